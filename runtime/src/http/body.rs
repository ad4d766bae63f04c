//! Request bodies, read with the configured size limit and refused in the
//! API's error shape: 413 for a body over the limit, 400 `invalid_json` for
//! malformed JSON, 400 `invalid_request` for JSON of the wrong shape.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use futures::StreamExt;
use serde::de::DeserializeOwned;

use super::{ApiError, AppState};

/// How much of an oversized body is read and dropped before answering 413.
/// Answering before the client finished sending would reset the connection
/// under it, and the client would see a broken pipe instead of the 413.
const DRAIN_FACTOR: usize = 16;

pub struct JsonBody<T>(pub T);

pub(super) fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "the request body is larger than the configured limit",
    )
}

/// Why a body was not read whole.
pub enum BodyError {
    /// Over the limit: its first `limit` bytes, or none when its declared
    /// length was past what is drained.
    TooLarge { prefix: Bytes },
    /// Reading it failed.
    Unreadable(ApiError),
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::TooLarge { .. } => too_large(),
            BodyError::Unreadable(e) => e,
        }
    }
}

/// Reads the whole body if it fits in `limit` bytes.
pub async fn read_bytes(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    Ok(read_body(req, limit).await?)
}

/// [`read_bytes`], keeping the start of a body over the limit.
pub async fn read_body(req: Request, limit: usize) -> Result<Bytes, BodyError> {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let drain_limit = limit.saturating_mul(DRAIN_FACTOR);
    if declared.is_some_and(|n| n > drain_limit) {
        return Err(BodyError::TooLarge {
            prefix: Bytes::new(),
        });
    }
    let mut stream = req.into_body().into_data_stream();
    let mut body = Vec::with_capacity(declared.unwrap_or(0).min(limit));
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            BodyError::Unreadable(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("reading the body: {e}"),
            ))
        })?;
        seen += chunk.len();
        if seen > drain_limit {
            break;
        }
        if body.len() < limit {
            let room = limit - body.len();
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
    }
    if seen > limit {
        return Err(BodyError::TooLarge {
            prefix: Bytes::from(body),
        });
    }
    Ok(Bytes::from(body))
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let bytes = read_bytes(req, state.engine.config().max_body_bytes).await?;
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("malformed JSON: {e}"),
            )
        })?;
        let parsed = serde_json::from_value(value).map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string())
        })?;
        Ok(JsonBody(parsed))
    }
}
