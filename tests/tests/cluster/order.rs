//! Requests racing on one thread through two nodes: duplicates make one
//! event, concurrent requests one order, a lost compare-and-set a conflict.

use std::sync::Arc;
use std::time::Duration;

use ferry_nats::cluster::subjects::Layout;
use ferry_tests::eventually;
use futures::future::join_all;
use serde_json::json;

use super::{path_of, result, Cluster};

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

/// Writers racing on one thread: nats-server answers the losers with
/// "wrong last sequence: N" (10071) or, in a cluster while the winner's
/// commit is still in flight, "wrong last sequence" (10164). Either is a lost
/// compare-and-set, which the engine decides again; neither may pass
/// for an outage (a 503 to the tool or agent that asked).
#[tokio::test(flavor = "multi_thread")]
async fn a_write_that_loses_a_race_is_a_conflict_whatever_nats_calls_it() {
    use ferry_engine::store::{Durability, Error, Store, Write};
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
                at: "2026-11-29T00:00:00.000Z".parse().unwrap(),
                idempotency_key: None,
                kind: EventKind::ThreadClosed {},
            }];
            let write = Write {
                expected_last_seq,
                state: &state,
                events: &events,
                audit: &[],
            };
            store.append(write, Durability::Await).await
        });
        for written in join_all(writes).await {
            match written {
                Ok(_) => stored += 1,
                Err(Error::Conflict(_)) => lost += 1,
                Err(e) => panic!("a lost race taken for another failure: {e}"),
            }
        }
    }
    assert!(lost > 0, "no writers raced");
    let thread = stores[0].thread("g").await.unwrap().unwrap();
    assert_eq!(thread.last_seq, stored);
}
