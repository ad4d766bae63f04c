//! User interaction: answering a tool's `user_choice` through Ferry (the
//! answer is durable, then delivered to the tool's `response_url`), and the
//! `display` rendering rule of rap-2.

use ferry_tests::{Ack, Ferry, TestTool};
use serde_json::{json, Value};

async fn setup() -> (Ferry, TestTool, String) {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    let url = tool.next_invocation().await.invocation.callback_url;
    (ferry, tool, url)
}

fn prompt(tool: &TestTool) -> Value {
    json!({"type": "user_choice", "group_id": "g", "id": "c", "prompt": "Which region?",
           "choices": ["eu-west", "us-east"], "default": 0, "response_url": format!("{}/choice", tool.url)})
}

#[tokio::test]
async fn an_answer_is_recorded_then_delivered_to_the_tool() {
    let (ferry, tool, url) = setup().await;
    let api = ferry.api();
    assert_eq!(api.post(&url, &prompt(&tool)).await.0, 200);
    let (_, call) = api.call("g", "c").await;
    assert_eq!(call["status"], "awaiting_user");
    assert_eq!(call["choice"]["choices"], json!(["eu-west", "us-east"]));

    let (status, call) = api
        .post(
            "/v1/threads/g/calls/c/choice",
            &json!({"choice": "us-east"}),
        )
        .await;
    assert_eq!(status, 200, "{call}");
    assert_eq!(call["status"], "dispatched");
    // rap-3: the runtime POSTs {"id": <call id>, "selected": <index>}.
    let (kind, body) = tool.next_notice().await;
    assert_eq!(
        (kind.as_str(), body),
        ("choice", json!({"id": "c", "selected": 1}))
    );
    let made = api.wait_for("g", "c", "choice_made").await;
    assert_eq!(made["payload"], json!({"index": 1, "choice": "us-east"}));
    api.wait_for("g", "c", "choice_delivered").await;
    // Answering again: the call no longer waits for a choice.
    let (status, body) = api
        .post("/v1/threads/g/calls/c/choice", &json!({"index": 0}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_awaiting_choice"))
    );
    // The tool asks again (a new prompt): it is recorded, not swallowed.
    assert_eq!(api.post(&url, &prompt(&tool)).await.1["status"], "applied");
    assert_eq!(api.call("g", "c").await.1["status"], "awaiting_user");
}

/// rap-3: the runtime POSTs `{"id", "selected"}` to `response_url` ("the
/// `default` index if the user dismisses"). Before, nothing could dismiss
/// a prompt, and the `default` was never sent.
#[tokio::test]
async fn a_dismissed_prompt_sends_the_tool_its_default() {
    let (ferry, tool, url) = setup().await;
    let api = ferry.api();
    let mut asked = prompt(&tool);
    asked["default"] = json!(1);
    assert_eq!(api.post(&url, &asked).await.0, 200);
    let (status, call) = api
        .post("/v1/threads/g/calls/c/choice", &json!({"dismiss": true}))
        .await;
    assert_eq!(status, 200, "{call}");
    let (kind, body) = tool.next_notice().await;
    assert_eq!(
        (kind.as_str(), body),
        ("choice", json!({"id": "c", "selected": 1}))
    );
    let made = api.wait_for("g", "c", "choice_made").await;
    assert_eq!(
        made["payload"],
        json!({"index": 1, "choice": "us-east", "dismissed": true})
    );
    api.wait_for("g", "c", "choice_delivered").await;
}

#[tokio::test]
async fn bad_answers_are_refused_and_change_nothing() {
    let (ferry, tool, url) = setup().await;
    let api = ferry.api();
    // No prompt yet: nothing to answer.
    let (status, body) = api
        .post("/v1/threads/g/calls/c/choice", &json!({"index": 0}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_awaiting_choice"))
    );
    api.post(&url, &prompt(&tool)).await;
    let before = api.events("g", 0).await.len();
    let cases = [
        (json!({"index": 2}), 422, "invalid_choice"),
        (json!({"index": -1}), 422, "invalid_choice"),
        // Out of range however large, up to 2^63 and beyond.
        (
            json!({"index": 9_223_372_036_854_775_808_u64}),
            422,
            "invalid_choice",
        ),
        (
            json!({"index": -9_223_372_036_854_775_807_i64}),
            422,
            "invalid_choice",
        ),
        (json!({"index": 1e30}), 422, "invalid_choice"),
        (json!({"index": 2.0}), 422, "invalid_choice"),
        (json!({"index": 0.5}), 400, "invalid_request"),
        (json!({"index": "0"}), 400, "invalid_request"),
        (json!({"choice": "mars"}), 422, "invalid_choice"),
        (
            json!({"index": 0, "choice": "eu-west"}),
            400,
            "invalid_request",
        ),
        (json!({}), 400, "invalid_request"),
        (json!({"dismiss": false}), 400, "invalid_request"),
        (json!({"dismiss": true, "index": 0}), 400, "invalid_request"),
        (json!({"dismiss": "yes"}), 400, "invalid_request"),
    ];
    for (body, status, code) in cases {
        let (got, reply) = api.post("/v1/threads/g/calls/c/choice", &body).await;
        assert_eq!(
            (got, reply["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}"
        );
    }
    let (status, _) = api
        .post("/v1/threads/g/calls/ghost/choice", &json!({"index": 0}))
        .await;
    assert_eq!(status, 404);
    assert_eq!(api.events("g", 0).await.len(), before);
    assert_eq!(api.call("g", "c").await.1["status"], "awaiting_user");
    // `1.0` is the integer 1, as JSON Schema counts it.
    let (status, call) = api
        .post("/v1/threads/g/calls/c/choice", &json!({"index": 1.0}))
        .await;
    assert_eq!(status, 200, "{call}");
    let made = api.wait_for("g", "c", "choice_made").await;
    assert_eq!(made["payload"]["index"], 1, "{made}");
}

#[tokio::test]
async fn display_renders_the_first_supported_segment_or_the_text() {
    let (ferry, _tool, url) = setup().await;
    let api = ferry.api();
    let (status, call) = api.get("/v1/threads/g/calls/c?display=text").await;
    assert_eq!(
        (status, &call["display"]),
        (200, &Value::Null),
        "no result yet"
    );
    api.post(&url, &json!({"type": "tool_result", "group_id": "g", "id": "c", "text": "Replaced text in a.rs",
        "display_as": [{"type": "diff", "content": {"path": "a.rs", "patch": "+x"}}, {"type": "text", "content": "edit a.rs"}]}))
        .await;
    let show = |types: &'static str| {
        let api = api.clone();
        async move {
            api.get(&format!("/v1/threads/g/calls/c?display={types}"))
                .await
                .1["display"]
                .clone()
        }
    };
    assert_eq!(show("diff,text").await["type"], "diff");
    assert_eq!(
        show("text").await,
        json!({"type": "text", "content": "edit a.rs"})
    );
    assert_eq!(
        show("image").await,
        json!({"type": "text", "content": "Replaced text in a.rs"})
    );
    assert!(api
        .get("/v1/threads/g/calls/c")
        .await
        .1
        .get("display")
        .is_none());
}

#[tokio::test]
async fn malformed_paths_and_redirecting_tools_are_handled() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::Status(302)]);
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    // Invalid UTF-8 in a path segment: the API's error shape, not text.
    let (status, body) = api.get("/v1/threads/%FF/events").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    let (status, body) = api.get(&format!("/v1/threads/{}", "g".repeat(600))).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    // A 3xx is not an acknowledgement (and is not followed).
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    let result = api.wait_for("g", "c", "tool_result").await;
    assert_eq!(
        result["payload"]["text"],
        "Error: the tool refused the call (HTTP 302)"
    );
}

#[tokio::test]
async fn the_demo_gates_drop_table_and_asks_pick_region() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    // drop_table is annotated destructive: gated until a reviewer allows it.
    let (_, reply) = api
        .submit(json!({"operation": "drop_table", "arguments": {"table": "users"}, "group_id": "g", "id": "d"}))
        .await;
    assert_eq!(reply["status"], "pending_approval");
    let (status, _) = api
        .post(
            "/v1/approvals/g/d",
            &json!({"optionId": "allow_once", "reviewer": "ana"}),
        )
        .await;
    assert_eq!(status, 200);
    let result = api.wait_for("g", "d", "tool_result").await;
    assert!(result["payload"]["text"]
        .as_str()
        .unwrap()
        .starts_with("Dropped table users"));
    // pick_region asks the user, who answers through Ferry.
    api.submit(json!({"operation": "pick_region", "arguments": {}, "group_id": "g", "id": "p"}))
        .await;
    let asked = api.wait_for("g", "p", "user_choice").await;
    assert_eq!(
        asked["payload"]["choices"],
        json!(["eu-west", "us-east", "ap-south"])
    );
    let (status, _) = api
        .post(
            "/v1/threads/g/calls/p/choice",
            &json!({"choice": "ap-south"}),
        )
        .await;
    assert_eq!(status, 200);
    let result = api.wait_for("g", "p", "tool_result").await;
    assert_eq!(result["payload"]["text"], "region: ap-south");
    // The demo sends its result before it answers the POST of the choice:
    // the result settles the answer (`choice_delivered` may not follow).
    assert_eq!(api.call("g", "p").await.1["status"], "completed");
}

/// A `response_url` that answers `statuses` in turn, then 200; returns its
/// URL and how many answers it has sent.
async fn response_url(
    statuses: Vec<u16>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    response_url_holding_the_first(statuses, None).await
}

/// [`response_url`], whose first answer waits for `hold` to be notified
/// when there is one (it counts the request as it arrives).
async fn response_url_holding_the_first(
    statuses: Vec<u16>,
    hold: Option<std::sync::Arc<tokio::sync::Notify>>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let app = axum::Router::new().route(
        "/choice",
        axum::routing::post(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let status = statuses.get(n).copied().unwrap_or(200);
            let hold = hold.clone().filter(|_| n == 0);
            async move {
                if let Some(hold) = hold {
                    hold.notified().await;
                }
                axum::http::StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/choice", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

/// Answers the call's choice through Ferry, after the tool asked with
/// `response_url`.
async fn answer(ferry: &Ferry, url: &str, response_url: &str) {
    let api = ferry.api();
    let ask = json!({"type": "user_choice", "group_id": "g", "id": "c", "prompt": "Which region?",
                     "choices": ["eu-west", "us-east"], "default": 0, "response_url": response_url});
    assert_eq!(api.post(url, &ask).await.0, 200);
    let (status, call) = api
        .post("/v1/threads/g/calls/c/choice", &json!({"index": 1}))
        .await;
    assert_eq!(status, 200, "{call}");
}

#[tokio::test]
async fn an_answer_reaches_a_tool_that_was_down_for_a_while() {
    let (ferry, _tool, url) = setup().await;
    // Five failures: as many as a delivery used to try before it waited
    // for Ferry's next start.
    let (response, seen) = response_url(vec![503; 5]).await;
    answer(&ferry, &url, &response).await;
    ferry.api().wait_for("g", "c", "choice_delivered").await;
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 6);
}

#[tokio::test]
async fn an_answer_the_tool_refuses_is_recorded_and_not_sent_again() {
    let (ferry, _tool, url) = setup().await;
    let (response, seen) = response_url(vec![410]).await;
    answer(&ferry, &url, &response).await;
    let api = ferry.api();
    let refused = api.wait_for("g", "c", "choice_refused").await;
    assert_eq!(refused["payload"], json!({"status": 410}));
    assert_eq!(api.count("g", "c", "choice_delivered").await, 0);
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The call still waits for its result.
    let (_, call) = api.call("g", "c").await;
    assert_eq!(call["status"], "dispatched");
}

/// A newer answer is delivered even while an older one, to a prompt the
/// tool replaced, is still being retried.
#[tokio::test]
async fn a_newer_answer_is_delivered_while_an_older_one_is_retried() {
    let (ferry, _tool, url) = setup().await;
    let (stale, _) = response_url(vec![503; 1000]).await;
    answer(&ferry, &url, &stale).await;
    // The tool asks again, elsewhere; the user answers that.
    let (fresh, seen) = response_url(vec![]).await;
    answer(&ferry, &url, &fresh).await;
    let api = ferry.api();
    api.wait_for("g", "c", "choice_delivered").await;
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(api.count("g", "c", "choice_made").await, 2);
}

/// A newer answer does not wait out an older one's backoff: the older
/// delivery, pausing between retries, is woken and ends. Seven failed
/// sends put the older one in a 6.4 s pause (0.1 s doubling); the newer
/// answer is delivered within 3 s of being made, rather than waiting for
/// the pause to end (up to a minute, the backoff's cap; 11.4 s in a run).
#[tokio::test]
async fn a_newer_answer_does_not_wait_out_an_older_ones_backoff() {
    let (ferry, _tool, url) = setup().await;
    let (stale, tried) = response_url(vec![503; 1000]).await;
    answer(&ferry, &url, &stale).await;
    sent(&tried, 7).await;
    let (fresh, seen) = response_url(vec![]).await;
    answer(&ferry, &url, &fresh).await;
    let api = ferry.api();
    let delivered = tokio::time::timeout(
        std::time::Duration::from_secs(3),
        api.wait_for("g", "c", "choice_delivered"),
    )
    .await;
    assert!(
        delivered.is_ok(),
        "the newer answer waited for the older one's pause"
    );
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// Waits until the `response_url` was sent `n` answers.
async fn sent(seen: &std::sync::atomic::AtomicUsize, n: usize) {
    let wait = std::time::Duration::from_secs(20);
    ferry_tests::eventually("the answer to reach the response_url", wait, || async {
        (seen.load(std::sync::atomic::Ordering::SeqCst) >= n).then_some(())
    })
    .await;
}

/// rap-3: a runtime "MUST NOT cache or replay choice responses". An answer
/// still owed when the tool asks again, or when it sends its result, is
/// not sent after that (else it is delivered as the new prompt's answer,
/// and retried forever after the call completed). Past the first
/// retry delay (0.1 s, then 0.2 s), nothing more reaches the tool.
#[tokio::test]
async fn an_answer_still_owed_is_not_sent_once_the_tool_moved_on() {
    for moved_on in ["asked again", "sent its result"] {
        let (ferry, _tool, url) = setup().await;
        let api = ferry.api();
        // The 503 is held until the tool has moved on: Ferry tries again
        // 100 ms after it, sooner than a slow machine posts the callback.
        let hold = std::sync::Arc::new(tokio::sync::Notify::new());
        let (response, seen) = response_url_holding_the_first(vec![503], Some(hold.clone())).await;
        answer(&ferry, &url, &response).await;
        sent(&seen, 1).await;
        let next = match moved_on {
            "asked again" => json!({"type": "user_choice", "group_id": "g", "id": "c",
                "prompt": "Delete the old bucket?", "choices": ["no", "yes"], "default": 0,
                "response_url": response}),
            _ => json!({"type": "tool_result", "group_id": "g", "id": "c", "text": "went on"}),
        };
        assert_eq!(
            api.post(&url, &next).await.1["status"],
            "applied",
            "{moved_on}"
        );
        hold.notify_one();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert_eq!(
            seen.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "{moved_on}"
        );
        assert_eq!(
            api.count("g", "c", "choice_delivered").await,
            0,
            "{moved_on}"
        );
        let (_, thread) = api.thread("g").await;
        let owed = moved_on == "asked again";
        assert_eq!(
            thread["counts"]["awaiting_user"] == 1,
            owed,
            "{moved_on}: {thread}"
        );
    }
}

/// A 429 from the `response_url` asks to try later, like a 5xx: the
/// answer is sent again, not recorded as refused (which would lose it,
/// and leave the call with no way to be answered).
#[tokio::test]
async fn a_429_from_the_response_url_is_tried_again() {
    let (ferry, _tool, url) = setup().await;
    let (response, seen) = response_url(vec![429]).await;
    answer(&ferry, &url, &response).await;
    let api = ferry.api();
    api.wait_for("g", "c", "choice_delivered").await;
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(api.count("g", "c", "choice_refused").await, 0);
}
