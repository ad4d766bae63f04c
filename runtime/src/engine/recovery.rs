//! Start-up recovery (invariant 7 and `rap-3` "tool_call_status"): calls
//! still queued are enqueued again; for calls a tool server was already
//! given, that server is asked whether it still processes them.

use std::sync::Arc;

use ferry_proto::api::CallStatus;
use ferry_worker::CallLiveness;
use futures::StreamExt;
use tracing::{info, warn};

use super::{Engine, Error};
use crate::thread::{CallRecord, Command};

/// How many `/tool_call_status` questions are in flight at once.
const STATUS_CONCURRENCY: usize = 16;

/// The tool server a call waits on: an open call a server was given
/// (queued calls and pending approvals wait on Ferry, not on a tool).
fn waits_on(call: &CallRecord) -> Option<String> {
    match call.status {
        CallStatus::Queued | CallStatus::PendingApproval => None,
        status if status.is_open() => call.target.as_ref().map(|t| t.base_url.clone()),
        _ => None,
    }
}

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
        let mut requeued = 0;
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
                CallStatus::Queued => {
                    self.enqueue(&group_id, &call).await?;
                    requeued += 1;
                }
                // The deadline is stored with the call: re-arm it.
                CallStatus::PendingApproval => self.arm(&group_id, &call),
                status => {
                    if status == CallStatus::Subscribed {
                        subscribed += 1;
                    }
                    if let Some(server) = waits_on(&call) {
                        waiting.push((group_id, id, server));
                    }
                }
            }
        }
        ::metrics::gauge!(crate::metrics::ACTIVE_SUBSCRIPTIONS).set(subscribed as f64);
        info!(
            requeued,
            waiting = waiting.len(),
            "recovery: queued calls re-enqueued"
        );
        let asking = self.ask_tool_servers(waiting);
        Ok(async move {
            let (checked, pruned) = asking.await;
            Recovered {
                requeued,
                checked,
                pruned,
            }
        })
    }

    /// A cluster runtime node's recovery once it attached to NATS: asks
    /// tool servers about every call the cluster waits on them for, so a
    /// callback a tool gave up on while every node was down does not leave
    /// its call waiting for ever. Queued calls need nothing here (their
    /// work waits in JetStream), nor pending approvals (workers re-arm
    /// them). Nodes that start together ask twice; a second `Lost` for one
    /// call records nothing.
    pub async fn check_waiting_calls(
        self: &Arc<Self>,
    ) -> Result<impl std::future::Future<Output = Recovered> + Send + 'static, Error> {
        let mut waiting = vec![];
        for (group_id, id) in self.store.open_calls().await? {
            let call = self.store.call(&group_id, &id).await?;
            if let Some(server) = call.as_ref().and_then(waits_on) {
                waiting.push((group_id, id, server));
            }
        }
        let asking = self.ask_tool_servers(waiting);
        Ok(async move {
            let (checked, pruned) = asking.await;
            Recovered {
                requeued: 0,
                checked,
                pruned,
            }
        })
    }

    /// Asks each call's tool server whether it still processes the call, a
    /// few at once, and records the calls they lost. Returns how many were
    /// asked about and how many were pruned.
    fn ask_tool_servers(
        self: &Arc<Self>,
        waiting: Vec<(String, String, String)>,
    ) -> impl std::future::Future<Output = (usize, usize)> + Send + 'static {
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
            info!(
                checked,
                pruned, "recovery: tool servers asked about waiting calls"
            );
            (checked, pruned)
        }
    }

    /// The cluster's recovery sweep, run by every worker at start and then
    /// periodically: re-arms approval timeouts and re-sends undelivered
    /// choices of every open call. Dispatch work needs no sweep there (it
    /// waits in JetStream until a worker acks it). Arming a timer twice, or
    /// on two workers, is harmless: the state machine takes one decision.
    pub async fn rearm(self: &Arc<Self>) -> Result<usize, Error> {
        let mut rearmed = 0;
        let mut pending = std::collections::HashSet::new();
        for (group_id, id) in self.store.open_calls().await? {
            let Some(call) = self.store.call(&group_id, &id).await? else {
                continue;
            };
            if let Some(answer) = call.undelivered_choice.clone() {
                self.deliver(&group_id, &id, answer);
                rearmed += 1;
            }
            if call.status == CallStatus::PendingApproval {
                self.arm(&group_id, &call);
                pending.insert((group_id, id));
                rearmed += 1;
            }
        }
        // Calls decided elsewhere (another worker, a cancel) wait for no
        // timeout here any more.
        self.disarm_all_but(&pending);
        Ok(rearmed)
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
