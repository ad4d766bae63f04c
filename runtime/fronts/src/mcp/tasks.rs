//! 2025-11-25 task augmentation for tools annotated `longRunning`: the task
//! is the durable Ferry call itself, so its id names the call and any node
//! can answer for it, and a client that went away comes back for the result.

use base64::Engine as _;
use ferry_proto::api::CallStatus;
use serde_json::{json, Map, Value};

use super::jsonrpc::RpcError;
use super::session::Context;
use super::tools::{self, Accepted};
use crate::engine::{Engine, Error};
use crate::thread::CallRecord;

/// Call ids of task-augmented calls start with this: `tasks/list` shows them.
pub const CALL_PREFIX: &str = "mcp-task-";
/// Suggested milliseconds between `tasks/get` polls.
const POLL_INTERVAL_MS: u64 = 1000;

/// `base64url(JSON [group_id, call id])`.
pub fn task_id(group_id: &str, id: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json!([group_id, id]).to_string())
}

fn parse_task_id(params: &Map<String, Value>) -> Result<Accepted, RpcError> {
    let raw = params
        .get("taskId")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params("taskId (a string) is required"))?;
    let unknown =
        || RpcError::invalid_params(format!("Failed to retrieve task: unknown taskId {raw:?}"));
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(raw)
        .map_err(|_| unknown())?;
    let (group_id, id): (String, String) = serde_json::from_slice(&bytes).map_err(|_| unknown())?;
    if !id.starts_with(CALL_PREFIX) {
        return Err(unknown());
    }
    Ok(Accepted { group_id, id })
}

fn may_follow_tasks(ctx: &Context) -> bool {
    use crate::identity::Scope;
    ctx.identity.may(Scope::Read) || ctx.identity.may(Scope::Submit)
}

/// The task's call, if `ctx`'s identity may see its thread: another
/// identity's task is as unknown as one that never was.
async fn load(engine: &Engine, ctx: &Context, task: &Accepted) -> Result<CallRecord, RpcError> {
    let unknown = || {
        RpcError::invalid_params(format!(
            "Failed to retrieve task: no call {:?} in thread {:?}",
            task.id, task.group_id
        ))
    };
    // A task is read by who submits calls (its own) or reads threads; a
    // reviewer or an administrator reaches every thread, and reads none.
    let visible = may_follow_tasks(ctx)
        && engine
            .may_act_in(&ctx.identity, &task.group_id)
            .await
            .map_err(|e| RpcError::internal(e.to_string()))?;
    if !visible {
        return Err(unknown());
    }
    engine
        .call(&task.group_id, &task.id)
        .await
        .map_err(|e| match e {
            Error::NotFound(_) | Error::InvalidRequest(_) => unknown(),
            other => RpcError::internal(other.to_string()),
        })
}

/// The MCP `Task` of a call.
pub fn view(group_id: &str, call: &CallRecord) -> Value {
    let (status, message) = match call.status {
        _ if tools::settled(call) => {
            let failed = call.result.as_ref().is_none_or(|r| r.is_error);
            match call.status {
                CallStatus::Cancelled => ("cancelled", "the call was cancelled"),
                _ if failed => ("failed", "the call ended with an error result"),
                _ => ("completed", "the call has its result"),
            }
        }
        CallStatus::PendingApproval => ("working", "waiting for a reviewer's approval"),
        CallStatus::AwaitingAuth => ("working", "waiting for the user to authorize"),
        CallStatus::AwaitingUser => ("working", "waiting for the user's choice"),
        _ => ("working", "running"),
    };
    json!({
        "taskId": task_id(group_id, &call.id),
        "status": status,
        "statusMessage": message,
        "createdAt": call.created_at,
        "lastUpdatedAt": call.updated_at,
        // Durable calls are kept: the result never expires.
        "ttl": null,
        "pollInterval": POLL_INTERVAL_MS,
    })
}

/// `tools/call` with `task`: answers at once with the task.
pub async fn created(engine: &Engine, ctx: &Context, call: &Accepted) -> Result<Value, RpcError> {
    let record = load(engine, ctx, call).await?;
    Ok(json!({"task": view(&call.group_id, &record)}))
}

pub async fn get(
    engine: &Engine,
    ctx: &Context,
    params: &Map<String, Value>,
) -> Result<Value, RpcError> {
    let task = parse_task_id(params)?;
    Ok(view(&task.group_id, &load(engine, ctx, &task).await?))
}

/// `tasks/result`: blocks until the call settles, then its `CallToolResult`.
pub async fn result(
    engine: &Engine,
    ctx: &Context,
    params: &Map<String, Value>,
    stream: Option<&tokio::sync::mpsc::Sender<Value>>,
) -> Result<Option<Value>, RpcError> {
    let task = parse_task_id(params)?;
    load(engine, ctx, &task).await?;
    let waited = tools::wait(engine, &task, stream, None).await?;
    Ok(waited.map(|call| {
        let mut value = tools::result(&call, &task.group_id);
        value["_meta"]["io.modelcontextprotocol/related-task"] =
            json!({"taskId": task_id(&task.group_id, &call.id)});
        value
    }))
}

/// `tasks/list`: the task-augmented calls of the request's thread (the
/// session's, or the one `_meta` names), oldest first.
pub async fn list(
    engine: &Engine,
    ctx: &Context,
    params: &Map<String, Value>,
) -> Result<Value, RpcError> {
    let explicit = params
        .get("_meta")
        .and_then(|m| m.get(tools::GROUP_ID_META))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let after = tools::cursor(params)?;
    let invalid = |after: &str| {
        RpcError::invalid_params(format!("invalid cursor: it names no task ({after:?})"))
    };
    let Some(group_id) = explicit.or_else(|| ctx.session_thread()) else {
        return match after {
            Some(after) => Err(invalid(&after)),
            None => Ok(json!({"tasks": []})),
        };
    };
    let visible = may_follow_tasks(ctx)
        && engine
            .may_act_in(&ctx.identity, &group_id)
            .await
            .map_err(|e| RpcError::internal(e.to_string()))?;
    if !visible {
        // Another identity's thread lists like an empty one.
        return match after {
            Some(after) => Err(invalid(&after)),
            None => Ok(json!({"tasks": []})),
        };
    }
    let calls = match engine.calls(&group_id).await {
        Ok(calls) => calls,
        Err(Error::InvalidRequest(m)) => return Err(RpcError::invalid_params(m)),
        Err(e) => return Err(RpcError::internal(e.to_string())),
    };
    let tasks: Vec<&CallRecord> = calls
        .iter()
        .filter(|c| c.id.starts_with(CALL_PREFIX))
        .collect();
    // The cursor is the last call id of the page before.
    let start = match &after {
        None => 0,
        Some(after) => {
            tasks
                .iter()
                .position(|c| c.id == *after)
                .ok_or_else(|| invalid(after))?
                + 1
        }
    };
    let rest = &tasks[start..];
    let page = &rest[..rest.len().min(tools::PAGE_SIZE)];
    let mut result = json!({"tasks": page.iter().map(|c| view(&group_id, c)).collect::<Vec<_>>()});
    if let (true, Some(last)) = (rest.len() > page.len(), page.last()) {
        result["nextCursor"] = json!(tools::next_cursor(&last.id));
    }
    Ok(result)
}

/// `tasks/cancel`: cancels the durable call through `perform`, like a
/// native `DELETE` (Ferry tells the tool).
pub async fn cancel(
    engine: &std::sync::Arc<Engine>,
    ctx: &Context,
    perform: &dyn crate::http::Perform,
    params: &Map<String, Value>,
) -> Result<Value, RpcError> {
    let task = parse_task_id(params)?;
    let record = load(engine, ctx, &task).await?;
    if tools::settled(&record) {
        return Err(RpcError::invalid_params(format!(
            "Cannot cancel task: it is already {}",
            view(&task.group_id, &record)["status"]
                .as_str()
                .unwrap_or("finished")
        )));
    }
    let request = crate::engine::requests::Request::CancelCall {
        group_id: task.group_id.clone(),
        id: task.id.clone(),
    };
    match perform.perform(&ctx.identity, request).await {
        Ok(crate::engine::requests::Reply::Call { call }) => Ok(view(&task.group_id, &call)),
        Ok(_) => Ok(view(&task.group_id, &load(engine, ctx, &task).await?)),
        Err(e) => {
            let e = crate::http::ApiError::from(e);
            if e.status.is_client_error() {
                Err(RpcError::invalid_params(format!(
                    "Cannot cancel task: {}",
                    e.body.error.message
                )))
            } else {
                Err(RpcError::internal(e.body.error.message))
            }
        }
    }
}
