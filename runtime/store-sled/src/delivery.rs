//! Consumers in sled: their specs (tree `consumers`, by name), each
//! thread's cursor (tree `cursors`: name, thread → seq) and dead letters
//! (tree `dead_letters`: name, thread, seq → the letter, so a letter
//! written twice, by a crash between it and its cursor, is kept once).

use ferry_core::consumer::ThreadDelivery;
use ferry_store::codec::{decode, encode};
use ferry_store::{DeliveryRecord, Error, StoredConsumer};

use crate::{backend, keys};

pub(crate) struct Deliveries {
    consumers: sled::Tree,
    cursors: sled::Tree,
    dead: sled::Tree,
}

/// `len(name) as u32 BE ++ name`: no consumer's keys prefix another's.
fn of(name: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(4 + name.len() + 32);
    key.extend_from_slice(&(name.len() as u32).to_be_bytes());
    key.extend_from_slice(name.as_bytes());
    key
}

fn cursor(name: &str, group_id: &str) -> Vec<u8> {
    let mut key = of(name);
    key.extend_from_slice(&keys::thread(group_id));
    key
}

fn letter(name: &str, group_id: &str, seq: u64) -> Vec<u8> {
    let mut key = cursor(name, group_id);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

impl Deliveries {
    pub(crate) fn open(db: &sled::Db) -> Result<Self, Error> {
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        Ok(Self {
            consumers: tree("consumers")?,
            cursors: tree("cursors")?,
            dead: tree("dead_letters")?,
        })
    }

    pub(crate) fn create(
        &self,
        consumer: &StoredConsumer,
    ) -> Result<Option<StoredConsumer>, Error> {
        // One process writes: the engine makes consumers one at a time.
        let name = consumer.spec.name.as_bytes();
        if let Some(kept) = self.consumers.get(name).map_err(backend)? {
            return Ok(Some(decode(&kept)?));
        }
        self.consumers
            .insert(name, encode(consumer))
            .map_err(backend)?;
        Ok(None)
    }

    pub(crate) fn delete(&self, name: &str) -> Result<(), Error> {
        // Its cursors and letters first: a crash in between leaves a
        // consumer that starts over, never cursors without a consumer
        // that a new one of the name would inherit.
        for tree in [&self.cursors, &self.dead] {
            for key in tree.scan_prefix(of(name)).keys() {
                tree.remove(key.map_err(backend)?).map_err(backend)?;
            }
        }
        self.consumers.remove(name.as_bytes()).map_err(backend)?;
        Ok(())
    }

    pub(crate) fn all(&self) -> Result<Vec<StoredConsumer>, Error> {
        self.consumers
            .iter()
            .values()
            .map(|v| decode(&v.map_err(backend)?))
            .collect()
    }

    /// Every record of consumer `name`: its cursors, with each thread's
    /// dead letters.
    pub(crate) fn records(&self, name: &str) -> Result<Vec<DeliveryRecord>, Error> {
        let prefix = of(name);
        let mut out = vec![];
        for entry in self.cursors.scan_prefix(&prefix) {
            let (key, value) = entry.map_err(backend)?;
            let group_id = keys::thread_of(&key[prefix.len()..])
                .and_then(|t| std::str::from_utf8(&t[4..]).ok())
                .ok_or_else(|| Error::Backend("a cursor key is not a thread's".into()))?
                .to_owned();
            let done = seq_of(&value)?;
            out.push(self.record_of(name, group_id, done)?);
        }
        Ok(out)
    }

    pub(crate) fn record(
        &self,
        name: &str,
        group_id: &str,
    ) -> Result<Option<DeliveryRecord>, Error> {
        let Some(value) = self.cursors.get(cursor(name, group_id)).map_err(backend)? else {
            return Ok(None);
        };
        self.record_of(name, group_id.to_owned(), seq_of(&value)?)
            .map(Some)
    }

    fn record_of(&self, name: &str, group_id: String, done: u64) -> Result<DeliveryRecord, Error> {
        let dead = self
            .dead
            .scan_prefix(cursor(name, &group_id))
            .values()
            .map(|v| decode(&v.map_err(backend)?))
            .collect::<Result<_, _>>()?;
        Ok(DeliveryRecord {
            delivery: ThreadDelivery { done, out: None },
            group_id,
            dead,
            revision: 1,
        })
    }

    /// Writes each record's cursor and dead letters (what is out stays in
    /// the one process's memory).
    pub(crate) fn write(&self, name: &str, records: &[DeliveryRecord]) -> Result<(), Error> {
        for record in records {
            let group_id = &record.group_id;
            // Letters before the cursor: a crash between them hands the
            // event out again, and its letter, when written again,
            // replaces itself.
            let kept: Vec<u64> = record.dead.iter().map(|l| l.seq).collect();
            for key in self.dead.scan_prefix(cursor(name, group_id)).keys() {
                let key = key.map_err(backend)?;
                let seq = seq_of(&key[key.len() - 8..])?;
                if !kept.contains(&seq) {
                    self.dead.remove(key).map_err(backend)?;
                }
            }
            for letter_of in &record.dead {
                let key = letter(name, group_id, letter_of.seq);
                self.dead.insert(key, encode(letter_of)).map_err(backend)?;
            }
            self.cursors
                .insert(cursor(name, group_id), &record.delivery.done.to_be_bytes())
                .map_err(backend)?;
        }
        Ok(())
    }
}

fn seq_of(bytes: &[u8]) -> Result<u64, Error> {
    bytes
        .try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| Error::Backend("a cursor is not a sequence number".into()))
}
