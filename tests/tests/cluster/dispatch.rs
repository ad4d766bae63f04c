//! Workers dispatching: retries and the attempt bound across workers, calls
//! waiting to retry, calls a tool forgot, and a worker's `/metrics`.

use ferry_tests::{Ferry, FerryOptions, FerryWorker, Nats, TestTool};
use serde_json::{json, Value};

use super::{metered_worker, registered_on_both, Cluster};

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
