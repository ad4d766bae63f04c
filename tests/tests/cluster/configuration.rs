//! How processes are configured to join: a node's `--api-token`, and a
//! `--secret` or `--partitions` that must be the cluster's.

use std::sync::Arc;
use std::time::Duration;

use ferry_nats::cluster::subjects::Layout;
use ferry_tests::{Api, Ferry, FerryOptions, FerryWorker, Nats, TestTool};
use serde_json::json;

use super::{
    answer_everything, every_call_has_one_outcome, node_with, result, submit_load, Cluster,
};

/// A runtime node takes `--api-token` as `ferry serve` does: its native
/// API asks for a token (its callbacks do not).
#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_nodes_api_asks_for_its_token() {
    let nats = Nats::start().await;
    let tool = TestTool::start("t", &["op"]).await;
    let token = "node-token-0123456789";
    let options = FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::runtime(&nats.url())
    };
    let a = Ferry::start(options.api_token(token)).await;
    let _worker = FerryWorker::start(&nats.url(), &a.url).await;
    let (status, body) = a.api().get("/v1/tools").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let (status, body) = a
        .api()
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    assert_eq!(status, 401, "{body}");
    let agent = Api::with_token(&a.url, token);
    let (status, body) = agent
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let sent = tool.next_invocation().await.invocation;
    let (status, body) = a
        .api()
        .post(&sent.callback_url, &result("g", "c", "done"))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, call) = agent.call("g", "c").await;
    assert_eq!(
        (status, call["status"].as_str()),
        (200, Some("completed")),
        "{call}"
    );
}

/// A process whose `--secret` is not the cluster's refuses to start,
/// saying so: a worker's calls would otherwise get callback URLs every
/// node refuses, and wait for good. The secret itself is never shown, nor
/// kept in JetStream (only its fingerprint is).
#[tokio::test(flavor = "multi_thread")]
async fn a_process_with_another_secret_refuses_to_join_the_cluster() {
    let c = Cluster::start(1).await;
    let other = "another-secret-0123456789";
    let url = c.nats.url();
    for role in [
        &["worker", "--public-url", c.a.url.as_str()][..],
        &["runtime", "--listen", "127.0.0.1:0"][..],
    ] {
        let args: Vec<String> = [role, &["--nats", url.as_str(), "--secret", other][..]]
            .concat()
            .into_iter()
            .map(str::to_owned)
            .collect();
        let run = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            ferry_tests::ferry::refused(&args)
        });
        let (status, stderr) = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("it stops by itself")
            .unwrap();
        assert!(!status.success(), "{role:?}: {stderr}");
        assert!(
            stderr.contains("--secret is not the cluster's"),
            "{role:?}: {stderr}"
        );
        assert!(!stderr.contains(other), "the secret is not shown: {stderr}");
    }
    // The cluster goes on.
    c.dispatched(&c.b.api(), "g", "c").await;
}

/// `--partitions 4`: threads are spread over four streams by their
/// `group_id`, calls on all of them run through nodes and workers alike,
/// and a process given another count refuses to start, naming the
/// cluster's.
#[tokio::test(flavor = "multi_thread")]
async fn threads_spread_over_partitions_and_a_process_with_another_count_refuses() {
    let nats = Nats::start().await;
    let tool = Arc::new(TestTool::start("t", &["op"]).await);
    let a = node_with(&nats, &tool, &["--partitions", "4"]).await;
    let _worker = FerryWorker::start_with(&nats.url(), &a.url, &["--partitions", "4"]).await;
    let answering = answer_everything(tool.clone(), vec![a.url.clone()]);
    let calls = submit_load(&[a.api()], 16, 32).await;
    every_call_has_one_outcome(&a.api(), &calls).await;
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let layout = Layout::new(4);
    let mut used = std::collections::BTreeSet::new();
    for (g, _) in &calls {
        let p = layout.partition(g);
        let mut stream = js.get_stream(layout.stream(p)).await.unwrap();
        let info = stream.info().await.unwrap();
        assert!(info.state.messages > 0, "{g} in {}", layout.stream(p));
        used.insert(p);
    }
    assert!(used.len() > 1, "16 threads in one partition: {used:?}");
    let (_, threads) = a.api().get("/v1/threads").await;
    assert_eq!(
        threads["threads"].as_array().map(Vec::len),
        Some(16),
        "{threads}"
    );
    let url = nats.url();
    let (status, stderr) = tokio::task::spawn_blocking(move || {
        ferry_tests::ferry::refused(&[
            "worker",
            "--nats",
            &url,
            "--secret",
            ferry_tests::TEST_SECRET,
            "--public-url",
            "http://127.0.0.1:9",
            "--partitions",
            "2",
        ])
    })
    .await
    .unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("--partitions 4"), "{stderr}");
    answering.abort();
}
