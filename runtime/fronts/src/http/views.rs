//! How calls and threads look to agents.

use std::collections::BTreeMap;

use ferry_proto::api::{CallResult, CallStatus, PendingChoice, PermissionKind};
use ferry_proto::time::{Deadline, Timestamp};
use serde::Serialize;
use serde_json::Value;

use crate::thread::{ApprovalRecord, CallRecord, ThreadMeta};

#[derive(Debug, Serialize)]
pub struct CallView {
    pub group_id: String,
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    pub operation: String,
    pub tool: String,
    pub arguments: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    pub status: CallStatus,
    pub attempts: u32,
    /// The sequence number of the `call_accepted` event.
    pub seq: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<CallResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice: Option<PendingChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscription: Option<SubscriptionView>,
    /// When a pending approval is rejected automatically.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_deadline: Option<Deadline>,
    /// How the approval gate decided, for gated tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalRecord>,
}

#[derive(Debug, Serialize)]
pub struct SubscriptionView {
    pub active: bool,
    pub events: u64,
}

impl CallView {
    pub fn new(group_id: &str, call: CallRecord) -> Self {
        let subscribed = call.status == CallStatus::Subscribed;
        let subscription =
            (subscribed || call.subscription_events > 0).then_some(SubscriptionView {
                active: subscribed,
                events: call.subscription_events,
            });
        Self {
            group_id: group_id.to_owned(),
            id: call.id,
            call_id: call.submission.call_id,
            operation: call.submission.operation,
            tool: call.tool,
            arguments: call.submission.arguments,
            user_id: call.submission.user_id,
            status: call.status,
            attempts: call.attempts,
            seq: call.accepted_seq,
            created_at: call.created_at,
            updated_at: call.updated_at,
            result: call.result,
            auth_url: call.auth_url,
            choice: call.choice,
            subscription,
            // Shown while a reviewer is asked: a call cancelled meanwhile
            // keeps it in its record only as a sign that one was.
            approval_deadline: call
                .approval_deadline
                .filter(|_| call.status == CallStatus::PendingApproval),
            approval: call.approval,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ThreadView {
    pub group_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ancestors: Option<Vec<String>>,
    pub closed: bool,
    pub last_seq: u64,
    pub active_subscriptions: Vec<String>,
    /// Calls by status (zero counts omitted).
    pub counts: BTreeMap<CallStatus, u64>,
    pub calls: u64,
    /// The latest `view_update` content per `view_type`.
    pub views: BTreeMap<String, Value>,
    /// Standing approval decisions by tool (`Toolset.tool`).
    pub grants: BTreeMap<String, PermissionKind>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl From<ThreadMeta> for ThreadView {
    fn from(m: ThreadMeta) -> Self {
        let counts: BTreeMap<_, _> = m.counts.into_iter().filter(|(_, n)| *n > 0).collect();
        Self {
            calls: counts.values().sum(),
            group_id: m.group_id,
            ancestors: m.ancestors,
            closed: m.closed,
            last_seq: m.last_seq,
            active_subscriptions: m.active_subscriptions.into_iter().collect(),
            counts,
            views: m.views,
            grants: m.grants,
            created_at: m.created_at,
            updated_at: m.updated_at,
        }
    }
}
