//! How a `ferry worker` stops (SIGTERM, Ctrl-C): it drains, then gives up.
//!
//! Draining, it takes no more work: its pulls end, and a message they still
//! bring is handed back (a nak: another worker gets it at once, not after
//! the ack deadline). What is under way goes on to its end: a request being
//! applied, so that the node waiting on it gets its answer; a dispatch
//! attempt waiting for its tool's 200, so that the tool is not sent the call
//! a second time by the worker that takes it over. Work that was only
//! waiting (for a free slot, or out a retry's backoff) is handed back at
//! once (`ferry_dispatch::Dispatcher::stop`).
//!
//! Once the drain time is over the worker gives up: what is still under way
//! is handed back, and the worker exits. A worker killed outright (SIGKILL)
//! loses nothing either; its messages come back after the ack deadline.

use std::sync::Arc;

use tokio::sync::watch;

/// Where a stopping worker is; each phase follows the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Working,
    /// Takes no more work; finishes what is under way.
    Draining,
    /// Hands back what is still under way.
    GivingUp,
}

/// A worker's stop, shared by its consumers and the work they run.
#[derive(Clone)]
pub struct Stop(Arc<watch::Sender<Phase>>);

impl Default for Stop {
    fn default() -> Self {
        Stop(Arc::new(watch::Sender::new(Phase::Working)))
    }
}

impl Stop {
    /// Moves the worker on to `phase`, unless it is there or past it.
    pub fn enter(&self, phase: Phase) {
        self.0.send_if_modified(|now| {
            let later = phase > *now;
            if later {
                *now = phase;
            }
            later
        });
    }

    /// Whether the worker is at `phase` or past it.
    pub fn at(&self, phase: Phase) -> bool {
        *self.0.borrow() >= phase
    }

    /// Resolves once the worker is at `phase` or past it.
    pub async fn reached(&self, phase: Phase) {
        let mut now = self.0.subscribe();
        // The sender lives as long as `self`.
        let _ = now.wait_for(|now| *now >= phase).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn phases_only_move_forward_and_wake_who_waits_for_them() {
        let stop = Stop::default();
        assert!(stop.at(Phase::Working) && !stop.at(Phase::Draining));
        let waiting = tokio::spawn({
            let stop = stop.clone();
            async move { stop.reached(Phase::Draining).await }
        });
        stop.enter(Phase::Draining);
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the drain wakes who waits for it")
            .unwrap();
        stop.enter(Phase::GivingUp);
        stop.enter(Phase::Draining);
        assert!(stop.at(Phase::GivingUp), "a phase never goes back");
        // Reached already: resolves at once.
        tokio::time::timeout(Duration::from_secs(10), stop.reached(Phase::Draining))
            .await
            .expect("a phase passed resolves at once");
    }
}
