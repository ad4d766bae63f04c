//! Dispatch: the tool must acknowledge with 200; connection errors, 5xx and
//! 429 are retried with backoff (honouring `Retry-After`); a 4xx is never
//! retried; giving up records an `Error: ` result the agent can read.

use std::time::Duration;

use ferry_tests::{Ack, Ferry, FerryOptions, TestTool};
use serde_json::json;

async fn ferry_with(tool: &TestTool, extra: &[&str]) -> Ferry {
    let mut options = FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::default()
    };
    options.args.extend(extra.iter().map(|s| s.to_string()));
    Ferry::start(options).await
}

#[tokio::test]
async fn a_tool_answering_500_twice_then_200_is_dispatched_on_the_third_attempt() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::Status(500), Ack::Status(500)]);
    let ferry = ferry_with(&tool, &[]).await;
    let api = ferry.api();
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    for _ in 0..3 {
        assert_eq!(tool.next_invocation().await.invocation.id, "c");
    }
    let dispatched = api.wait_for("g", "c", "call_dispatched").await;
    assert_eq!(dispatched["payload"]["attempts"], 3);
    // Each failed attempt is in the log, before the acknowledgement.
    let retries: Vec<_> = api
        .events("g", 0)
        .await
        .into_iter()
        .filter(|e| e["type"] == "dispatch_retrying")
        .map(|e| {
            assert!(e["seq"].as_u64() < dispatched["seq"].as_u64(), "{e}");
            assert!(e["payload"]["retry_in_ms"].as_u64().is_some(), "{e}");
            (
                e["payload"]["attempts"].clone(),
                e["payload"]["reason"].clone(),
            )
        })
        .collect();
    assert_eq!(
        retries,
        [
            (json!(1), json!("the tool answered HTTP 500")),
            (json!(2), json!("the tool answered HTTP 500")),
        ]
    );
    let (_, call) = api.call("g", "c").await;
    assert_eq!(
        (call["status"].as_str(), call["attempts"].as_u64()),
        (Some("dispatched"), Some(3))
    );
    // After the 200, Ferry waits for the callback: no further attempts.
    let url = tool.invocations()[2].callback_url.clone();
    api.post(
        &url,
        &json!({"type": "tool_result", "group_id": "g", "id": "c", "text": "ok"}),
    )
    .await;
    assert_eq!(api.call("g", "c").await.1["status"], "completed");
    assert_eq!(tool.invocations().len(), 3);
}

#[tokio::test]
async fn a_4xx_is_never_retried_and_fails_the_call() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::Status(404)]);
    let ferry = ferry_with(&tool, &[]).await;
    let api = ferry.api();
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    let result = api.wait_for("g", "c", "tool_result").await;
    assert_eq!(result["payload"]["origin"], "ferry");
    assert_eq!(result["payload"]["is_error"], true);
    assert_eq!(
        result["payload"]["text"],
        "Error: the tool refused the call (HTTP 404)"
    );
    let (_, call) = api.call("g", "c").await;
    assert_eq!(
        (call["status"].as_str(), call["attempts"].as_u64()),
        (Some("failed"), Some(1))
    );
    assert_eq!(tool.invocations().len(), 1);
    // `call_dispatched` means the tool acknowledged the call with a 200;
    // a refused call has none, not even one before its failure. The
    // attempts ride on the failure.
    assert_eq!(api.types("g").await, ["call_accepted", "tool_result"]);
    assert_eq!(result["payload"]["attempts"], 1, "{result}");
}

#[tokio::test]
async fn other_non_200_answers_end_the_call() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::Status(202)]);
    let ferry = ferry_with(&tool, &[]).await;
    let api = ferry.api();
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    let result = api.wait_for("g", "c", "tool_result").await;
    assert!(result["payload"]["text"]
        .as_str()
        .unwrap()
        .starts_with("Error: "));
    assert_eq!(api.call("g", "c").await.1["status"], "failed");
}

#[tokio::test]
async fn a_tool_that_refuses_connections_fails_after_the_retries() {
    // A tool server that answers discovery, closing each connection after
    // its answer, and is gone by the time its endpoint (on the same
    // origin, as Ferry requires) is called.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let manifest = json!({"name": "gone", "endpoint": format!("{url}/invoke"),
        "tools": [{"name": "op", "description": "", "inputSchema": {"type": "object"}}]});
    let discovery = axum::Router::new().route(
        "/.well-known/rap-toolset",
        axum::routing::get(move || {
            let manifest = manifest.clone();
            async move { ([("connection", "close")], axum::Json(manifest)) }
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, discovery).await });
    let mut options = FerryOptions {
        tool_servers: vec![url],
        ..FerryOptions::default()
    };
    options
        .args
        .extend(["--max-attempts".to_owned(), "3".to_owned()]);
    let ferry = Ferry::start(options).await;
    server.abort();
    let _ = server.await;
    let api = ferry.api();
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    let result = api.wait_for("g", "c", "tool_result").await;
    assert_eq!(
        result["payload"]["text"],
        "Error: the tool could not be reached after 3 attempts"
    );
    let (_, call) = api.call("g", "c").await;
    assert_eq!(
        (call["status"].as_str(), call["attempts"].as_u64()),
        (Some("failed"), Some(3))
    );
    // No internal detail (addresses, OS errors) reaches the agent.
    assert!(!result["payload"]["text"]
        .as_str()
        .unwrap()
        .contains("127.0.0.1"));
}

#[tokio::test]
async fn exhausted_5xx_retries_fail_the_call() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::Status(503); 3]);
    let ferry = ferry_with(&tool, &["--max-attempts", "3"]).await;
    let api = ferry.api();
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    let result = api.wait_for("g", "c", "tool_result").await;
    assert_eq!(
        result["payload"]["text"],
        "Error: the tool kept failing (HTTP 503) after 3 attempts"
    );
    assert_eq!(tool.invocations().len(), 3);
}

/// A call waiting to retry shows the attempts made so far, and why it
/// waits: an agent polling it is not told `attempts: 0`.
#[tokio::test]
async fn a_call_waiting_to_retry_shows_its_attempts_and_why() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::RetryAfter(503, 60)]);
    let ferry = ferry_with(&tool, &[]).await;
    let api = ferry.api();
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    let retry = api.wait_for("g", "c", "dispatch_retrying").await;
    assert_eq!(
        retry["payload"],
        json!({"attempts": 1, "reason": "the tool answered HTTP 503", "retry_in_ms": 60_000})
    );
    let (_, call) = api.call("g", "c").await;
    assert_eq!(
        (call["status"].as_str(), call["attempts"].as_u64()),
        (Some("queued"), Some(1))
    );
    // A tool that cannot be reached says so (no address, no OS error).
    tool.stop();
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "h", "id": "d"}))
        .await;
    let retry = api.wait_for("h", "d", "dispatch_retrying").await;
    assert_eq!(retry["payload"]["reason"], "the tool could not be reached");
}

/// The bound on attempts holds across a crash: attempts recorded before a
/// kill -9 count after the restart, so the tool sees `--max-attempts` in
/// all, not that many more.
#[tokio::test]
async fn the_attempt_bound_holds_across_kill_9() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[
        Ack::Status(503),
        Ack::RetryAfter(503, 60),
        Ack::Status(503),
        Ack::Status(503),
        Ack::Status(503),
    ]);
    let mut ferry = ferry_with(
        &tool,
        &["--max-attempts", "3", "--initial-backoff-ms", "10"],
    )
    .await;
    ferry
        .api()
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    // Two attempts made and recorded; the call waits out the Retry-After.
    ferry
        .api()
        .wait_event("g", 0, |e| {
            e["type"] == "dispatch_retrying" && e["payload"]["attempts"] == 2
        })
        .await;
    ferry.restart().await;
    let api = ferry.api();
    let result = api.wait_for("g", "c", "tool_result").await;
    assert_eq!(
        result["payload"]["text"],
        "Error: the tool kept failing (HTTP 503) after 3 attempts"
    );
    assert_eq!(tool.invocations().len(), 3);
    assert_eq!(api.call("g", "c").await.1["attempts"], 3);
}

#[tokio::test]
async fn a_429_with_retry_after_waits_as_asked() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::RetryAfter(429, 1)]);
    // Backoff capped at 2 s so the Retry-After of 1 s is not cut short.
    let ferry = ferry_with(&tool, &["--max-backoff-ms", "2000"]).await;
    let api = ferry.api();
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    let first = tool.next_invocation().await.at;
    let second = tool.next_invocation().await.at;
    assert!(
        second - first >= Duration::from_millis(950),
        "retried after {:?}",
        second - first
    );
    assert_eq!(
        api.wait_for("g", "c", "call_dispatched").await["payload"]["attempts"],
        2
    );
}

#[tokio::test]
async fn a_call_cancelled_during_retries_stops_being_retried() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::RetryAfter(503, 1), Ack::Status(503), Ack::Status(503)]);
    let ferry = ferry_with(&tool, &["--max-backoff-ms", "2000"]).await;
    cancel_during_retries_then_call_again(&ferry.api(), &tool).await;
    assert_eq!(ferry.api().count("g", "c", "tool_result").await, 0);
}

/// Call `c` of thread `g` is cancelled after its first attempt, while it
/// waits to retry; the thread's next call must then reach the tool (one at
/// a time, in order: only once the cancelled call's dispatch ended), and
/// `c` is not sent again.
async fn cancel_during_retries_then_call_again(api: &ferry_tests::Api, tool: &TestTool) {
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    tool.next_invocation().await;
    assert_eq!(api.delete("/v1/threads/g/calls/c").await.0, 200);
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "next"}))
        .await;
    assert_eq!(tool.next_invocation().await.invocation.id, "next");
    assert_eq!(tool.invocations().iter().filter(|i| i.id == "c").count(), 1);
}

/// A cancel frees the thread at once, not after the rest of the wait the
/// tool asked for: the thread's next call goes out while the cancelled
/// call's `Retry-After` of two minutes still runs (next_invocation gives
/// up after 20 s).
#[tokio::test]
async fn a_cancel_during_a_long_retry_after_frees_the_thread() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::RetryAfter(429, 120)]);
    let ferry = ferry_with(&tool, &[]).await;
    cancel_during_retries_then_call_again(&ferry.api(), &tool).await;
}

/// A tool asking for a long wait must not hold up another tool: a call
/// waiting out its `Retry-After` holds none of the attempts in flight.
#[tokio::test]
async fn calls_waiting_to_retry_do_not_hold_up_other_tools() {
    let stuck = TestTool::start("stuck", &["wait"]).await;
    let healthy = TestTool::start("healthy", &["go"]).await;
    stuck.plan(&[Ack::RetryAfter(429, 120); 3]);
    let mut options = FerryOptions {
        tool_servers: vec![stuck.url.clone(), healthy.url.clone()],
        ..FerryOptions::default()
    };
    options
        .args
        .extend(["--max-in-flight", "2", "--max-backoff-ms", "200000"].map(String::from));
    let ferry = Ferry::start(options).await;
    ferry_tests::calls_waiting_to_retry_leave_room(&ferry.api(), &stuck).await;
    assert_eq!(healthy.invocations().len(), 1);
}

/// Bad dispatch settings stop `ferry` before it starts, saying which.
#[test]
fn zero_attempts_in_flight_or_ack_timeout_are_refused_at_start() {
    let data = tempfile::tempdir().unwrap();
    let data = data.path().to_str().unwrap();
    let serve = ["serve", "--listen", "127.0.0.1:0", "--data", data];
    let worker = [
        "worker",
        "--secret",
        "0123456789abcdef",
        "--public-url",
        "http://127.0.0.1:9",
    ];
    for (command, flag) in [
        (&serve[..], "--max-attempts"),
        (&serve[..], "--max-in-flight"),
        (&serve[..], "--ack-timeout-ms"),
        (&worker[..], "--max-in-flight"),
        (&worker[..], "--ack-timeout-ms"),
    ] {
        let (status, stderr) = ferry_tests::ferry::refused(&[command, &[flag, "0"]].concat());
        assert!(!status.success(), "{} {flag} 0 started", command[0]);
        assert!(
            stderr.contains(&format!("{flag} must be at least 1")),
            "{} {flag} 0: {stderr}",
            command[0]
        );
    }
}

/// Values that would only fail later, and quietly, stop `ferry` at start
/// with an error naming the flag (accepted, a `--public-url` without a
/// scheme means no callback can ever arrive; an empty `--nats` is
/// retried for ever; a huge `--oxp-wait-secs` drops every OXP call; a
/// short worker `--secret` goes unreported while NATS is down).
#[test]
fn values_that_could_only_fail_later_are_refused_at_start() {
    let data = tempfile::tempdir().unwrap();
    let data = data.path().to_str().unwrap();
    let serve = ["serve", "--listen", "127.0.0.1:0", "--data", data];
    let worker = ["worker", "--nats", "nats://127.0.0.1:9"];
    let secret = ["--secret", "0123456789abcdef"];
    let public = ["--public-url", "http://127.0.0.1:9"];
    let cases: [(&[&str], &[&str], &str); 9] = [
        (&serve, &["--public-url", "127.0.0.1:8080"], "--public-url"),
        (&serve, &["--public-url", ""], "--public-url"),
        (&serve, &["--tool-server", "notaurl"], "--tool-server"),
        (
            &serve,
            &["--tool-server", "http://127.0.0.1:9/?v=2"],
            "--tool-server",
        ),
        (
            &serve,
            &["--oxp-wait-secs", "18446744073709551615"],
            "--oxp-wait-secs",
        ),
        (
            &worker,
            &["--secret", "short", "--public-url", "http://127.0.0.1:9"],
            "--secret",
        ),
        (
            &worker,
            &[secret[0], secret[1], "--public-url", "ftp://x"],
            "--public-url",
        ),
        (
            &worker,
            &[secret[0], secret[1], public[0], public[1], "--nats", ""],
            "--nats",
        ),
        (
            &worker,
            &[
                secret[0],
                secret[1],
                public[0],
                public[1],
                "--nats",
                "nats://a:1,",
            ],
            "--nats",
        ),
    ];
    for (command, args, flag) in cases {
        let (status, stderr) = ferry_tests::ferry::refused(&[command, args].concat());
        assert!(!status.success(), "{args:?} started");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
}

/// Issue 2: "Messages of one thread are processed one at a time, in
/// order." Two calls of one thread accepted at the same moment become
/// durable in one group commit; they must still reach the tool in the order
/// of their sequence numbers, in every thread.
#[tokio::test]
async fn calls_of_one_thread_submitted_at_once_reach_the_tool_in_seq_order() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = ferry_with(&tool, &[]).await;
    let api = ferry.api();
    let threads = 100;
    let submits = (0..threads).flat_map(|t| {
        ["a", "b"].map(|id| {
            let api = api.clone();
            async move {
                let g = format!("par-{t}");
                let (status, body) = api
                    .submit(json!({"operation": "op", "arguments": {}, "group_id": g, "id": id}))
                    .await;
                assert_eq!(status, 202, "{body}");
                (g, id, body["seq"].as_u64().unwrap())
            }
        })
    });
    let accepted = futures::future::join_all(submits).await;
    while tool.invocations().len() < 2 * threads {
        tool.next_invocation().await;
    }
    let sent = tool.invocations();
    for t in 0..threads {
        let g = format!("par-{t}");
        let mut by_seq: Vec<_> = accepted.iter().filter(|(x, ..)| *x == g).collect();
        by_seq.sort_by_key(|(.., seq)| *seq);
        let expected: Vec<&str> = by_seq.iter().map(|(_, id, _)| *id).collect();
        let got: Vec<&str> = sent
            .iter()
            .filter(|i| i.group_id == g)
            .map(|i| i.id.as_str())
            .collect();
        assert_eq!(got, expected, "thread {g}");
    }
}
