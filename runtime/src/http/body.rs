//! A JSON body extractor whose refusals use the API's error shape: 413 for
//! a body over the limit, 400 `invalid_json` for malformed JSON, 400
//! `invalid_request` for JSON of the wrong shape.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::ApiError;

pub struct JsonBody<T>(pub T);

/// Reads the raw body, answering 413 in the API's shape when it is over the
/// limit.
pub async fn read_bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the request body is larger than the configured limit",
            )
        } else {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                rejection.body_text(),
            )
        }
    })
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = read_bytes(req, state).await?;
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
