//! Cluster mode: a real `nats-server` with JetStream, two `ferry runtime`
//! nodes and three `ferry worker`s, RAP tools on loopback. A call accepted
//! on one node is answered through another and read on both; duplicates
//! split across nodes make one event; workers, runtime nodes and NATS are
//! killed and restarted under load.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{Info, PullConsumer};
use ferry_nats::cluster::streams;
use ferry_nats::cluster::subjects::Layout;

/// The stream workers take work from, with one partition (the default).
const WORK_STREAM: &str = "FERRY_THREADS_0";
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
    tool: Arc<TestTool>,
}

impl Cluster {
    async fn start(workers: usize) -> Cluster {
        Self::on(Nats::start().await, workers).await
    }

    /// [`Cluster::start`] on a NATS of the test's own.
    async fn on(nats: Nats, workers: usize) -> Cluster {
        let tool = Arc::new(TestTool::start("t", &["op"]).await);
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

    /// Submits on `node`; returns the callback URL the tool got, once the
    /// dispatch is recorded (a result posted earlier makes `call_dispatched`
    /// redundant, and the log one event shorter).
    async fn dispatched(&self, node: &Api, g: &str, id: &str) -> String {
        let (status, body) = node
            .submit(json!({"operation": "op", "arguments": {}, "group_id": g, "id": id}))
            .await;
        assert_eq!(status, 202, "{body}");
        // Decided, with its place in the log.
        assert!(body["seq"].as_u64().is_some_and(|seq| seq > 0), "{body}");
        let sent = self.tool.next_invocation().await.invocation;
        assert_eq!((sent.group_id.as_str(), sent.id.as_str()), (g, id));
        node.wait_for(g, id, "call_dispatched").await;
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

/// Posts the tool's result for call `id` to `node` at `path`: applied,
/// and so in the thread when the answer comes.
async fn answer(node: &Api, path: &str, g: &str, id: &str, text: &str) {
    let (status, body) = node.post(path, &result(g, id, text)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("applied")),
        "{body}"
    );
    assert_eq!(node.count(g, id, "tool_result").await, 1);
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

/// rap-3: "Events have no per-event id", so only an `Idempotency-Key`
/// tells a `subscription_event` sent again (its answer lost with a node)
/// from a second one. Ten copies under one key, sent to two nodes at once,
/// are one event: the key travels in the commit on JetStream, and the
/// compare-and-set decides each loser again against the winner's keys.
/// Another key, even with the same text, is another event.
#[tokio::test(flavor = "multi_thread")]
async fn a_keyed_subscription_event_sent_to_two_nodes_is_recorded_once() {
    let c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let url = path_of(&c.dispatched(&a, "g", "s").await);
    let opened = json!({"type": "tool_result", "group_id": "g", "id": "s", "text": "on", "subscription": true});
    assert_eq!(a.post(&url, &opened).await.0, 200);
    let tick =
        json!({"type": "subscription_event", "group_id": "g", "tool_call_id": "s", "text": "tick"});
    let body = tick.to_string().into_bytes();
    let key: &[u8] = br#""8e03978e-40d5-43e8-bc93-6894a57f9324""#;
    let posts = (0..10).map(|i| {
        let (node, url, body) = (if i % 2 == 0 { &a } else { &b }, &url, body.clone());
        async move { node.post_with(url, body, &[("Idempotency-Key", key)]).await }
    });
    let answers = join_all(posts).await;
    assert!(answers.iter().all(|(s, _)| *s == 200), "{answers:?}");
    let applied = answers.iter().filter(|(_, b)| b["status"] == "applied");
    assert_eq!(applied.count(), 1, "{answers:?}");
    let other = b
        .post_with(&url, body, &[("Idempotency-Key", b"tick-2")])
        .await;
    assert_eq!(
        (other.0, other.1["status"].as_str()),
        (200, Some("applied"))
    );
    for node in [&a, &b] {
        assert_eq!(node.count("g", "s", "subscription_event").await, 2);
        let keys = node
            .fields("g", "subscription_event", "/idempotency_key/key")
            .await;
        assert_eq!(
            keys,
            [
                json!("8e03978e-40d5-43e8-bc93-6894a57f9324"),
                json!("tick-2")
            ]
        );
    }
}

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

/// A tool's callback side: answers every invocation with a `tool_result`
/// whose text is the call id, posted to the nodes in turn and retried until
/// one accepts it (as a real tool would through an outage). Returns the
/// task; abort it when done.
fn answer_everything(tool: Arc<TestTool>, nodes: Vec<String>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let mut turn = 0usize;
        while let Some(invoked) = tool.await_invocation().await {
            let invocation = invoked.invocation;
            let path = path_of(&invocation.callback_url);
            let body = result(&invocation.group_id, &invocation.id, &invocation.id).to_string();
            turn += 1;
            let (client, nodes, start) = (client.clone(), nodes.clone(), turn);
            tokio::spawn(async move {
                for attempt in 0.. {
                    let node = &nodes[(start + attempt) % nodes.len()];
                    let sent = client
                        .post(format!("{node}{path}"))
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await;
                    if sent.is_ok_and(|r| r.status().is_success()) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
    })
}

/// Submits `calls` calls over `threads` threads, alternating nodes, with a
/// few in flight at once; retries a submission a node could not take (the
/// same id: at most one call results). Returns `(group_id, id)` of each.
async fn submit_load(nodes: &[Api], threads: usize, calls: usize) -> Vec<(String, String)> {
    use futures::StreamExt;
    let all: Vec<(String, String)> = (0..calls)
        .map(|i| (format!("load-{}", i % threads), format!("c{i}")))
        .collect();
    futures::stream::iter(all.iter().enumerate())
        .for_each_concurrent(16, |(i, (g, id))| async move {
            let body = json!({"operation": "op", "arguments": {}, "group_id": g, "id": id});
            for attempt in 0..200 {
                let node = &nodes[(i + attempt) % nodes.len()];
                let sent = node
                    .client
                    .post(format!("{}/v1/calls", node.base))
                    .json(&body)
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status() == 202 || r.status() == 200 => return,
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            panic!("no node took call {id}");
        })
        .await;
    all
}

/// Waits until every call has its result, then checks each has exactly one
/// `call_accepted` and one `tool_result` (reading through `reader`).
async fn every_call_has_one_outcome(reader: &Api, calls: &[(String, String)]) {
    let mut threads: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (g, id) in calls {
        threads.entry(g).or_default().push(id);
    }
    for (g, ids) in threads {
        let events = eventually(
            &format!("every result of {g}"),
            Duration::from_secs(90),
            || async {
                let (status, body) = reader
                    .get(&format!("/v1/threads/{}/events?limit=10000", seg(g)))
                    .await;
                let events = body["events"].as_array().cloned().unwrap_or_default();
                let results = events.iter().filter(|e| e["type"] == "tool_result").count();
                (status == 200 && results >= ids.len()).then_some(events)
            },
        )
        .await;
        let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "{g}: dense, in order"
        );
        for id in ids {
            let of = |kind: &str| {
                events
                    .iter()
                    .filter(|e| e["type"] == kind && e["id"] == *id)
                    .count()
            };
            assert_eq!(of("call_accepted"), 1, "{g}/{id}");
            assert_eq!(of("tool_result"), 1, "{g}/{id}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_under_load_loses_nothing() {
    let mut c = Cluster::start(3).await;
    let tool = c.tool.clone();
    let answering = answer_everything(tool.clone(), vec![c.a.url.clone(), c.b.url.clone()]);
    let nodes = [c.a.api(), c.b.api()];
    let load = submit_load(&nodes, 50, 500);
    let killer = async {
        // Kill a worker once the load is well under way, restart it later.
        eventually("dispatches under way", Duration::from_secs(60), || async {
            (tool.invocations().len() >= 100).then_some(())
        })
        .await;
        c.workers[0].kill9();
        eventually("more dispatches", Duration::from_secs(60), || async {
            (tool.invocations().len() >= 250).then_some(())
        })
        .await;
        c.workers[0].restart().await;
    };
    let (calls, ()) = tokio::join!(load, killer);
    every_call_has_one_outcome(&c.b.api(), &calls).await;
    answering.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_down_for_five_seconds_under_load_loses_nothing() {
    let mut c = Cluster::start(2).await;
    let answering = answer_everything(c.tool.clone(), vec![c.a.url.clone(), c.b.url.clone()]);
    let nodes = [c.a.api(), c.b.api()];
    let tool = c.tool.clone();
    let load = submit_load(&nodes, 20, 200);
    let outage = async {
        eventually("dispatches under way", Duration::from_secs(60), || async {
            (tool.invocations().len() >= 40).then_some(())
        })
        .await;
        c.nats.kill9();
        // The outage itself: submissions and results are refused (503)
        // and retried until NATS is back.
        tokio::time::sleep(Duration::from_secs(5)).await;
        c.nats.restart().await;
    };
    let (calls, ()) = tokio::join!(load, outage);
    every_call_has_one_outcome(&c.a.api(), &calls).await;
    answering.abort();
}

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
    eventually("reads again", Duration::from_secs(30), || async {
        (b.get("/v1/threads/g").await.0 == 200).then_some(())
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

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_node_killed_mid_load_is_covered_by_the_other() {
    let mut c = Cluster::start(2).await;
    let answering = answer_everything(c.tool.clone(), vec![c.b.url.clone()]);
    let nodes = [c.a.api(), c.b.api()];
    let tool = c.tool.clone();
    let load = submit_load(&nodes, 20, 200);
    let kill = async {
        eventually("dispatches under way", Duration::from_secs(60), || async {
            (tool.invocations().len() >= 40).then_some(())
        })
        .await;
        c.a.kill9();
    };
    let (calls, ()) = tokio::join!(load, kill);
    // B serves every thread, including those A accepted.
    every_call_has_one_outcome(&c.b.api(), &calls).await;
    c.a.restart().await;
    every_call_has_one_outcome(&c.a.api(), &calls).await;
    answering.abort();
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

#[tokio::test(flavor = "multi_thread")]
async fn a_three_node_nats_cluster_loses_a_node_under_load_and_nothing() {
    let mut nats = ferry_tests::NatsCluster::start().await;
    let urls = nats.urls();
    let tool = Arc::new(TestTool::start("t", &["op"]).await);
    let replicated = |mut options: FerryOptions| {
        options
            .args
            .extend(["--replicas".to_owned(), "3".to_owned()]);
        options
    };
    let a = Ferry::start(replicated(FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::runtime(&urls)
    }))
    .await;
    let b = Ferry::start(replicated(FerryOptions::runtime(&urls))).await;
    let _workers = [
        FerryWorker::start(&urls, &a.url).await,
        FerryWorker::start(&urls, &b.url).await,
    ];
    // The streams really are replicated on all three servers.
    let servers: Vec<async_nats::ServerAddr> =
        urls.split(',').map(|u| u.parse().unwrap()).collect();
    let js = async_nats::jetstream::new(async_nats::connect(servers).await.unwrap());
    for name in [WORK_STREAM] {
        let mut stream = js.get_stream(name).await.unwrap();
        let replicas = stream.info().await.unwrap().config.num_replicas;
        assert_eq!(replicas, 3, "{name}");
    }
    let answering = answer_everything(tool.clone(), vec![a.url.clone(), b.url.clone()]);
    let nodes = [a.api(), b.api()];
    let load = submit_load(&nodes, 20, 200);
    let kill = async {
        eventually("dispatches under way", Duration::from_secs(60), || async {
            (tool.invocations().len() >= 40).then_some(())
        })
        .await;
        nats.nodes[0].kill9();
    };
    let (calls, ()) = tokio::join!(load, kill);
    every_call_has_one_outcome(&b.api(), &calls).await;
    answering.abort();
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

#[tokio::test(flavor = "multi_thread")]
async fn a_result_nats_could_not_carry_ends_its_call_and_holds_nothing_back() {
    let c = Cluster::start(1).await;
    let a = c.a.api();
    let url = path_of(&c.dispatched(&a, "g", "c1").await);
    // NATS's default max_payload is 1 MiB. A result given as content
    // becomes a commit holding its text four times (the event's and the
    // call's, each as text and as content), compressed: over 1 MiB for
    // 400 KB of text that does not compress. It could never be stored.
    let big = json!({"type": "tool_result", "group_id": "g", "id": "c1",
        "content": [{"type": "text", "text": noise(400_000, 3)}]});
    let (status, body) = a.post(&url, &big).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    // Tools do not retry a 4xx (rap-3): the call fails with an error
    // result in its place rather than waiting forever, and the tool is told.
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("with an error result saying so"),
        "{message}"
    );
    a.wait_for("g", "c1", "tool_result").await;
    let (_, call) = c.b.api().call("g", "c1").await;
    assert_eq!(call["status"], "failed", "{call}");
    assert_eq!(call["result"]["is_error"], true, "{call}");
    let told = json!({"thread_id": "g", "tool_call_id": "c1"});
    assert_eq!(
        c.tool.next_notice().await,
        ("cancel_tool_call".into(), told)
    );
    let said = call["result"]["text"].as_str().unwrap();
    assert!(
        said.starts_with("Error: the tool's result was larger"),
        "{said}"
    );
    // Nothing waits behind it: a result NATS can carry lands at once.
    let url = path_of(&c.dispatched(&a, "g", "c2").await);
    let fits = "y".repeat(200_000);
    let (status, body) = a.post(&url, &result("g", "c2", &fits)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("applied")),
        "{body}"
    );
    let (_, call) = c.b.api().call("g", "c2").await;
    assert_eq!(call["result"]["text"].as_str().map(str::len), Some(200_000));
    assert_eq!(a.count("g", "c1", "tool_result").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_the_stream_refused_never_wakes_a_reader() {
    let c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let url = path_of(&c.dispatched(&a, "g", "c1").await);
    answer(&a, &url, "g", "c1", "done").await;
    // B follows the thread: its stream has shown every event so far.
    let events = a.events("g", 0).await;
    let mut stream = SseReader::open(&b, "/v1/threads/g/stream", None).await;
    for expected in &events {
        assert_eq!(&stream.next().await.data, expected);
    }
    let last = events.last().unwrap()["seq"].as_u64().unwrap();
    // A writer that lost its compare-and-set: the stream refuses the
    // commit, but a JetStream publish is also a core NATS message, and
    // reaches any core subscriber of its subject all the same.
    let nats = async_nats::connect(c.nats.url()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Expected-Last-Subject-Sequence", "1");
    headers.insert(
        "Nats-Expected-Last-Subject-Sequence-Subject",
        Layout::new(1).log("g").as_str(),
    );
    headers.insert("Ferry-Last-Seq", (last + 5).to_string().as_str());
    let subject = Layout::new(1).commit("g", false);
    let refused = async_nats::jetstream::new(nats)
        .publish_with_headers(subject, headers, "lost".into())
        .await
        .unwrap()
        .await;
    assert!(refused.is_err(), "the stream stored a stale commit");
    // So a long poll after the last real event finds nothing and waits
    // its whole time instead of answering at once.
    let started = std::time::Instant::now();
    let (status, body) = b
        .get(&format!("/v1/threads/g/events?after={last}&wait=2"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["events"], json!([]), "{body}");
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "woken by a commit that was never stored, after {:?}",
        started.elapsed()
    );
    // And a real commit still wakes B's stream.
    let url = path_of(&c.dispatched(&a, "g", "c2").await);
    answer(&a, &url, "g", "c2", "again").await;
    let (_, call) = b.call("g", "c2").await;
    assert_eq!(call["status"], "completed");
    loop {
        let event = stream.next().await.data;
        if event["type"] == "tool_result" && event["id"] == "c2" {
            break;
        }
    }
}

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

/// A worker keeps calls waiting out a `Retry-After` in hand without
/// letting them hold up another tool's calls (the single-node test is in
/// `dispatch.rs`).
#[tokio::test(flavor = "multi_thread")]
async fn calls_waiting_to_retry_do_not_hold_up_other_tools() {
    let nats = Nats::start().await;
    let stuck = TestTool::start("stuck", &["wait"]).await;
    let healthy = TestTool::start("healthy", &["go"]).await;
    stuck.plan(&[ferry_tests::Ack::RetryAfter(429, 120); 3]);
    let a = Ferry::start(FerryOptions {
        tool_servers: vec![stuck.url.clone(), healthy.url.clone()],
        ..FerryOptions::runtime(&nats.url())
    })
    .await;
    let flags = ["--max-in-flight", "2"];
    let _worker = FerryWorker::start_with(
        &nats.url(),
        &a.url,
        &[&flags[..], &["--max-backoff-ms", "200000"]].concat(),
    )
    .await;
    ferry_tests::calls_waiting_to_retry_leave_room(&a.api(), &stuck).await;
    assert_eq!(healthy.invocations().len(), 1);
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

/// rap-3's `/tool_call_status` in a cluster: a worker that starts asks
/// the tool servers about every call they were given, so a call a tool
/// forgot while no worker ran (a tool restarted meanwhile, say) is settled
/// with RAP's error instead of waiting for good; a tool that cannot say
/// (a 5xx) keeps its call.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_its_tool_forgot_while_every_worker_was_down_is_settled() {
    use ferry_tests::tool::Liveness;
    let mut c = Cluster::start(1).await;
    let unsure = TestTool::start("u", &["op_u"]).await;
    let a = c.a.api();
    registered_on_both(&a, &c.b.api(), &unsure.url, "u").await;
    c.dispatched(&a, "g", "forgotten").await;
    let (status, body) = a
        .submit(json!({"operation": "op_u", "arguments": {}, "group_id": "g", "id": "kept"}))
        .await;
    assert_eq!(status, 202, "{body}");
    unsure.next_invocation().await;
    a.wait_for("g", "kept", "call_dispatched").await;
    c.workers[0].kill9();
    c.tool.set_liveness(Liveness::Alive(false));
    unsure.set_liveness(Liveness::Status(503));
    c.workers[0].restart().await;
    let failed = a.wait_for("g", "forgotten", "tool_result").await;
    assert_eq!(failed["payload"]["is_error"], true, "{failed}");
    assert_eq!(failed["payload"]["origin"], "ferry", "{failed}");
    let (_, call) = c.b.api().call("g", "forgotten").await;
    assert_eq!(call["status"], "failed", "{call}");
    // Asked too, and kept: a 5xx says nothing about the call.
    let (notice, asked) = unsure.next_notice().await;
    assert_eq!(
        (notice.as_str(), &asked["tool_call_id"]),
        ("tool_call_status", &json!("kept"))
    );
    let (_, call) = a.call("g", "kept").await;
    assert_eq!(call["status"], "dispatched", "{call}");
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
/// A runtime node on `nats` with `tool` registered and `args` besides.
async fn node_with(nats: &Nats, tool: &TestTool, args: &[&str]) -> Ferry {
    let mut options = FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::runtime(&nats.url())
    };
    options.args.extend(args.iter().map(|a| (*a).to_owned()));
    Ferry::start(options).await
}

/// One JSON-RPC request to `{node}/mcp`: the answer's status, session
/// header and body.
async fn mcp(
    node: &str,
    session: Option<&str>,
    method: &str,
    params: Value,
) -> (u16, Option<String>, Value) {
    let mut request = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{node}/mcp"))
        .header("accept", "application/json")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
    if let Some(s) = session {
        request = request.header("mcp-session-id", s);
    }
    let response = request.send().await.expect("POST /mcp");
    let status = response.status().as_u16();
    let session = response
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    (
        status,
        session,
        response.json().await.unwrap_or(Value::Null),
    )
}

/// MCP and OXP on runtime nodes: a call made through either front on one
/// node runs through the cluster (journal, relay, a worker) and its result,
/// called back to the other node, is the front's answer; bad input gets
/// each protocol's error and records nothing.
#[tokio::test(flavor = "multi_thread")]
async fn mcp_and_oxp_calls_run_through_any_runtime_node() {
    let c = Cluster::start(1).await;
    let answering = answer_everything(c.tool.clone(), vec![c.b.url.clone()]);
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {},
                      "clientInfo": {"name": "cluster-test", "version": "1"}});
    let (status, session, body) = mcp(&c.a.url, None, "initialize", init).await;
    assert_eq!(status, 200, "{body}");
    let session = session.expect("a session id");

    let call = json!({"name": "op", "arguments": {}});
    let (status, _, body) = mcp(&c.a.url, Some(&session), "tools/call", call).await;
    assert_eq!(status, 200, "{body}");
    let result = &body["result"];
    assert_eq!(result["isError"], false, "{body}");
    let (g, id) = (
        result["_meta"]["io.ferry/group_id"].as_str().unwrap(),
        result["_meta"]["io.ferry/id"].as_str().unwrap(),
    );
    // The tool's answer (its text is the call's id), read on the other node.
    assert_eq!(result["content"][0]["text"], id, "{body}");
    assert_eq!(c.b.api().count(g, id, "tool_result").await, 1);

    let unknown = json!({"name": "nope", "arguments": {}});
    let (_, _, body) = mcp(&c.a.url, Some(&session), "tools/call", unknown).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
    let not_object = json!({"name": "op", "arguments": [1]});
    let (_, _, body) = mcp(&c.a.url, Some(&session), "tools/call", not_object).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");

    let oxp = |input: Value, call_id: &str| {
        let body = json!({"request": {"tool_id": "t.op", "input": input, "call_id": call_id,
                                      "context": {"user_id": "u1"}}});
        let url = format!("{}/oxp/tools/call", c.b.url);
        async move {
            let r = reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = oxp(json!({}), "oxp-1").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("error").is_none(), "{body}");
    let sent = c
        .tool
        .invocations()
        .into_iter()
        .find(|i| i.id == "oxp-1")
        .unwrap();
    assert_eq!(
        c.a.api()
            .count(&sent.group_id, "oxp-1", "tool_result")
            .await,
        1
    );
    // The same call_id with other input is refused by the worker, and the
    // refusal reaches the OXP client as the front's own error.
    let (status, body) = oxp(json!({"other": true}), "oxp-1").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["message"], "This call_id was already used for a different call",
        "{body}"
    );
    assert_eq!(
        c.a.api()
            .count(&sent.group_id, "oxp-1", "call_accepted")
            .await,
        1
    );
    answering.abort();
}

/// MCP 2025-11-25, "Session Management": "The server MAY terminate the
/// session at any time, after which it MUST respond to requests containing
/// that session ID with HTTP 404 Not Found." A session lives in JetStream
/// KV: opened on node A, it is served by node B (its calls go to the
/// session's thread); ended on B, it is ended on A too. While NATS is away
/// a session cannot be opened or read: 503 with `Retry-After`, a JSON-RPC
/// error, and the session is still there once NATS is back.
#[tokio::test(flavor = "multi_thread")]
async fn a_2025_mcp_session_opened_on_one_node_continues_on_another() {
    let mut c = Cluster::start(1).await;
    let answering = answer_everything(c.tool.clone(), vec![c.a.url.clone()]);
    let init = json!({"protocolVersion": "2025-11-25", "capabilities": {},
                      "clientInfo": {"name": "cluster-test", "version": "1"}});
    let (status, session, body) = mcp(&c.a.url, None, "initialize", init.clone()).await;
    assert_eq!(status, 200, "{body}");
    let session = session.expect("a session id");

    let (status, _, body) = mcp(&c.b.url, Some(&session), "tools/list", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "op"),
        "{body}"
    );
    let call = json!({"name": "op", "arguments": {}});
    let (status, _, body) = mcp(&c.b.url, Some(&session), "tools/call", call.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["isError"], false, "{body}");
    assert_eq!(
        body["result"]["_meta"]["io.ferry/group_id"],
        json!(session),
        "{body}"
    );

    // Unknown ids, and ids no KV key can be, are 404 on every node.
    for bad in ["mcp-0123", "mcp-a.b", "mcp-*", "mcp->"] {
        let (status, _, body) = mcp(&c.b.url, Some(bad), "tools/list", json!({})).await;
        assert_eq!(
            (status, body["error"]["code"].as_i64()),
            (404, Some(-32001)),
            "{bad}: {body}"
        );
    }

    c.nats.kill9();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    for (headers, method) in [(None, "initialize"), (Some(&session), "tools/list")] {
        let mut request = client
            .post(format!("{}/mcp", c.a.url))
            .header("accept", "application/json")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": init}));
        if let Some(s) = headers {
            request = request.header("mcp-session-id", s);
        }
        let sent = request.send().await.unwrap();
        assert_eq!(sent.status().as_u16(), 503, "{method}");
        assert_eq!(sent.headers()["retry-after"], "1", "{method}");
        let body: Value = sent.json().await.unwrap();
        assert_eq!(body["error"]["code"], -32603, "{method}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("retry"),
            "{body}"
        );
    }
    c.nats.restart().await;
    eventually(
        "the session, read again",
        Duration::from_secs(30),
        || async {
            let (status, _, _) = mcp(&c.a.url, Some(&session), "tools/list", json!({})).await;
            (status == 200).then_some(())
        },
    )
    .await;

    let end = |node: String| {
        let (client, session) = (client.clone(), session.clone());
        async move {
            let sent = client
                .delete(format!("{node}/mcp"))
                .header("mcp-session-id", session)
                .send()
                .await
                .unwrap();
            sent.status().as_u16()
        }
    };
    assert_eq!(end(c.b.url.clone()).await, 204);
    let (status, _, body) = mcp(&c.a.url, Some(&session), "tools/call", call).await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (404, Some(-32001)),
        "{body}"
    );
    assert_eq!(end(c.a.url.clone()).await, 404, "ended already");
    // The session's thread stays readable: one call, one result.
    let events = c.a.api().events(&session, 0).await;
    assert_eq!(
        events.iter().filter(|e| e["type"] == "tool_result").count(),
        1,
        "{events:?}"
    );
    answering.abort();
}

/// MCP and OXP calls made before any worker runs are accepted by the node
/// (decided and stored), and answered with the tool's result once a
/// worker starts and dispatches them.
#[tokio::test(flavor = "multi_thread")]
async fn mcp_and_oxp_calls_made_before_any_worker_runs_are_answered_once_one_does() {
    let nats = Nats::start().await;
    let tool = Arc::new(TestTool::start("t", &["op"]).await);
    let a = node_with(&nats, &tool, &[]).await;
    let answering = answer_everything(tool.clone(), vec![a.url.clone()]);
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {},
                      "clientInfo": {"name": "cluster-test", "version": "1"}});
    let (_, session, body) = mcp(&a.url, None, "initialize", init).await;
    let session = session.unwrap_or_else(|| panic!("no session: {body}"));

    let call = json!({"name": "op", "arguments": {}});
    let oxp = json!({"request": {"tool_id": "t.op", "input": {}, "call_id": "oxp-j"}});
    let oxp_call = async {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let r = client
            .post(format!("{}/oxp/tools/call", a.url))
            .json(&oxp)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    // The worker starts only after both calls were sent.
    let nats_url = nats.url();
    let ((status, _, mcp_body), (oxp_status, oxp_body), _worker) = tokio::join!(
        mcp(&a.url, Some(&session), "tools/call", call),
        oxp_call,
        FerryWorker::start(&nats_url, &a.url),
    );
    assert_eq!(status, 200, "{mcp_body}");
    assert_eq!(mcp_body["result"]["isError"], false, "{mcp_body}");
    let id = mcp_body["result"]["_meta"]["io.ferry/id"].as_str().unwrap();
    assert_eq!(mcp_body["result"]["content"][0]["text"], id, "{mcp_body}");
    assert_eq!(
        (oxp_status, &oxp_body["result"]["success"]),
        (200, &json!(true)),
        "{oxp_body}"
    );
    answering.abort();
}

/// NATS down: an OXP call is refused with OXP's own server error (400)
/// saying to retry, and nothing is recorded. Retried after NATS is back,
/// it answers the tool's result; the agent sees one outcome.
#[tokio::test(flavor = "multi_thread")]
async fn an_oxp_call_made_while_nats_is_down_answers_a_retry_once_it_is_back() {
    let mut nats = Nats::start().await;
    let tool = Arc::new(TestTool::start("t", &["op"]).await);
    let a = node_with(&nats, &tool, &["--oxp-wait-secs", "5"]).await;
    let _worker = FerryWorker::start(&nats.url(), &a.url).await;
    let answering = answer_everything(tool.clone(), vec![a.url.clone()]);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let oxp = || async {
        let body = json!({"request": {"tool_id": "t.op", "input": {}, "call_id": "oxp-down"}});
        let r = client
            .post(format!("{}/oxp/tools/call", a.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    nats.kill9();
    let (status, body) = oxp().await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["developer_message"]
            .as_str()
            .is_some_and(|m| m.contains("retry")),
        "{body}"
    );
    nats.restart().await;
    let done = eventually(
        "the retried call's result",
        Duration::from_secs(60),
        || async {
            let (_, body) = oxp().await;
            (body["result"]["success"] == true).then_some(body)
        },
    )
    .await;
    assert_eq!(done["result"]["value"], "oxp-down", "{done}");
    let api = a.api();
    assert_eq!(
        api.count("oxp-anonymous", "oxp-down", "tool_result").await,
        1
    );
    assert_eq!(
        api.count("oxp-anonymous", "oxp-down", "call_accepted")
            .await,
        1
    );
    answering.abort();
}

/// A tool server whose one tool, `op`, is destructive: gated.
async fn gated_tool() -> TestTool {
    TestTool::with_manifest(json!({"name": "t", "tools": [{
        "name": "op", "description": "destructive: gated",
        "inputSchema": ferry_tests::tool::text_schema(),
        "annotations": {"destructive": true},
    }]}))
    .await
}

/// An ACP permission answer is decided like a native one: with NATS down
/// it is refused (503, a JSON-RPC error) and changes nothing; the same
/// answer once NATS is back is applied, and the gated call runs.
#[tokio::test(flavor = "multi_thread")]
async fn an_acp_answer_refused_while_nats_is_down_is_applied_when_sent_again() {
    let mut nats = Nats::start().await;
    let tool = Arc::new(gated_tool().await);
    let a = node_with(&nats, &tool, &[]).await;
    let _worker = FerryWorker::start(&nats.url(), &a.url).await;
    let api = a.api();
    let (status, body) = api
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g-acp", "id": "c"}))
        .await;
    assert_eq!(status, 202, "{body}");
    api.wait_for("g-acp", "c", "approval_requested").await;

    nats.kill9();
    let answer = json!({"jsonrpc": "2.0", "id": "ferry-permission:c",
                        "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}});
    let (status, body) = api.post("/v1/threads/g-acp/acp", &answer).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["code"].is_i64(), "a JSON-RPC error: {body}");
    nats.restart().await;
    eventually("the answer taken", Duration::from_secs(60), || async {
        let (status, _) = api.post("/v1/threads/g-acp/acp", &answer).await;
        (status == 202).then_some(())
    })
    .await;
    let sent = tool.next_invocation().await.invocation;
    assert_eq!((sent.group_id.as_str(), sent.id.as_str()), ("g-acp", "c"));
    let decided = api.wait_for("g-acp", "c", "approval_decided").await;
    assert_eq!(decided["payload"]["reviewer"], "acp", "{decided}");
}

/// ACP through either node: the permission request of a call submitted on
/// node A reaches an ACP client following the thread on node B; its
/// answer, posted to B, is decided once and the call runs; the same answer
/// sent to A afterwards is 409, as on one process.
#[tokio::test(flavor = "multi_thread")]
async fn an_acp_permission_asked_through_one_node_is_answered_through_the_other() {
    let nats = Nats::start().await;
    let tool = Arc::new(gated_tool().await);
    let a = node_with(&nats, &tool, &[]).await;
    let b = Ferry::start(FerryOptions::runtime(&nats.url())).await;
    let _worker = FerryWorker::start(&nats.url(), &a.url).await;
    let answering = answer_everything(tool.clone(), vec![a.url.clone(), b.url.clone()]);
    let (api_a, api_b) = (a.api(), b.api());
    let mut stream =
        ferry_tests::sse::SseReader::open(&api_b, "/v1/threads/g-acp2/acp", None).await;
    let (status, body) = api_a
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g-acp2", "id": "c"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let asked = loop {
        let event = stream.next().await;
        if event.data["method"] == "session/request_permission" {
            break event.data;
        }
    };
    assert_eq!(asked["params"]["toolCall"]["toolCallId"], "c", "{asked}");
    let answer = json!({"jsonrpc": "2.0", "id": asked["id"],
                        "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}});
    let (status, body) = api_b.post("/v1/threads/g-acp2/acp", &answer).await;
    assert_eq!(status, 202, "{body}");
    let done = api_a.wait_for("g-acp2", "c", "tool_result").await;
    assert_eq!(done["payload"]["text"], "c", "{done}");
    let (status, body) = api_a.post("/v1/threads/g-acp2/acp", &answer).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(api_b.count("g-acp2", "c", "approval_decided").await, 1);
    assert_eq!(
        api_a.events("g-acp2", 0).await,
        api_b.events("g-acp2", 0).await
    );
    answering.abort();
}

/// Registers the toolset at `url` (named `name`) on node `a` and waits
/// until node `b` serves it too.
async fn registered_on_both(a: &Api, b: &Api, url: &str, name: &str) {
    let (status, body) = a.register(url).await;
    assert!(status < 300, "{body}");
    let path = format!("/v1/toolsets/{name}");
    eventually(
        "B to serve the toolset",
        Duration::from_secs(20),
        || async { (b.get(&path).await.0 == 200).then_some(()) },
    )
    .await;
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

/// Workers retry as a single process does: a tool answering 500 twice and
/// then 200 is dispatched with `attempts: 3`; a tool that refuses
/// connections ends its call failed, with a text starting `Error: `.
/// A worker killed while a call waits to retry: the worker that takes the
/// work over counts the attempts recorded before, so the tool sees
/// `--max-attempts` in all.
#[tokio::test(flavor = "multi_thread")]
async fn the_attempt_bound_holds_when_the_retrying_worker_dies() {
    let nats = Nats::start().await;
    let tool = TestTool::start("t", &["op"]).await;
    let a = Ferry::start(FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::runtime(&nats.url())
    })
    .await;
    let bound = ["--max-attempts", "3"];
    let mut first = FerryWorker::start_with(&nats.url(), &a.url, &bound).await;
    let api = a.api();
    let failing = ferry_tests::Ack::Status(503);
    tool.plan(&[
        failing,
        ferry_tests::Ack::RetryAfter(503, 120),
        failing,
        failing,
        failing,
    ]);
    let (status, body) = api
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    assert!(status < 300, "{body}");
    api.wait_event("g", 0, |e| {
        e["type"] == "dispatch_retrying" && e["payload"]["attempts"] == 2
    })
    .await;
    first.kill9();
    // The work comes back to a second worker after its ack deadline.
    let _second = FerryWorker::start_with(&nats.url(), &a.url, &bound).await;
    let failed = api.wait_for("g", "c", "tool_result").await;
    assert_eq!(
        failed["payload"]["text"],
        "Error: the tool kept failing (HTTP 503) after 3 attempts"
    );
    assert_eq!(tool.invocations().len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_retry_and_give_up_like_a_single_process() {
    let nats = Nats::start().await;
    let tool = TestTool::start("t", &["op"]).await;
    let gone = TestTool::start("gone", &["away"]).await;
    let a = Ferry::start(FerryOptions {
        tool_servers: vec![tool.url.clone(), gone.url.clone()],
        ..FerryOptions::runtime(&nats.url())
    })
    .await;
    let fast = ["--max-attempts", "3", "--initial-backoff-ms", "10"];
    let _worker = FerryWorker::start_with(&nats.url(), &a.url, &fast).await;
    let api = a.api();

    tool.plan(&[ferry_tests::Ack::Status(500), ferry_tests::Ack::Status(500)]);
    let (status, body) = api
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "flaky"}))
        .await;
    assert!(status < 300, "{body}");
    let dispatched = api.wait_for("g", "flaky", "call_dispatched").await;
    assert_eq!(dispatched["payload"]["attempts"], 3, "{dispatched}");
    assert_eq!(tool.invocations().len(), 3);
    let retried: Vec<_> = api
        .events("g", 0)
        .await
        .into_iter()
        .filter(|e| e["type"] == "dispatch_retrying")
        .map(|e| e["payload"]["attempts"].clone())
        .collect();
    assert_eq!(retried, [json!(1), json!(2)]);

    gone.stop();
    let (status, body) = api
        .submit(json!({"operation": "away", "arguments": {}, "group_id": "g", "id": "down"}))
        .await;
    assert!(status < 300, "{body}");
    let failed = api.wait_for("g", "down", "tool_result").await;
    assert_eq!(failed["payload"]["is_error"], true, "{failed}");
    assert!(
        failed["payload"]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("Error: ")),
        "{failed}"
    );
    let (_, call) = api.call("g", "down").await;
    assert_eq!(
        (&call["status"], &call["attempts"]),
        (&json!("failed"), &json!(3)),
        "{call}"
    );
}

/// DESIGN.md, invariant 6: "Events of one thread are totally ordered".
/// Two nodes take one thread's requests at once — submissions, a
/// subscription's events, results, a cancel, an approval decision — and
/// every 2xx'd request is in the log exactly once, in one order that both
/// nodes read alike.
#[tokio::test(flavor = "multi_thread")]
async fn two_nodes_taking_one_threads_requests_at_once_make_one_order() {
    let c = Cluster::start(2).await;
    let (a, b) = (c.a.api(), c.b.api());
    let url = path_of(&c.dispatched(&a, "g", "s").await);
    let opened = json!({"type": "tool_result", "group_id": "g", "id": "s", "text": "on", "subscription": true});
    assert_eq!(b.post(&url, &opened).await.0, 200);
    let nodes = [&a, &b];
    let ticks = (0..60).map(|n| {
        let (node, url) = (nodes[n % 2], url.clone());
        async move {
            let event = json!({"type": "subscription_event", "group_id": "g",
                               "tool_call_id": "s", "text": format!("tick {n}")});
            let (status, body) = node.post(&url, &event).await;
            assert_eq!(
                (status, body["status"].as_str()),
                (200, Some("applied")),
                "{body}"
            );
        }
    });
    let submissions = (0..20).map(|n| {
        let node = nodes[n % 2];
        async move {
            let call =
                json!({"operation": "op", "arguments": {}, "group_id": "g", "id": format!("c{n}")});
            let (status, body) = node.submit(call).await;
            assert_eq!(status, 202, "{body}");
        }
    });
    let cancel = async {
        let call = json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "doomed"});
        assert_eq!(b.submit(call).await.0, 202);
        let (status, body) = a.delete("/v1/threads/g/calls/doomed").await;
        assert_eq!(status, 200, "{body}");
    };
    tokio::join!(join_all(ticks), join_all(submissions), cancel);
    // Workers record each call's dispatch a little later: read once the
    // log is whole.
    let on_a = eventually("every call dispatched", Duration::from_secs(60), || async {
        let events = a.events("g", 0).await;
        let dispatched = |id: String| {
            events
                .iter()
                .any(|e| e["id"] == id && e["type"] == "call_dispatched")
        };
        (0..20)
            .all(|n| dispatched(format!("c{n}")))
            .then_some(events)
    })
    .await;
    let on_b = b.events("g", 0).await;
    assert_eq!(on_a, on_b, "both nodes read one order");
    let seqs: Vec<u64> = on_a.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "dense");
    let of = |kind: &str| on_a.iter().filter(|e| e["type"] == kind).count();
    assert_eq!(of("subscription_event"), 60);
    assert_eq!(of("call_accepted"), 22);
    assert_eq!(of("call_cancelled"), 1);
    let mut texts: Vec<&str> = on_a
        .iter()
        .filter(|e| e["type"] == "subscription_event")
        .map(|e| e["payload"]["text"].as_str().unwrap())
        .collect();
    texts.sort_unstable();
    texts.dedup();
    assert_eq!(texts.len(), 60, "each event once");
    // Nothing is dispatched after its cancel was decided.
    let cancelled_at = on_a
        .iter()
        .find(|e| e["type"] == "call_cancelled")
        .and_then(|e| e["seq"].as_u64())
        .unwrap();
    assert!(!on_a.iter().any(|e| e["id"] == "doomed"
        && e["type"] == "call_dispatched"
        && e["seq"].as_u64().unwrap() > cancelled_at));
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

/// Core NATS delivers what the stream republishes at most once: a commit
/// made while a node is reconnecting never reaches that node that way. A
/// stream open on the node still delivers it once the node is back (before,
/// it waited for the thread's next event, here forever).
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_on_a_node_that_lost_nats_for_a_while_delivers_what_it_missed() {
    let nats = Nats::start().await;
    let tool = TestTool::start("t", &["op"]).await;
    let proxy = ferry_tests::proxy::Proxy::start(&format!("127.0.0.1:{}", nats.port)).await;
    let a = Ferry::start(FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::runtime(&nats.url())
    })
    .await;
    let b = Ferry::start(FerryOptions::runtime(&proxy.nats_url())).await;
    let _worker = FerryWorker::start(&nats.url(), &a.url).await;
    let (a_api, b_api) = (a.api(), b.api());
    let call = json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c1"});
    let (status, body) = a_api.submit(call).await;
    assert_eq!(status, 202, "{body}");
    let sent = tool.next_invocation().await.invocation;
    a_api.wait_for("g", "c1", "call_dispatched").await;
    let mut stream = SseReader::open(&b_api, "/v1/threads/g/stream", None).await;
    for kind in ["call_accepted", "call_dispatched"] {
        assert_eq!(stream.next().await.data["type"], kind);
    }

    proxy.cut();
    eventually("B to lose NATS", Duration::from_secs(20), || async {
        (b_api.get("/v1/threads/g").await.0 == 503).then_some(())
    })
    .await;
    let (status, body) = a_api
        .post(&path_of(&sent.callback_url), &result("g", "c1", "done"))
        .await;
    assert_eq!(status, 200, "{body}");
    a_api.wait_for("g", "c1", "tool_result").await;
    proxy.restore();

    let missed = stream.next().await.data;
    assert_eq!(
        (&missed["type"], &missed["seq"]),
        (&json!("tool_result"), &json!(3))
    );
}

/// A worker of `c` started with `flags` and its `/metrics` on a port of
/// its own (the address is returned).
async fn metered_worker(c: &Cluster, flags: &[&str]) -> (FerryWorker, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let with = [flags, &["--metrics-listen", &listen]].concat();
    let worker = FerryWorker::start_with(&c.nats.url(), &c.a.url, &with).await;
    (worker, listen)
}

/// A worker has no API, and dispatches in its own process: with
/// `--metrics-listen` it serves its `/metrics` (dispatch outcomes, and
/// latency as a histogram) and `/healthz`.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_serves_its_dispatch_metrics() {
    let c = Cluster::start(0).await;
    let (_worker, listen) = metered_worker(&c, &[]).await;
    c.dispatched(&c.a.api(), "g", "c1").await;
    let get = |path: &str| reqwest::get(format!("http://{listen}{path}"));
    let health: Value = get("/healthz").await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "ok");
    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    let acknowledged = r#"ferry_dispatch_outcomes_total{outcome="acknowledged"} 1"#;
    assert!(metrics.contains(acknowledged), "{metrics}");
    let latency = "# TYPE ferry_dispatch_latency_seconds histogram";
    assert!(metrics.contains(latency), "{metrics}");
}

/// Text no compression shrinks: `n` pseudo-random letters and digits.
fn noise(n: usize, seed: u64) -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            LETTERS[(state >> 33) as usize % LETTERS.len()] as char
        })
        .collect()
}

/// A result whose commit NATS refuses only with the thread's views beside
/// it is refused like any result too large (not a 5xx, which tools retry
/// forever), and its call fails.
#[tokio::test(flavor = "multi_thread")]
async fn a_result_whose_commit_nats_refuses_fails_its_call() {
    let c = Cluster::start(1).await;
    let a = c.a.api();
    let url = path_of(&c.dispatched(&a, "g", "c1").await);
    let view = json!({"type": "view_update", "group_id": "g", "view_type": "big",
        "content": noise(100_000, 1)});
    let (status, body) = a.post(&url, &view).await;
    assert_eq!(status, 200, "{body}");
    // With 100 KB of views the commit is over NATS's 1 MiB.
    let big = json!({"type": "tool_result", "group_id": "g", "id": "c1",
        "content": [{"type": "text", "text": noise(240_000, 2)}]});
    let (status, body) = a.post(&url, &big).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (413, &json!("payload_too_large")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("with an error result saying so"),
        "{message}"
    );
    let (_, call) = c.b.api().call("g", "c1").await;
    assert_eq!(
        (&call["status"], &call["result"]["is_error"]),
        (&json!("failed"), &json!(true))
    );
    assert_eq!(a.count("g", "c1", "tool_result").await, 1);
}

/// Closing a thread cancels its open calls in one commit, which carries
/// each of them; when those are more than NATS takes in one message
/// (each well under the node's own limit), they are cancelled one commit
/// each and then the thread is closed, not refused 413 at every close
/// and left open for good.
#[tokio::test(flavor = "multi_thread")]
async fn a_thread_whose_open_calls_are_large_together_still_closes() {
    let c = Cluster::start(1).await;
    let a = c.a.api();
    for i in 0..6 {
        let id = format!("c{i}");
        // Text no compression shrinks, 200 KB of the 1 MiB max_payload.
        let big = noise(200_000, i);
        let (status, body) = a
            .submit(
                json!({"operation": "op", "arguments": {"text": big}, "group_id": "g", "id": id}),
            )
            .await;
        assert_eq!(status, 202, "{}", body["error"]);
        c.tool.next_invocation().await;
        a.wait_for("g", &id, "call_dispatched").await;
    }
    let thread = close(&a, "g").await;
    assert_eq!(thread["counts"], json!({"cancelled": 6}), "{thread}");
}

/// Closes thread `g` through `api`: closed when the answer comes. The
/// closed thread.
async fn close(api: &Api, g: &str) -> Value {
    let (status, body) = api
        .post(&format!("/v1/threads/{g}/close"), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, thread) = api.thread(g).await;
    assert_eq!(thread["closed"], true, "{thread}");
    thread
}

/// A stream opened on a node that has not reached NATS since it started
/// waits it out, then delivers the thread's events, those stored after it
/// caught up too. Before, once caught up it waited on the watch it took
/// before the store was there, which never moves: the `tool_result`
/// never came.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_opened_before_its_node_reached_nats_follows_the_thread() {
    let mut c = Cluster::start(1).await;
    let callback = c.dispatched(&c.a.api(), "g", "c1").await;
    c.a.kill9();
    c.nats.kill9();
    c.a.restart().await;
    let a = c.a.api();
    assert_eq!(a.get("/v1/threads/g").await.0, 503);
    let mut stream = SseReader::open(&a, "/v1/threads/g/stream", None).await;
    c.nats.restart().await;
    for kind in ["call_accepted", "call_dispatched"] {
        assert_eq!(stream.next().await.data["type"], kind);
    }
    let (status, body) = a
        .post(&path_of(&callback), &result("g", "c1", "done"))
        .await;
    assert_eq!(status, 200, "{body}");
    let answered = stream.next().await.data;
    assert_eq!(
        (&answered["type"], &answered["seq"]),
        (&json!("tool_result"), &json!(3))
    );
}

/// Core NATS drops the messages of a subscription whose reader fell
/// behind (a slow consumer) and never sends them again. When the
/// subscription a runtime node follows commits by drops some, the node
/// reads its watched threads' tips again, so no stream waits for a commit
/// it missed. Here the observing store's client holds one message per
/// subscription, on a single-threaded runtime: a burst of commits
/// overflows it.
#[tokio::test]
async fn watched_tips_catch_up_after_a_slow_subscription_dropped_commits() {
    use ferry_engine::store::Store;
    use ferry_nats::jetstream::{ClientEvents, JetStreamStore};

    let nats = Nats::start().await;
    let events = Arc::new(ClientEvents::default());
    let seen = events.clone();
    let observer = async_nats::ConnectOptions::new()
        .subscription_capacity(1)
        .event_callback(move |event| {
            seen.record(&event);
            std::future::ready(())
        })
        .connect(nats.url())
        .await
        .unwrap();
    let store = JetStreamStore::connect(observer, events.clone(), 1, Layout::new(1), true)
        .await
        .unwrap();
    // Another process's commits, as the stream stores them.
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let commit = |group_id: String, seq: u64| {
        let js = js.clone();
        async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Ferry-Last-Seq", seq.to_string().as_str());
            let subject = Layout::new(1).commit(&group_id, false);
            js.publish_with_headers(subject, headers, "commit".into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    let groups: Vec<String> = (0..200).map(|i| format!("g{i}")).collect();
    for group_id in &groups {
        commit(group_id.clone(), 1).await;
    }
    let mut watches: Vec<_> = groups.iter().map(|g| store.watch(g)).collect();
    for watch in &mut watches {
        let read = tokio::time::timeout(Duration::from_secs(10), watch.wait_for(|t| *t >= 1));
        assert!(
            matches!(read.await, Ok(Ok(_))),
            "a watch never read its tip"
        );
    }
    // Bursts until one overflowed the subscription (the first, in every
    // run seen), each committing the next sequence number to every thread.
    let before = events.slow_consumer_drops();
    let mut tip = 1;
    while events.slow_consumer_drops() == before {
        assert!(tip < 10, "nine bursts never overflowed the subscription");
        tip += 1;
        join_all(groups.iter().map(|g| commit(g.clone(), tip))).await;
        // The client reports a drop from its own task: poll for a while.
        let overflowed = async {
            while events.slow_consumer_drops() == before {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), overflowed).await;
    }
    for (group_id, watch) in groups.iter().zip(&mut watches) {
        let moved = tokio::time::timeout(Duration::from_secs(10), watch.wait_for(|t| *t >= tip));
        assert!(
            matches!(moved.await, Ok(Ok(_))),
            "{group_id}: its stored commit {tip} never reached the watch (tip {})",
            *watch.borrow()
        );
    }
}

/// Writers racing on one thread: nats-server answers the losers with
/// "wrong last sequence: N" (10071) or, in a cluster while the winner's
/// commit is still in flight, "wrong last sequence" (10164). Either is a lost
/// compare-and-set, which the engine decides again; neither may pass
/// for an outage (a 503 to the tool or agent that asked).
#[tokio::test(flavor = "multi_thread")]
async fn a_write_that_loses_a_race_is_a_conflict_whatever_nats_calls_it() {
    use ferry_engine::store::{Error, Store, Write};
    use ferry_nats::jetstream::JetStreamStore;
    use ferry_proto::api::{Event, EventKind};

    // Replicated, as the second answer is given by a stream's leader.
    let nats = ferry_tests::NatsCluster::start().await;
    let mut stores = vec![];
    let url = nats.nodes[0].url();
    for _ in 0..8 {
        // The first waits for the cluster to elect its JetStream leader.
        let store = eventually(
            "JetStream in the cluster",
            Duration::from_secs(30),
            || async {
                let client = async_nats::connect(&url).await.ok()?;
                JetStreamStore::connect(client, Arc::default(), 3, Layout::new(1), false)
                    .await
                    .ok()
            },
        )
        .await;
        stores.push(store);
    }
    let (mut stored, mut lost) = (0, 0);
    for _ in 0..50 {
        let writes = stores.iter().map(|store| async move {
            let mut state = store.load("g", &[]).await.unwrap();
            let expected_last_seq = state.meta.last_seq;
            state.meta.last_seq += 1;
            let events = [Event {
                seq: state.meta.last_seq,
                group_id: "g".into(),
                id: None,
                at: "2026-11-29T00:00:00.000Z".into(),
                idempotency_key: None,
                kind: EventKind::ThreadClosed {},
            }];
            let write = Write {
                expected_last_seq,
                state: &state,
                events: &events,
            };
            store.write(write).await
        });
        for written in join_all(writes).await {
            match written {
                Ok(()) => stored += 1,
                Err(Error::Conflict(_)) => lost += 1,
                Err(e) => panic!("a lost race taken for another failure: {e}"),
            }
        }
    }
    assert!(lost > 0, "no writers raced");
    let thread = stores[0].thread("g").await.unwrap().unwrap();
    assert_eq!(thread.last_seq, stored);
}

/// A node reads a thread's tip from the stream when a reader starts to
/// watch it. If that read fails (here the stream refuses direct gets for
/// a while), it is tried again until it succeeds: a thread written to no
/// more would otherwise keep its reader waiting for good.
#[tokio::test]
async fn a_failed_read_of_a_watched_tip_is_tried_again() {
    use ferry_engine::store::Store;
    use ferry_nats::jetstream::JetStreamStore;

    let nats = Nats::start().await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let store = JetStreamStore::connect(client.clone(), Arc::default(), 1, Layout::new(1), true)
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    let groups: Vec<String> = (0..20).map(|i| format!("g{i}")).collect();
    for group_id in &groups {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Ferry-Last-Seq", "1");
        let subject = Layout::new(1).commit(group_id, false);
        js.publish_with_headers(subject, headers, "commit".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let direct = |allow: bool| {
        let js = js.clone();
        async move {
            let mut config = js
                .get_stream(WORK_STREAM)
                .await
                .unwrap()
                .cached_info()
                .config
                .clone();
            config.allow_direct = allow;
            js.update_stream(config).await.unwrap();
        }
    };
    direct(false).await;
    let mut watches: Vec<_> = groups.iter().map(|g| store.watch(g)).collect();
    eventually(
        "a read of a tip to fail",
        Duration::from_secs(10),
        || async { store.tips_unread().then_some(()) },
    )
    .await;
    direct(true).await;
    for (group_id, watch) in groups.iter().zip(&mut watches) {
        let read = tokio::time::timeout(Duration::from_secs(10), watch.wait_for(|t| *t >= 1));
        assert!(
            matches!(read.await, Ok(Ok(_))),
            "{group_id}: its tip was never read again"
        );
    }
    assert!(!store.tips_unread());
}

/// Worker priorities (`ferry worker --priority`): the shared consumers,
/// as NATS reports them, and what a worker says it dispatched.
/// The consumer all workers share on `stream`, on a client of its own.
async fn shared(nats: &Nats, stream: &str) -> PullConsumer {
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    js.get_stream(stream)
        .await
        .unwrap()
        .get_consumer(streams::CONSUMER)
        .await
        .unwrap()
}

/// What NATS says of the consumer all workers share on `stream`.
async fn consumer(nats: &Nats, stream: &str) -> Info {
    shared(nats, stream).await.info().await.unwrap().clone()
}

mod priorities {
    use super::*;

    fn has_group(info: &Info) -> bool {
        info.config.priority_groups == [streams::PRIORITY_GROUP]
    }

    /// Invocations the tool acknowledged to the worker serving `/metrics`
    /// at `listen`.
    async fn acknowledged(listen: &str) -> u64 {
        let metrics = reqwest::get(format!("http://{listen}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let line = r#"ferry_dispatch_outcomes_total{outcome="acknowledged"} "#;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .map_or(0, |n| n.trim().parse().unwrap())
    }

    /// Waits until `n` pulls wait on each shared consumer.
    async fn pulls_waiting(nats: &Nats, n: usize) {
        eventually("the workers' pulls", Duration::from_secs(20), || async {
            let work = consumer(nats, WORK_STREAM).await.num_waiting;
            (work == n).then_some(())
        })
        .await;
    }

    /// A worker that holds four calls at most: one attempt in flight, and
    /// three more in hand waiting for it ([`hold_calls`] fills it). Its
    /// attempts outlast any test.
    const STUCK: [&str; 4] = ["--max-in-flight", "1", "--ack-timeout-ms", "600000"];

    /// Submits `calls` calls at once (threads `held0`, `held1`, ...), the
    /// first `at_tool` of them held at the tool, and waits until the tool
    /// has those and NATS has all `calls` out and not acked (with
    /// `waiting` pulls left on the dispatch work, when given).
    async fn hold_calls(c: &Cluster, calls: usize, at_tool: usize, waiting: Option<usize>) {
        c.tool.plan(&vec![ferry_tests::Ack::Held; at_tool]);
        burst(&c.a.api(), "held", calls).await;
        for _ in 0..at_tool {
            c.tool.next_invocation().await;
        }
        eventually("the worker to be full", Duration::from_secs(20), || async {
            let work = consumer(&c.nats, WORK_STREAM).await;
            let out = work.num_ack_pending == calls;
            (out && waiting.is_none_or(|w| work.num_waiting == w)).then_some(())
        })
        .await;
    }

    /// Submits `n` calls at once, to threads `{name}0`, `{name}1`, ...
    async fn burst(a: &Api, name: &str, n: usize) {
        join_all((0..n).map(|i| async move {
            let call = json!({"operation": "op", "arguments": {}, "group_id": format!("{name}{i}"), "id": "c"});
            assert_eq!(a.submit(call).await.0, 202);
        }))
        .await;
    }

    /// Both workers have room and a pull waiting: the one with the lower
    /// number takes every call (shared in turn, each would take some).
    #[tokio::test(flavor = "multi_thread")]
    async fn the_worker_with_the_lower_number_takes_the_work_while_it_has_room() {
        let c = Cluster::start(0).await;
        let (_first, first) = metered_worker(&c, &["--priority", "0"]).await;
        let (_second, second) = metered_worker(&c, &["--priority", "1"]).await;
        assert!(has_group(&consumer(&c.nats, WORK_STREAM).await));
        pulls_waiting(&c.nats, 2).await;
        let a = c.a.api();
        for i in 0..20 {
            c.dispatched(&a, &format!("g{i}"), "c").await;
        }
        assert_eq!(
            (acknowledged(&first).await, acknowledged(&second).await),
            (20, 0)
        );
    }

    /// The first worker, allowed one attempt in flight, holds four calls
    /// (one at a tool that does not answer, three waiting for it): full, it
    /// has no pull waiting, and the next worker dispatches every new call
    /// on its first delivery. Once the tool answers, the first worker's
    /// calls go out too.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_full_or_stuck_first_worker_leaves_new_work_to_the_next() {
        let c = Cluster::start(0).await;
        let (_first, first) =
            metered_worker(&c, &[&["--priority", "0"][..], &STUCK].concat()).await;
        let (_second, second) = metered_worker(&c, &["--priority", "1"]).await;
        pulls_waiting(&c.nats, 2).await;
        let a = c.a.api();
        // The second worker's pull still waits.
        hold_calls(&c, 4, 1, Some(1)).await;

        for i in 0..10 {
            c.dispatched(&a, &format!("g{i}"), "c").await;
        }
        assert_eq!(
            (acknowledged(&first).await, acknowledged(&second).await),
            (0, 10)
        );
        assert_eq!(consumer(&c.nats, WORK_STREAM).await.num_redelivered, 0);

        c.tool.release();
        for i in 0..4 {
            a.wait_for(&format!("held{i}"), "c", "call_dispatched")
                .await;
        }
        assert_eq!(acknowledged(&first).await, 4);
    }

    /// The group is there only once a worker asks for a priority; a worker
    /// started without one pulls in it once it is there (NATS refuses its
    /// pulls without, and it reads the consumer again); and
    /// `--drop-priority-group` takes it away, after which a pull without a
    /// group (as a Ferry older than priorities makes) is served again.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_priority_group_comes_when_asked_and_goes_for_a_rollback() {
        let c = Cluster::start(0).await;
        let a = c.a.api();
        let plain_pull = || async {
            let consumer = shared(&c.nats, WORK_STREAM).await;
            let mut pull = consumer.fetch().max_messages(1).messages().await.unwrap();
            futures::StreamExt::next(&mut pull)
                .await
                .map(|m| m.map(|_| ()).map_err(|e| e.to_string()))
        };
        let _plain = FerryWorker::start_with(&c.nats.url(), &c.a.url, &STUCK).await;
        assert!(!has_group(&consumer(&c.nats, WORK_STREAM).await));
        assert!(matches!(plain_pull().await, None | Some(Ok(()))));
        // Full (as in the test above), the plain worker has no pull
        // waiting for work while the group comes: its next one is made
        // after, without the group.
        hold_calls(&c, 4, 1, Some(0)).await;

        let asking = FerryWorker::start_with(&c.nats.url(), &c.a.url, &["--priority", "3"]).await;
        assert!(has_group(&consumer(&c.nats, WORK_STREAM).await));
        let refused = plain_pull().await;
        assert!(matches!(refused, Some(Err(_))), "{refused:?}");
        drop(asking);
        c.tool.release();
        for i in 0..4 {
            a.wait_for(&format!("held{i}"), "c", "call_dispatched")
                .await;
        }
        for _ in 1..4 {
            c.tool.next_invocation().await;
        }
        // Only the worker started without a priority is left.
        c.dispatched(&a, "g1", "c").await;

        let dropping =
            FerryWorker::start_with(&c.nats.url(), &c.a.url, &["--drop-priority-group"]).await;
        assert!(!has_group(&consumer(&c.nats, WORK_STREAM).await));
        assert!(matches!(plain_pull().await, None | Some(Ok(()))));
        drop(dropping);
        c.dispatched(&a, "g2", "c").await;
    }

    /// After the first worker was full, the room it regains is asked for
    /// again as it frees, so a burst that follows goes to it, not to the
    /// next worker (0–2 of 16 leak to the second when the first re-checks
    /// its room only as messages come).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_burst_after_the_first_worker_was_full_goes_to_it() {
        let c = Cluster::start(0).await;
        // Room for 16 dispatches.
        let flags = ["--priority", "0", "--max-in-flight", "4"];
        let (_first, first) = metered_worker(&c, &flags).await;
        let (_second, second) = metered_worker(&c, &["--priority", "1"]).await;
        pulls_waiting(&c.nats, 2).await;
        let a = c.a.api();
        hold_calls(&c, 16, 4, None).await;
        for _ in 0..4 {
            c.tool.release();
        }
        for i in 0..16 {
            a.wait_for(&format!("held{i}"), "c", "call_dispatched")
                .await;
        }
        assert_eq!(acknowledged(&first).await, 16);

        burst(&a, "g", 16).await;
        for i in 0..16 {
            a.wait_for(&format!("g{i}"), "c", "call_dispatched").await;
        }
        assert_eq!(
            (acknowledged(&first).await, acknowledged(&second).await),
            (32, 0)
        );
    }

    /// A server-wide `max_request_batch` below a worker's room (it gives
    /// the consumers their `max_batch`, and NATS refuses larger pulls):
    /// the worker asks in pulls that fit, and its calls go out.
    #[tokio::test(flavor = "multi_thread")]
    async fn pulls_fit_a_servers_batch_limit() {
        let nats = Nats::start_with("limits { max_request_batch: 100 }").await;
        let c = Cluster::on(nats, 1).await;
        assert_eq!(consumer(&c.nats, WORK_STREAM).await.config.max_batch, 100);
        let a = c.a.api();
        for i in 0..3 {
            c.dispatched(&a, &format!("g{i}"), "c").await;
        }
    }

    /// A consumer deleted under a running worker is made again by it, with
    /// the priority group it asked for at start, and work goes on.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_deleted_consumer_is_made_again_with_the_group() {
        let c = Cluster::start(0).await;
        let _worker = FerryWorker::start_with(&c.nats.url(), &c.a.url, &["--priority", "2"]).await;
        pulls_waiting(&c.nats, 1).await;
        let js = async_nats::jetstream::new(async_nats::connect(c.nats.url()).await.unwrap());
        js.get_stream(WORK_STREAM)
            .await
            .unwrap()
            .delete_consumer(streams::CONSUMER)
            .await
            .unwrap();
        // The worker makes the consumer, then gives it the group: two
        // steps, so the consumer may be seen between them without it.
        eventually(
            "the consumer to be made again with its group",
            Duration::from_secs(20),
            || async {
                let stream = js.get_stream(WORK_STREAM).await.unwrap();
                let again: Result<PullConsumer, _> = stream.get_consumer(streams::CONSUMER).await;
                let mut again = again.ok()?;
                has_group(again.info().await.ok()?).then_some(())
            },
        )
        .await;
        c.dispatched(&c.a.api(), "g", "c").await;
    }

    /// A priority NATS does not take, or one given beside
    /// `--drop-priority-group`, stops the worker before it starts.
    #[test]
    fn a_bad_priority_is_refused_at_start() {
        let worker = [
            "worker",
            "--nats",
            "nats://127.0.0.1:9",
            "--secret",
            "0123456789abcdef",
            "--public-url",
            "http://127.0.0.1:9",
        ];
        for (flags, says) in [
            (&["--priority", "10"][..], "10 is not in 0..=9"),
            (&["--priority", "-1"][..], "unexpected argument"),
            (&["--priority", "first"][..], "invalid digit"),
            (&["--priority", ""][..], "--priority"),
            (
                &["--priority", "1", "--drop-priority-group"][..],
                "cannot be used with",
            ),
        ] {
            let (status, stderr) = ferry_tests::ferry::refused(&[&worker[..], flags].concat());
            assert_eq!(status.code(), Some(2), "{flags:?}: {stderr}");
            assert!(stderr.contains(says), "{flags:?}: {stderr}");
        }
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

/// `ferry worker` on SIGTERM (a rolling restart): it takes no more work,
/// finishes the dispatch attempts it has under way (for up to
/// `--drain-ms`), hands the rest back for another worker to take at once,
/// and exits 0. What a worker hands back, NATS reports as a nak advisory.
mod stopping_workers {
    use super::*;
    use async_nats::Subscriber;
    use ferry_tests::Ack;
    use futures::StreamExt;

    /// NATS's advisories of dispatch work handed back (naked).
    async fn naks(nats: &Nats) -> Subscriber {
        let client = async_nats::connect(nats.url()).await.unwrap();
        let subject = format!("$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.{WORK_STREAM}.>");
        let naks = client.subscribe(subject).await.unwrap();
        // Subscribed at the server before anything is handed back.
        client.flush().await.unwrap();
        naks
    }

    /// The next nak advisory (`io.nats.jetstream.advisory.v1.nak`).
    async fn next_nak(naks: &mut Subscriber) -> Value {
        let advisory = tokio::time::timeout(Duration::from_secs(60), naks.next())
            .await
            .expect("nothing was handed back within a minute")
            .expect("the advisories' subscription ended");
        let advisory: Value = serde_json::from_slice(&advisory.payload).unwrap();
        assert_eq!(advisory["type"], "io.nats.jetstream.advisory.v1.nak");
        advisory
    }

    /// Waits until neither shared consumer has a pull waiting (NATS drops a
    /// pull whose inbox nobody listens to any more).
    async fn no_pulls(nats: &Nats) {
        eventually("the pulls to end", Duration::from_secs(20), || async {
            let work = consumer(nats, WORK_STREAM).await.num_waiting;
            (work == 0).then_some(())
        })
        .await;
    }

    async fn submit(api: &Api, g: &str) {
        let call = json!({"operation": "op", "arguments": {}, "group_id": g, "id": "c"});
        let (status, body) = api.submit(call).await;
        assert_eq!(status, 202, "{body}");
    }

    async fn call(api: &Api, g: &str) -> Value {
        let (status, call) = api.call(g, "c").await;
        assert_eq!(status, 200, "{call}");
        call
    }

    /// One attempt in flight at most: the first call waits at the tool for
    /// its 200, the second waits in the worker's hand for the slot. On
    /// SIGTERM the worker ends its pulls and hands the second back at once,
    /// and it stays until the tool answers the first, records that
    /// dispatch, and exits 0. The next worker takes the second call.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_stopping_worker_finishes_the_dispatch_under_way_and_hands_back_the_rest() {
        let c = Cluster::start(0).await;
        // Neither the held attempt nor the drain may end on their own
        // clocks, however slow the machine.
        let flags = [
            "--max-in-flight",
            "1",
            "--ack-timeout-ms",
            "600000",
            "--drain-ms",
            "600000",
        ];
        let mut worker = FerryWorker::start_with(&c.nats.url(), &c.a.url, &flags).await;
        c.tool.plan(&[Ack::Held]);
        let a = c.a.api();
        submit(&a, "first").await;
        let sent = c.tool.next_invocation().await.invocation;
        assert_eq!(sent.group_id, "first");
        submit(&a, "second").await;
        eventually("both calls in hand", Duration::from_secs(20), || async {
            (consumer(&c.nats, WORK_STREAM).await.num_ack_pending == 2).then_some(())
        })
        .await;
        let mut naks = naks(&c.nats).await;

        worker.sigterm();
        // The second call, waiting for the slot, is handed back at once.
        let nak = next_nak(&mut naks).await;
        assert_eq!(nak["deliveries"], 1, "{nak}");
        no_pulls(&c.nats).await;
        // The first call's attempt still waits for the tool.
        assert!(worker.is_running(), "the worker left its dispatch");
        c.tool.release();
        let status = worker.exited(Duration::from_secs(60)).await;
        let status = status.expect("the worker still runs a minute after SIGTERM");
        assert!(status.success(), "{status}");

        let first = call(&a, "first").await;
        assert_eq!(first["status"], "dispatched", "{first}");
        assert_eq!(first["attempts"], 1, "{first}");
        // Never sent: the stopping worker did not start it.
        assert_eq!(call(&a, "second").await["status"], "queued");

        let _next = FerryWorker::start(&c.nats.url(), &c.a.url).await;
        let sent = c.tool.next_invocation().await.invocation;
        assert_eq!(sent.group_id, "second");
        a.wait_for("second", "c", "call_dispatched").await;
        assert_eq!(c.tool.invocations().len(), 2, "the first was sent once");
    }

    /// A dispatch that outlasts the drain (a tool that never answers) is
    /// handed back when the drain ends, and the worker exits 0; the next
    /// worker sends the call again.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_dispatch_that_outlasts_the_drain_is_handed_back() {
        let c = Cluster::start(0).await;
        let mut worker = FerryWorker::start_with(
            &c.nats.url(),
            &c.a.url,
            &["--drain-ms", "300", "--ack-timeout-ms", "600000"],
        )
        .await;
        c.tool.plan(&[Ack::Hang]);
        let a = c.a.api();
        submit(&a, "g").await;
        c.tool.next_invocation().await;
        let mut naks = naks(&c.nats).await;

        worker.sigterm();
        let status = worker.exited(Duration::from_secs(60)).await;
        let status = status.expect("the worker still runs a minute after SIGTERM");
        assert!(status.success(), "{status}");
        // Handed back as it gave up, not left to the ack deadline.
        let nak = next_nak(&mut naks).await;
        assert_eq!(nak["deliveries"], 1, "{nak}");
        assert_eq!(call(&a, "g").await["status"], "queued");

        let _next = FerryWorker::start(&c.nats.url(), &c.a.url).await;
        let again = c.tool.next_invocation().await.invocation;
        assert_eq!((again.group_id.as_str(), again.id.as_str()), ("g", "c"));
        a.wait_for("g", "c", "call_dispatched").await;
    }

    /// A worker still waiting for NATS at start holds nothing: SIGTERM
    /// stops it at once, and cleanly.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_worker_waiting_for_nats_stops_on_sigterm() {
        use std::io::{BufRead, BufReader};
        let mut child = std::process::Command::new(ferry_tests::ferry::binary())
            .args(["worker", "--nats", "nats://127.0.0.1:1"])
            .args(["--public-url", "http://127.0.0.1:1"])
            .args(["--secret", ferry_tests::TEST_SECRET])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let waiting = tokio::task::spawn_blocking(move || {
            let mut lines = BufReader::new(stderr).lines();
            let found = lines.any(|l| l.is_ok_and(|l| l.contains("NATS not reachable yet")));
            // Keep reading, so that the worker never blocks on a full pipe.
            std::thread::spawn(move || lines.for_each(drop));
            found
        });
        let waiting = tokio::time::timeout(Duration::from_secs(60), waiting).await;
        assert!(waiting.expect("no word of NATS in a minute").unwrap());

        let mut child = Some(child);
        ferry_tests::ferry::sigterm(child.as_ref().unwrap());
        let status = ferry_tests::ferry::exit_within(&mut child, Duration::from_secs(60)).await;
        let status = status.expect("the worker still runs a minute after SIGTERM");
        assert!(status.success(), "{status}");
    }

    /// `--drain-ms` takes a number of milliseconds, nothing else.
    #[test]
    fn a_bad_drain_is_refused_at_start() {
        let worker = [
            "worker",
            "--nats",
            "nats://127.0.0.1:1",
            "--public-url",
            "http://127.0.0.1:1",
            "--secret",
            ferry_tests::TEST_SECRET,
        ];
        for (drain, says) in [
            ("-1", "unexpected argument"),
            ("10s", "invalid digit"),
            ("soon", "invalid digit"),
            ("", "--drain-ms"),
        ] {
            let (status, stderr) =
                ferry_tests::ferry::refused(&[&worker[..], &["--drain-ms", drain]].concat());
            assert_eq!(status.code(), Some(2), "{drain:?}: {stderr}");
            assert!(stderr.contains(says), "{drain:?}: {stderr}");
        }
    }
}
