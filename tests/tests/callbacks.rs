//! Tools' callbacks (`POST /v1/callbacks/{token}`): the five types, dedupe,
//! forged and unmatched callbacks, subscriptions and their cancellation.

use ferry_engine::token::Capabilities;
use ferry_tests::{Api, Ferry, TestTool, TEST_SECRET};
use futures::future::join_all;
use serde_json::{json, Value};

struct Setup {
    ferry: Ferry,
    tool: TestTool,
}

impl Setup {
    async fn new() -> Setup {
        let tool = TestTool::start("t", &["op"]).await;
        let ferry = Ferry::with_tool(&tool).await;
        Setup { ferry, tool }
    }

    fn api(&self) -> Api {
        self.ferry.api()
    }

    /// Submits call `id` in `g` and returns the callback URL the tool got.
    async fn dispatched(&self, g: &str, id: &str) -> String {
        let (status, body) = self
            .api()
            .submit(json!({"operation": "op", "arguments": {}, "group_id": g, "id": id}))
            .await;
        assert_eq!(status, 202, "{body}");
        let sent = self.tool.next_invocation().await.invocation;
        assert_eq!((sent.group_id.as_str(), sent.id.as_str()), (g, id));
        sent.callback_url
    }
}

fn result(g: &str, id: &str, text: &str) -> Value {
    json!({"type": "tool_result", "group_id": g, "id": id, "text": text})
}

/// A `user_choice` for call `a` of `g` whose answer goes to `response_url`.
fn choice_to(response_url: &str) -> Value {
    json!({"type": "user_choice", "group_id": "g", "id": "a", "prompt": "?",
           "choices": ["x"], "default": 0, "response_url": response_url})
}

fn event(g: &str, id: &str, text: &str, last: bool) -> Value {
    json!({"type": "subscription_event", "group_id": g, "tool_call_id": id, "text": text, "final": last})
}

#[tokio::test]
async fn ten_identical_results_posted_at_once_make_one_event() {
    let s = Setup::new().await;
    let url = s.dispatched("g", "c").await;
    let api = s.api();
    let body = result("g", "c", "done");
    let posts = (0..10).map(|_| api.post(&url, &body));
    let mut applied = 0;
    for (status, body) in join_all(posts).await {
        assert_eq!(status, 200, "{body}");
        match body["status"].as_str() {
            Some("applied") => applied += 1,
            Some("duplicate") => {}
            other => panic!("{other:?}: {body}"),
        }
    }
    assert_eq!(applied, 1);
    assert_eq!(api.count("g", "c", "tool_result").await, 1);
    // A later, different result for the finished call has no effect either.
    let (status, body) = api.post(&url, &result("g", "c", "changed my mind")).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("duplicate")));
    let (_, call) = api.call("g", "c").await;
    assert_eq!(call["result"]["text"], "done");
    assert_eq!(api.count("g", "c", "tool_result").await, 1);
}

#[tokio::test]
async fn forged_mismatched_and_unknown_callbacks_record_nothing() {
    let s = Setup::new().await;
    let api = s.api();
    let url_a = s.dispatched("g", "a").await;
    s.dispatched("g", "b").await;
    api.wait_for("g", "b", "call_dispatched").await;
    let before = api.events("g", 0).await.len();
    let (prefix, token) = url_a.rsplit_once('/').unwrap();
    let (payload, mac) = token.split_once('.').unwrap();
    let flipped = format!(
        "{payload}.{}{}",
        if mac.starts_with('A') { "B" } else { "A" },
        &mac[1..]
    );
    let minted = Capabilities::new(TEST_SECRET.as_bytes());
    let cases = [
        (
            "flipped MAC",
            format!("{prefix}/{flipped}"),
            result("g", "a", "x"),
            403,
            "forbidden",
        ),
        (
            "garbage token",
            format!("{prefix}/garbage"),
            result("g", "a", "x"),
            403,
            "forbidden",
        ),
        (
            "token that is not UTF-8",
            format!("{prefix}/%FF%FE"),
            result("g", "a", "x"),
            403,
            "forbidden",
        ),
        (
            "other secret",
            format!(
                "{prefix}/{}",
                Capabilities::new(b"another-secret-entirely").mint("g", "a")
            ),
            result("g", "a", "x"),
            403,
            "forbidden",
        ),
        (
            "body names another call",
            url_a.clone(),
            result("g", "b", "x"),
            403,
            "forbidden",
        ),
        (
            "body names another thread",
            url_a.clone(),
            result("h", "a", "x"),
            403,
            "forbidden",
        ),
        (
            "unknown call",
            format!("{prefix}/{}", minted.mint("g", "ghost")),
            result("g", "ghost", "x"),
            404,
            "unknown_call",
        ),
        (
            "unknown thread",
            format!("{prefix}/{}", minted.mint("nowhere", "c")),
            result("nowhere", "c", "x"),
            404,
            "unknown_call",
        ),
        (
            "view_update for unknown call",
            format!("{prefix}/{}", minted.mint("g", "ghost")),
            json!({"type": "view_update", "group_id": "g", "view_type": "diff", "content": {}}),
            404,
            "unknown_call",
        ),
        (
            "malformed JSON",
            url_a.clone(),
            json!("{not json"),
            400,
            "invalid_callback",
        ),
        (
            "unknown type",
            url_a.clone(),
            json!({"type": "tool_resultz", "group_id": "g", "id": "a", "text": "x"}),
            400,
            "invalid_callback",
        ),
        (
            "missing text and content",
            url_a.clone(),
            json!({"type": "tool_result", "group_id": "g", "id": "a"}),
            400,
            "invalid_callback",
        ),
        (
            "missing group_id",
            url_a.clone(),
            json!({"type": "tool_result", "id": "a", "text": "x"}),
            400,
            "invalid_callback",
        ),
        (
            "user_choice with a response_url no answer could reach",
            url_a.clone(),
            choice_to("ftp://tool/answer"),
            400,
            "invalid_callback",
        ),
        (
            "user_choice with a response_url that is no URL",
            url_a.clone(),
            choice_to("answer here"),
            400,
            "invalid_callback",
        ),
        (
            "oauth with a script for its link",
            url_a.clone(),
            json!({"type": "oauth", "group_id": "g", "id": "a", "auth_url": "javascript:alert(1)"}),
            400,
            "invalid_callback",
        ),
        (
            "tool_result with no content items and no text",
            url_a.clone(),
            json!({"type": "tool_result", "group_id": "g", "id": "a", "content": []}),
            400,
            "invalid_callback",
        ),
        (
            "a diff display segment that is not {path, patch}",
            url_a.clone(),
            json!({"type": "tool_result", "group_id": "g", "id": "a", "text": "t",
                   "display_as": [{"type": "diff", "content": "not an object"}]}),
            400,
            "invalid_callback",
        ),
    ];
    for (what, url, body, status, code) in cases {
        let raw = match &body {
            Value::String(s) => s.clone().into_bytes(),
            other => other.to_string().into_bytes(),
        };
        let (got, reply) = api.post_raw(&url, raw).await;
        assert_eq!(got, status, "{what}: {reply}");
        assert_eq!(reply["error"]["code"], code, "{what}");
    }
    let (_, reply) = api
        .post(
            &url_a,
            &json!({"type": "tool_resultz", "group_id": "g", "id": "a", "text": "x"}),
        )
        .await;
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown callback type"));
    assert_eq!(
        api.events("g", 0).await.len(),
        before,
        "a refused callback recorded something"
    );
    assert_eq!(api.thread("nowhere").await.0, 404);
    for id in ["a", "b"] {
        assert_eq!(api.call("g", id).await.1["status"], "dispatched");
    }
}

#[tokio::test]
async fn a_subscription_event_that_overtakes_its_result_is_kept() {
    let s = Setup::new().await;
    let api = s.api();
    let url = s.dispatched("g", "sub").await;
    let (status, _) = api
        .post(&url, &event("g", "sub", "early bird", false))
        .await;
    assert_eq!(status, 200);
    let (status, _) = api
        .post(&url, &json!({"type": "tool_result", "group_id": "g", "id": "sub", "text": "watching", "subscription": true}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        api.post(&url, &event("g", "sub", "second", false)).await.0,
        200
    );
    let texts = api.fields("g", "subscription_event", "/payload/text").await;
    assert_eq!(texts, vec![json!("early bird"), json!("second")]);
    let (_, call) = api.call("g", "sub").await;
    assert_eq!(call["status"], "subscribed");
    assert_eq!(call["subscription"], json!({"active": true, "events": 2}));
    let (_, thread) = api.thread("g").await;
    assert_eq!(thread["active_subscriptions"], json!(["sub"]));
    // final: true removes it from the active set; nothing after it counts.
    assert_eq!(api.post(&url, &event("g", "sub", "bye", true)).await.0, 200);
    let (status, body) = api.post(&url, &event("g", "sub", "too late", false)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (410, Some("subscription_gone"))
    );
    assert_eq!(api.thread("g").await.1["active_subscriptions"], json!([]));
    assert_eq!(api.call("g", "sub").await.1["status"], "completed");
}

#[tokio::test]
async fn a_cancelled_subscription_answers_410_and_tells_the_tool() {
    let s = Setup::new().await;
    let api = s.api();
    let url = s.dispatched("g", "sub").await;
    api.post(&url, &json!({"type": "tool_result", "group_id": "g", "id": "sub", "text": "ok", "subscription": true}))
        .await;
    let (status, body) = api.delete("/v1/threads/g/subscriptions/sub").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "cancelled");
    let (kind, notice) = s.tool.next_notice().await;
    assert_eq!(kind, "cancel_tool_call");
    assert_eq!(notice, json!({"thread_id": "g", "tool_call_id": "sub"}));
    let before = api.events("g", 0).await.len();
    let (status, body) = api
        .post(&url, &event("g", "sub", "after cancel", false))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (410, Some("subscription_gone"))
    );
    assert_eq!(api.events("g", 0).await.len(), before);
    assert_eq!(api.thread("g").await.1["active_subscriptions"], json!([]));
    // Cancelling again, or something that is not a subscription: 404.
    let (status, body) = api.delete("/v1/threads/g/subscriptions/sub").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_subscribed"))
    );
    let (status, _) = api.delete("/v1/threads/g/subscriptions/nope").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn the_builtin_cancel_subscription_tool_answers_at_once() {
    let s = Setup::new().await;
    let api = s.api();
    let url = s.dispatched("g", "sub").await;
    api.post(&url, &json!({"type": "tool_result", "group_id": "g", "id": "sub", "text": "ok", "subscription": true}))
        .await;
    // Another thread cannot cancel it: rap-3 "a thread cancels only its own".
    let (status, reply) = api
        .submit(json!({"operation": "cancel_subscription", "arguments": {"tool_call_id": "sub"}, "group_id": "other"}))
        .await;
    assert_eq!(status, 202);
    assert_eq!(reply["status"], "completed");
    assert!(reply["result"]["text"]
        .as_str()
        .unwrap()
        .starts_with("Error: "));
    assert_eq!(
        api.thread("g").await.1["active_subscriptions"],
        json!(["sub"])
    );
    let (status, reply) = api
        .submit(json!({"operation": "cancel_subscription", "arguments": {"tool_call_id": "sub"}, "group_id": "g", "id": "k"}))
        .await;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(reply["status"], "completed");
    assert_eq!(reply["result"]["is_error"], false);
    assert_eq!(
        s.tool.next_notice().await.1,
        json!({"thread_id": "g", "tool_call_id": "sub"})
    );
    assert_eq!(api.post(&url, &event("g", "sub", "x", false)).await.0, 410);
    assert_eq!(api.thread("g").await.1["active_subscriptions"], json!([]));
    // Bad arguments to the built-in are refused like any tool's.
    let (status, body) = api
        .submit(json!({"operation": "cancel_subscription", "arguments": {"tool_call_id": 7}, "group_id": "g"}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("invalid_arguments"))
    );
    let (_, tools) = api.get("/v1/tools").await;
    assert!(tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "cancel_subscription"));
}

#[tokio::test]
async fn cancelling_a_pending_call_ignores_its_late_result() {
    let s = Setup::new().await;
    let api = s.api();
    let url = s.dispatched("g", "c").await;
    let (status, call) = api.delete("/v1/threads/g/calls/c").await;
    assert_eq!((status, call["status"].as_str()), (200, Some("cancelled")));
    assert_eq!(
        s.tool.next_notice().await.1,
        json!({"thread_id": "g", "tool_call_id": "c"})
    );
    let (status, body) = api.post(&url, &result("g", "c", "late")).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ignored")));
    assert_eq!(api.count("g", "c", "tool_result").await, 0);
    assert_eq!(api.call("g", "c").await.1["status"], "cancelled");
    let (status, body) = api.delete("/v1/threads/g/calls/c").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("call_finished"))
    );
    // The message names the status as the API writes it.
    assert_eq!(
        body["error"]["message"], "call \"c\" is already cancelled",
        "{body}"
    );
    assert_eq!(api.delete("/v1/threads/g/calls/nope").await.0, 404);
}

/// Every commit of a thread carries its views, so their bytes are bounded
/// too: a `view_update` that would take the thread past the bound is
/// refused (413, nothing recorded); replacing a view counts its new
/// content only.
#[tokio::test]
async fn a_threads_views_are_bounded_in_bytes() {
    let s = Setup::new().await;
    let api = s.api();
    let url = s.dispatched("g", "c").await;
    let limit = ferry_engine::thread::MAX_VIEW_BYTES;
    let view = |view_type: &str, bytes: usize| {
        json!({"type": "view_update", "group_id": "g", "view_type": view_type,
               "content": "x".repeat(bytes)})
    };
    assert_eq!(api.post(&url, &view("big", limit * 3 / 4)).await.0, 200);
    let before = api.thread("g").await.1["last_seq"].clone();
    let (status, body) = api.post(&url, &view("more", limit / 2)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (413, Some("views_too_large")),
        "{body}"
    );
    assert_eq!(api.thread("g").await.1["last_seq"], before);
    // Growing the one view up to the bound (its name and its content as
    // JSON, with quotes) is fine, past it is not.
    let fits = limit - "big".len() - 2;
    assert_eq!(api.post(&url, &view("big", fits)).await.0, 200);
    assert_eq!(api.post(&url, &view("big", fits + 1)).await.0, 413);
    let (_, thread) = api.thread("g").await;
    assert_eq!(thread["views"]["big"].as_str().map(str::len), Some(fits));
    assert!(thread["views"].get("more").is_none(), "{thread}");
    // The name counts: a tiny view under a name past the bound is refused.
    let named = json!({"type": "view_update", "group_id": "g",
                       "view_type": "n".repeat(limit), "content": 1});
    assert_eq!(api.post(&url, &named).await.0, 413);
}

#[tokio::test]
async fn oauth_user_choice_and_view_update_are_recorded() {
    let s = Setup::new().await;
    let api = s.api();
    let url = s.dispatched("g", "c").await;
    let oauth =
        json!({"type": "oauth", "group_id": "g", "id": "c", "auth_url": "https://auth.example/x"});
    assert_eq!(api.post(&url, &oauth).await.0, 200);
    assert_eq!(api.post(&url, &oauth).await.1["status"], "duplicate");
    let (_, call) = api.call("g", "c").await;
    assert_eq!(
        (call["status"].as_str(), call["auth_url"].as_str()),
        (Some("awaiting_auth"), Some("https://auth.example/x"))
    );
    let choice = json!({"type": "user_choice", "group_id": "g", "id": "c", "prompt": "Which?",
                        "choices": ["a", "b"], "default": 1, "response_url": "https://tool.example/choice"});
    assert_eq!(api.post(&url, &choice).await.0, 200);
    let (_, call) = api.call("g", "c").await;
    assert_eq!(call["status"], "awaiting_user");
    assert_eq!(call["choice"]["choices"], json!(["a", "b"]));
    let view = json!({"type": "view_update", "group_id": "g", "view_type": "diff", "content": {"patch": "+x"}});
    assert_eq!(api.post(&url, &view).await.0, 200);
    assert_eq!(
        api.thread("g").await.1["views"],
        json!({"diff": {"patch": "+x"}})
    );
    // A thread holds a bounded number of views: one more type is refused
    // (a 4xx: the tool does not retry it), an existing one still updates.
    let bound = ferry_engine::thread::MAX_VIEWS;
    for i in 1..bound {
        let more = json!({"type": "view_update", "group_id": "g", "view_type": format!("v{i}"), "content": i});
        assert_eq!(api.post(&url, &more).await.0, 200);
    }
    let over = json!({"type": "view_update", "group_id": "g", "view_type": "over", "content": 0});
    let (status, body) = api.post(&url, &over).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("too_many_views")),
        "{body}"
    );
    assert_eq!(api.post(&url, &view).await.1["status"], "duplicate");
    assert_eq!(
        api.post(&url, &result("g", "c", "authorized and chosen"))
            .await
            .0,
        200
    );
    let (_, call) = api.call("g", "c").await;
    assert_eq!(call["status"], "completed");
    assert!(call.get("auth_url").is_none() && call.get("choice").is_none());
    let kinds = api.types("g").await;
    for kind in ["oauth", "user_choice", "tool_result"] {
        assert_eq!(
            kinds.iter().filter(|k| *k == kind).count(),
            1,
            "{kind} in {kinds:?}"
        );
    }
    let views = kinds.iter().filter(|k| *k == "view_update").count();
    assert_eq!(views, ferry_engine::thread::MAX_VIEWS, "{kinds:?}");
}

#[tokio::test]
async fn demo_tools_exercise_the_protocol_end_to_end() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    // ticks: a subscription of N events, then final.
    api.submit(json!({"operation": "ticks", "arguments": {"count": 3, "interval_ms": 1}, "group_id": "g", "id": "t"})).await;
    api.wait_event("g", 0, |e| {
        e["type"] == "subscription_event" && e["payload"]["final"] == true
    })
    .await;
    let (_, call) = api.call("g", "t").await;
    assert_eq!(call["status"], "completed");
    assert_eq!(call["subscription"]["events"], 3);
    // authorize: oauth first, the result after the user visits auth_url.
    api.submit(
        json!({"operation": "authorize", "arguments": {"text": "me"}, "group_id": "g", "id": "a"}),
    )
    .await;
    let oauth = api.wait_for("g", "a", "oauth").await;
    let auth_url = oauth["payload"]["auth_url"].as_str().unwrap();
    assert_eq!(api.call("g", "a").await.1["status"], "awaiting_auth");
    reqwest::get(auth_url)
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    let result = api.wait_for("g", "a", "tool_result").await;
    assert_eq!(result["payload"]["text"], "authorized: me");
    // diff: display_as with a text fallback; fail: an Error: result.
    api.submit(json!({"operation": "diff", "arguments": {"path": "src/main.rs"}, "group_id": "g", "id": "d"})).await;
    let diff = api.wait_for("g", "d", "tool_result").await;
    assert_eq!(diff["payload"]["display_as"][0]["type"], "diff");
    assert_eq!(diff["payload"]["display_as"][1]["type"], "text");
    api.submit(json!({"operation": "fail", "arguments": {}, "group_id": "g", "id": "f"}))
        .await;
    let failed = api.wait_for("g", "f", "tool_result").await;
    assert_eq!(failed["payload"]["is_error"], true);
    assert!(failed["payload"]["text"]
        .as_str()
        .unwrap()
        .starts_with("Error: "));
}

/// `rap-3`: "A runtime should bound the number of active subscriptions per
/// thread." One past the bound: the agent gets the result, the tool is
/// told to cancel, and the thread's active set does not grow.
#[tokio::test]
async fn a_subscription_past_the_threads_bound_is_cancelled_at_once() {
    let bound = ferry_engine::thread::MAX_ACTIVE_SUBSCRIPTIONS;
    let s = Setup::new().await;
    let api = s.api();
    let opened = |id: &str| json!({"type": "tool_result", "group_id": "g", "id": id, "text": "watching", "subscription": true});
    for i in 0..bound {
        let id = format!("s{i}");
        let url = s.dispatched("g", &id).await;
        let (status, body) = api.post(&url, &opened(&id)).await;
        assert_eq!((status, body["status"].as_str()), (200, Some("applied")));
    }
    let url = s.dispatched("g", "over").await;
    let (status, body) = api.post(&url, &opened("over")).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("applied")));
    let (kind, notice) = s.tool.next_notice().await;
    assert_eq!(kind, "cancel_tool_call");
    assert_eq!(notice, json!({"thread_id": "g", "tool_call_id": "over"}));
    let (_, thread) = api.thread("g").await;
    let active = thread["active_subscriptions"].as_array().unwrap();
    assert_eq!(active.len(), bound);
    assert!(!active.contains(&json!("over")));
    let (_, call) = api.call("g", "over").await;
    assert_eq!(
        (call["status"].as_str(), call["result"]["text"].as_str()),
        (Some("cancelled"), Some("watching"))
    );
    let last: Vec<String> = api.types("g").await.into_iter().rev().take(2).collect();
    assert_eq!(last, ["subscription_cancelled", "tool_result"]);
    // The agent reads why: nobody asked for this cancel.
    let cancelled = api.wait_for("g", "over", "subscription_cancelled").await;
    assert_eq!(
        cancelled["payload"]["reason"],
        format!("the thread already holds {bound} active subscriptions, the most it may")
    );
    let (status, _) = api.post(&url, &event("g", "over", "tick", false)).await;
    assert_eq!(status, 410);
}

/// DESIGN invariant 5: "A callback is accepted only for a call that exists
/// and is waiting (or a subscription that is active)." A `view_update`
/// sent with the token of a cancelled call, or in a closed thread, is
/// answered 200 `ignored` and records nothing.
#[tokio::test]
async fn a_view_update_from_a_call_no_longer_open_changes_nothing() {
    let s = Setup::new().await;
    let api = s.api();
    let view =
        |n: i64| json!({"type": "view_update", "group_id": "g", "view_type": "diff", "content": n});
    let cancelled = s.dispatched("g", "c").await;
    let open = s.dispatched("g", "d").await;
    assert_eq!(api.post(&open, &view(1)).await.0, 200);
    api.delete("/v1/threads/g/calls/c").await;
    let before = api.events("g", 0).await;
    let (status, body) = api.post(&cancelled, &view(2)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("ignored")),
        "{body}"
    );

    assert_eq!(api.post("/v1/threads/g/close", &json!({})).await.0, 200);
    let closed = api.events("g", 0).await;
    let (status, body) = api.post(&open, &view(3)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("ignored")),
        "{body}"
    );
    assert_eq!(api.events("g", 0).await, closed, "a view was recorded");
    // Closing cancelled `d`, still open, and then closed the thread.
    assert_eq!(
        closed.len(),
        before.len() + 2,
        "only call_cancelled and thread_closed after the cancel"
    );
    assert_eq!(api.thread("g").await.1["views"], json!({"diff": 1}));
}

/// A `tool_result` over the body limit (1 MiB by default) is refused 413,
/// and "Tools retry callbacks on 5xx, not on 4xx" (rap-3): instead of
/// waiting forever for a result the tool will not send again, the call
/// fails with an error result from Ferry that says why, and the tool is
/// told the call is over. Nothing else that large is recorded: not a
/// `subscription_event`, not a body naming another call or thread, or with
/// a misshapen field, not a result for a call that was cancelled; a body
/// with a forged token is 403, as any forged callback.
#[tokio::test]
async fn a_result_too_large_to_record_fails_its_call_with_an_error() {
    let s = Setup::new().await;
    let api = s.api();
    let url = s.dispatched("g", "big").await;
    let other = s.dispatched("g", "other").await;
    let gone = s.dispatched("g", "gone").await;
    assert_eq!(api.delete("/v1/threads/g/calls/gone").await.0, 200);
    let told = json!({"thread_id": "g", "tool_call_id": "gone"});
    assert_eq!(
        s.tool.next_notice().await,
        ("cancel_tool_call".into(), told)
    );
    let text = "x".repeat(2 << 20);
    let oversized = |fields: Value| {
        let mut body = fields;
        body["text"] = json!(text);
        // Keys sorted, as serde_json and Go's maps write them: `type` comes
        // after the 2 MiB of `text`.
        body.to_string().into_bytes()
    };
    let (prefix, _) = url.rsplit_once('/').unwrap();
    let forged = format!(
        "{prefix}/{}",
        Capabilities::new(b"another-secret-entirely").mint("g", "big")
    );
    let tool_result = json!({"type": "tool_result", "group_id": "g", "id": "big"});
    let before = api.events("g", 0).await;
    let refused_alone = [
        (
            "a subscription_event",
            url.clone(),
            json!({"type": "subscription_event", "group_id": "g", "tool_call_id": "big"}),
        ),
        ("another call's token", other.clone(), tool_result.clone()),
        (
            "another thread",
            url.clone(),
            json!({"type": "tool_result", "group_id": "h", "id": "big"}),
        ),
        (
            "a misshapen group_id",
            url.clone(),
            json!({"type": "tool_result", "group_id": 7, "id": "big"}),
        ),
        (
            "no id",
            url.clone(),
            json!({"type": "tool_result", "group_id": "g"}),
        ),
        (
            "a cancelled call",
            gone,
            json!({"type": "tool_result", "group_id": "g", "id": "gone"}),
        ),
    ];
    let (status, answer) = api.post_raw(&forged, oversized(tool_result.clone())).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (403, &json!("forbidden"))
    );
    for (case, to, fields) in refused_alone {
        let (status, answer) = api.post_raw(&to, oversized(fields)).await;
        assert_eq!(status, 413, "{case}: {answer}");
        assert_eq!(answer["error"]["code"], "payload_too_large", "{case}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(!message.contains("error result"), "{case}: {message}");
    }
    // A field given twice, the last time not as text; and bodies that are
    // not JSON after their fields (issue 2: "Malformed JSON or missing
    // fields: 400", which changes nothing): no callback.
    let fields = r#"{"type":"tool_result","group_id":"g","id":"big","text":"#;
    for (case, body) in [
        ("twice", format!(r#"{fields}"{text}","type":5}}"#)),
        (
            "trailing garbage",
            format!(r#"{fields}"{text}"}} <<<not json"#),
        ),
        ("unterminated", format!(r#"{fields}"{text}"#)),
    ] {
        let (status, answer) = api.post_raw(&url, body.into_bytes()).await;
        assert_eq!(status, 413, "{case}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(!message.contains("error result"), "{case}: {message}");
    }
    assert_eq!(api.events("g", 0).await, before, "nothing recorded");

    let (status, answer) = api.post_raw(&url, oversized(tool_result.clone())).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["error"]["code"], "payload_too_large");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.ends_with("the call failed with an error result saying so"),
        "{message}"
    );
    let (_, call) = api.call("g", "big").await;
    assert_eq!(call["status"], "failed", "{call}");
    assert_eq!(call["result"]["is_error"], true, "{call}");
    let said = call["result"]["text"].as_str().unwrap().to_owned();
    assert!(
        said.starts_with(
            "Error: the tool's result was larger than this runtime accepts (at most 1048576 bytes)"
        ),
        "{said}"
    );
    let told = json!({"thread_id": "g", "tool_call_id": "big"});
    assert_eq!(
        s.tool.next_notice().await,
        ("cancel_tool_call".into(), told)
    );
    // The other calls are as they were.
    assert_eq!(api.call("g", "other").await.1["status"], "dispatched");
    assert_eq!(api.call("g", "gone").await.1["status"], "cancelled");

    // Sent again, that large or not, it changes nothing: one result.
    let (status, answer) = api.post_raw(&url, oversized(tool_result)).await;
    assert_eq!(status, 413, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(!message.contains("error result"), "{message}");
    let (status, answer) = api.post(&url, &result("g", "big", "small")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(api.count("g", "big", "tool_result").await, 1);
    assert_eq!(api.call("g", "big").await.1["result"]["text"], said);
}

/// The same for a body sent in chunks, with no `Content-Length` (keys
/// sorted, `type` last): Ferry reads it through as it arrives.
#[tokio::test]
async fn a_result_sent_in_chunks_too_large_to_record_fails_its_call() {
    let s = Setup::new().await;
    let url = s.dispatched("g", "big").await;
    let mut chunks = vec![r#"{"group_id":"g","id":"big","text":""#.to_owned()];
    chunks.extend((0..16).map(|_| "x".repeat(128 << 10)));
    chunks.push(r#"","type":"tool_result"}"#.to_owned());
    let response = post_in_chunks(&url, chunks).await.unwrap();
    assert_eq!(response.status(), 413);
    let answer: Value = response.json().await.unwrap();
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.ends_with("the call failed with an error result saying so"),
        "{message}"
    );
    let (_, call) = s.api().call("g", "big").await;
    assert_eq!(call["status"], "failed", "{call}");
}

/// Past 16 times the limit Ferry stops reading a body through; a result
/// whose `type`, `group_id` and `id` came before that point still fails
/// its call (taking the cut for malformed JSON would leave the call
/// waiting for a result never sent again).
#[tokio::test]
async fn a_result_cut_where_ferry_stops_reading_still_fails_its_call() {
    let s = Setup::new().await;
    let url = s.dispatched("g", "huge").await;
    let mut chunks =
        vec![r#"{"type":"tool_result","group_id":"g","id":"huge","text":""#.to_owned()];
    chunks.extend((0..17).map(|_| "x".repeat(1 << 20)));
    chunks.push(r#""}"#.to_owned());
    let sent = post_in_chunks(&url, chunks).await;
    // Ferry answers before the last megabyte is sent: the sender may see
    // the connection close instead of the 413.
    if let Ok(response) = sent {
        assert_eq!(response.status(), 413);
    }
    let api = s.api();
    let result = api.wait_for("g", "huge", "tool_result").await;
    assert_eq!(result["payload"]["is_error"], true, "{result}");
    assert_eq!(api.call("g", "huge").await.1["status"], "failed");
}

/// POSTs `chunks` as one JSON body with no `Content-Length`.
async fn post_in_chunks(url: &str, chunks: Vec<String>) -> reqwest::Result<reqwest::Response> {
    let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
    reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
}

/// The header the IETF draft names (draft-ietf-httpapi-idempotency-key-header).
const KEY: &str = "Idempotency-Key";

/// Request headers as `Api::post_with` sends them.
type Headers<'a> = Vec<(&'a str, &'a [u8])>;

/// Posts `body` to `url` with one `Idempotency-Key: key` header.
async fn post_keyed(api: &Api, url: &str, body: &Value, key: &[u8]) -> (u16, Value) {
    api.post_with(url, body.to_string().into_bytes(), &[(KEY, key)])
        .await
}

/// rap-3: a `subscription_event` has no id ("Events have no per-event
/// id"), so a tool that sends one again because Ferry's answer never
/// reached it (Ferry killed between storing it and answering) would have
/// it recorded twice. Named by an `Idempotency-Key` (the draft: a key "the
/// resource server uses to recognize subsequent retries of the same
/// request"), the repeat is answered `duplicate` and records nothing.
/// The draft makes the value an sf-string (quoted); a bare key is taken as
/// the same key. The same key with a different body is the draft's 422.
#[tokio::test]
async fn a_keyed_subscription_event_posted_twice_is_recorded_once() {
    let mut s = Setup::new().await;
    let api = s.api();
    let url = s.dispatched("g", "sub").await;
    let opened = json!({"type": "tool_result", "group_id": "g", "id": "sub", "text": "watching", "subscription": true});
    assert_eq!(api.post(&url, &opened).await.0, 200);
    let tick = event("g", "sub", "tick", false);
    let answer = |(status, body): (u16, Value)| (status, body["status"].clone());
    let applied = (200, json!("applied"));
    let duplicate = (200, json!("duplicate"));
    assert_eq!(
        answer(post_keyed(&api, &url, &tick, br#""sub/1""#).await),
        applied
    );
    assert_eq!(
        answer(post_keyed(&api, &url, &tick, br#""sub/1""#).await),
        duplicate
    );
    assert_eq!(
        answer(post_keyed(&api, &url, &tick, b"sub/1").await),
        duplicate
    );
    // The key names the callback, not its text: another key, another event.
    assert_eq!(
        answer(post_keyed(&api, &url, &tick, br#""sub/2""#).await),
        applied
    );
    let (status, body) = post_keyed(&api, &url, &event("g", "sub", "tock", false), b"sub/1").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("idempotency_key_reused")),
        "{body}"
    );
    assert_eq!(api.count("g", "sub", "subscription_event").await, 2);
    assert_eq!(api.call("g", "sub").await.1["subscription"]["events"], 2);
    let keys = api
        .fields("g", "subscription_event", "/idempotency_key/key")
        .await;
    assert_eq!(keys, [json!("sub/1"), json!("sub/2")]);

    // The keys are in the log: after a kill -9 the repeat is still one.
    s.ferry.restart().await;
    let api = s.api();
    assert_eq!(
        answer(post_keyed(&api, &url, &tick, br#""sub/1""#).await),
        duplicate
    );
    assert_eq!(api.count("g", "sub", "subscription_event").await, 2);
    // Without a key, the same event is a new one, as before.
    assert_eq!(answer(api.post(&url, &tick).await), applied);
    assert_eq!(api.count("g", "sub", "subscription_event").await, 3);
}

/// A key Ferry does not take (over 256 bytes, a control character, not
/// ASCII, empty, a broken sf-string, or two headers: the draft says
/// "Clients MUST NOT include more than one") is answered 400
/// `invalid_callback` and records nothing, whatever the body.
#[tokio::test]
async fn a_bad_idempotency_key_is_refused_and_changes_nothing() {
    let s = Setup::new().await;
    let api = s.api();
    let url = s.dispatched("g", "sub").await;
    api.wait_for("g", "sub", "call_dispatched").await;
    let tick = event("g", "sub", "tick", false).to_string().into_bytes();
    let longest = "k".repeat(256);
    let too_long = "k".repeat(257);
    let quoted_too_long = format!("\"{too_long}\"");
    let cases: [(&str, Headers); 9] = [
        ("257 bytes", vec![(KEY, too_long.as_bytes())]),
        ("257 bytes, quoted", vec![(KEY, quoted_too_long.as_bytes())]),
        ("a tab inside", vec![(KEY, b"a\tb")]),
        ("not ASCII", vec![(KEY, "café".as_bytes())]),
        ("empty", vec![(KEY, b"")]),
        ("empty, quoted", vec![(KEY, br#""""#)]),
        ("an unclosed quote", vec![(KEY, br#""abc"#)]),
        ("a space, unquoted", vec![(KEY, b"a b")]),
        ("two headers", vec![(KEY, b"a"), (KEY, b"b")]),
    ];
    let before = api.events("g", 0).await;
    for (what, headers) in cases {
        let (status, body) = api.post_with(&url, tick.clone(), &headers).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("invalid_callback")),
            "{what}: {body}"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(KEY), "{what}: {message}");
    }
    assert_eq!(api.events("g", 0).await, before, "nothing recorded");
    assert_eq!(api.call("g", "sub").await.1["status"], "dispatched");
    // The longest key Ferry takes, quoted or bare.
    let quoted = format!("\"{longest}\"");
    let (status, body) = api
        .post_with(&url, tick.clone(), &[(KEY, quoted.as_bytes())])
        .await;
    assert_eq!((status, body["status"].as_str()), (200, Some("applied")));
    let (status, body) = api
        .post_with(&url, tick, &[(KEY, longest.as_bytes())])
        .await;
    assert_eq!((status, body["status"].as_str()), (200, Some("duplicate")));
    assert_eq!(api.count("g", "sub", "subscription_event").await, 1);
}
