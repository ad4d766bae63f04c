//! A runtime node's journal: every request it accepts is written here and
//! fsynced (group commit) before the node answers, then relayed to NATS and
//! removed. What a crash or a NATS outage leaves here is relayed later
//! (invariants 1 and 7).

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::engine::requests::Request;
use crate::store::commit::GroupCommit;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the outbox failed: {0}")]
    Backend(String),
    #[error("an outbox entry is unreadable: {0}")]
    Corrupt(String),
}

fn backend(e: impl std::fmt::Display) -> Error {
    Error::Backend(e.to_string())
}

/// One journaled request.
#[derive(Debug, Serialize, Deserialize)]
pub struct Entry {
    pub group_id: String,
    /// Where the node that took the request waits for the answer.
    pub reply_to: Option<String>,
    pub request: Request,
}

pub struct Outbox {
    db: Arc<sled::Db>,
    entries: sled::Tree,
    commit: GroupCommit,
}

impl Outbox {
    /// Opens the outbox in `dir` (inside a tokio runtime: group commit).
    pub fn open(dir: &Path) -> Result<Self, Error> {
        let db = Arc::new(sled::open(dir).map_err(backend)?);
        Ok(Self {
            entries: db.open_tree("outbox").map_err(backend)?,
            commit: GroupCommit::start(Arc::downgrade(&db)),
            db,
        })
    }

    /// A new entry number, increasing across restarts: it names the entry
    /// in `Nats-Msg-Id`, so a relay repeated after a crash is stored once.
    pub fn next_number(&self) -> Result<u64, Error> {
        self.db.generate_id().map_err(backend)
    }

    /// An entry as [`Outbox::append`] stores it.
    pub fn encode(entry: &Entry) -> Vec<u8> {
        rmp_serde::to_vec_named(entry).expect("entries serialize")
    }

    /// Writes an entry encoded by [`Outbox::encode`] and returns once it is
    /// durable.
    pub async fn append(&self, number: u64, bytes: Vec<u8>) -> Result<(), Error> {
        self.entries
            .insert(number.to_be_bytes(), bytes)
            .map_err(backend)?;
        self.commit.flush().await.map_err(Error::Backend)
    }

    /// Up to `limit` entries still to relay, oldest first.
    pub fn pending(&self, limit: usize) -> Result<Vec<(u64, Entry)>, Error> {
        let mut out = vec![];
        for item in self.entries.iter().take(limit) {
            let (key, value) = item.map_err(backend)?;
            let number = u64::from_be_bytes(
                key.as_ref()
                    .try_into()
                    .map_err(|_| Error::Corrupt("bad key".into()))?,
            );
            let entry = rmp_serde::from_slice(&value).map_err(|e| Error::Corrupt(e.to_string()))?;
            out.push((number, entry));
        }
        Ok(out)
    }

    /// Forgets a relayed entry (made durable with the next group commit; a
    /// crash before that relays it again, which `Nats-Msg-Id` dedupes).
    pub fn remove(&self, number: u64) -> Result<(), Error> {
        self.entries
            .remove(number.to_be_bytes())
            .map(drop)
            .map_err(backend)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
