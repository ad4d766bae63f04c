//! The approval gate: `GET /v1/approvals`, `POST /v1/approvals/{g}/{id}`,
//! and revoking a thread's standing grant.

use ferry_proto::ErrorCode;
use std::collections::HashMap;

use super::auth::Caller;
use super::path::Path;
use axum::extract::{Query, State};
use axum::Json;
use ferry_proto::api::PermissionKind;
use serde::Deserialize;
use serde_json::{json, Value};

use super::body::JsonBody;
use super::{unexpected, ApiError, AppState};
use crate::engine::requests::{Reply, Request};
use crate::identity::{Identity, Scope};
use crate::thread::Reviewer;

/// `GET /v1/approvals?status=pending`: what waits for a reviewer, oldest
/// first, across threads.
/// Only calls in threads within the caller's reach are listed.
pub async fn list(
    State(app): State<AppState>,
    Caller(by): Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    super::auth::need(&by, &[Scope::Read, Scope::Review])?;
    match query.get("status").map(String::as_str) {
        None | Some("pending") => {}
        Some(other) => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("status={other:?}: only \"pending\" is listed"),
            ))
        }
    }
    let now = std::time::SystemTime::now();
    let approvals: Vec<Value> = app
        .engine
        .pending_approvals(&by)
        .await?
        .into_iter()
        .map(|(group_id, call)| {
            let age = now
                .duration_since(call.created_at.to_system_time())
                .map_or(0, |d| d.as_secs());
            json!({
                "group_id": group_id,
                "id": call.id,
                "tool": call.tool,
                "operation": call.submission.operation,
                "arguments": call.submission.arguments,
                "user_id": call.submission.user_id,
                "requested_at": call.created_at,
                "age_secs": age,
                "deadline": call.approval_deadline,
                "options": PermissionKind::ALL.iter().map(|k| k.option()).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(Json(json!({"approvals": approvals})))
}

/// A reviewer's decision.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    #[serde(rename = "optionId")]
    option_id: String,
    #[serde(default)]
    reviewer: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

/// Who decided: a named identity is its own name, and a `reviewer` it
/// typed is only a comment, kept ahead of the reason. A shared credential
/// (no credentials at all, or an `--api-token`) names no one, so there
/// the typed name is the reviewer, as Ferry has no better one.
fn reviewer_of(
    by: &Identity,
    typed: Option<String>,
    reason: Option<String>,
) -> (String, Option<String>) {
    let shared = [Identity::ANONYMOUS, super::auth::API_TOKEN_IDENTITY].contains(&by.name());
    match typed {
        None if shared => (Identity::ANONYMOUS.to_owned(), reason),
        Some(typed) if shared => (typed, reason),
        Some(typed) if typed != by.name() => {
            let reason = match reason {
                Some(reason) => format!("(typed reviewer: {typed}) {reason}"),
                None => format!("(typed reviewer: {typed})"),
            };
            (by.name().to_owned(), Some(reason))
        }
        _ => (by.name().to_owned(), reason),
    }
}

/// `POST /v1/approvals/{group_id}/{id}`: 200 with the call; 409 when it
/// does not wait for approval; 422 for an unknown `optionId`; 404 for an
/// unknown call.
pub async fn decide(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path((group_id, id)): Path<(String, String)>,
    JsonBody(decision): JsonBody<Decision>,
) -> Result<axum::response::Response, ApiError> {
    let (reviewer, reason) = reviewer_of(&by, decision.reviewer, decision.reason);
    let request = Request::Decide {
        group_id: group_id.clone(),
        id,
        option_id: decision.option_id,
        // Checked by the engine: a person may not name themselves as one
        // of Ferry's own deciders (the timeout, a grant, ACP).
        reviewer: Reviewer::Person(reviewer),
        reason,
    };
    super::calls::call_reply(&app, &by, &group_id, request).await
}

/// `DELETE /v1/threads/{group_id}/grants/{tool}`.
pub async fn revoke(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path((group_id, tool)): Path<(String, String)>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let request = Request::RevokeGrant {
        group_id: group_id.clone(),
        tool: tool.clone(),
    };
    match app.perform(&by, request).await? {
        Reply::Revoked => {
            Ok(Json(json!({"group_id": group_id, "tool": tool, "revoked": true})).into_response())
        }
        other => Err(unexpected(other)),
    }
}
