//! The storage port: threads' logs and metadata, calls, and registered
//! toolsets. The engine owns this trait; `sled` is its embedded adapter (the
//! NATS JetStream adapter is the cluster's, in `ferry-nats`).
//!
//! **Invariant:** only the sled adapter opens sled.

pub mod codec;
pub mod deferred;
pub mod log;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use async_trait::async_trait;
use ferry_proto::api::Event;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use ferry_core::thread::{CallRecord, ThreadMeta, ThreadState};
use ferry_core::toolsets::StoredToolset;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend failed (an insert, a flush, opening a tree).
    #[error("storage failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// An earlier write or flush failed: nothing more goes in until a
    /// restart recovers the store.
    #[error("an earlier write or flush failed; restart Ferry to recover the store")]
    Poisoned,
    /// The data was written in a layout this build does not read.
    #[error("{dir} was written by an older Ferry ({why}); this version cannot read it: start with an empty --data directory")]
    OlderLayout { dir: String, why: String },
    /// The cluster's store (NATS) cannot be reached: try again later.
    #[error("storage is unavailable: {0}")]
    Unavailable(String),
    #[error("stored record is unreadable: {0}")]
    Corrupt(String),
    /// Another writer appended to the thread first; reload and decide again.
    #[error("thread {0:?} changed concurrently")]
    Conflict(String),
    /// The commit is larger than the store accepts (NATS's `max_payload`),
    /// however often it is tried.
    #[error("{0}")]
    TooLarge(String),
}

/// A receiver of a thread's last durable sequence number. Dropping it lets
/// the store forget the thread's entry (readers of threads that are never
/// written again must not grow the store's memory).
pub struct Watch {
    receiver: Option<watch::Receiver<u64>>,
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Watch {
    fn new(receiver: watch::Receiver<u64>, on_drop: Box<dyn FnOnce() + Send + Sync>) -> Self {
        Self {
            receiver: Some(receiver),
            on_drop: Some(on_drop),
        }
    }

    /// A watch of `group_id` whose drop removes the thread's entry from a
    /// store's `tips` once `idle` says nothing else holds it.
    pub fn of_tip<T: Send + 'static>(
        receiver: watch::Receiver<u64>,
        tips: &Arc<Mutex<HashMap<String, T>>>,
        group_id: &str,
        idle: fn(&T) -> bool,
    ) -> Self {
        let (tips, group_id) = (Arc::downgrade(tips), group_id.to_owned());
        Self::new(
            receiver,
            Box::new(move || {
                let Some(tips) = tips.upgrade() else { return };
                let mut tips = tips.lock().expect("tips lock");
                if tips.get(&group_id).is_some_and(idle) {
                    tips.remove(&group_id);
                }
            }),
        )
    }
}

impl std::ops::Deref for Watch {
    type Target = watch::Receiver<u64>;

    fn deref(&self) -> &Self::Target {
        self.receiver.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for Watch {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.receiver.as_mut().expect("present until drop")
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // The receiver first, so the store sees it gone.
        drop(self.receiver.take());
        if let Some(on_drop) = self.on_drop.take() {
            on_drop();
        }
    }
}

/// A batch of changes to one thread, written atomically.
pub struct Write<'a> {
    /// The thread's `last_seq` the changes were decided against; the write
    /// fails with [`Error::Conflict`] if the stored thread moved on.
    pub expected_last_seq: u64,
    pub state: &'a ThreadState,
    pub events: &'a [Event],
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The thread's metadata and the named calls (those that exist), for
    /// a command about to write: the engine calls it under its lock on the
    /// thread, and the sled store caches what it loads on that ground.
    /// (One load runs outside the lock, only with the JetStream store:
    /// `close_thread`'s one-call-at-a-time fallback. That store keeps the
    /// last commit for the writes that follow, each checked against
    /// `last_seq` and the compare-and-set.)
    async fn load(&self, group_id: &str, call_ids: &[&str]) -> Result<ThreadState, Error>;

    /// Like [`Store::load`], but the store may answer from the last commit
    /// of the thread it wrote or read itself, without reading the tip: a
    /// write decided on it is refused (`Conflict`) if the tip moved since,
    /// and the caller must decide again on [`Store::load`] anything that
    /// writes nothing (a refusal, a duplicate), which rests on the tip.
    /// The flag says whether it did answer so (else the state is the tip).
    async fn load_optimistic(
        &self,
        group_id: &str,
        call_ids: &[&str],
    ) -> Result<(ThreadState, bool), Error> {
        Ok((self.load(group_id, call_ids).await?, false))
    }

    /// Appends events and writes the state they fold into, atomically. Not
    /// durable until [`Store::flush`] returns.
    async fn write(&self, write: Write<'_>) -> Result<(), Error>;

    /// Like [`Store::write`], for a command nobody waits on: the store may
    /// hold the commit back for up to [`Store::hold_back`], so that the
    /// thread's next write carries its events in one append. Loads see it
    /// at once; readers see its events once a flush after [`Store::settle`]
    /// made them durable.
    async fn write_held(&self, write: Write<'_>) -> Result<(), Error> {
        self.write(write).await
    }

    /// How long [`Store::write_held`] may hold a commit back; zero when it
    /// writes at once.
    fn hold_back(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Writes the thread's held commit, if any is still held; once it
    /// returns, a [`Store::flush`] makes every held write of the thread
    /// durable.
    async fn settle(&self, _group_id: &str) -> Result<(), Error> {
        Ok(())
    }

    /// Returns once everything written before the call is durable. Calls
    /// made concurrently share one fsync (group commit).
    async fn flush(&self) -> Result<(), Error>;

    /// Whether a write could be taken now, as far as the store can tell
    /// without making one (the cluster's: connected to NATS); why not.
    fn writable(&self) -> Result<(), Error> {
        Ok(())
    }

    /// Marks events up to `seq` of `group_id` durable: readers may see them.
    fn publish(&self, group_id: &str, seq: u64);

    /// Whether the thread's state up to `seq` is durable (no write of it is
    /// still waiting for a flush).
    fn is_durable(&self, group_id: &str, seq: u64) -> bool;

    /// Durable events of the thread with sequence numbers above `after`.
    async fn events(&self, group_id: &str, after: u64, limit: usize) -> Result<Vec<Event>, Error>;

    /// [`Store::events`] for a reader that follows the thread and knows its
    /// tip (above `after`): it may stop once it has read up to `tip`, since
    /// the reader waits for the tip to move before it reads again. (A
    /// cluster's read of the log's end is one more round trip to NATS.)
    async fn events_to_tip(
        &self,
        group_id: &str,
        after: u64,
        limit: usize,
        _tip: u64,
    ) -> Result<Vec<Event>, Error> {
        self.events(group_id, after, limit).await
    }

    /// Watches the thread's last durable sequence number.
    fn watch(&self, group_id: &str) -> Watch;

    async fn thread(&self, group_id: &str) -> Result<Option<ThreadMeta>, Error>;

    /// Every thread's metadata (a scan: for dashboards, not hot paths).
    async fn threads(&self) -> Result<Vec<ThreadMeta>, Error>;

    /// Every call of one thread, by id.
    async fn calls(&self, group_id: &str) -> Result<Vec<CallRecord>, Error>;
    async fn call(&self, group_id: &str, id: &str) -> Result<Option<CallRecord>, Error>;

    /// Every call Ferry still expects something for (queued, dispatched,
    /// awaiting, subscribed, pending approval, or owing a user's choice to
    /// the tool), as `(group_id, id)`: what recovery walks.
    async fn open_calls(&self) -> Result<Vec<(String, String)>, Error>;

    async fn put_toolset(&self, toolset: &StoredToolset) -> Result<(), Error>;
    async fn delete_toolset(&self, name: &str, version: &semver::Version) -> Result<(), Error>;
    async fn toolsets(&self) -> Result<Vec<StoredToolset>, Error>;
}
