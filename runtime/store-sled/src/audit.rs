//! The audit log in sled: entries by sequence number (`audit`), and each
//! entry's key with the number it was stored under (`audit_keys`), so that
//! a repeat of an action is stored once. Both go in one transaction, and
//! into the same flush as the thread write that brings them.

use std::sync::Mutex;

use ferry_proto::audit::{AuditEntry, AuditQuery, AuditRecord};
use ferry_store::codec::{decode, encode};
use ferry_store::Error;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

pub struct AuditLog {
    entries: sled::Tree,
    keys: sled::Tree,
    /// The next entry's number. Held while entries are stored, so numbers
    /// are given in the order entries become readable: a reader that read
    /// up to `n` never later finds an entry below `n` it had not seen.
    next: Mutex<u64>,
}

impl AuditLog {
    pub fn open(db: &sled::Db) -> Result<Self, Error> {
        let tree = |name: &str| db.open_tree(name).map_err(super::backend);
        let entries = tree("audit")?;
        let next = match entries.last().map_err(super::backend)? {
            Some((key, _)) => seq_of(&key)? + 1,
            None => 1,
        };
        Ok(Self {
            entries,
            keys: tree("audit_keys")?,
            next: Mutex::new(next),
        })
    }

    /// Stores the entries whose keys are new, not yet flushed.
    pub fn insert(&self, entries: &[AuditEntry]) -> sled::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut next = self.next.lock().expect("audit lock");
        let stored = (&self.entries, &self.keys).transaction(|(log, keys)| {
            let mut seq = *next;
            for entry in entries {
                if keys.get(entry.key.as_bytes())?.is_some() {
                    continue;
                }
                let record = AuditRecord {
                    seq,
                    entry: entry.clone(),
                };
                log.insert(&seq.to_be_bytes(), encode(&record))?;
                keys.insert(entry.key.as_bytes(), &seq.to_be_bytes())?;
                seq += 1;
            }
            Ok::<_, ConflictableTransactionError<sled::Error>>(seq)
        });
        match stored {
            Ok(seq) => {
                *next = seq;
                Ok(())
            }
            Err(TransactionError::Abort(e) | TransactionError::Storage(e)) => Err(e),
        }
    }

    pub fn read(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, Error> {
        let mut out = vec![];
        let start = query.after.saturating_add(1).to_be_bytes();
        for item in self.entries.range(start..) {
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
    key.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| Error::Corrupt(format!("an audit key of {} bytes", key.len())))
}
