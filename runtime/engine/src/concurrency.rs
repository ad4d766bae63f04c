//! Per-toolset concurrency limits in one process (`ferry serve`): at most
//! `limit` calls of a lane (one toolset version) dispatched and not yet
//! answered; the others wait here, in the order they were enqueued. A
//! waiting call is still `queued` in the store, so a restart re-enqueues
//! it (recovery, in acceptance order) and nothing waiting is lost.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

/// A call, as `(group_id, id)`.
pub type CallKey = (String, String);

#[derive(Default)]
struct Lane<W> {
    running: HashSet<CallKey>,
    waiting: VecDeque<(CallKey, W)>,
}

/// Every lane's running and waiting calls, with the work each waiting
/// call goes out as.
pub struct Lanes<W> {
    lanes: Mutex<HashMap<String, Lane<W>>>,
}

impl<W> Default for Lanes<W> {
    fn default() -> Self {
        Self {
            lanes: Mutex::default(),
        }
    }
}

impl<W> Lanes<W> {
    /// The work to send now, if the lane has room (or the call runs
    /// already: a repeat of its enqueue goes out again); else it waits.
    pub fn admit(&self, lane: &str, limit: usize, key: CallKey, work: W) -> Option<W> {
        let mut lanes = self.lanes.lock().expect("lanes lock");
        let lane = lanes.entry(lane.to_owned()).or_insert_with(|| Lane {
            running: HashSet::new(),
            waiting: VecDeque::new(),
        });
        if lane.running.contains(&key) || lane.running.len() < limit {
            lane.running.insert(key);
            return Some(work);
        }
        match lane.waiting.iter_mut().find(|(k, _)| *k == key) {
            Some(waiting) => waiting.1 = work,
            None => lane.waiting.push_back((key, work)),
        }
        None
    }

    /// Counts a call already dispatched (found so at a restart).
    pub fn hold(&self, lane: &str, key: CallKey) {
        let mut lanes = self.lanes.lock().expect("lanes lock");
        lanes
            .entry(lane.to_owned())
            .or_insert_with(|| Lane {
                running: HashSet::new(),
                waiting: VecDeque::new(),
            })
            .running
            .insert(key);
    }

    /// The call no longer needs its tool (answered, failed, cancelled):
    /// its room, if it held some, goes to the calls waiting longest, as
    /// many as now fit under `limit` (the limit may have changed). The
    /// caller sends their work.
    pub fn release(&self, lane: &str, limit: usize, key: &CallKey) -> Vec<(CallKey, W)> {
        let mut lanes = self.lanes.lock().expect("lanes lock");
        let Some(lane_state) = lanes.get_mut(lane) else {
            return vec![];
        };
        lane_state.running.remove(key);
        lane_state.waiting.retain(|(k, _)| k != key);
        let mut next = vec![];
        while lane_state.running.len() < limit {
            let Some((key, work)) = lane_state.waiting.pop_front() else {
                break;
            };
            lane_state.running.insert(key.clone());
            next.push((key, work));
        }
        if lane_state.running.is_empty() && lane_state.waiting.is_empty() {
            lanes.remove(lane);
        }
        next
    }

    /// Whether no lane has a call: most writes need not look further.
    pub fn is_empty(&self) -> bool {
        self.lanes.lock().expect("lanes lock").is_empty()
    }

    /// Whether the lane has running or waiting calls (for a caller that
    /// releases only where it must).
    pub fn knows(&self, lane: &str) -> bool {
        self.lanes.lock().expect("lanes lock").contains_key(lane)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> CallKey {
        ("g".into(), id.into())
    }

    #[test]
    fn at_most_the_limit_run_and_the_rest_go_in_order() {
        let lanes = Lanes::default();
        assert_eq!(lanes.admit("t", 2, key("a"), "a"), Some("a"));
        assert_eq!(lanes.admit("t", 2, key("b"), "b"), Some("b"));
        assert_eq!(lanes.admit("t", 2, key("c"), "c"), None);
        assert_eq!(lanes.admit("t", 2, key("d"), "d"), None);
        // A repeat of a running call's enqueue goes out; a waiting one's
        // keeps its place.
        assert_eq!(lanes.admit("t", 2, key("a"), "a"), Some("a"));
        assert_eq!(lanes.admit("t", 2, key("c"), "c"), None);
        assert_eq!(lanes.release("t", 2, &key("b")), vec![(key("c"), "c")]);
        // A waiting call that ends (cancelled) leaves the queue.
        assert!(lanes.release("t", 2, &key("d")).is_empty());
        assert!(lanes.release("t", 2, &key("a")).is_empty());
        assert!(lanes.release("t", 2, &key("c")).is_empty());
        assert!(!lanes.knows("t"));
    }

    #[test]
    fn held_calls_count_and_a_raised_limit_lets_more_go() {
        let lanes = Lanes::default();
        lanes.hold("t", key("old"));
        assert_eq!(lanes.admit("t", 1, key("a"), "a"), None);
        assert_eq!(lanes.admit("t", 1, key("b"), "b"), None);
        let next = lanes.release("t", 3, &key("old"));
        assert_eq!(next, vec![(key("a"), "a"), (key("b"), "b")]);
    }
}
