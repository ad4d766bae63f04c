//! Consumers (docs/api.md "Consumers"): durable delivery cursors over every
//! thread. Pullers sharing one get each event once at a time, a thread's
//! events in order; what is not acknowledged within `ack_wait_secs` comes
//! back, and after `max_deliver` deliveries is dead-lettered; a restart
//! loses nothing unacknowledged and hands out nothing acknowledged.

use std::collections::{BTreeMap, HashSet};

use ferry_tests::api::Api;
use ferry_tests::{Ferry, TestTool};
use serde_json::{json, Value};

/// Submits call `id` in thread `g` and has the tool answer it.
async fn answered(api: &Api, tool: &TestTool, g: &str, id: &str) {
    let call = json!({"operation": "op", "arguments": {}, "group_id": g, "id": id});
    let (status, body) = api.submit(call).await;
    assert_eq!(status, 202, "{body}");
    let sent = tool.next_invocation().await.invocation;
    let result = json!({"type": "tool_result", "group_id": g, "id": id, "text": id});
    let (status, body) = api.post(&sent.callback_url, &result).await;
    assert_eq!(status, 200, "{body}");
}

pub(crate) async fn make(api: &Api, spec: Value) -> Value {
    let (status, body) = api.post("/v1/consumers", &spec).await;
    assert_eq!(status, 201, "{body}");
    body
}

/// `GET …/next`: the `(group_id, seq, deliveries)` handed out.
pub(crate) async fn next(api: &Api, name: &str, query: &str) -> Vec<(String, u64, u64)> {
    let (status, body) = api.get(&format!("/v1/consumers/{name}/next?{query}")).await;
    assert_eq!(status, 200, "{}: {body}", api.base);
    body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "tool_result", "{e}");
            (
                e["group_id"].as_str().unwrap().to_owned(),
                e["seq"].as_u64().unwrap(),
                e["deliveries"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn ack(api: &Api, name: &str, events: &[(String, u64, u64)]) -> Value {
    let acks: Vec<Value> = events
        .iter()
        .map(|(g, seq, _)| json!({"group_id": g, "seq": seq}))
        .collect();
    let (status, body) = api
        .post(&format!("/v1/consumers/{name}/ack"), &json!({"acks": acks}))
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_hands_out_each_result_once_in_thread_order() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    // Results from before the consumer was made are its too.
    answered(&api, &tool, "a", "a1").await;
    make(
        &api,
        json!({"name": "results", "filter": {"types": ["tool_result"]}}),
    )
    .await;
    answered(&api, &tool, "a", "a2").await;
    for g in ["b", "c"] {
        answered(&api, &tool, g, &format!("{g}1")).await;
        answered(&api, &tool, g, &format!("{g}2")).await;
    }
    // One event of each thread at a time: the first of a, b and c.
    let first = next(&api, "results", "max=100").await;
    let threads: HashSet<&str> = first.iter().map(|(g, _, _)| g.as_str()).collect();
    assert_eq!((first.len(), threads.len()), (3, 3), "{first:?}");
    assert!(first.iter().all(|(_, _, n)| *n == 1));
    // Nothing more while they are out.
    assert_eq!(next(&api, "results", "max=100").await, vec![]);
    let reply = ack(&api, "results", &first).await;
    assert_eq!(reply["acknowledged"], 3, "{reply}");
    let second = next(&api, "results", "max=100").await;
    assert_eq!(second.len(), 3, "{second:?}");
    for (g, seq, _) in &second {
        let before = first.iter().find(|(h, _, _)| h == g).unwrap().1;
        assert!(*seq > before, "{g}: {seq} after {before}");
    }
    ack(&api, "results", &second).await;
    assert_eq!(next(&api, "results", "max=100&wait=0.2").await, vec![]);
    // Acknowledging again, or what was never handed out, changes nothing
    // and says so.
    let again = ack(
        &api,
        "results",
        &[
            second[0].clone(),
            ("a".into(), 999, 0),
            ("nowhere".into(), 1, 0),
        ],
    )
    .await;
    assert_eq!(again["acknowledged"], 0, "{again}");
    let reasons: Vec<&str> = again["ignored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        reasons,
        [
            "already acknowledged",
            "not delivered by this consumer",
            "not delivered by this consumer"
        ],
        "{again}"
    );
    let (_, shown) = api.get("/v1/consumers/results").await;
    assert_eq!(
        (shown["pending"].as_u64(), shown["out"].as_u64()),
        (Some(0), Some(0)),
        "{shown}"
    );
    assert_eq!(shown["deliveries"], 6, "{shown}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_poll_wakes_for_a_new_result() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    make(
        &api,
        json!({"name": "r", "filter": {"types": ["tool_result"]}}),
    )
    .await;
    let waiting = {
        let api = ferry.api();
        tokio::spawn(async move { next(&api, "r", "wait=20").await })
    };
    answered(&api, &tool, "g", "c").await;
    let got = waiting.await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "g");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_not_acknowledged_comes_back_then_is_dead_lettered() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    make(
        &api,
        json!({"name": "r", "filter": {"types": ["tool_result"]}, "ack_wait_secs": 1, "max_deliver": 2}),
    )
    .await;
    answered(&api, &tool, "g", "c1").await;
    answered(&api, &tool, "g", "c2").await;
    let first = next(&api, "r", "wait=5").await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].2, 1);
    // Not acknowledged: back after ack_wait (the long-poll wakes for it).
    let again = next(&api, "r", "wait=5").await;
    assert_eq!(
        (again[0].0.as_str(), again[0].1, again[0].2),
        ("g", first[0].1, 2)
    );
    // Twice without an acknowledgement: dead-lettered, and the thread's
    // next event goes.
    let after = next(&api, "r", "wait=5").await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(after[0].1 > first[0].1 && after[0].2 == 1, "{after:?}");
    let (_, shown) = api.get("/v1/consumers/r").await;
    assert_eq!(shown["dead_lettered"], 1, "{shown}");
    let letter = &shown["dead_letters"][0];
    assert_eq!(
        (
            letter["group_id"].as_str(),
            letter["seq"].as_u64(),
            letter["deliveries"].as_u64()
        ),
        (Some("g"), Some(first[0].1), Some(2)),
        "{shown}"
    );
    // A late acknowledgement of the dead letter changes nothing.
    let late = ack(&api, "r", &first).await;
    assert_eq!(late["acknowledged"], 0, "{late}");
    assert_eq!(late["ignored"][0]["reason"], "dead-lettered", "{late}");
}

/// `ferry serve` SIGKILLed with events out and others acknowledged: after
/// the restart, nothing acknowledged is handed out again, and everything
/// else is.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_loses_nothing_unacknowledged_and_repeats_nothing_acknowledged() {
    let tool = TestTool::start("t", &["op"]).await;
    let mut ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    make(
        &api,
        json!({"name": "r", "filter": {"types": ["tool_result"]}}),
    )
    .await;
    for g in 0..6 {
        answered(&api, &tool, &format!("g{g}"), "c").await;
    }
    let out = next(&api, "r", "max=4").await;
    assert_eq!(out.len(), 4);
    ack(&api, "r", &out[..2]).await;
    ferry.restart().await;
    let api = ferry.api();
    let mut after: Vec<(String, u64, u64)> = next(&api, "r", "max=100").await;
    after.sort();
    let acked: HashSet<&str> = out[..2].iter().map(|(g, _, _)| g.as_str()).collect();
    let want: Vec<String> = (0..6)
        .map(|g| format!("g{g}"))
        .filter(|g| !acked.contains(g.as_str()))
        .collect();
    let got: Vec<String> = after.iter().map(|(g, _, _)| g.clone()).collect();
    assert_eq!(
        got, want,
        "every unacknowledged thread once, no acknowledged one"
    );
    ack(&api, "r", &after).await;
    assert_eq!(next(&api, "r", "max=100").await, vec![]);
}

/// Two pullers sharing a consumer over 50 threads of three results each:
/// no event is out to both at once, each thread's results arrive in order,
/// and every one is acknowledged exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn two_pullers_share_a_consumer_without_overlap_and_in_thread_order() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    make(
        &api,
        json!({"name": "r", "filter": {"types": ["tool_result"]}}),
    )
    .await;
    let mut want = BTreeMap::new();
    for g in 0..50 {
        for c in 0..3 {
            answered(&api, &tool, &format!("g{g}"), &format!("c{c}")).await;
        }
        want.insert(format!("g{g}"), 3usize);
    }
    let pull = |api: Api| async move {
        let mut got = vec![];
        loop {
            let batch = next(&api, "r", "max=7&wait=0.5").await;
            if batch.is_empty() {
                return got;
            }
            let reply = ack(&api, "r", &batch).await;
            assert_eq!(reply["acknowledged"], batch.len(), "{reply}");
            got.extend(batch);
        }
    };
    let (one, two) = tokio::join!(pull(ferry.api()), pull(ferry.api()));
    let mut per_thread: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (g, seq, deliveries) in one.iter().chain(&two) {
        assert_eq!(*deliveries, 1, "{g} {seq} handed out twice");
        per_thread.entry(g.clone()).or_default().push(*seq);
    }
    // Each puller saw each thread's results in order (acked in between).
    for got in [&one, &two] {
        let mut last: BTreeMap<&str, u64> = BTreeMap::new();
        for (g, seq, _) in got {
            let before = last.insert(g, *seq).unwrap_or(0);
            assert!(*seq > before, "{g}: {seq} after {before}");
        }
    }
    let counts: BTreeMap<String, usize> = per_thread
        .iter()
        .map(|(g, seqs)| {
            let distinct: HashSet<_> = seqs.iter().collect();
            assert_eq!(distinct.len(), seqs.len(), "{g}: {seqs:?}");
            (g.clone(), seqs.len())
        })
        .collect();
    assert_eq!(counts, want);
    assert!(!one.is_empty() && !two.is_empty(), "both pullers got work");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_consumer_requests_are_refused_clearly_and_change_nothing() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    let spec = json!({"name": "r", "filter": {"types": ["tool_result"]}});
    make(&api, spec.clone()).await;
    // The same again is no change; another filter under the name is 409.
    let (status, body) = api.post("/v1/consumers", &spec).await;
    assert_eq!(status, 200, "{body}");
    let other = json!({"name": "r", "filter": {"types": ["call_accepted"]}});
    let (status, body) = api.post("/v1/consumers", &other).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{body}"
    );
    for bad in [
        json!({"name": "x", "filter": {"types": ["no_such_type"]}}),
        json!({"name": "x", "filter": {"types": []}}),
        json!({"name": "x", "filter": "tool_result"}),
        json!({"name": "x"}),
        json!({"name": "bad name", "filter": {"types": ["tool_result"]}}),
        json!({"name": "..", "filter": {"types": ["tool_result"]}}),
        json!({"name": ".", "filter": {"types": ["tool_result"]}}),
        json!({"name": "x", "filter": {"types": ["tool_result"]}, "ack_wait_secs": 0}),
        json!({"name": "x", "filter": {"types": ["tool_result"]}, "max_deliver": 0}),
        json!({"name": "x", "filter": {"types": ["tool_result"]}, "unknown": 1}),
    ] {
        let (status, body) = api.post("/v1/consumers", &bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{bad}: {body}");
    }
    let (_, listed) = api.get("/v1/consumers").await;
    let names: Vec<&str> = listed["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["r"], "{listed}");
    let (_, shown) = api.get("/v1/consumers/r").await;
    assert_eq!(shown["filter"]["types"], json!(["tool_result"]), "{shown}");
    // Unknown consumers are 404 everywhere.
    for path in ["/v1/consumers/nope", "/v1/consumers/nope/next"] {
        let (status, body) = api.get(path).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (404, Some("not_found")),
            "{path}: {body}"
        );
    }
    let acks = json!({"acks": [{"group_id": "g", "seq": 1}]});
    let (status, _) = api.post("/v1/consumers/nope/ack", &acks).await;
    assert_eq!(status, 404);
    let (status, _) = api.delete("/v1/consumers/nope").await;
    assert_eq!(status, 404);
    // Bounds of a pull and of an acknowledgement.
    for query in ["max=0", "max=1001", "max=x", "wait=61", "wait=-1"] {
        let (status, body) = api.get(&format!("/v1/consumers/r/next?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
    }
    for bad in [
        json!({"acks": []}),
        json!({"acks": [{"group_id": "g"}]}),
        json!({"acks": [{"group_id": "g", "seq": -1}]}),
        json!({"ack": []}),
    ] {
        let (status, body) = api.post("/v1/consumers/r/ack", &bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    // Deleted, it is gone, and its name is free again.
    let (status, _) = api.delete("/v1/consumers/r").await;
    assert_eq!(status, 200);
    let (status, _) = api.get("/v1/consumers/r").await;
    assert_eq!(status, 404);
    make(&api, other).await;
}

/// `replay` delivers again from a point, acknowledged events and dead
/// letters alike: from a `seq` in one thread, or from a time in every
/// thread.
#[tokio::test(flavor = "multi_thread")]
async fn replay_delivers_again_from_a_seq_or_a_time_and_brings_dead_letters_back() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    make(
        &api,
        json!({"name": "r", "filter": {"types": ["tool_result"]}, "ack_wait_secs": 1, "max_deliver": 1}),
    )
    .await;
    answered(&api, &tool, "a", "a1").await;
    answered(&api, &tool, "b", "b1").await;
    // a's result is acknowledged; b's is never, and is dead-lettered.
    let mut first = next(&api, "r", "max=10").await;
    first.sort();
    ack(&api, "r", &first[..1]).await;
    assert_eq!(next(&api, "r", "wait=3").await, vec![]);
    let (_, shown) = api.get("/v1/consumers/r").await;
    assert_eq!(shown["dead_lettered"], 1, "{shown}");
    // From b's result on, in b only: the dead letter comes back.
    let from_b = json!({"from": {"seq": first[1].1}, "group_id": "b"});
    let (status, body) = api.post("/v1/consumers/r/replay", &from_b).await;
    assert_eq!((status, body["threads"].as_u64()), (200, Some(1)), "{body}");
    let again = next(&api, "r", "max=10").await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(
        (again[0].0.as_str(), again[0].1, again[0].2),
        ("b", first[1].1, 1)
    );
    ack(&api, "r", &again).await;
    let (_, shown) = api.get("/v1/consumers/r").await;
    assert_eq!(shown["dead_lettered"], 0, "{shown}");
    // From a time before everything, in every thread: both results again.
    let from_start = json!({"from": {"time": "2020-01-01T00:00:00Z"}});
    let (status, body) = api.post("/v1/consumers/r/replay", &from_start).await;
    assert_eq!((status, body["threads"].as_u64()), (200, Some(2)), "{body}");
    let mut all = next(&api, "r", "max=10").await;
    all.sort();
    let seqs: Vec<(String, u64)> = all.iter().map(|(g, s, _)| (g.clone(), *s)).collect();
    let want: Vec<(String, u64)> = first.iter().map(|(g, s, _)| (g.clone(), *s)).collect();
    assert_eq!(seqs, want);
    // From a time after everything: nothing moves.
    ack(&api, "r", &all).await;
    let later = json!({"from": {"time": "2099-01-01T00:00:00Z"}});
    let (_, body) = api.post("/v1/consumers/r/replay", &later).await;
    assert_eq!(body["threads"], 0, "{body}");
    // Bad replays change nothing.
    for (bad, status) in [
        (json!({"from": {"seq": 0}}), 400),
        (
            json!({"from": {"seq": 1, "time": "2020-01-01T00:00:00Z"}}),
            400,
        ),
        (json!({"from": {"time": "yesterday"}}), 400),
        (json!({"from": {}}), 400),
        (json!({}), 400),
        (json!({"from": {"seq": 1}, "group_id": "nowhere"}), 404),
    ] {
        let (got, body) = api.post("/v1/consumers/r/replay", &bad).await;
        assert_eq!(got, status, "{bad}: {body}");
    }
    let (status, _) = api
        .post("/v1/consumers/nope/replay", &json!({"from": {"seq": 1}}))
        .await;
    assert_eq!(status, 404);
    assert_eq!(next(&api, "r", "max=10").await, vec![]);
}

/// A Standard Webhooks secret (24 bytes).
pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

/// A loopback port nothing listens on (yet).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `tests/py/webhook_receiver.py` on `port`: it verifies each delivery
/// with the `standardwebhooks` package and fails the first `fail_first`
/// requests (-1: all). Its lines, one per request, come on the channel.
/// The cluster tests use it too.
pub(crate) struct Receiver {
    pub(crate) child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<Value>,
}

impl Receiver {
    pub(crate) async fn start(port: u16, fail_first: i64) -> Receiver {
        use tokio::io::AsyncBufReadExt;
        let python = workspace().join("target/py/bin/python");
        assert!(python.exists(), "run `bash ops/scripts/setup-oxp.sh`");
        let mut child = tokio::process::Command::new(python)
            .arg(workspace().join("tests/py/webhook_receiver.py"))
            .args([port.to_string(), SECRET.to_owned(), fail_first.to_string()])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting the receiver");
        let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let first = out.next_line().await.unwrap();
        assert_eq!(first.as_deref(), Some("listening"));
        let (send, lines) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                let _ = send.send(serde_json::from_str(&line).unwrap());
            }
        });
        Receiver { child, lines }
    }

    pub(crate) async fn next(&mut self) -> Value {
        tokio::time::timeout(std::time::Duration::from_secs(60), self.lines.recv())
            .await
            .expect("a delivery within a minute")
            .expect("the receiver runs")
    }
}

/// A Ferry whose push consumers wait at most `max_backoff_ms` between
/// attempts at a failing receiver, with tool `t`.
async fn pushing_ferry(max_backoff_ms: &str) -> (TestTool, Ferry) {
    let tool = TestTool::start("t", &["op"]).await;
    let options = ferry_tests::FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..Default::default()
    };
    let ferry = Ferry::start(options.with_args(&["--push-max-backoff-ms", max_backoff_ms])).await;
    (tool, ferry)
}

/// A push consumer whose receiver is down for 20 s, then answers 500 three
/// times, then 200: it receives every event, each thread's in order, and
/// every signature verifies with the reference library.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_consumer_delivers_every_event_in_order_through_an_outage_signed() {
    let (tool, ferry) = pushing_ferry("2000").await;
    let api = ferry.api();
    let port = free_port();
    let spec = json!({"name": "hook", "filter": {"types": ["tool_result"]},
        "push": {"url": format!("http://127.0.0.1:{port}/hook"), "secret": SECRET}});
    let made = make(&api, spec).await;
    assert_eq!(made["push"]["secret"], "***", "{made}");
    let mut want: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for g in 0..4 {
        for c in 0..3 {
            let group_id = format!("g{g}");
            answered(&api, &tool, &group_id, &format!("c{c}")).await;
            let result = api
                .wait_for(&group_id, &format!("c{c}"), "tool_result")
                .await;
            want.entry(group_id)
                .or_default()
                .push(result["seq"].as_u64().unwrap());
        }
    }
    // Down: nothing listens for 20 s while Ferry tries.
    tokio::time::sleep(std::time::Duration::from_secs(20)).await;
    let mut receiver = Receiver::start(port, 3).await;
    let mut taken: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut refused = 0;
    while taken.values().map(Vec::len).sum::<usize>() < 12 {
        let line = receiver.next().await;
        assert_eq!(line["verified"], true, "{line}");
        assert!(
            line["id"].as_str().is_some_and(|id| id.starts_with("msg_")),
            "{line}"
        );
        if line["status"] == 500 {
            refused += 1;
            continue;
        }
        let g = line["group_id"].as_str().unwrap().to_owned();
        let seq = line["seq"].as_u64().unwrap();
        let seqs = taken.entry(g.clone()).or_default();
        // A repeat of an event taken already is allowed (at least once);
        // an event before one taken is not.
        if seqs.last() != Some(&seq) {
            assert!(
                seqs.last().is_none_or(|last| *last < seq),
                "{g}: {seq} after {seqs:?}"
            );
            seqs.push(seq);
        }
    }
    assert_eq!(refused, 3);
    assert_eq!(taken, want, "every event, in order per thread");
    let shown = ferry_tests::eventually(
        "the deliveries recorded",
        std::time::Duration::from_secs(20),
        || async {
            let (_, shown) = api.get("/v1/consumers/hook").await;
            (shown["pending"] == 0).then_some(shown)
        },
    )
    .await;
    assert_eq!(shown["dead_lettered"], 0, "{shown}");
    // Pulling from a push consumer is refused.
    let (status, body) = api.get("/v1/consumers/hook/next").await;
    assert_eq!(status, 400, "{body}");
    drop(receiver.child);
}

/// A receiver that never answers 2xx: its events are dead-lettered after
/// `max_age_secs`, and come back with `replay` once it answers.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_consumer_dead_letters_after_its_max_age_and_replays() {
    let (tool, ferry) = pushing_ferry("500").await;
    let api = ferry.api();
    let port = free_port();
    let mut failing = Receiver::start(port, -1).await;
    let spec = json!({"name": "hook", "filter": {"types": ["tool_result"]},
        "push": {"url": format!("http://127.0.0.1:{port}/"), "secret": SECRET, "max_age_secs": 2}});
    make(&api, spec).await;
    answered(&api, &tool, "a", "c").await;
    answered(&api, &tool, "b", "c").await;
    let shown = ferry_tests::eventually(
        "both dead-lettered",
        std::time::Duration::from_secs(30),
        || async {
            let (_, shown) = api.get("/v1/consumers/hook").await;
            (shown["dead_lettered"] == 2).then_some(shown)
        },
    )
    .await;
    assert_eq!(shown["pending"], 0, "{shown}");
    assert!(failing.next().await["status"] == 500);
    failing.child.kill().await.unwrap();
    let mut taking = Receiver::start(port, 0).await;
    let from_start = json!({"from": {"time": "2020-01-01T00:00:00Z"}});
    let (status, body) = api.post("/v1/consumers/hook/replay", &from_start).await;
    assert_eq!((status, body["threads"].as_u64()), (200, Some(2)), "{body}");
    let mut threads = HashSet::new();
    while threads.len() < 2 {
        let line = taking.next().await;
        assert_eq!(
            (line["verified"].as_bool(), line["status"].as_u64()),
            (Some(true), Some(200)),
            "{line}"
        );
        threads.insert(line["group_id"].as_str().unwrap().to_owned());
    }
    let (_, shown) = api.get("/v1/consumers/hook").await;
    assert_eq!(shown["dead_lettered"], 0, "{shown}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_push_consumers_are_refused_and_change_nothing() {
    let ferry = Ferry::start(ferry_tests::FerryOptions::default()).await;
    let api = ferry.api();
    let push =
        |push: Value| json!({"name": "hook", "filter": {"types": ["tool_result"]}, "push": push});
    for bad in [
        push(json!({"url": "ftp://127.0.0.1/", "secret": SECRET})),
        push(json!({"url": "http://user:pw@127.0.0.1/", "secret": SECRET})),
        push(json!({"url": "/relative", "secret": SECRET})),
        push(json!({"url": "http://127.0.0.1/", "secret": "not-a-whsec"})),
        push(json!({"url": "http://127.0.0.1/", "secret": "whsec_c2hvcnQ="})),
        push(json!({"url": "http://127.0.0.1/"})),
        push(json!({"url": "http://127.0.0.1/", "secret": SECRET, "max_age_secs": 0})),
    ] {
        let (status, body) = api.post("/v1/consumers", &bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            !body.to_string().contains("pw@"),
            "credentials echoed: {body}"
        );
    }
    let (_, listed) = api.get("/v1/consumers").await;
    assert_eq!(listed["consumers"], json!([]), "{listed}");
}

/// An agent worker (`tests/py/consumer_agent.py`, a process of its own).
struct Agent {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    out: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Agent {
    async fn start(ferry: &Ferry, consumer: &str, max: usize) -> Agent {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(workspace().join("target/py/bin/python"))
            .arg(workspace().join("tests/py/consumer_agent.py"))
            .args([ferry.url.as_str(), consumer, &max.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting the agent");
        let stdin = child.stdin.take().unwrap();
        let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(out.next_line().await.unwrap().as_deref(), Some("ready"));
        Agent { child, stdin, out }
    }

    async fn say(&mut self, command: &str) -> Value {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        let line = self.out.next_line().await.unwrap().expect("an answer");
        serde_json::from_str(&line).unwrap()
    }
}

/// An agent that is SIGKILLed with events handed out and unacknowledged:
/// a second agent receives them once `ack_wait` passes. In the end every
/// result was acknowledged exactly once, and each agent saw each thread's
/// results in order.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_killed_holding_events_loses_none_of_them() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    make(
        &api,
        json!({"name": "r", "filter": {"types": ["tool_result"]}, "ack_wait_secs": 2}),
    )
    .await;
    let mut want: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for g in 0..5 {
        for c in 0..2 {
            let (group_id, id) = (format!("g{g}"), format!("c{c}"));
            answered(&api, &tool, &group_id, &id).await;
            let seq = api.wait_for(&group_id, &id, "tool_result").await["seq"]
                .as_u64()
                .unwrap();
            want.entry(group_id).or_default().push(seq);
        }
    }
    let mut first = Agent::start(&ferry, "r", 3).await;
    let held = first.say("pull").await;
    let held: Vec<(String, u64)> = held
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["group_id"].as_str().unwrap().to_owned(),
                e["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(held.len(), 3, "{held:?}");
    first.child.kill().await.unwrap();
    // The second agent takes everything, the killed one's events included
    // once their ack_wait passes.
    let mut second = Agent::start(&ferry, "r", 100).await;
    let mut got: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut acknowledged = 0;
    while acknowledged < 10 {
        let batch = second.say("pull").await;
        for e in batch.as_array().unwrap() {
            let g = e["group_id"].as_str().unwrap().to_owned();
            let seq = e["seq"].as_u64().unwrap();
            let seqs = got.entry(g.clone()).or_default();
            assert!(
                seqs.last().is_none_or(|last| *last < seq),
                "{g}: {seq} after {seqs:?}"
            );
            seqs.push(seq);
            if held.contains(&(g, seq)) {
                assert_eq!(e["deliveries"], 2, "{e}");
            }
        }
        let reply = second.say("ack").await;
        assert_eq!(reply["ignored"], json!([]), "{reply}");
        acknowledged += reply["acknowledged"].as_u64().unwrap();
    }
    assert_eq!(acknowledged, 10);
    assert_eq!(got, want, "every result once, in order per thread");
    let (_, shown) = api.get("/v1/consumers/r").await;
    assert_eq!(
        (shown["pending"].as_u64(), shown["redeliveries"].as_u64()),
        (Some(0), Some(3)),
        "{shown}"
    );
}

/// A token bounded to a `group_prefix` uses only consumers whose threads
/// are all within it; an agent that owns its threads uses none.
#[tokio::test(flavor = "multi_thread")]
async fn a_bounded_token_uses_only_consumers_within_its_reach() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let root = ferry
        .api()
        .make_token(json!({"name": "ops", "scopes": ["admin", "read"]}))
        .await;
    let admin = ferry_tests::Api::with_token(&ferry.url, &root);
    let team = admin
        .make_token(json!({"name": "team-a", "scopes": ["read"], "group_prefix": "team-a/"}))
        .await;
    let agent = admin
        .make_token(json!({"name": "agent", "scopes": ["submit", "read"]}))
        .await;
    let types = json!(["tool_result"]);
    make(&admin, json!({"name": "all", "filter": {"types": types}})).await;
    make(
        &admin,
        json!({"name": "mine", "filter": {"types": types, "group_prefix": "team-a/x"}}),
    )
    .await;
    let team = ferry_tests::Api::with_token(&ferry.url, &team);
    let agent = ferry_tests::Api::with_token(&ferry.url, &agent);
    let (status, body) = team.get("/v1/consumers/mine/next").await;
    assert_eq!(status, 200, "{body}");
    for (who, api, name) in [
        ("team-a", &team, "all"),
        ("agent", &agent, "all"),
        ("agent", &agent, "mine"),
    ] {
        let (status, body) = api.get(&format!("/v1/consumers/{name}/next")).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (403, Some("forbidden")),
            "{who} {name}: {body}"
        );
        let acks = json!({"acks": [{"group_id": "team-a/x1", "seq": 1}]});
        let (status, _) = api.post(&format!("/v1/consumers/{name}/ack"), &acks).await;
        assert_eq!(status, 403, "{who} {name}");
    }
    // Its list holds only what it may use; it makes none.
    let (_, listed) = team.get("/v1/consumers").await;
    let names: Vec<&str> = listed["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mine"], "{listed}");
    let spec = json!({"name": "x", "filter": {"types": types}});
    assert_eq!(team.post("/v1/consumers", &spec).await.0, 403);
}

/// The lag gauges are counted on their own, for Prometheus: a consumer
/// that nobody looks at shows its pending result in `/metrics`.
#[tokio::test(flavor = "multi_thread")]
async fn the_lag_of_a_consumer_nobody_looks_at_reaches_the_metrics() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    let (status, _) = api
        .post(
            "/v1/consumers",
            &json!({"name": "unwatched", "filter": {"types": ["tool_result"]}}),
        )
        .await;
    assert_eq!(status, 201);
    answered(&api, &tool, "g", "c").await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let line = ferry_tests::eventually(
        "the pending gauge",
        std::time::Duration::from_secs(40),
        || async {
            let text = client
                .get(format!("{}/metrics", ferry.url))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            text.lines()
                .find(|l| {
                    l.starts_with("ferry_consumer_pending{consumer=\"unwatched\"}")
                        && l.ends_with(" 1")
                })
                .map(str::to_owned)
        },
    )
    .await;
    assert!(line.ends_with(" 1"), "{line}");
}
