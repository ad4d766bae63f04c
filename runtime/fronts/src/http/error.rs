//! The one place engine errors become HTTP statuses and error codes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferry_proto::api::ErrorBody;
use ferry_proto::ErrorCode;

use crate::engine::Error;

/// An error answer: `{"error": {"code", "message", "parameter_errors"?}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
    /// Whole seconds for `Retry-After` on a 429 (a 503 always says
    /// [`RETRY_AFTER_SECS`]).
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: status_of(code),
            body: ErrorBody::new(code, message),
            retry_after_secs: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if let Some(secs) = self.retry_after_secs {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        } else if self.status == StatusCode::SERVICE_UNAVAILABLE {
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

/// The one table of the native API's error statuses: each code's HTTP
/// status. Every error answer of the native API takes its status here.
pub fn status_of(code: ErrorCode) -> StatusCode {
    use ErrorCode as C;
    use StatusCode as S;
    match code {
        C::InvalidJson
        | C::InvalidRequest
        | C::UnknownTool
        | C::AmbiguousTool
        | C::InvalidCallback => S::BAD_REQUEST,
        C::Unauthorized => S::UNAUTHORIZED,
        C::Forbidden => S::FORBIDDEN,
        C::NotFound | C::UnknownCall | C::NotSubscribed | C::NoGrant => S::NOT_FOUND,
        C::MethodNotAllowed => S::METHOD_NOT_ALLOWED,
        C::Conflict
        | C::ThreadClosed
        | C::CallFinished
        | C::NotPendingApproval
        | C::NotDispatched
        | C::NotAwaitingChoice
        | C::TooManyViews => S::CONFLICT,
        C::RequestTimeout => S::REQUEST_TIMEOUT,
        C::RateLimited => S::TOO_MANY_REQUESTS,
        C::SubscriptionGone => S::GONE,
        C::PayloadTooLarge | C::ViewsTooLarge => S::PAYLOAD_TOO_LARGE,
        C::UnsupportedMediaType => S::UNSUPPORTED_MEDIA_TYPE,
        C::InvalidArguments
        | C::InvalidOption
        | C::InvalidToolset
        | C::InvalidChoice
        | C::IdempotencyKeyReused => S::UNPROCESSABLE_ENTITY,
        C::StorageError | C::InternalError => S::INTERNAL_SERVER_ERROR,
        // A 502, but about the tool server the caller named, not Ferry.
        C::ToolsetUnreachable => S::BAD_GATEWAY,
        C::Busy | C::Unavailable | C::BusUnavailable => S::SERVICE_UNAVAILABLE,
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let mut api = ApiError::new(e.code(), e.to_string());
        match &e {
            // A 502, but about the tool server the caller named, not Ferry.
            Error::ToolsetUnreachable(_) => tracing::warn!(error = %e, "request failed"),
            _ if api.status.is_server_error() => tracing::error!(error = %e, "request failed"),
            _ => {}
        }
        if let Error::RateLimited { retry_after, .. } = &e {
            api.retry_after_secs = Some(retry_secs(*retry_after));
        }
        if let Error::InvalidArguments(errors) = e {
            api.body.error.parameter_errors = Some(errors);
        }
        api
    }
}

/// `Retry-After` is whole seconds: a wait rounded up, at least one.
pub fn retry_secs(wait: std::time::Duration) -> u64 {
    (wait.as_secs_f64().ceil() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store;

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
