//! The native API's error codes: the `code` of `{"error": {"code", ...}}`.
//!
//! One enum names every code Ferry answers with, so the engine says what
//! went wrong without knowing HTTP and each front maps a code to its own
//! protocol's shape (the native API's status table is in the fronts).

use serde::{Deserialize, Serialize};

macro_rules! error_codes {
    ($($variant:ident => $text:literal,)*) => {
        /// A native API error code. Serialized as its snake_case text.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode {
            $($variant,)*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as it appears on the wire and in metrics labels.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $text,)*
                }
            }
        }
    };
}

error_codes! {
    // The request itself.
    InvalidJson => "invalid_json",
    InvalidRequest => "invalid_request",
    PayloadTooLarge => "payload_too_large",
    UnsupportedMediaType => "unsupported_media_type",
    RequestTimeout => "request_timeout",
    Unauthorized => "unauthorized",
    Forbidden => "forbidden",
    NotFound => "not_found",
    MethodNotAllowed => "method_not_allowed",
    // Tools and their arguments.
    UnknownTool => "unknown_tool",
    AmbiguousTool => "ambiguous_tool",
    InvalidArguments => "invalid_arguments",
    InvalidOption => "invalid_option",
    ToolsetUnreachable => "toolset_unreachable",
    InvalidToolset => "invalid_toolset",
    // What the thread's state machine refused.
    UnknownCall => "unknown_call",
    Conflict => "conflict",
    ThreadClosed => "thread_closed",
    SubscriptionGone => "subscription_gone",
    CallFinished => "call_finished",
    NotSubscribed => "not_subscribed",
    NotPendingApproval => "not_pending_approval",
    NotDispatched => "not_dispatched",
    NoGrant => "no_grant",
    NotAwaitingChoice => "not_awaiting_choice",
    InvalidChoice => "invalid_choice",
    TooManyViews => "too_many_views",
    ViewsTooLarge => "views_too_large",
    IdempotencyKeyReused => "idempotency_key_reused",
    InvalidCallback => "invalid_callback",
    // Ferry's own state: retry later, or a fault.
    RateLimited => "rate_limited",
    Busy => "busy",
    Unavailable => "unavailable",
    BusUnavailable => "bus_unavailable",
    StorageError => "storage_error",
    InternalError => "internal_error",
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn each_code_serializes_as_its_text() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json, code.as_str(), "{code:?}");
            let back: ErrorCode = serde_json::from_value(json).unwrap();
            assert_eq!(back, *code);
        }
    }
}
