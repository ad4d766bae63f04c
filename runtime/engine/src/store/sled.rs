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
//! A commit nobody waits on (`call_dispatched`) is held in memory for up to
//! `HOLD_BACK` and merged into the thread's next commit: a tool that
//! answers at once costs one insert for both.

use std::num::NonZeroUsize;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ferry_proto::api::Event;
use lru::LruCache;
use std::collections::{hash_map::Entry, BTreeSet, HashMap, VecDeque};
use tokio::sync::watch;

use super::codec::{decode, encode};
use super::commit::GroupCommit;
use super::log::{Commit, CommitEvents, CommitHead};
use super::{keys, Error, Store, Watch, Write};
use crate::thread::{CallRecord, ThreadMeta, ThreadState};
use crate::toolsets::StoredToolset;

/// Threads whose last commit is kept decoded in memory.
const CACHED_THREADS: usize = 4096;

/// Events per watched or written thread kept in memory for its followers.
const RECENT_EVENTS: usize = 128;

/// How long a commit nobody waits on (`call_dispatched`) is held back
/// before it is written on its own. A tool that answers at once calls back
/// within this time, and the result's write carries the held events too:
/// one sled insert instead of two. Readers see the held events this much
/// later at most (after a flush, like any other).
const HOLD_BACK: std::time::Duration = std::time::Duration::from_millis(5);

/// Trees of an older layout (a journal beside per-record trees); a data
/// directory holding them is refused at open, not misread.
const OLD_LAYOUT_TREES: [&str; 3] = ["journal", "threads", "events"];

pub struct SledStore {
    /// Owns the database; the group-commit task holds it only weakly.
    _db: Arc<sled::Db>,
    log: sled::Tree,
    calls: sled::Tree,
    toolsets: sled::Tree,
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
    /// Commits held back ([`Store::write_held`]), by thread, not yet in
    /// sled: the thread's next write carries their events, or `settle`
    /// writes them. Whoever takes one holds this lock until it is inserted,
    /// so a flush that starts after `settle` covers it either way.
    held: Mutex<HashMap<String, Commit>>,
    /// Set when a flush or a log insert failed: sled's memory may hold
    /// writes its disk does not (or lack held events the cache shows), and
    /// commands built on them could be lost in a crash after being
    /// answered. Every later write is refused, and nothing more is shown to
    /// readers, until a restart.
    poisoned: AtomicBool,
    /// [`HOLD_BACK`], but for tests that need a held commit to stay held.
    hold_back: std::time::Duration,
}

struct Tip {
    durable: watch::Sender<u64>,
    /// Writes made but not yet published.
    pending: u32,
    /// The thread's newest events, in order and without gaps, durable or
    /// not (readers stop at `durable`): a follower reads what it was woken
    /// for from memory instead of sled.
    recent: VecDeque<Event>,
}

impl Tip {
    fn new(durable: u64) -> Self {
        Self {
            durable: watch::Sender::new(durable),
            pending: 0,
            recent: VecDeque::new(),
        }
    }

    fn remember(&mut self, events: Vec<Event>) {
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
    fn events_after(&self, after: u64, limit: usize) -> Option<Vec<Event>> {
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

fn poisoned() -> Error {
    Error::Backend("an earlier write or flush failed; restart Ferry to recover the store".into())
}

fn backend(e: impl std::fmt::Display) -> Error {
    Error::Backend(e.to_string())
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
        // A layout that stored JSON: every value starts with `{`, which
        // MessagePack would read as a number. One value tells.
        let json = || {
            let log = db.open_tree("log").ok()?;
            let (_, first) = log.iter().next()?.ok()?;
            (first.first() == Some(&b'{')).then(|| "its values are JSON".to_owned())
        };
        if let Some(why) = old_trees.or_else(json) {
            return Err(Error::Backend(format!(
                "{} was written by an older Ferry ({why}); this version cannot read it: \
                 start with an empty --data directory",
                dir.display()
            )));
        }
        let db = Arc::new(db);
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        let log = tree("log")?;
        let (calls, toolsets) = (tree("calls")?, tree("toolsets")?);
        let mut unsettled = BTreeSet::new();
        for last in last_commits(&log) {
            let meta = last?.meta;
            for id in meta.unsettled {
                unsettled.insert((meta.group_id.clone(), id));
            }
        }
        Ok(Self {
            log,
            calls,
            toolsets,
            commit: GroupCommit::start(Arc::downgrade(&db)),
            _db: db,
            tips: Arc::default(),
            last: Mutex::new(LruCache::new(
                NonZeroUsize::new(cached_threads.max(1)).expect("not zero"),
            )),
            unsettled: Mutex::new(unsettled),
            held: Mutex::default(),
            poisoned: AtomicBool::new(false),
            hold_back: HOLD_BACK,
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
        // A held commit is newer than anything in sled: the cache may have
        // dropped it, this must not.
        if let Some(held) = self.held.lock().expect("held lock").get(group_id) {
            let last = Arc::new(held.head());
            return Ok(Some(self.remember_read(group_id, last, locked)));
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

    /// Appends a command's commit, or holds it back (`hold`) for the
    /// thread's next write to carry. Callers serialise writes per thread
    /// (the engine's lock), and only this process can open the sled
    /// directory, so checking the last commit and then appending is a sound
    /// compare-and-set.
    fn append(&self, write: Write<'_>, hold: bool) -> Result<(), Error> {
        let group_id = write.state.meta.group_id.as_str();
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(poisoned());
        }
        let last = self.last_commit_locked(group_id)?;
        if last.as_ref().map_or(0, |l| l.meta.last_seq) != write.expected_last_seq {
            return Err(Error::Conflict(group_id.to_owned()));
        }
        let moved: Vec<&CallRecord> = last
            .iter()
            .flat_map(|l| l.moved_on(&write.state.calls))
            .collect();
        if !moved.is_empty() {
            // A copy is the call as a commit in sled left it: if that commit
            // is only held, it goes in first, on its own.
            self.settle_held(group_id)?;
        }
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
        let own = commit.events.len();
        let appended = {
            let mut held = self.held.lock().expect("held lock");
            match held.remove(group_id) {
                // The held events come first. The lock is kept until the
                // insert, so a `settle` that finds nothing held returns only
                // once the events it was for are in sled.
                Some(earlier) => {
                    commit.events.splice(0..0, earlier.events);
                    if hold {
                        held.insert(group_id.to_owned(), commit.clone());
                        Ok(())
                    } else {
                        self.insert_commit(group_id, &commit)
                    }
                }
                None if hold => {
                    held.insert(group_id.to_owned(), commit.clone());
                    Ok(())
                }
                None => {
                    drop(held);
                    self.insert_commit(group_id, &commit)
                }
            }
        };
        if let Err(e) = appended {
            self.publish(group_id, write.expected_last_seq);
            return Err(e);
        }
        // This write's events move to the tip (held ones are there
        // already); the cached commit keeps none.
        let events = commit.events.split_off(commit.events.len() - own);
        commit.events = vec![];
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

    /// Inserts the thread's held commit, if one is still held.
    fn settle_held(&self, group_id: &str) -> Result<(), Error> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(poisoned());
        }
        let mut held = self.held.lock().expect("held lock");
        if let Some(commit) = held.remove(group_id) {
            self.insert_commit(group_id, &commit)?;
        }
        Ok(())
    }

    /// Inserts a commit into the log. A failure poisons the store: the
    /// cached last commit (and any held events) would no longer match
    /// sled, and the next write could leave a gap in the thread's log.
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

#[cfg(test)]
impl SledStore {
    /// Whether the thread has a commit held back, not yet in sled.
    pub(crate) fn holds(&self, group_id: &str) -> bool {
        self.held.lock().expect("held lock").contains_key(group_id)
    }

    /// [`SledStore::open`], holding commits back for `hold` rather than
    /// [`HOLD_BACK`]: long enough that only a write or a settle ends it.
    pub(crate) fn open_holding(dir: &Path, hold: std::time::Duration) -> Result<Self, Error> {
        let mut store = Self::open(dir)?;
        store.hold_back = hold;
        Ok(store)
    }
}

/// Held commits are written on a clean shutdown rather than lost (a crash
/// loses them, which only means their calls are dispatched again).
impl Drop for SledStore {
    fn drop(&mut self) {
        let held = std::mem::take(&mut *self.held.lock().expect("held lock"));
        if held.is_empty() || self.poisoned.load(Ordering::SeqCst) {
            return;
        }
        for (group_id, commit) in &held {
            if self.insert_commit(group_id, commit).is_err() {
                return;
            }
        }
        if let Err(e) = self._db.flush() {
            tracing::warn!(error = %e, "could not flush held commits at shutdown");
        }
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

/// What the `calls` tree holds for a call its thread moved on from: the
/// sequence number (key) of the commit that last carried it, always 9
/// bytes, MessagePack's `uint 64` (`0xcf` and the number, big-endian).
mod pointer {
    use super::Error;

    pub fn of(seq: u64) -> [u8; 9] {
        let mut bytes = [0xcf; 9];
        bytes[1..].copy_from_slice(&seq.to_be_bytes());
        bytes
    }

    pub fn read(bytes: &[u8]) -> Result<u64, Error> {
        match bytes {
            [0xcf, seq @ ..] if seq.len() == 8 => {
                Ok(u64::from_be_bytes(seq.try_into().expect("8 bytes")))
            }
            _ => Err(Error::Corrupt(format!(
                "a call's pointer is {} bytes, not 9",
                bytes.len()
            ))),
        }
    }
}

#[async_trait]
impl Store for SledStore {
    async fn load(&self, group_id: &str, call_ids: &[&str]) -> Result<ThreadState, Error> {
        let last = self.last_commit_locked(group_id)?;
        Commit::state(last.as_deref(), group_id, call_ids, |id| {
            self.copy(group_id, id)
        })
    }

    async fn write(&self, write: Write<'_>) -> Result<(), Error> {
        self.append(write, false)
    }

    async fn write_held(&self, write: Write<'_>) -> Result<(), Error> {
        self.append(write, true)
    }

    fn hold_back(&self) -> std::time::Duration {
        self.hold_back
    }

    async fn settle(&self, group_id: &str) -> Result<(), Error> {
        self.settle_held(group_id)
    }

    async fn flush(&self) -> Result<(), Error> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(poisoned());
        }
        let flushed = self.commit.flush().await.map_err(Error::Backend);
        if flushed.is_err() {
            self.poisoned.store(true, Ordering::SeqCst);
        }
        flushed
    }

    /// Once the store is poisoned nothing changes any more (no thread's
    /// durable tip moves, none is forgotten): a failed insert may have lost
    /// held events below `seq`.
    fn publish(&self, group_id: &str, seq: u64) {
        if self.poisoned.load(Ordering::SeqCst) {
            return;
        }
        let mut tips = self.tips.lock().expect("tips lock");
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

    fn is_durable(&self, group_id: &str, seq: u64) -> bool {
        let tips = self.tips.lock().expect("tips lock");
        tips.get(group_id)
            .is_none_or(|t| t.pending == 0 && *t.durable.borrow() >= seq)
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
        // events after `after` is the first keyed above it. The durable tip
        // may fall inside a commit (held events published before the write
        // that carried them), so the last commit read is the first keyed at
        // or above it, and its later events are left out.
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
        // Held commits are newer than what sled has of their threads.
        let held: HashMap<String, ThreadMeta> = {
            let held = self.held.lock().expect("held lock");
            held.iter()
                .map(|(g, c)| (g.clone(), c.meta.clone()))
                .collect()
        };
        last_commits(&self.log)
            .map(|c| {
                let meta = c?.meta;
                Ok(held.get(&meta.group_id).cloned().unwrap_or(meta))
            })
            .collect()
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

    async fn put_toolset(&self, toolset: &StoredToolset) -> Result<(), Error> {
        let key = keys::toolset(&toolset.name, &toolset.version);
        self.toolsets
            .insert(key, encode(toolset))
            .map_err(backend)?;
        Ok(())
    }

    async fn delete_toolset(&self, name: &str, version: &semver::Version) -> Result<(), Error> {
        self.toolsets
            .remove(keys::toolset(name, version))
            .map_err(backend)?;
        Ok(())
    }

    async fn toolsets(&self) -> Result<Vec<StoredToolset>, Error> {
        self.toolsets
            .iter()
            .values()
            .map(|v| decode(&v.map_err(backend)?))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::log::tests::call;
    use ferry_proto::api::{CallStatus, EventKind};

    fn event(group_id: &str, seq: u64) -> Event {
        Event {
            seq,
            group_id: group_id.into(),
            id: None,
            at: "t".into(),
            idempotency_key: None,
            kind: EventKind::ThreadClosed {},
        }
    }

    /// Opens a store just dropped in this process. sled's I/O threads may
    /// still hold the directory lock for a moment after the drop (a restart
    /// is a new process, where this cannot happen), so retry, bounded.
    async fn reopen(dir: &Path) -> SledStore {
        crate::store::open_when_unlocked(|| SledStore::open(dir))
            .await
            .unwrap_or_else(|e| panic!("reopening the store: {e}"))
    }

    /// Thread `g` moved to `seq` with `calls` changed, as a command would
    /// leave it.
    async fn next_state(store: &SledStore, g: &str, seq: u64, calls: &[CallRecord]) -> ThreadState {
        let mut state = store.load(g, &[]).await.unwrap();
        state.meta.last_seq = seq;
        for call in calls {
            state.calls.insert(call.id.clone(), call.clone());
            if call.is_unsettled() {
                state.meta.unsettled.insert(call.id.clone());
            } else {
                state.meta.unsettled.remove(&call.id);
            }
        }
        state
    }

    /// Appends one command to thread `g`, as the engine would: the thread
    /// moves to `seq` with `calls` changed, recording one event; held back
    /// (`write_held`) or not. Not flushed, not published.
    async fn append_next(store: &SledStore, g: &str, seq: u64, calls: &[CallRecord], held: bool) {
        let state = next_state(store, g, seq, calls).await;
        let write = Write {
            expected_last_seq: seq - 1,
            state: &state,
            events: &[event(g, seq)],
        };
        let written = if held {
            store.write_held(write).await
        } else {
            store.write(write).await
        };
        written.unwrap();
    }

    /// [`append_next`], flushed and published.
    async fn commit(store: &SledStore, g: &str, seq: u64, calls: &[CallRecord]) {
        append_next(store, g, seq, calls, false).await;
        store.flush().await.unwrap();
        store.publish(g, seq);
    }

    /// The ids of the thread's calls, sorted.
    async fn call_ids(store: &SledStore, g: &str) -> Vec<String> {
        let mut ids: Vec<_> = store
            .calls(g)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        ids.sort();
        ids
    }

    fn with_status(id: &str, status: CallStatus) -> CallRecord {
        CallRecord { status, ..call(id) }
    }

    /// Like [`commit`], for a command nobody waits on: held back, not
    /// flushed, not published.
    async fn hold(store: &SledStore, g: &str, seq: u64, calls: &[CallRecord]) {
        append_next(store, g, seq, calls, true).await;
    }

    /// A store in `dir` whose thread `g` accepted call `a` (seq 1) and holds
    /// its dispatch (seq 2).
    async fn held_dispatch(dir: &Path) -> SledStore {
        let store = SledStore::open(dir).unwrap();
        commit(&store, "g", 1, &[with_status("a", CallStatus::Queued)]).await;
        hold(&store, "g", 2, &[with_status("a", CallStatus::Dispatched)]).await;
        store
    }

    fn seqs(events: &[Event]) -> Vec<u64> {
        events.iter().map(|e| e.seq).collect()
    }

    /// A held commit is loaded at once, shown to readers only once durable,
    /// and carried by the thread's next write: one log entry for both.
    #[tokio::test]
    async fn a_held_commit_rides_with_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = held_dispatch(dir.path()).await;
            let loaded = store.load("g", &["a"]).await.unwrap();
            assert_eq!(loaded.meta.last_seq, 2);
            assert_eq!(loaded.calls["a"].status, CallStatus::Dispatched);
            store.flush().await.unwrap();
            assert_eq!(seqs(&store.events("g", 0, 10).await.unwrap()), [1]);
            assert!(!store.is_durable("g", 2));

            commit(&store, "g", 3, &[with_status("a", CallStatus::Completed)]).await;
            // The held write's own settle, flush and publish find it carried.
            store.settle("g").await.unwrap();
            store.flush().await.unwrap();
            store.publish("g", 2);
            assert_eq!(seqs(&store.events("g", 0, 10).await.unwrap()), [1, 2, 3]);
            assert_eq!(store.log.len(), 2, "commits 1 and 2+3");
        }
        let store = reopen(dir.path()).await;
        assert_eq!(seqs(&store.events("g", 0, 10).await.unwrap()), [1, 2, 3]);
        assert_eq!(seqs(&store.events("g", 1, 10).await.unwrap()), [2, 3]);
        let a = store.call("g", "a").await.unwrap().unwrap();
        assert_eq!(a.status, CallStatus::Completed);
    }

    /// With no next write, `settle` writes the held commit on its own, and
    /// a later write does not carry its events again.
    #[tokio::test]
    async fn settle_writes_a_held_commit_on_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = held_dispatch(dir.path()).await;
        store.settle("g").await.unwrap();
        store.flush().await.unwrap();
        store.publish("g", 2);
        assert_eq!(seqs(&store.events("g", 0, 10).await.unwrap()), [1, 2]);
        assert!(store.is_durable("g", 2));
        commit(&store, "g", 3, &[with_status("a", CallStatus::Completed)]).await;
        assert_eq!(store.log.len(), 3);
        drop(store);
        let store = reopen(dir.path()).await;
        assert_eq!(seqs(&store.events("g", 0, 10).await.unwrap()), [1, 2, 3]);
    }

    /// A held commit stays the thread's last even once the cache of last
    /// commits has dropped it.
    #[tokio::test]
    async fn a_held_commit_outlives_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open_caching(dir.path(), 1).unwrap();
        commit(&store, "g", 1, &[with_status("a", CallStatus::Queued)]).await;
        hold(&store, "g", 2, &[with_status("a", CallStatus::Dispatched)]).await;
        commit(&store, "other", 1, &[]).await;
        assert!(store.last.lock().unwrap().peek("g").is_none(), "evicted");
        let listed = store.threads().await.unwrap();
        let g = listed.iter().find(|m| m.group_id == "g").unwrap();
        assert_eq!(g.last_seq, 2, "the listing shows the held commit too");
        let loaded = store.load("g", &["a"]).await.unwrap();
        assert_eq!(loaded.meta.last_seq, 2);
        assert_eq!(loaded.calls["a"].status, CallStatus::Dispatched);
        commit(&store, "g", 3, &[with_status("a", CallStatus::Completed)]).await;
        store.publish("g", 2);
        assert_eq!(seqs(&store.events("g", 0, 10).await.unwrap()), [1, 2, 3]);
    }

    /// Only a load for a write (under the engine's lock) caches a thread's
    /// last commit: a lock-free reader may have found it before a write
    /// whose own entry was evicted since, and the next write would then
    /// reuse a sequence number.
    #[tokio::test]
    async fn only_locked_loads_cache_what_they_find() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open_caching(dir.path(), 1).unwrap();
        commit(&store, "g", 1, &[with_status("a", CallStatus::Queued)]).await;
        commit(&store, "other", 1, &[]).await;
        let cached = |store: &SledStore| store.last.lock().unwrap().peek("g").is_some();
        assert!(!cached(&store), "evicted");
        assert_eq!(store.thread("g").await.unwrap().unwrap().last_seq, 1);
        assert_eq!(store.call("g", "a").await.unwrap().unwrap().id, "a");
        assert_eq!(seqs(&store.events("g", 0, 10).await.unwrap()), [1]);
        assert!(!cached(&store), "lock-free reads leave the cache alone");
        assert_eq!(store.load("g", &["a"]).await.unwrap().meta.last_seq, 1);
        assert!(cached(&store), "a load for a write caches");
    }

    /// A call's copy is never newer than the log: moving on from a call
    /// that only a held commit carries writes that commit first.
    #[tokio::test]
    async fn a_copy_never_runs_ahead_of_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        commit(&store, "g", 1, &[with_status("a", CallStatus::Queued)]).await;
        commit(&store, "g", 2, &[with_status("b", CallStatus::Queued)]).await;
        hold(&store, "g", 3, &[with_status("a", CallStatus::Dispatched)]).await;
        assert_eq!(store.log.len(), 2, "3 is held");
        // 4 carries only b: a's copy (as 3 left it) needs 3 in the log.
        hold(&store, "g", 4, &[with_status("b", CallStatus::Dispatched)]).await;
        assert_eq!(store.log.len(), 3, "3 went in before a's copy");
        let copy = store.copy("g", "a").unwrap().unwrap();
        assert_eq!(copy.status, CallStatus::Dispatched);
    }

    /// After a failed write nothing more becomes visible: held events it
    /// took with it are gone, so no sequence number may be shown past them.
    #[tokio::test]
    async fn a_poisoned_store_shows_nothing_more() {
        let dir = tempfile::tempdir().unwrap();
        let store = held_dispatch(dir.path()).await;
        store.poison();
        assert!(store.flush().await.is_err());
        store.publish("g", 2);
        assert_eq!(*store.watch("g").borrow(), 1);
        assert_eq!(seqs(&store.events("g", 0, 10).await.unwrap()), [1]);
        assert!(!store.is_durable("g", 2));
        assert!(store.settle("g").await.is_err());
    }

    /// A reader that found an older last commit does not replace the one a
    /// writer cached meanwhile.
    #[tokio::test]
    async fn a_reader_never_caches_over_a_newer_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        let at = |seq| {
            Arc::new(Commit {
                meta: ThreadMeta {
                    last_seq: seq,
                    ..ThreadMeta::default()
                },
                calls: vec![],
                events: vec![],
            })
        };
        store.remember("g", at(2));
        for locked in [false, true] {
            assert_eq!(store.remember_read("g", at(1), locked).meta.last_seq, 2);
        }
        assert_eq!(store.last_commit("g").unwrap().unwrap().meta.last_seq, 2);
    }

    /// Held events made durable inside the next write's commit, and shown
    /// before that write is, read back from sled too (a reader too far
    /// behind for the events kept in memory).
    #[tokio::test]
    async fn held_events_shown_early_read_back_from_sled() {
        let dir = tempfile::tempdir().unwrap();
        let store = held_dispatch(dir.path()).await;
        append_next(
            &store,
            "g",
            3,
            &[with_status("a", CallStatus::Completed)],
            false,
        )
        .await;
        store
            .tips
            .lock()
            .unwrap()
            .get_mut("g")
            .unwrap()
            .recent
            .clear();
        store.settle("g").await.unwrap();
        store.flush().await.unwrap();
        // The held write's task publishes 2; the result's own publish of 3
        // has not happened yet.
        store.publish("g", 2);
        assert_eq!(seqs(&store.events("g", 0, 10).await.unwrap()), [1, 2]);
        store.publish("g", 3);
        assert_eq!(seqs(&store.events("g", 0, 10).await.unwrap()), [1, 2, 3]);
        assert_eq!(seqs(&store.events("g", 2, 10).await.unwrap()), [3]);
    }

    /// Held commits still held when the store closes are written, not lost.
    #[tokio::test]
    async fn held_commits_are_written_when_the_store_closes() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = held_dispatch(dir.path()).await;
            hold(&store, "g", 3, &[with_status("a", CallStatus::Subscribed)]).await;
        }
        let store = reopen(dir.path()).await;
        assert_eq!(store.thread("g").await.unwrap().unwrap().last_seq, 3);
        assert_eq!(seqs(&store.events("g", 0, 10).await.unwrap()), [1, 2, 3]);
        let a = store.call("g", "a").await.unwrap().unwrap();
        assert_eq!(a.status, CallStatus::Subscribed);
    }

    #[tokio::test]
    async fn writes_read_back_and_a_stale_expectation_conflicts() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        let mut state = ThreadState::new("g");
        state.meta.last_seq = 1;
        let events = [event("g", 1)];
        store
            .write(Write {
                expected_last_seq: 0,
                state: &state,
                events: &events,
            })
            .await
            .unwrap();
        store.flush().await.unwrap();
        store.publish("g", 1);
        assert_eq!(store.events("g", 0, 10).await.unwrap(), events);
        let stale = store
            .write(Write {
                expected_last_seq: 0,
                state: &state,
                events: &events,
            })
            .await;
        assert!(matches!(stale, Err(Error::Conflict(_))));
    }

    /// A store for races between a reader on its own OS thread and writes
    /// driven from the test's thread: the runtime, its directory, the store.
    fn racing_store() -> (tokio::runtime::Runtime, tempfile::TempDir, Arc<SledStore>) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(rt.block_on(async { SledStore::open(dir.path()) }).unwrap());
        (rt, dir, store)
    }

    /// Runs `read` on an OS thread and runtime of its own, to race the
    /// writes the test makes meanwhile; its answer comes with the join.
    fn reading<T, F>(
        store: &Arc<SledStore>,
        read: impl FnOnce(Arc<SledStore>) -> F + Send + 'static,
    ) -> std::thread::JoinHandle<T>
    where
        F: std::future::Future<Output = Result<T, Error>>,
        T: Send + 'static,
    {
        let store = store.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(read(store)).unwrap()
        })
    }

    /// A reader of a thread nobody watches (a plain `/events` read) must
    /// not show a commit inserted during its scan, before that commit's
    /// flush. A race, so many trials, each starting the write at a
    /// slightly later point of the scan (65 of 300 showed it before the
    /// fix).
    #[test]
    fn a_reader_without_a_watch_never_shows_an_unflushed_commit() {
        let (rt, _dir, store) = racing_store();
        // A long thread, so that a scan from 0 takes a while.
        let mut seq = 900u64;
        rt.block_on(async {
            for seq in 1..=seq {
                append_next(&store, "g", seq, &[], false).await;
            }
            store.flush().await.unwrap();
            // One publish per write, as the engine does.
            for seq in 1..=seq {
                store.publish("g", seq);
            }
        });
        assert!(store.tips.lock().unwrap().is_empty(), "an idle thread");
        let mut shown_early = 0;
        for trial in 0..300u64 {
            let reader = reading(&store, |s| async move { s.events("g", 0, 1000).await });
            // Jitter, not synchronisation: where in the scan the write lands.
            std::thread::sleep(std::time::Duration::from_micros((trial % 20) * 50));
            seq += 1;
            rt.block_on(append_next(&store, "g", seq, &[], false));
            let events = reader.join().unwrap();
            if events.last().map(|e| e.seq) == Some(seq) {
                shown_early += 1;
            }
            rt.block_on(async {
                store.flush().await.unwrap();
                store.publish("g", seq);
            });
        }
        assert_eq!(shown_early, 0, "shown before its flush, of 300");
    }

    /// `calls` scans the pointers, then reads the last commit. A call only
    /// the last commit carries, whose thread moves on during the scan (its
    /// pointer landing behind the scan, the new last commit not carrying
    /// it), was in neither, and dropped out of the listing: 189–191 of 200
    /// listings here missed it before the commits in between were read.
    /// Found by a review.
    #[test]
    fn calls_lists_a_call_whose_thread_moves_on_during_the_listing() {
        let (rt, _dir, store) = racing_store();
        // Many moved calls, so that the listing's scan of pointers takes a while.
        let mut seq = 0u64;
        rt.block_on(async {
            for i in 0..2000 {
                seq += 1;
                let id = format!("m{i:05}");
                let calls = [with_status(&id, CallStatus::Completed)];
                append_next(&store, "g", seq, &calls, false).await;
            }
        });
        let mut dropped = 0;
        let trials = 200u64;
        for trial in 0..trials {
            // A new call that sorts before every pointer: the scan passes its
            // key first. Only the last commit carries it.
            let id = format!("a{:05}", 99_999 - trial);
            seq += 1;
            rt.block_on(commit(
                &store,
                "g",
                seq,
                &[with_status(&id, CallStatus::Queued)],
            ));
            let reader = reading(&store, |s| async move { s.calls("g").await });
            std::thread::sleep(std::time::Duration::from_micros((trial % 20) * 100));
            // The thread moves on: the new call gets its pointer, the new
            // last commit carries another call.
            seq += 1;
            let other = format!("z{trial:05}");
            rt.block_on(commit(
                &store,
                "g",
                seq,
                &[with_status(&other, CallStatus::Queued)],
            ));
            let listed = reader.join().unwrap();
            if !listed.iter().any(|c| c.id == id) {
                dropped += 1;
            }
        }
        // Read alone, every call is listed: what went missing was the race.
        let all = rt.block_on(store.calls("g")).unwrap();
        assert_eq!(all.len() as u64, 2000 + 2 * trials);
        assert_eq!(
            dropped, 0,
            "calls listed without an existing call, of {trials}"
        );
    }

    #[tokio::test]
    async fn watching_a_thread_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        for i in 0..100 {
            drop(store.watch(&format!("never-written-{i}")));
        }
        let kept = store.watch("kept");
        assert_eq!(store.tips.lock().unwrap().len(), 1);
        drop(kept);
        assert!(store.tips.lock().unwrap().is_empty());
    }

    /// A call's record is in the last commit while the thread works on it,
    /// then in its copy; both read back after a restart (a cold cache).
    #[tokio::test]
    async fn calls_read_back_from_the_last_commit_or_their_copy_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = SledStore::open(dir.path()).unwrap();
            commit(&store, "g", 1, &[with_status("a", CallStatus::Queued)]).await;
            commit(&store, "g", 2, &[with_status("a", CallStatus::Completed)]).await;
            assert!(store.copy("g", "a").unwrap().is_none(), "not moved on yet");
            commit(&store, "g", 3, &[with_status("b", CallStatus::Queued)]).await;
            commit(&store, "h", 1, &[with_status("c", CallStatus::Queued)]).await;
        }
        let store = reopen(dir.path()).await;
        let state = store.load("g", &["a", "b", "x"]).await.unwrap();
        assert_eq!(state.meta.last_seq, 3);
        assert_eq!(state.calls["a"].status, CallStatus::Completed);
        assert_eq!(state.calls["b"].status, CallStatus::Queued);
        assert!(!state.calls.contains_key("x"));
        assert_eq!(call_ids(&store, "g").await, ["a", "b"]);
        let events: Vec<u64> = store
            .events("g", 1, 10)
            .await
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(events, [2, 3]);
        assert_eq!(
            store.events("g", 0, 2).await.unwrap().len(),
            2,
            "limit holds"
        );
        let mut threads: Vec<_> = store
            .threads()
            .await
            .unwrap()
            .into_iter()
            .map(|m| (m.group_id, m.last_seq))
            .collect();
        threads.sort();
        assert_eq!(threads, [("g".into(), 3), ("h".into(), 1)]);
    }

    /// Every pointer reads back as the number it was written with, whatever
    /// its first byte would be in the shortest encoding (123 is `{`).
    #[test]
    fn pointers_read_back_whatever_the_number() {
        for seq in [0, 1, 123, 127, 128, 255, 65_535, u32::MAX as u64, u64::MAX] {
            assert_eq!(pointer::read(&pointer::of(seq)).unwrap(), seq);
        }
    }

    /// A thread long enough that its pointers cross every one-byte
    /// encoding (123 is `{` in the shortest one): each moved call reads
    /// back, before and after a restart, alone and in the listing.
    #[tokio::test]
    async fn a_long_thread_reads_back_every_moved_call() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<String> = (1..=130).map(|seq| format!("c{seq:03}")).collect();
        {
            let store = SledStore::open(dir.path()).unwrap();
            for (seq, id) in (1..).zip(&ids) {
                commit(&store, "g", seq, &[with_status(id, CallStatus::Completed)]).await;
            }
            for id in &ids[..129] {
                assert_eq!(store.copy("g", id).unwrap().unwrap().id, *id);
            }
        }
        let store = reopen(dir.path()).await;
        for id in &ids {
            let state = store.load("g", &[id]).await.unwrap();
            assert_eq!(state.calls[id].status, CallStatus::Completed, "{id}");
        }
        assert_eq!(call_ids(&store, "g").await, ids);
    }

    /// A call its thread moved on from is found through the sequence number
    /// of the commit that carries it; anything else in its place, or a
    /// pointer to a commit without the call, is corruption, not a missing
    /// call.
    #[tokio::test]
    async fn a_moved_call_is_found_through_the_commit_that_carries_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        commit(&store, "g", 1, &[with_status("a", CallStatus::Queued)]).await;
        commit(&store, "g", 2, &[with_status("a", CallStatus::Completed)]).await;
        commit(&store, "g", 3, &[with_status("b", CallStatus::Queued)]).await;
        let pointer = store.calls.get(keys::call("g", "a")).unwrap().unwrap();
        assert_eq!(decode::<u64>(&pointer).unwrap(), 2, "MessagePack's u64");
        assert_eq!(pointer.len(), 9, "a pointer, not a record");
        assert_eq!(
            store.copy("g", "a").unwrap().unwrap().status,
            CallStatus::Completed
        );

        let record = rmp_serde::to_vec_named(&with_status("c", CallStatus::Failed)).unwrap();
        store.calls.insert(keys::call("g", "c"), record).unwrap();
        assert!(matches!(store.copy("g", "c"), Err(Error::Corrupt(_))));

        store
            .calls
            .insert(keys::call("g", "lost"), pointer::of(1).as_slice())
            .unwrap();
        assert!(matches!(store.copy("g", "lost"), Err(Error::Corrupt(_))));
        store
            .calls
            .insert(keys::call("g", "gone"), pointer::of(9).as_slice())
            .unwrap();
        assert!(matches!(store.copy("g", "gone"), Err(Error::Corrupt(_))));
    }

    #[test]
    fn a_tip_serves_durable_events_from_memory_only_when_it_holds_them_all() {
        let mut tip = Tip::new(0);
        tip.remember(vec![event("g", 1), event("g", 2)]);
        tip.remember(vec![event("g", 3)]);
        tip.durable.send_replace(2);
        let seqs = |events: Option<Vec<Event>>| {
            events.map(|e| e.iter().map(|e| e.seq).collect::<Vec<_>>())
        };
        assert_eq!(
            seqs(tip.events_after(0, 10)),
            Some(vec![1, 2]),
            "not past durable"
        );
        assert_eq!(seqs(tip.events_after(1, 10)), Some(vec![2]));
        assert_eq!(seqs(tip.events_after(0, 1)), Some(vec![1]));
        // A gap (events written while nobody kept them) restarts memory.
        tip.remember(vec![event("g", 7)]);
        assert_eq!(
            seqs(tip.events_after(3, 10)),
            None,
            "6 and before are not in memory"
        );
        for seq in 8..8 + RECENT_EVENTS as u64 {
            tip.remember(vec![event("g", seq)]);
        }
        assert_eq!(tip.recent.len(), RECENT_EVENTS);
        assert_eq!(seqs(tip.events_after(6, 10)), None, "7 fell out");
        assert_eq!(
            seqs(tip.events_after(7, 10)),
            Some(vec![]),
            "8 on, none durable"
        );
    }

    #[tokio::test]
    async fn recovery_sees_unsettled_calls_and_not_finished_ones_also_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let expected = vec![
            ("g".to_owned(), "b".to_owned()),
            ("h".to_owned(), "c".to_owned()),
        ];
        {
            let store = SledStore::open(dir.path()).unwrap();
            commit(&store, "g", 1, &[with_status("a", CallStatus::Queued)]).await;
            commit(&store, "g", 2, &[with_status("b", CallStatus::Dispatched)]).await;
            commit(&store, "g", 3, &[with_status("a", CallStatus::Completed)]).await;
            commit(&store, "h", 1, &[with_status("c", CallStatus::Queued)]).await;
            commit(&store, "i", 1, &[with_status("d", CallStatus::Queued)]).await;
            commit(&store, "i", 2, &[with_status("d", CallStatus::Failed)]).await;
            assert_eq!(store.open_calls().await.unwrap(), expected);
        }
        let store = reopen(dir.path()).await;
        assert_eq!(store.open_calls().await.unwrap(), expected);
    }

    #[tokio::test]
    async fn a_directory_of_the_old_layout_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::open(dir.path()).unwrap();
            db.open_tree("journal").unwrap();
            db.flush().unwrap();
        }
        let message = crate::store::open_when_unlocked(|| SledStore::open(dir.path()))
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(message.contains("older Ferry"), "{message}");
    }

    /// A directory whose commits are JSON (a layout before MessagePack)
    /// is refused at open with the same error, not misread later.
    #[tokio::test]
    async fn a_directory_of_json_values_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::open(dir.path()).unwrap();
            let log = db.open_tree("log").unwrap();
            log.insert(keys::commit("g", 1), &b"{\"meta\":{}}"[..])
                .unwrap();
            db.flush().unwrap();
        }
        let message = crate::store::open_when_unlocked(|| SledStore::open(dir.path()))
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(message.contains("older Ferry"), "{message}");
    }
}
