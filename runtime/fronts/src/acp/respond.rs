//! `POST /v1/threads/{group_id}/acp`: the client's JSON-RPC response to a
//! `session/request_permission`. `selected` decides the approval exactly
//! as a reviewer's `POST /v1/approvals/{g}/{id}` does (reviewer `acp`);
//! `cancelled` cancels the call. Errors are JSON-RPC error objects and
//! change nothing. Answers 202 with no body when the response was taken.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferry_proto::api::CallStatus;
use serde_json::{json, Value};
use tracing::info;

use super::messages::PERMISSION_PREFIX;
use crate::engine::requests::Request as EngineRequest;
use crate::engine::Error;
use ferry_proto::jsonrpc::{
    INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR,
};

use crate::http::auth::Caller;
use crate::http::path::Path;
use crate::http::AppState;
use crate::identity::Identity;
use crate::thread::Reviewer;

/// A JSON-RPC error answer and its HTTP status.
struct RpcError {
    status: StatusCode,
    id: Value,
    code: i64,
    message: String,
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        let body = json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": self.code, "message": self.message},
        });
        (self.status, Json(body)).into_response()
    }
}

fn rpc(status: StatusCode, id: &Value, code: i64, message: impl Into<String>) -> RpcError {
    RpcError {
        status,
        id: id.clone(),
        code,
        message: message.into(),
    }
}

pub async fn respond(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path(group_id): Path<String>,
    req: Request,
) -> Response {
    match handle(app, by, group_id, req).await {
        Ok(()) => StatusCode::ACCEPTED.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn handle(
    app: AppState,
    by: Identity,
    group_id: String,
    req: Request,
) -> Result<(), RpcError> {
    let null = Value::Null;
    let limit = app.engine.config().max_body_bytes;
    let bytes = crate::http::body::read_bytes(req, limit)
        .await
        .map_err(|e| rpc(e.status, &null, INVALID_REQUEST, e.body.error.message))?;
    let message: Value = serde_json::from_slice(&bytes).map_err(|e| {
        rpc(
            StatusCode::BAD_REQUEST,
            &null,
            PARSE_ERROR,
            format!("Parse error: {e}"),
        )
    })?;
    let bad = |id: &Value, why: &str| rpc(StatusCode::BAD_REQUEST, id, INVALID_REQUEST, why);
    let Some(object) = message.as_object() else {
        return Err(bad(
            &null,
            "Invalid Request: expected one JSON-RPC response object",
        ));
    };
    // A request or a notification (`session/cancel`, say): none is served
    // here, whatever its id (a notification has none).
    if object.contains_key("method") {
        let id = match object.get("id") {
            Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
            _ => Value::Null,
        };
        return Err(rpc(
            StatusCode::BAD_REQUEST,
            &id,
            METHOD_NOT_FOUND,
            "Method not found: this endpoint takes responses to Ferry's requests only",
        ));
    }
    // JSON-RPC 2.0: an id is a string or a number (the id of an Invalid
    // Request error is null when it cannot be read).
    let id = match object.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        _ => {
            return Err(bad(
                &null,
                "Invalid Request: \"id\" must be a string or a number",
            ))
        }
    };
    if object.get("jsonrpc") != Some(&json!("2.0")) {
        return Err(bad(&id, "Invalid Request: \"jsonrpc\" must be \"2.0\""));
    }
    if !object.contains_key("error") && !object.contains_key("result") {
        return Err(bad(&id, "Invalid Request: a response has result or error"));
    }
    let call_id = id
        .as_str()
        .and_then(|s| s.strip_prefix(PERMISSION_PREFIX))
        .ok_or_else(|| unknown(&id))?;
    // Only who could decide (review) or withdraw (submit) learns whether
    // Ferry asked permission for a call.
    use crate::identity::Scope;
    if !(by.may(Scope::Review) || by.may(Scope::Submit)) {
        return Err(engine_error(
            &id,
            Error::Forbidden(format!(
                "{} lacks the review or submit scope this needs",
                by.name()
            )),
        ));
    }
    let asked = match app.engine.call(&group_id, call_id).await {
        Ok(call) => {
            call.status == CallStatus::PendingApproval
                || call.approval_deadline.is_some()
                || call.approval.is_some()
        }
        Err(Error::NotFound(_)) => false,
        Err(e) => return Err(engine_error(&id, e)),
    };
    if !asked {
        // Ferry never asked permission for this call. One it asked and
        // that was decided since is answered 409 below, as natively.
        return Err(unknown(&id));
    }
    if object.contains_key("error") && object.contains_key("result") {
        return Err(rpc(
            StatusCode::BAD_REQUEST,
            &id,
            INVALID_REQUEST,
            "Invalid Request: a response has result or error, not both",
        ));
    }
    if object.contains_key("error") {
        // The client could not ask its user; the call keeps waiting for
        // another reviewer or its timeout.
        info!(
            group_id,
            call_id, "ACP client answered the permission request with an error"
        );
        return Ok(());
    }
    let outcome = object
        .get("result")
        .and_then(|r| r.get("outcome"))
        .ok_or_else(|| {
            rpc(
                StatusCode::BAD_REQUEST,
                &id,
                INVALID_PARAMS,
                "Invalid params: a RequestPermissionResponse has result.outcome",
            )
        })?;
    // Through `perform`, like the native API: run to its end even if the
    // client goes away.
    let request = match (
        outcome.get("outcome").and_then(Value::as_str),
        outcome.get("optionId").and_then(Value::as_str),
    ) {
        (Some("selected"), Some(option)) => EngineRequest::Decide {
            group_id: group_id.clone(),
            id: call_id.to_owned(),
            option_id: option.to_owned(),
            reviewer: Reviewer::Acp,
            reason: None,
        },
        (Some("cancelled"), _) => EngineRequest::Withdraw {
            group_id: group_id.clone(),
            id: call_id.to_owned(),
        },
        _ => {
            return Err(rpc(
                StatusCode::BAD_REQUEST,
                &id,
                INVALID_PARAMS,
                "Invalid params: outcome must be {\"outcome\": \"selected\", \"optionId\": …} or {\"outcome\": \"cancelled\"}",
            ))
        }
    };
    app.perform(&by, request)
        .await
        .map_err(|e| api_error(&id, e))?;
    info!(group_id, call_id, outcome = %outcome, "ACP permission response taken");
    Ok(())
}

fn unknown(id: &Value) -> RpcError {
    rpc(
        StatusCode::NOT_FOUND,
        id,
        INVALID_PARAMS,
        format!("Invalid params: no permission request of this thread has id {id}"),
    )
}

fn engine_error(id: &Value, e: Error) -> RpcError {
    api_error(id, crate::http::ApiError::from(e))
}

fn api_error(id: &Value, api: crate::http::ApiError) -> RpcError {
    let code = if api.status.is_server_error() {
        INTERNAL_ERROR
    } else {
        INVALID_PARAMS
    };
    rpc(api.status, id, code, api.body.error.message)
}
