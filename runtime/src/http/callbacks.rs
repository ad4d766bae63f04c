//! `POST /v1/callbacks/{token}`: the five RAP callback types.

use super::path::Path;
use axum::extract::{Request, State};
use axum::Json;
use serde_json::{json, Value};

use super::body::read_bytes;
use super::{detached, ApiError, AppState};

/// 200 `{"status": "applied" | "duplicate" | "ignored"}` once durable.
/// 403 for a forged token or a body naming another call; 404 for an unknown
/// call; 410 for an event of a cancelled or ended subscription; 400 for a
/// malformed body. Refusals record nothing.
pub async fn receive(
    State(app): State<AppState>,
    Path(token): Path<String>,
    request: Request,
) -> Result<Json<Value>, ApiError> {
    let body = read_bytes(request, app.engine.config().max_body_bytes).await?;
    let engine = app.engine.clone();
    let outcome = detached(async move { engine.callback(&token, &body).await }).await?;
    Ok(Json(
        json!({"status": format!("{outcome:?}").to_lowercase()}),
    ))
}
