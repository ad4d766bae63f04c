//! `ferry worker` on SIGTERM (a rolling restart): it takes no more work,
//! finishes the dispatch attempts it has under way (for up to
//! `--drain-ms`), hands the rest back for another worker to take at once,
//! and exits 0. What a worker hands back, NATS reports as a nak advisory.

use std::time::Duration;

use async_nats::Subscriber;
use ferry_tests::{eventually, Ack, Api, FerryWorker, Nats};
use futures::StreamExt;
use serde_json::{json, Value};

use super::{consumer, Cluster, WORK_STREAM};

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
