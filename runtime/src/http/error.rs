//! The one place engine errors become HTTP statuses and error codes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferry_proto::api::ErrorBody;

use crate::engine::requests::Refusal;
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
        (self.status, Json(self.body)).into_response()
    }
}

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
        // Its own code is in its body (`From<Error> for ApiError`).
        Error::Refused(_) => (S::BAD_GATEWAY, "refused"),
    }
}

/// The error code of an engine error, for metrics labels.
pub fn error_code(e: &Error) -> &'static str {
    classify(e).1
}

/// A refusal as it crosses the wire between a cluster node and a worker.
impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Self {
        Refusal {
            status: e.status.as_u16(),
            body: e.body,
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(refused: Refusal) -> Self {
        ApiError {
            status: StatusCode::from_u16(refused.status)
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body: refused.body,
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        if let Error::Refused(refused) = e {
            return refused.into();
        }
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

    /// What a front tells apart survives the wire: an engine error made an
    /// HTTP refusal (as a cluster worker sends it back) and read again by
    /// the MCP or OXP front is the same error.
    #[test]
    fn a_refusal_read_back_is_the_error_it_was() {
        let errors = serde_json::Map::from_iter([("b".to_owned(), "must be a number".into())]);
        let cases = [
            Error::UnknownTool("no tool x".into()),
            Error::AmbiguousTool("x is in A and B".into()),
            Error::InvalidRequest("bad id".into()),
            Error::InvalidArguments(errors),
            Error::Rejected(Rejection::Conflict("c".into())),
            Error::Rejected(Rejection::ThreadClosed),
        ];
        for error in cases {
            let shown = format!("{error:?}");
            let refusal = Refusal::from(ApiError::from(error));
            assert_eq!(format!("{:?}", refusal.into_submit_error("c")), shown);
        }
        // Anything else keeps its status, code and message.
        let api = ApiError::from(Error::Store(store::Error::Unavailable("NATS".into())));
        let (status, body) = (api.status, api.body.clone());
        let refusal = Refusal::from(api);
        let back = ApiError::from(refusal.into_submit_error("c"));
        assert_eq!((back.status, back.body), (status, body));
    }
}
