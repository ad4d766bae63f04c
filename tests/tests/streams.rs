//! Reading a thread: long-poll events, the SSE stream (with resumption),
//! the event shape, thread metadata, closing a thread, and the operational
//! endpoints (`/healthz`, `/metrics`, unknown routes).

use std::time::{Duration, Instant};

use ferry_proto::Invocation;
use ferry_tests::api::seg;
use ferry_tests::sse::{Sse, SseReader};
use ferry_tests::{Ack, Api, Ferry, FerryOptions, TestTool};
use serde_json::{json, Value};

/// Asserts an answer is the API's error shape with `status` and `code`.
fn refused(answer: &(u16, Value), status: u16, code: &str) {
    let (got, body) = answer;
    assert_eq!(*got, status, "expected {status} {code}, got {got}: {body}");
    assert_eq!(body["error"]["code"], code, "wrong error code: {body}");
    let message = body["error"]["message"].as_str();
    assert!(
        message.is_some_and(|m| !m.is_empty()),
        "error without a message: {body}"
    );
}

/// A TestTool serving toolset `S` with tool `op`, and a Ferry that
/// registered it at start.
async fn setup() -> (TestTool, Ferry) {
    let tool = TestTool::start("S", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    (tool, ferry)
}

/// Submits call `id` in `group_id`, and returns the invocation the tool
/// received once Ferry has recorded it as dispatched.
async fn dispatched(api: &Api, tool: &TestTool, group_id: &str, id: &str) -> Invocation {
    dispatched_as(api, tool, "op", group_id, id).await
}

/// [`dispatched`], of the tool's `operation`.
async fn dispatched_as(
    api: &Api,
    tool: &TestTool,
    operation: &str,
    group_id: &str,
    id: &str,
) -> Invocation {
    let call =
        json!({"operation": operation, "arguments": {"text": id}, "group_id": group_id, "id": id});
    let (status, reply) = api.submit(call).await;
    assert_eq!(status, 202, "{reply}");
    let invocation = tool.next_invocation().await.invocation;
    assert_eq!(invocation.id, id);
    api.wait_for(group_id, id, "call_dispatched").await;
    invocation
}

/// Sends the call's `tool_result` callback, as the tool would.
async fn send_result(api: &Api, invocation: &Invocation, text: &str) {
    let body = json!({"type": "tool_result", "group_id": invocation.group_id, "id": invocation.id, "text": text});
    let (status, answer) = api.post(&invocation.callback_url, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["status"], "applied");
}

/// A call submitted, dispatched and completed: three events.
async fn completed(api: &Api, tool: &TestTool, group_id: &str, id: &str) {
    let invocation = dispatched(api, tool, group_id, id).await;
    send_result(api, &invocation, &format!("done {id}")).await;
}

fn seqs(events: &[Value]) -> Vec<u64> {
    events.iter().map(|e| e["seq"].as_u64().unwrap()).collect()
}

fn events_path(group_id: &str, query: &str) -> String {
    format!("/v1/threads/{}/events?{query}", seg(group_id))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_poll_returns_as_soon_as_the_event_lands() {
    let (tool, ferry) = setup().await;
    let api = ferry.api();
    let invocation = dispatched(&api, &tool, "g", "c1").await;
    let tip = api.events("g", 0).await.last().unwrap()["seq"]
        .as_u64()
        .unwrap();
    assert_eq!(tip, 2, "call_accepted and call_dispatched");

    let poller = api.clone();
    let mut poll = tokio::spawn(async move {
        let answer = poller
            .get(&events_path("g", &format!("after={tip}&wait=10")))
            .await;
        (answer, Instant::now())
    });
    // Not a synchronisation: the poll must still be waiting (without long
    // poll it would have answered `[]` at once).
    let early = tokio::time::timeout(Duration::from_millis(500), &mut poll).await;
    assert!(
        early.is_err(),
        "the long poll answered before any event: {early:?}"
    );

    let sent = Instant::now();
    send_result(&api, &invocation, "landed").await;
    let ((status, body), answered) = tokio::time::timeout(Duration::from_secs(8), poll)
        .await
        .expect("the long poll did not return when the event landed")
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let events = body["events"].as_array().unwrap();
    assert_eq!(seqs(events), [3], "{body}");
    assert_eq!(events[0]["type"], "tool_result");
    assert_eq!(events[0]["id"], "c1");
    assert_eq!(events[0]["payload"]["text"], "landed");
    assert_eq!(body["next_after"], 3);
    let late = answered.saturating_duration_since(sent);
    assert!(
        late < Duration::from_secs(5),
        "the poll answered {late:?} after the event"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn long_poll_honours_wait_limit_and_after() {
    let (tool, ferry) = setup().await;
    let api = ferry.api();
    completed(&api, &tool, "g", "c1").await;
    completed(&api, &tool, "g", "c2").await;

    let (status, page) = api.get(&events_path("g", "after=0&limit=2")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(seqs(page["events"].as_array().unwrap()), [1, 2]);
    assert_eq!(page["next_after"], 2);
    let (_, page) = api.get(&events_path("g", "after=2&limit=3")).await;
    assert_eq!(seqs(page["events"].as_array().unwrap()), [3, 4, 5]);
    assert_eq!(page["next_after"], 5);
    let (_, page) = api.get(&events_path("g", "after=5")).await;
    assert_eq!(seqs(page["events"].as_array().unwrap()), [6]);

    // Nothing new and wait=0: an empty page at once.
    let started = Instant::now();
    let (status, page) = api.get(&events_path("g", "after=6&wait=0")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page, json!({"events": [], "next_after": 6}));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "wait=0 waited {:?}",
        started.elapsed()
    );
    // Beyond the end: nothing, and the cursor stays where it was.
    let (status, page) = api.get(&events_path("g", "after=100")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page, json!({"events": [], "next_after": 100}));
    // The largest cursor there is: nothing after it, and no overflow.
    let (status, page) = api
        .get(&events_path("g", &format!("after={}", u64::MAX)))
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["events"], json!([]));

    for query in [
        "after=abc",
        "after=-1",
        "limit=many",
        "limit=0",
        "limit=-3",
        "wait=abc",
        "wait=-1",
    ] {
        let answer = api.get(&events_path("g", query)).await;
        refused(&answer, 400, "invalid_request");
    }
    let answer = api.get("/v1/threads?limit=0").await;
    refused(&answer, 400, "invalid_request");
    // Past the page bound (1 000 events, 500 threads), the bound is served.
    let (status, page) = api.get(&events_path("g", "limit=5000")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["events"].as_array().map(Vec::len), Some(6));
    let (status, _) = api.get("/v1/threads?limit=5000").await;
    assert_eq!(status, 200);
    // However large: a limit past what `usize` holds is the bound too
    // (not refused as "not a valid number").
    let huge = "limit=99999999999999999999999999999999999999999";
    let (status, page) = api.get(&events_path("g", huge)).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["events"].as_array().map(Vec::len), Some(6));
    let (status, page) = api.get(&format!("/v1/threads?{huge}")).await;
    assert_eq!(status, 200, "{page}");
    let (_, thread) = api.thread("g").await;
    assert_eq!(thread["last_seq"], 6, "{thread}");
    assert_eq!(seqs(&api.events("g", 0).await), [1, 2, 3, 4, 5, 6]);
}

/// Asserts an SSE event is event `seq` of type `kind`, `id` being the seq.
fn assert_sse(sse: &Sse, seq: u64, kind: &str) {
    assert_eq!(sse.id.as_deref(), Some(seq.to_string().as_str()), "{sse:?}");
    assert_eq!(sse.event.as_deref(), Some(kind), "{sse:?}");
    assert_eq!(sse.data["seq"], seq, "{sse:?}");
    assert_eq!(sse.data["type"], kind, "{sse:?}");
    assert_eq!(sse.data["group_id"], "g", "{sse:?}");
}

/// Opens a stream that should be refused: its status and error body.
async fn open_refused(api: &Api, path: &str, last_event_id: Option<&str>) -> (u16, Value) {
    let mut request = api.client.get(format!("{}{path}", api.base));
    if let Some(value) = last_event_id {
        request = request.header("last-event-id", value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.expect("an error body"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sse_stream_delivers_events_in_order_and_resumes() {
    let (tool, ferry) = setup().await;
    let api = ferry.api();

    // A stream opened on an empty thread receives its first event.
    let mut live = SseReader::open(&api, "/v1/threads/g/stream", None).await;
    let invocation = dispatched(&api, &tool, "g", "c1").await;
    assert_sse(&live.next().await, 1, "call_accepted");
    assert_sse(&live.next().await, 2, "call_dispatched");
    send_result(&api, &invocation, "one").await;
    let result = live.next().await;
    assert_sse(&result, 3, "tool_result");
    assert_eq!(result.data["id"], "c1");
    assert_eq!(result.data["payload"]["text"], "one");

    // A fresh stream replays from the start, in order.
    let mut replay = SseReader::open(&api, "/v1/threads/g/stream", None).await;
    for (seq, kind) in [
        (1, "call_accepted"),
        (2, "call_dispatched"),
        (3, "tool_result"),
    ] {
        assert_sse(&replay.next().await, seq, kind);
    }
    // A new event reaches both open streams.
    dispatched(&api, &tool, "g", "c2").await;
    for stream in [&mut live, &mut replay] {
        let accepted = stream.next().await;
        assert_sse(&accepted, 4, "call_accepted");
        assert_eq!(accepted.data["id"], "c2");
        assert_sse(&stream.next().await, 5, "call_dispatched");
    }

    // Resuming: `Last-Event-ID: 2` and `?after=2` both start at seq 3.
    let mut resumed = SseReader::open(&api, "/v1/threads/g/stream", Some("2")).await;
    let mut after = SseReader::open(&api, "/v1/threads/g/stream?after=2", None).await;
    for stream in [&mut resumed, &mut after] {
        for (seq, kind) in [
            (3, "tool_result"),
            (4, "call_accepted"),
            (5, "call_dispatched"),
        ] {
            assert_sse(&stream.next().await, seq, kind);
        }
    }

    // An empty `Last-Event-ID` is no id (the SSE model's "no last event
    // id"): the stream starts where it would without the header.
    let mut from_start = SseReader::open(&api, "/v1/threads/g/stream", Some("")).await;
    assert_sse(&from_start.next().await, 1, "call_accepted");
    let mut from_after = SseReader::open(&api, "/v1/threads/g/stream?after=4", Some(" ")).await;
    assert_sse(&from_after.next().await, 5, "call_dispatched");

    for (query, header) in [("", Some("abc")), ("", Some("-1")), ("?after=abc", None)] {
        let answer = open_refused(&api, &format!("/v1/threads/g/stream{query}"), header).await;
        refused(&answer, 400, "invalid_request");
    }
}

/// `?types=` keeps only the wanted event types, on the stream and on the
/// long poll; the others still advance the reader's position.
#[tokio::test(flavor = "multi_thread")]
async fn readers_can_ask_for_some_event_types_only() {
    let (tool, ferry) = setup().await;
    let api = ferry.api();
    let mut results = SseReader::open(&api, "/v1/threads/g/stream?types=tool_result", None).await;
    completed(&api, &tool, "g", "c1").await;
    completed(&api, &tool, "g", "c2").await;
    for (seq, id) in [(3, "c1"), (6, "c2")] {
        let event = results.next().await;
        assert_sse(&event, seq, "tool_result");
        assert_eq!(event.data["id"], id);
    }
    // Resuming a filtered stream skips what it does not want.
    let mut resumed = SseReader::open(
        &api,
        "/v1/threads/g/stream?types=call_accepted,tool_result",
        Some("3"),
    )
    .await;
    assert_sse(&resumed.next().await, 4, "call_accepted");
    assert_sse(&resumed.next().await, 6, "tool_result");

    let (status, page) = api
        .get(&events_path("g", "after=0&types=call_dispatched"))
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(seqs(page["events"].as_array().unwrap()), [2, 5]);
    assert_eq!(page["next_after"], 6);
    // Pages of unwanted events are scanned past, with or without `wait`:
    // the first page holding a wanted one answers.
    let (_, page) = api
        .get(&events_path("g", "after=0&limit=1&types=tool_result"))
        .await;
    assert_eq!(seqs(page["events"].as_array().unwrap()), [3], "{page}");
    assert_eq!(page["next_after"], 3);
    let (_, page) = api
        .get(&events_path(
            "g",
            "after=0&limit=2&types=tool_result&wait=0",
        ))
        .await;
    assert_eq!(seqs(page["events"].as_array().unwrap()), [3], "{page}");
    assert_eq!(page["next_after"], 4);
    // Past the last wanted event: empty, the cursor at the end.
    let (_, page) = api
        .get(&events_path("g", "after=6&limit=1&types=tool_result"))
        .await;
    assert_eq!(page, json!({"events": [], "next_after": 6}));

    // A long poll waits through unwanted events for a wanted one.
    let invocation = dispatched(&api, &tool, "g", "c3").await;
    let poller = api.clone();
    let mut poll = tokio::spawn(async move {
        poller
            .get(&events_path("g", "after=6&wait=10&types=tool_result"))
            .await
    });
    // Not a synchronisation: seqs 7 and 8 are there already, and the poll
    // must not answer with them filtered away (an empty page).
    let early = tokio::time::timeout(Duration::from_millis(500), &mut poll).await;
    assert!(
        early.is_err(),
        "the poll answered before a result: {early:?}"
    );
    send_result(&api, &invocation, "three").await;
    let (status, page) = tokio::time::timeout(Duration::from_secs(8), poll)
        .await
        .expect("the long poll did not return on the wanted event")
        .unwrap();
    assert_eq!(status, 200, "{page}");
    assert_eq!(seqs(page["events"].as_array().unwrap()), [9], "{page}");
    assert_eq!(page["next_after"], 9);

    // Bad filters: 400, naming the problem.
    for query in ["types=", "types=tool_result,nope", "types=TOOL_RESULT"] {
        let answer = api.get(&events_path("g", query)).await;
        refused(&answer, 400, "invalid_request");
        let answer = open_refused(&api, &format!("/v1/threads/g/stream?{query}"), None).await;
        refused(&answer, 400, "invalid_request");
    }
    let (_, thread) = api.thread("g").await;
    assert_eq!(thread["last_seq"], 9, "{thread}");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_event_has_the_documented_fields_and_dense_seqs() {
    let (tool, ferry) = setup().await;
    let api = ferry.api();
    completed(&api, &tool, "g", "c1").await;
    dispatched(&api, &tool, "g", "c2").await;
    let (status, cancelled) = api.delete("/v1/threads/g/calls/c2").await;
    assert_eq!(status, 200, "{cancelled}");
    let (status, closed) = api.post("/v1/threads/g/close", &json!({})).await;
    assert_eq!(status, 200, "{closed}");

    let events = api.events("g", 0).await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "call_accepted",
            "call_dispatched",
            "tool_result",
            "call_accepted",
            "call_dispatched",
            "call_cancelled",
            "thread_closed"
        ]
    );
    // Seqs are dense and start at 1.
    assert_eq!(seqs(&events), (1..=events.len() as u64).collect::<Vec<_>>());
    let mut previous = String::new();
    let mut without_payload = vec![];
    for event in &events {
        for field in ["seq", "type", "group_id", "at"] {
            assert!(
                event.get(field).is_some(),
                "event without {field:?}: {event}"
            );
        }
        if event.get("payload").is_none() {
            without_payload.push(event["type"].as_str().unwrap().to_owned());
        }
        assert_eq!(event["group_id"], "g", "{event}");
        let at = event["at"].as_str().unwrap();
        assert!(
            at.contains('T') && at.ends_with('Z'),
            "`at` is not RFC 3339 UTC: {event}"
        );
        assert!(at >= previous.as_str(), "time went backwards: {event}");
        previous = at.to_owned();
        let expected_id = match event["seq"].as_u64().unwrap() {
            1..=3 => json!("c1"),
            4..=6 => json!("c2"),
            _ => Value::Null,
        };
        assert_eq!(
            event.get("id").cloned().unwrap_or(Value::Null),
            expected_id,
            "{event}"
        );
    }
    let accepted = &events[0]["payload"];
    assert_eq!(accepted["operation"], "op");
    assert_eq!(accepted["tool"], "S.op@1.0.0");
    assert_eq!(accepted["arguments"], json!({"text": "c1"}));
    assert_eq!(events[1]["payload"]["attempts"], 1);
    assert_eq!(events[2]["payload"]["text"], "done c1");
    assert_eq!(events[2]["payload"]["is_error"], false);
    assert_eq!(events[2]["payload"]["origin"], "tool");
    // Every event carries `payload`, even a type with nothing to say.
    assert!(
        without_payload.is_empty(),
        "events without \"payload\": {without_payload:?} in {events:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn closing_a_thread_tells_the_tools_and_refuses_later_calls() {
    let (tool, ferry) = setup().await;
    let api = ferry.api();
    completed(&api, &tool, "g", "c1").await;

    let (status, closed) = api.post("/v1/threads/g/close", &json!({})).await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(
        closed,
        json!({"group_id": "g", "closed": true, "last_seq": 4})
    );
    // rap-3: "`POST /close_thread` `{"thread_id"}` — best effort, single
    // shot, to every configured tool server when a thread is closed" (to
    // those that had calls in it, here: see
    // `notices_go_only_to_the_tool_servers_of_the_call_and_the_thread`).
    let (kind, notice) = tool.next_notice().await;
    assert_eq!(kind, "close_thread");
    assert_eq!(notice, json!({"thread_id": "g"}));
    let (_, thread) = api.thread("g").await;
    assert_eq!(thread["closed"], true, "{thread}");

    let answer = api
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c2"}))
        .await;
    refused(&answer, 409, "thread_closed");
    refused(&api.call("g", "c2").await, 404, "not_found");
    let events = api.events("g", 0).await;
    assert_eq!(seqs(&events), [1, 2, 3, 4], "the refused call left a trace");
    assert_eq!(events[3]["type"], "thread_closed");

    // A call in another thread still goes through; the refused one never
    // reached the tool.
    dispatched(&api, &tool, "other", "c3").await;
    let ids: Vec<String> = tool.invocations().into_iter().map(|i| i.id).collect();
    assert_eq!(ids, ["c1", "c3"]);
}

/// Closing a thread ends what is open in it: an active subscription, a
/// call waiting out a `Retry-After`, a call queued behind it. Each is
/// cancelled (its tool told, as for any cancel), none reaches the tool
/// after `/close_thread`, and nothing stays active: the subscription is
/// not left active for good, nor is either call sent after the close.
#[tokio::test(flavor = "multi_thread")]
async fn closing_a_thread_ends_what_is_open_in_it() {
    let tool = TestTool::start("S", &["op"]).await;
    tool.plan(&[ferry_tests::Ack::Ok, ferry_tests::Ack::RetryAfter(503, 2)]);
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    let sub = dispatched(&api, &tool, "g", "sub").await;
    let on = json!({"type": "tool_result", "group_id": "g", "id": "sub", "text": "on", "subscription": true});
    assert_eq!(api.post(&sub.callback_url, &on).await.0, 200);
    for id in ["waiting", "queued"] {
        let body = json!({"operation": "op", "arguments": {}, "group_id": "g", "id": id});
        assert_eq!(api.submit(body).await.0, 202);
    }
    // The first attempt of `waiting` was answered 503, Retry-After: 2.
    assert_eq!(tool.next_invocation().await.invocation.id, "waiting");

    let (status, closed) = api.post("/v1/threads/g/close", &json!({})).await;
    assert_eq!(status, 200, "{closed}");
    let events = api.events("g", 0).await;
    let ended: Vec<(&str, &str)> = events[events.len() - 4..]
        .iter()
        .map(|e| (e["type"].as_str().unwrap(), e["id"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        ended,
        [
            ("subscription_cancelled", "sub"),
            ("call_cancelled", "waiting"),
            ("call_cancelled", "queued"),
            ("thread_closed", "")
        ]
    );
    let (_, thread) = api.thread("g").await;
    assert_eq!(thread["active_subscriptions"], json!([]), "{thread}");
    for id in ["sub", "waiting", "queued"] {
        assert_eq!(api.call("g", id).await.1["status"], "cancelled", "{id}");
    }
    // rap-3: `/cancel_tool_call` "when a call or subscription is
    // cancelled", and `/close_thread` when the thread is closed.
    let mut notices = Vec::new();
    for _ in 0..4 {
        let (kind, body) = tool.next_notice().await;
        notices.push(format!(
            "{kind} {}",
            body["tool_call_id"].as_str().unwrap_or("")
        ));
    }
    notices.sort();
    assert_eq!(
        notices,
        [
            "cancel_tool_call queued",
            "cancel_tool_call sub",
            "cancel_tool_call waiting",
            "close_thread "
        ]
    );
    // Past the Retry-After, the dispatcher asks whether `waiting` is still
    // wanted (once a second) and drops it; neither call reaches the tool.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let ids: Vec<String> = tool.invocations().into_iter().map(|i| i.id).collect();
    assert_eq!(ids, ["sub", "waiting"], "sent after the thread was closed");
    // An event of the cancelled subscription is gone.
    let tick =
        json!({"type": "subscription_event", "group_id": "g", "tool_call_id": "sub", "text": "t"});
    assert_eq!(api.post(&sub.callback_url, &tick).await.0, 410);
}

/// The next `n` notices `tool` receives, as (path, thread, call), sorted:
/// notices sent at once may arrive in any order.
async fn notices(tool: &TestTool, n: usize) -> Vec<(String, String, String)> {
    let mut got = Vec::new();
    for _ in 0..n {
        let (kind, body) = tool.next_notice().await;
        let field = |name: &str| body[name].as_str().unwrap_or_default().to_owned();
        got.push((kind, field("thread_id"), field("tool_call_id")));
    }
    got.sort();
    got
}

fn notice(kind: &str, thread: &str, call: &str) -> (String, String, String) {
    (kind.into(), thread.into(), call.into())
}

async fn close(api: &Api, group_id: &str) {
    let (status, closed) = api
        .post(&format!("/v1/threads/{group_id}/close"), &json!({}))
        .await;
    assert_eq!(status, 200, "{closed}");
}

/// rap-3 sends notices to every tool server: `/cancel_tool_call` is "sent
/// concurrently to every configured tool server when a call or
/// subscription is cancelled", and `/close_thread` goes "to every
/// configured tool server when a thread is closed". Ferry sends a cancel
/// only to the call's own tool server, and a close only to the servers that
/// had calls in the thread: any other would learn thread and call ids it
/// never saw (of other agents' conversations, for a tool that may be
/// anyone's), and has nothing of them to stop or free.
///
/// Each server's next notices are awaited in turn: one leaked to it would
/// have come before those of the thread after, and be among them.
#[tokio::test(flavor = "multi_thread")]
async fn notices_go_only_to_the_tool_servers_of_the_call_and_the_thread() {
    let a = TestTool::start("A", &["op_a"]).await;
    let b = TestTool::start("B", &["op_b"]).await;
    let ferry = Ferry::start(FerryOptions {
        tool_servers: vec![a.url.clone(), b.url.clone()],
        ..FerryOptions::default()
    })
    .await;
    let api = ferry.api();

    // A call of A's, cancelled, in a thread then closed: A is told both.
    dispatched_as(&api, &a, "op_a", "g", "c").await;
    let (status, call) = api.delete("/v1/threads/g/calls/c").await;
    assert_eq!((status, call["status"].as_str()), (200, Some("cancelled")));
    close(&api, "g").await;
    assert_eq!(
        notices(&a, 2).await,
        [
            notice("cancel_tool_call", "g", "c"),
            notice("close_thread", "g", "")
        ]
    );

    // B's first notices are of its own call's thread, not of `g`.
    dispatched_as(&api, &b, "op_b", "h", "d").await;
    close(&api, "h").await;
    assert_eq!(
        notices(&b, 2).await,
        [
            notice("cancel_tool_call", "h", "d"),
            notice("close_thread", "h", "")
        ]
    );

    // A thread with a call on each: each server is told of its own call,
    // and both of the close; A's next notices are these, not `h`'s.
    dispatched_as(&api, &a, "op_a", "k", "e").await;
    dispatched_as(&api, &b, "op_b", "k", "f").await;
    close(&api, "k").await;
    assert_eq!(
        notices(&a, 2).await,
        [
            notice("cancel_tool_call", "k", "e"),
            notice("close_thread", "k", "")
        ]
    );
    assert_eq!(
        notices(&b, 2).await,
        [
            notice("cancel_tool_call", "k", "f"),
            notice("close_thread", "k", "")
        ]
    );
}

/// The value of the first sample of `metric` whose line contains `label`.
fn sample(metrics: &str, metric: &str, label: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with([' ', '{']))
        .find(|l| l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn health_metrics_and_unknown_routes() {
    let (tool, ferry) = setup().await;
    let api = ferry.api();
    let (status, health) = api.get("/healthz").await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["status"], "ok");

    completed(&api, &tool, "g", "c1").await;
    let metrics = metrics(&api).await;
    let accepted = sample(&metrics, "ferry_calls_accepted_total", "");
    assert_eq!(accepted, Some(1.0), "{metrics}");
    let callbacks = sample(&metrics, "ferry_callbacks_total", "tool_result");
    assert!(callbacks.is_some_and(|n| n >= 1.0), "{metrics}");
    // Refused callbacks are counted too: a forged token (its body never
    // read) as `unknown`, a refused body by the type it names.
    let (status, _) = api.post("/v1/callbacks/forged", &json!({})).await;
    assert_eq!(status, 403);
    let invocation = dispatched(&api, &tool, "g", "c2").await;
    let wrong_thread = json!({"type": "tool_result", "group_id": "other", "id": "c2", "text": "x"});
    assert_eq!(
        api.post(&invocation.callback_url, &wrong_thread).await.0,
        403
    );
    // One refused for its size (over the default 1 MiB) never reaches the
    // engine, and is counted by the type it names all the same.
    let oversized = json!({"type": "oauth", "group_id": "g", "id": "c2",
                           "auth_url": format!("https://auth.example/{}", "x".repeat(2 << 20))});
    assert_eq!(api.post(&invocation.callback_url, &oversized).await.0, 413);
    let metrics = self::metrics(&api).await;
    let rejected = |kind: &str| {
        let label = format!("type=\"{kind}\",outcome=\"rejected\"");
        sample(&metrics, "ferry_callbacks_total", &label)
    };
    assert_eq!(rejected("unknown"), Some(1.0), "{metrics}");
    assert_eq!(rejected("tool_result"), Some(1.0), "{metrics}");
    assert_eq!(rejected("oauth"), Some(1.0), "{metrics}");
    // "a histogram of dispatch latency" (issue 2): buckets, not quantiles.
    let latency = "ferry_dispatch_latency_seconds";
    assert!(
        metrics.contains(&format!("# TYPE {latency} histogram")),
        "{metrics}"
    );
    let all = sample(&metrics, &format!("{latency}_bucket"), "le=\"+Inf\"");
    assert_eq!(all, Some(2.0), "two dispatches: {metrics}");

    refused(&api.get("/v1/nowhere").await, 404, "not_found");
    refused(&api.get("/v1/threads/g/nowhere").await, 404, "not_found");
    refused(
        &api.post("/healthz", &json!({})).await,
        405,
        "method_not_allowed",
    );
}

/// The `/metrics` page (which must answer 200).
async fn metrics(api: &Api) -> String {
    let response = api
        .client
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

/// `ferry_active_subscriptions` now, from `/metrics`.
async fn active_subscriptions(api: &Api) -> Option<f64> {
    sample(&metrics(api).await, "ferry_active_subscriptions", "")
}

/// The gauge goes down however a subscription ends: a cancel of the
/// subscription, of its call, or the built-in `cancel_subscription` tool.
#[tokio::test(flavor = "multi_thread")]
async fn the_active_subscriptions_gauge_follows_every_way_one_ends() {
    let (tool, ferry) = setup().await;
    let api = ferry.api();
    for id in ["s1", "s2", "s3"] {
        let invocation = dispatched(&api, &tool, "g", id).await;
        let opened = json!({"type": "tool_result", "group_id": "g", "id": id,
                            "text": "on", "subscription": true});
        assert_eq!(api.post(&invocation.callback_url, &opened).await.0, 200);
    }
    assert_eq!(active_subscriptions(&api).await, Some(3.0));
    assert_eq!(api.delete("/v1/threads/g/subscriptions/s1").await.0, 200);
    assert_eq!(api.delete("/v1/threads/g/calls/s2").await.0, 200);
    let cancel = json!({"operation": "cancel_subscription", "arguments": {"tool_call_id": "s3"},
                        "group_id": "g", "id": "x"});
    assert_eq!(api.submit(cancel).await.0, 202);
    assert_eq!(api.thread("g").await.1["active_subscriptions"], json!([]));
    assert_eq!(active_subscriptions(&api).await, Some(0.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn thread_metadata_reports_progress_and_ancestors() {
    let (tool, ferry) = setup().await;
    let api = ferry.api();
    refused(&api.thread("g").await, 404, "not_found");

    let (status, reply) = api
        .submit(
            json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c1",
                       "thread_ancestors": ["root", "parent"]}),
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    let first = tool.next_invocation().await.invocation;
    api.wait_for("g", "c1", "call_dispatched").await;
    send_result(&api, &first, "done").await;
    // A later call's ancestors do not replace the first call's.
    let (status, reply) = api
        .submit(
            json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c2",
                       "thread_ancestors": ["elsewhere"]}),
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    tool.next_invocation().await;
    api.wait_for("g", "c2", "call_dispatched").await;

    let (status, thread) = api.thread("g").await;
    assert_eq!(status, 200, "{thread}");
    assert_eq!(thread["group_id"], "g");
    assert_eq!(thread["ancestors"], json!(["root", "parent"]));
    assert_eq!(thread["closed"], false);
    assert_eq!(thread["last_seq"], 5);
    assert_eq!(thread["counts"], json!({"completed": 1, "dispatched": 1}));
    assert_eq!(thread["calls"], 2);
    assert_eq!(thread["active_subscriptions"], json!([]));
    assert!(
        thread["created_at"].is_string() && thread["updated_at"].is_string(),
        "{thread}"
    );

    refused(&api.thread("unknown").await, 404, "not_found");
}

/// `--drain-ms` bounds how long a stopping `ferry serve` waits for the
/// requests still running: here a toolset registration whose tool server
/// accepted the connection and never answers. Ferry cuts it off after the
/// drain it was given, says so in its log, and exits 0.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_still_running_is_cut_off_after_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ferry.log");
    let mut ferry = Ferry::start(FerryOptions {
        args: vec!["--drain-ms".into(), "300".into()],
        log: Some(log.clone()),
        ..FerryOptions::default()
    })
    .await;
    // A tool server that takes connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let registering = reqwest::Client::new()
        .post(format!("{}/v1/toolsets", ferry.url))
        .json(&json!({ "url": url }))
        .send();
    let registering = tokio::spawn(registering);
    // Ferry is fetching the manifest: its request is under way.
    let (_held, _) = silent.accept().await.unwrap();

    let exited = ferry.terminate(Duration::from_secs(60)).await;
    let status = exited.expect("ferry still runs a minute after SIGTERM");
    assert!(status.success(), "{status}");
    let text = String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
    let cut = text
        .lines()
        .find(|l| l.contains("requests still open after the drain"))
        .unwrap_or_else(|| panic!("no line says the drain ended:\n{text}"));
    assert!(cut.contains("drain=300ms"), "{cut}");
    // The registering client saw its connection end, with no answer.
    let answer = registering.await.unwrap();
    assert!(
        answer.is_err(),
        "a request cut off was answered: {answer:?}"
    );
}

/// A dispatch attempt under way when `ferry serve` stops runs to its end:
/// the tool's 200, arriving during the drain, is recorded before Ferry
/// exits, so after the restart the call is `dispatched` and not sent again.
/// (Ended at once, the attempt's 200 would be lost and the call
/// dispatched again after the restart, to a tool that now hangs.)
#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_under_way_at_sigterm_is_recorded_before_ferry_exits() {
    let (tool, mut ferry) = setup().await;
    tool.plan(&[Ack::Held, Ack::Hang]);
    let api = ferry.api();
    let mut stream = SseReader::open(&api, "/v1/threads/g/stream", None).await;
    let (status, reply) = api
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    assert_eq!(status, 202, "{reply}");
    tool.next_invocation().await;
    assert_sse(&stream.next().await, 1, "call_accepted");

    ferry.sigterm();
    // The stream ending says Ferry is stopping; its attempt still waits.
    stream.expect_end().await;
    assert!(ferry.is_running(), "ferry left its dispatch");
    tool.release();
    let status = ferry.exited(Duration::from_secs(60)).await;
    let status = status.expect("ferry still runs a minute after SIGTERM");
    assert!(status.success(), "{status}");

    ferry.restart().await;
    let (status, call) = ferry.api().call("g", "c").await;
    assert_eq!(status, 200, "{call}");
    assert_eq!(call["status"], "dispatched", "{call}");
    assert_eq!(call["attempts"], 1, "{call}");
    assert_eq!(tool.invocations().len(), 1, "the call was sent again");
}

/// SIGTERM stops `ferry serve` while agents follow its threads: the native
/// and the ACP streams end cleanly (an agent reconnects with its
/// `Last-Event-ID`) instead of holding the graceful shutdown open, Ferry
/// exits 0, and a call still out at the stop completes after the restart.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_open_streams_and_ferry_exits() {
    let (tool, mut ferry) = setup().await;
    let api = ferry.api();
    let mut native = SseReader::open(&api, "/v1/threads/g/stream", None).await;
    let mut acp = SseReader::open(&api, "/v1/threads/g/acp", None).await;
    let invocation = dispatched(&api, &tool, "g", "c1").await;
    assert_sse(&native.next().await, 1, "call_accepted");
    assert_sse(&native.next().await, 2, "call_dispatched");
    for seq in ["1", "2"] {
        assert_eq!(acp.next().await.id.as_deref(), Some(seq));
    }

    let exited = ferry.terminate(Duration::from_secs(60)).await;
    let status = exited.expect("ferry still runs a minute after SIGTERM");
    assert!(status.success(), "{status}");
    // Ended, not broken off (as they would be by the process exiting).
    native.expect_end().await;
    acp.expect_end().await;

    ferry.restart().await;
    let api = ferry.api();
    let mut resumed = SseReader::open(&api, "/v1/threads/g/stream", Some("2")).await;
    send_result(&api, &invocation, "after the stop").await;
    assert_sse(&resumed.next().await, 3, "tool_result");
}
