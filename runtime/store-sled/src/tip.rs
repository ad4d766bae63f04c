//! A thread's tip in memory: how far its log is durable, the writes not
//! yet published, and its newest events, so that a follower woken for
//! them reads memory instead of sled.

use std::collections::VecDeque;

use ferry_proto::api::Event;
use tokio::sync::watch;

use super::RECENT_EVENTS;

pub(super) struct Tip {
    pub(super) durable: watch::Sender<u64>,
    /// Writes made but not yet published.
    pub(super) pending: u32,
    /// The thread's newest events, in order and without gaps, durable or
    /// not (readers stop at `durable`): a follower reads what it was woken
    /// for from memory instead of sled.
    pub(super) recent: VecDeque<Event>,
}

impl Tip {
    pub(super) fn new(durable: u64) -> Self {
        Self {
            durable: watch::Sender::new(durable),
            pending: 0,
            recent: VecDeque::new(),
        }
    }

    pub(super) fn remember(&mut self, events: Vec<Event>) {
        let follows = match (self.recent.back(), events.first()) {
            (Some(back), Some(first)) => back.seq + 1 == first.seq,
            _ => true,
        };
        if !follows {
            self.recent.clear();
        }
        self.recent.extend(events);
        let excess = self.recent.len().saturating_sub(RECENT_EVENTS);
        self.recent.drain(..excess);
    }

    /// Durable events after `after` from memory, if memory holds them all.
    pub(super) fn events_after(&self, after: u64, limit: usize) -> Option<Vec<Event>> {
        let first = self.recent.front()?;
        if first.seq > after.saturating_add(1) {
            return None;
        }
        let durable = *self.durable.borrow();
        Some(
            self.recent
                .iter()
                .skip_while(|e| e.seq <= after)
                .take_while(|e| e.seq <= durable)
                .take(limit)
                .cloned()
                .collect(),
        )
    }
}
