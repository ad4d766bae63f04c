//! Consumers at work in one process (`ferry serve`): which threads may have
//! an event to hand out, the one event of each thread that is out, and
//! the cursors kept in the [`DeliveryStore`]. The rules of one thread's
//! delivery are `ferry_core::consumer`'s; here they meet the stores.
//!
//! What is out lives in memory only: after a restart every event not
//! acknowledged is handed out again (its delivery count starts over), and
//! nothing acknowledged is, since an acknowledgement is durable before it
//! is answered.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use ferry_proto::api::Event;
use ferry_proto::time::Timestamp;
use serde::Serialize;

use crate::consumer::{toolset_of, Acked, ConsumerSpec, Due, Filter, ThreadDelivery};
use crate::store::{self, DeadLetter, DeliveryStore, Store, StoredConsumer};

/// Most threads one pull looks into: the rest wait for the next.
const MAX_THREADS_PER_TAKE: usize = 1000;
/// Events read from a thread's log at a time.
const PAGE: usize = 128;
/// Most events counted for a consumer's `pending`.
pub const MAX_COUNTED: usize = 10_000;

pub const DELIVERIES: &str = "ferry_consumer_deliveries_total";
pub const REDELIVERIES: &str = "ferry_consumer_redeliveries_total";
pub const DEAD_LETTERED: &str = "ferry_consumer_dead_lettered_total";
pub const PENDING: &str = "ferry_consumer_pending";
pub const OLDEST_PENDING: &str = "ferry_consumer_oldest_pending_seconds";

pub fn describe() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(DELIVERIES, "events handed out, by consumer");
    describe_counter!(
        REDELIVERIES,
        "events handed out again after their ack_wait, by consumer"
    );
    describe_counter!(
        DEAD_LETTERED,
        "events given up after max_deliver deliveries, by consumer"
    );
    describe_gauge!(
        PENDING,
        "events a consumer has not had acknowledged, as last counted"
    );
    describe_gauge!(
        OLDEST_PENDING,
        "age of a consumer's oldest event not acknowledged, as last counted"
    );
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no consumer {0:?}")]
    Unknown(String),
    #[error("consumer {0:?} exists with another spec; delete it first, or choose another name")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// An event handed out, with how many times it was.
#[derive(Debug, Clone, Serialize)]
pub struct Delivered {
    #[serde(flatten)]
    pub event: Event,
    pub deliveries: u32,
}

/// One `(group_id, seq)` an acknowledgement named and changed nothing for.
#[derive(Debug, Clone, Serialize)]
pub struct Ignored {
    pub group_id: String,
    pub seq: u64,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct AckReply {
    pub acknowledged: usize,
    pub ignored: Vec<Ignored>,
}

/// A consumer as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerView {
    #[serde(flatten)]
    pub spec: ConsumerSpec,
    pub created_at: Timestamp,
    pub created_by: String,
    /// Events not acknowledged yet (out or not), counted up to
    /// [`MAX_COUNTED`]; `pending_exact` is false beyond.
    pub pending: usize,
    pub pending_exact: bool,
    /// Handed out and not acknowledged.
    pub out: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_pending_age_secs: Option<u64>,
    /// Since this process started.
    pub deliveries: u64,
    pub redeliveries: u64,
    pub dead_lettered: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letters: Option<Vec<DeadLetter>>,
}

pub struct Consumers {
    store: Arc<dyn DeliveryStore>,
    live: RwLock<HashMap<String, Arc<Live>>>,
}

/// One consumer at work.
pub struct Live {
    stored: StoredConsumer,
    ready: Mutex<Ready>,
    /// Woken when a thread becomes ready.
    pub woken: tokio::sync::Notify,
    state: tokio::sync::Mutex<State>,
    deliveries: AtomicU64,
    redeliveries: AtomicU64,
}

/// Threads that may have an event to hand out, oldest first, each once.
#[derive(Default)]
struct Ready {
    queue: VecDeque<String>,
    queued: HashSet<String>,
}

impl Ready {
    fn push(&mut self, group_id: &str) {
        if self.queued.insert(group_id.to_owned()) {
            self.queue.push_back(group_id.to_owned());
        }
    }

    fn pop(&mut self) -> Option<String> {
        let g = self.queue.pop_front()?;
        self.queued.remove(&g);
        Some(g)
    }
}

#[derive(Default)]
struct State {
    threads: HashMap<String, ThreadDelivery>,
    /// Events out, by when they come back: `(until_ms, group_id)`.
    out: BTreeSet<(u64, String)>,
}

impl Live {
    fn new(stored: StoredConsumer, threads: HashMap<String, ThreadDelivery>) -> Self {
        Self {
            stored,
            ready: Mutex::default(),
            woken: tokio::sync::Notify::new(),
            state: tokio::sync::Mutex::new(State {
                threads,
                out: BTreeSet::new(),
            }),
            deliveries: AtomicU64::new(0),
            redeliveries: AtomicU64::new(0),
        }
    }

    pub fn spec(&self) -> &ConsumerSpec {
        &self.stored.spec
    }

    fn filter(&self) -> &Filter {
        &self.stored.spec.filter
    }

    fn make_ready(&self, group_id: &str) {
        self.ready.lock().expect("ready lock").push(group_id);
        self.woken.notify_waiters();
    }

    /// When the first event out comes back, if one is out.
    pub async fn next_overdue_ms(&self) -> Option<u64> {
        self.state.lock().await.out.first().map(|(until, _)| *until)
    }
}

impl Consumers {
    /// Every stored consumer, each thread it may have work in made ready.
    pub async fn load(
        deliveries: Arc<dyn DeliveryStore>,
        threads: &dyn Store,
    ) -> Result<Self, Error> {
        let consumers = Self {
            store: deliveries.clone(),
            live: RwLock::default(),
        };
        let metas = threads.threads().await?;
        for stored in deliveries.consumers().await? {
            let name = stored.spec.name.clone();
            let cursors: HashMap<String, u64> =
                deliveries.cursors(&name).await?.into_iter().collect();
            let live = Live::new(
                stored,
                cursors
                    .iter()
                    .map(|(g, done)| {
                        let thread = ThreadDelivery {
                            done: *done,
                            out: None,
                        };
                        (g.clone(), thread)
                    })
                    .collect(),
            );
            for meta in &metas {
                let done = cursors.get(&meta.group_id).copied().unwrap_or(0);
                if meta.last_seq > done && live.filter().takes_thread(&meta.group_id) {
                    live.make_ready(&meta.group_id);
                }
            }
            consumers
                .live
                .write()
                .expect("consumers lock")
                .insert(name, Arc::new(live));
        }
        Ok(consumers)
    }

    pub fn get(&self, name: &str) -> Result<Arc<Live>, Error> {
        self.live
            .read()
            .expect("consumers lock")
            .get(name)
            .cloned()
            .ok_or_else(|| Error::Unknown(name.to_owned()))
    }

    pub fn all(&self) -> Vec<Arc<Live>> {
        let mut all: Vec<_> = self
            .live
            .read()
            .expect("consumers lock")
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.spec().name.cmp(&b.spec().name));
        all
    }

    /// Makes a consumer (which starts at every thread's beginning), or
    /// finds the same one made before: `true` when it is new.
    pub async fn create(
        &self,
        spec: ConsumerSpec,
        by: &str,
        now: Timestamp,
        threads: &dyn Store,
    ) -> Result<(Arc<Live>, bool), Error> {
        if let Ok(existing) = self.get(&spec.name) {
            if existing.stored.spec == spec {
                return Ok((existing, false));
            }
            return Err(Error::Conflict(spec.name));
        }
        let stored = StoredConsumer {
            spec,
            created_at: now,
            created_by: by.to_owned(),
        };
        let metas = threads.threads().await?;
        self.store.put_consumer(&stored).await?;
        let name = stored.spec.name.clone();
        let live = Arc::new(Live::new(stored, HashMap::new()));
        for meta in metas {
            if live.filter().takes_thread(&meta.group_id) {
                live.make_ready(&meta.group_id);
            }
        }
        let mut all = self.live.write().expect("consumers lock");
        // Two creates of one name at once: the first made wins, and the
        // second answers as a repeat would (or a conflict).
        if let Some(first) = all.get(&name) {
            return if first.stored.spec == live.stored.spec {
                Ok((first.clone(), false))
            } else {
                Err(Error::Conflict(name))
            };
        }
        all.insert(name, live.clone());
        Ok((live, true))
    }

    pub async fn delete(&self, name: &str) -> Result<(), Error> {
        self.get(name)?;
        self.store.delete_consumer(name).await?;
        let removed = self.live.write().expect("consumers lock").remove(name);
        if let Some(live) = removed {
            // Pullers waiting on it end, finding it gone.
            live.woken.notify_waiters();
        }
        Ok(())
    }

    /// A thread was written: the consumers that take it have work to look
    /// at.
    /// Whether any consumer takes thread `group_id`.
    pub fn any_takes(&self, group_id: &str) -> bool {
        let live = self.live.read().expect("consumers lock");
        live.values().any(|l| l.filter().takes_thread(group_id))
    }

    pub fn touched(&self, group_id: &str) {
        for live in self.live.read().expect("consumers lock").values() {
            if live.filter().takes_thread(group_id) {
                live.make_ready(group_id);
            }
        }
    }

    /// Hands out at most `max` events now (none waiting for more): events
    /// come back after their `ack_wait`, first; then the first event of
    /// each ready thread that is not held back.
    pub async fn take(
        &self,
        threads: &dyn Store,
        live: &Live,
        max: usize,
        now_ms: u64,
    ) -> Result<Vec<Delivered>, Error> {
        let spec = live.spec();
        let mut state = live.state.lock().await;
        let overdue: Vec<String> = state
            .out
            .iter()
            .take_while(|(until, _)| *until <= now_ms)
            .map(|(_, g)| g.clone())
            .collect();
        let mut candidates: VecDeque<String> = overdue.into();
        let mut out = vec![];
        let mut dead = vec![];
        let mut looked = 0;
        while out.len() < max && looked < MAX_THREADS_PER_TAKE {
            let group_id = match candidates.pop_front() {
                Some(g) => g,
                None => match live.ready.lock().expect("ready lock").pop() {
                    Some(g) => g,
                    None => break,
                },
            };
            looked += 1;
            let thread = state.threads.entry(group_id.clone()).or_default().clone();
            if thread.held(now_ms) {
                continue;
            }
            let (passed, next) = next_taken(threads, &group_id, thread.done, live.filter()).await?;
            let mut thread = thread;
            if let Some(before) = &thread.out {
                state.out.remove(&(before.until_ms, group_id.clone()));
            }
            let Some(event) = next else {
                thread.pass(passed);
                state.threads.insert(group_id, thread);
                continue;
            };
            match thread.due(event.seq, now_ms, spec.give_up()) {
                Some(Due::Deliver(deliveries)) => {
                    let until = now_ms.saturating_add(spec.ack_wait_secs.saturating_mul(1000));
                    thread.pass(passed);
                    thread.hand_out(event.seq, deliveries, now_ms, until);
                    state.out.insert((until, group_id.clone()));
                    state.threads.insert(group_id, thread);
                    live.deliveries.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(DELIVERIES, "consumer" => spec.name.clone()).increment(1);
                    if deliveries > 1 {
                        live.redeliveries.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!(REDELIVERIES, "consumer" => spec.name.clone())
                            .increment(1);
                    }
                    out.push(Delivered { event, deliveries });
                }
                Some(Due::DeadLetter) => {
                    let deliveries = thread.out.as_ref().map_or(0, |o| o.deliveries);
                    tracing::warn!(
                        consumer = spec.name,
                        group_id,
                        seq = event.seq,
                        deliveries,
                        "event dead-lettered: never acknowledged"
                    );
                    dead.push(DeadLetter {
                        group_id: group_id.clone(),
                        seq: event.seq,
                        kind: event.kind.name().to_owned(),
                        deliveries,
                        at: Timestamp::from_millis(now_ms),
                    });
                    thread.pass(event.seq);
                    state.threads.insert(group_id.clone(), thread);
                    // Its next event may go.
                    candidates.push_back(group_id);
                }
                None => {}
            }
        }
        if !dead.is_empty() {
            let cursors: Vec<(String, u64)> = dead
                .iter()
                .map(|d| {
                    let done = state.threads.get(&d.group_id).map_or(d.seq, |t| t.done);
                    (d.group_id.clone(), done)
                })
                .collect();
            self.store.advance(&spec.name, &cursors, &dead).await?;
            metrics::counter!(DEAD_LETTERED, "consumer" => spec.name.clone())
                .increment(dead.len() as u64);
        }
        Ok(out)
    }

    /// A push of `(group_id, seq)` failed: it goes out again no sooner
    /// than `until_ms`.
    pub async fn retry_later(&self, live: &Live, group_id: &str, seq: u64, until_ms: u64) {
        let mut state = live.state.lock().await;
        let Some(thread) = state.threads.get_mut(group_id) else {
            return;
        };
        let before = thread
            .out
            .as_ref()
            .filter(|o| o.seq == seq)
            .map(|o| o.until_ms);
        thread.hold_until(seq, until_ms);
        if let Some(before) = before {
            state.out.remove(&(before, group_id.to_owned()));
            state.out.insert((until_ms, group_id.to_owned()));
        }
    }

    /// Acknowledges `acks` (`(group_id, seq)`), durably before it returns.
    pub async fn ack(&self, live: &Live, acks: &[(String, u64)]) -> Result<AckReply, Error> {
        let mut state = live.state.lock().await;
        let mut moved: Vec<(String, u64)> = vec![];
        let mut ignored = vec![];
        for (group_id, seq) in acks {
            let Some(thread) = state.threads.get_mut(group_id) else {
                ignored.push(Ignored {
                    group_id: group_id.clone(),
                    seq: *seq,
                    reason: "not delivered by this consumer",
                });
                continue;
            };
            let until = thread.out.as_ref().map(|o| o.until_ms);
            match thread.ack(*seq) {
                Acked::Done => {
                    let done = thread.done;
                    if let Some(until) = until {
                        state.out.remove(&(until, group_id.clone()));
                    }
                    moved.retain(|(g, _)| g != group_id);
                    moved.push((group_id.clone(), done));
                }
                Acked::Already if *seq == 0 => ignored.push(Ignored {
                    group_id: group_id.clone(),
                    seq: *seq,
                    reason: "not delivered by this consumer",
                }),
                Acked::Already => ignored.push(Ignored {
                    group_id: group_id.clone(),
                    seq: *seq,
                    reason: "already acknowledged",
                }),
                Acked::NotDelivered => ignored.push(Ignored {
                    group_id: group_id.clone(),
                    seq: *seq,
                    reason: "not delivered by this consumer",
                }),
            }
        }
        if !moved.is_empty() {
            self.store.advance(&live.spec().name, &moved, &[]).await?;
        }
        drop(state);
        // One given up on before its acknowledgement came is not "already
        // acknowledged": the puller is told it was dead-lettered.
        if ignored.iter().any(|i| i.reason == "already acknowledged") {
            let letters = self
                .store
                .dead_letters(&live.spec().name, usize::MAX)
                .await?;
            for ignore in &mut ignored {
                let dead = letters
                    .iter()
                    .any(|l| l.group_id == ignore.group_id && l.seq == ignore.seq);
                if dead && ignore.reason == "already acknowledged" {
                    ignore.reason = "dead-lettered";
                }
            }
        }
        for (group_id, _) in &moved {
            live.make_ready(group_id);
        }
        Ok(AckReply {
            acknowledged: moved.len(),
            ignored,
        })
    }

    /// Delivers again, in each thread `only` names (or every thread the
    /// consumer takes), every event from `from` on: acknowledged ones,
    /// dead letters (forgotten) and what is out alike. A thread whose
    /// cursor is before `from` already is left as it is. Returns how many
    /// threads moved back.
    pub async fn replay(
        &self,
        threads: &dyn Store,
        live: &Live,
        from: ReplayFrom,
        only: Option<&str>,
    ) -> Result<usize, Error> {
        let metas = match only {
            Some(g) => threads.thread(g).await?.into_iter().collect(),
            None => threads.threads().await?,
        };
        let mut state = live.state.lock().await;
        let mut moves = vec![];
        for meta in metas {
            let group_id = meta.group_id.clone();
            if !live.filter().takes_thread(&group_id) {
                continue;
            }
            let done = state.threads.get(&group_id).map_or(0, |t| t.done);
            let to = match from {
                ReplayFrom::Seq(seq) => seq.saturating_sub(1),
                ReplayFrom::Time(at) if meta.updated_at < at => continue,
                ReplayFrom::Time(at) => match first_at_or_after(threads, &group_id, at).await? {
                    Some(seq) => seq - 1,
                    None => continue,
                },
            };
            if to >= done {
                continue;
            }
            let thread = state.threads.entry(group_id.clone()).or_default();
            let out = thread.out.take();
            thread.done = to;
            if let Some(out) = out {
                state.out.remove(&(out.until_ms, group_id.clone()));
            }
            moves.push((group_id, to));
        }
        if !moves.is_empty() {
            self.store.rewind(&live.spec().name, &moves).await?;
        }
        drop(state);
        for (group_id, _) in &moves {
            live.make_ready(group_id);
        }
        Ok(moves.len())
    }

    /// What `GET /v1/consumers/{name}` shows; with `letters`, the dead
    /// letters too (at most 100).
    pub async fn view(
        &self,
        threads: &dyn Store,
        live: &Live,
        now: Timestamp,
        letters: bool,
    ) -> Result<ConsumerView, Error> {
        let mut spec = live.spec().clone();
        if let Some(push) = spec.push.as_mut() {
            push.secret = "***".into();
        }
        let (looked_at, out) = {
            let state = live.state.lock().await;
            let ready = live.ready.lock().expect("ready lock");
            let mut looked_at: Vec<(String, u64)> = ready
                .queue
                .iter()
                .map(|g| (g.clone(), state.threads.get(g).map_or(0, |t| t.done)))
                .collect();
            for (_, g) in &state.out {
                if !ready.queued.contains(g) {
                    let done = state.threads.get(g).map_or(0, |t| t.done);
                    looked_at.push((g.clone(), done));
                }
            }
            (looked_at, state.out.len())
        };
        let mut pending = 0;
        let mut exact = true;
        let mut oldest: Option<Timestamp> = None;
        'threads: for (group_id, done) in looked_at {
            let mut after = done;
            loop {
                let events = threads.events(&group_id, after, PAGE).await?;
                let Some(last) = events.last() else { break };
                after = last.seq;
                for event in &events {
                    if takes(threads, &group_id, event, &spec.filter).await? {
                        pending += 1;
                        oldest = Some(oldest.map_or(event.at, |o| o.min(event.at)));
                        if pending >= MAX_COUNTED {
                            exact = false;
                            break 'threads;
                        }
                    }
                }
            }
        }
        let age = oldest
            .and_then(|o| now.duration_since(o))
            .map(|d| d.as_secs());
        metrics::gauge!(PENDING, "consumer" => spec.name.clone()).set(pending as f64);
        metrics::gauge!(OLDEST_PENDING, "consumer" => spec.name.clone())
            .set(age.unwrap_or(0) as f64);
        let dead = self.store.dead_letters(&spec.name, usize::MAX).await?;
        Ok(ConsumerView {
            created_at: live.stored.created_at,
            created_by: live.stored.created_by.clone(),
            pending,
            pending_exact: exact,
            out,
            oldest_pending_age_secs: age,
            deliveries: live.deliveries.load(Ordering::Relaxed),
            redeliveries: live.redeliveries.load(Ordering::Relaxed),
            dead_lettered: dead.len(),
            dead_letters: letters.then(|| dead.into_iter().take(100).collect()),
            spec,
        })
    }
}

/// Where a replay starts: a thread's sequence number, or a time (each
/// thread's first event at or after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ReplayFrom {
    Seq(u64),
    Time(Timestamp),
}

/// The seq of the thread's first event at or after `at`.
async fn first_at_or_after(
    threads: &dyn Store,
    group_id: &str,
    at: Timestamp,
) -> Result<Option<u64>, Error> {
    let mut after = 0;
    loop {
        let events = threads.events(group_id, after, PAGE).await?;
        let Some(last) = events.last() else {
            return Ok(None);
        };
        if let Some(first) = events.iter().find(|e| e.at >= at) {
            return Ok(Some(first.seq));
        }
        after = last.seq;
    }
}

/// The first event after `after` that `filter` takes, and the seq of the
/// last event before it that it does not (or of the last event read).
async fn next_taken(
    threads: &dyn Store,
    group_id: &str,
    after: u64,
    filter: &Filter,
) -> Result<(u64, Option<Event>), Error> {
    let mut passed = after;
    loop {
        let events = threads.events(group_id, passed, PAGE).await?;
        if events.is_empty() {
            return Ok((passed, None));
        }
        for event in events {
            if takes(threads, group_id, &event, filter).await? {
                return Ok((passed, Some(event)));
            }
            passed = event.seq;
        }
    }
}

/// Whether `filter` takes `event` (a call's toolset looked up only when
/// the filter names toolsets).
async fn takes(
    threads: &dyn Store,
    group_id: &str,
    event: &Event,
    filter: &Filter,
) -> Result<bool, Error> {
    let kind = event.kind.name();
    if !filter.types.iter().any(|t| t == kind) {
        return Ok(false);
    }
    if !filter.needs_toolset() {
        return Ok(true);
    }
    let toolset = match &event.id {
        Some(id) => threads
            .call(group_id, id)
            .await?
            .and_then(|call| toolset_of(&call.tool).map(str::to_owned)),
        None => None,
    };
    Ok(filter.takes(kind, toolset.as_deref()))
}
