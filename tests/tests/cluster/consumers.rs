//! Consumers on a cluster (docs/api.md "Consumers"): the same API as
//! `ferry serve`, with the delivery state shared by every runtime node, so
//! any node serves any consumer. A pull through one node and its
//! acknowledgement through another count as one; a node killed holding
//! events loses none of them; a consumer deleted through one node is gone
//! from all.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry_tests::{eventually, Api};
use futures::future::join_all;
use serde_json::{json, Value};

use super::{answer_everything, every_call_has_one_outcome, Cluster};
use crate::consumers::{make, next};

/// One event handed out: `(group_id, seq, deliveries)`.
type Out = (String, u64, u64);

/// Pulls through `api` until `n` events are out (a node may learn of a
/// thread's newest events a moment after another wrote them), and checks
/// no more come with them.
async fn take(api: &Api, name: &str, n: usize) -> Vec<Out> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = vec![];
    while out.len() < n {
        assert!(Instant::now() < deadline, "{}: only {out:?}", api.base);
        out.extend(next(api, name, "max=100&wait=1").await);
    }
    assert_eq!(out.len(), n, "{out:?}");
    out.sort();
    out
}

/// Acknowledges `events`, every one of which must count: the reply says
/// so, and ignores none.
async fn ack(api: &Api, name: &str, events: &[Out]) {
    let acks: Vec<Value> = events
        .iter()
        .map(|(g, seq, _)| json!({"group_id": g, "seq": seq}))
        .collect();
    let (status, body) = api
        .post(&format!("/v1/consumers/{name}/ack"), &json!({"acks": acks}))
        .await;
    assert_eq!(status, 200, "{}: {body}", api.base);
    assert_eq!(
        (body["acknowledged"].as_u64(), &body["ignored"]),
        (Some(events.len() as u64), &json!([])),
        "{}: {body}",
        api.base
    );
}

/// `GET /v1/consumers/{name}` on `api`.
async fn view(api: &Api, name: &str) -> Value {
    let (status, body) = api.get(&format!("/v1/consumers/{name}")).await;
    assert_eq!(status, 200, "{}: {body}", api.base);
    body
}

fn names(listed: &Value) -> Vec<&str> {
    listed["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect()
}

/// Submits `per_thread` calls in each of `threads` threads
/// (`{prefix}0`, `{prefix}1`, …): a thread's calls one after another, the
/// threads at once, each call to the next of `nodes` in turn, and to the
/// one after while a node cannot take it (the same id: at most one call
/// results). Returns `(group_id, id)` of each.
async fn submit_threads(
    nodes: &[Api],
    prefix: &str,
    threads: usize,
    per_thread: usize,
) -> Vec<(String, String)> {
    let submitted = join_all((0..threads).map(|t| async move {
        let g = format!("{prefix}{t}");
        let mut ids = vec![];
        for n in 0..per_thread {
            let id = format!("c{n}");
            let body = json!({"operation": "op", "arguments": {}, "group_id": g, "id": id});
            let mut taken = false;
            for attempt in 0..200 {
                let node = &nodes[(t + n + attempt) % nodes.len()];
                let sent = node
                    .client
                    .post(format!("{}/v1/calls", node.base))
                    .json(&body)
                    .send()
                    .await;
                if sent.is_ok_and(|r| r.status() == 202 || r.status() == 200) {
                    taken = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(taken, "no node took {g}/{id}");
            ids.push((g.clone(), id));
        }
        ids
    }))
    .await;
    submitted.into_iter().flatten().collect()
}

/// Once every call has its one result: each thread's `tool_result` seqs,
/// in order, as `reader` reads them from the log.
async fn results_of(reader: &Api, calls: &[(String, String)]) -> BTreeMap<String, Vec<u64>> {
    every_call_has_one_outcome(reader, calls).await;
    let mut threads: Vec<&str> = calls.iter().map(|(g, _)| g.as_str()).collect();
    threads.dedup();
    let mut results = BTreeMap::new();
    for g in threads {
        let seqs = reader
            .events(g, 0)
            .await
            .iter()
            .filter(|e| e["type"] == "tool_result")
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        results.insert(g.to_owned(), seqs);
    }
    results
}

/// What the pullers of [`pulls_and_acks_through_different_nodes`] saw,
/// between them.
#[derive(Default)]
struct Seen {
    /// Per thread, the event handed out whose acknowledgement is not sent
    /// yet: while one is, no later event of its thread may come.
    held: HashMap<String, u64>,
    /// Every event in the order it was handed out, over both pullers.
    order: Vec<(String, u64)>,
    /// How many acknowledgements counted for each event.
    acked: BTreeMap<(String, u64), usize>,
}

/// Two pullers share a consumer made on A while ten threads of three calls
/// each are submitted through both nodes. A round of each pulls through
/// one node, then through the other while still holding what the first
/// pull gave, then acknowledges each batch through the node it did not
/// come from; the nodes swap every round. Every
/// result is handed out once and acknowledged once, a thread's results in
/// order and never two at a time, and once all are acknowledged neither
/// node hands any out again, not even after `ack_wait_secs` (a node that
/// missed an acknowledgement made through the other would).
#[tokio::test(flavor = "multi_thread")]
async fn pulls_and_acks_through_different_nodes() {
    let c = Cluster::start(1).await;
    let nodes = [c.a.api(), c.b.api()];
    let (a, b) = (&nodes[0], &nodes[1]);
    let spec = json!({"name": "results", "filter": {"types": ["tool_result"]}, "ack_wait_secs": 3});
    make(a, spec.clone()).await;
    // B answers for it at once: the same spec is no change, another is a
    // conflict, whichever node made it.
    let other = json!({"name": "results", "filter": {"types": ["call_accepted"]}});
    let (status, body) = b.post("/v1/consumers", &other).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{body}"
    );
    let (status, body) = b.post("/v1/consumers", &spec).await;
    assert_eq!(status, 200, "{body}");
    let (status, listed) = b.get("/v1/consumers").await;
    assert_eq!((status, names(&listed)), (200, vec!["results"]), "{listed}");
    let shown = view(b, "results").await;
    assert_eq!(
        (&shown["filter"]["types"], shown["ack_wait_secs"].as_u64()),
        (&json!(["tool_result"]), Some(3)),
        "{shown}"
    );

    let answering = answer_everything(c.tool.clone(), vec![c.a.url.clone(), c.b.url.clone()]);
    let (threads, per_thread) = (10, 3);
    let total = threads * per_thread;
    let seen = Mutex::new(Seen::default());
    // Takes what a pull handed out into `seen`: none of it may be of a
    // thread whose event is held (by either puller) unacknowledged.
    let hold = |seen: &Mutex<Seen>, batch: &[Out]| {
        let mut seen = seen.lock().unwrap();
        for (g, seq, deliveries) in batch {
            assert_eq!(*deliveries, 1, "{g} {seq} handed out again");
            let out = seen.held.insert(g.clone(), *seq);
            assert!(out.is_none(), "{g}: {seq} handed out while {out:?} was");
            seen.order.push((g.clone(), *seq));
        }
    };
    // Each round pulls through one node, then through the other while
    // still holding the first batch, and only then acknowledges each batch
    // through the node it did not come from.
    let pull = |me: usize| {
        let (nodes, seen) = (&nodes, &seen);
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            for round in me.. {
                if seen.lock().unwrap().acked.len() >= total {
                    return;
                }
                assert!(Instant::now() < deadline, "puller {me}: not all results");
                let (one, other) = (&nodes[round % 2], &nodes[(round + 1) % 2]);
                let first = next(one, "results", "max=4&wait=1").await;
                hold(seen, &first);
                let second = next(other, "results", "max=4&wait=0").await;
                hold(seen, &second);
                {
                    // Their acknowledgements go out now: from here the
                    // threads' next events may be handed out.
                    let mut seen = seen.lock().unwrap();
                    for (g, _, _) in first.iter().chain(&second) {
                        seen.held.remove(g);
                    }
                }
                for (batch, acker) in [(&first, other), (&second, one)] {
                    if batch.is_empty() {
                        continue;
                    }
                    ack(acker, "results", batch).await;
                    let mut seen = seen.lock().unwrap();
                    for (g, seq, _) in batch {
                        *seen.acked.entry((g.clone(), *seq)).or_default() += 1;
                    }
                }
            }
        }
    };
    let (calls, (), ()) = tokio::join!(
        submit_threads(&nodes, "t", threads, per_thread),
        pull(0),
        pull(1)
    );
    let want = results_of(b, &calls).await;
    answering.abort();

    let seen = seen.into_inner().unwrap();
    let mut per_thread_order: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (g, seq) in &seen.order {
        per_thread_order.entry(g).or_default().push(*seq);
    }
    for (g, seqs) in &per_thread_order {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{g}: {seqs:?}");
    }
    let mut acked: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for ((g, seq), times) in &seen.acked {
        assert_eq!(*times, 1, "{g} {seq} acknowledged {times} times");
        acked.entry(g.clone()).or_default().push(*seq);
    }
    assert_eq!(acked, want, "every result acknowledged, none besides");

    // Past ack_wait, neither node hands out what the other acknowledged.
    let (from_a, from_b) = tokio::join!(
        next(a, "results", "max=100&wait=4"),
        next(b, "results", "max=100&wait=4")
    );
    assert_eq!((from_a, from_b), (vec![], vec![]));
    for node in &nodes {
        let shown = view(node, "results").await;
        assert_eq!(
            (shown["pending"].as_u64(), shown["out"].as_u64()),
            (Some(0), Some(0)),
            "{}: {shown}",
            node.base
        );
    }
}

/// Events pulled through A and not acknowledged when A is SIGKILLed come
/// out of B once their `ack_wait_secs` passes, counted as delivered again;
/// what A had acknowledged never does. Restarted, A serves the consumer
/// as B left it.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_killed_mid_pull_hands_its_events_out_again() {
    let mut c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let ack_wait = Duration::from_secs(2);
    make(
        &a,
        json!({"name": "r", "filter": {"types": ["tool_result"]}, "ack_wait_secs": 2}),
    )
    .await;
    let answering = answer_everything(c.tool.clone(), vec![c.a.url.clone(), c.b.url.clone()]);
    let calls = submit_threads(&[a.clone(), b.clone()], "g", 5, 2).await;
    let want = results_of(&b, &calls).await;
    answering.abort();

    // Through A: each thread's first result; two of them acknowledged,
    // which lets those threads' second results out too.
    let pulled_at = Instant::now();
    let first = take(&a, "r", 5).await;
    let firsts: Vec<(&str, u64)> = first.iter().map(|(g, s, _)| (g.as_str(), *s)).collect();
    let heads: Vec<(&str, u64)> = want.iter().map(|(g, s)| (g.as_str(), s[0])).collect();
    assert_eq!(firsts, heads, "each thread's first result");
    assert!(first.iter().all(|(_, _, n)| *n == 1), "{first:?}");
    ack(&a, "r", &first[..2]).await;
    let second = take(&a, "r", 2).await;
    let seconds: Vec<(&str, u64)> = second.iter().map(|(g, s, _)| (g.as_str(), *s)).collect();
    let after_acked: Vec<(&str, u64)> = want
        .iter()
        .take(2)
        .map(|(g, s)| (g.as_str(), s[1]))
        .collect();
    assert_eq!(
        seconds, after_acked,
        "the acknowledged threads' next results"
    );
    let acked_on_a: Vec<(String, u64)> =
        first[..2].iter().map(|(g, s, _)| (g.clone(), *s)).collect();
    let mut held: Vec<(String, u64)> = first[2..]
        .iter()
        .chain(&second)
        .map(|(g, s, _)| (g.clone(), *s))
        .collect();
    held.sort();

    c.a.kill9();
    // B hands out everything else, A's held events once their ack_wait
    // passes (less half a second, for clocks that count coarser).
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut on_b: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut again: Vec<(String, u64)> = vec![];
    while on_b.values().map(Vec::len).sum::<usize>() < 8 {
        assert!(Instant::now() < deadline, "B handed out {on_b:?} only");
        let batch = next(&b, "r", "max=100&wait=1").await;
        for (g, seq, deliveries) in &batch {
            let event = (g.clone(), *seq);
            assert!(!acked_on_a.contains(&event), "{g} {seq}: acknowledged on A");
            let seqs = on_b.entry(g.clone()).or_default();
            assert!(
                seqs.last().is_none_or(|last| last < seq),
                "{g}: {seq} after {seqs:?}"
            );
            seqs.push(*seq);
            if held.contains(&event) {
                assert!(*deliveries >= 2, "{g} {seq}: deliveries {deliveries}");
                let elapsed = pulled_at.elapsed();
                assert!(
                    elapsed + Duration::from_millis(500) >= ack_wait,
                    "{g} {seq} handed out again after {elapsed:?}"
                );
                again.push(event);
            } else {
                assert_eq!(*deliveries, 1, "{g} {seq}");
            }
        }
        if !batch.is_empty() {
            ack(&b, "r", &batch).await;
        }
    }
    again.sort();
    assert_eq!(again, held, "every event A held, handed out again");
    let mut all = on_b.clone();
    for (g, seq) in &acked_on_a {
        all.get_mut(g).unwrap().insert(0, *seq);
    }
    assert_eq!(all, want, "every result, once acknowledged");
    // Past ack_wait: nothing comes back.
    assert_eq!(next(&b, "r", "max=100&wait=3").await, vec![]);

    c.a.restart().await;
    let a = c.a.api();
    // A restarted node may answer 503 until it reaches NATS.
    let shown = eventually(
        "A to serve the consumer",
        Duration::from_secs(60),
        || async {
            let (status, shown) = a.get("/v1/consumers/r").await;
            (status == 200).then_some(shown)
        },
    )
    .await;
    assert_eq!(
        (shown["pending"].as_u64(), shown["out"].as_u64()),
        (Some(0), Some(0)),
        "{shown}"
    );
    assert_eq!(next(&a, "r", "max=100&wait=1").await, vec![]);
    let shown = view(&b, "r").await;
    assert_eq!(
        (shown["pending"].as_u64(), shown["out"].as_u64()),
        (Some(0), Some(0)),
        "{shown}"
    );
}

/// A consumer made on A, used, and deleted through B is gone from A: 404
/// for it and its pulls and acknowledgements. Its cursors went with it:
/// made again under the name, it starts at the beginning of every thread.
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_deleted_on_one_node_is_gone_on_the_other() {
    let c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let answering = answer_everything(c.tool.clone(), vec![c.a.url.clone(), c.b.url.clone()]);
    let calls = submit_threads(&[a.clone(), b.clone()], "g", 2, 1).await;
    let want = results_of(&b, &calls).await;
    answering.abort();
    let spec = json!({"name": "r", "filter": {"types": ["tool_result"]}});
    make(&a, spec.clone()).await;
    let taken = take(&a, "r", 2).await;
    let heads: Vec<(String, u64)> = want.iter().map(|(g, s)| (g.clone(), s[0])).collect();
    let got: Vec<(String, u64)> = taken.iter().map(|(g, s, _)| (g.clone(), *s)).collect();
    assert_eq!(got, heads);
    ack(&b, "r", &taken).await;

    let (status, body) = b.delete("/v1/consumers/r").await;
    assert_eq!(status, 200, "{body}");
    eventually(
        "A to forget the consumer",
        Duration::from_secs(20),
        || async {
            let shown = a.get("/v1/consumers/r").await.0;
            let pulled = a.get("/v1/consumers/r/next").await.0;
            (shown == 404 && pulled == 404).then_some(())
        },
    )
    .await;
    let (status, body) = a.get("/v1/consumers/r/next").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let acks = json!({"acks": [{"group_id": "g0", "seq": 1}]});
    assert_eq!(a.post("/v1/consumers/r/ack", &acks).await.0, 404);
    for node in [&a, &b] {
        let (_, listed) = node.get("/v1/consumers").await;
        assert_eq!(
            names(&listed),
            Vec::<&str>::new(),
            "{}: {listed}",
            node.base
        );
    }
    // Deleting it again, through either node, finds nothing.
    assert_eq!(a.delete("/v1/consumers/r").await.0, 404);

    make(&a, spec).await;
    let again = take(&b, "r", 2).await;
    let got: Vec<(String, u64)> = again.iter().map(|(g, s, _)| (g.clone(), *s)).collect();
    assert_eq!(got, heads, "from the beginning of every thread");
    assert!(again.iter().all(|(_, _, n)| *n == 1), "{again:?}");
}

/// Lines from the receiver until it has taken every result in `want`
/// (per thread, in order): each verified and answered 200; a repeat of
/// the event taken last is allowed (at least once), an event before it
/// is not.
async fn receive(
    receiver: &mut crate::consumers::Receiver,
    taken: &mut BTreeMap<String, Vec<u64>>,
    want: &BTreeMap<String, Vec<u64>>,
) {
    while want.iter().any(|(g, seqs)| taken.get(g) != Some(seqs)) {
        let line = receiver.next().await;
        assert_eq!(
            (line["verified"].as_bool(), line["status"].as_u64()),
            (Some(true), Some(200)),
            "{line}"
        );
        let g = line["group_id"].as_str().unwrap().to_owned();
        let seq = line["seq"].as_u64().unwrap();
        let seqs = taken.entry(g.clone()).or_default();
        if seqs.last() != Some(&seq) {
            assert!(
                seqs.last().is_none_or(|last| *last < seq),
                "{g}: {seq} after {seqs:?}"
            );
            seqs.push(seq);
        }
    }
}

/// A push consumer made on A delivers every result to its receiver, each
/// thread's in order, while both nodes run, with A SIGKILLed, and with B
/// SIGKILLed after A came back: whichever node was pushing, the other
/// carries on.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_consumer_delivers_on_through_the_loss_of_either_node() {
    use crate::consumers::{free_port, Receiver, SECRET};

    let mut c = Cluster::start(1).await;
    let (a, b) = (c.a.api(), c.b.api());
    let port = free_port();
    let mut receiver = Receiver::start(port, 0).await;
    let spec = json!({"name": "hook", "filter": {"types": ["tool_result"]},
        "push": {"url": format!("http://127.0.0.1:{port}/hook"), "secret": SECRET}});
    make(&a, spec).await;
    let answering = answer_everything(c.tool.clone(), vec![c.a.url.clone(), c.b.url.clone()]);
    let mut taken = BTreeMap::new();

    let calls = submit_threads(&[a.clone(), b.clone()], "both-", 3, 2).await;
    let want = results_of(&b, &calls).await;
    receive(&mut receiver, &mut taken, &want).await;

    c.a.kill9();
    let calls = submit_threads(std::slice::from_ref(&b), "b-only-", 3, 2).await;
    let want = results_of(&b, &calls).await;
    receive(&mut receiver, &mut taken, &want).await;

    c.a.restart().await;
    c.b.kill9();
    let calls = submit_threads(std::slice::from_ref(&a), "a-only-", 3, 2).await;
    let want = results_of(&a, &calls).await;
    receive(&mut receiver, &mut taken, &want).await;
    answering.abort();

    assert_eq!(taken.len(), 9, "{taken:?}");
    let shown = eventually(
        "the deliveries recorded",
        Duration::from_secs(20),
        || async {
            let (status, shown) = a.get("/v1/consumers/hook").await;
            (status == 200 && shown["pending"] == 0).then_some(shown)
        },
    )
    .await;
    assert_eq!(shown["dead_lettered"], 0, "{shown}");
    drop(receiver.child);
}
