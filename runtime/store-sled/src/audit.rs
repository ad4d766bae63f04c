//! The audit log in sled, one tree (`audit`): entries under `e` + their
//! sequence number, and each entry's key under `k` + the key, pointing at
//! the entry, so that a repeat of an action is stored once. Both are plain
//! inserts, in the same flush as the thread write that brings them: a
//! sled batch or transaction takes the database's global write lock and
//! cut `ferry serve`'s calls/s to a third (BENCHMARKS.md). The entry goes
//! first, so a crash between the two can only leave a repeat stored
//! twice, never an entry lost.

use std::sync::Mutex;

use ferry_proto::audit::{AuditEntry, AuditQuery, AuditRecord};
use ferry_store::codec::{decode, encode};
use ferry_store::Error;

const ENTRY: u8 = b'e';
const KEY: u8 = b'k';

pub struct AuditLog {
    tree: sled::Tree,
    /// The next entry's number. Held while entries are stored, so numbers
    /// are given in the order entries become readable: a reader that read
    /// up to `n` never later finds an entry below `n` it had not seen.
    next: Mutex<u64>,
}

fn entry_key(seq: u64) -> [u8; 9] {
    let mut key = [ENTRY; 9];
    key[1..].copy_from_slice(&seq.to_be_bytes());
    key
}

fn key_key(key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + key.len());
    out.push(KEY);
    out.extend_from_slice(key.as_bytes());
    out
}

impl AuditLog {
    pub fn open(db: &sled::Db) -> Result<Self, Error> {
        let tree = db.open_tree("audit").map_err(super::backend)?;
        let last = tree
            .range(entry_key(0)..=entry_key(u64::MAX))
            .next_back()
            .transpose()
            .map_err(super::backend)?;
        let next = match last {
            Some((key, _)) => seq_of(&key)? + 1,
            None => 1,
        };
        Ok(Self {
            tree,
            next: Mutex::new(next),
        })
    }

    /// Stores the entries whose keys are new, not yet flushed.
    pub fn insert(&self, entries: &[AuditEntry]) -> sled::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut next = self.next.lock().expect("audit lock");
        for entry in entries {
            let key = key_key(&entry.key);
            if self.tree.contains_key(&key)? {
                continue;
            }
            let seq = *next;
            let record = AuditRecord {
                seq,
                entry: entry.clone(),
            };
            self.tree.insert(entry_key(seq), encode(&record))?;
            self.tree.insert(key, &seq.to_be_bytes())?;
            *next = seq + 1;
        }
        Ok(())
    }

    pub fn read(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, Error> {
        let mut out = vec![];
        let start = entry_key(query.after.saturating_add(1));
        for item in self.tree.range(start..=entry_key(u64::MAX)) {
            if out.len() >= query.limit {
                break;
            }
            let (_, value) = item.map_err(super::backend)?;
            let record: AuditRecord = decode(&value)?;
            if query.wants(&record) {
                out.push(record);
            }
        }
        Ok(out)
    }
}

fn seq_of(key: &[u8]) -> Result<u64, Error> {
    key.get(1..)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| Error::Corrupt(format!("an audit key of {} bytes", key.len())))
}
