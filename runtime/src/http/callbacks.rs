//! `POST /v1/callbacks/{token}`: the five RAP callback types.

use super::path::Path;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::json;

use super::body::{read_body, too_large, BodyError};
use super::{journaled, unexpected, ApiError, AppState};
use crate::engine::requests::{self, Reply};

/// 200 `{"status": "applied" | "duplicate" | "ignored"}` once durable.
/// 403 for a forged token or a body naming another call; 404 for an unknown
/// call; 410 for an event of a cancelled or ended subscription; 400 for a
/// malformed body; 413 for a body over the size limit (a `tool_result`
/// that large ends its call with an error result saying so). Other
/// refusals record nothing.
pub async fn receive(
    State(app): State<AppState>,
    Path(token): Path<String>,
    request: Request,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let limit = app.engine.config().max_body_bytes;
    let body = match read_body(request, limit).await {
        Ok(body) => body,
        Err(BodyError::TooLarge { prefix }) => {
            let (limit, refused) = (Some(limit), too_large());
            return Err(end_call_refused_for_size(&app, &token, &prefix, limit, refused).await);
        }
        Err(e) => return Err(e.into()),
    };
    let request = requests::Request::Callback {
        token: token.clone(),
        body: body.to_vec(),
    };
    match app.perform(request).await {
        Ok(Reply::Callback { outcome }) => Ok(Json(json!({"status": outcome})).into_response()),
        Ok(Reply::Journaled { .. }) => Ok(journaled(json!({}))),
        Ok(other) => Err(unexpected(other)),
        // A cluster node refuses what NATS could not carry.
        Err(e) if is_too_large(&e) => {
            Err(end_call_refused_for_size(&app, &token, &body, None, e).await)
        }
        Err(e) => Err(e),
    }
}

fn is_too_large(e: &ApiError) -> bool {
    e.status == StatusCode::PAYLOAD_TOO_LARGE && e.body.error.code == "payload_too_large"
}

/// Refuses a callback for its size; if it was the call's `tool_result`,
/// first records an error result in its place, so that the call ends
/// instead of waiting for a result the tool will not send again.
async fn end_call_refused_for_size(
    app: &AppState,
    token: &str,
    body: &[u8],
    limit: Option<usize>,
    mut refused: ApiError,
) -> ApiError {
    let Some(stand_in) = app.engine.result_refused_for_size(token, body, limit) else {
        return refused;
    };
    let request = requests::Request::Callback {
        token: token.to_owned(),
        body: stand_in,
    };
    match app.perform(request).await {
        Ok(Reply::Callback { outcome }) if outcome == "applied" => {
            refused.body.error.message += "; the call ends with an error result saying so";
        }
        Ok(Reply::Journaled { .. }) => {
            refused.body.error.message += "; the call will end with an error result saying so";
        }
        // The call had ended already, or is not one this token may end.
        Ok(_) | Err(_) => {}
    }
    refused
}
