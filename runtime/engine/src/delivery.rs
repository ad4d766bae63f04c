//! Consumers at work in one process: which threads may have an event to
//! hand out, and a mirror of each thread's [`DeliveryRecord`] (its cursor,
//! the one event out, its dead letters) kept in the [`DeliveryStore`]. The
//! rules of one thread's delivery are `ferry_core::consumer`'s; here they
//! meet the stores.
//!
//! Several processes may serve one consumer (a cluster's runtime nodes):
//! every record is written compare-and-set on its revision, and a process
//! whose write lost reads the record again and goes by it, so an event is
//! handed out by one process at a time and acknowledged once. Where the
//! store does not share what is out (`ferry serve`), it lives in memory
//! only: after a restart every event not acknowledged is handed out again
//! (its delivery count starts over), and nothing acknowledged is, since an
//! acknowledgement is durable before it is answered.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use ferry_proto::api::Event;
use ferry_proto::time::Timestamp;
use serde::Serialize;

use crate::consumer::{toolset_of, Acked, ConsumerSpec, Due, Filter};
use crate::store::{self, DeadLetter, DeliveryRecord, DeliveryStore, Store, StoredConsumer};
use crate::thread::ThreadMeta;

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
    /// Each thread's record, as this process last read or wrote it.
    threads: HashMap<String, DeliveryRecord>,
    /// Events out, by when they come back: `(until_ms, group_id)`.
    out: BTreeSet<(u64, String)>,
}

impl State {
    fn record(&self, group_id: &str) -> DeliveryRecord {
        self.threads
            .get(group_id)
            .cloned()
            .unwrap_or_else(|| DeliveryRecord {
                group_id: group_id.to_owned(),
                ..DeliveryRecord::default()
            })
    }

    /// Keeps `record` in place of the thread's, with when its event out
    /// (if any) comes back.
    fn keep(&mut self, record: DeliveryRecord) {
        let group_id = record.group_id.clone();
        if let Some(before) = self
            .threads
            .get(&group_id)
            .and_then(|r| r.delivery.out.as_ref())
        {
            self.out.remove(&(before.until_ms, group_id.clone()));
        }
        if let Some(out) = &record.delivery.out {
            self.out.insert((out.until_ms, group_id.clone()));
        }
        self.threads.insert(group_id, record);
    }

    /// Keeps `record`, read from the store, unless the one here is as new.
    fn keep_newer(&mut self, record: DeliveryRecord) -> bool {
        let newer = self
            .threads
            .get(&record.group_id)
            .is_none_or(|kept| kept.revision < record.revision);
        if newer {
            self.keep(record);
        }
        newer
    }
}

impl Live {
    fn new(stored: StoredConsumer, records: Vec<DeliveryRecord>) -> Self {
        let mut state = State::default();
        for record in records {
            state.keep(record);
        }
        Self {
            stored,
            ready: Mutex::default(),
            woken: tokio::sync::Notify::new(),
            state: tokio::sync::Mutex::new(state),
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
            store: deliveries,
            live: RwLock::default(),
        };
        consumers.refresh(threads).await?;
        Ok(consumers)
    }

    /// Takes up the consumers another process made, and lets go of those
    /// it deleted (`load` does it once; a cluster's nodes on each change).
    pub async fn refresh(&self, threads: &dyn Store) -> Result<(), Error> {
        let stored = self.store.consumers().await?;
        let gone: Vec<Arc<Live>> = {
            let mut live = self.live.write().expect("consumers lock");
            let names: HashSet<&str> = stored.iter().map(|s| s.spec.name.as_str()).collect();
            let gone: Vec<String> = live
                .iter()
                .filter(|(name, l)| {
                    !names.contains(name.as_str()) || stored.iter().all(|s| s.spec != l.stored.spec)
                })
                .map(|(name, _)| name.clone())
                .collect();
            gone.iter().filter_map(|name| live.remove(name)).collect()
        };
        for live in gone {
            // Pullers waiting on it end, finding it gone.
            live.woken.notify_waiters();
        }
        let mut metas = None;
        for stored in stored {
            if self.get(&stored.spec.name).is_ok() {
                continue;
            }
            if metas.is_none() {
                metas = Some(threads.threads().await?);
            }
            let live = self
                .start(stored, metas.as_deref().unwrap_or_default())
                .await?;
            let mut all = self.live.write().expect("consumers lock");
            all.entry(live.spec().name.clone()).or_insert(live);
        }
        Ok(())
    }

    /// A consumer with its records, each thread it may have work in made
    /// ready.
    async fn start(
        &self,
        stored: StoredConsumer,
        metas: &[ThreadMeta],
    ) -> Result<Arc<Live>, Error> {
        let records = self.store.records(&stored.spec.name).await?;
        let done: HashMap<String, u64> = records
            .iter()
            .map(|r| (r.group_id.clone(), r.delivery.done))
            .collect();
        let live = Live::new(stored, records);
        for meta in metas {
            let done = done.get(&meta.group_id).copied().unwrap_or(0);
            if meta.last_seq > done && live.filter().takes_thread(&meta.group_id) {
                live.make_ready(&meta.group_id);
            }
        }
        Ok(Arc::new(live))
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
        let name = stored.spec.name.clone();
        let metas = threads.threads().await?;
        // Another process (or another request here) may have made one of
        // the name first: the store says which is kept.
        let (kept, made) = match self.store.create_consumer(&stored).await? {
            Some(kept) if kept.spec != stored.spec => return Err(Error::Conflict(name)),
            Some(kept) => (kept, false),
            None => (stored, true),
        };
        let live = self.start(kept, &metas).await?;
        let mut all = self.live.write().expect("consumers lock");
        let live = all.entry(name).or_insert(live).clone();
        Ok((live, made))
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

    /// Whether any consumer takes thread `group_id`.
    pub fn any_takes(&self, group_id: &str) -> bool {
        let live = self.live.read().expect("consumers lock");
        live.values().any(|l| l.filter().takes_thread(group_id))
    }

    /// A thread was written: the consumers that take it have work to look
    /// at.
    pub fn touched(&self, group_id: &str) {
        for live in self.live.read().expect("consumers lock").values() {
            if live.filter().takes_thread(group_id) {
                live.make_ready(group_id);
            }
        }
    }

    /// Every thread may have work: after this process missed changes.
    pub async fn touched_all(&self, threads: &dyn Store) -> Result<(), Error> {
        let metas = threads.threads().await?;
        for meta in metas {
            self.touched(&meta.group_id);
        }
        Ok(())
    }

    /// Another process wrote consumer `name`'s record of a thread: this
    /// one goes by it, and looks at the thread again.
    pub async fn apply(&self, name: &str, record: DeliveryRecord) {
        let Ok(live) = self.get(name) else { return };
        let group_id = record.group_id.clone();
        if live.state.lock().await.keep_newer(record) {
            live.make_ready(&group_id);
        }
    }

    /// Writes `changed` records (each from the revision it was read at),
    /// keeps those written and reads again those another process wrote
    /// first: the threads of those written.
    async fn write(
        &self,
        live: &Live,
        state: &mut State,
        changed: Vec<DeliveryRecord>,
    ) -> Result<HashSet<String>, Error> {
        if changed.is_empty() {
            return Ok(HashSet::new());
        }
        let name = &live.spec().name;
        let answers = self.store.write_records(name, &changed).await?;
        let mut written = HashSet::new();
        for (mut record, answer) in changed.into_iter().zip(answers) {
            match answer {
                Some(revision) => {
                    record.revision = revision;
                    written.insert(record.group_id.clone());
                    state.keep(record);
                }
                None => {
                    if let Some(theirs) = self.store.record(name, &record.group_id).await? {
                        state.keep_newer(theirs);
                    }
                }
            }
        }
        Ok(written)
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
        let shares = self.store.shares_outs();
        let mut state = live.state.lock().await;
        let overdue: Vec<String> = state
            .out
            .iter()
            .take_while(|(until, _)| *until <= now_ms)
            .map(|(_, g)| g.clone())
            .collect();
        let mut candidates: VecDeque<String> = overdue.into();
        // Records changed by this take, by thread, to write before any of
        // their events is handed out; what only this process must know is
        // kept at once.
        let mut changed: HashMap<String, DeliveryRecord> = HashMap::new();
        let mut handed = vec![];
        let mut looked = 0;
        while handed.len() < max && looked < MAX_THREADS_PER_TAKE {
            let group_id = match candidates.pop_front() {
                Some(g) => g,
                None => match live.ready.lock().expect("ready lock").pop() {
                    Some(g) => g,
                    None => break,
                },
            };
            looked += 1;
            let mut record = changed
                .get(&group_id)
                .cloned()
                .unwrap_or_else(|| state.record(&group_id));
            if record.delivery.held(now_ms) {
                continue;
            }
            let (passed, next) =
                next_taken(threads, &group_id, record.delivery.done, live.filter()).await?;
            let Some(event) = next else {
                // Passing over events the filter does not take is found
                // again by any process: it need not be written.
                record.delivery.pass(passed);
                match changed.entry(group_id) {
                    std::collections::hash_map::Entry::Occupied(mut kept) => {
                        kept.insert(record);
                    }
                    std::collections::hash_map::Entry::Vacant(_) => state.keep(record),
                }
                continue;
            };
            match record.delivery.due(event.seq, now_ms, spec.give_up()) {
                Some(Due::Deliver(deliveries)) => {
                    let until = now_ms.saturating_add(spec.ack_wait_secs.saturating_mul(1000));
                    record.delivery.pass(passed);
                    record
                        .delivery
                        .hand_out(event.seq, deliveries, now_ms, until);
                    if shares || changed.contains_key(&group_id) {
                        changed.insert(group_id, record);
                    } else {
                        state.keep(record);
                    }
                    handed.push(Delivered { event, deliveries });
                }
                Some(Due::DeadLetter) => {
                    let deliveries = record.delivery.out.as_ref().map_or(0, |o| o.deliveries);
                    tracing::warn!(
                        consumer = spec.name,
                        group_id,
                        seq = event.seq,
                        deliveries,
                        "event dead-lettered: never acknowledged"
                    );
                    record.dead.push(DeadLetter {
                        group_id: group_id.clone(),
                        seq: event.seq,
                        kind: event.kind.name().to_owned(),
                        deliveries,
                        at: Timestamp::from_millis(now_ms),
                    });
                    record.delivery.pass(event.seq);
                    changed.insert(group_id.clone(), record);
                    // Its next event may go.
                    candidates.push_back(group_id);
                }
                None => {}
            }
        }
        let changed: Vec<DeliveryRecord> = changed.into_values().collect();
        let dead: usize = changed
            .iter()
            .map(|r| {
                let before = state.threads.get(&r.group_id).map_or(0, |k| k.dead.len());
                r.dead.len().saturating_sub(before)
            })
            .sum();
        let touched: HashSet<String> = changed.iter().map(|r| r.group_id.clone()).collect();
        let written = self.write(live, &mut state, changed).await?;
        drop(state);
        // An event whose record another process wrote first is theirs.
        handed.retain(|d| {
            !touched.contains(&d.event.group_id) || written.contains(&d.event.group_id)
        });
        if dead > 0 {
            metrics::counter!(DEAD_LETTERED, "consumer" => spec.name.clone())
                .increment(dead as u64);
        }
        for delivered in &handed {
            live.deliveries.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(DELIVERIES, "consumer" => spec.name.clone()).increment(1);
            if delivered.deliveries > 1 {
                live.redeliveries.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(REDELIVERIES, "consumer" => spec.name.clone()).increment(1);
            }
        }
        Ok(handed)
    }

    /// A push of `(group_id, seq)` failed: it goes out again no sooner
    /// than `until_ms`.
    pub async fn retry_later(
        &self,
        live: &Live,
        group_id: &str,
        seq: u64,
        until_ms: u64,
    ) -> Result<(), Error> {
        let mut state = live.state.lock().await;
        let Some(mut record) = state.threads.get(group_id).cloned() else {
            return Ok(());
        };
        record.delivery.hold_until(seq, until_ms);
        if self.store.shares_outs() {
            // Another process that wrote it first decided for itself.
            self.write(live, &mut state, vec![record]).await?;
        } else {
            state.keep(record);
        }
        Ok(())
    }

    /// Acknowledges `acks` (`(group_id, seq)`), durably before it returns.
    pub async fn ack(&self, live: &Live, acks: &[(String, u64)]) -> Result<AckReply, Error> {
        let name = &live.spec().name;
        let shares = self.store.shares_outs();
        let mut state = live.state.lock().await;
        let mut acknowledged: Vec<String> = vec![];
        let mut ignored = vec![];
        let mut left: Vec<(String, u64)> = acks.to_vec();
        // Another process may write a record between this one's read and
        // write: those acknowledgements are tried again on what it wrote.
        for attempt in 0..3 {
            if shares {
                for (group_id, seq) in &left {
                    let shown = state
                        .threads
                        .get(group_id)
                        .is_some_and(|r| r.delivery.out.as_ref().is_some_and(|o| o.seq == *seq));
                    if attempt > 0 || !shown {
                        if let Some(theirs) = self.store.record(name, group_id).await? {
                            state.keep_newer(theirs);
                        }
                    }
                }
            }
            let mut changed: HashMap<String, DeliveryRecord> = HashMap::new();
            let mut tried: Vec<(String, u64)> = vec![];
            for (group_id, seq) in std::mem::take(&mut left) {
                let Some(mut record) = changed
                    .get(&group_id)
                    .cloned()
                    .or_else(|| state.threads.get(&group_id).cloned())
                else {
                    ignored.push(ignore(&group_id, seq, "not delivered by this consumer"));
                    continue;
                };
                match record.delivery.ack(seq) {
                    Acked::Done => {
                        changed.insert(group_id.clone(), record);
                        tried.push((group_id, seq));
                    }
                    Acked::Already if seq == 0 => {
                        ignored.push(ignore(&group_id, seq, "not delivered by this consumer"));
                    }
                    Acked::Already if record.dead.iter().any(|l| l.seq == seq) => {
                        // Given up on before its acknowledgement came.
                        ignored.push(ignore(&group_id, seq, "dead-lettered"));
                    }
                    Acked::Already => ignored.push(ignore(&group_id, seq, "already acknowledged")),
                    Acked::NotDelivered => {
                        ignored.push(ignore(&group_id, seq, "not delivered by this consumer"));
                    }
                }
            }
            let written = self
                .write(live, &mut state, changed.into_values().collect())
                .await?;
            for (group_id, seq) in tried {
                if written.contains(&group_id) {
                    acknowledged.push(group_id);
                } else {
                    left.push((group_id, seq));
                }
            }
            if left.is_empty() {
                break;
            }
        }
        drop(state);
        for (group_id, seq) in left {
            ignored.push(ignore(&group_id, seq, "not delivered by this consumer"));
        }
        // At most one event of a thread is out: each acknowledged moves
        // its own thread on.
        for group_id in &acknowledged {
            live.make_ready(group_id);
        }
        Ok(AckReply {
            acknowledged: acknowledged.len(),
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
        let name = &live.spec().name;
        let shares = self.store.shares_outs();
        let mut state = live.state.lock().await;
        let mut targets = vec![];
        for meta in metas {
            let group_id = meta.group_id.clone();
            if !live.filter().takes_thread(&group_id) {
                continue;
            }
            let to = match from {
                ReplayFrom::Seq(seq) => seq.saturating_sub(1),
                ReplayFrom::Time(at) if meta.updated_at < at => continue,
                ReplayFrom::Time(at) => match first_at_or_after(threads, &group_id, at).await? {
                    Some(seq) => seq - 1,
                    None => continue,
                },
            };
            targets.push((group_id, to));
        }
        let mut moved: Vec<String> = vec![];
        for attempt in 0..3 {
            let mut changed = vec![];
            for (group_id, to) in std::mem::take(&mut targets) {
                if shares && attempt > 0 {
                    if let Some(theirs) = self.store.record(name, &group_id).await? {
                        state.keep_newer(theirs);
                    }
                }
                let mut record = state.record(&group_id);
                if to >= record.delivery.done {
                    continue;
                }
                record.delivery.done = to;
                record.delivery.out = None;
                record.dead.retain(|l| l.seq <= to);
                changed.push(record);
                targets.push((group_id, to));
            }
            let written = self.write(live, &mut state, changed).await?;
            targets.retain(|(g, _)| {
                let done = written.contains(g);
                if done {
                    moved.push(g.clone());
                }
                !done
            });
            if targets.is_empty() {
                break;
            }
        }
        drop(state);
        if !targets.is_empty() {
            let busy = format!("consumer {name:?} kept being changed by other nodes; try again");
            return Err(store::Error::Unavailable(busy).into());
        }
        for group_id in &moved {
            live.make_ready(group_id);
        }
        Ok(moved.len())
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
        let (looked_at, out, mut dead) = {
            let state = live.state.lock().await;
            let ready = live.ready.lock().expect("ready lock");
            let done = |g: &str| state.threads.get(g).map_or(0, |r| r.delivery.done);
            let mut looked_at: Vec<(String, u64)> =
                ready.queue.iter().map(|g| (g.clone(), done(g))).collect();
            for (_, g) in &state.out {
                if !ready.queued.contains(g) {
                    looked_at.push((g.clone(), done(g)));
                }
            }
            let dead: Vec<DeadLetter> = state
                .threads
                .values()
                .flat_map(|r| r.dead.iter().cloned())
                .collect();
            (looked_at, state.out.len(), dead)
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
        dead.sort_by_key(|l| l.at);
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

fn ignore(group_id: &str, seq: u64, reason: &'static str) -> Ignored {
    Ignored {
        group_id: group_id.to_owned(),
        seq,
        reason,
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
