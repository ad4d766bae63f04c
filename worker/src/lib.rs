//! Ferry's dispatch (the worker side): it takes dispatch work, hands each
//! invocation to its tool through a [`ToolProtocol`] (RAP's is [`Rap`])
//! with bounded exponential backoff, and reports each outcome through the
//! [`Outcomes`] trait it owns. It also sends the
//! runtime-to-tool-server notifications (`rap-3`).
//!
//! **Invariant:** a worker keeps nothing between messages; every decision
//! about a call's state is the runtime's (through [`Outcomes`]).

mod dispatch;
pub mod metrics;
mod notify;
mod outbound;
mod rap;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ferry_proto::bus::Work;
use tokio::sync::Notify;
use tracing::{info, instrument, warn};

pub use dispatch::{Attempt, DispatchConfig, Dispatcher, Failure, ToolProtocol};
pub use notify::{CallLiveness, ChoiceDelivery, Notifier};
pub use outbound::{Networks, Outbound, Refused};
pub use rap::Rap;

/// Where a worker reports what happened to the calls it dispatches. The
/// runtime implements it by deciding through the thread state machine.
#[async_trait]
pub trait Outcomes: Send + Sync + 'static {
    /// Whether the call still waits to be dispatched (not cancelled, not
    /// already answered): `None` when it does not, otherwise the attempts
    /// recorded for it so far (a dispatch a crash interrupted made them),
    /// which count against the bound. Asked before every attempt.
    async fn still_wanted(&self, group_id: &str, id: &str) -> Option<u32>;
    /// Attempt number `attempts` failed for `reason` (safe to show); the
    /// next one follows in `wait`. Recording it is best effort: a report
    /// lost in a crash only lets the call's attempts count again from the
    /// last one recorded.
    async fn retrying(
        &self,
        group_id: &str,
        id: &str,
        attempts: u32,
        reason: String,
        wait: Duration,
    );
    /// The tool acknowledged with 200 after `attempts` attempts. Returns
    /// whether that is recorded (false: the store could not be reached).
    async fn acknowledged(&self, group_id: &str, id: &str, attempts: u32) -> bool;
    /// Dispatch gave up; `text` starts with `Error: ` and is safe to show.
    /// Returns whether that is recorded.
    async fn gave_up(&self, group_id: &str, id: &str, attempts: u32, text: String) -> bool;
}

/// What became of a work item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Its outcome is recorded: the work is done.
    Recorded,
    /// Its outcome could not be recorded (the store was out of reach): the
    /// work should be done again later.
    Unrecorded,
    /// The dispatcher was stopped before the work was done
    /// ([`Dispatcher::stop`]): another worker should take it now.
    HandedBack,
}

/// Takes work items and carries them out. Clones share what they count.
#[derive(Clone)]
pub struct Worker {
    dispatcher: Dispatcher,
    outcomes: Arc<dyn Outcomes>,
    busy: Arc<Busy>,
}

/// How many work items are being handled, and who waits for none. An
/// atomic count, not a watch: a watch's send wakes its eight waiter lists
/// on every change, twice per call on the hot path.
#[derive(Default)]
struct Busy {
    items: AtomicUsize,
    idle: Notify,
}

impl Busy {
    /// Resolves once no item is being handled.
    async fn idle(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Waiting before the count is read: a last item ending in
            // between still wakes it.
            idle.as_mut().enable();
            if self.items.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// One work item being handled, counted while it lives.
struct Item<'a>(&'a Busy);

impl<'a> Item<'a> {
    fn new(busy: &'a Busy) -> Self {
        busy.items.fetch_add(1, Ordering::SeqCst);
        Item(busy)
    }
}

impl Drop for Item<'_> {
    fn drop(&mut self) {
        if self.0.items.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Worker {
    pub fn new(dispatcher: Dispatcher, outcomes: Arc<dyn Outcomes>) -> Self {
        Self {
            dispatcher,
            outcomes,
            busy: Arc::default(),
        }
    }

    /// Stops its dispatcher ([`Dispatcher::stop`]): no attempt starts from
    /// now on, and work that only waits is handed back.
    pub fn stop(&self) {
        self.dispatcher.stop();
    }

    /// Resolves once no work item is being handled. Once its dispatcher is
    /// stopped ([`Dispatcher::stop`]) work that only waits ends at once, so
    /// this says when every attempt under way has its answer and its
    /// outcome was reported.
    pub async fn idle(&self) {
        self.busy.idle().await
    }

    /// Carries out one work item to its end (acknowledged or given up), or
    /// until the dispatcher stops. Work done again may send the tool the
    /// call twice (invariant 4).
    pub async fn handle(&self, work: Work) -> Handled {
        let _item = Item::new(&self.busy);
        match work {
            Work::Dispatch {
                endpoint,
                invocation,
            } => self.dispatch(&endpoint, &invocation).await,
        }
    }

    #[instrument(skip_all, fields(group_id = ?invocation.group_id, call_id = ?invocation.id))]
    async fn dispatch(&self, endpoint: &str, invocation: &ferry_proto::Invocation) -> Handled {
        let (group_id, id) = (invocation.group_id.as_str(), invocation.id.as_str());
        let started = Instant::now();
        let result = self
            .dispatcher
            .dispatch(endpoint, invocation, self.outcomes.as_ref())
            .await;
        let elapsed = started.elapsed().as_secs_f64();
        match result {
            Ok(attempts) => {
                metrics::record_outcome("acknowledged", elapsed);
                info!(attempts, "dispatched");
                recorded(self.outcomes.acknowledged(group_id, id, attempts).await)
            }
            Err(Failure::NotWanted { attempts }) => {
                metrics::record_outcome("not_wanted", elapsed);
                info!(
                    attempts,
                    "dispatch stopped: the call no longer waits for it"
                );
                Handled::Recorded
            }
            Err(failure @ Failure::Stopped { .. }) => {
                metrics::record_outcome(failure.kind(), elapsed);
                info!(
                    attempts = failure.attempts(),
                    "the worker is stopping: the call is handed back"
                );
                Handled::HandedBack
            }
            Err(failure) => {
                metrics::record_outcome(failure.kind(), elapsed);
                warn!(attempts = failure.attempts(), reason = %failure, "dispatch failed");
                let text = failure.to_string();
                recorded(
                    self.outcomes
                        .gave_up(group_id, id, failure.attempts(), text)
                        .await,
                )
            }
        }
    }
}

fn recorded(recorded: bool) -> Handled {
    if recorded {
        Handled::Recorded
    } else {
        Handled::Unrecorded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_waits_for_the_last_item_being_handled() {
        let busy = Arc::new(Busy::default());
        busy.idle().await;
        let (first, second) = (Item::new(&busy), Item::new(&busy));
        let waiting = tokio::spawn({
            let busy = busy.clone();
            async move { busy.idle().await }
        });
        drop(first);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "an item is still being handled");
        drop(second);
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("idle once the last item ended")
            .unwrap();
    }
}
