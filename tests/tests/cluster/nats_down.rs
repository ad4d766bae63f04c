//! NATS away: every change is a 503 that leaves no trace, a node started
//! or left without NATS answers 503 and says why, and all resumes after.

use std::time::Duration;

use ferry_tests::{eventually, Api, Ferry, FerryOptions};
use serde_json::{json, Value};

use super::{path_of, result, Cluster};

/// With NATS unreachable a node's reads answer 503, and bad input is
/// still refused for what it is. (A bad call that names its id may be the
/// retry of a call whose toolset changed since, which only the thread can
/// tell: that is a 503 too.)
async fn without_nats_reads_fail_and_bad_calls_are_refused(node: &Api) {
    let (status, body) = node.get("/v1/threads/g").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    let (status, body) = node
        .submit(json!({"operation": "nope", "arguments": {}, "group_id": "g"}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("unknown_tool")),
        "{body}"
    );
    let (status, body) = node
        .submit(json!({"operation": "op", "arguments": {"text": 5}, "group_id": "g"}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("invalid_arguments")),
        "{body}"
    );
}

/// DESIGN.md, invariant 1: "When the store cannot take the write, the
/// answer is 503 with `Retry-After`, and nothing changes." With NATS down,
/// every request that would change a thread is refused so, through either
/// node, whatever its kind; once NATS is back, the same requests retried
/// are each applied once.
#[tokio::test(flavor = "multi_thread")]
async fn with_nats_down_every_change_is_a_503_that_leaves_no_trace() {
    let mut c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let url = path_of(&c.dispatched(&a, "g", "s").await);
    let opened = json!({"type": "tool_result", "group_id": "g", "id": "s", "text": "on", "subscription": true});
    assert_eq!(a.post(&url, &opened).await.0, 200);
    let before = a.events("g", 0).await;
    c.nats.kill9();
    without_nats_reads_fail_and_bad_calls_are_refused(&a).await;
    let tick =
        json!({"type": "subscription_event", "group_id": "g", "tool_call_id": "s", "text": "tick"});
    let submit = json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "new"});
    let changes: Vec<(&str, Value)> = vec![
        ("/v1/calls", submit.clone()),
        (url.as_str(), tick.clone()),
        ("/v1/threads/g/close", json!({})),
    ];
    for node in [&a, &b] {
        for (path, body) in &changes {
            let sent = node
                .client
                .post(format!("{}{path}", node.base))
                .json(body)
                .send()
                .await
                .unwrap();
            let status = sent.status().as_u16();
            let retry_after = sent.headers().get("retry-after").cloned();
            let body: Value = sent.json().await.unwrap();
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (503, Some("unavailable")),
                "{path}: {body}"
            );
            assert_eq!(retry_after.as_ref().map(|v| v.to_str().unwrap()), Some("1"));
        }
        let (status, body) = node.delete("/v1/threads/g/calls/s").await;
        assert_eq!(status, 503, "{body}");
    }
    c.nats.restart().await;
    // Nothing changed while NATS was away: the log is as it was.
    // Each node reconnects on its own clock: wait for both.
    eventually("both nodes read again", Duration::from_secs(30), || async {
        let a_reads = a.get("/v1/threads/g").await.0 == 200;
        (a_reads && b.get("/v1/threads/g").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(a.events("g", 0).await, before);
    // The same requests again, now applied: once each, through either node.
    let (status, body) = b.submit(submit.clone()).await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = a.submit(submit).await;
    assert_eq!(status, 200, "the same submission answers its call: {body}");
    let (status, body) = b.post(&url, &tick).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("applied")),
        "{body}"
    );
    let events = a.events("g", 0).await;
    let count = |kind: &str| events.iter().filter(|e| e["type"] == kind).count();
    assert_eq!(
        (count("call_accepted"), count("subscription_event")),
        (2, 1),
        "{events:?}"
    );
}

/// A runtime node (re)started while NATS is down serves, and answers what
/// needs the store 503 (its `/healthz` too), a call to a tool it cannot
/// know yet included: it keeps nothing of its own. Once NATS is back, the
/// same call is accepted and runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_started_while_nats_is_down_answers_503_until_it_is_back() {
    let mut c = Cluster::start(1).await;
    c.a.kill9();
    c.nats.kill9();
    c.a.restart().await;
    let a = c.a.api();
    let (status, body) = a.get("/v1/threads/g").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    let call = json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "j"});
    let (status, body) = a.submit(call.clone()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    c.nats.restart().await;
    let (status, body) = eventually("the call accepted", Duration::from_secs(60), || async {
        let (status, body) = a.submit(call.clone()).await;
        (status != 503).then_some((status, body))
    })
    .await;
    assert_eq!(status, 202, "{body}");
    let sent = c.tool.next_invocation().await.invocation;
    assert_eq!((sent.group_id.as_str(), sent.id.as_str()), ("g", "j"));
    let (status, body) = a
        .post(&path_of(&sent.callback_url), &result("g", "j", "late"))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, call) = a.call("g", "j").await;
    assert_eq!(
        (status, call["status"].as_str()),
        (200, Some("completed")),
        "{call}"
    );
    assert_eq!(a.count("g", "j", "call_accepted").await, 1);
}

/// A node given a NATS URL nobody answers says so every few seconds,
/// naming the URL and the cause, and its `/healthz` says it is degraded.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_that_cannot_reach_nats_says_where_and_why() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("nats://{}", free.local_addr().unwrap());
    drop(free);
    let log = tempfile::NamedTempFile::new().unwrap();
    let node = Ferry::start(FerryOptions {
        log: Some(log.path().to_owned()),
        ..FerryOptions::runtime(&nowhere)
    })
    .await;
    let (status, body) = node.api().get("/healthz").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (503, Some("degraded")),
        "{body}"
    );
    assert!(
        body["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{body}"
    );
    let said = eventually("the warning", Duration::from_secs(30), || async {
        let text = std::fs::read_to_string(log.path()).unwrap_or_default();
        text.lines()
            .find(|l| l.contains("NATS unreachable"))
            .map(str::to_owned)
    })
    .await;
    assert!(said.contains(&nowhere), "{said}");
    assert!(said.to_lowercase().contains("refused"), "{said}");
}
