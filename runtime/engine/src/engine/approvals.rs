//! The approval gate's I/O: finding ancestors' grants for a new call,
//! reviewers' decisions, revoking grants, and the durable timeout.
//!
//! The deadline is stored with the call (`approval_requested`), so a restart
//! re-arms it; the timeout decides through the state machine like a
//! reviewer, so a decision racing it yields exactly one outcome.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ferry_proto::api::{CallStatus, PermissionKind};
use ferry_proto::time::Deadline;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{Engine, Error};
use crate::identity::Identity;
use crate::thread::{grant_key, CallRecord, Command, Gate, Rejection, Reviewer};

/// Longest reason a reviewer may give, in bytes; it is stored with the call
/// and read back to the agent.
pub const MAX_REASON_BYTES: usize = 4096;

/// Why a reviewer's decision cannot be recorded, if it cannot: a person's
/// name Ferry would not record (`Reviewer::person`), or a reason too long.
fn refuse_decision(reviewer: &Reviewer, reason: Option<&str>) -> Option<String> {
    if let Reviewer::Person(name) = reviewer {
        if let Err(why) = Reviewer::person(name) {
            return Some(why);
        }
    }
    match reason {
        Some(reason) if reason.len() > MAX_REASON_BYTES => Some(format!(
            "reason is {} bytes long; the limit is {MAX_REASON_BYTES}",
            reason.len()
        )),
        _ => None,
    }
}

/// A pending approval to reject at `deadline` if no one decides first.
pub(crate) struct Timer {
    pub group_id: String,
    pub id: String,
    pub deadline: SystemTime,
}

impl Engine {
    /// The gate of a call to `tool`, which needs approval, in `group_id`:
    /// its deadline, and the standing decision of the nearest ancestor that
    /// has one. The ancestors are the thread's as `GET /v1/threads/{g}`
    /// shows them (set by its first call that named any), and the call's
    /// own (`ancestors`) only while the thread has none: a later call
    /// naming other ancestors must not borrow their grants.
    pub(crate) async fn gate(
        &self,
        by: &Identity,
        tool: &str,
        timeout_secs: u64,
        group_id: &str,
        ancestors: Option<&[String]>,
    ) -> Result<Gate, Error> {
        let recorded = self.recorded_ancestors(group_id).await?;
        let ancestors = recorded.as_deref().or(ancestors);
        // Kept to the second, rounded up from the clock's own precision: a
        // gate that closed up to a second early left a reviewer of a 1 s
        // timeout no time at all.
        let deadline = Deadline::at_or_after(SystemTime::now() + Duration::from_secs(timeout_secs));
        let mut inherited = None;
        // Root first on the wire: the parent is last, and nearest wins.
        for ancestor in ancestors.unwrap_or_default().iter().rev() {
            // Only an ancestor `by` may act in lends its grants: one created
            // by another identity after this thread named it lends none.
            let grant = self
                .store
                .thread(ancestor)
                .await?
                .filter(|meta| by.may_act_in(ancestor, meta))
                .and_then(|meta| meta.grants.get(grant_key(tool)).copied());
            if let Some(kind) = grant {
                inherited = Some((kind, ancestor.clone()));
                break;
            }
        }
        Ok(Gate {
            deadline,
            inherited,
            ancestors: ancestors.map(<[String]>::to_vec),
        })
    }

    /// A reviewer decides a pending approval. Allowed calls are dispatched.
    pub async fn decide_approval(
        &self,
        by: &Identity,
        group_id: &str,
        id: &str,
        option_id: &str,
        reviewer: Reviewer,
        reason: Option<String>,
    ) -> Result<CallRecord, Error> {
        let option = PermissionKind::parse(option_id).ok_or_else(|| {
            Error::InvalidOption(format!(
                "unknown optionId {option_id:?}; expected allow_once, allow_always, reject_once or reject_always"
            ))
        })?;
        if let Some(why) = refuse_decision(&reviewer, reason.as_deref()) {
            return Err(Error::InvalidRequest(why));
        }
        self.decide(by, group_id, id, option, reviewer, reason)
            .await
    }

    async fn decide(
        &self,
        by: &Identity,
        group_id: &str,
        id: &str,
        option: PermissionKind,
        reviewer: Reviewer,
        reason: Option<String>,
    ) -> Result<CallRecord, Error> {
        let shown = reviewer.recorded();
        let command = Command::Decide {
            id: id.into(),
            option,
            reviewer,
            reason,
        };
        let executed = match self.execute_in_turn(by, group_id, command).await {
            Err(Error::Rejected(Rejection::NotPendingApproval {
                status: CallStatus::Queued,
                ..
            })) => {
                // Allowed already, but perhaps never handed to the workers:
                // the request that allowed it may be the one being applied
                // again, its worker having died between the commit and the
                // enqueue. Enqueue again (a tool may see a call twice,
                // invariant 4), then refuse the repeat as before.
                if let Some(call) = self.store.call(group_id, id).await? {
                    if call.status == CallStatus::Queued {
                        let ancestors = self.recorded_ancestors(group_id).await?;
                        self.enqueue(group_id, &call, ancestors.as_deref()).await?;
                    }
                }
                return Err(Error::Rejected(Rejection::NotPendingApproval {
                    id: id.into(),
                    status: CallStatus::Queued,
                }));
            }
            executed => executed?,
        };
        let call = executed.state.calls[id].clone();
        self.disarm(group_id, id);
        info!(
            group_id,
            call_id = id,
            option = option.id(),
            reviewer = shown,
            "approval decided"
        );
        if call.status == CallStatus::Queued {
            if let Some(turn) = &executed.turn {
                turn.come().await;
            }
            let ancestors = executed.state.meta.ancestors.as_deref();
            self.enqueue(group_id, &call, ancestors).await?;
        }
        Ok(call)
    }

    /// Revokes a thread's standing grant for `tool` (`Toolset.tool`).
    pub async fn revoke_grant(
        &self,
        by: &Identity,
        group_id: &str,
        tool: &str,
    ) -> Result<(), Error> {
        self.execute_as(by, group_id, Command::Revoke { tool: tool.into() })
            .await?;
        info!(group_id, tool, "grant revoked");
        Ok(())
    }

    /// Every call waiting for a reviewer, across threads, oldest first.
    /// Only those in threads `by` may act in.
    pub async fn pending_approvals(
        &self,
        by: &Identity,
    ) -> Result<Vec<(String, CallRecord)>, Error> {
        let mut pending = vec![];
        for (group_id, id) in self.store.open_calls().await? {
            if !self.may_act_in(by, &group_id).await? {
                continue;
            }
            if let Some(call) = self.store.call(&group_id, &id).await? {
                if call.status == CallStatus::PendingApproval {
                    pending.push((group_id, call));
                }
            }
        }
        pending.sort_by_key(|(_, call)| call.created_at);
        Ok(pending)
    }

    /// Arms the timeout of a pending approval.
    pub(crate) fn arm(&self, group_id: &str, call: &CallRecord) {
        let Some(deadline) = call.approval_deadline else {
            return;
        };
        let deadline = deadline.to_system_time();
        let key = (group_id.to_owned(), call.id.clone());
        {
            let mut armed = self.armed.lock().expect("armed lock");
            if armed.contains_key(&key) {
                return;
            }
            armed.insert(key, None);
        }
        let _ = self.timers.send(Timer {
            group_id: group_id.to_owned(),
            id: call.id.clone(),
            deadline,
        });
    }

    /// Runs the approval timers: each waits for its deadline, then rejects
    /// the call if it still waits (the state machine refuses otherwise).
    /// Starts the sweeper of waiting dispatch acknowledgements too: until
    /// it runs, acknowledgements are recorded at once.
    pub fn start_timers(self: &Arc<Self>) {
        self.acks.start(Arc::downgrade(self));
        let Some(mut timers) = self.timer_queue.lock().expect("timer lock").take() else {
            return;
        };
        let engine = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(timer) = timers.recv().await {
                let key = (timer.group_id.clone(), timer.id.clone());
                // Decided (and disarmed) before its timer got here.
                let armed = engine
                    .upgrade()
                    .is_some_and(|e| e.armed.lock().expect("armed lock").contains_key(&key));
                if !armed {
                    continue;
                }
                let weak = engine.clone();
                let task = tokio::spawn(async move {
                    let wait = timer
                        .deadline
                        .duration_since(SystemTime::now())
                        .unwrap_or_default();
                    tokio::time::sleep(wait).await;
                    let Some(engine) = weak.upgrade() else {
                        return;
                    };
                    let (g, id) = (&timer.group_id, &timer.id);
                    // Ours to end now: the decision below must not abort it.
                    engine
                        .armed
                        .lock()
                        .expect("armed lock")
                        .remove(&(g.clone(), id.clone()));
                    match engine
                        .decide(
                            &Identity::ferry(),
                            g,
                            id,
                            PermissionKind::RejectOnce,
                            Reviewer::Timeout,
                            None,
                        )
                        .await
                    {
                        Ok(_) => info!(group_id = ?g, call_id = ?id, "approval timed out"),
                        Err(Error::Rejected(Rejection::NotPendingApproval { .. })) => {}
                        Err(e) => {
                            warn!(group_id = ?g, call_id = ?id, error = %e, "approval timeout failed")
                        }
                    }
                });
                // Kept so that a decision can end the wait early; a timer
                // that already fired removed its entry, and keeps none.
                let Some(strong) = engine.upgrade() else {
                    return;
                };
                let mut armed = strong.armed.lock().expect("armed lock");
                if let Some(slot) = armed.get_mut(&key) {
                    *slot = Some(task.abort_handle());
                }
            }
        });
    }

    /// The calls whose timeouts are armed here.
    pub(super) fn armed_keys(&self) -> HashSet<(String, String)> {
        let armed = self.armed.lock().expect("armed lock");
        armed.keys().cloned().collect()
    }

    /// Ends the timeouts armed here of calls among `armed_before` but not
    /// in `pending`; those armed since stay.
    pub(super) fn disarm_all_but(
        &self,
        pending: &HashSet<(String, String)>,
        armed_before: &HashSet<(String, String)>,
    ) {
        let mut armed = self.armed.lock().expect("armed lock");
        armed.retain(|key, task| {
            let keep = pending.contains(key) || !armed_before.contains(key);
            if let (false, Some(task)) = (keep, task) {
                task.abort();
            }
            keep
        });
    }

    /// Ends a call's approval timeout, if armed here: it was decided.
    pub(super) fn disarm(&self, group_id: &str, id: &str) {
        let key = (group_id.to_owned(), id.to_owned());
        if let Some(Some(task)) = self.armed.lock().expect("armed lock").remove(&key) {
            task.abort();
        }
    }
}

/// The channel the engine arms timers on, and its receiving end.
pub(crate) fn timer_channel() -> (mpsc::UnboundedSender<Timer>, mpsc::UnboundedReceiver<Timer>) {
    mpsc::unbounded_channel()
}
