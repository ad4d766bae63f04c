//! `--api-token`: with tokens configured, the native API answers only
//! requests that carry one (`Authorization: Bearer …`); tools' callbacks,
//! the health check, the dashboard's page and the protocol fronts (which
//! have their own credentials) are not asked for one. A refused request
//! changes nothing.

use ferry_tests::api::Api;
use ferry_tests::{Ferry, FerryOptions, TestTool};
use serde_json::json;

const TOKEN: &str = "agents-token-0123456789";
const ROTATED: &str = "reviewers.token_of~ours+/==";

async fn guarded_ferry(tool: &TestTool) -> Ferry {
    let options = FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::default()
    };
    Ferry::start(options.api_token(TOKEN).api_token(ROTATED)).await
}

/// A raw request with the given `Authorization` header (if any).
async fn send(
    ferry: &Ferry,
    method: reqwest::Method,
    path: &str,
    authorization: Option<&str>,
) -> reqwest::Response {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = client
        .request(method, format!("{}{path}", ferry.url))
        .header("content-type", "application/json")
        .body(
            json!({"operation": "echo", "arguments": {}, "group_id": "g", "id": "c"}).to_string(),
        );
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    request.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_valid_token_the_api_refuses_and_changes_nothing() {
    let tool = TestTool::start("t", &["echo"]).await;
    let ferry = guarded_ferry(&tool).await;
    let post = reqwest::Method::POST;
    for authorization in [
        None,
        Some(""),
        Some("Bearer"),
        Some("Bearer "),
        Some("Bearer agents-token-012345678"),
        Some("Bearer agents-token-0123456789x"),
        Some("Bearer AGENTS-TOKEN-0123456789"),
        Some("Basic YWdlbnRzOnRva2Vu"),
        Some("agents-token-0123456789"),
        Some("Token agents-token-0123456789"),
    ] {
        let response = send(&ferry, post.clone(), "/v1/calls", authorization).await;
        assert_eq!(response.status(), 401, "{authorization:?}");
        // RFC 6750 §3.1: a refused token is `invalid_token`.
        let challenge = if authorization.is_some_and(|a| a.starts_with("Bearer ") && a.len() > 7) {
            "Bearer realm=\"ferry\", error=\"invalid_token\""
        } else {
            "Bearer realm=\"ferry\""
        };
        assert_eq!(
            response.headers()["www-authenticate"],
            challenge,
            "{authorization:?}"
        );
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        assert!(
            !body.to_string().contains(TOKEN),
            "the answer repeats the token: {body}"
        );
    }
    // Reads are guarded as well as writes.
    let get = reqwest::Method::GET;
    for path in [
        "/v1/tools",
        "/v1/toolsets",
        "/v1/threads",
        "/v1/threads/g",
        "/v1/threads/g/events?after=0",
        "/v1/threads/g/stream",
        "/v1/threads/g/acp",
        "/v1/threads/g/calls/c",
        "/v1/approvals",
        "/metrics",
    ] {
        let response = send(&ferry, get.clone(), path, None).await;
        assert_eq!(response.status(), 401, "{path}");
    }
    // Nothing reached the tool, and nothing was recorded.
    assert!(tool.invocations().is_empty());
    let api = Api::with_token(&ferry.url, TOKEN);
    let (status, body) = api.thread("g").await;
    assert_eq!(status, 404, "{body}");
    assert!(api.events("g", 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_token_calls_work_and_tools_call_back_without_one() {
    let tool = TestTool::start("t", &["echo"]).await;
    let ferry = guarded_ferry(&tool).await;
    let agent = Api::with_token(&ferry.url, TOKEN);
    let (status, body) = agent
        .submit(json!({"operation": "echo", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    assert_eq!(status, 202, "{body}");
    // The tool knows nothing of the API's tokens: its callback URL is its
    // credential.
    let sent = tool.next_invocation().await.invocation;
    // The tool is told who submitted the call, as Ferry authenticated it.
    assert_eq!(sent.identity.as_deref(), Some("api-token"));
    let anonymous = ferry.api();
    let result = json!({"type": "tool_result", "group_id": "g", "id": "c", "text": "done"});
    let (status, body) = anonymous.post(&sent.callback_url, &result).await;
    assert_eq!(status, 200, "{body}");
    // Either token works, and the scheme's case does not matter (RFC 7235).
    let response = send(
        &ferry,
        reqwest::Method::GET,
        "/v1/threads/g/calls/c",
        Some(&format!("bearer {ROTATED}")),
    )
    .await;
    assert_eq!(response.status(), 200);
    let call: serde_json::Value = response.json().await.unwrap();
    assert_eq!(call["status"], "completed", "{call}");
    // What needs no token: the health check and the dashboard's page.
    for path in ["/healthz", "/ui", "/ui/"] {
        let response = send(&ferry, reqwest::Method::GET, path, None).await;
        assert_eq!(response.status(), 200, "{path}");
    }
    // OXP, given no credentials of its own, asks for an API token (as
    // `/mcp` does: `mcp.rs`), in its own error shape.
    let get = reqwest::Method::GET;
    let refused = send(&ferry, get.clone(), "/oxp/tools", None).await;
    assert_eq!(refused.status(), 401);
    let wrong = send(&ferry, get.clone(), "/oxp/tools", Some("Bearer nope")).await;
    assert_eq!(wrong.status(), 401);
    let bearer = format!("Bearer {TOKEN}");
    let listed = send(&ferry, get, "/oxp/tools", Some(&bearer)).await;
    assert_eq!(listed.status(), 200);
    let listed: serde_json::Value = listed.json().await.unwrap();
    assert!(listed.to_string().contains("echo"), "{listed}");
}

/// A token that could not be sent, or is too short to be safe, stops
/// `ferry` at start, naming the flag and not the value.
#[test]
fn unusable_tokens_stop_ferry_at_start() {
    for token in [
        "x9y8z7",
        "has a space in it, see",
        "ünïcode-token-0123456789",
    ] {
        let (status, stderr) = ferry_tests::ferry::refused(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--api-token",
            token,
        ]);
        assert!(!status.success(), "{token:?} accepted");
        assert!(stderr.contains("--api-token"), "{token:?}: {stderr}");
        assert!(!stderr.contains(token), "{token:?} repeated: {stderr}");
    }
}
