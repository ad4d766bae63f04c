//! Consumers in sled: their specs (tree `consumers`, by name), each
//! thread's cursor (tree `cursors`: name, thread → seq) and dead letters
//! (tree `dead_letters`: name, thread, seq → the letter, so a letter
//! written twice, by a crash between it and its cursor, is kept once).

use ferry_store::codec::{decode, encode};
use ferry_store::{DeadLetter, Error, StoredConsumer};

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

    pub(crate) fn put(&self, consumer: &StoredConsumer) -> Result<(), Error> {
        self.consumers
            .insert(consumer.spec.name.as_bytes(), encode(consumer))
            .map_err(backend)?;
        Ok(())
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

    pub(crate) fn cursors(&self, name: &str) -> Result<Vec<(String, u64)>, Error> {
        let prefix = of(name);
        let mut out = vec![];
        for entry in self.cursors.scan_prefix(&prefix) {
            let (key, value) = entry.map_err(backend)?;
            let thread = &key[prefix.len()..];
            let group_id = keys::thread_of(thread)
                .and_then(|t| std::str::from_utf8(&t[4..]).ok())
                .ok_or_else(|| Error::Backend("a cursor key is not a thread's".into()))?;
            let seq = value
                .as_ref()
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| Error::Backend("a cursor is not a sequence number".into()))?;
            out.push((group_id.to_owned(), seq));
        }
        Ok(out)
    }

    pub(crate) fn advance(
        &self,
        name: &str,
        cursors: &[(String, u64)],
        dead: &[DeadLetter],
    ) -> Result<(), Error> {
        // Letters before cursors: a crash between them hands the event out
        // again, and its letter, when written again, replaces itself.
        for letter_of in dead {
            let key = letter(name, &letter_of.group_id, letter_of.seq);
            self.dead.insert(key, encode(letter_of)).map_err(backend)?;
        }
        for (group_id, seq) in cursors {
            self.cursors
                .insert(cursor(name, group_id), &seq.to_be_bytes())
                .map_err(backend)?;
        }
        Ok(())
    }

    pub(crate) fn rewind(&self, name: &str, cursors: &[(String, u64)]) -> Result<(), Error> {
        for (group_id, seq) in cursors {
            // The cursor first: a crash before the letters go leaves them
            // listed beside events that are delivered again, nothing lost.
            self.cursors
                .insert(cursor(name, group_id), &seq.to_be_bytes())
                .map_err(backend)?;
            let after = letter(name, group_id, seq.saturating_add(1));
            let end = letter(name, group_id, u64::MAX);
            for key in self.dead.range(after..=end).keys() {
                self.dead.remove(key.map_err(backend)?).map_err(backend)?;
            }
        }
        Ok(())
    }

    pub(crate) fn dead_letters(&self, name: &str, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        let mut letters: Vec<DeadLetter> = self
            .dead
            .scan_prefix(of(name))
            .values()
            .map(|v| decode(&v.map_err(backend)?))
            .collect::<Result<_, _>>()?;
        letters.sort_by_key(|l| l.at);
        letters.truncate(limit);
        Ok(letters)
    }
}
