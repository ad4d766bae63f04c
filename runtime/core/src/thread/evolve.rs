//! Folding events into thread state.

use ferry_proto::api::{CallResult, CallStatus, Event, EventKind, PendingChoice, ResultOrigin};
use ferry_proto::time::Timestamp;

use super::decide::Change;
use super::state::{ApprovalRecord, Submission};
use super::state::{CallRecord, ThreadState};
use super::Reviewer;

/// Numbers `changes` after the thread's last event, stamps them with `at`,
/// folds them into `state`, and returns the events to record.
pub fn apply(state: &mut ThreadState, at: Timestamp, changes: Vec<Change>) -> Vec<Event> {
    changes
        .into_iter()
        .map(|change| {
            let event = Event {
                seq: state.meta.last_seq + 1,
                group_id: state.meta.group_id.clone(),
                id: change.id,
                at,
                idempotency_key: change.idempotency_key,
                kind: change.kind,
            };
            evolve(state, &event);
            event
        })
        .collect()
}

/// Folds one event into `state`. The calls an event names must be loaded.
pub fn evolve(state: &mut ThreadState, event: &Event) {
    let meta = &mut state.meta;
    let first = meta.last_seq == 0;
    // The thread's first event dates it.
    if first {
        meta.created_at = event.at;
    }
    meta.last_seq = event.seq;
    meta.updated_at = event.at;
    let id = event.id.as_deref().unwrap_or_default();
    // A keyed callback's event: its call remembers the key (whatever the
    // event, a `view_update` included).
    if let Some(key) = &event.idempotency_key {
        match state.calls.get_mut(id) {
            Some(call) => call.remember(key),
            None => debug_assert!(false, "a keyed event for a call not loaded"),
        }
    }
    match &event.kind {
        EventKind::CallAccepted {
            operation,
            tool,
            arguments,
            call_id,
            user_id,
            thread_ancestors,
            identity,
            user_verified,
            target,
        } => {
            if meta.ancestors.is_none() {
                meta.ancestors = thread_ancestors.clone();
            }
            // The call that creates the thread makes it its identity's.
            if first {
                meta.owner = identity.clone();
            }
            *meta.counts.entry(CallStatus::Queued).or_default() += 1;
            if let Some(target) = target {
                meta.tool_servers.insert(target.base_url.clone());
            }
            let submission = Submission {
                operation: operation.clone(),
                arguments: arguments.clone(),
                call_id: call_id.clone(),
                user_id: user_id.clone(),
                thread_ancestors: thread_ancestors.clone(),
            };
            let mut record = CallRecord::queued(
                id,
                submission,
                tool.clone(),
                target.clone(),
                event.seq,
                event.at,
            );
            record.identity = identity.clone();
            record.user_verified = *user_verified;
            meta.unsettled.insert(id.to_owned());
            state.calls.insert(id.to_owned(), record);
        }
        EventKind::ThreadClosed {} => meta.closed = true,
        EventKind::GrantRevoked { tool } => {
            meta.grants.remove(tool);
        }
        EventKind::ViewUpdate { view_type, content } => {
            meta.views.insert(view_type.clone(), content.clone());
        }
        kind => {
            let Some(call) = state.calls.get_mut(id) else {
                debug_assert!(false, "event {} for a call not loaded", kind.name());
                return;
            };
            call.updated_at = event.at;
            let status = match kind {
                EventKind::CallDispatched { attempts, .. } => {
                    call.attempts = *attempts;
                    match call.status {
                        CallStatus::Queued => CallStatus::Dispatched,
                        other => other,
                    }
                }
                EventKind::DispatchRetrying { attempts, .. } => {
                    call.attempts = *attempts;
                    call.status
                }
                EventKind::ToolResult {
                    text,
                    content,
                    display_as,
                    is_error,
                    subscription,
                    origin,
                    attempts,
                } => {
                    // A result from a call still queued proves an attempt
                    // reached the tool; its acknowledgement, when it is
                    // recorded later, then adds nothing.
                    if call.status == CallStatus::Queued {
                        call.attempts = call.attempts.max(1);
                    }
                    if let Some(made) = attempts {
                        call.attempts = *made;
                    }
                    call.result = Some(CallResult {
                        text: text.clone(),
                        content: content.clone(),
                        display_as: display_as.clone(),
                        is_error: *is_error,
                    });
                    call.auth_url = None;
                    call.choice = None;
                    // The tool is done: it waits for no answer any more.
                    call.undelivered_choice = None;
                    match origin {
                        ResultOrigin::Ferry if call.status == CallStatus::Rejected => {
                            CallStatus::Rejected
                        }
                        ResultOrigin::Ferry => CallStatus::Failed,
                        ResultOrigin::Tool if *subscription && !call.subscription_ended => {
                            meta.active_subscriptions.insert(id.to_owned());
                            CallStatus::Subscribed
                        }
                        ResultOrigin::Tool => CallStatus::Completed,
                    }
                }
                EventKind::SubscriptionEvent { is_final, .. } => {
                    call.subscription_events += 1;
                    call.subscription_ended |= *is_final;
                    if *is_final {
                        meta.active_subscriptions.remove(id);
                    }
                    match call.status {
                        CallStatus::Subscribed if *is_final => CallStatus::Completed,
                        // An event before the tool's 200 was recorded proves
                        // the tool has the call, as a result would: it is
                        // dispatched, so a restart asks the tool about it
                        // rather than leaving it queued with nothing to send.
                        CallStatus::Queued => {
                            call.attempts = call.attempts.max(1);
                            CallStatus::Dispatched
                        }
                        other => other,
                    }
                }
                EventKind::OAuth { auth_url } => {
                    call.auth_url = Some(auth_url.clone());
                    call.choice = None;
                    CallStatus::AwaitingAuth
                }
                EventKind::UserChoice {
                    prompt,
                    choices,
                    default,
                    response_url,
                } => {
                    // A new question: an answer to an earlier one still
                    // owed must not be sent as this one's (rap-3: no
                    // replayed choice responses), and a spent `auth_url`
                    // is no longer what the call waits on.
                    call.undelivered_choice = None;
                    call.auth_url = None;
                    call.choice = Some(PendingChoice {
                        prompt: prompt.clone(),
                        choices: choices.clone(),
                        default: *default,
                        response_url: response_url.clone(),
                    });
                    CallStatus::AwaitingUser
                }
                EventKind::ApprovalRequested { deadline, .. } => {
                    call.approval_deadline = Some(*deadline);
                    CallStatus::PendingApproval
                }
                EventKind::ApprovalDecided {
                    option_id,
                    tool,
                    reviewer,
                    reason,
                } => {
                    // Only a reviewer's decision grants: one a grant made
                    // (an ancestor's, say) copied here would outlive that
                    // grant's revocation and pass to this thread's children.
                    let by_grant =
                        matches!(Reviewer::from_recorded(reviewer), Reviewer::Grant { .. });
                    if option_id.is_standing() && !by_grant {
                        meta.grants.insert(tool.clone(), *option_id);
                    }
                    call.approval_deadline = None;
                    call.approval = Some(ApprovalRecord {
                        option_id: *option_id,
                        reviewer: reviewer.clone(),
                        reason: reason.clone(),
                        at: event.at,
                    });
                    if option_id.allows() {
                        CallStatus::Queued
                    } else {
                        CallStatus::Rejected
                    }
                }
                EventKind::ChoiceMade { index, .. } => {
                    // Back to waiting for the tool, which answers next.
                    let response_url = call
                        .choice
                        .take()
                        .map(|c| c.response_url)
                        .unwrap_or_default();
                    call.undelivered_choice = Some(super::state::ChoiceAnswer {
                        index: *index,
                        response_url,
                        seq: event.seq,
                    });
                    CallStatus::Dispatched
                }
                EventKind::ChoiceDelivered {} | EventKind::ChoiceRefused { .. } => {
                    call.undelivered_choice = None;
                    call.status
                }
                EventKind::CallCancelled {} | EventKind::SubscriptionCancelled { .. } => {
                    meta.active_subscriptions.remove(id);
                    // A cancelled call's tool is owed no answer any more.
                    call.undelivered_choice = None;
                    CallStatus::Cancelled
                }
                EventKind::CallAccepted { .. }
                | EventKind::ThreadClosed {}
                | EventKind::GrantRevoked { .. }
                | EventKind::ViewUpdate { .. } => unreachable!("handled above"),
            };
            if status != call.status {
                if let Some(n) = meta.counts.get_mut(&call.status) {
                    *n = n.saturating_sub(1);
                }
                *meta.counts.entry(status).or_default() += 1;
                call.status = status;
            }
            if call.is_unsettled() {
                meta.unsettled.insert(id.to_owned());
            } else {
                meta.unsettled.remove(id);
            }
        }
    }
}
