//! Rate limits across runtime nodes: both take from the same buckets, in
//! the KV bucket `ferry_rate_limits`.

use futures::future::join_all;
use serde_json::json;

use ferry_tests::{Api, Ferry, FerryOptions, Nats, TestTool};

/// Two nodes with `--rate-limit-identity 0.001:10` (ten calls, then one
/// every 1000 s): 40 submissions at once, half to each node, admit ten in
/// all, and the rest are 429. With one bucket per call the shared bucket
/// is exact: a write that lost a race reads again.
#[tokio::test(flavor = "multi_thread")]
async fn two_nodes_admit_one_buckets_allowance_between_them() {
    let nats = Nats::start().await;
    let tool = TestTool::start("t", &["op"]).await;
    let limit = ["--rate-limit-identity", "0.001:10"];
    let a = Ferry::start(
        FerryOptions {
            tool_servers: vec![tool.url.clone()],
            ..FerryOptions::runtime(&nats.url())
        }
        .with_args(&limit),
    )
    .await;
    let b = Ferry::start(FerryOptions::runtime(&nats.url()).with_args(&limit)).await;
    let nodes = [a.api(), b.api()];
    ferry_tests::eventually(
        "B to list the tool",
        std::time::Duration::from_secs(20),
        || async {
            let (_, tools) = nodes[1].get("/v1/tools").await;
            tools.to_string().contains("\"op\"").then_some(())
        },
    )
    .await;
    let answers = join_all((0..40).map(|i| {
        let node: &Api = &nodes[i % 2];
        let call =
            json!({"operation": "op", "arguments": {}, "group_id": format!("g{i}"), "id": "c"});
        async move { node.submit(call).await }
    }))
    .await;
    let admitted = answers.iter().filter(|(s, _)| *s == 202).count();
    assert_eq!(admitted, 10, "admitted of 40 against a burst of 10");
    for (status, body) in answers.iter().filter(|(s, _)| *s != 202) {
        assert_eq!(*status, 429, "{body}");
        assert_eq!(body["error"]["code"], "rate_limited");
    }
    let (_, threads) = nodes[0].get("/v1/threads?limit=100").await;
    assert_eq!(threads["threads"].as_array().map(Vec::len), Some(admitted));
}
