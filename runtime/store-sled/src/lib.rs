//! The embedded storage adapter: each thread's log in sled, one key per
//! command, made durable by group commit.
//!
//! Trees (values encoded by `store::codec`):
//! - `log` — thread key ++ last sequence number (big-endian) → the
//!   command's [`Commit`]. A thread's commits sort in order, so its last
//!   commit is its current metadata and a range scan reads its events.
//! - `calls` — call key → where the call's record is when its thread moves
//!   on (the rule is in `store::log`): the sequence number of the commit
//!   that last carried it.
//! - `toolsets` — `name\0version` → the stored toolset.
//! - `tokens` — a named API token's id → its record (never its secret).
//!
//! Why one key per command: a single-key insert is atomic, so a command
//! needs no transaction and no journal (a sled transaction pins the log and
//! seals its I/O buffer, so each command paid its own write-out and group
//! commit had nothing left to merge). What a commit rests on, the copies of
//! the calls it moves on from, is written before it; sled recovers a prefix
//! of its log after a crash, so a commit that survives has them too.
//!
//! The calls recovery walks are each thread's `unsettled` set, in its last
//! commit's metadata: read once at open (one seek per thread), then kept in
//! memory, so no write pays for an index.
//!
//! An append is shown to readers once a group commit made it durable
//! (`Durable`), whether its caller waits for that or not.

mod audit;
pub mod commit;
mod delivery;
mod keys;
mod pointer;
mod tip;

use std::num::NonZeroUsize;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ferry_proto::api::Event;
use ferry_proto::audit::{AuditEntry, AuditQuery, AuditRecord};
use lru::LruCache;
use std::collections::{hash_map::Entry, BTreeSet, HashMap};
use tip::Tip;

use commit::GroupCommit;
use ferry_core::credential::StoredToken;
use ferry_core::thread::{CallRecord, ThreadMeta, ThreadState};
use ferry_core::toolsets::StoredToolset;
use ferry_store::codec::{decode, encode};
use ferry_store::log::{Commit, CommitEvents, CommitHead};
use ferry_store::{
    CatalogStore, DeliveryRecord, DeliveryStore, Durability, Durable, Error, Store, StoredConsumer,
    Watch, Write,
};

/// Threads whose last commit is kept decoded in memory.
const CACHED_THREADS: usize = 4096;

/// Events per watched or written thread kept in memory for its followers.
const RECENT_EVENTS: usize = 128;

/// Trees of an older layout (a journal beside per-record trees); a data
/// directory holding them is refused at open, not misread.
const OLD_LAYOUT_TREES: [&str; 3] = ["journal", "threads", "events"];

pub struct SledStore {
    /// Owns the database; the group-commit task holds it only weakly.
    _db: Arc<sled::Db>,
    log: sled::Tree,
    calls: sled::Tree,
    toolsets: sled::Tree,
    tokens: sled::Tree,
    audit: audit::AuditLog,
    deliveries: delivery::Deliveries,
    commit: GroupCommit,
    /// Per thread with a write in flight or a reader waiting: the last
    /// durable sequence number. Readers never see past it, so an event that
    /// a crash could still take back is never shown to an agent.
    tips: Arc<Mutex<HashMap<String, Tip>>>,
    /// The last commit of threads recently written or loaded for a write,
    /// without its events: what every command loads and every write checks
    /// against. Only this process writes the store, and only callers
    /// holding the engine's lock on a thread fill its entry
    /// ([`SledStore::remember_read`]), so it never goes stale.
    last: Mutex<LruCache<String, Arc<Commit>>>,
    /// Every thread's unsettled calls, as `(group_id, id)`.
    unsettled: Mutex<BTreeSet<(String, String)>>,
    /// Set when a flush or a log insert failed: sled's memory may hold
    /// writes its disk does not, and commands built on them could be lost
    /// in a crash after being answered. Every later write is refused, and
    /// nothing more is shown to readers, until a restart.
    poisoned: Arc<AtomicBool>,
}

fn poisoned_error() -> Error {
    Error::Poisoned
}

fn backend(e: sled::Error) -> Error {
    Error::Backend(Box::new(e))
}

impl SledStore {
    /// Opens (or creates) the store in `dir`. Must be called inside a tokio
    /// runtime: it starts the group-commit task.
    pub fn open(dir: &Path) -> Result<Self, Error> {
        Self::open_caching(dir, CACHED_THREADS)
    }

    /// [`SledStore::open`], keeping the last commit of `cached_threads`
    /// threads decoded.
    fn open_caching(dir: &Path, cached_threads: usize) -> Result<Self, Error> {
        let db = sled::Config::new()
            .path(dir)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(backend)?;
        let names = db.tree_names();
        let old_trees = OLD_LAYOUT_TREES
            .iter()
            .find(|t| names.iter().any(|n| n.as_ref() == t.as_bytes()))
            .map(|old| format!("it has a {old:?} tree"));
        let older = |why| Error::OlderLayout {
            dir: dir.display().to_string(),
            why,
        };
        // Refused before any tree is opened: a refused directory is left
        // as it was.
        if let Some(why) = old_trees {
            return Err(older(why));
        }
        let db = Arc::new(db);
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        let log = tree("log")?;
        // A layout that stored JSON: every value starts with `{`, which
        // MessagePack would read as a number. One value tells.
        if let Some(Ok((_, first))) = log.iter().next() {
            if first.first() == Some(&b'{') {
                return Err(older("its values are JSON".to_owned()));
            }
        }
        let (calls, toolsets, tokens) = (tree("calls")?, tree("toolsets")?, tree("tokens")?);
        let mut unsettled = BTreeSet::new();
        for last in last_commits(&log) {
            let meta = last?.meta;
            for id in meta.unsettled {
                unsettled.insert((meta.group_id.clone(), id));
            }
        }
        Ok(Self {
            audit: audit::AuditLog::open(&db)?,
            deliveries: delivery::Deliveries::open(&db)?,
            log,
            calls,
            toolsets,
            tokens,
            commit: GroupCommit::start(Arc::downgrade(&db)),
            _db: db,
            tips: Arc::default(),
            last: Mutex::new(LruCache::new(
                NonZeroUsize::new(cached_threads.max(1)).expect("not zero"),
            )),
            unsettled: Mutex::new(unsettled),
            poisoned: Arc::default(),
        })
    }

    /// The thread's last commit (its events left out), for a reader that
    /// does not hold the engine's lock on the thread.
    fn last_commit(&self, group_id: &str) -> Result<Option<Arc<Commit>>, Error> {
        self.find_last(group_id, false)
    }

    /// [`SledStore::last_commit`] for a caller holding the engine's lock on
    /// the thread (`load`, `append`): no write to it can run meanwhile, so
    /// what it finds is current and is cached.
    fn last_commit_locked(&self, group_id: &str) -> Result<Option<Arc<Commit>>, Error> {
        self.find_last(group_id, true)
    }

    fn find_last(&self, group_id: &str, locked: bool) -> Result<Option<Arc<Commit>>, Error> {
        if let Some(last) = self.last.lock().expect("cache lock").get(group_id) {
            return Ok(Some(last.clone()));
        }
        let Some(entry) = self.log.scan_prefix(keys::thread(group_id)).next_back() else {
            return Ok(None);
        };
        let (_, value) = entry.map_err(backend)?;
        let last = Arc::new(Commit::from(decode::<CommitHead>(&value)?));
        Ok(Some(self.remember_read(group_id, last, locked)))
    }

    /// Caches a writer's new last commit.
    fn remember(&self, group_id: &str, last: Arc<Commit>) {
        self.last
            .lock()
            .expect("cache lock")
            .put(group_id.to_owned(), last);
    }

    /// What a lookup found, or the newer commit a writer cached meanwhile.
    /// Only a caller holding the engine's lock (`locked`) caches what it
    /// found: a lock-free reader's find may be older than a write made
    /// since, whose cache entry other threads' entries may already have
    /// pushed out; cached, it would have the thread's next write reuse a
    /// sequence number and overwrite a commit.
    fn remember_read(&self, group_id: &str, found: Arc<Commit>, locked: bool) -> Arc<Commit> {
        let mut cache = self.last.lock().expect("cache lock");
        if let Some(newer) = cache.get(group_id) {
            return newer.clone();
        }
        if locked {
            cache.put(group_id.to_owned(), found.clone());
        }
        found
    }

    /// A call's copy (its record as of the thread's last commit but one, or
    /// older).
    fn copy(&self, group_id: &str, id: &str) -> Result<Option<CallRecord>, Error> {
        match self.calls.get(keys::call(group_id, id)).map_err(backend)? {
            Some(bytes) => {
                let seq = pointer::read(&bytes)?;
                self.carried(group_id, id, seq, &mut HashMap::new())
                    .map(Some)
            }
            None => Ok(None),
        }
    }

    /// The call's record in the thread's commit `seq`, which carries it.
    /// `read` keeps the commits read, for callers resolving many calls.
    fn carried(
        &self,
        group_id: &str,
        id: &str,
        seq: u64,
        read: &mut HashMap<u64, CommitHead>,
    ) -> Result<CallRecord, Error> {
        let commit = match read.entry(seq) {
            Entry::Occupied(read) => read.into_mut(),
            Entry::Vacant(unread) => {
                let bytes = self
                    .log
                    .get(keys::commit(group_id, seq))
                    .map_err(backend)?
                    .ok_or_else(|| {
                        Error::Corrupt(format!(
                            "call {id:?} points to commit {seq}, which is missing"
                        ))
                    })?;
                unread.insert(decode(&bytes)?)
            }
        };
        commit
            .calls
            .iter()
            .find(|c| c.id == id)
            .cloned()
            .ok_or_else(|| Error::Corrupt(format!("commit {seq} does not carry call {id:?}")))
    }

    fn current_call(&self, group_id: &str, id: &str) -> Result<Option<CallRecord>, Error> {
        let last = self.last_commit(group_id)?;
        match last.as_ref().and_then(|l| l.call(id)) {
            Some(call) => Ok(Some(call.clone())),
            None => self.copy(group_id, id),
        }
    }

    /// Inserts a command's commit, counted as pending on the thread's tip
    /// until [`SledStore::durable_at`] publishes it. Callers serialise
    /// writes per thread (the engine's lock), and only this process can
    /// open the sled directory, so checking the last commit and then
    /// inserting is a sound compare-and-set.
    fn insert(&self, write: Write<'_>) -> Result<(), Error> {
        let group_id = write.state.meta.group_id.as_str();
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(poisoned_error());
        }
        let last = self.last_commit_locked(group_id)?;
        if last.as_ref().map_or(0, |l| l.meta.last_seq) != write.expected_last_seq {
            return Err(Error::Conflict(group_id.to_owned()));
        }
        let moved: Vec<&CallRecord> = last
            .iter()
            .flat_map(|l| l.moved_on(&write.state.calls))
            .collect();
        // Where they are now: the last commit, which carries them.
        let at = pointer::of(last.as_ref().map_or(0, |l| l.meta.last_seq));
        for call in moved {
            let pointed = self
                .calls
                .insert(keys::call(group_id, &call.id), at.as_slice());
            self.poison_on(pointed)?;
        }
        let mut commit = Commit::of(&write);
        {
            let mut tips = self.tips.lock().expect("tips lock");
            let tip = tips
                .entry(group_id.to_owned())
                .or_insert_with(|| Tip::new(write.expected_last_seq));
            tip.pending += 1;
        }
        if let Err(e) = self.insert_commit(group_id, &commit) {
            publish(
                &self.tips,
                &self.poisoned,
                group_id,
                write.expected_last_seq,
            );
            return Err(e);
        }
        // Before the flush that makes the commit durable: that flush
        // makes them durable too.
        self.poison_on(self.audit.insert(write.audit))?;
        // The events move to the tip; the cached commit keeps none.
        let events = std::mem::take(&mut commit.events);
        if let Some(tip) = self.tips.lock().expect("tips lock").get_mut(group_id) {
            tip.remember(events);
        }
        {
            // Only what changed: most writes leave the set as it was.
            let empty = BTreeSet::new();
            let before = last.as_ref().map_or(&empty, |l| &l.meta.unsettled);
            let after = &commit.meta.unsettled;
            if before != after {
                let mut unsettled = self.unsettled.lock().expect("unsettled lock");
                for id in before.difference(after) {
                    unsettled.remove(&(group_id.to_owned(), id.clone()));
                }
                for id in after.difference(before) {
                    unsettled.insert((group_id.to_owned(), id.clone()));
                }
            }
        }
        self.remember(group_id, Arc::new(commit));
        Ok(())
    }

    /// Makes the thread's appends up to `seq` durable (one group commit
    /// for every append made meanwhile), then shows them to readers; if
    /// the flush fails, readers stay at `before`.
    fn durable_at(&self, group_id: &str, seq: u64, before: u64) -> Durable {
        let (commit, tips, poisoned) = (
            self.commit.clone(),
            self.tips.clone(),
            self.poisoned.clone(),
        );
        let group_id = group_id.to_owned();
        Durable::new(async move {
            let flushed = flush(&commit, &poisoned).await;
            let shown = if flushed.is_ok() { seq } else { before };
            publish(&tips, &poisoned, &group_id, shown);
            flushed
        })
    }

    /// Inserts a commit into the log. A failure poisons the store: the
    /// cached last commit would no longer match sled, and the next write could leave a gap in the thread's log.
    fn insert_commit(&self, group_id: &str, commit: &Commit) -> Result<(), Error> {
        let key = keys::commit(group_id, commit.meta.last_seq);
        self.poison_on(self.log.insert(key, encode(commit)))?;
        Ok(())
    }

    /// A failed sled write poisons the store: nothing more goes in.
    fn poison_on<T>(&self, written: sled::Result<T>) -> Result<T, Error> {
        written.map_err(|e| {
            self.poisoned.store(true, Ordering::SeqCst);
            backend(e)
        })
    }
}

#[cfg(any(test, feature = "testing"))]
impl SledStore {
    /// Fails every later write, as a failed insert or flush would.
    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
    }
}

/// Waits for a group commit; a failed one poisons the store.
async fn flush(commit: &GroupCommit, poisoned: &AtomicBool) -> Result<(), Error> {
    if poisoned.load(Ordering::SeqCst) {
        return Err(poisoned_error());
    }
    let flushed = commit.flush().await.map_err(|e| Error::Backend(e.into()));
    if flushed.is_err() {
        poisoned.store(true, Ordering::SeqCst);
    }
    flushed
}

/// Shows the thread's events up to `seq` to readers, for one pending
/// write. Once the store is poisoned nothing changes any more (no thread's
/// durable tip moves, none is forgotten).
fn publish(tips: &Mutex<HashMap<String, Tip>>, poisoned: &AtomicBool, group_id: &str, seq: u64) {
    if poisoned.load(Ordering::SeqCst) {
        return;
    }
    let mut tips = tips.lock().expect("tips lock");
    let Some(tip) = tips.get_mut(group_id) else {
        return;
    };
    tip.pending = tip.pending.saturating_sub(1);
    tip.durable.send_if_modified(|durable| {
        let newer = seq > *durable;
        if newer {
            *durable = seq;
        }
        newer
    });
    if tip.pending == 0 && tip.durable.receiver_count() == 0 {
        tips.remove(group_id);
    }
}

/// Every thread's last commit, skipping from thread to thread: one seek
/// per thread.
fn last_commits(log: &sled::Tree) -> impl Iterator<Item = Result<Commit, Error>> + '_ {
    let mut from = Bound::Unbounded;
    std::iter::from_fn(move || {
        let next = (|| {
            let Some(entry) = log
                .range::<Vec<u8>, _>((from.clone(), Bound::Unbounded))
                .next()
            else {
                return Ok(None);
            };
            let (key, _) = entry.map_err(backend)?;
            let thread = keys::thread_of(&key)
                .ok_or_else(|| Error::Corrupt("log key".into()))?
                .to_vec();
            from = Bound::Excluded(keys::commit_after_all(&thread));
            match log.scan_prefix(&thread).next_back() {
                Some(last) => decode(&last.map_err(backend)?.1).map(Some),
                None => Ok(None),
            }
        })();
        next.transpose()
    })
}

#[async_trait]
impl Store for SledStore {
    async fn load(&self, group_id: &str, call_ids: &[&str]) -> Result<ThreadState, Error> {
        let last = self.last_commit_locked(group_id)?;
        Commit::state(last.as_deref(), group_id, call_ids, |id| {
            self.copy(group_id, id)
        })
    }

    async fn append(&self, write: Write<'_>, durability: Durability) -> Result<Durable, Error> {
        let (group_id, before) = (write.state.meta.group_id.as_str(), write.expected_last_seq);
        let seq = write.state.meta.last_seq;
        self.insert(write)?;
        let durable = self.durable_at(group_id, seq, before);
        Ok(match durability {
            Durability::Await => durable,
            // Dropped unfinished: it completes in the background.
            Durability::Background => {
                drop(durable);
                Durable::ready()
            }
        })
    }

    async fn record_audit(&self, entries: &[AuditEntry]) -> Result<(), Error> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(poisoned_error());
        }
        self.poison_on(self.audit.insert(entries))?;
        self.flush().await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, Error> {
        self.audit.read(query)
    }

    async fn durable(&self, group_id: &str) -> Result<(), Error> {
        let pending = {
            let tips = self.tips.lock().expect("tips lock");
            tips.get(group_id).is_some_and(|t| t.pending > 0)
        };
        if pending {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), Error> {
        flush(&self.commit, &self.poisoned).await
    }

    async fn events(&self, group_id: &str, after: u64, limit: usize) -> Result<Vec<Event>, Error> {
        let durable = {
            let tips = self.tips.lock().expect("tips lock");
            let tip = tips.get(group_id);
            if let Some(events) = tip.and_then(|t| t.events_after(after, limit)) {
                return Ok(events);
            }
            match tip {
                Some(tip) => *tip.durable.borrow(),
                // No write in flight: what is stored now is durable. Read
                // under the lock, which a writer takes (to make its tip)
                // before it inserts, so the scan below cannot show a commit
                // inserted meanwhile, before its flush.
                None => self.last_commit(group_id)?.map_or(0, |l| l.meta.last_seq),
            }
        };
        if durable <= after {
            return Ok(vec![]);
        }
        // A commit's key is its last event's seq, so the first commit with
        // events after `after` is the first keyed above it, and the last
        // one read is the first keyed at or above the durable tip.
        let Some(from) = after.checked_add(1) else {
            return Ok(vec![]);
        };
        let range = keys::commit(group_id, from)..=keys::commit(group_id, u64::MAX);
        let mut out = Vec::new();
        for entry in self.log.range(range) {
            let (_, bytes) = entry.map_err(backend)?;
            let commit: CommitEvents = decode(&bytes)?;
            let reaches_tip = commit.events.last().is_some_and(|e| e.seq >= durable);
            out.extend(
                commit
                    .events
                    .into_iter()
                    .filter(|e| e.seq > after && e.seq <= durable),
            );
            if out.len() >= limit {
                out.truncate(limit);
                break;
            }
            if reaches_tip {
                break;
            }
        }
        Ok(out)
    }

    fn watch(&self, group_id: &str) -> Watch {
        let mut tips = self.tips.lock().expect("tips lock");
        let receiver = match tips.get(group_id) {
            Some(tip) => tip.durable.subscribe(),
            None => {
                // No write in flight: everything stored is durable.
                let last = self
                    .last_commit(group_id)
                    .ok()
                    .flatten()
                    .map_or(0, |l| l.meta.last_seq);
                let tip = Tip::new(last);
                let receiver = tip.durable.subscribe();
                tips.insert(group_id.to_owned(), tip);
                receiver
            }
        };
        Watch::of_tip(receiver, &self.tips, group_id, |t| {
            t.pending == 0 && t.durable.receiver_count() == 0
        })
    }

    async fn thread(&self, group_id: &str) -> Result<Option<ThreadMeta>, Error> {
        Ok(self.last_commit(group_id)?.map(|l| l.meta.clone()))
    }

    async fn threads(&self) -> Result<Vec<ThreadMeta>, Error> {
        last_commits(&self.log).map(|c| Ok(c?.meta)).collect()
    }

    async fn calls(&self, group_id: &str) -> Result<Vec<CallRecord>, Error> {
        // A write that moves the thread on points the last commit's calls
        // at it (behind this scan, perhaps), then appends the next commit
        // without them. So every commit that was the last one while the
        // pointers were scanned is read after, oldest first: a call in
        // neither the scan nor the final last commit is in one of them.
        let first = self.last_commit(group_id)?;
        let mut out: HashMap<String, CallRecord> = HashMap::new();
        // Calls that moved on together point to the same commit: read once.
        let mut read = HashMap::new();
        let thread = keys::thread(group_id);
        for entry in self.calls.scan_prefix(&thread) {
            let (key, value) = entry.map_err(backend)?;
            let id = std::str::from_utf8(&key[thread.len()..])
                .map_err(|_| Error::Corrupt("call key".into()))?;
            let call = self.carried(group_id, id, pointer::read(&value)?, &mut read)?;
            out.insert(call.id.clone(), call);
        }
        let last = self.last_commit(group_id)?;
        let seq = |commit: &Option<Arc<Commit>>| commit.as_ref().map_or(0, |c| c.meta.last_seq);
        let (from, to) = (seq(&first), seq(&last));
        let mut between = vec![];
        if to > from + 1 {
            let range = keys::commit(group_id, from + 1)..keys::commit(group_id, to);
            for entry in self.log.range(range) {
                let (_, value) = entry.map_err(backend)?;
                between.push(decode::<CommitHead>(&value)?.calls);
            }
        }
        // The last commit's calls may have no copy yet, or an older one.
        let carried = first.iter().map(|c| &c.calls);
        let carried = carried.chain(&between).chain(last.iter().map(|c| &c.calls));
        for call in carried.flatten() {
            out.insert(call.id.clone(), call.clone());
        }
        Ok(out.into_values().collect())
    }

    async fn call(&self, group_id: &str, id: &str) -> Result<Option<CallRecord>, Error> {
        self.current_call(group_id, id)
    }

    async fn open_calls(&self) -> Result<Vec<(String, String)>, Error> {
        let unsettled = self.unsettled.lock().expect("unsettled lock");
        Ok(unsettled.iter().cloned().collect())
    }
}

#[async_trait]
impl CatalogStore for SledStore {
    async fn put_toolset(&self, toolset: &StoredToolset) -> Result<(), Error> {
        let key = keys::toolset(&toolset.name, &toolset.version);
        self.toolsets
            .insert(key, encode(toolset))
            .map_err(backend)?;
        self.flush().await
    }

    async fn delete_toolset(&self, name: &str, version: &semver::Version) -> Result<(), Error> {
        self.toolsets
            .remove(keys::toolset(name, version))
            .map_err(backend)?;
        self.flush().await
    }

    async fn toolsets(&self) -> Result<Vec<StoredToolset>, Error> {
        self.toolsets
            .iter()
            .values()
            .map(|v| decode(&v.map_err(backend)?))
            .collect()
    }

    async fn put_token(&self, token: &StoredToken) -> Result<(), Error> {
        self.tokens
            .insert(token.id.as_bytes(), encode(token))
            .map_err(backend)?;
        self.flush().await
    }

    async fn tokens(&self) -> Result<Vec<StoredToken>, Error> {
        self.tokens
            .iter()
            .values()
            .map(|v| decode(&v.map_err(backend)?))
            .collect()
    }
}

#[cfg(test)]
/// Opens (with `open`) a sled database just dropped in this process.
/// sled's I/O threads may still hold the directory's lock for a moment
/// after the drop (a restart is a new process, where this cannot happen),
/// so retry while the lock is held, for up to 10 s.
pub(crate) async fn open_when_unlocked<T, E: std::fmt::Display>(
    open: impl Fn() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match open() {
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

#[async_trait]
impl DeliveryStore for SledStore {
    async fn create_consumer(
        &self,
        consumer: &StoredConsumer,
    ) -> Result<Option<StoredConsumer>, Error> {
        let kept = self.deliveries.create(consumer)?;
        self.flush().await?;
        Ok(kept)
    }

    async fn delete_consumer(&self, name: &str) -> Result<(), Error> {
        self.deliveries.delete(name)?;
        self.flush().await
    }

    async fn consumers(&self) -> Result<Vec<StoredConsumer>, Error> {
        self.deliveries.all()
    }

    async fn records(&self, name: &str) -> Result<Vec<DeliveryRecord>, Error> {
        self.deliveries.records(name)
    }

    async fn record(&self, name: &str, group_id: &str) -> Result<Option<DeliveryRecord>, Error> {
        self.deliveries.record(name, group_id)
    }

    async fn write_records(
        &self,
        name: &str,
        records: &[DeliveryRecord],
    ) -> Result<Vec<Option<u64>>, Error> {
        // One process writes each consumer's records: none is lost to
        // another writer.
        self.deliveries.write(name, records)?;
        self.flush().await?;
        Ok(records.iter().map(|r| Some(r.revision + 1)).collect())
    }
}

#[cfg(test)]
mod tests;
