//! What the audit log records of a thread's changes: derived from the
//! events a write appends (so every path that changes a thread is audited
//! by the one write it makes), and again from a call's record when a
//! request is a repeat of one already recorded (so an action whose first
//! answer was lost in a crash is audited by its retry). Each entry's key
//! names its action; the store keeps one entry per key.

use std::collections::BTreeSet;

use ferry_proto::api::{CallStatus, ResultOrigin};
use ferry_proto::audit::{AuditEntry, AuditKind};
use ferry_proto::{Event, EventKind, Timestamp};

use crate::thread::{CallRecord, ThreadState};

/// Who a tool's callback acts as.
pub const TOOL: &str = "tool";
/// Who Ferry acts as on its own (a timeout, a lost call).
pub const FERRY: &str = "ferry";

/// The entries for `events`, just appended to `state`'s thread, at the
/// request of `by` (none: a tool's callback or Ferry itself).
pub fn of_events(state: &ThreadState, events: &[Event], by: Option<&str>) -> Vec<AuditEntry> {
    let group_id = state.meta.group_id.as_str();
    let mut entries = vec![];
    let mut settled = BTreeSet::new();
    for event in events {
        let id = event.id.as_deref();
        let entry = |kind, identity: &str, parts: &[&str]| AuditEntry {
            at: event.at,
            kind,
            identity: identity.to_owned(),
            key: key(kind, group_id, parts),
            group_id: Some(group_id.to_owned()),
            id: id.map(str::to_owned),
            ..AuditEntry::default()
        };
        match &event.kind {
            EventKind::CallAccepted {
                operation,
                tool,
                user_id,
                identity,
                ..
            } => {
                let who = identity.as_deref().or(by).unwrap_or(FERRY);
                entries.push(AuditEntry {
                    operation: Some(operation.clone()),
                    tool: Some(tool.clone()),
                    user_id: user_id.clone(),
                    ..entry(AuditKind::CallSubmitted, who, &[id.unwrap_or_default()])
                });
            }
            EventKind::ApprovalDecided {
                option_id,
                tool,
                reviewer,
                reason,
            } => entries.push(AuditEntry {
                tool: Some(tool.clone()),
                outcome: Some(option_id.id().to_owned()),
                detail: reason.clone(),
                ..entry(
                    AuditKind::ApprovalDecided,
                    reviewer,
                    &[id.unwrap_or_default()],
                )
            }),
            EventKind::GrantRevoked { tool } => entries.push(AuditEntry {
                tool: Some(tool.clone()),
                ..entry(
                    AuditKind::GrantRevoked,
                    by.unwrap_or(FERRY),
                    &[&event.seq.to_string()],
                )
            }),
            EventKind::ThreadClosed {} => {
                entries.push(entry(AuditKind::ThreadClosed, by.unwrap_or(FERRY), &[]))
            }
            _ => {}
        }
        if let Some(call) = id.and_then(|id| state.calls.get(id)) {
            let who = match &event.kind {
                EventKind::ToolResult {
                    origin: ResultOrigin::Tool,
                    ..
                }
                | EventKind::SubscriptionEvent { .. } => TOOL,
                EventKind::ApprovalDecided { reviewer, .. } => reviewer,
                _ => by.unwrap_or(FERRY),
            };
            if ends(&event.kind) && settled.insert(call.id.as_str()) {
                entries.extend(settled_entry(group_id, call, who, event.at));
            }
        }
    }
    entries
}

/// The entries a call's record says it has: what a repeat of a request
/// about the call records again (each once, by its key).
pub fn of_call(group_id: &str, call: &CallRecord) -> Vec<AuditEntry> {
    let mut entries = vec![AuditEntry {
        at: call.created_at,
        kind: AuditKind::CallSubmitted,
        identity: call.identity.clone().unwrap_or_else(|| FERRY.to_owned()),
        key: key(AuditKind::CallSubmitted, group_id, &[&call.id]),
        group_id: Some(group_id.to_owned()),
        id: Some(call.id.clone()),
        operation: Some(call.submission.operation.clone()),
        tool: Some(call.tool.clone()),
        user_id: call.submission.user_id.clone(),
        ..AuditEntry::default()
    }];
    if let Some(approval) = &call.approval {
        entries.push(AuditEntry {
            at: approval.at,
            kind: AuditKind::ApprovalDecided,
            identity: approval.reviewer.clone(),
            key: key(AuditKind::ApprovalDecided, group_id, &[&call.id]),
            group_id: Some(group_id.to_owned()),
            id: Some(call.id.clone()),
            tool: Some(call.tool.clone()),
            outcome: Some(approval.option_id.id().to_owned()),
            detail: approval.reason.clone(),
            ..AuditEntry::default()
        });
    }
    let who = match call.status {
        CallStatus::Completed | CallStatus::Subscribed => TOOL,
        _ => FERRY,
    };
    entries.extend(settled_entry(group_id, call, who, call.updated_at));
    entries
}

/// An entry made by `identity` outside any thread (a toolset or a token
/// changed, a credential refused); `parts` name the action: an action
/// that is never repeated names itself with something unique to it.
pub fn entry(
    kind: AuditKind,
    at: Timestamp,
    identity: &str,
    subject: Option<String>,
    detail: Option<String>,
    parts: &[&str],
) -> AuditEntry {
    AuditEntry {
        at,
        kind,
        identity: identity.to_owned(),
        key: key(kind, "", parts),
        subject,
        detail,
        ..AuditEntry::default()
    }
}

/// A call's outcome once it has one: its status where that is an end (or
/// a subscription, which is one until it ends).
fn settled_entry(
    group_id: &str,
    call: &CallRecord,
    identity: &str,
    at: Timestamp,
) -> Option<AuditEntry> {
    let outcome = match call.status {
        CallStatus::Subscribed => "subscribed",
        CallStatus::Completed if call.subscription_ended => "subscription_ended",
        CallStatus::Completed if call.result.as_ref().is_some_and(|r| r.is_error) => {
            "completed_with_error"
        }
        CallStatus::Completed => "completed",
        CallStatus::Failed => "failed",
        CallStatus::Cancelled => "cancelled",
        CallStatus::Rejected => "rejected",
        _ => return None,
    };
    Some(AuditEntry {
        at,
        kind: AuditKind::CallSettled,
        identity: identity.to_owned(),
        key: key(AuditKind::CallSettled, group_id, &[&call.id, outcome]),
        group_id: Some(group_id.to_owned()),
        id: Some(call.id.clone()),
        tool: Some(call.tool.clone()),
        user_id: call.submission.user_id.clone(),
        outcome: Some(outcome.to_owned()),
        ..AuditEntry::default()
    })
}

/// Whether an event can bring its call to an outcome.
fn ends(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::ToolResult { .. }
            | EventKind::CallCancelled {}
            | EventKind::ApprovalDecided { .. }
            | EventKind::SubscriptionCancelled { .. }
            | EventKind::SubscriptionEvent { is_final: true, .. }
    )
}

/// The key of an action: a digest of its kind, its thread and what names
/// it there, each length-prefixed so no two actions' parts run together.
fn key(kind: AuditKind, group_id: &str, parts: &[&str]) -> String {
    let mut named = String::new();
    for part in [kind.name(), group_id].iter().chain(parts) {
        named.push_str(&format!("{}:{part}", part.len()));
    }
    crate::digest::sha256_hex(named, 16)
}
