//! The MCP server at `/mcp` (Streamable HTTP, JSON-RPC 2.0): Ferry's tools
//! as MCP tools, each `tools/call` a Ferry call on the same durable path as
//! `POST /v1/calls` (validated, gated, persisted, dispatched, deduped,
//! visible in its thread's events).
//!
//! Revisions: 2025-11-25 (negotiating down to 2025-06-18 and 2025-03-26)
//! with the `initialize` handshake and `Mcp-Session-Id` sessions; and the
//! stateless 2026-07-28 (`server/discover`, the `_meta` envelope and the
//! `Mcp-Method`/`Mcp-Name` headers on every request). See `session`.

mod cancel;
mod jsonrpc;
mod security;
mod session;

pub use ferry_engine::sessions;
pub use session::thread_of_session;
mod tasks;
mod tools;

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tracing::{info_span, Instrument};

use crate::engine::Engine;
use crate::http::Perform;
use crate::identity::Identity;
use jsonrpc::{Incoming, RpcError, INVALID_REQUEST, METHOD_NOT_FOUND};
use session::{Context, HANDSHAKE_VERSIONS, SESSION_HEADER};
use sessions::Sessions;

/// What `ferry serve` configures for `/mcp`.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// Extra `Host` values accepted besides loopback (`host` or
    /// `host:port`): what clients use to reach Ferry when it listens on a
    /// non-loopback address. The native API accepts the same.
    pub allowed_hosts: Vec<String>,
    /// Extra `Origin`s accepted besides loopback ones (`*` for any).
    pub allowed_origins: Vec<String>,
    /// When set, every request must carry `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
    /// The native API's tokens: without a `bearer_token`, one of these
    /// is required instead (when there are any).
    pub api_tokens: crate::http::auth::ApiTokens,
    pub max_body_bytes: usize,
    /// Where the 2025 revisions' sessions live: this process's memory,
    /// or (a cluster) a store every node shares.
    pub sessions: Arc<dyn Sessions>,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            allowed_hosts: vec![],
            allowed_origins: vec![],
            bearer_token: None,
            api_tokens: Default::default(),
            max_body_bytes: 1 << 20,
            sessions: Arc::new(sessions::InMemory::default()),
        }
    }
}

struct Mcp {
    engine: Arc<Engine>,
    /// Where calls are submitted: the engine, detached from the client.
    perform: Arc<dyn Perform>,
    config: McpConfig,
    /// Session `tools/call`s a `notifications/cancelled` may still cancel.
    running: cancel::Running,
}

/// `POST`, `GET` and `DELETE /mcp`.
pub fn router(engine: Arc<Engine>, perform: Arc<dyn Perform>, config: McpConfig) -> Router {
    let mcp = Arc::new(Mcp {
        engine,
        perform,
        config,
        running: cancel::Running::default(),
    });
    Router::new()
        .route("/mcp", post(receive).get(no_stream).delete(end_session))
        .with_state(mcp)
}

/// An error answered on its own (not as part of a stream).
fn error_reply(id: &Value, error: &RpcError) -> Response {
    let status = StatusCode::from_u16(error.http_status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut response = (status, Json(jsonrpc::error_response(id, error))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

fn accepts_sse(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

async fn receive(State(mcp): State<Arc<Mcp>>, req: Request) -> Response {
    let headers = req.headers().clone();
    let identity = match security::check(&mcp.config, &headers) {
        Ok(identity) => identity,
        Err(e) => return error_reply(&Value::Null, &e),
    };
    let body = match axum::body::to_bytes(req.into_body(), mcp.config.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => {
            let e = RpcError::transport(
                413,
                INVALID_REQUEST,
                "the request body is larger than the configured limit",
            );
            return error_reply(&Value::Null, &e);
        }
    };
    if let Some(batch) = batch_of(&body) {
        return receive_batch(&mcp, &headers, &identity, batch).await;
    }
    let incoming = Incoming::parse(&body);
    // Looked up once: in a cluster, each lookup asks JetStream.
    let named = session::in_session(&*mcp.config.sessions, &headers, &identity).await;
    if let (Ok(Incoming::Notification { .. } | Incoming::Response), Some(Err(e))) =
        (&incoming, &named)
    {
        // A notification in a session that is gone is refused like a
        // request (404): the client learns it must initialize again.
        return error_reply(&Value::Null, e);
    }
    let (id, method, params) = match incoming {
        Err((id, e)) => return error_reply(&id, &e),
        Ok(Incoming::Notification { method, params }) => {
            let session = named.and_then(Result::ok);
            notified(&mcp, session.as_ref(), &method, &params).await;
            return StatusCode::ACCEPTED.into_response();
        }
        Ok(Incoming::Response) => return StatusCode::ACCEPTED.into_response(),
        Ok(Incoming::Request { id, method, params }) => (id, method, params),
    };
    let ctx = match named {
        Some(Ok(_)) if method == "initialize" => {
            let e = RpcError::new(INVALID_REQUEST, "this session is already initialized");
            return error_reply(&id, &e);
        }
        Some(Ok(ctx)) => ctx,
        Some(Err(e)) => return error_reply(&id, &e),
        None if method == "initialize" => return initialize(&mcp, &identity, &id, &params).await,
        None if session::looks_modern(&method, &params, &headers) => {
            match session::stateless(&method, &params, &headers, &identity) {
                Ok(ctx) => ctx,
                Err(e) => return error_reply(&id, &e),
            }
        }
        None => {
            let e = RpcError::transport(
                400,
                INVALID_REQUEST,
                "Bad Request: no Mcp-Session-Id header; send initialize first, or use the \
                 2026-07-28 revision's _meta envelope",
            );
            return error_reply(&id, &e);
        }
    };
    let span = info_span!("mcp", ?method, session = ctx.session.as_deref().unwrap_or(""), version = %ctx.version);
    // Calls may wait long (a reviewer, a slow tool): answer them as a stream
    // when the client takes one, so progress and keep-alives can flow.
    let long = matches!(method.as_str(), "tools/call" | "tasks/result");
    if long && accepts_sse(&headers) {
        let (tx, rx) = mpsc::channel::<Value>(16);
        tokio::spawn(
            async move {
                let answer = dispatch(&mcp, &ctx, &id, &method, &params, Some(&tx)).await;
                if let Some(message) = answer_message(&id, &ctx, answer) {
                    let _ = tx.send(message).await;
                }
            }
            .instrument(span),
        );
        let events = tokio_stream::wrappers::ReceiverStream::new(rx).map(|message| {
            Ok::<_, Infallible>(Event::default().event("message").data(message.to_string()))
        });
        return Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response();
    }
    let answer = dispatch(&mcp, &ctx, &id, &method, &params, None)
        .instrument(span)
        .await;
    match answer_message(&id, &ctx, answer) {
        Some(message) => Json(message).into_response(),
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// Messages one batch may hold: its requests run at once.
const MAX_BATCH: usize = 64;

/// The messages of a body that is a JSON array, if it is one.
fn batch_of(body: &[u8]) -> Option<Vec<Value>> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
    if *first != b'[' {
        return None;
    }
    serde_json::from_slice(body).ok()
}

/// A JSON-RPC batch, which MCP 2025-03-26 allows (and 2025-06-18 removed):
/// requests and notifications in one POST, answered together as an array
/// (202 when none is a request). Its requests run concurrently.
async fn receive_batch(
    mcp: &Arc<Mcp>,
    headers: &HeaderMap,
    identity: &Identity,
    batch: Vec<Value>,
) -> Response {
    let refuse = |why: &str| {
        let e = RpcError::transport(400, INVALID_REQUEST, format!("Invalid Request: {why}"));
        error_reply(&Value::Null, &e)
    };
    let ctx = match session::in_session(&*mcp.config.sessions, headers, identity).await {
        Some(Ok(ctx)) if ctx.version == session::BATCH_VERSION => ctx,
        Some(Err(e)) => return error_reply(&Value::Null, &e),
        _ => {
            return refuse(
                "JSON-RPC batches are supported only in a 2025-03-26 session (they were removed in MCP 2025-06-18); send one message per POST",
            )
        }
    };
    if batch.is_empty() {
        return refuse("an empty batch");
    }
    if batch.len() > MAX_BATCH {
        return refuse(&format!("a batch holds at most {MAX_BATCH} messages"));
    }
    let answers = futures::future::join_all(batch.into_iter().map(|message| {
        let ctx = &ctx;
        async move {
            match Incoming::from_value(message) {
                Err((id, e)) => Some(jsonrpc::error_response(&id, &e)),
                Ok(Incoming::Notification { method, params }) => {
                    notified(mcp, Some(ctx), &method, &params).await;
                    None
                }
                Ok(Incoming::Response) => None,
                Ok(Incoming::Request { id, method, .. }) if method == "initialize" => {
                    let e = RpcError::new(
                        INVALID_REQUEST,
                        "initialize must not be part of a JSON-RPC batch",
                    );
                    Some(jsonrpc::error_response(&id, &e))
                }
                Ok(Incoming::Request { id, method, params }) => {
                    let span = info_span!("mcp", ?method, session = ctx.session.as_deref().unwrap_or(""), version = %ctx.version, batch = true);
                    let answer = dispatch(mcp, ctx, &id, &method, &params, None)
                        .instrument(span)
                        .await;
                    answer_message(&id, ctx, answer)
                }
            }
        }
    }))
    .await;
    let answers: Vec<Value> = answers.into_iter().flatten().collect();
    if answers.is_empty() {
        StatusCode::ACCEPTED.into_response()
    } else {
        Json(Value::Array(answers)).into_response()
    }
}

/// The JSON-RPC answer; `None` when the client is gone.
fn answer_message(
    id: &Value,
    ctx: &Context,
    answer: Result<Option<Value>, RpcError>,
) -> Option<Value> {
    match answer {
        Ok(Some(mut result)) => {
            // 2026-07-28 results say whether they are final.
            if ctx.stateless() {
                if let Some(object) = result.as_object_mut() {
                    object.insert("resultType".into(), json!("complete"));
                }
            }
            Some(jsonrpc::response(id, result))
        }
        Ok(None) => None,
        Err(e) => Some(jsonrpc::error_response(id, &e)),
    }
}

fn capabilities(tasks: bool) -> Value {
    let mut caps = json!({"tools": {"listChanged": false}});
    if tasks {
        caps["tasks"] = json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}});
    }
    caps
}

fn server_info() -> Value {
    json!({"name": "ferry", "title": "Ferry", "version": env!("CARGO_PKG_VERSION")})
}

const INSTRUCTIONS: &str = "Tools run through Ferry, a durable tool runtime: every call is \
    recorded in a thread, some wait for a human reviewer's approval, and a result starting \
    with 'Error: ' reports a failure.";

/// The 2025 handshake: negotiates the revision and opens a session. Its
/// params are what every revision's schema requires of them; without them
/// no session opens.
async fn initialize(
    mcp: &Mcp,
    identity: &Identity,
    id: &Value,
    params: &Map<String, Value>,
) -> Response {
    let requested = params.get("protocolVersion").and_then(Value::as_str);
    let object = |key: &str| params.get(key).is_some_and(Value::is_object);
    if requested.is_none() || !object("capabilities") || !object("clientInfo") {
        let e = RpcError::invalid_params(
            "initialize needs params with protocolVersion (a string), capabilities and \
             clientInfo (objects)",
        );
        return error_reply(id, &e);
    }
    let version = session::negotiate(requested);
    let session = match mcp.config.sessions.open(version, identity.name()).await {
        Ok(session) => session,
        Err(e) => return error_reply(id, &session::unavailable(&e)),
    };
    tracing::info!(session = %session, version, "MCP session opened");
    let result = json!({
        "protocolVersion": version,
        "capabilities": capabilities(version == HANDSHAKE_VERSIONS[0]),
        "serverInfo": server_info(),
        "instructions": INSTRUCTIONS,
    });
    let mut response = Json(jsonrpc::response(id, result)).into_response();
    if let Ok(value) = HeaderValue::from_str(&session) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    response
}

/// Takes a notification: `notifications/cancelled` in a session cancels
/// the call it names; the rest (`notifications/initialized`, …) need
/// nothing.
async fn notified(mcp: &Mcp, ctx: Option<&Context>, method: &str, params: &Map<String, Value>) {
    tracing::debug!(?method, "MCP notification");
    if method != "notifications/cancelled" {
        return;
    }
    if let Some(Context {
        session: Some(session),
        identity,
        ..
    }) = ctx
    {
        let perform = &*mcp.perform;
        mcp.running
            .cancelled(perform, identity, session, params)
            .await;
    }
}

/// Runs request `id`. `stream` is the SSE channel when the answer streams.
async fn dispatch(
    mcp: &Mcp,
    ctx: &Context,
    id: &Value,
    method: &str,
    params: &Map<String, Value>,
    stream: Option<&mpsc::Sender<Value>>,
) -> Result<Option<Value>, RpcError> {
    let engine = &mcp.engine;
    match method {
        "ping" => Ok(Some(json!({}))),
        "server/discover" => Ok(Some(json!({
            "supportedVersions": session::supported_versions(),
            "capabilities": capabilities(false),
            "serverInfo": server_info(),
            "instructions": INSTRUCTIONS,
            "ttlMs": 0,
            "cacheScope": "private",
            // Where the 2026-07-28 SDKs read the server's identity.
            "_meta": {"io.modelcontextprotocol/serverInfo": server_info()},
        }))),
        "tools/list" => {
            let mut tools = tools::list(engine, ctx, params)?;
            if ctx.stateless() {
                // 2026-07-28 caching hints: toolsets change at any time.
                tools["ttlMs"] = json!(0);
                tools["cacheScope"] = json!("private");
            }
            Ok(Some(tools))
        }
        "tools/call" => call(mcp, ctx, id, params, stream).await,
        "tasks/get" if ctx.tasks() => tasks::get(engine, ctx, params).await.map(Some),
        "tasks/result" if ctx.tasks() => tasks::result(engine, ctx, params, stream).await,
        "tasks/list" if ctx.tasks() => tasks::list(engine, ctx, params).await.map(Some),
        "tasks/cancel" if ctx.tasks() => tasks::cancel(engine, ctx, &*mcp.perform, params)
            .await
            .map(Some),
        other => Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!("Method not found: {other}"),
        )),
    }
}

/// Whether the tool `name` resolves to is annotated `longRunning` (it
/// takes tasks); `None` when no tool answers to `name`.
fn long_running(engine: &Engine, name: &str) -> Option<bool> {
    let qualified = engine.registry().resolve(name).ok()?.qualified;
    engine.registry().list().iter().find_map(|toolset| {
        let s = &toolset.stored;
        s.manifest.tools.iter().find_map(|tool| {
            (format!("{}.{}@{}", s.name, tool.name, s.version) == qualified).then(|| {
                tool.annotations
                    .as_ref()
                    .and_then(|a| a.long_running)
                    .unwrap_or(false)
            })
        })
    })
}

async fn call(
    mcp: &Mcp,
    ctx: &Context,
    request: &Value,
    params: &Map<String, Value>,
    stream: Option<&mpsc::Sender<Value>>,
) -> Result<Option<Value>, RpcError> {
    let engine = &mcp.engine;
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params("tools/call needs params.name, a string"))?;
    // 2025-11-25: `task` is an object (`{ttl?}`); a client that sent
    // something else meant a task and must not block on a plain call.
    let as_task = match params.get("task") {
        Some(Value::Object(_)) => ctx.tasks(),
        None | Some(Value::Null) => false,
        Some(_) if ctx.tasks() => {
            return Err(RpcError::invalid_params(
                "params.task must be an object ({\"ttl\"?: number})",
            ))
        }
        Some(_) => false,
    };
    // By any name the tool answers to (bare, `Toolset.tool`, `…@1.2.3`);
    // an unknown tool goes on to the unknown-tool error.
    if as_task && long_running(engine, name) == Some(false) {
        // The tool's taskSupport is "forbidden": Method not found.
        return Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!(
                "tool {name:?} does not support task-augmented execution (only tools annotated longRunning do)"
            ),
        ));
    }
    // A client that names the call (`_meta["io.ferry/id"]`) may retry it:
    // the same id and arguments attach to the same durable call.
    let named = params
        .get("_meta")
        .and_then(|m| m.get(tools::CALL_ID_META))
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| RpcError::invalid_params("_meta.io.ferry/id must be a string"))
        })
        .transpose()?;
    let id = match (as_task, named) {
        (false, Some(id)) => id,
        (true, Some(id)) => format!("{}{id}", tasks::CALL_PREFIX),
        (false, None) => format!("mcp-{}", uuid::Uuid::new_v4().simple()),
        (true, None) => format!("{}{}", tasks::CALL_PREFIX, uuid::Uuid::new_v4().simple()),
    };
    let accepted = match tools::submit(&*mcp.perform, ctx, name, params, id).await? {
        tools::Submitted::Refused(result) => return Ok(Some(result)),
        tools::Submitted::Call(accepted) => accepted,
    };
    if as_task {
        return tasks::created(engine, ctx, &accepted).await.map(Some);
    }
    let tracked = ctx
        .session
        .as_deref()
        .map(|session| mcp.running.track(session, request, &accepted));
    let token = params
        .get("_meta")
        .and_then(|m| m.get("progressToken"))
        .filter(|t| t.is_string() || t.is_number());
    let settled = tools::wait(engine, &accepted, stream, token).await?;
    if tracked.is_some_and(|t| t.cancelled()) {
        // "Receivers … SHOULD … not send a response for the cancelled
        // request."
        return Ok(None);
    }
    Ok(settled.map(|call| tools::result(&call, &accepted.group_id)))
}

/// Ferry opens no server-initiated stream: every answer travels on the
/// POST that asked for it.
async fn no_stream(State(mcp): State<Arc<Mcp>>, headers: HeaderMap) -> Response {
    if let Err(e) = security::check(&mcp.config, &headers) {
        return error_reply(&Value::Null, &e);
    }
    let mut response = StatusCode::METHOD_NOT_ALLOWED.into_response();
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST, DELETE"));
    response
}

/// `DELETE /mcp` ends the session it names (its thread stays).
async fn end_session(State(mcp): State<Arc<Mcp>>, headers: HeaderMap) -> Response {
    let identity = match security::check(&mcp.config, &headers) {
        Ok(identity) => identity,
        Err(e) => return error_reply(&Value::Null, &e),
    };
    let Some(id) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) else {
        let e = RpcError::transport(
            400,
            INVALID_REQUEST,
            "Bad Request: no Mcp-Session-Id header",
        );
        return error_reply(&Value::Null, &e);
    };
    // Only its holder ends a session; to anyone else it is not there.
    let held = match mcp.config.sessions.get(id).await {
        Ok(session) => session.is_some_and(|s| s.holder == identity.name()),
        Err(e) => return error_reply(&Value::Null, &session::unavailable(&e)),
    };
    let closed = match held {
        true => mcp.config.sessions.close(id).await,
        false => Ok(false),
    };
    match closed {
        Ok(true) => {
            tracing::info!(session = id, "MCP session ended");
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => {
            let e = RpcError::transport(404, jsonrpc::SESSION_NOT_FOUND, "Session not found");
            error_reply(&Value::Null, &e)
        }
        Err(e) => error_reply(&Value::Null, &session::unavailable(&e)),
    }
}
