//! The one place engine errors become HTTP statuses and error codes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferry_proto::api::ErrorBody;

use crate::engine::Error;
use crate::store;
use crate::thread::Rejection;

/// An error answer: `{"error": {"code", "message", "parameter_errors"?}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody::new(code, message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        response
    }
}

/// What a 503 tells its client to wait before the same request again:
/// the store (NATS) is out of reach, or the thread too busy, for now.
pub const RETRY_AFTER_SECS: &str = "1";

/// The status and code of an engine error.
fn classify(e: &Error) -> (StatusCode, &'static str) {
    use StatusCode as S;
    match e {
        Error::InvalidRequest(_) => (S::BAD_REQUEST, "invalid_request"),
        Error::UnknownTool(_) => (S::BAD_REQUEST, "unknown_tool"),
        Error::AmbiguousTool(_) => (S::BAD_REQUEST, "ambiguous_tool"),
        Error::InvalidArguments(_) => (S::UNPROCESSABLE_ENTITY, "invalid_arguments"),
        Error::Rejected(r) => match r {
            Rejection::UnknownCall(_) => (S::NOT_FOUND, "unknown_call"),
            Rejection::Conflict(_) => (S::CONFLICT, "conflict"),
            Rejection::ThreadClosed => (S::CONFLICT, "thread_closed"),
            Rejection::SubscriptionGone(_) => (S::GONE, "subscription_gone"),
            Rejection::Finished { .. } => (S::CONFLICT, "call_finished"),
            Rejection::NotSubscribed(_) => (S::NOT_FOUND, "not_subscribed"),
            Rejection::NotPendingApproval { .. } => (S::CONFLICT, "not_pending_approval"),
            Rejection::NotDispatched(_) => (S::CONFLICT, "not_dispatched"),
            Rejection::NoGrant(_) => (S::NOT_FOUND, "no_grant"),
            Rejection::NotAwaitingChoice { .. } => (S::CONFLICT, "not_awaiting_choice"),
            Rejection::BadChoice(_) => (S::UNPROCESSABLE_ENTITY, "invalid_choice"),
            Rejection::TooManyViews(_) => (S::CONFLICT, "too_many_views"),
            Rejection::ViewsTooLarge { .. } => (S::PAYLOAD_TOO_LARGE, "views_too_large"),
            Rejection::KeyReused { .. } => (S::UNPROCESSABLE_ENTITY, "idempotency_key_reused"),
        },
        Error::Forged | Error::Mismatch(_) => (S::FORBIDDEN, "forbidden"),
        Error::BadCallback(_) => (S::BAD_REQUEST, "invalid_callback"),
        Error::NotFound(_) => (S::NOT_FOUND, "not_found"),
        Error::InvalidOption(_) => (S::UNPROCESSABLE_ENTITY, "invalid_option"),
        Error::ToolsetUnreachable(_) => (S::BAD_GATEWAY, "toolset_unreachable"),
        Error::InvalidToolset(_) => (S::UNPROCESSABLE_ENTITY, "invalid_toolset"),
        Error::Store(store::Error::Conflict(_)) => (S::SERVICE_UNAVAILABLE, "busy"),
        Error::Store(store::Error::Unavailable(_)) => (S::SERVICE_UNAVAILABLE, "unavailable"),
        // What a result would be stored as, with the thread's metadata, is
        // more than NATS carries: refused like a body over the limit (a
        // tool's result then fails its call, `http::callbacks`).
        Error::Store(store::Error::TooLarge(_)) => (S::PAYLOAD_TOO_LARGE, "payload_too_large"),
        Error::Store(_) => (S::INTERNAL_SERVER_ERROR, "storage_error"),
        Error::Bus(_) => (S::SERVICE_UNAVAILABLE, "bus_unavailable"),
    }
}

/// The error code of an engine error, for metrics labels.
pub fn error_code(e: &Error) -> &'static str {
    classify(e).1
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, code) = classify(&e);
        match &e {
            // A 502, but about the tool server the caller named, not Ferry.
            Error::ToolsetUnreachable(_) => tracing::warn!(error = %e, "request failed"),
            _ if status.is_server_error() => tracing::error!(error = %e, "request failed"),
            _ => {}
        }
        let mut api = ApiError::new(status, code, e.to_string());
        if let Error::InvalidArguments(errors) = e {
            api.body.error.parameter_errors = Some(errors);
        }
        api
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DESIGN.md, invariant 1: "When the store cannot take the write, the
    /// answer is 503 with `Retry-After`, and nothing changes."
    #[test]
    fn a_store_out_of_reach_is_a_503_that_says_when_to_retry() {
        for e in [
            store::Error::Unavailable("not connected to NATS".into()),
            store::Error::Conflict("g".into()),
        ] {
            let response = ApiError::from(Error::Store(e)).into_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers()["retry-after"], RETRY_AFTER_SECS);
        }
        let refused = ApiError::from(Error::InvalidRequest("bad id".into())).into_response();
        assert!(refused.headers().get("retry-after").is_none());
    }
}
