//! Toolsets and named tokens across nodes: registered, deleted or revoked
//! through one node, they are what every node resolves calls and
//! credentials against.

use std::time::Duration;

use ferry_tests::{eventually, Api, TestTool};
use serde_json::json;

use super::Cluster;

/// A toolset deleted through one node leaves every node's registry: B
/// stops listing its tools and refuses calls to them.
#[tokio::test(flavor = "multi_thread")]
async fn a_toolset_deleted_on_one_node_leaves_every_node() {
    let c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let (status, body) = a.delete("/v1/toolsets/t").await;
    assert_eq!(status, 200, "{body}");
    eventually("B to drop the tool", Duration::from_secs(20), || async {
        let (_, tools) = b.get("/v1/tools").await;
        (!tools.to_string().contains("\"op\"")).then_some(())
    })
    .await;
    let (status, body) = b
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("unknown_tool")),
        "{body}"
    );
}

/// Workers learn toolsets through the toolset bucket's watch, which may lag
/// the node that registered one. A call submitted through that node at once
/// is applied to the tool the node resolved: never refused for a tool the
/// node knew (before, most of these were `400 unknown_tool`), nor recorded
/// against an older version a worker still had as the latest.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_right_after_its_toolset_is_registered_goes_to_the_tool_the_node_resolved() {
    let c = Cluster::start(3).await;
    let a = c.a.api();
    let mut tools = vec![];
    for i in 0..10 {
        let name = format!("r{i}");
        let tool = TestTool::start(&name, &["go"]).await;
        let g = format!("rg{i}");
        for (version, id) in [("1.0.0", "v1"), ("2.0.0", "v2")] {
            let registration = json!({"url": tool.url, "version": version});
            let (status, body) = a.post("/v1/toolsets", &registration).await;
            assert!(status < 300, "{body}");
            let call = json!({"operation": format!("{name}.go"), "arguments": {},
                "group_id": g, "id": id});
            let (status, body) = a.submit(call).await;
            assert_eq!(status, 202, "round {i}, {version}: {body}");
            let accepted = a.wait_for(&g, id, "call_accepted").await;
            assert_eq!(accepted["payload"]["tool"], format!("{name}.go@{version}"));
        }
        tools.push(tool);
    }
}

/// A retry of a call whose toolset was deleted meanwhile is answered by the
/// call on every node (200; 409 for another body), though each node's
/// registry no longer knows the tool; a new call of it is still refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_retry_after_its_toolset_was_deleted_is_answered_by_its_call() {
    let c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let call = |id: &str, text: &str| json!({"operation": "op", "arguments": {"text": text}, "group_id": "g", "id": id});
    let (status, first) = a.submit(call("c1", "hi")).await;
    assert_eq!(status, 202, "{first}");
    a.wait_for("g", "c1", "call_accepted").await;
    assert_eq!(a.delete("/v1/toolsets/t").await.0, 200);
    for node in [&a, &b] {
        eventually(
            "the node to forget the tool",
            Duration::from_secs(20),
            || async {
                let (_, tools) = node.get("/v1/tools").await;
                (!tools.to_string().contains("\"op\"")).then_some(())
            },
        )
        .await;
        let (status, new) = node.submit(call("new", "hi")).await;
        assert_eq!(
            (status, &new["error"]["code"]),
            (400, &json!("unknown_tool"))
        );
        let (status, again) = node.submit(call("c1", "hi")).await;
        assert_eq!((status, &again["id"]), (200, &json!("c1")), "{again}");
        let (status, other) = node.submit(call("c1", "other")).await;
        assert_eq!((status, &other["error"]["code"]), (409, &json!("conflict")));
    }
    assert_eq!(a.count("g", "c1", "call_accepted").await, 1);
    assert_eq!(a.count("g", "new", "call_accepted").await, 0);
}

/// Named tokens live in the KV bucket `ferry_tokens`: one made through
/// node A is accepted by node B once B sees the change, and from then on
/// B asks every request for a credential; one revoked through B is
/// refused by A.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_made_on_one_node_works_on_the_other_and_so_does_its_revocation() {
    let c = Cluster::start(0).await;
    let root =
        c.a.api()
            .make_token(json!({"name": "root", "scopes": ["admin", "read"]}))
            .await;
    let root_at_b = Api::with_token(&c.b.url, &root);
    eventually("B to accept A's token", Duration::from_secs(20), || async {
        (root_at_b.get("/v1/threads").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(c.b.api().get("/v1/threads").await.0, 401, "B still open");
    let reader = root_at_b
        .make_token(json!({"name": "reader", "scopes": ["read"]}))
        .await;
    let reader_at_a = Api::with_token(&c.a.url, &reader);
    eventually("A to accept B's token", Duration::from_secs(20), || async {
        (reader_at_a.get("/v1/threads").await.0 == 200).then_some(())
    })
    .await;
    let (_, listed) = root_at_b.get("/v1/tokens").await;
    let id = listed["tokens"][1]["id"].as_str().unwrap().to_owned();
    assert_eq!(root_at_b.delete(&format!("/v1/tokens/{id}")).await.0, 200);
    assert_eq!(
        Api::with_token(&c.b.url, &reader)
            .get("/v1/threads")
            .await
            .0,
        401
    );
    eventually(
        "A to refuse the revoked token",
        Duration::from_secs(20),
        || async { (reader_at_a.get("/v1/threads").await.0 == 401).then_some(()) },
    )
    .await;
}
