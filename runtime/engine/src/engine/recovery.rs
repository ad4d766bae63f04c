//! Start-up recovery (invariant 7 and `rap-3` "tool_call_status"): calls
//! still queued are enqueued again; for calls a tool server was already
//! given, that server is asked whether it still processes them; approval timeouts are
//! armed again and answers still owed to a `response_url` delivered again.

use std::sync::Arc;

use ferry_dispatch::CallLiveness;
use ferry_proto::api::CallStatus;
use futures::StreamExt;
use tracing::{info, warn};

use super::{Engine, Error};
use crate::thread::Command;

/// How many `/tool_call_status` questions are in flight at once.
const STATUS_CONCURRENCY: usize = 16;

/// What recovery found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    pub requeued: usize,
    pub checked: usize,
    pub pruned: usize,
}

impl Engine {
    /// Re-enqueues queued calls now, then asks tool servers about the rest.
    /// Runs before HTTP intake starts; the status questions finish in the
    /// returned background future so start-up does not wait on tools.
    pub async fn recover(
        self: &Arc<Self>,
    ) -> Result<impl std::future::Future<Output = Recovered> + Send + 'static, Error> {
        let mut queued = vec![];
        let mut waiting = vec![];
        let mut subscribed = 0i64;
        for (group_id, id) in self.store.open_calls().await? {
            let Some(call) = self.store.call(&group_id, &id).await? else {
                continue;
            };
            if let Some(answer) = call.undelivered_choice.clone() {
                self.deliver(&group_id, &id, answer);
            }
            match call.status {
                CallStatus::Queued => queued.push((group_id, call)),
                // The deadline is stored with the call: re-arm it.
                CallStatus::PendingApproval => self.arm(&group_id, &call),
                status if status.is_open() => {
                    if status.is_pending() {
                        self.hold_lane(&group_id, &call);
                    }
                    if status == CallStatus::Subscribed {
                        subscribed += 1;
                    }
                    if let Some(target) = call.target {
                        waiting.push((group_id, id, self.server_of(&target)));
                    }
                }
                _ => {}
            }
        }
        // A thread's calls go out in the order they were accepted (the
        // open calls come sorted by id, which says nothing of that).
        queued.sort_by(|(g1, c1), (g2, c2)| (g1, c1.accepted_seq).cmp(&(g2, c2.accepted_seq)));
        let requeued = queued.len();
        // Sorted by thread: each thread's ancestors are read once.
        let mut ancestors: Option<(&str, Option<Vec<String>>)> = None;
        for (group_id, call) in &queued {
            if ancestors.as_ref().is_none_or(|(g, _)| g != group_id) {
                ancestors = Some((group_id, self.recorded_ancestors(group_id).await?));
            }
            let of_thread = ancestors.as_ref().and_then(|(_, a)| a.as_deref());
            self.enqueue(group_id, call, of_thread).await?;
        }
        ::metrics::gauge!(crate::metrics::ACTIVE_SUBSCRIPTIONS).set(subscribed as f64);
        info!(
            requeued,
            waiting = waiting.len(),
            "recovery: queued calls re-enqueued"
        );
        let asked = self.ask_about(waiting);
        Ok(async move {
            Recovered {
                requeued,
                ..asked.await
            }
        })
    }

    /// The cluster's recovery sweep, run by every worker at start and then
    /// periodically: re-arms approval timeouts and re-sends undelivered
    /// choices of every open call, and asks tool servers about the calls
    /// they were given (`/tool_call_status`, the rules of [`Engine::recover`])
    /// that have not changed for `ask_after` (zero: every one, as a worker
    /// does at start). Dispatch work needs no sweep there (it waits in the
    /// thread log until a worker acks it). Arming a timer twice, or on two
    /// workers, is harmless: the state machine takes one decision. Returns
    /// what it re-armed, and what is left of it: the status questions,
    /// which finish in the background.
    pub async fn rearm(
        self: &Arc<Self>,
        ask_after: std::time::Duration,
    ) -> Result<
        (
            usize,
            impl std::future::Future<Output = Recovered> + Send + 'static,
        ),
        Error,
    > {
        let mut rearmed = 0;
        let mut pending = std::collections::HashSet::new();
        let mut waiting = vec![];
        let asked_before = std::time::SystemTime::now().checked_sub(ask_after);
        // Timers armed from here on (calls this worker accepts while the
        // sweep walks every thread) are not the sweep's to end: its listing
        // may not have seen their calls.
        let armed_before = self.armed_keys();
        for (group_id, id) in self.store.open_calls().await? {
            let Some(call) = self.store.call(&group_id, &id).await? else {
                continue;
            };
            if let Some(answer) = call.undelivered_choice.clone() {
                self.deliver(&group_id, &id, answer);
                rearmed += 1;
            }
            match call.status {
                CallStatus::PendingApproval => {
                    self.arm(&group_id, &call);
                    pending.insert((group_id, id));
                    rearmed += 1;
                }
                CallStatus::Queued => {}
                status if status.is_open() => {
                    let quiet = asked_before
                        .is_some_and(|before| call.updated_at.to_system_time() <= before);
                    if let (true, Some(target)) = (quiet, call.target) {
                        waiting.push((group_id, id, self.server_of(&target)));
                    }
                }
                _ => {}
            }
        }
        // Calls decided elsewhere (another worker, a cancel) wait for no
        // timeout here any more.
        self.disarm_all_but(&pending, &armed_before);
        Ok((rearmed, self.ask_about(waiting)))
    }

    /// The base URL `/tool_call_status` is asked at, with its credentials.
    fn server_of(&self, target: &ferry_proto::api::ToolTarget) -> String {
        self.registry.authorised(&target.base_url, &target.base_url)
    }

    /// Asks tool servers about `waiting` calls, a few at once, recording
    /// the losses.
    fn ask_about(
        self: &Arc<Self>,
        waiting: Vec<(String, String, String)>,
    ) -> impl std::future::Future<Output = Recovered> + Send + 'static {
        let engine = self.clone();
        async move {
            let checked = waiting.len();
            let pruned = futures::stream::iter(waiting)
                .map(|(group_id, id, server)| {
                    let engine = engine.clone();
                    async move { engine.check_liveness(&group_id, &id, &server).await }
                })
                .buffer_unordered(STATUS_CONCURRENCY)
                .filter(|pruned| std::future::ready(*pruned))
                .count()
                .await;
            if checked > 0 {
                info!(
                    checked,
                    pruned, "recovery: tool servers asked about waiting calls"
                );
            }
            Recovered {
                requeued: 0,
                checked,
                pruned,
            }
        }
    }

    /// Asks `server` about one call and prunes it if the server lost it.
    /// Returns whether it was pruned.
    async fn check_liveness(&self, group_id: &str, id: &str, server: &str) -> bool {
        match self.notifier.tool_call_status(server, group_id, id).await {
            CallLiveness::Alive | CallLiveness::Unknown => false,
            CallLiveness::Lost => {
                warn!(
                    group_id,
                    call_id = id,
                    "tool server lost the call; recording the loss"
                );
                match self
                    .execute(group_id, Command::Lost { id: id.into() })
                    .await
                {
                    Ok(executed) => !executed.events.is_empty(),
                    Err(e) => {
                        warn!(group_id, call_id = id, error = %e, "could not record a lost call");
                        false
                    }
                }
            }
        }
    }
}
