//! A runtime node's journal: every request it accepts is written here and
//! fsynced (group commit) before the node answers, then relayed to NATS and
//! removed. What a crash or a NATS outage leaves here is relayed later
//! (invariants 1 and 7).
//!
//! An entry this build cannot read (written by another version, say) is
//! moved to the `unreadable` tree rather than left to hold back every entry
//! after it. Each start tries those again and puts back, under their own
//! numbers, the ones it can read: a node rolled back and then forward again
//! relays what the older build set aside.

use std::path::Path;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::error;

use super::provisional::Relayed;
use crate::engine::requests::Request;
use crate::store::commit::GroupCommit;
use crate::toolsets::StoredToolset;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the outbox failed: {0}")]
    Backend(String),
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

/// An entry's thread, read without the rest of it.
#[derive(Deserialize)]
struct EntryHead {
    group_id: String,
}

/// How many entries one `pending` call looks at, at most: entries waiting
/// for their thread's turn are passed over, not without end.
pub const SCAN_LIMIT: usize = 4096;

pub struct Outbox {
    db: Arc<sled::Db>,
    entries: sled::Tree,
    /// Entries `pending` could not decode, under their own keys.
    unreadable: sled::Tree,
    /// Submissions relayed and not yet answered, by entry number
    /// (`provisional::Relayed`).
    claims: sled::Tree,
    /// The toolsets last read from NATS (one value): what a node started
    /// while NATS is unreachable validates calls against.
    toolsets: sled::Tree,
    commit: GroupCommit,
}

impl Outbox {
    /// Opens the outbox in `dir` (inside a tokio runtime: group commit).
    pub fn open(dir: &Path) -> Result<Self, Error> {
        let db = Arc::new(sled::open(dir).map_err(backend)?);
        let outbox = Self {
            entries: db.open_tree("outbox").map_err(backend)?,
            unreadable: db.open_tree("unreadable").map_err(backend)?,
            claims: db.open_tree("claims").map_err(backend)?,
            toolsets: db.open_tree("toolsets").map_err(backend)?,
            commit: GroupCommit::start(Arc::downgrade(&db)),
            db,
        };
        outbox.take_back_readable()?;
        Ok(outbox)
    }

    /// Moves back to the outbox the set-aside entries this build reads
    /// (copied first: a crash in between leaves one in both, and the
    /// outbox's copy wins).
    fn take_back_readable(&self) -> Result<(), Error> {
        for item in self.unreadable.iter() {
            let (key, value) = item.map_err(backend)?;
            let readable = key.len() == 8 && rmp_serde::from_slice::<Entry>(&value).is_ok();
            if readable {
                self.entries.insert(&key, value).map_err(backend)?;
                self.unreadable.remove(&key).map_err(backend)?;
            }
        }
        self.db.flush().map_err(backend)?;
        Ok(())
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

    /// Up to `limit` entries still to relay, oldest first, of those `ready`
    /// takes (asked with each entry's number and thread, in order; one it
    /// refuses waits for a later call). At most [`SCAN_LIMIT`] entries are
    /// looked at. Unreadable ones are set aside on the way.
    pub fn pending(
        &self,
        limit: usize,
        mut ready: impl FnMut(u64, &str) -> bool,
    ) -> Result<Vec<(u64, Entry)>, Error> {
        let mut out = vec![];
        for item in self.entries.iter().take(SCAN_LIMIT) {
            if out.len() == limit {
                break;
            }
            let (key, value) = item.map_err(backend)?;
            let number = <[u8; 8]>::try_from(key.as_ref()).map(u64::from_be_bytes);
            // The thread alone first: an entry that must wait is not
            // decoded whole.
            if let (Ok(number), Ok(head)) = (number, rmp_serde::from_slice::<EntryHead>(&value)) {
                if !ready(number, &head.group_id) {
                    continue;
                }
            }
            match (number, rmp_serde::from_slice::<Entry>(&value)) {
                (Ok(number), Ok(entry)) => out.push((number, entry)),
                (number, entry) => {
                    let why = match entry {
                        Err(e) => e.to_string(),
                        Ok(_) => "its key is not an entry number".into(),
                    };
                    error!(key = ?number.ok(), error = %why, "unreadable journal entry set aside in the `unreadable` tree; it will not be relayed");
                    self.set_aside(&key, value)?;
                }
            }
        }
        Ok(out)
    }

    /// Every readable entry still to relay, oldest first (unreadable ones
    /// are skipped; `pending` sets them aside).
    pub fn entries(&self) -> impl Iterator<Item = (u64, Entry)> + '_ {
        numbered(&self.entries)
    }

    /// Moves an entry to `unreadable` (copied first: a crash in between
    /// leaves it in both, and the next `pending` moves it again).
    fn set_aside(&self, key: &[u8], value: sled::IVec) -> Result<(), Error> {
        self.unreadable.insert(key, value).map_err(backend)?;
        self.entries.remove(key).map(drop).map_err(backend)
    }

    /// Keeps the registered toolsets as NATS has them now, on disk at once
    /// (a node killed right after must still find them; they change
    /// rarely).
    pub fn keep_toolsets(&self, toolsets: &[StoredToolset]) -> Result<(), Error> {
        let bytes = rmp_serde::to_vec_named(toolsets).expect("toolsets serialize");
        self.toolsets.insert("all", bytes).map_err(backend)?;
        self.db.flush().map(drop).map_err(backend)
    }

    /// The toolsets last kept (none if never kept, or if another build
    /// kept them in a form this one cannot read: NATS has them).
    pub fn kept_toolsets(&self) -> Result<Vec<StoredToolset>, Error> {
        let Some(bytes) = self.toolsets.get("all").map_err(backend)? else {
            return Ok(vec![]);
        };
        Ok(rmp_serde::from_slice(&bytes).unwrap_or_else(|e| {
            error!(error = %e, "the toolsets kept in the outbox are unreadable");
            vec![]
        }))
    }

    /// How many entries were set aside as unreadable.
    pub fn unreadable(&self) -> usize {
        self.unreadable.len()
    }

    /// Waits until every removal so far is on disk.
    pub async fn flush(&self) -> Result<(), Error> {
        self.commit.flush().await.map_err(Error::Backend)
    }

    /// Forgets a relayed entry (durable after [`Outbox::flush`]; a crash
    /// before that relays it again, which `Nats-Msg-Id` dedupes while in
    /// its two-minute window).
    pub fn remove(&self, number: u64) -> Result<(), Error> {
        self.entries
            .remove(number.to_be_bytes())
            .map(drop)
            .map_err(backend)
    }

    /// Keeps a relayed submission's claim on its id (durable after
    /// [`Outbox::flush`]).
    pub fn keep_claim(&self, number: u64, claim: &Relayed) -> Result<(), Error> {
        let bytes = rmp_serde::to_vec_named(claim).expect("claims serialize");
        self.claims
            .insert(number.to_be_bytes(), bytes)
            .map(drop)
            .map_err(backend)
    }

    /// Forgets a claim that was settled (a crash that loses this brings
    /// it back, to be settled again).
    pub fn forget_claim(&self, number: u64) -> Result<(), Error> {
        self.claims
            .remove(number.to_be_bytes())
            .map(drop)
            .map_err(backend)
    }

    /// The claims kept, oldest first (unreadable ones are skipped).
    pub fn claims(&self) -> impl Iterator<Item = (u64, Relayed)> + '_ {
        numbered(&self.claims)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The readable values of a tree keyed by entry number, in order.
fn numbered<T: DeserializeOwned>(tree: &sled::Tree) -> impl Iterator<Item = (u64, T)> + '_ {
    tree.iter().filter_map(|item| {
        let (key, value) = item.ok()?;
        let number = u64::from_be_bytes(key.as_ref().try_into().ok()?);
        Some((number, rmp_serde::from_slice(&value).ok()?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(group_id: &str) -> Entry {
        Entry {
            group_id: group_id.into(),
            reply_to: None,
            request: Request::Close {
                group_id: group_id.into(),
            },
        }
    }

    fn groups(pending: &[(u64, Entry)]) -> Vec<&str> {
        pending.iter().map(|(_, e)| e.group_id.as_str()).collect()
    }

    /// Opens an outbox just dropped in this process (see
    /// [`crate::store::open_when_unlocked`]; CI once failed such a reopen).
    async fn reopen(dir: &Path) -> Outbox {
        crate::store::open_when_unlocked(|| Outbox::open(dir))
            .await
            .expect("reopening the outbox")
    }

    /// Entries `ready` refuses are passed over, not counted: the limit
    /// fills with the ones after them.
    #[tokio::test]
    async fn entries_waiting_their_turn_are_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let outbox = Outbox::open(dir.path()).unwrap();
        for (number, g) in [(1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, "c")] {
            outbox
                .append(number, Outbox::encode(&entry(g)))
                .await
                .unwrap();
        }
        let mut asked = vec![];
        let pending = outbox
            .pending(2, |number, g| {
                asked.push(number);
                g != "a"
            })
            .unwrap();
        assert_eq!(groups(&pending), ["b", "c"]);
        assert_eq!(asked, [1, 2, 3, 4, 5]);
        assert_eq!(outbox.len(), 5);
    }

    #[tokio::test]
    async fn an_unreadable_entry_is_set_aside_and_holds_back_nothing() {
        let dir = tempfile::tempdir().unwrap();
        {
            let outbox = Outbox::open(dir.path()).unwrap();
            for (number, g) in [(1, "a"), (3, "b")] {
                outbox
                    .append(number, Outbox::encode(&entry(g)))
                    .await
                    .unwrap();
            }
            // Between them: bytes no build reads, and a key that is no
            // entry number.
            outbox
                .append(2, b"\xc1 not an entry".to_vec())
                .await
                .unwrap();
            outbox
                .entries
                .insert(b"odd", Outbox::encode(&entry("c")))
                .unwrap();
            let pending = outbox.pending(10, |_, _| true).unwrap();
            assert_eq!(groups(&pending), ["a", "b"]);
            assert_eq!((outbox.len(), outbox.unreadable()), (2, 2));
            // The limit counts what is relayed, not what was set aside.
            assert_eq!(groups(&outbox.pending(1, |_, _| true).unwrap()), ["a"]);
            outbox.db.flush().unwrap();
        }
        // Kept across a restart, out of the way.
        let outbox = reopen(dir.path()).await;
        assert_eq!(
            groups(&outbox.pending(10, |_, _| true).unwrap()),
            ["a", "b"]
        );
        assert_eq!(outbox.unreadable(), 2);
        assert_eq!(
            outbox
                .unreadable
                .get(2u64.to_be_bytes())
                .unwrap()
                .as_deref(),
            Some(&b"\xc1 not an entry"[..])
        );
        // What an older build set aside, this one reads: at its start it
        // goes back to the outbox under its own number, in order.
        outbox
            .unreadable
            .insert(2u64.to_be_bytes(), Outbox::encode(&entry("set aside")))
            .unwrap();
        outbox.db.flush().unwrap();
        drop(outbox);
        let outbox = reopen(dir.path()).await;
        assert_eq!(
            groups(&outbox.pending(10, |_, _| true).unwrap()),
            ["a", "set aside", "b"]
        );
        assert_eq!(outbox.unreadable(), 1, "the key that is no number stays");
    }

    #[tokio::test]
    async fn kept_claims_outlast_a_restart_until_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let claim = |seq| Relayed {
            group_id: "g".into(),
            id: "c".into(),
            fingerprint: [seq as u8; 32],
            seq,
        };
        {
            let outbox = Outbox::open(dir.path()).unwrap();
            outbox.keep_claim(3, &claim(30)).unwrap();
            outbox.keep_claim(1, &claim(10)).unwrap();
            outbox.keep_claim(2, &claim(20)).unwrap();
            outbox.forget_claim(2).unwrap();
            outbox
                .claims
                .insert(4u64.to_be_bytes(), b"\xc1".to_vec())
                .unwrap();
            outbox.flush().await.unwrap();
        }
        let outbox = reopen(dir.path()).await;
        let kept: Vec<_> = outbox.claims().collect();
        assert_eq!(
            kept,
            [(1, claim(10)), (3, claim(30))],
            "in order, unreadable skipped"
        );
        assert!(outbox.is_empty(), "claims are not entries to relay");
    }
}
