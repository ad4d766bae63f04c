//! The demo tool against a real callback receiver on loopback.

use super::*;
use ferry_proto::rap::CallbackError;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// The demo tool and a callback receiver, each on its own loopback port.
struct Harness {
    base: String,
    callback_url: String,
    callbacks: mpsc::UnboundedReceiver<Result<Callback, CallbackError>>,
    http: reqwest::Client,
}

async fn start() -> Harness {
    let tool = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", tool.local_addr().unwrap());
    tokio::spawn(DemoTool::serve(tool));
    let (tx, callbacks) = mpsc::unbounded_channel();
    let receiver = Router::new().route(
        "/callback",
        post(move |body: Bytes| async move {
            let _ = tx.send(Callback::from_slice(&body));
            StatusCode::OK
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let callback_url = format!("http://{}/callback", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver).await });
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    Harness {
        base,
        callback_url,
        callbacks,
        http,
    }
}

impl Harness {
    async fn invoke(&self, id: &str, operation: &str, arguments: Value) -> StatusCode {
        let body = json!({
            "operation": operation, "arguments": arguments, "id": id, "call_id": null,
            "callback_url": self.callback_url, "group_id": "thread-1",
        });
        self.post("/invoke", body).await.status()
    }

    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn alive(&self, id: &str) -> bool {
        let body = json!({"thread_id": "thread-1", "tool_call_id": id});
        let reply: ToolCallStatusReply = self
            .post("/tool_call_status", body)
            .await
            .json()
            .await
            .unwrap();
        reply.alive
    }

    async fn next(&mut self) -> Callback {
        let next = tokio::time::timeout(Duration::from_secs(10), self.callbacks.recv()).await;
        next.expect("no callback within 10s")
            .expect("receiver gone")
            .expect("malformed callback")
    }

    async fn next_result(&mut self) -> ToolResult {
        match self.next().await {
            Callback::ToolResult(r) => r,
            other => panic!("expected a tool_result, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn manifest_lists_every_tool_with_a_strict_schema() {
    let h = start().await;
    let url = format!("{}/.well-known/rap-toolset", h.base);
    let manifest: Manifest = h.http.get(url).send().await.unwrap().json().await.unwrap();
    assert_eq!(manifest.name, "demo");
    assert_eq!(manifest.endpoint, format!("{}/invoke", h.base));
    let names: Vec<&str> = manifest.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, TOOL_NAMES);
    for tool in &manifest.tools {
        let schema = &tool.input_schema;
        assert_eq!(schema["type"], "object", "{}", tool.name);
        assert_eq!(schema["additionalProperties"], false, "{}", tool.name);
        assert!(
            schema["properties"].is_object() && schema["required"].is_array(),
            "{}",
            tool.name
        );
    }
}

#[tokio::test]
async fn echo_calls_back_the_text() {
    let mut h = start().await;
    assert_eq!(
        h.invoke("call-1", "echo", json!({"text": "hello"})).await,
        StatusCode::OK
    );
    let result = h.next_result().await;
    assert_eq!(
        (result.group_id.as_str(), result.id.as_str()),
        ("thread-1", "call-1")
    );
    assert_eq!(result.text.as_deref(), Some("hello"));
    assert!(!result.subscription);
}

#[tokio::test]
async fn flaky_answers_500_failures_times_then_succeeds() {
    let mut h = start().await;
    let args = json!({"failures": 2});
    assert_eq!(
        h.invoke("f", "flaky", args.clone()).await,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        h.invoke("f", "flaky", args.clone()).await,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(h.invoke("f", "flaky", args).await, StatusCode::OK);
    let result = h.next_result().await;
    assert_eq!(result.text.as_deref(), Some("succeeded after 2 failures"));
    assert!(
        h.callbacks.try_recv().is_err(),
        "the refused attempts must not call back"
    );
    let stats: Value = h
        .http
        .get(format!("{}/stats", h.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        stats,
        json!({"invocations": 3, "by_call": {"thread-1/f": 3}})
    );
}

#[tokio::test]
async fn ticks_subscribe_then_send_events_up_to_a_final_one() {
    let mut h = start().await;
    assert_eq!(
        h.invoke("t", "ticks", json!({"count": 3, "interval_ms": 0}))
            .await,
        StatusCode::OK
    );
    let result = h.next_result().await;
    assert!(result.subscription);
    assert_eq!(result.text.as_deref(), Some("subscribed to 3 ticks"));
    for i in 1..=3 {
        let Callback::SubscriptionEvent(event) = h.next().await else {
            panic!("expected an event")
        };
        assert_eq!(event.tool_call_id, "t");
        assert_eq!(event.text, format!("tick {i}"));
        assert!(event.associative);
        assert_eq!(event.is_final, i == 3);
    }
    assert!(!h.alive("t").await);
}

#[tokio::test]
async fn cancelled_ticks_stop_and_are_no_longer_alive() {
    let mut h = start().await;
    h.invoke("t", "ticks", json!({"count": 1000, "interval_ms": 5}))
        .await;
    assert!(h.next_result().await.subscription);
    assert!(matches!(h.next().await, Callback::SubscriptionEvent(e) if !e.is_final));
    assert!(h.alive("t").await);
    let cancel = h.post(
        "/cancel_tool_call",
        json!({"thread_id": "thread-1", "tool_call_id": "t"}),
    );
    assert_eq!(cancel.await.status(), StatusCode::OK);
    assert!(!h.alive("t").await);
}

#[tokio::test]
async fn fail_sends_an_error_result() {
    let mut h = start().await;
    h.invoke("a", "fail", json!({})).await;
    assert_eq!(
        h.next_result().await.text.as_deref(),
        Some("Error: the demo tool was asked to fail")
    );
    h.invoke("b", "fail", json!({"message": "boom"})).await;
    let result = h.next_result().await;
    assert_eq!(result.text.as_deref(), Some("Error: boom"));
    assert!(result.is_error());
}

#[tokio::test]
async fn bad_invocations_still_ack_then_report_an_error() {
    let mut h = start().await;
    assert_eq!(
        h.invoke("u", "no_such_tool", json!({})).await,
        StatusCode::OK
    );
    let result = h.next_result().await;
    assert_eq!(result.id, "u");
    assert!(result.text.unwrap().starts_with("Error: unknown operation"));
    assert_eq!(
        h.invoke("v", "echo", json!({"txt": 1})).await,
        StatusCode::OK
    );
    assert!(h
        .next_result()
        .await
        .text
        .unwrap()
        .starts_with("Error: invalid arguments for echo"));
    assert_eq!(
        h.invoke("w", "ticks", json!({"count": 0})).await,
        StatusCode::OK
    );
    assert!(h.next_result().await.is_error());
    let malformed = h.post("/invoke", json!({"operation": "echo"})).await;
    assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn tool_call_status_tracks_liveness() {
    let mut h = start().await;
    assert!(!h.alive("never-seen").await);
    h.invoke("s", "sleep", json!({"seconds": 3600})).await;
    assert!(h.alive("s").await);
    h.post("/close_thread", json!({"thread_id": "thread-1"}))
        .await;
    assert!(!h.alive("s").await);
    h.invoke("e", "echo", json!({"text": "x"})).await;
    h.next_result().await;
    assert!(!h.alive("e").await);
}

#[tokio::test]
async fn authorize_waits_for_consent() {
    let mut h = start().await;
    h.invoke("o", "authorize", json!({"text": "hi"})).await;
    let Callback::OAuth(oauth) = h.next().await else {
        panic!("expected an oauth callback")
    };
    assert!(oauth
        .auth_url
        .starts_with(&format!("{}/authorize/", h.base)));
    assert!(h.alive("o").await);
    let page = h.http.get(&oauth.auth_url).send().await.unwrap();
    assert_eq!(page.text().await.unwrap().trim(), "authorized");
    assert_eq!(
        h.next_result().await.text.as_deref(),
        Some("authorized: hi")
    );
}

#[tokio::test]
async fn diff_has_a_diff_then_a_text_segment() {
    let mut h = start().await;
    h.invoke("d", "diff", json!({"path": "src/main.rs"})).await;
    let result = h.next_result().await;
    assert_eq!(result.text.as_deref(), Some("Replaced text in src/main.rs"));
    let segments = result.display_as.unwrap();
    let DisplaySegment::Known(KnownSegment::Diff(diff)) = &segments[0] else {
        panic!("no diff")
    };
    assert_eq!(diff.path, "src/main.rs");
    assert!(diff
        .patch
        .starts_with("--- src/main.rs\n+++ src/main.rs\n@@"));
    let text = DisplaySegment::Known(KnownSegment::Text("edit src/main.rs — 1 insertion".into()));
    assert_eq!(segments[1], text);
}

/// Each callback carries an `Idempotency-Key` of its own, quoted as the
/// draft's sf-string, and a retry of it (after a 5xx) the same key and the
/// same body, so that Ferry can answer a repeat `duplicate`.
#[tokio::test]
async fn each_callback_has_its_own_idempotency_key_kept_across_retries() {
    let tool = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", tool.local_addr().unwrap());
    tokio::spawn(DemoTool::serve(tool));
    let (tx, mut posts) = mpsc::unbounded_channel();
    let seen = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let receiver = Router::new().route(
        "/callback",
        post(move |headers: HeaderMap, body: Bytes| async move {
            let key = headers
                .get(ferry_proto::idempotency::HEADER)
                .map(|v| v.to_str().unwrap().to_owned());
            let first = seen.lock().unwrap().insert(body.clone());
            let _ = tx.send((key, body));
            // Every callback's first attempt fails, as a Ferry that stored
            // it and died before answering would look to the tool.
            if first {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let callback_url = format!("http://{}/callback", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver).await });
    let invocation = json!({
        "operation": "ticks", "arguments": {"count": 2, "interval_ms": 0}, "id": "t",
        "call_id": null, "callback_url": callback_url, "group_id": "thread-1",
    });
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let sent = http.post(format!("{base}/invoke")).json(&invocation).send();
    assert_eq!(sent.await.unwrap().status(), StatusCode::OK);
    let mut received = vec![];
    // The result and two ticks, each sent twice.
    for _ in 0..6 {
        let next = tokio::time::timeout(Duration::from_secs(10), posts.recv()).await;
        received.push(next.expect("no callback within 10s").unwrap());
    }
    let mut keys = std::collections::HashSet::new();
    for attempts in received.chunks(2) {
        assert_eq!(attempts[0], attempts[1], "a retry is the same request");
        let key = attempts[0].0.as_deref().expect("an Idempotency-Key");
        assert!(key.starts_with('"') && key.ends_with('"'), "{key}");
        let key = ferry_proto::idempotency::parse(key.as_bytes()).unwrap();
        assert!(keys.insert(key), "each callback has a key of its own");
    }
}
