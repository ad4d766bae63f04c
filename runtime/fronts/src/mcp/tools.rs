//! `tools/list` and `tools/call`: Ferry's registered tools as MCP tools, and
//! an MCP call as a Ferry call on the same durable path as `POST /v1/calls`.

use std::time::Duration;

use base64::Engine as _;
use ferry_proto::api::{CallStatus, SubmitCall};
use ferry_proto::rap::ContentItem;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tracing::{info, instrument};

use super::jsonrpc::{self, RpcError};
use super::session::Context;
use crate::engine::{Engine, Error};
use crate::http::Perform;
use crate::thread::CallRecord;
use crate::toolsets::{cancel_subscription_schema, CANCEL_SUBSCRIPTION};

/// Tools per `tools/list` page.
pub const PAGE_SIZE: usize = 50;

/// `_meta` keys a client may set on `tools/call` to place the call.
pub const GROUP_ID_META: &str = "io.ferry/group_id";
pub const ANCESTORS_META: &str = "io.ferry/thread_ancestors";
pub const USER_ID_META: &str = "io.ferry/user_id";
/// `_meta` key naming the Ferry call: set by the client on `tools/call` to
/// make a retry idempotent, and on every result.
pub const CALL_ID_META: &str = "io.ferry/id";

/// How often a waiting call with a `progressToken` reports progress even
/// when nothing changed, so the client knows it is still waiting.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// Every tool as MCP lists it, sorted by name: the latest version of each
/// toolset's tools (bare name, or `Toolset.tool` where bare names clash) and
/// the built-in `cancel_subscription`.
pub fn all(engine: &Engine, ctx: &Context) -> Vec<Value> {
    // As `GET /v1/tools`: who neither submits nor reads (a reviewer, an
    // administrator) may call nothing, and is shown nothing.
    use crate::identity::Scope;
    if !(ctx.identity.may(Scope::Read) || ctx.identity.may(Scope::Submit)) {
        return vec![];
    }
    let mut tools = vec![json!({
        "name": CANCEL_SUBSCRIPTION,
        "description": "Cancel an active subscription of this thread, named by the call that opened it.",
        "inputSchema": cancel_subscription_schema(),
        "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true},
    })];
    let registered = engine.toolsets_for(&ctx.identity);
    for toolset in &registered {
        let versions = registered.iter().filter(|t| t.name == toolset.name);
        let latest = crate::toolsets::latest_by(versions, |t| &t.version);
        if latest.map(|t| &t.version) != Some(&toolset.version) {
            continue;
        }
        for tool in &toolset.tools {
            let name = if toolset.available.contains(&tool.name) {
                tool.name.clone()
            } else {
                format!("{}.{}", toolset.name, tool.name)
            };
            let description = if tool.description.trim().is_empty() {
                format!("{} (toolset {})", tool.name, toolset.name)
            } else {
                tool.description.clone()
            };
            let mut entry = json!({
                "name": name,
                "description": description,
                "inputSchema": object_schema(&tool.input_schema),
                "_meta": {"io.ferry/qualified": tool.qualified},
            });
            let a = tool.annotations.clone().unwrap_or_default();
            let mut hints = Map::new();
            for (key, value) in [
                ("readOnlyHint", a.read_only),
                ("destructiveHint", a.destructive),
                ("idempotentHint", a.idempotent),
            ] {
                if let Some(v) = value {
                    hints.insert(key.into(), json!(v));
                }
            }
            if !hints.is_empty() {
                entry["annotations"] = Value::Object(hints);
            }
            if ctx.tasks() && a.long_running == Some(true) {
                entry["execution"] = json!({"taskSupport": "optional"});
            }
            tools.push(entry);
        }
    }
    tools.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    tools
}

/// A tool's `inputSchema` as MCP lists it: MCP's schema requires
/// `"type": "object"`, which a RAP schema may leave out (`{}` for a tool
/// taking nothing), and clients that check it (the TypeScript SDK) refuse
/// the whole list over one such tool. Arguments are objects either way.
fn object_schema(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object
            .entry("type")
            .or_insert_with(|| Value::String("object".into()));
    }
    schema
}

/// One page of `tools/list`. The cursor is the last name of the previous
/// page, so pages stay consistent when toolsets change in between.
pub fn list(
    engine: &Engine,
    ctx: &Context,
    params: &Map<String, Value>,
) -> Result<Value, RpcError> {
    let after = cursor(params)?;
    let tools: Vec<Value> = all(engine, ctx)
        .into_iter()
        .filter(|t| {
            after
                .as_deref()
                .is_none_or(|a| t["name"].as_str() > Some(a))
        })
        .collect();
    let more = tools.len() > PAGE_SIZE;
    let page: Vec<Value> = tools.into_iter().take(PAGE_SIZE).collect();
    let mut result = json!({"tools": page});
    if more {
        let last = page.last().and_then(|t| t["name"].as_str()).unwrap_or("");
        result["nextCursor"] = json!(next_cursor(last));
    }
    Ok(result)
}

/// What a list request's `cursor` says: the key of the last item of the
/// page before (none for the first page). "Invalid cursors SHOULD result
/// in an error with code -32602 (Invalid params)."
pub fn cursor(params: &Map<String, Value>) -> Result<Option<String>, RpcError> {
    match params.get("cursor") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(c)) => base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(c)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .map(Some)
            .ok_or_else(|| RpcError::invalid_params(format!("invalid cursor {c:?}"))),
        Some(_) => Err(RpcError::invalid_params("cursor must be a string")),
    }
}

/// The `nextCursor` of a page whose last item has key `last`.
pub fn next_cursor(last: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(last)
}

/// Where an MCP call goes: the thread `_meta` names; else, for a call the
/// client named, a thread named after that id; else the session's, or
/// (stateless) a thread of its own.
pub struct Placement {
    pub group_id: String,
    pub thread_ancestors: Option<Vec<String>>,
    pub user_id: Option<String>,
}

pub fn placement(ctx: &Context, params: &Map<String, Value>) -> Result<Placement, RpcError> {
    let meta = params.get("_meta").and_then(Value::as_object);
    let get = |key: &str| meta.and_then(|m| m.get(key)).filter(|v| !v.is_null());
    let string = |key: &str| match get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(RpcError::invalid_params(format!(
            "_meta.{key} must be a string"
        ))),
    };
    let thread_ancestors = match get(ANCESTORS_META) {
        None => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|i| i.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    RpcError::invalid_params(format!("_meta.{ANCESTORS_META} must be strings"))
                })?,
        ),
        Some(_) => {
            return Err(RpcError::invalid_params(format!(
                "_meta.{ANCESTORS_META} must be an array of strings"
            )))
        }
    };
    // A call the client named has a thread named after it, in a session
    // too: its retry meets the call (one dispatch) from any session, also
    // from the new one a client opens after Ferry restarted.
    let group_id = match (
        string(GROUP_ID_META)?,
        string(CALL_ID_META)?,
        ctx.session_thread(),
    ) {
        (Some(g), _, _) => g,
        (None, Some(id), _) => format!("mcp-call-{}", named_thread(&id)),
        (None, None, Some(session)) => session,
        (None, None, None) => format!("mcp-call-{}", uuid::Uuid::new_v4().simple()),
    };
    Ok(Placement {
        group_id,
        thread_ancestors,
        user_id: string(USER_ID_META)?,
    })
}

/// The thread part of a stateless call named `id`: a digest, since an id
/// may be as long as a thread name may.
fn named_thread(id: &str) -> String {
    crate::digest::sha256_hex(id, 16)
}

/// A call Ferry accepted for an MCP request.
#[derive(Clone)]
pub struct Accepted {
    pub group_id: String,
    pub id: String,
}

/// What `tools/call` submits, or the answer it gives without a call.
pub enum Submitted {
    Call(Accepted),
    /// The arguments broke the tool's schema: a tool error, so the model can
    /// correct itself; nothing was recorded.
    Refused(Value),
}

/// Submits the call like `POST /v1/calls` (`http::submit_call`: detached
/// from the client's connection, answered once decided and durable).
#[instrument(skip_all, fields(group_id, call_id = ?id, tool = ?name))]
pub async fn submit(
    perform: &dyn Perform,
    ctx: &Context,
    name: &str,
    params: &Map<String, Value>,
    id: String,
) -> Result<Submitted, RpcError> {
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(a)) => Value::Object(a.clone()),
        Some(_) => return Err(RpcError::invalid_params("arguments must be an object")),
    };
    let place = placement(ctx, params)?;
    tracing::Span::current().record("group_id", place.group_id.as_str());
    let request = SubmitCall {
        operation: name.to_owned(),
        arguments,
        group_id: place.group_id.clone(),
        id: Some(id.clone()),
        call_id: None,
        user_id: place.user_id,
        thread_ancestors: place.thread_ancestors,
    };
    match crate::http::submit_call(perform, &ctx.identity, request).await {
        Ok(id) => {
            info!("MCP call accepted");
            Ok(Submitted::Call(Accepted {
                group_id: place.group_id,
                id,
            }))
        }
        Err(Error::UnknownTool(m) | Error::AmbiguousTool(m)) => Err(RpcError::invalid_params(
            format!("Unknown tool {name:?}: {m}"),
        )),
        Err(Error::InvalidArguments(errors)) => {
            let listed: Vec<String> = errors
                .iter()
                .map(|(param, why)| {
                    let why = why.as_str().map_or_else(|| why.to_string(), str::to_owned);
                    let param = if param.is_empty() {
                        "(arguments)"
                    } else {
                        param
                    };
                    format!("{param}: {why}")
                })
                .collect();
            let text = format!("Error: invalid arguments for {name}: {}", listed.join("; "));
            Ok(Submitted::Refused(json!({
                "content": [{"type": "text", "text": text}],
                "isError": true,
                "_meta": {"io.ferry/parameter_errors": errors},
            })))
        }
        Err(Error::InvalidRequest(m)) => Err(RpcError::invalid_params(m)),
        Err(Error::Rejected(r @ crate::thread::Rejection::Conflict(_))) => {
            Err(RpcError::invalid_params(format!(
                "{r}: a call of this id exists with other arguments"
            )))
        }
        Err(Error::Rejected(r)) => Ok(Submitted::Refused(json!({
            "content": [{"type": "text", "text": format!("Error: {r}")}],
            "isError": true,
        }))),
        // Refusals of this caller, not faults: a tool error the model
        // can read, as a refused call in the thread is.
        Err(e @ (Error::Forbidden(_) | Error::RateLimited { .. })) => {
            Ok(Submitted::Refused(json!({
                "content": [{"type": "text", "text": format!("Error: {e}")}],
                "isError": true,
            })))
        }
        Err(e @ (Error::Store(_) | Error::Bus(_))) => Err(RpcError::internal(format!(
            "{e}: Ferry could not record the call and nothing changed; retry the same request"
        ))),
        Err(e) => Err(RpcError::internal(e.to_string())),
    }
}

/// Whether the agent has its answer: a result, or an end without one.
pub fn settled(call: &CallRecord) -> bool {
    call.result.is_some()
        || matches!(
            call.status,
            CallStatus::Completed
                | CallStatus::Failed
                | CallStatus::Cancelled
                | CallStatus::Rejected
        )
}

/// What a waiting call is doing, in words for progress notifications.
fn describe(call: &CallRecord) -> String {
    match call.status {
        CallStatus::PendingApproval => format!(
            "waiting for a reviewer to approve {} (until {})",
            call.tool,
            call.approval_deadline
                .map_or_else(|| "the approval timeout".to_owned(), |d| d.to_string())
        ),
        CallStatus::Queued => "queued for dispatch".into(),
        CallStatus::Dispatched => "running".into(),
        CallStatus::AwaitingAuth => format!(
            "waiting for the user to authorize at {}",
            call.auth_url.as_deref().unwrap_or("the tool's link")
        ),
        CallStatus::AwaitingUser => "waiting for the user's choice".into(),
        other => format!("{other:?}"),
    }
}

/// Waits for the call's answer, as long as it takes (no protocol timeout).
/// With a progress token and a stream to the client, reports each change of
/// the call's state and a heartbeat; gives up waiting (not the call) when
/// the client's stream closes (`Ok(None)`), or with an error naming the
/// call when Ferry stops.
#[instrument(skip_all, fields(group_id = ?call.group_id, call_id = ?call.id))]
pub async fn wait(
    engine: &Engine,
    call: &Accepted,
    stream: Option<&mpsc::Sender<Value>>,
    token: Option<&Value>,
) -> Result<Option<CallRecord>, RpcError> {
    let mut last: Option<CallStatus> = None;
    let mut step = 0u64;
    loop {
        let waited = engine.wait_for_call(&call.group_id, &call.id, HEARTBEAT, |c| {
            settled(c) || Some(c.status) != last
        });
        let record = match stream {
            Some(tx) => tokio::select! {
                r = waited => r,
                () = tx.closed() => return Ok(None),
            },
            None => waited.await,
        }
        .map_err(|e| RpcError::internal(e.to_string()))?;
        if settled(&record) {
            return Ok(Some(record));
        }
        if engine.readers_stopped() {
            return Err(stopping(call));
        }
        if let (Some(token), Some(tx)) = (token, stream) {
            step += 1;
            let note = jsonrpc::notification(
                "notifications/progress",
                json!({"progressToken": token, "progress": step, "message": describe(&record)}),
            );
            if tx.send(note).await.is_err() {
                return Ok(None);
            }
        }
        last = Some(record.status);
    }
}

/// The answer to a wait cut short by Ferry stopping: the call goes on, and
/// the error says where its result will be.
fn stopping(call: &Accepted) -> RpcError {
    RpcError::new(
        jsonrpc::SERVER_STOPPING,
        format!(
            "Ferry is stopping; call {:?} goes on, and its result will be in thread {:?} \
             once Ferry is back",
            call.id, call.group_id
        ),
    )
    .with_data(json!({"group_id": call.group_id, "id": call.id}))
}

/// The `CallToolResult` of a settled call: its content (text, and image
/// items from RAP `content`), `isError` for error results.
pub fn result(call: &CallRecord, group_id: &str) -> Value {
    let (content, is_error) = match &call.result {
        Some(r) => {
            let mut items: Vec<Value> = r
                .content
                .iter()
                .flatten()
                .map(|item| match item {
                    ContentItem::Text { text } => json!({"type": "text", "text": text}),
                    ContentItem::Image { data, media_type } => {
                        json!({"type": "image", "data": data, "mimeType": media_type})
                    }
                })
                .collect();
            let has_text = items.iter().any(|i| i["type"] == "text");
            if !has_text && (!r.text.is_empty() || items.is_empty()) {
                items.insert(0, json!({"type": "text", "text": r.text}));
            }
            (items, r.is_error)
        }
        None => {
            let text = match call.status {
                CallStatus::Cancelled => "Error: the call was cancelled".to_owned(),
                CallStatus::Rejected => "Error: the call was rejected".to_owned(),
                _ => "Error: the call ended without a result".to_owned(),
            };
            (vec![json!({"type": "text", "text": text})], true)
        }
    };
    json!({
        "content": content,
        "isError": is_error,
        "_meta": {GROUP_ID_META: group_id, CALL_ID_META: call.id},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPTLY: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn an_mcp_wait_on_a_call_ends_with_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(ferry_store_sled::SledStore::open(dir.path()).unwrap());
        let engine = ferry_engine::testing::queued(store).await;
        engine.stop_readers();
        let accepted = Accepted {
            group_id: "g".into(),
            id: "c1".into(),
        };
        let waited = wait(&engine, &accepted, None, None);
        let error = tokio::time::timeout(PROMPTLY, waited)
            .await
            .expect("answered at once")
            .expect_err("an error, not a result");
        assert_eq!(error.code, jsonrpc::SERVER_STOPPING);
        assert!(error.message.contains("\"c1\""), "{}", error.message);
        assert_eq!(
            error.data,
            Some(serde_json::json!({"group_id": "g", "id": "c1"}))
        );
    }
}
