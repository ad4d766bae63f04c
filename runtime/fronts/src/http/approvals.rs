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
use crate::thread::Reviewer;

/// `GET /v1/approvals?status=pending`: what waits for a reviewer, oldest
/// first, across threads.
pub async fn list(
    State(app): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
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
        .pending_approvals()
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
    #[serde(default = "anonymous")]
    reviewer: String,
    #[serde(default)]
    reason: Option<String>,
}

fn anonymous() -> String {
    "anonymous".to_owned()
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
    let request = Request::Decide {
        group_id: group_id.clone(),
        id,
        option_id: decision.option_id,
        // Checked by the engine: a person may not name themselves as one
        // of Ferry's own deciders (the timeout, a grant, ACP).
        reviewer: Reviewer::Person(decision.reviewer),
        reason: decision.reason,
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
