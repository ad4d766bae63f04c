//! The storage ports: [`Store`] for threads' logs, metadata and calls,
//! [`CatalogStore`] for registered toolsets. The engine writes through
//! them; `ferry-store-sled` is the embedded adapter, `ferry-nats` the
//! cluster's (JetStream).
//!
//! **Invariant:** only the sled adapter opens sled.

pub mod codec;
pub mod deferred;
pub mod log;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use async_trait::async_trait;
use ferry_proto::api::Event;
use ferry_proto::audit::{AuditEntry, AuditQuery, AuditRecord};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::watch;

use ferry_core::credential::StoredToken;
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
    /// What the audit log records of these events: stored with them (each
    /// once by its key), durable when they are.
    pub audit: &'a [AuditEntry],
}

/// How soon the caller of [`Store::append`] needs the append durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The caller awaits the [`Durable`] it is given.
    Await,
    /// Nobody waits (a `call_dispatched`, a retry's reason): the store
    /// makes the append durable, and shows it to readers, on its own. A
    /// crash before then loses it, which must be harmless.
    Background,
}

/// Resolves once an append is durable and its events are shown to
/// readers; an error means the flush failed and they never are. Dropped
/// before it resolves, it finishes in the background: a caller cut short
/// never leaves a thread's readers behind its write.
pub struct Durable(Option<Finish>);

/// What is left of an append's way to durable and shown.
type Finish = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

impl Durable {
    /// An append that is durable and shown already.
    pub fn ready() -> Self {
        Self(None)
    }

    pub fn new(finish: impl Future<Output = Result<(), Error>> + Send + 'static) -> Self {
        Self(Some(Box::pin(finish)))
    }
}

impl Future for Durable {
    type Output = Result<(), Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(finish) = self.0.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let done = std::task::ready!(finish.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(done)
    }
}

impl Drop for Durable {
    fn drop(&mut self) {
        if let Some(finish) = self.0.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(finish);
            }
        }
    }
}

/// Threads: their logs, state and calls. How a store makes appends
/// durable (group commit, a replicated stream) is its own business: the
/// engine only says whether it waits.
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

    /// Appends events and writes the state they fold into, atomically:
    /// loads see it once this returns, readers once it is durable. The
    /// caller holds the engine's lock on the thread for this call only,
    /// not for the [`Durable`], so that appends of one thread made while
    /// an earlier one is being flushed share its flush.
    async fn append(&self, write: Write<'_>, durability: Durability) -> Result<Durable, Error>;

    /// Returns once everything appended to the thread so far is durable:
    /// before an answer that rests on another request's append.
    async fn durable(&self, group_id: &str) -> Result<(), Error>;

    /// Returns once everything written before the call is durable.
    async fn flush(&self) -> Result<(), Error>;

    /// Whether a write could be taken now, as far as the store can tell
    /// without making one (the cluster's: connected to NATS); why not.
    fn writable(&self) -> Result<(), Error> {
        Ok(())
    }

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

    /// Appends entries to the audit log, each unless an entry with its key
    /// is there already; durable when this returns. (A thread's changes
    /// bring theirs in their [`Write`].)
    async fn record_audit(&self, entries: &[AuditEntry]) -> Result<(), Error>;

    /// The audit log's entries `query` wants, in log order, at most
    /// `query.limit`.
    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, Error>;
}

/// A consumer as Ferry keeps it: what was asked for, and when and by whom.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredConsumer {
    pub spec: ferry_core::consumer::ConsumerSpec,
    pub created_at: ferry_proto::time::Timestamp,
    pub created_by: String,
}

/// An event a consumer gave up on: handed out `deliveries` times without
/// an acknowledgement.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeadLetter {
    pub group_id: String,
    pub seq: u64,
    #[serde(rename = "type")]
    pub kind: String,
    pub deliveries: u32,
    pub at: ferry_proto::time::Timestamp,
}

/// Where one consumer stands in one thread: its delivery (every event
/// through `delivery.done` is acknowledged, dead-lettered or not the
/// consumer's; at most one is out) and the thread's dead letters.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeliveryRecord {
    pub group_id: String,
    pub delivery: ferry_core::consumer::ThreadDelivery,
    pub dead: Vec<DeadLetter>,
    /// The version kept, for compare-and-set: 0 when none is.
    #[serde(skip)]
    pub revision: u64,
}

/// Consumers and where each stands in each thread. Each change is durable
/// when it returns.
#[async_trait]
pub trait DeliveryStore: Send + Sync + 'static {
    /// Keeps `consumer` unless one of its name is kept: that one is
    /// returned, and nothing changes.
    async fn create_consumer(
        &self,
        consumer: &StoredConsumer,
    ) -> Result<Option<StoredConsumer>, Error>;
    /// Removes a consumer with its records.
    async fn delete_consumer(&self, name: &str) -> Result<(), Error>;
    async fn consumers(&self) -> Result<Vec<StoredConsumer>, Error>;
    /// Consumer `name`'s record of each thread it has one of.
    async fn records(&self, name: &str) -> Result<Vec<DeliveryRecord>, Error>;
    /// Consumer `name`'s record of thread `group_id`, if it has one.
    async fn record(&self, name: &str, group_id: &str) -> Result<Option<DeliveryRecord>, Error>;
    /// Writes each record where the one kept is still at its `revision`,
    /// all durable when this returns. Each answer is the record's new
    /// revision, or `None` where another process wrote it first.
    async fn write_records(
        &self,
        name: &str,
        records: &[DeliveryRecord],
    ) -> Result<Vec<Option<u64>>, Error>;
    /// Whether records keep the event out too, so that other processes
    /// see it: where several serve one consumer. Where only one does, what
    /// is out lives in its memory, and only cursors and dead letters are
    /// written.
    fn shares_outs(&self) -> bool {
        false
    }
}

/// What operators register: toolsets, and named API tokens (their records,
/// never their secrets). Each change is durable when it returns.
#[async_trait]
pub trait CatalogStore: Send + Sync + 'static {
    async fn put_toolset(&self, toolset: &StoredToolset) -> Result<(), Error>;
    async fn delete_toolset(&self, name: &str, version: &semver::Version) -> Result<(), Error>;
    async fn toolsets(&self) -> Result<Vec<StoredToolset>, Error>;
    /// Stores a token's record under its id, replacing any (a revocation
    /// is a record with `revoked_at`).
    async fn put_token(&self, token: &StoredToken) -> Result<(), Error>;
    async fn tokens(&self) -> Result<Vec<StoredToken>, Error>;
}
