//! `POST /oxp/tools/call`: an OXP call made a Ferry call through the same
//! `Perform` path as `POST /v1/calls` (`http::submit_call`: validated,
//! gated, persisted, dispatched, deduped), then answered with its result
//! once it settles.
//!
//! Thread rule: a call runs in thread `oxp-user-{context.user_id}`, or in
//! `oxp-anonymous` without a user id. The OXP `call_id` is the Ferry call
//! `id` (generated when absent), so a repeat in the same thread attaches to
//! the same durable call. A call not settled within the wait (a gated call
//! waiting for its reviewer, a slow tool) is answered `success: false`,
//! `can_retry: true`: retrying with the same `call_id` picks it up.
//!
//! A call Ferry could not get to its tool (unreachable, kept failing, lost)
//! is answered `can_retry: true` too, and OXP says a client "SHOULD retry"
//! then, with the same request. The call under that id stays failed (one
//! outcome per call), so such a retry runs the call again as a new Ferry
//! call, a *rerun*, whose id derives from the `call_id` and the rerun's
//! number and whose `call_id` field is the client's; the answer names the
//! client's `call_id`. At most [`MAX_RERUNS`] reruns per `call_id`.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferry_proto::api::{CallStatus, SubmitCall};
use serde_json::{json, Map, Value};
use tracing::{info, instrument, Instrument};

use super::names::{names_operation, valid_tool_id, Index, NotFound};
use super::wire::{request_validator, supported_schema, OxpError, SCHEMA};
use super::Oxp;
use crate::engine::Error;
use crate::identity::Identity;
use crate::thread::{CallRecord, Rejection, Submission};

/// The thread of an OXP call.
pub fn thread_of(user_id: Option<&str>) -> String {
    match user_id {
        Some(user) => format!("oxp-user-{user}"),
        None => "oxp-anonymous".to_owned(),
    }
}

/// Waits for the reviewer or the tool; the rest is for `call_id` retries.
const RETRY_AFTER_MS: u64 = 1000;

/// How many times one `call_id` is run again after transient failures.
pub const MAX_RERUNS: u32 = 5;

/// How Ferry's failures start when another try may succeed: the tool
/// could not be reached, kept failing (5xx), took no attempt left after a
/// restart, or was lost by its tool server. A refusal (4xx) or a result
/// too large to record would end the same way again.
const TRANSIENT: [&str; 4] = [
    "Error: the tool could not be reached",
    "Error: the tool kept failing",
    "Error: the tool did not acknowledge",
    crate::thread::LOST_CALL_TEXT,
];

/// Whether a call failed in a way another try may not.
fn failed_transiently(call: &CallRecord) -> bool {
    call.status == CallStatus::Failed && call.result.as_ref().is_some_and(|r| transient(&r.text))
}

fn transient(failure: &str) -> bool {
    TRANSIENT.iter().any(|t| failure.starts_with(t))
}

/// What every rerun's id starts with; no client's `call_id` may, so that
/// no client can take a rerun's id (they are derived, so computable) and
/// block another client's retries in a shared thread.
const RERUN_PREFIX: &str = "oxp-rerun-";

/// The id of rerun `n` of `call_id`: fixed length whatever the
/// `call_id`'s.
fn rerun_id(call_id: &str, n: u32) -> String {
    format!(
        "{RERUN_PREFIX}{}-{n}",
        crate::digest::sha256_hex(call_id, 12)
    )
}

pub async fn call(State(oxp): State<Arc<Oxp>>, req: Request) -> Response {
    match handle(&oxp, req).await {
        Ok(result) => (
            StatusCode::OK,
            Json(json!({"$schema": SCHEMA, "result": result})),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

fn bad(message: &str, developer: impl Into<String>) -> OxpError {
    OxpError::server(message, developer)
}

async fn handle(oxp: &Oxp, req: Request) -> Result<Value, OxpError> {
    let headers = req.headers().clone();
    let headers = &headers;
    if let Some(origin) = crate::http::origin::cross_site(&oxp.origins, req.method(), headers) {
        crate::http::origin::warn_refused("origin", origin, req.uri().path());
        return Err(bad(
            "Requests from web pages on other sites are refused",
            format!("Origin {origin:?} is not this server's"),
        ));
    }
    // Credentials before the body: a stranger's upload is not read.
    let caller = oxp.auth.check(headers).map_err(|e| {
        info!(error = %e, "OXP credentials refused");
        OxpError::unauthorized(e.to_string())
    })?;
    let body = crate::http::body::read_bytes(req, oxp.max_body_bytes)
        .await
        .map_err(|e| bad("The request could not be read", e.body.error.message))?;
    let body: Value = serde_json::from_slice(&body).map_err(|e| {
        bad(
            "The request is malformed",
            format!("the body is not JSON: {e}"),
        )
    })?;
    let Value::Object(mut body) = body else {
        return Err(bad(
            "The request is malformed",
            "the body must be a JSON object",
        ));
    };
    match body.get("$schema") {
        None => {}
        Some(Value::String(s)) if supported_schema(s) => {}
        Some(other) => {
            return Err(bad(
                "This version of OXP is not supported",
                format!("$schema {other} is not supported; this server speaks {SCHEMA}"),
            ))
        }
    }
    let request = body
        .remove("request")
        .ok_or_else(|| bad("The request is malformed", "the body has no \"request\""))?;
    let problems: Vec<String> = request_validator()
        .iter_errors(&request)
        .map(|e| format!("request{}: {e}", e.instance_path))
        .collect();
    if !problems.is_empty() {
        return Err(bad("The request is malformed", problems.join("; ")));
    }
    let text = |key: &str| request.get(key).and_then(Value::as_str).map(str::to_owned);
    let tool_id = text("tool_id").unwrap_or_default();
    if !valid_tool_id(&tool_id) {
        return Err(bad(
            &format!("Tool id '{tool_id}' is invalid"),
            "tool_id must match ^[A-Za-z0-9_]+\\.[A-Za-z0-9_]+(@([0-9]+|[0-9]+\\.[0-9]+\\.[0-9]+))?$",
        ));
    }
    let claimed = request
        .get("context")
        .and_then(|c| c.get("user_id"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    // A token issued to a user calls for that user only: the thread (and
    // its grants) is theirs, whatever the body claims.
    let user_id = match (caller.user_id, claimed) {
        (Some(user), Some(claimed)) if claimed != user => {
            return Err(bad(
                "The call is for another user than the credential's",
                format!(
                    "context.user_id {claimed:?} is not the user this token was issued to (its sub)"
                ),
            ))
        }
        (Some(user), _) => Some(user),
        (None, claimed) => claimed,
    };
    let id = text("call_id").unwrap_or_else(|| format!("oxp_{}", uuid::Uuid::new_v4().simple()));
    if id.starts_with(RERUN_PREFIX) {
        return Err(bad(
            "The request is malformed",
            format!("a call_id may not start with {RERUN_PREFIX:?}: Ferry names its reruns so"),
        ));
    }
    let group_id = thread_of(user_id.as_deref());
    let span = tracing::info_span!("oxp_call", group_id = ?group_id, call_id = ?id,
        tool_id = ?tool_id, trace_id = text("trace_id").unwrap_or_default());
    // The call already under this call_id, if any: read once, for the
    // operation and for the reruns.
    let earlier = oxp.engine.call(&group_id, &id).await.ok();
    let operation = match earlier_operation(earlier.as_ref(), &tool_id) {
        Some(operation) => operation,
        None => resolve(oxp, &caller.identity, &tool_id)?,
    };
    let submit = SubmitCall {
        operation,
        arguments: request.get("input").cloned().unwrap_or_else(|| json!({})),
        group_id: group_id.clone(),
        id: Some(id.clone()),
        call_id: Some(id.clone()),
        user_id,
        thread_ancestors: None,
    };
    settle(oxp, &caller.identity, submit, earlier)
        .instrument(span)
        .await
}

/// The native operation that `tool_id` names now (`Toolset.tool@x.y.z`),
/// among the tools `by` may call: another is no tool to it.
fn resolve(oxp: &Oxp, by: &crate::identity::Identity, tool_id: &str) -> Result<String, OxpError> {
    let index = Index::build(&oxp.engine.toolsets_for(by));
    let tool = index.resolve(tool_id).map_err(|e| {
        let developer = match &e {
            NotFound::Version { available, .. } => {
                format!("{tool_id}: available versions are {}", available.join(", "))
            }
            NotFound::Tool(_) => format!("no tool is served as {tool_id}; see GET /oxp/tools"),
        };
        bad(&e.to_string(), developer)
    })?;
    Ok(tool.operation())
}

/// The operation of the call already under this `call_id`, when `tool_id`
/// names it: a retry is answered by that call (or its reruns), as a native
/// retry is, even once a newer version is registered (`tool_id` without a
/// version would now resolve to it) or its own was removed. Whether the
/// input matches is the submission's own check (a conflict).
fn earlier_operation(earlier: Option<&CallRecord>, tool_id: &str) -> Option<String> {
    let operation = &earlier?.submission.operation;
    names_operation(tool_id, operation).then(|| operation.clone())
}

/// The Ferry call that answers `submit` now: its `call_id`'s own, or,
/// when that one (and each rerun since) failed transiently with this same
/// request, the next rerun's. A different request stops at the first, to
/// be refused as a conflict. Also whether a rerun is left after it.
/// `first`: the record under the `call_id` itself, as read already.
async fn current_attempt(
    oxp: &Oxp,
    submit: &SubmitCall,
    first: Option<CallRecord>,
) -> (String, bool) {
    let call_id = submit.id.clone().unwrap_or_default();
    let wanted = Submission {
        operation: submit.operation.clone(),
        arguments: submit.arguments.clone(),
        call_id: submit.call_id.clone(),
        user_id: submit.user_id.clone(),
        thread_ancestors: None,
    };
    let mut id = call_id.clone();
    let mut record = first;
    for n in 1..=MAX_RERUNS {
        match record {
            Some(call) if call.submission == wanted && failed_transiently(&call) => {
                id = rerun_id(&call_id, n);
                record = oxp.engine.call(&submit.group_id, &id).await.ok();
            }
            _ => return (id, true),
        }
    }
    (id, false)
}

#[instrument(skip_all)]
async fn settle(
    oxp: &Oxp,
    by: &Identity,
    mut submit: SubmitCall,
    earlier: Option<CallRecord>,
) -> Result<Value, OxpError> {
    let call_id = submit.id.clone().unwrap_or_default();
    let (id, reruns_left) = current_attempt(oxp, &submit, earlier).await;
    if id != call_id {
        info!(rerun = %id, "OXP retry of a call that failed transiently: running it again");
        submit.id = Some(id.clone());
    }
    let group_id = submit.group_id.clone();
    // Like a native submission: run detached from the client's
    // connection, answered once decided and durable.
    let deadline = tokio::time::Instant::now() + oxp.wait;
    crate::http::submit_call(&*oxp.perform, by, submit)
        .await
        .map_err(submit_error)?;
    let rest = deadline.saturating_duration_since(tokio::time::Instant::now());
    let call = oxp
        .engine
        .wait_for_call(&group_id, &id, rest, |c| !waiting(c.status))
        .await
        .map_err(|e| bad("The server could not read the call", e.to_string()))?;
    info!(status = ?call.status, "OXP call answered");
    Ok(result_of(&group_id, &call_id, &call, reruns_left))
}

/// Still on its way: the answer would be "retry later".
fn waiting(status: CallStatus) -> bool {
    matches!(
        status,
        CallStatus::PendingApproval | CallStatus::Queued | CallStatus::Dispatched
    )
}

fn submit_error(e: Error) -> OxpError {
    match e {
        Error::InvalidArguments(errors) => OxpError::validation(errors),
        Error::Rejected(Rejection::Conflict(id)) => bad(
            "This call_id was already used for a different call",
            format!("call {id:?} exists in this thread with another tool or input"),
        ),
        Error::Rejected(Rejection::ThreadClosed) => {
            bad("The thread of this user is closed", e.to_string())
        }
        Error::Rejected(Rejection::ForeignThread(_)) => bad(
            "This credential may not call in this user's thread",
            e.to_string(),
        ),
        Error::Forbidden(_) => bad("This credential may not make this call", e.to_string()),
        Error::RateLimited { .. } => bad("Too many calls: over a rate limit", e.to_string()),
        Error::Store(_) | Error::Bus(_) => bad(
            "The tool server is temporarily unavailable",
            format!("{e}; nothing was recorded: retry the same request"),
        ),
        other => bad("The call could not be made", other.to_string()),
    }
}

/// Milliseconds from acceptance to the last change (to now while waiting).
fn duration_ms(call: &CallRecord) -> u64 {
    let start = call.created_at.to_system_time();
    let end = if waiting(call.status) {
        SystemTime::now()
    } else {
        call.updated_at.to_system_time()
    };
    end.duration_since(start)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A path segment of the native API: OXP threads are named after their
/// users, which may be any string.
fn segment(text: &str) -> String {
    use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
    // RFC 3986 path-segment characters stay as they are.
    const SEGMENT: &AsciiSet = &CONTROLS
        .add(b' ')
        .add(b'"')
        .add(b'#')
        .add(b'%')
        .add(b'/')
        .add(b'<')
        .add(b'>')
        .add(b'?')
        .add(b'[')
        .add(b']')
        .add(b'\\')
        .add(b'^')
        .add(b'`')
        .add(b'{')
        .add(b'|')
        .add(b'}');
    utf8_percent_encode(text, SEGMENT).to_string()
}

/// The `CallToolResponse` for the call as it stands in thread `group_id`,
/// answering `call_id` (the call's own id, or the id it reruns). A
/// transient failure can be retried while `reruns_left`.
fn result_of(group_id: &str, call_id: &str, call: &CallRecord, reruns_left: bool) -> Value {
    let mut result = json!({"call_id": call_id, "duration": duration_ms(call)});
    let text = call
        .result
        .as_ref()
        .map(|r| r.text.clone())
        .unwrap_or_default();
    let (g, id) = (segment(group_id), segment(&call.id));
    let error = |message: String, developer: &str, can_retry: bool| {
        let mut e = Map::new();
        e.insert("message".into(), json!(message));
        e.insert("developer_message".into(), json!(developer));
        e.insert("can_retry".into(), json!(can_retry));
        if can_retry {
            e.insert("retry_after_ms".into(), json!(RETRY_AFTER_MS));
        }
        Value::Object(e)
    };
    let outcome = match call.status {
        CallStatus::Completed | CallStatus::Subscribed
            if !call.result.as_ref().is_some_and(|r| r.is_error) =>
        {
            Ok(value_of(call))
        }
        CallStatus::Completed | CallStatus::Subscribed => {
            Err(error(text, "the tool answered with an error", false))
        }
        CallStatus::Failed => {
            let again = failed_transiently(call) && reruns_left;
            let developer = if again {
                "Ferry could not get the call to the tool; retrying with the same call_id runs \
                 it again"
                    .to_owned()
            } else if failed_transiently(call) {
                format!("Ferry could not get the call to the tool, {MAX_RERUNS} reruns included")
            } else {
                "the call failed in a way another try would repeat (the tool refused it, or its \
                 result was too large to record)"
                    .to_owned()
            };
            Err(error(text, &developer, again))
        }
        CallStatus::Rejected => Err(error(text, "the approval gate rejected the call", false)),
        CallStatus::Cancelled => Err(error(
            "The call was cancelled".into(),
            "cancelled through Ferry's API",
            false,
        )),
        CallStatus::AwaitingAuth => {
            let url = call.auth_url.clone().unwrap_or_default();
            let mut e = error(
                format!(
                    "The tool needs authorization: open {url}, then retry with the same call_id"
                ),
                "the tool sent an oauth callback",
                true,
            );
            e["additional_prompt_content"] = json!(format!("Ask the user to authorize at {url}."));
            Err(e)
        }
        CallStatus::AwaitingUser => {
            let choice = call.choice.as_ref();
            let prompt = choice.map(|c| c.prompt.clone()).unwrap_or_default();
            let choices = choice.map(|c| c.choices.join(", ")).unwrap_or_default();
            let mut e = error(
                format!("The tool asks the user: {prompt} ({choices}); retry with the same call_id once answered"),
                &format!("answer with POST /v1/threads/{g}/calls/{id}/choice"),
                true,
            );
            e["additional_prompt_content"] = json!(format!("{prompt} Choices: {choices}"));
            Err(e)
        }
        CallStatus::PendingApproval => Err(error(
            "The call waits for a reviewer's approval; retry with the same call_id".into(),
            &format!("gated tool: decide it in /ui, POST /v1/approvals/{g}/{id}, or over ACP"),
            true,
        )),
        CallStatus::Queued | CallStatus::Dispatched => {
            return still_running(
                call_id,
                duration_ms(call),
                "the wait for the result ended first",
            )
        }
    };
    match outcome {
        Ok(value) => {
            result["success"] = json!(true);
            result["value"] = value;
        }
        Err(e) => {
            result["success"] = json!(false);
            result["error"] = e;
        }
    }
    result
}

/// The answer for a call the wait ended before: retry with its `call_id`.
fn still_running(id: &str, duration: u64, developer: &str) -> Value {
    json!({"call_id": id, "duration": duration, "success": false, "error": {
        "message": "The call is still running; retry with the same call_id for its result",
        "developer_message": developer,
        "can_retry": true,
        "retry_after_ms": RETRY_AFTER_MS,
    }})
}

/// The result's text; an object `{text, content?, display_as?}` when the
/// tool also sent content items or display segments.
fn value_of(call: &CallRecord) -> Value {
    let Some(r) = &call.result else {
        return Value::Null;
    };
    if r.content.is_none() && r.display_as.is_none() {
        return json!(r.text);
    }
    let mut v = json!({"text": r.text});
    if let Some(c) = &r.content {
        v["content"] = json!(c);
    }
    if let Some(d) = &r.display_as {
        v["display_as"] = json!(d);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::{rerun_id, segment, transient};
    use ferry_dispatch::Failure;

    #[test]
    fn failures_another_try_may_mend_are_transient() {
        let attempts = 3;
        for failure in [
            Failure::Unreachable { attempts },
            Failure::Exhausted {
                status: 503,
                attempts,
            },
            Failure::OutOfAttempts { attempts },
        ] {
            assert!(transient(&failure.to_string()), "{failure}");
        }
        assert!(transient(crate::thread::LOST_CALL_TEXT));
        let refused = Failure::Refused {
            status: 400,
            attempts,
        };
        assert!(!transient(&refused.to_string()));
        assert!(!transient(
            "Error: the tool's result was larger than this runtime accepts"
        ));
    }

    #[test]
    fn rerun_ids_are_short_and_distinct() {
        let long = "x".repeat(10_000);
        assert_eq!(rerun_id(&long, 1).len(), rerun_id("a", 1).len());
        assert_ne!(rerun_id("a", 1), rerun_id("a", 2));
        assert_ne!(rerun_id("a", 1), rerun_id("b", 1));
    }

    #[test]
    fn a_path_segment_escapes_what_would_change_the_path() {
        assert_eq!(segment("oxp-user-ops"), "oxp-user-ops");
        assert_eq!(segment("a/b c?d#e%f"), "a%2Fb%20c%3Fd%23e%25f");
        assert_eq!(segment("ü"), "%C3%BC");
    }
}
