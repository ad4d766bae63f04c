//! `POST /v1/callbacks/{token}`: the five RAP callback types.

use super::path::Path;
use axum::extract::{Request, State};
use axum::Json;
use serde_json::json;

use super::body::read_bytes;
use super::{journaled, unexpected, ApiError, AppState};
use crate::engine::requests::{self, Reply};

/// 200 `{"status": "applied" | "duplicate" | "ignored"}` once durable.
/// 403 for a forged token or a body naming another call; 404 for an unknown
/// call; 410 for an event of a cancelled or ended subscription; 400 for a
/// malformed body. Refusals record nothing.
pub async fn receive(
    State(app): State<AppState>,
    Path(token): Path<String>,
    request: Request,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let body = read_bytes(request, app.engine.config().max_body_bytes).await?;
    let request = requests::Request::Callback {
        token,
        body: body.to_vec(),
    };
    match app.perform(request).await? {
        Reply::Callback { outcome } => Ok(Json(json!({"status": outcome})).into_response()),
        Reply::Journaled { .. } => Ok(journaled(json!({}))),
        other => Err(unexpected(other)),
    }
}
