//! One thread through several nodes: a call accepted on one node is
//! answered through another and read on both, subscriptions included.

use std::time::Duration;

use ferry_tests::sse::SseReader;
use serde_json::{json, Value};

use super::{path_of, result, Cluster};

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
async fn subscriptions_overtaking_results_and_cancel_across_nodes() {
    let c = Cluster::start(2).await;
    let (a, b) = (c.a.api(), c.b.api());
    let url = path_of(&c.dispatched(&a, "g", "s").await);
    let event = |text: &str, last: bool| json!({"type": "subscription_event", "group_id": "g", "tool_call_id": "s", "text": text, "final": last});
    // The first event overtakes the result that opens the subscription.
    let (status, body) = b.post(&url, &event("early", false)).await;
    assert_eq!(status, 200, "{body}");
    let opened = json!({"type": "tool_result", "group_id": "g", "id": "s", "text": "subscribed", "subscription": true});
    let (status, body) = a.post(&url, &opened).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = b.post(&url, &event("second", false)).await;
    assert_eq!(status, 200, "{body}");
    let (_, thread) = b.thread("g").await;
    assert_eq!(thread["active_subscriptions"], json!(["s"]), "{thread}");
    let texts = a.fields("g", "subscription_event", "/payload/text").await;
    assert_eq!(texts, [json!("early"), json!("second")]);
    // Cancelled through A: every node answers later events 410.
    let (status, body) = a.delete("/v1/threads/g/subscriptions/s").await;
    assert_eq!(status, 200, "{body}");
    for node in [&a, &b] {
        let (status, body) = node.post(&url, &event("after cancel", false)).await;
        assert_eq!(status, 410, "{body}");
    }
    let (_, thread) = a.thread("g").await;
    assert_eq!(thread["active_subscriptions"], json!([]), "{thread}");
    assert_eq!(
        a.events("g", 0)
            .await
            .iter()
            .filter(|e| e["type"] == "subscription_event")
            .count(),
        2
    );

    // Closing the thread through B ends the subscription opened through
    // A, though the thread's last commit no longer carries it (a later
    // call completed since): every node then answers its events 410.
    let url = path_of(&c.dispatched(&a, "g", "s2").await);
    let opened = json!({"type": "tool_result", "group_id": "g", "id": "s2", "text": "on", "subscription": true});
    assert_eq!(a.post(&url, &opened).await.0, 200);
    let later = path_of(&c.dispatched(&a, "g", "later").await);
    assert_eq!(a.post(&later, &result("g", "later", "done")).await.0, 200);
    let (status, body) = b.post("/v1/threads/g/close", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let tail: Vec<Value> = a
        .events("g", 0)
        .await
        .iter()
        .rev()
        .take(2)
        .map(|e| e["type"].clone())
        .collect();
    assert_eq!(
        tail,
        [json!("thread_closed"), json!("subscription_cancelled")]
    );
    let tick =
        json!({"type": "subscription_event", "group_id": "g", "tool_call_id": "s2", "text": "t"});
    for node in [&a, &b] {
        let (status, body) = node.post(&url, &tick).await;
        assert_eq!(status, 410, "{body}");
        let (_, thread) = node.thread("g").await;
        assert_eq!(thread["active_subscriptions"], json!([]), "{thread}");
    }
}

/// A subscription outlives later calls in its thread, so its record is
/// copied each time the thread moves on from it: every copy after the
/// first replaces an older one, and reads see the newest.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_copied_again_reads_back_as_of_its_last_change() {
    let c = Cluster::start(2).await;
    let (a, b) = (c.a.api(), c.b.api());
    let url = path_of(&c.dispatched(&a, "g", "s").await);
    let opened = json!({"type": "tool_result", "group_id": "g", "id": "s", "text": "subscribed", "subscription": true});
    let (status, body) = a.post(&url, &opened).await;
    assert_eq!(status, 200, "{body}");
    for (n, later) in ["c1", "c2", "c3"].into_iter().enumerate() {
        // The thread moves on from `s` (its copy is written)...
        c.dispatched(&a, "g", later).await;
        // ...then `s` changes again.
        let event = json!({"type": "subscription_event", "group_id": "g", "tool_call_id": "s", "text": format!("tick {n}"), "final": false});
        let (status, body) = b.post(&url, &event).await;
        assert_eq!(status, 200, "{body}");
    }
    // Moved on from once more: its newest record is only in its copy.
    c.dispatched(&a, "g", "c4").await;
    for node in [&a, &b] {
        let (status, call) = node.call("g", "s").await;
        assert_eq!(status, 200, "{call}");
        assert_eq!(call["status"], "subscribed", "{call}");
        assert_eq!(call["subscription"]["events"], 3, "{call}");
    }
}

/// A runtime node stops on SIGTERM while an agent follows a thread on it:
/// the stream ends cleanly, the node exits 0, and the other node serves
/// the thread on.
#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_node_stops_on_sigterm_with_a_stream_open() {
    let mut cluster = Cluster::start(1).await;
    let (a, b) = (cluster.a.api(), cluster.b.api());
    let mut stream = SseReader::open(&b, "/v1/threads/g/stream", None).await;
    cluster.dispatched(&a, "g", "c1").await;
    for kind in ["call_accepted", "call_dispatched"] {
        assert_eq!(stream.next().await.event.as_deref(), Some(kind));
    }

    let exited = cluster.b.terminate(Duration::from_secs(60)).await;
    let status = exited.expect("the node still runs a minute after SIGTERM");
    assert!(status.success(), "{status}");
    stream.expect_end().await;
    let (status, call) = a.get("/v1/threads/g/calls/c1").await;
    assert_eq!((status, &call["status"]), (200, &json!("dispatched")));
}
