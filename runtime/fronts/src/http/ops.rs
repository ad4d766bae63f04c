//! `/healthz`, `/metrics`, and the JSON answers for unknown routes.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferry_proto::ErrorCode;
use serde_json::json;

use super::auth::Caller;
use super::{ApiError, AppState};
use crate::identity::Scope;

/// `200 {"status": "ok"}`, or `503 {"status": "degraded", "reason"}`
/// while the store cannot take writes (a cluster node away from NATS), so
/// a load balancer sends requests to the nodes that can decide them.
pub async fn healthz(State(app): State<AppState>) -> Response {
    match app.engine.writable() {
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => (
            super::status_of(ErrorCode::Unavailable),
            [(header::RETRY_AFTER, super::error::RETRY_AFTER_SECS)],
            Json(json!({"status": "degraded", "reason": e.to_string()})),
        )
            .into_response(),
    }
}

pub async fn metrics(State(app): State<AppState>, Caller(by): Caller) -> Response {
    if let Err(refused) = super::auth::need(&by, &[Scope::Read]) {
        return refused.into_response();
    }
    match &app.metrics {
        Some(render) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            render(),
        )
            .into_response(),
        None => ApiError::new(ErrorCode::NotFound, "metrics are not enabled").into_response(),
    }
}

pub async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such endpoint")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "method not allowed on this endpoint",
    )
}
