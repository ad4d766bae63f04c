//! The embedded storage adapter: sled trees, written atomically per thread
//! and made durable by group commit.
//!
//! Trees: `threads` (thread key → [`ThreadMeta`], MessagePack), `calls`
//! (call key → [`CallRecord`], MessagePack), `events` (event key → JSON
//! event, served as is), `open` (call key → `()`, the calls recovery walks),
//! `toolsets` (`name\0version` → JSON).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use async_trait::async_trait;
use ferry_proto::api::Event;
use serde::{de::DeserializeOwned, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;
use tokio::sync::watch;

use super::commit::GroupCommit;
use super::{keys, Error, Store, Write};
use crate::thread::{CallRecord, ThreadMeta, ThreadState};
use crate::toolsets::StoredToolset;

pub struct SledStore {
    db: sled::Db,
    threads: sled::Tree,
    calls: sled::Tree,
    events: sled::Tree,
    open: sled::Tree,
    toolsets: sled::Tree,
    commit: GroupCommit,
    /// Per thread with a write in flight or a reader waiting: the last
    /// durable sequence number. Readers never see past it, so an event that
    /// a crash could still take back is never shown to an agent.
    tips: Mutex<HashMap<String, Tip>>,
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
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        Ok(Self {
            threads: tree("threads")?,
            calls: tree("calls")?,
            events: tree("events")?,
            open: tree("open")?,
            toolsets: tree("toolsets")?,
            commit: GroupCommit::start(db.clone()),
            db,
            tips: Mutex::new(HashMap::new()),
        })
    }

    fn meta(&self, group_id: &str) -> Result<Option<ThreadMeta>, Error> {
        match self.threads.get(keys::thread(group_id)).map_err(backend)? {
            Some(bytes) => unpack(&bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Reads this adapter's sled for something only sled knows (size on
    /// disk), for `/metrics` and benchmarks.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
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

    async fn write(&self, write: Write<'_>) -> Result<(), Error> {
        let group_id = write.state.meta.group_id.as_str();
        let thread_key = keys::thread(group_id);
        let meta = pack(&write.state.meta);
        let calls: Vec<_> = write
            .state
            .calls
            .values()
            .map(|c| (keys::call(group_id, &c.id), pack(c), c.status.is_open()))
            .collect();
        let events: Vec<_> = write
            .events
            .iter()
            .map(|e| {
                (
                    keys::event(group_id, e.seq),
                    serde_json::to_vec(e).expect("events serialize"),
                )
            })
            .collect();
        {
            let mut tips = self.tips.lock().expect("tips lock");
            let tip = tips.entry(group_id.to_owned()).or_insert_with(|| Tip {
                durable: watch::Sender::new(write.expected_last_seq),
                pending: 0,
            });
            tip.pending += 1;
        }
        let result = (&self.threads, &self.calls, &self.events, &self.open).transaction(
            |(threads, calls_t, events_t, open)| {
                let stored = match threads.get(&thread_key)? {
                    Some(bytes) => {
                        let meta: ThreadMeta = rmp_serde::from_slice(&bytes).map_err(|e| {
                            ConflictableTransactionError::Abort(Error::Corrupt(e.to_string()))
                        })?;
                        meta.last_seq
                    }
                    None => 0,
                };
                if stored != write.expected_last_seq {
                    return Err(ConflictableTransactionError::Abort(Error::Conflict(
                        group_id.to_owned(),
                    )));
                }
                threads.insert(thread_key.as_slice(), meta.as_slice())?;
                for (key, value, is_open) in &calls {
                    calls_t.insert(key.as_slice(), value.as_slice())?;
                    if *is_open {
                        open.insert(key.as_slice(), &[])?;
                    } else {
                        open.remove(key.as_slice())?;
                    }
                }
                for (key, value) in &events {
                    events_t.insert(key.as_slice(), value.as_slice())?;
                }
                Ok(())
            },
        );
        let result = result.map_err(|e| match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => backend(e),
        });
        if result.is_err() {
            let last = write.expected_last_seq;
            self.publish(group_id, last);
        }
        result
    }

    async fn flush(&self) -> Result<(), Error> {
        self.commit.flush().await.map_err(Error::Backend)
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

    fn watch(&self, group_id: &str) -> watch::Receiver<u64> {
        let mut tips = self.tips.lock().expect("tips lock");
        if let Some(tip) = tips.get(group_id) {
            return tip.durable.subscribe();
        }
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

    async fn thread(&self, group_id: &str) -> Result<Option<ThreadMeta>, Error> {
        self.meta(group_id)
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
