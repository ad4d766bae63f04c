//! The native HTTP API's shapes: what agents submit, the events they read,
//! the call and thread views, and the error body.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::idempotency::IdempotencyKey;
use crate::rap::{ContentItem, DisplaySegment};
use crate::time::{Deadline, Timestamp};

/// `POST /v1/calls`: the RAP invocation fields minus `callback_url`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitCall {
    pub operation: String,
    /// Required, as in RAP's invocation (rap-1), even when empty (`{}`).
    pub arguments: Value,
    pub group_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_ancestors: Option<Vec<String>>,
}

impl SubmitCall {
    /// The submission with an empty `thread_ancestors` as none: RAP omits
    /// the field "when the current thread is the root", so `[]` and no
    /// field are the same call (a retry of one with the other is no
    /// conflict).
    pub fn normalized(mut self) -> Self {
        if self.thread_ancestors.as_ref().is_some_and(Vec::is_empty) {
            self.thread_ancestors = None;
        }
        self
    }
}

/// The answer to `POST /v1/calls`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitReply {
    pub group_id: String,
    pub id: String,
    pub status: CallStatus,
    /// The sequence number of the event that accepted the call.
    pub seq: u64,
    /// Set when the call finished at once (built-in tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<CallResult>,
}

/// Where a call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// Accepted and durable; waits for a reviewer before it is dispatched.
    PendingApproval,
    /// Accepted and durable; not yet acknowledged by the tool.
    Queued,
    /// The tool acknowledged the invocation; Ferry waits for the callback.
    Dispatched,
    /// The tool sent `oauth`; the user must authorize.
    AwaitingAuth,
    /// The tool sent `user_choice`; the user must choose.
    AwaitingUser,
    /// The tool's result opened a subscription that is still active.
    Subscribed,
    /// The tool sent its result (which may itself report an error).
    Completed,
    /// Ferry ended the call: dispatch failed, or the tool lost it.
    Failed,
    /// The agent cancelled the call.
    Cancelled,
    /// A reviewer, a standing grant or the approval timeout rejected it.
    Rejected,
}

impl CallStatus {
    /// Whether the call still waits on the tool (or the user).
    pub fn is_pending(self) -> bool {
        matches!(
            self,
            Self::Queued | Self::Dispatched | Self::AwaitingAuth | Self::AwaitingUser
        )
    }

    /// Whether Ferry still has something to do for the call: time out its
    /// approval, dispatch it, or take its callbacks.
    pub fn is_open(self) -> bool {
        self.is_pending() || matches!(self, Self::Subscribed | Self::PendingApproval)
    }

    /// The status as the API writes it (`pending_approval`, `cancelled`…).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PendingApproval => "pending_approval",
            Self::Queued => "queued",
            Self::Dispatched => "dispatched",
            Self::AwaitingAuth => "awaiting_auth",
            Self::AwaitingUser => "awaiting_user",
            Self::Subscribed => "subscribed",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Rejected => "rejected",
        }
    }
}

/// Error messages name a status as the API writes it.
impl std::fmt::Display for CallStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A call's result as the agent reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallResult {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<ContentItem>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_as: Option<Vec<DisplaySegment>>,
    pub is_error: bool,
}

/// A pending choice, as shown to the user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingChoice {
    pub prompt: String,
    pub choices: Vec<String>,
    pub default: usize,
    pub response_url: String,
}

/// One entry of a thread's log. `seq` is dense and starts at 1 per thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub group_id: String,
    /// The call the event concerns, where it concerns one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// RFC 3339 UTC, milliseconds.
    pub at: Timestamp,
    /// The `Idempotency-Key` of the tool's callback that recorded the
    /// event, with its body's fingerprint: a repeat of the key for the
    /// same call is answered `duplicate` and records nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened, tagged by `type`, with its data under `payload`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "payload", rename_all = "snake_case")]
pub enum EventKind {
    /// The call is durable and will be dispatched.
    CallAccepted {
        /// As the agent named it.
        operation: String,
        /// Fully qualified: `Toolset.tool@version`.
        tool: String,
        arguments: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread_ancestors: Option<Vec<String>>,
        /// The identity that submitted the call: the name of the
        /// credential Ferry authenticated, where `user_id` is only claimed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        identity: Option<String>,
        /// `user_id` is one the identity's credential names (not only
        /// what it claims).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        user_verified: bool,
        /// Where the call goes; absent for built-in tools.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<ToolTarget>,
    },
    /// The tool acknowledged the invocation with HTTP 200.
    CallDispatched {
        attempts: u32,
        /// The acknowledgement was recorded after the call's result (the
        /// tool called back before its 200 was recorded, on a retried
        /// attempt): it only corrects `attempts`; the call does not run
        /// again.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        after_result: bool,
    },
    /// An attempt to dispatch the call failed in a way worth retrying (a
    /// 5xx, a 429, no connection): Ferry tries again in `retry_in_ms`.
    /// `attempts` counts the attempts made so far, so the bound on them
    /// holds across restarts.
    DispatchRetrying {
        attempts: u32,
        /// What went wrong, safe to show (no internals).
        reason: String,
        retry_in_ms: u64,
    },
    /// The call's outcome. `origin` is `tool` for a result the tool sent and
    /// `ferry` for a failure Ferry recorded (dispatch failed, call lost).
    ToolResult {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<Vec<ContentItem>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        display_as: Option<Vec<DisplaySegment>>,
        is_error: bool,
        #[serde(default)]
        subscription: bool,
        origin: ResultOrigin,
        /// The dispatch attempts made, on a failure Ferry recorded because
        /// the tool could not be reached or refused the call (there is no
        /// `call_dispatched` then: the tool never acknowledged it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempts: Option<u32>,
    },
    SubscriptionEvent {
        text: String,
        associative: bool,
        #[serde(rename = "final")]
        is_final: bool,
    },
    #[serde(rename = "oauth")]
    OAuth {
        auth_url: String,
    },
    UserChoice {
        prompt: String,
        choices: Vec<String>,
        default: usize,
        response_url: String,
    },
    ViewUpdate {
        view_type: String,
        content: Value,
    },
    /// The call waits for a reviewer until `deadline` (RFC 3339), when it
    /// is rejected automatically.
    ApprovalRequested {
        tool: String,
        arguments: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user_id: Option<String>,
        options: Vec<PermissionOption>,
        deadline: Deadline,
    },
    /// A reviewer, a standing grant (`reviewer` = `grant:<group_id>`) or the
    /// timeout (`reviewer` = `timeout`) decided. `tool` keys the grant an
    /// `*_always` option records.
    ApprovalDecided {
        #[serde(rename = "optionId")]
        option_id: PermissionKind,
        tool: String,
        reviewer: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A standing grant for `tool` was revoked.
    GrantRevoked {
        tool: String,
    },
    /// The user answered the call's `user_choice`; Ferry delivers the
    /// answer to the tool's `response_url`.
    ChoiceMade {
        index: usize,
        choice: String,
        /// The user dismissed the prompt: `index` is its `default` (rap-3).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        dismissed: bool,
    },
    /// The tool's `response_url` accepted the answer.
    ChoiceDelivered {},
    /// The tool's `response_url` refused the answer with this 4xx status:
    /// it is not sent again.
    ChoiceRefused {
        status: u16,
    },
    /// The agent cancelled a pending call. (Variants without data are empty
    /// structs so that every event carries a `payload`, `{}` here.)
    CallCancelled {},
    /// The subscription left the thread's active set: the agent cancelled
    /// it, or (`reason` says so) Ferry did.
    SubscriptionCancelled {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    ThreadClosed {},
}

/// Where a call's tool lives, recorded at acceptance so that re-dispatch and
/// recovery need no registry lookup (the toolset may be gone by then).
/// Every reader of the thread sees it, so it holds no user name or
/// password: those stay with the registered toolset and are added to what
/// is sent while it is registered (a toolset deleted takes them along).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolTarget {
    /// The tool's own name, sent as `operation` on the wire.
    pub tool_name: String,
    /// The tool server's base URL (notifications, `/tool_call_status`).
    pub base_url: String,
    /// Where invocations are POSTed.
    pub endpoint: String,
}

/// The four ACP permission option kinds; an option's id is its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionKind {
    AllowOnce,
    AllowAlways,
    RejectOnce,
    RejectAlways,
}

impl PermissionKind {
    pub const ALL: [PermissionKind; 4] = [
        Self::AllowOnce,
        Self::AllowAlways,
        Self::RejectOnce,
        Self::RejectAlways,
    ];

    pub fn allows(self) -> bool {
        matches!(self, Self::AllowOnce | Self::AllowAlways)
    }

    /// Whether the decision is remembered as a grant for the tool.
    pub fn is_standing(self) -> bool {
        matches!(self, Self::AllowAlways | Self::RejectAlways)
    }

    pub fn id(self) -> &'static str {
        match self {
            Self::AllowOnce => "allow_once",
            Self::AllowAlways => "allow_always",
            Self::RejectOnce => "reject_once",
            Self::RejectAlways => "reject_always",
        }
    }

    pub fn parse(id: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.id() == id)
    }

    /// The ACP `PermissionOption` offered to reviewers.
    pub fn option(self) -> PermissionOption {
        let name = match self {
            Self::AllowOnce => "Allow once",
            Self::AllowAlways => "Always allow",
            Self::RejectOnce => "Reject",
            Self::RejectAlways => "Always reject",
        };
        PermissionOption {
            option_id: self.id().to_owned(),
            name: name.to_owned(),
            kind: self,
        }
    }
}

/// An ACP `PermissionOption`: `{optionId, name, kind}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PermissionOption {
    #[serde(rename = "optionId")]
    pub option_id: String,
    pub name: String,
    pub kind: PermissionKind,
}

/// Who produced a `tool_result` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultOrigin {
    Tool,
    Ferry,
}

impl EventKind {
    /// Every `type` tag, in declaration order: what a reader may filter on.
    pub const NAMES: [&'static str; 17] = [
        "call_accepted",
        "call_dispatched",
        "dispatch_retrying",
        "tool_result",
        "subscription_event",
        "oauth",
        "user_choice",
        "view_update",
        "approval_requested",
        "approval_decided",
        "grant_revoked",
        "choice_made",
        "choice_delivered",
        "choice_refused",
        "call_cancelled",
        "subscription_cancelled",
        "thread_closed",
    ];

    /// The `type` tag.
    pub fn name(&self) -> &'static str {
        match self {
            Self::CallAccepted { .. } => "call_accepted",
            Self::CallDispatched { .. } => "call_dispatched",
            Self::DispatchRetrying { .. } => "dispatch_retrying",
            Self::ToolResult { .. } => "tool_result",
            Self::SubscriptionEvent { .. } => "subscription_event",
            Self::OAuth { .. } => "oauth",
            Self::UserChoice { .. } => "user_choice",
            Self::ViewUpdate { .. } => "view_update",
            Self::ApprovalRequested { .. } => "approval_requested",
            Self::ApprovalDecided { .. } => "approval_decided",
            Self::GrantRevoked { .. } => "grant_revoked",
            Self::ChoiceMade { .. } => "choice_made",
            Self::ChoiceDelivered {} => "choice_delivered",
            Self::ChoiceRefused { .. } => "choice_refused",
            Self::CallCancelled {} => "call_cancelled",
            Self::SubscriptionCancelled { .. } => "subscription_cancelled",
            Self::ThreadClosed {} => "thread_closed",
        }
    }
}

/// `{"error": {...}}`, the one error shape of the native API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// An [`ErrorCode`](crate::ErrorCode)'s text. Kept as text so that a
    /// client reads codes a newer Ferry adds.
    pub code: String,
    pub message: String,
    /// Per-parameter messages for `invalid_arguments`, keyed by the
    /// argument's JSON pointer without the leading slash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter_errors: Option<Map<String, Value>>,
}

impl ErrorBody {
    pub fn new(code: crate::ErrorCode, message: impl Into<String>) -> Self {
        Self {
            error: ErrorDetail {
                code: code.as_str().to_owned(),
                message: message.into(),
                parameter_errors: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CallStatus;

    #[test]
    fn a_status_displays_as_the_api_writes_it() {
        use CallStatus::*;
        for status in [
            PendingApproval,
            Queued,
            Dispatched,
            AwaitingAuth,
            AwaitingUser,
            Subscribed,
            Completed,
            Failed,
            Cancelled,
            Rejected,
        ] {
            let wire = serde_json::to_value(status).unwrap();
            assert_eq!(wire.as_str(), Some(status.to_string().as_str()));
        }
    }

    /// An agent's cancel gives no reason: `subscription_cancelled` is
    /// written with an empty payload, and reads back as no reason, in JSON
    /// and in MessagePack.
    #[test]
    fn a_subscription_cancelled_without_a_reason_is_an_empty_payload() {
        use super::EventKind;
        let old = serde_json::json!({"type": "subscription_cancelled", "payload": {}});
        let kind: EventKind = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(kind, EventKind::SubscriptionCancelled { reason: None });
        assert_eq!(serde_json::to_value(&kind).unwrap(), old);
        let packed = rmp_serde::to_vec_named(&old).unwrap();
        let unpacked: EventKind = rmp_serde::from_slice(&packed).unwrap();
        assert_eq!(unpacked, kind);
    }
}
