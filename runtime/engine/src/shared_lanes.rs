//! Per-toolset concurrency limits that every process of a cluster shares:
//! one [`Lane`] record per lane (a toolset version), kept by the
//! [`SharedLanes`] port (JetStream KV in `ferry-nats`, written
//! compare-and-set). A worker that takes a call of a limited lane enters
//! it: with room, the call runs; without, it waits in the record, in
//! acceptance order, and the work that carried it is done with. Whoever
//! writes a call's end leaves the lane for it, which gives the room to the
//! calls waiting longest and hands them to dispatch again.
//!
//! The record is the pure half (`enter`, `leave`, `promote`), so the
//! rules are tested without NATS; the adapter only reads, applies and
//! writes back.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use crate::concurrency::CallKey;
use crate::store;
use crate::thread::CallRecord;

/// Where a call stands in its lane's acceptance order: the time its call
/// was accepted (by the accepting node's clock, to the millisecond), then
/// the commit's position in its stream, then its key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Order {
    pub accepted_ms: u64,
    pub seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    pub key: CallKey,
    /// When it was given room (ms since the epoch), for the sweep.
    pub since_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    pub order: Order,
    pub key: CallKey,
}

/// One lane's calls: those given room, and those waiting for it, oldest
/// first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lane {
    pub running: Vec<Running>,
    pub waiting: Vec<Waiting>,
}

/// What entering a lane did for the call that entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entered {
    /// It has room: dispatch it now.
    Runs,
    /// It waits, at this place (0: next).
    Waits(usize),
}

impl Lane {
    /// `key` enters the lane of `limit`: it runs when it already holds
    /// room (a repeat) or is among the oldest waiting that fit. Also
    /// returns the other calls given room by the way (room left by a
    /// leave whose hand-out was lost), which must be handed to dispatch.
    pub fn enter(
        &mut self,
        limit: usize,
        key: &CallKey,
        order: Order,
        now_ms: u64,
    ) -> (Entered, Vec<CallKey>) {
        if self.runs(key) {
            return (Entered::Runs, vec![]);
        }
        if !self.waiting.iter().any(|w| &w.key == key) {
            let at = self
                .waiting
                .partition_point(|w| (&w.order, &w.key) <= (&order, key));
            self.waiting.insert(
                at,
                Waiting {
                    order,
                    key: key.clone(),
                },
            );
        }
        let mut promoted = self.promote(limit, now_ms);
        if let Some(at) = promoted.iter().position(|k| k == key) {
            promoted.remove(at);
            return (Entered::Runs, promoted);
        }
        let place = self.waiting.iter().position(|w| &w.key == key);
        (Entered::Waits(place.unwrap_or(0)), promoted)
    }

    /// `key` no longer needs its tool (or no longer waits): it leaves,
    /// and the calls waiting longest take the room it leaves. Returns
    /// whether it was there, and the calls given room.
    pub fn leave(&mut self, limit: usize, key: &CallKey, now_ms: u64) -> (bool, Vec<CallKey>) {
        let before = self.running.len() + self.waiting.len();
        self.running.retain(|r| &r.key != key);
        self.waiting.retain(|w| &w.key != key);
        let was_there = self.running.len() + self.waiting.len() < before;
        (was_there, self.promote(limit, now_ms))
    }

    /// Moves the oldest waiting calls into the room there is.
    pub fn promote(&mut self, limit: usize, now_ms: u64) -> Vec<CallKey> {
        let room = limit
            .saturating_sub(self.running.len())
            .min(self.waiting.len());
        self.waiting
            .drain(..room)
            .map(|w| {
                self.running.push(Running {
                    key: w.key.clone(),
                    since_ms: now_ms,
                });
                w.key
            })
            .collect()
    }

    pub fn runs(&self, key: &CallKey) -> bool {
        self.running.iter().any(|r| &r.key == key)
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }
}

/// How long a call may hold room without a single dispatch attempt before
/// the sweep hands it to dispatch again (the hand-out was lost).
pub const LOST_HAND_OUT_MS: u64 = 60_000;

/// What a sweep does with a call holding room, by what the store holds of
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swept {
    /// Still at its tool, or on its way there.
    Keep,
    /// Ended (or unknown): its room is taken back.
    Leave,
    /// Given room long ago and never tried: its hand-out was lost.
    HandOut,
}

impl Swept {
    pub fn of(running: &Running, call: Option<&CallRecord>, now_ms: u64) -> Self {
        match call {
            Some(call) if call.status.is_pending() => {
                let lost = call.awaits_dispatch()
                    && call.attempts == 0
                    && now_ms.saturating_sub(running.since_ms) > LOST_HAND_OUT_MS;
                if lost {
                    Self::HandOut
                } else {
                    Self::Keep
                }
            }
            _ => Self::Leave,
        }
    }
}

/// The port that keeps every lane's record where all processes read it.
#[async_trait]
pub trait SharedLanes: Send + Sync {
    /// `key` enters `lane`; calls given room by the way are handed to
    /// dispatch before this returns.
    async fn enter(
        &self,
        lane: &str,
        limit: usize,
        key: &CallKey,
        order: Order,
    ) -> Result<Entered, store::Error>;

    /// `key` leaves `lane`; the calls given its room are handed to
    /// dispatch before this returns.
    async fn leave(&self, lane: &str, limit: usize, key: &CallKey) -> Result<(), store::Error>;

    /// Gives the room there is in `lane` to the calls waiting longest
    /// (its limit was raised, say).
    async fn promote(&self, lane: &str, limit: usize) -> Result<(), store::Error>;

    /// Hands `key`, given room at `since_ms`, to dispatch again: the
    /// hand-out that gave it room was lost.
    async fn hand_out(&self, key: &CallKey, since_ms: u64) -> Result<(), store::Error>;

    /// Every lane with calls in it, and its record.
    async fn lanes(&self) -> Result<Vec<(String, Lane)>, store::Error>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> CallKey {
        (format!("g{n}"), format!("c{n}"))
    }

    fn order(n: u32) -> Order {
        Order {
            accepted_ms: 1_000 + u64::from(n),
            seq: u64::from(n),
        }
    }

    #[test]
    fn calls_run_up_to_the_limit_and_wait_in_acceptance_order() {
        let mut lane = Lane::default();
        assert_eq!(lane.enter(2, &key(0), order(0), 5).0, Entered::Runs);
        assert_eq!(lane.enter(2, &key(1), order(1), 5).0, Entered::Runs);
        // Entered out of order (two workers), waiting in order all the same.
        assert_eq!(lane.enter(2, &key(3), order(3), 5).0, Entered::Waits(0));
        assert_eq!(lane.enter(2, &key(2), order(2), 5).0, Entered::Waits(0));
        assert_eq!(lane.enter(2, &key(4), order(4), 5).0, Entered::Waits(2));
        // A repeat keeps its place.
        assert_eq!(lane.enter(2, &key(3), order(3), 5).0, Entered::Waits(1));
        assert_eq!(lane.enter(2, &key(0), order(0), 5).0, Entered::Runs);
        assert_eq!(lane.leave(2, &key(0), 9), (true, vec![key(2)]));
        assert_eq!(lane.leave(2, &key(1), 9), (true, vec![key(3)]));
        assert!(lane.runs(&key(2)) && lane.runs(&key(3)));
        assert_eq!(lane.leave(2, &key(1), 9), (false, vec![]));
    }

    #[test]
    fn a_waiting_call_that_leaves_gives_up_its_place() {
        let mut lane = Lane::default();
        lane.enter(1, &key(0), order(0), 0);
        lane.enter(1, &key(1), order(1), 0);
        lane.enter(1, &key(2), order(2), 0);
        assert_eq!(lane.leave(1, &key(1), 0), (true, vec![]));
        assert_eq!(lane.leave(1, &key(0), 0), (true, vec![key(2)]));
        assert_eq!(lane.leave(1, &key(2), 0), (true, vec![]));
        assert!(lane.is_empty());
    }

    #[test]
    fn room_left_by_a_lost_hand_out_goes_to_the_oldest_on_the_next_entry() {
        let mut lane = Lane {
            running: vec![],
            waiting: vec![Waiting {
                order: order(0),
                key: key(0),
            }],
        };
        // c1 is newer: c0 takes the room, c1 waits, and c0 is handed out.
        assert_eq!(
            lane.enter(1, &key(1), order(1), 0),
            (Entered::Waits(0), vec![key(0)])
        );
    }

    #[test]
    fn the_sweep_takes_back_room_of_ended_calls_and_hands_out_lost_ones() {
        use ferry_proto::api::CallStatus;
        let held = Running {
            key: key(0),
            since_ms: 1_000,
        };
        let submission = crate::thread::Submission {
            operation: "op".into(),
            arguments: serde_json::json!({}),
            call_id: None,
            user_id: None,
            thread_ancestors: None,
        };
        let mut call = CallRecord::queued(
            "c0",
            submission,
            "T.op@1.0.0".into(),
            None,
            1,
            ferry_proto::time::Timestamp::from_millis(1_000),
        );
        let soon = 1_000 + LOST_HAND_OUT_MS;
        let late = soon + 1;
        assert_eq!(Swept::of(&held, Some(&call), soon), Swept::Keep);
        assert_eq!(Swept::of(&held, Some(&call), late), Swept::HandOut);
        call.attempts = 1;
        assert_eq!(
            Swept::of(&held, Some(&call), late),
            Swept::Keep,
            "a dispatch is under way"
        );
        call.status = CallStatus::Dispatched;
        assert_eq!(Swept::of(&held, Some(&call), late), Swept::Keep);
        call.status = CallStatus::Completed;
        assert_eq!(Swept::of(&held, Some(&call), soon), Swept::Leave);
        assert_eq!(Swept::of(&held, None, soon), Swept::Leave);
    }

    #[test]
    fn a_raised_limit_lets_more_in() {
        let mut lane = Lane::default();
        for n in 0..4 {
            lane.enter(1, &key(n), order(n), 0);
        }
        assert_eq!(lane.promote(3, 0), vec![key(1), key(2)]);
    }
}
