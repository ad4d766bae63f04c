//! The instant echo tool: a RAP toolset that acks every invocation and
//! calls back with its result at once.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use ferry_proto::rap::{Callback, Invocation, Manifest, ToolDef, ToolResult};
use serde_json::{json, Value};

use super::{TOOL, TOOLSET};

/// The instant RAP tool: acks every invocation at once and sends the result
/// straight away, so that what is measured is the path, not the tool.
pub(super) fn tool_router(http: reqwest::Client) -> Router {
    Router::new()
        .route("/.well-known/rap-toolset", get(manifest))
        .route("/invoke", post(invoke))
        .with_state(http)
}

/// The manifest names the endpoint by the `Host` the caller used.
async fn manifest(headers: HeaderMap) -> Json<Manifest> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    Json(Manifest {
        name: TOOLSET.to_owned(),
        description: Some("Ferry's bench tool: answers at once.".to_owned()),
        endpoint: format!("http://{host}/invoke"),
        tools: vec![ToolDef {
            name: TOOL.to_owned(),
            description: "Answers with the given text, at once.".to_owned(),
            input_schema: json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            }),
            annotations: None,
            display_script: None,
        }],
        needs_migration: None,
    })
}

/// Acks 200 and calls back in a spawned task (rap-1: never block the ack).
async fn invoke(State(http): State<reqwest::Client>, body: Bytes) -> StatusCode {
    let Ok(inv) = serde_json::from_slice::<Invocation>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    tokio::spawn(call_back(http, inv));
    StatusCode::OK
}

/// POSTs the echo result to the invocation's callback URL; retried twice on
/// a transport error or 5xx so that a transient hiccup is not a lost call.
async fn call_back(http: reqwest::Client, inv: Invocation) {
    let text = match inv.arguments.get("text").and_then(Value::as_str) {
        Some(t) if inv.operation == TOOL => t.to_owned(),
        _ => format!("Error: the bench tool only has {TOOL}(text)"),
    };
    let result = Callback::ToolResult(ToolResult {
        group_id: inv.group_id,
        id: inv.id,
        call_id: inv.call_id,
        text: Some(text),
        content: None,
        display_as: None,
        subscription: false,
    });
    for attempt in 1..=3 {
        match http.post(&inv.callback_url).json(&result).send().await {
            Ok(r) if !r.status().is_server_error() => return,
            Ok(r) => tracing::warn!(status = %r.status(), attempt, "bench callback failed"),
            Err(e) => tracing::warn!(error = %e, attempt, "bench callback failed"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
