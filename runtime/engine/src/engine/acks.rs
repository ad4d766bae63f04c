//! Dispatch acknowledgements that ride with their thread's next command.
//!
//! A tool's 200 is recorded as `call_dispatched`. For a fast tool the
//! result follows within milliseconds, and recording the acknowledgement
//! as a command of its own (load, decide, write, flush, publish) costs
//! about as much as recording the result. Where one process records both
//! ([`super::Acknowledgements::RideWithNext`]: `ferry serve`), an
//! acknowledgement waits here instead, up to that long: the thread's next
//! command applies it first, in its own write, and the sweeper
//! ([`Engine::start_timers`]) records the ones no command took. The events
//! are the same and in the same order; only the write that carries them
//! changes. A crash loses a waiting acknowledgement: the call, still
//! queued, is dispatched again on recovery (invariant 4).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use ferry_proto::time::Timestamp;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

use super::{Durability, Engine};
use crate::thread::Command;

/// A tool's acknowledgement of call `id`, at `at`, after `attempts`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ack {
    pub id: String,
    pub attempts: u32,
    pub at: Timestamp,
}

impl Ack {
    pub fn command(&self) -> Command {
        Command::DispatchAcked {
            id: self.id.clone(),
            attempts: self.attempts,
        }
    }
}

/// The waiting acknowledgements, by thread.
pub(crate) struct Acks {
    waiting: Mutex<HashMap<String, Vec<Ack>>>,
    /// How many acknowledgements wait: most commands find none and skip
    /// the lock.
    count: AtomicUsize,
    /// Threads with an acknowledgement, each with when it is due.
    due: mpsc::UnboundedSender<(Instant, String)>,
    queue: Mutex<Option<mpsc::UnboundedReceiver<(Instant, String)>>>,
    /// Whether the sweeper runs: without it nothing may wait.
    sweeping: AtomicBool,
}

impl Default for Acks {
    fn default() -> Self {
        let (due, queue) = mpsc::unbounded_channel();
        Self {
            waiting: Mutex::default(),
            count: AtomicUsize::new(0),
            due,
            queue: Mutex::new(Some(queue)),
            sweeping: AtomicBool::new(false),
        }
    }
}

impl Acks {
    /// Leaves `ack` for the thread's next command, or for the sweeper once
    /// `hold` has passed. Returns it when it cannot wait: no `hold`, or no
    /// sweeper runs.
    pub fn wait(&self, group_id: &str, ack: Ack, hold: std::time::Duration) -> Result<(), Ack> {
        if hold.is_zero() || !self.sweeping.load(Ordering::Acquire) {
            return Err(ack);
        }
        let mut waiting = self.waiting.lock().expect("acks lock");
        waiting.entry(group_id.to_owned()).or_default().push(ack);
        // Counted under the lock, so the count never runs behind the map
        // (a sweeper reading it then would skip a thread for good).
        self.count.fetch_add(1, Ordering::AcqRel);
        drop(waiting);
        self.due(group_id, hold);
        Ok(())
    }

    fn due(&self, group_id: &str, hold: std::time::Duration) {
        let _ = self.due.send((Instant::now() + hold, group_id.to_owned()));
    }

    /// Takes the thread's waiting acknowledgements, oldest first.
    pub fn take(&self, group_id: &str) -> Vec<Ack> {
        if self.count.load(Ordering::Acquire) == 0 {
            return vec![];
        }
        let mut waiting = self.waiting.lock().expect("acks lock");
        let taken = waiting.remove(group_id).unwrap_or_default();
        self.count.fetch_sub(taken.len(), Ordering::AcqRel);
        taken
    }

    /// Gives back acknowledgements a command took and did not write, ahead
    /// of any that came since, due again after `hold` (their first turn
    /// with the sweeper may be over).
    pub fn restore(&self, group_id: &str, mut acks: Vec<Ack>, hold: std::time::Duration) {
        if acks.is_empty() {
            return;
        }
        let mut waiting = self.waiting.lock().expect("acks lock");
        let slot = waiting.entry(group_id.to_owned()).or_default();
        self.count.fetch_add(acks.len(), Ordering::AcqRel);
        acks.append(slot);
        *slot = acks;
        drop(waiting);
        self.due(group_id, hold);
    }

    /// The threads with acknowledgements waiting.
    pub fn threads(&self) -> Vec<String> {
        let waiting = self.waiting.lock().expect("acks lock");
        waiting.keys().cloned().collect()
    }

    /// Whether any acknowledgement of the thread waits.
    pub fn waits(&self, group_id: &str) -> bool {
        self.any_of(group_id, |_| true)
    }

    /// Whether the acknowledgement of call `id` waits: the call is
    /// dispatched, though its record does not say so yet.
    pub fn waits_for(&self, group_id: &str, id: &str) -> bool {
        self.any_of(group_id, |ack| ack.id == id)
    }

    fn any_of(&self, group_id: &str, matches: impl Fn(&Ack) -> bool) -> bool {
        self.count.load(Ordering::Acquire) > 0
            && self
                .waiting
                .lock()
                .expect("acks lock")
                .get(group_id)
                .is_some_and(|acks| acks.iter().any(matches))
    }

    /// Starts the sweeper: it records each thread's waiting
    /// acknowledgements once they are due and no command took them.
    pub fn start(&self, engine: Weak<Engine>) {
        let Some(mut queue) = self.queue.lock().expect("acks lock").take() else {
            return;
        };
        self.sweeping.store(true, Ordering::Release);
        tokio::spawn(async move {
            let mut next = None;
            loop {
                let (when, group_id) = match next.take() {
                    Some(due) => due,
                    None => match queue.recv().await {
                        Some(due) => due,
                        None => return,
                    },
                };
                if when > Instant::now() {
                    tokio::time::sleep_until(when).await;
                }
                // Everything due by now, in one wake-up.
                let now = Instant::now();
                let mut due = vec![group_id];
                while let Ok((when, group_id)) = queue.try_recv() {
                    if when > now {
                        next = Some((when, group_id));
                        break;
                    }
                    due.push(group_id);
                }
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                due.sort_unstable();
                due.dedup();
                for group_id in due {
                    if engine.acks.waits(&group_id) {
                        tokio::spawn(record(engine.clone(), group_id));
                    }
                }
            }
        });
    }
}

/// Records the thread's waiting acknowledgements on their own, flushed at
/// once: they have waited long enough.
async fn record(engine: Arc<Engine>, group_id: String) {
    if let Err(e) = engine.record_acks(&group_id, Durability::Await).await {
        warn!(group_id, error = %e, "could not record dispatch");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::{call, engine};
    use crate::engine::Error;
    use crate::thread::Rejection;
    use ferry_dispatch::Outcomes;
    use ferry_proto::api::{CallStatus, Event, EventKind};
    use ferry_store_sled::SledStore;
    use std::time::Duration;

    /// An engine whose acknowledgements wait for `hold`, with its sweeper
    /// running, and call `c1` of thread `g` accepted (seq 1) and
    /// acknowledged by its tool.
    async fn acknowledged(dir: &std::path::Path, hold: Duration) -> Arc<Engine> {
        let store = Arc::new(SledStore::open(dir).unwrap());
        let rides = super::super::Acknowledgements::RideWithNext(hold);
        let engine = Arc::new(engine(store).with_acknowledgements(rides));
        engine.start_timers();
        engine
            .execute("g", Command::Submit(call("c1", "a")))
            .await
            .unwrap();
        assert!(engine.acknowledged("g", "c1", 1).await);
        engine
    }

    async fn events(engine: &Engine) -> Vec<Event> {
        engine.store.events("g", 0, 100).await.unwrap()
    }

    fn kinds(events: &[Event]) -> Vec<(u64, &str)> {
        events.iter().map(|e| (e.seq, e.kind.name())).collect()
    }

    /// The acknowledgement waits, unwritten; the thread's next command
    /// writes it first, in its own commit, and answers with its own events
    /// only.
    #[tokio::test]
    async fn an_acknowledgement_rides_with_the_threads_next_command() {
        let dir = tempfile::tempdir().unwrap();
        let engine = acknowledged(dir.path(), Duration::from_secs(60)).await;
        assert!(engine.acks.waits_for("g", "c1"));
        assert_eq!(
            engine.store.load("g", &["c1"]).await.unwrap().meta.last_seq,
            1
        );
        // Acknowledged: a worker handed the call again does not send it.
        assert_eq!(engine.still_wanted("g", "c1").await, None);
        let cancelled = engine
            .execute("g", Command::Cancel { id: "c1".into() })
            .await
            .unwrap();
        assert_eq!(kinds(&cancelled.events), [(3, "call_cancelled")]);
        let all = events(&engine).await;
        assert_eq!(
            kinds(&all),
            [
                (1, "call_accepted"),
                (2, "call_dispatched"),
                (3, "call_cancelled")
            ]
        );
        assert!(matches!(
            all[1].kind,
            EventKind::CallDispatched { attempts: 1, .. }
        ));
        assert!(all[1].at <= all[2].at, "timestamps never go back");
        assert!(!engine.acks.waits("g"));
    }

    /// One that no command takes is written once due, and shown.
    #[tokio::test]
    async fn an_acknowledgement_no_command_takes_is_recorded_when_due() {
        let dir = tempfile::tempdir().unwrap();
        let engine = acknowledged(dir.path(), Duration::from_millis(50)).await;
        let mut tip = engine.watch("g").unwrap();
        tokio::time::timeout(Duration::from_secs(10), async {
            while *tip.borrow_and_update() < 2 {
                tip.changed().await.unwrap();
            }
        })
        .await
        .expect("the sweeper records the acknowledgement");
        assert_eq!(
            kinds(&events(&engine).await),
            [(1, "call_accepted"), (2, "call_dispatched")]
        );
        assert!(!engine.acks.waits("g"));
    }

    /// A refused command still writes the acknowledgements it carried, and
    /// durably: its refusal rests on them.
    #[tokio::test]
    async fn a_refused_command_writes_the_acknowledgements_it_carried() {
        let dir = tempfile::tempdir().unwrap();
        let engine = acknowledged(dir.path(), Duration::from_secs(60)).await;
        let refused = engine
            .execute("g", Command::Cancel { id: "nope".into() })
            .await;
        assert!(
            matches!(refused, Err(Error::Rejected(Rejection::UnknownCall(_)))),
            "{:?}",
            refused.err()
        );
        // Shown to readers, so durable, when the refusal was answered.
        assert_eq!(
            kinds(&events(&engine).await),
            [(1, "call_accepted"), (2, "call_dispatched")]
        );
    }

    /// A read of the call or its thread shows what the tool said.
    #[tokio::test]
    async fn a_read_shows_an_acknowledged_call_dispatched() {
        let dir = tempfile::tempdir().unwrap();
        let engine = acknowledged(dir.path(), Duration::from_secs(60)).await;
        let read = engine.call("g", "c1").await.unwrap();
        assert_eq!(read.status, CallStatus::Dispatched);
        assert_eq!(engine.thread("g").await.unwrap().last_seq, 2);
    }

    /// Without a hold, nothing waits.
    #[tokio::test]
    async fn without_a_hold_the_acknowledgement_is_recorded_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let engine = acknowledged(dir.path(), Duration::ZERO).await;
        assert!(!engine.acks.waits("g"));
        let state = engine.store.load("g", &["c1"]).await.unwrap();
        assert_eq!(state.calls["c1"].status, CallStatus::Dispatched);
    }

    fn ack(id: &str) -> Ack {
        Ack {
            id: id.into(),
            attempts: 1,
            at: Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn nothing_waits_without_a_sweeper() {
        let acks = Acks::default();
        let hold = std::time::Duration::from_millis(5);
        assert_eq!(acks.wait("g", ack("a"), hold), Err(ack("a")));
        assert!(acks.take("g").is_empty());
    }

    #[test]
    fn restored_acknowledgements_come_before_later_ones() {
        let acks = Acks::default();
        acks.sweeping.store(true, Ordering::Release);
        let hold = std::time::Duration::from_millis(5);
        acks.wait("g", ack("a"), hold).unwrap();
        acks.wait("h", ack("x"), hold).unwrap();
        let taken = acks.take("g");
        assert_eq!(taken, [ack("a")]);
        acks.wait("g", ack("b"), hold).unwrap();
        acks.restore("g", taken, hold);
        assert_eq!(acks.take("g"), [ack("a"), ack("b")]);
        assert_eq!(acks.take("h"), [ack("x")]);
        assert!(acks.take("g").is_empty());
        assert_eq!(acks.count.load(Ordering::Acquire), 0);
        // Each wait, and the restore, gave the sweeper a due thread: a
        // restored acknowledgement is swept again.
        let mut queue = acks.queue.lock().unwrap().take().unwrap();
        let mut due = vec![];
        while let Ok((_, group_id)) = queue.try_recv() {
            due.push(group_id);
        }
        assert_eq!(due, ["g", "h", "g", "g"]);
    }
}
