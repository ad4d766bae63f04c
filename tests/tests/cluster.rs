//! Cluster mode: a real `nats-server` with JetStream, two `ferry runtime`
//! nodes and three `ferry worker`s, RAP tools on loopback. A call accepted
//! on one node is answered through another and read on both; duplicates
//! split across nodes make one event; workers, runtime nodes and NATS are
//! killed and restarted under load.

use std::time::Duration;

use ferry_tests::api::seg;
use ferry_tests::sse::SseReader;
use ferry_tests::{eventually, Api, Ferry, FerryOptions, FerryWorker, Nats, TestTool};
use futures::future::join_all;
use serde_json::{json, Value};

/// NATS, two runtime nodes (A and B), workers, and a RAP tool `t` with `op`.
struct Cluster {
    nats: Nats,
    a: Ferry,
    b: Ferry,
    workers: Vec<FerryWorker>,
    tool: TestTool,
}

impl Cluster {
    async fn start(workers: usize) -> Cluster {
        let nats = Nats::start().await;
        let tool = TestTool::start("t", &["op"]).await;
        let a = Ferry::start(FerryOptions {
            tool_servers: vec![tool.url.clone()],
            ..FerryOptions::runtime(&nats.url())
        })
        .await;
        let b = Ferry::start(FerryOptions::runtime(&nats.url())).await;
        // Callbacks go to node A (as through a load balancer); tests post
        // some to B themselves.
        let mut started = vec![];
        for _ in 0..workers {
            started.push(FerryWorker::start(&nats.url(), &a.url).await);
        }
        // B learns the toolset A registered through the KV bucket.
        let b_api = b.api();
        eventually("B to list the tool", Duration::from_secs(20), || async {
            let (_, tools) = b_api.get("/v1/tools").await;
            tools.to_string().contains("\"op\"").then_some(())
        })
        .await;
        Cluster {
            nats,
            a,
            b,
            workers: started,
            tool,
        }
    }

    /// Submits on `node`; returns the callback URL rewritten to `via`.
    async fn dispatched(&self, node: &Api, g: &str, id: &str) -> String {
        let (status, body) = node
            .submit(json!({"operation": "op", "arguments": {}, "group_id": g, "id": id}))
            .await;
        assert_eq!(status, 202, "{body}");
        assert!(body["seq"].as_u64().unwrap() > 0, "{body}");
        let sent = self.tool.next_invocation().await.invocation;
        assert_eq!((sent.group_id.as_str(), sent.id.as_str()), (g, id));
        sent.callback_url
    }
}

/// The callback URL's path, to post it to any node.
fn path_of(url: &str) -> String {
    url.split_once("/v1/")
        .map(|(_, p)| format!("/v1/{p}"))
        .unwrap()
}

fn result(g: &str, id: &str, text: &str) -> Value {
    json!({"type": "tool_result", "group_id": g, "id": id, "text": text})
}

#[tokio::test(flavor = "multi_thread")]
async fn accepted_on_a_answered_on_b_read_on_both() {
    let c = Cluster::start(3).await;
    let (a, b) = (c.a.api(), c.b.api());
    let url = c.dispatched(&a, "g", "c1").await;
    let (status, body) = b.post(&path_of(&url), &result("g", "c1", "done")).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("applied")),
        "{body}"
    );
    let from_a = a.events("g", 0).await;
    let kinds: Vec<&str> = from_a.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["call_accepted", "call_dispatched", "tool_result"]);
    // Streamed from B: the same events, in the same order.
    let mut stream = SseReader::open(&b, "/v1/threads/g/stream", None).await;
    for expected in &from_a {
        assert_eq!(&stream.next().await.data, expected);
    }
    let (_, call) = b.call("g", "c1").await;
    assert_eq!(call["status"], "completed");
    assert_eq!(call["result"]["text"], "done");
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_copies_of_a_result_across_two_nodes_make_one_event() {
    let c = Cluster::start(3).await;
    let (a, b) = (c.a.api(), c.b.api());
    let url = path_of(&c.dispatched(&a, "g", "c").await);
    let body = result("g", "c", "once");
    let posts = (0..10).map(|i| {
        let (node, url, body) = (if i % 2 == 0 { &a } else { &b }, &url, &body);
        async move { node.post(url, body).await }
    });
    let answers = join_all(posts).await;
    let applied = answers
        .iter()
        .filter(|(s, b)| *s == 200 && b["status"] == "applied")
        .count();
    assert!(answers.iter().all(|(s, _)| *s == 200), "{answers:?}");
    assert_eq!(applied, 1, "{answers:?}");
    assert_eq!(a.count("g", "c", "tool_result").await, 1);
    assert_eq!(b.count("g", "c", "tool_result").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_group_ids_stay_in_their_own_thread() {
    let c = Cluster::start(1).await;
    let a = c.a.api();
    let dots = ".".repeat(255);
    let hostile = ["a.*.>", "$JS.API", dots.as_str(), "a b", "é>*"];
    for (i, g) in hostile.iter().enumerate() {
        let id = format!("c{i}");
        let url = c.dispatched(&a, g, &id).await;
        let (status, _) = a.post(&path_of(&url), &result(g, &id, g)).await;
        assert_eq!(status, 200);
    }
    for (i, g) in hostile.iter().enumerate() {
        let events = a.events(g, 0).await;
        assert_eq!(events.len(), 3, "{g:?}: {events:?}");
        assert!(events
            .iter()
            .all(|e| e["group_id"] == *g && e["id"] == format!("c{i}")));
        let (_, call) = a.call(g, &format!("c{i}")).await;
        assert_eq!(call["result"]["text"], *g);
    }
    // A thread named like a wildcard sees nothing of the others.
    let (status, _) = a.get(&format!("/v1/threads/{}", seg("*"))).await;
    assert_eq!(status, 404);
    let (status, body) = a
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "", "id": "x"}))
        .await;
    assert_eq!(status, 400, "{body}");
    let long = "x".repeat(10 * 1024);
    let (status, body) = a
        .submit(json!({"operation": "op", "arguments": {}, "group_id": long, "id": "x"}))
        .await;
    assert_eq!(status, 400, "{body}");
}
