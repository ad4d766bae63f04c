//! The embedded storage adapter: sled trees, written atomically per command
//! and made durable by group commit.
//!
//! Trees: `threads` (thread key → [`ThreadMeta`], MessagePack), `calls`
//! (call key → [`CallRecord`], MessagePack), `events` (event key → JSON
//! event, served as is), `open` (call key → `()`, the calls recovery walks),
//! `toolsets` (`name\0version` → JSON), and `journal`.
//!
//! Why a journal rather than a sled transaction: a multi-tree transaction
//! pins sled's log and seals its IO buffer on commit, so every command paid
//! its own write-out and group commit had nothing left to merge (measured:
//! about 6 synced writes per call). Instead each command's writes are first
//! recorded as **one** journal value (a single-key insert is atomic), then
//! applied to the trees with plain inserts, then the journal entry is
//! removed; none of these seal the log, so one `flush` covers many commands.
//! sled recovers a prefix of its log after a crash, so an entry still in the
//! journal on open was written before any of its (possibly partial)
//! applications: replaying it, idempotently, completes the command.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ferry_proto::api::Event;
use serde::{de::DeserializeOwned, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;
use tokio::sync::watch;

use super::commit::GroupCommit;
use super::{keys, Error, Store, Watch, Write};
use crate::thread::{CallRecord, ThreadMeta, ThreadState};
use crate::toolsets::StoredToolset;

pub struct SledStore {
    db: Arc<sled::Db>,
    threads: sled::Tree,
    calls: sled::Tree,
    events: sled::Tree,
    open: sled::Tree,
    toolsets: sled::Tree,
    journal: sled::Tree,
    /// Keys of journal entries; the journal is empty after open, so counting
    /// from zero in each process is enough.
    next_entry: AtomicU64,
    commit: GroupCommit,
    /// Per thread with a write in flight or a reader waiting: the last
    /// durable sequence number. Readers never see past it, so an event that
    /// a crash could still take back is never shown to an agent.
    tips: Arc<Mutex<HashMap<String, Tip>>>,
    /// Set when a write failed after its journal entry, or a flush failed:
    /// the trees may disagree with the journal, and replaying that entry
    /// later could revert newer writes. Every later write is refused until
    /// a restart replays the journal.
    poisoned: std::sync::atomic::AtomicBool,
}

/// The trees a journal entry writes to.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
enum TreeId {
    Threads,
    Calls,
    Events,
    Open,
}

/// One write of a command, as recorded in the journal.
#[derive(Debug, Serialize, Deserialize)]
enum Op {
    Put(
        TreeId,
        #[serde(with = "serde_bytes")] Vec<u8>,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    Delete(TreeId, #[serde(with = "serde_bytes")] Vec<u8>),
}

struct Tip {
    durable: watch::Sender<u64>,
    /// Writes made but not yet published.
    pending: u32,
}

fn backend(e: impl std::fmt::Display) -> Error {
    Error::Backend(e.to_string())
}

fn pack<T: Serialize>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(value).expect("state records always serialize")
}

fn unpack<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    rmp_serde::from_slice(bytes).map_err(|e| Error::Corrupt(e.to_string()))
}

impl SledStore {
    /// Opens (or creates) the store in `dir`. Must be called inside a tokio
    /// runtime: it starts the group-commit task.
    pub fn open(dir: &Path) -> Result<Self, Error> {
        let db = sled::Config::new()
            .path(dir)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(backend)?;
        let db = Arc::new(db);
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        let store = Self {
            threads: tree("threads")?,
            calls: tree("calls")?,
            events: tree("events")?,
            open: tree("open")?,
            toolsets: tree("toolsets")?,
            journal: tree("journal")?,
            next_entry: AtomicU64::new(0),
            commit: GroupCommit::start(Arc::downgrade(&db)),
            db,
            tips: Arc::default(),
            poisoned: std::sync::atomic::AtomicBool::new(false),
        };
        store.replay_journal()?;
        Ok(store)
    }

    /// Completes commands a crash interrupted between their journal entry
    /// and its removal, then empties the journal.
    fn replay_journal(&self) -> Result<(), Error> {
        let mut replayed = 0;
        for entry in self.journal.iter() {
            let (key, value) = entry.map_err(backend)?;
            let ops: Vec<Op> = unpack(&value)?;
            self.apply(&ops)?;
            self.journal.remove(key).map_err(backend)?;
            replayed += 1;
        }
        if replayed > 0 {
            self.db.flush().map_err(backend)?;
            tracing::info!(
                replayed,
                "storage: completed interrupted writes from the journal"
            );
        }
        Ok(())
    }

    fn tree(&self, id: TreeId) -> &sled::Tree {
        match id {
            TreeId::Threads => &self.threads,
            TreeId::Calls => &self.calls,
            TreeId::Events => &self.events,
            TreeId::Open => &self.open,
        }
    }

    fn apply(&self, ops: &[Op]) -> Result<(), Error> {
        for op in ops {
            match op {
                Op::Put(tree, key, value) => {
                    self.tree(*tree)
                        .insert(key.as_slice(), value.as_slice())
                        .map_err(backend)?;
                }
                Op::Delete(tree, key) => {
                    self.tree(*tree).remove(key.as_slice()).map_err(backend)?;
                }
            }
        }
        Ok(())
    }

    fn meta(&self, group_id: &str) -> Result<Option<ThreadMeta>, Error> {
        match self.threads.get(keys::thread(group_id)).map_err(backend)? {
            Some(bytes) => unpack(&bytes).map(Some),
            None => Ok(None),
        }
    }
}

#[async_trait]
impl Store for SledStore {
    async fn load(&self, group_id: &str, call_ids: &[&str]) -> Result<ThreadState, Error> {
        let mut state = ThreadState::new(group_id);
        if let Some(meta) = self.meta(group_id)? {
            state.meta = meta;
        }
        for id in call_ids {
            if let Some(bytes) = self.calls.get(keys::call(group_id, id)).map_err(backend)? {
                state.calls.insert((*id).to_owned(), unpack(&bytes)?);
            }
        }
        Ok(state)
    }

    /// Callers serialise writes per thread (the engine's lock), and only
    /// this process can open the sled directory, so reading `last_seq` and
    /// then writing is a sound compare-and-set.
    async fn write(&self, write: Write<'_>) -> Result<(), Error> {
        let group_id = write.state.meta.group_id.as_str();
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(Error::Backend(
                "an earlier write failed; restart Ferry to recover the store".into(),
            ));
        }
        let stored = self.meta(group_id)?.map_or(0, |m| m.last_seq);
        if stored != write.expected_last_seq {
            return Err(Error::Conflict(group_id.to_owned()));
        }
        let mut ops = Vec::with_capacity(2 + 2 * write.state.calls.len() + write.events.len());
        for event in write.events {
            let value = serde_json::to_vec(event).expect("events serialize");
            ops.push(Op::Put(
                TreeId::Events,
                keys::event(group_id, event.seq),
                value,
            ));
        }
        for call in write.state.calls.values() {
            let key = keys::call(group_id, &call.id);
            ops.push(if call.status.is_open() {
                Op::Put(TreeId::Open, key.clone(), vec![])
            } else {
                Op::Delete(TreeId::Open, key.clone())
            });
            ops.push(Op::Put(TreeId::Calls, key, pack(call)));
        }
        ops.push(Op::Put(
            TreeId::Threads,
            keys::thread(group_id),
            pack(&write.state.meta),
        ));
        {
            let mut tips = self.tips.lock().expect("tips lock");
            let tip = tips.entry(group_id.to_owned()).or_insert_with(|| Tip {
                durable: watch::Sender::new(write.expected_last_seq),
                pending: 0,
            });
            tip.pending += 1;
        }
        let entry = self
            .next_entry
            .fetch_add(1, Ordering::Relaxed)
            .to_be_bytes();
        let journaled = self.journal.insert(entry, pack(&ops)).map_err(backend);
        let result = journaled.and_then(|_| {
            let applied = self
                .apply(&ops)
                .and_then(|_| self.journal.remove(entry).map(drop).map_err(backend));
            if applied.is_err() {
                self.poisoned.store(true, Ordering::SeqCst);
            }
            applied
        });
        if result.is_err() {
            self.publish(group_id, write.expected_last_seq);
        }
        result
    }

    async fn flush(&self) -> Result<(), Error> {
        let flushed = self.commit.flush().await.map_err(Error::Backend);
        if flushed.is_err() {
            self.poisoned.store(true, Ordering::SeqCst);
        }
        flushed
    }

    fn publish(&self, group_id: &str, seq: u64) {
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
            tips.get(group_id).map_or(u64::MAX, |t| *t.durable.borrow())
        };
        if durable <= after {
            return Ok(vec![]);
        }
        let range = keys::event(group_id, after + 1)..=keys::event(group_id, durable);
        let mut out = Vec::new();
        for entry in self.events.range(range).take(limit) {
            let (_, bytes) = entry.map_err(backend)?;
            out.push(serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt(e.to_string()))?);
        }
        Ok(out)
    }

    fn watch(&self, group_id: &str) -> Watch {
        let mut tips = self.tips.lock().expect("tips lock");
        let receiver = match tips.get(group_id) {
            Some(tip) => tip.durable.subscribe(),
            None => {
                // No write in flight: everything stored is durable.
                let last = self.meta(group_id).ok().flatten().map_or(0, |m| m.last_seq);
                let sender = watch::Sender::new(last);
                let receiver = sender.subscribe();
                tips.insert(
                    group_id.to_owned(),
                    Tip {
                        durable: sender,
                        pending: 0,
                    },
                );
                receiver
            }
        };
        let (all, group_id) = (Arc::downgrade(&self.tips), group_id.to_owned());
        Watch::new(
            receiver,
            Box::new(move || {
                let Some(all) = all.upgrade() else { return };
                let mut tips = all.lock().expect("tips lock");
                if tips
                    .get(&group_id)
                    .is_some_and(|t| t.pending == 0 && t.durable.receiver_count() == 0)
                {
                    tips.remove(&group_id);
                }
            }),
        )
    }

    async fn thread(&self, group_id: &str) -> Result<Option<ThreadMeta>, Error> {
        self.meta(group_id)
    }

    async fn threads(&self) -> Result<Vec<ThreadMeta>, Error> {
        self.threads
            .iter()
            .values()
            .map(|v| unpack(&v.map_err(backend)?))
            .collect()
    }

    async fn calls(&self, group_id: &str) -> Result<Vec<CallRecord>, Error> {
        self.calls
            .scan_prefix(keys::thread(group_id))
            .values()
            .map(|v| unpack(&v.map_err(backend)?))
            .collect()
    }

    async fn call(&self, group_id: &str, id: &str) -> Result<Option<CallRecord>, Error> {
        match self.calls.get(keys::call(group_id, id)).map_err(backend)? {
            Some(bytes) => unpack(&bytes).map(Some),
            None => Ok(None),
        }
    }

    async fn open_calls(&self) -> Result<Vec<(String, String)>, Error> {
        self.open
            .iter()
            .keys()
            .map(|k| {
                let k = k.map_err(backend)?;
                keys::split_call(&k).ok_or_else(|| Error::Corrupt("open call key".into()))
            })
            .collect()
    }

    async fn put_toolset(&self, toolset: &StoredToolset) -> Result<(), Error> {
        let key = keys::toolset(&toolset.name, &toolset.version);
        let value = serde_json::to_vec(toolset).expect("toolsets serialize");
        self.toolsets.insert(key, value).map_err(backend)?;
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
            .map(|v| {
                let v = v.map_err(backend)?;
                serde_json::from_slice(&v).map_err(|e| Error::Corrupt(e.to_string()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::api::EventKind;

    fn event(group_id: &str, seq: u64) -> Event {
        Event {
            seq,
            group_id: group_id.into(),
            id: None,
            at: "t".into(),
            kind: EventKind::ThreadClosed {},
        }
    }

    /// Opens a store just dropped in this process. sled's I/O threads may
    /// still hold the directory lock for a moment after the drop (a restart
    /// is a new process, where this cannot happen), so retry, bounded.
    async fn reopen(dir: &Path) -> SledStore {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match SledStore::open(dir) {
                Ok(store) => return store,
                Err(e)
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => panic!("reopening the store: {e}"),
            }
        }
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

    #[tokio::test]
    async fn a_command_cut_short_after_its_journal_entry_is_completed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = SledStore::open(dir.path()).unwrap();
            let mut meta = ThreadMeta {
                group_id: "g".into(),
                ..ThreadMeta::default()
            };
            meta.last_seq = 1;
            let ops = vec![
                Op::Put(
                    TreeId::Events,
                    keys::event("g", 1),
                    serde_json::to_vec(&event("g", 1)).unwrap(),
                ),
                Op::Put(TreeId::Threads, keys::thread("g"), pack(&meta)),
            ];
            // The crash: the journal entry is written, nothing applied.
            store
                .journal
                .insert(7u64.to_be_bytes(), pack(&ops))
                .unwrap();
            store.db.flush().unwrap();
        }
        let store = reopen(dir.path()).await;
        assert_eq!(store.thread("g").await.unwrap().unwrap().last_seq, 1);
        assert_eq!(store.events("g", 0, 10).await.unwrap(), vec![event("g", 1)]);
        assert!(store.journal.is_empty());
    }
}
