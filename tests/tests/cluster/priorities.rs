//! Worker priorities (`ferry worker --priority`): the shared consumers,
//! as NATS reports them, and what a worker says it dispatched.

use std::time::Duration;

use async_nats::jetstream::consumer::{Info, PullConsumer};
use ferry_nats::cluster::streams;
use ferry_tests::{eventually, Api, FerryWorker, Nats};
use futures::future::join_all;
use serde_json::json;

use super::{consumer, metered_worker, shared, Cluster, WORK_STREAM};

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
    let (_first, first) = metered_worker(&c, &[&["--priority", "0"][..], &STUCK].concat()).await;
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
