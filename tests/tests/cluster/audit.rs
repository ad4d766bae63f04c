//! The audit log on a cluster: one log in JetStream, whichever node
//! recorded an entry, each action once.

use serde_json::{json, Value};

use super::Cluster;

#[tokio::test(flavor = "multi_thread")]
async fn every_node_reads_one_log_with_each_action_once() {
    let c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let call = json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c1",
                      "user_id": "u1"});
    assert_eq!(a.submit(call.clone()).await.0, 202);
    // A retry through the other node is the same call: no second entry.
    assert_eq!(b.submit(call).await.0, 200);
    let url = c.tool.next_invocation().await.invocation.callback_url;
    let url_at_b = url.replacen(&c.a.url, &c.b.url, 1);
    let result = json!({"type": "tool_result", "group_id": "g", "id": "c1", "text": "ok"});
    assert_eq!(a.post(&url, &result).await.1["status"], "applied");
    assert_eq!(b.post(&url_at_b, &result).await.1["status"], "duplicate");

    let kinds = |page: &Value| -> Vec<(String, String)> {
        page["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let field = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                (field("kind"), field("identity"))
            })
            .collect()
    };
    for api in [&a, &b] {
        let (status, page) = api.get("/v1/audit").await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(
            kinds(&page),
            [
                ("toolset_registered".to_owned(), "ferry".to_owned()),
                ("call_submitted".to_owned(), "anonymous".to_owned()),
                ("call_settled".to_owned(), "tool".to_owned()),
            ],
            "{page}"
        );
    }
    // A change made on B is read on A at once: one stream, no follower.
    let (status, body) = b.post("/v1/threads/g/close", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (_, page) = a.get("/v1/audit?kind=thread_closed").await;
    assert_eq!(page["records"].as_array().unwrap().len(), 1, "{page}");
    // Its place in the log is a cursor on every node.
    let next = page["next"].as_u64().unwrap();
    let (_, page) = b.get(&format!("/v1/audit?since={next}")).await;
    assert_eq!(page["records"], json!([]), "{page}");
}
