//! Bad and hostile input on every node: refused as on one process, and
//! nothing recorded; hostile group ids stay in their own thread.

use ferry_tests::api::seg;
use ferry_tests::TestTool;
use serde_json::{json, Value};

use super::{path_of, registered_on_both, result, Cluster};

#[tokio::test(flavor = "multi_thread")]
async fn hostile_group_ids_stay_in_their_own_thread() {
    let c = Cluster::start(1).await;
    let a = c.a.api();
    let dots = ".".repeat(255);
    let hostile = [
        "a.*.>",
        "$JS.API",
        dots.as_str(),
        "a b",
        "é>*",
        "*",
        ">",
        "a.b",
        "$JS.API.>",
    ];
    for (i, g) in hostile.iter().enumerate() {
        let id = format!("c{i}");
        let url = c.dispatched(&a, g, &id).await;
        let (status, _) = a.post(&path_of(&url), &result(g, &id, g)).await;
        assert_eq!(status, 200);
    }
    let b = c.b.api();
    for (i, g) in hostile.iter().enumerate() {
        for node in [&a, &b] {
            let events = node.events(g, 0).await;
            assert_eq!(events.len(), 3, "{g:?}: {events:?}");
            assert!(events
                .iter()
                .all(|e| e["group_id"] == *g && e["id"] == format!("c{i}")));
            let (_, call) = node.call(g, &format!("c{i}")).await;
            assert_eq!(call["result"]["text"], *g);
        }
    }
    // A wildcard-like name never used is no thread, not a view of others.
    let (status, _) = a.get(&format!("/v1/threads/{}", seg("a.*"))).await;
    assert_eq!(status, 404);
    let long = "x".repeat(10 * 1024);
    for g in ["", long.as_str()] {
        let (status, body) = a
            .submit(json!({"operation": "op", "arguments": {}, "group_id": g, "id": "x"}))
            .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{body}"
        );
    }
    assert!(c.tool.invocations().iter().all(|i| i.id != "x"));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_refused_on_every_node_and_changes_nothing() {
    use ferry_engine::token::Capabilities;
    let c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let url = path_of(&c.dispatched(&a, "g", "ok").await);
    let before = a.events("g", 0).await;
    let caps = Capabilities::new(ferry_tests::TEST_SECRET.as_bytes());
    for node in [&a, &b] {
        let code = |answer: &(u16, Value)| {
            (
                answer.0,
                answer.1["error"]["code"].as_str().map(str::to_owned),
            )
        };
        let answer = node.post_raw("/v1/calls", b"{not json".to_vec()).await;
        assert_eq!(answer.0, 400, "{answer:?}");
        let answer = node
            .submit(
                json!({"operation": "op", "arguments": {"text": 5}, "group_id": "g", "id": "bad"}),
            )
            .await;
        assert_eq!(code(&answer), (422, Some("invalid_arguments".into())));
        assert!(
            answer.1["error"]["parameter_errors"]["text"].is_string(),
            "{answer:?}"
        );
        let answer = node.post_raw("/v1/calls", vec![b' '; 2 << 20]).await;
        assert_eq!(answer.0, 413);
        // A forged token, a body naming another call, an unknown call.
        let answer = node
            .post("/v1/callbacks/forged.token", &result("g", "ok", "x"))
            .await;
        assert_eq!(code(&answer), (403, Some("forbidden".into())));
        let answer = node.post(&url, &result("g", "other", "x")).await;
        assert_eq!(code(&answer), (403, Some("forbidden".into())));
        let unknown = format!("/v1/callbacks/{}", caps.mint("g", "ghost"));
        let answer = node.post(&unknown, &result("g", "ghost", "x")).await;
        assert_eq!(answer.0, 404, "{answer:?}");
        // The same id with a different body: 409.
        let answer = node
            .submit(json!({"operation": "op", "arguments": {"text": "new"}, "group_id": "g", "id": "ok"}))
            .await;
        assert_eq!(code(&answer), (409, Some("conflict".into())));
    }
    assert_eq!(a.events("g", 0).await, before);
    assert_eq!(b.events("g", 0).await, before);
}

/// Issue 3: "Bad inputs from the single-node issue hold in cluster mode
/// too." Every bad submission of the single-node tests, on both nodes;
/// then toolsets: a discovery document with a tool missing `inputSchema`
/// registers nothing on either node, and a second toolset with a tool of
/// the same name makes the bare name ambiguous on both.
#[tokio::test(flavor = "multi_thread")]
async fn the_single_node_bad_inputs_hold_on_every_node() {
    let c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let calc = TestTool::with_manifest(ferry_tests::cases::calc_manifest()).await;
    registered_on_both(&a, &b, &calc.url, "calc").await;
    for node in [&a, &b] {
        for (what, body, status, code) in ferry_tests::cases::bad_submissions() {
            let (got, reply) = node.post_raw("/v1/calls", body).await;
            assert_eq!(
                (got, reply["error"]["code"].as_str()),
                (status, Some(code)),
                "{what}: {reply}"
            );
        }
        assert_eq!(node.thread("bad").await.0, 404);
    }
    assert!(c.tool.invocations().is_empty() && calc.invocations().is_empty());

    let broken = TestTool::with_manifest(json!({"name": "Bad", "tools": [
        {"name": "ok", "description": "a valid tool", "inputSchema": ferry_tests::tool::text_schema()},
        {"name": "schemaless", "description": "no inputSchema"}]}))
    .await;
    let (status, body) = b.register(&broken.url).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("invalid_toolset")),
        "{body}"
    );
    for node in [&a, &b] {
        assert_eq!(node.get("/v1/toolsets/Bad").await.0, 404);
    }

    let clash = TestTool::start("u", &["op"]).await;
    registered_on_both(&a, &b, &clash.url, "u").await;
    for node in [&a, &b] {
        let (status, body) = node
            .submit(json!({"operation": "op", "arguments": {}, "group_id": "amb", "id": "x"}))
            .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("ambiguous_tool")),
            "{body}"
        );
        assert_eq!(node.thread("amb").await.0, 404);
    }
    let (status, body) = b
        .submit(json!({"operation": "u.op", "arguments": {}, "group_id": "amb", "id": "x"}))
        .await;
    assert_eq!(status, 202, "{body}");
}
