//! What folding a thread's log yields: the thread's metadata and its calls.
//! Commands load only the calls they touch, so a `ThreadState` is a partial
//! view: `meta` plus the named calls.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ferry_proto::api::{CallResult, CallStatus, PendingChoice, PermissionKind, ToolTarget};
use ferry_proto::idempotency::IdempotencyKey;
use ferry_proto::time::{Deadline, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Thread-wide metadata, small enough to load for every command.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadMeta {
    pub group_id: String,
    /// Ancestors, root first, as the first call in the thread named them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ancestors: Option<Vec<String>>,
    /// The identity whose call created the thread: only it, and identities
    /// that may act everywhere, may act here (`Identity::may_act_in`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The sequence number of the thread's last event; 0 for a new thread.
    pub last_seq: u64,
    pub closed: bool,
    /// Calls whose result opened a subscription that is still active.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub active_subscriptions: BTreeSet<String>,
    /// Calls Ferry still owes something ([`CallRecord::is_unsettled`]):
    /// what recovery walks after a restart.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub unsettled: BTreeSet<String>,
    /// The base URLs of the tool servers this thread's calls were accepted
    /// for: the servers told when it closes, and no others, since another
    /// would learn of a thread it never saw. Threads recorded before this
    /// was kept decode with none.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub tool_servers: BTreeSet<String>,
    /// How many calls are in each status.
    pub counts: BTreeMap<CallStatus, u64>,
    /// The latest `view_update` content per `view_type`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub views: BTreeMap<String, Value>,
    /// Standing `allow_always`/`reject_always` decisions, by tool
    /// (`Toolset.tool`); they apply here and in threads that name this one
    /// among their `thread_ancestors`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub grants: BTreeMap<String, PermissionKind>,
    /// When the thread's first event was recorded; the epoch until then.
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// One call and everything known about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub id: String,
    pub submission: Submission,
    /// The identity that submitted the call (beside the `user_id` it
    /// claims); none for calls recorded before identities were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// Whether that identity's credential vouches for the `user_id`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub user_verified: bool,
    /// Fully qualified tool name: `Toolset.tool@version` (or the built-in's
    /// name).
    pub tool: String,
    /// `None` for built-in tools, which are never dispatched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<ToolTarget>,
    pub status: CallStatus,
    /// Dispatch attempts made: so far while it retries, then until the tool
    /// acknowledged (or Ferry gave up).
    pub attempts: u32,
    pub accepted_seq: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<CallResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<PendingChoice>,
    /// Subscription events recorded for this call.
    pub subscription_events: u64,
    /// A `final` subscription event arrived (possibly before the result).
    pub subscription_ended: bool,
    /// When a pending approval is rejected automatically (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_deadline: Option<Deadline>,
    /// How the approval gate was decided, when the tool is gated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalRecord>,
    /// The user's answer to a `user_choice`, until the tool accepted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undelivered_choice: Option<ChoiceAnswer>,
    /// The `Idempotency-Key`s of the call's most recent keyed callbacks
    /// that recorded something, oldest first, at most
    /// [`MAX_IDEMPOTENCY_KEYS`](super::MAX_IDEMPOTENCY_KEYS): the fold of
    /// the keys their events carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub idempotency_keys: Vec<IdempotencyKey>,
}

impl CallRecord {
    /// A call just accepted: queued, never dispatched, nothing known yet
    /// but what was submitted, at the event (`seq`, `at`) that accepted it.
    pub fn queued(
        id: &str,
        submission: Submission,
        tool: String,
        target: Option<ToolTarget>,
        seq: u64,
        at: Timestamp,
    ) -> Self {
        Self {
            id: id.to_owned(),
            submission,
            identity: None,
            user_verified: false,
            tool,
            target,
            status: CallStatus::Queued,
            attempts: 0,
            accepted_seq: seq,
            created_at: at,
            updated_at: at,
            result: None,
            auth_url: None,
            choice: None,
            subscription_events: 0,
            subscription_ended: false,
            approval_deadline: None,
            approval: None,
            undelivered_choice: None,
            idempotency_keys: Vec::new(),
        }
    }

    /// Whether the call still waits to reach its tool: queued (a
    /// subscription event from the tool proves it has the call, and moves
    /// it to `dispatched`).
    pub fn awaits_dispatch(&self) -> bool {
        self.status == CallStatus::Queued
    }

    /// Whether Ferry still owes the call something: it is open (queued,
    /// dispatched, waiting, subscribed, pending approval), or it holds a
    /// user's answer the tool has not taken yet.
    pub fn is_unsettled(&self) -> bool {
        self.status.is_open() || self.undelivered_choice.is_some()
    }

    /// The remembered callback under `key`, if the call has one.
    pub fn keyed(&self, key: &str) -> Option<&IdempotencyKey> {
        self.idempotency_keys.iter().find(|k| k.key == key)
    }

    /// Remembers `key` as the newest, dropping the oldest past
    /// [`MAX_IDEMPOTENCY_KEYS`](super::MAX_IDEMPOTENCY_KEYS). A key already
    /// remembered stays where it is.
    pub(super) fn remember(&mut self, key: &IdempotencyKey) {
        if self.keyed(&key.key).is_some() {
            return;
        }
        self.idempotency_keys.push(key.clone());
        let over = self
            .idempotency_keys
            .len()
            .saturating_sub(super::MAX_IDEMPOTENCY_KEYS);
        self.idempotency_keys.drain(..over);
    }
}

/// An answer on its way to the tool's `response_url`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChoiceAnswer {
    pub index: usize,
    pub response_url: String,
    /// The `choice_made` event's sequence number: what tells two equal
    /// answers to two prompts apart.
    #[serde(default)]
    pub seq: u64,
}

/// A decision of the approval gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub option_id: PermissionKind,
    pub reviewer: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at: Timestamp,
}

/// The grant key of a qualified tool name: `Toolset.tool@1.0.0` → `Toolset.tool`.
pub fn grant_key(tool: &str) -> &str {
    tool.split('@').next().unwrap_or(tool)
}

/// What the agent sent, as it sent it: a resubmission under the same id is
/// the same call exactly when this is equal (invariant 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submission {
    /// As the agent named it (bare or qualified).
    pub operation: String,
    pub arguments: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_ancestors: Option<Vec<String>>,
}

/// A call as submitted, after its tool was resolved and its arguments
/// validated.
#[derive(Debug, Clone, PartialEq)]
pub struct NewCall {
    pub id: String,
    pub submission: Submission,
    /// Who submits it.
    pub identity: String,
    /// Whether the identity's credential vouches for the `user_id`.
    pub user_verified: bool,
    pub tool: String,
    pub target: Option<ToolTarget>,
    /// Set when the tool is gated behind approval.
    pub gate: Option<Gate>,
}

/// What the engine found out for a gated call before deciding: when an
/// unanswered request times out, and any standing grant of an ancestor.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    pub deadline: Deadline,
    /// The nearest ancestor's standing decision for the tool, and that
    /// ancestor's `group_id`.
    pub inherited: Option<(PermissionKind, String)>,
    /// The ancestors `inherited` was read for: the thread's recorded ones,
    /// or the call's own while it had none. Read before the thread's turn,
    /// so the decision holds only if the thread still has these when the
    /// call is decided (a first call naming others may have come between).
    pub ancestors: Option<Vec<String>>,
}

/// The metadata of a thread and the calls a command touches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadState {
    pub meta: ThreadMeta,
    pub calls: HashMap<String, CallRecord>,
}

impl ThreadState {
    pub fn new(group_id: &str) -> Self {
        Self {
            meta: ThreadMeta {
                group_id: group_id.to_owned(),
                ..ThreadMeta::default()
            },
            calls: HashMap::new(),
        }
    }
}
