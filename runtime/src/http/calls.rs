//! `POST /v1/calls`, `GET` and `DELETE /v1/threads/{group_id}/calls/{id}`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use ferry_proto::api::{SubmitCall, SubmitReply};

use super::body::JsonBody;
use super::views::CallView;
use super::{ApiError, AppState};
use crate::engine::calls::Submitted;

/// 202 when the call is new and durable; 200 when the same call was already
/// submitted (nothing new is dispatched).
pub async fn submit(
    State(app): State<AppState>,
    JsonBody(req): JsonBody<SubmitCall>,
) -> Result<(StatusCode, Json<SubmitReply>), ApiError> {
    let (submitted, reply) = app.engine.submit(req).await?;
    let status = match submitted {
        Submitted::Created => StatusCode::ACCEPTED,
        Submitted::Existing => StatusCode::OK,
    };
    Ok((status, Json(reply)))
}

pub async fn show(
    State(app): State<AppState>,
    Path((group_id, id)): Path<(String, String)>,
) -> Result<Json<CallView>, ApiError> {
    let call = app.engine.call(&group_id, &id).await?;
    Ok(Json(CallView::new(&group_id, call)))
}

pub async fn cancel(
    State(app): State<AppState>,
    Path((group_id, id)): Path<(String, String)>,
) -> Result<Json<CallView>, ApiError> {
    let call = app.engine.cancel_call(&group_id, &id).await?;
    Ok(Json(CallView::new(&group_id, call)))
}
