//! Turns at the bus, per thread, in the order commands were written.
//!
//! A command takes its turn while it holds its thread's lock, so turns
//! follow the thread's write order; it hands its call to the bus only once
//! it is durable, after the lock is gone, and two commands of one thread
//! become durable together (group commit) and then race. Waiting for its
//! turn before publishing keeps a thread's calls going out in the order
//! they were accepted (issue 2: one at a time, in order).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Turns {
    next: std::sync::atomic::AtomicU64,
    lines: Mutex<HashMap<String, Line>>,
}

/// The turns of one thread still outstanding.
struct Line {
    waiting: BTreeSet<u64>,
    changed: Arc<Notify>,
}

/// One command's place in its thread's line; leaves the line when dropped.
pub(crate) struct Turn {
    turns: Arc<Turns>,
    group_id: String,
    number: u64,
    changed: Arc<Notify>,
}

impl Turns {
    /// A place at the end of `group_id`'s line. Call it holding the
    /// thread's lock.
    pub fn take(self: &Arc<Self>, group_id: &str) -> Turn {
        let number = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut lines = self.lines.lock().expect("turns lock");
        let line = lines.entry(group_id.to_owned()).or_insert_with(|| Line {
            waiting: BTreeSet::new(),
            changed: Arc::new(Notify::new()),
        });
        line.waiting.insert(number);
        Turn {
            turns: self.clone(),
            group_id: group_id.to_owned(),
            number,
            changed: line.changed.clone(),
        }
    }

    fn first(&self, group_id: &str) -> Option<u64> {
        let lines = self.lines.lock().expect("turns lock");
        lines.get(group_id)?.waiting.first().copied()
    }
}

impl Turn {
    /// Returns once every turn taken before this one in its thread is gone.
    pub async fn come(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before looking, so a leave in between wakes us.
            changed.as_mut().enable();
            if self.turns.first(&self.group_id) == Some(self.number) {
                return;
            }
            changed.await;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut lines = self.turns.lines.lock().expect("turns lock");
        if let Some(line) = lines.get_mut(&self.group_id) {
            line.waiting.remove(&self.number);
            if line.waiting.is_empty() {
                lines.remove(&self.group_id);
            }
        }
        drop(lines);
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::time::Duration;

    #[tokio::test]
    async fn a_turn_comes_once_the_turns_before_it_are_gone() {
        let turns = Arc::new(Turns::default());
        let (a, b, c) = (turns.take("g"), turns.take("g"), turns.take("g"));
        let other = turns.take("h");
        // Another thread's line is its own.
        other.come().await;
        a.come().await;
        assert!(c.come().now_or_never().is_none(), "c came before a left");
        drop(a);
        assert!(c.come().now_or_never().is_none(), "c came before b left");
        let waiting = tokio::spawn(async move {
            c.come().await;
        });
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("c's turn came")
            .unwrap();
        assert!(turns.lines.lock().unwrap().get("g").is_none());
    }

    #[tokio::test]
    async fn a_turn_left_out_of_order_does_not_hold_the_line() {
        let turns = Arc::new(Turns::default());
        let (a, b, c) = (turns.take("g"), turns.take("g"), turns.take("g"));
        drop(b);
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), c.come())
            .await
            .expect("c's turn came");
    }
}
