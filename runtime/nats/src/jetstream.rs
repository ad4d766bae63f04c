//! The storage port on NATS JetStream, for the cluster: every runtime node
//! and worker reads and writes the same threads.
//!
//! Layout (partition `p` of `--partitions`, stream `FERRY_THREADS_<p>`,
//! see `cluster::subjects`):
//! - `ferry.<p>.log.<g>.*` — the thread's log: one message per command, a
//!   [`Commit`] holding the command's events, the thread's metadata after
//!   them, and the calls the command loaded (after them). A commit that
//!   hands calls to dispatch goes to `ferry.<p>.log.<g>.d`, where workers take
//!   it from (the commit *is* the work: there is no second write that a
//!   crash could separate from it), any other to `ferry.<p>.log.<g>.c`.
//!   Appends are compare-and-set on the last sequence of the whole filter
//!   (`Nats-Expected-Last-Subject-Sequence` with
//!   `Nats-Expected-Last-Subject-Sequence-Subject`), so the log is one total
//!   order however many processes write.
//! - `ferry.<p>.call.<g>.<id>` — each call's copy, written when its thread moves
//!   on (the rule is in `store::log`, shared with the sled adapter). Copies
//!   are compare-and-set, so a slow copier cannot put an older version
//!   back.
//!
//! Toolsets live in the KV bucket `ferry_toolsets`, named API tokens'
//! records in `ferry_tokens`.
//!
//! An acknowledged publish is durable: the server runs with
//! `sync_interval: always` (or R3 streams; see `ops/nats/`), so `flush` has
//! nothing left to do. A write is not even sent while the client is not
//! connected: the client would queue it and send it after a reconnect,
//! long after the caller was told 503, and a request refused that way must
//! change nothing.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::{self, context::PublishErrorKind, kv, stream};
use async_nats::HeaderMap;
use async_trait::async_trait;
use bytes::Bytes;
use ferry_proto::api::Event;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::audit::{self, AuditStream};
use crate::cluster::subjects::{self, Layout};
use crate::store::log::Commit;
use crate::store::{codec, CatalogStore, Durability, Durable, Error, Store, Watch, Write};
use crate::thread::{CallRecord, ThreadMeta, ThreadState};
use crate::toolsets::StoredToolset;
use ferry_core::credential::StoredToken;
use ferry_proto::audit::{AuditEntry, AuditQuery, AuditRecord};

pub const TOOLSETS_BUCKET: &str = "ferry_toolsets";
pub const TOKENS_BUCKET: &str = "ferry_tokens";

/// The header carrying a commit's last event sequence number, so watchers
/// learn a thread's tip without decoding the commit.
const LAST_SEQ_HEADER: &str = "Ferry-Last-Seq";

/// What a store following commits must learn from its NATS client's event
/// callback: messages a subscription dropped because its reader fell
/// behind (`SlowConsumer`). Core NATS does not send them again, so a
/// republished commit among them would never wake its readers.
#[derive(Debug, Default)]
pub struct ClientEvents {
    slow_consumer_drops: AtomicU64,
}

impl ClientEvents {
    /// Records one event the client reported.
    pub fn record(&self, event: &async_nats::Event) {
        if let async_nats::Event::SlowConsumer(_) = event {
            self.slow_consumer_drops.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many times a subscription of the client dropped messages.
    pub fn slow_consumer_drops(&self) -> u64 {
        self.slow_consumer_drops.load(Ordering::Relaxed)
    }
}

/// A call's record as of the thread's event `seq`.
#[derive(Debug, Serialize, Deserialize)]
struct CallCopy {
    seq: u64,
    call: CallRecord,
}

/// The last commit of a thread and where it sits in the stream.
struct Last {
    stream_seq: u64,
    commit: Commit,
}

pub struct JetStreamStore {
    js: jetstream::Context,
    layout: Layout,
    toolsets: kv::Store,
    tokens: kv::Store,
    audit: AuditStream,
    tips: Arc<Tips>,
    /// Watched threads whose tip must be read again from the stream (a
    /// read failed, or the republish may have been missed): read within
    /// [`CATCH_UP_CHECK`].
    tips_unread: Arc<Unread>,
    /// Per thread, commits already seen: event sequence → stream sequence
    /// of the commit ending there. Lets readers start mid-log.
    positions: Mutex<HashMap<String, std::collections::BTreeMap<u64, u64>>>,
    /// The last commit this process read or appended, per thread: the
    /// `write` that follows a load needs that commit (its stream sequence,
    /// its calls) and need not fetch it again, and `load_optimistic`
    /// decides on it without reading the tip (the compare-and-set refuses
    /// a stale one). A republish of a later commit forgets it.
    loaded: Mutex<HashMap<String, Arc<Last>>>,
    catalog_changed: watch::Sender<u64>,
    /// The thread of each commit any process appended, as it is stored
    /// (followed stores only): consumers look at the thread again.
    committed: tokio::sync::broadcast::Sender<String>,
    /// Reads of a subject's last message, as commands and watchers need
    /// them.
    last: LastReads,
    copier: Copier,
    /// Calls being copied in the background after the commit that settled
    /// them, by `(group_id, id)`, with that commit's last event sequence.
    copying: Mutex<HashMap<(String, String), (u64, Copying)>>,
}

/// Commits' threads a slow receiver of [`JetStreamStore::committed`] may
/// be behind by before it misses some.
const COMMITS_HELD: usize = 4096;

/// Attempts at writing a call's copy against copies racing it, before the
/// command gives up like a lost commit race and is decided again.
const COPY_ATTEMPTS: u32 = 8;

fn backend(e: impl std::fmt::Display) -> Error {
    Error::Unavailable(e.to_string())
}

/// Refuses at once while the client is not connected: a request sent now
/// would wait out its timeout (a write would even be sent after the
/// reconnect, long after its caller was answered).
fn connected(js: &jetstream::Context) -> Result<(), Error> {
    match js.client().connection_state() {
        async_nats::connection::State::Connected => Ok(()),
        _ => Err(Error::Unavailable("not connected to NATS".into())),
    }
}

impl JetStreamStore {
    /// Creates (or binds to) the streams of `layout` and the bucket. With
    /// `follow`, it also
    /// follows every process's commits so that local watchers (long-polls,
    /// streams) wake for them: what a runtime node needs and a worker, which
    /// serves no reader, must not pay for (every commit would reach every
    /// worker). `events` are those of `client`'s event callback.
    pub async fn connect(
        client: async_nats::Client,
        events: Arc<ClientEvents>,
        replicas: usize,
        layout: Layout,
        follow: bool,
    ) -> Result<Arc<Self>, Error> {
        let js = jetstream::new(client.clone());
        let mut streams = vec![];
        for p in 0..layout.partitions() {
            let (source, destination) = layout.republished(p);
            let mut stream = js
                .get_or_create_stream(stream::Config {
                    name: layout.stream(p),
                    subjects: layout.stream_subjects(p),
                    storage: stream::StorageType::File,
                    num_replicas: replicas,
                    allow_direct: true,
                    // Logs are kept forever; a call's copies need only the
                    // last, but keeping them costs only disk.
                    max_messages_per_subject: -1,
                    republish: Some(stream::Republish {
                        source,
                        destination,
                        headers_only: true,
                    }),
                    ..Default::default()
                })
                .await
                .map_err(backend)?;
            // A stream made by an older Ferry lacks subjects added since.
            let wanted = layout.stream_subjects(p);
            if stream.cached_info().config.subjects != wanted {
                let config = stream::Config {
                    subjects: wanted,
                    ..stream.cached_info().config.clone()
                };
                js.update_stream(config).await.map_err(backend)?;
                stream = js.get_stream(layout.stream(p)).await.map_err(backend)?;
            }
            streams.push(stream);
        }
        let last = LastReads {
            js: js.clone(),
            layout,
            from_leader: streams[0].cached_info().config.num_replicas > 1,
            streams: Arc::new(streams),
        };
        let toolsets = catalog_bucket(&js, TOOLSETS_BUCKET, replicas).await?;
        let tokens = catalog_bucket(&js, TOKENS_BUCKET, replicas).await?;
        let audit = AuditStream::connect(&js, replicas).await?;
        let copier = Copier {
            js: js.clone(),
            layout,
            last: last.clone(),
        };
        let store = Arc::new(Self {
            js,
            layout,
            toolsets,
            tokens,
            audit,
            tips: Arc::default(),
            tips_unread: Arc::default(),
            positions: Mutex::default(),
            loaded: Mutex::default(),
            catalog_changed: watch::Sender::new(0),
            committed: tokio::sync::broadcast::Sender::new(COMMITS_HELD),
            copier,
            last,
            copying: Mutex::default(),
        });
        if follow {
            store.follow_commits(client, events).await?;
        }
        store.follow_catalog(&store.toolsets).await?;
        store.follow_catalog(&store.tokens).await?;
        Ok(store)
    }

    /// Whether a read of a watched thread's tip failed and waits to be
    /// tried again (within [`CATCH_UP_CHECK`]): what a health report, or
    /// a test, may look at.
    pub fn tips_unread(&self) -> bool {
        !self.tips_unread.lock().expect("unread lock").is_empty()
    }

    /// Bumped whenever any process changes a toolset: the engine reloads
    /// its registry.
    pub fn catalog_changed(&self) -> watch::Receiver<u64> {
        self.catalog_changed.subscribe()
    }

    /// The thread of every commit stored from now on, by any process (a
    /// store made with `follow`): a receiver that falls more than
    /// [`COMMITS_HELD`] behind, or a client that reconnected, missed some.
    pub fn committed(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.committed.subscribe()
    }

    async fn follow_commits(
        self: &Arc<Self>,
        client: async_nats::Client,
        events: Arc<ClientEvents>,
    ) -> Result<(), Error> {
        self.catch_up_when_missed(&client, events);
        // The stream's republish of what it stored: a commit that lost its
        // compare-and-set (or was never stored) must not move a reader.
        let mut commits = client
            .subscribe(self.layout.all_logged())
            .await
            .map_err(backend)?;
        let (tips, store) = (Arc::downgrade(&self.tips), Arc::downgrade(self));
        tokio::spawn(async move {
            while let Some(message) = commits.next().await {
                let Some(tips) = tips.upgrade() else { return };
                let seq = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(LAST_SEQ_HEADER))
                    .and_then(|v| v.as_str().parse::<u64>().ok());
                let group_id = subjects::group_of(&message.subject);
                if let (Some(seq), Some(group_id)) = (seq, group_id) {
                    advance(&tips, &group_id, seq);
                    if let Some(store) = store.upgrade() {
                        store.forget_before(&group_id, seq);
                        // None listening is no failure.
                        let _ = store.committed.send(group_id);
                    }
                }
            }
        });
        Ok(())
    }

    /// Core NATS delivers the republished commits at most once: those
    /// published while this client was reconnecting never arrive, nor do
    /// those a slow subscription dropped, and a stream waiting on its
    /// thread's tip would wait for the thread's next commit. After each
    /// reconnect or drop, every watched thread's tip is read again from
    /// the stream (from its leader when replicated: a follower may not
    /// have the missed commit yet), as is a tip whose read failed; all
    /// within [`CATCH_UP_CHECK`], after the client has subscribed again.
    /// Reads that fail stay to be read: a few failures in a row end the
    /// round (NATS is likely gone again) until the next check.
    fn catch_up_when_missed(
        self: &Arc<Self>,
        client: &async_nats::Client,
        events: Arc<ClientEvents>,
    ) {
        let statistics = client.statistics();
        let missed = move || {
            (
                statistics.connects.load(Ordering::Relaxed),
                events.slow_consumer_drops(),
            )
        };
        let (last, tips) = (self.last.clone(), Arc::downgrade(&self.tips));
        let unread = self.tips_unread.clone();
        tokio::spawn(async move {
            let mut seen = missed();
            let mut every = tokio::time::interval(CATCH_UP_CHECK);
            // A round longer than the period is not followed by another
            // at once.
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(watched) = tips.upgrade() else {
                    return;
                };
                let now = missed();
                if now != seen {
                    if now.1 != seen.1 {
                        warn!(
                            drops = now.1 - seen.1,
                            "a NATS subscription fell behind and dropped messages; reading watched tips again"
                        );
                    }
                    seen = now;
                    let all: Vec<String> =
                        watched.lock().expect("tips lock").keys().cloned().collect();
                    unread.lock().expect("unread lock").extend(all);
                }
                let pending = std::mem::take(&mut *unread.lock().expect("unread lock"));
                drop(watched);
                if !pending.is_empty() {
                    debug!(threads = pending.len(), "reading watched tips again");
                    let left = read_tips(&last, &tips, pending).await;
                    unread.lock().expect("unread lock").extend(left);
                }
            }
        });
    }

    async fn follow_catalog(self: &Arc<Self>, bucket: &kv::Store) -> Result<(), Error> {
        let mut changes = bucket.watch_all().await.map_err(backend)?;
        let store = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(change) = changes.next().await {
                let Some(store) = store.upgrade() else { return };
                if change.is_ok() {
                    store.catalog_changed.send_modify(|n| *n += 1);
                }
            }
        });
        Ok(())
    }

    /// Forgets the thread's last known commit when another process
    /// appended after it: the next command reads the tip at once instead
    /// of losing a compare-and-set first.
    fn forget_before(&self, group_id: &str, seq: u64) {
        let mut loaded = self.loaded.lock().expect("loaded lock");
        if loaded
            .get(group_id)
            .is_some_and(|last| last.commit.meta.last_seq < seq)
        {
            loaded.remove(group_id);
        }
    }

    /// The thread's state as of commit `last` (none: a new thread), with
    /// the calls named; `last` is kept for the write that follows.
    async fn state_at(
        &self,
        group_id: &str,
        call_ids: &[&str],
        last: Option<Arc<Last>>,
    ) -> Result<ThreadState, Error> {
        let mut state = ThreadState::new(group_id);
        if let Some(last) = &last {
            state.meta = last.commit.meta.clone();
        }
        for id in call_ids {
            if let Some(call) = self.current_call(group_id, id, last.as_deref()).await? {
                state.calls.insert((*id).to_owned(), call);
            }
        }
        let mut loaded = self.loaded.lock().expect("loaded lock");
        if loaded.len() > 10_000 {
            loaded.clear();
        }
        match last {
            Some(last) => loaded.insert(group_id.to_owned(), last),
            None => loaded.remove(group_id),
        };
        Ok(state)
    }

    async fn last(&self, group_id: &str) -> Result<Option<Last>, Error> {
        let Some(message) = self.last.on(group_id, self.layout.log(group_id)).await? else {
            return Ok(None);
        };
        let commit: Commit = codec::decode(&message.payload)?;
        self.remember(group_id, commit.meta.last_seq, message.sequence);
        Ok(Some(Last {
            stream_seq: message.sequence,
            commit,
        }))
    }

    fn remember(&self, group_id: &str, last_seq: u64, stream_seq: u64) {
        let mut positions = self.positions.lock().expect("positions lock");
        let known = positions.entry(group_id.to_owned()).or_default();
        known.insert(last_seq, stream_seq);
        // A bounded memory: keep the newest positions only.
        while known.len() > 64 {
            known.pop_first();
        }
        if positions.len() > 10_000 {
            positions.clear();
        }
    }

    /// The copied record of a call and the stream sequence of the copy.
    async fn copy(&self, group_id: &str, id: &str) -> Result<Option<(u64, CallCopy)>, Error> {
        self.copier.read(group_id, id).await
    }

    /// The call as of the thread's last commit.
    async fn current_call(
        &self,
        group_id: &str,
        id: &str,
        last: Option<&Last>,
    ) -> Result<Option<CallRecord>, Error> {
        if let Some(call) = last.and_then(|l| l.commit.call(id)) {
            return Ok(Some(call.clone()));
        }
        Ok(self.copy(group_id, id).await?.map(|(_, c)| c.call))
    }

    /// Copies a commit's calls to their own subjects, except those in
    /// `carried` (the next commit holds them) and those already copied as
    /// of this commit, in the background after it ([`Self::copy_settled`]).
    async fn copy_calls(
        &self,
        group_id: &str,
        commit: &Commit,
        carried: &HashMap<String, CallRecord>,
    ) -> Result<(), Error> {
        for call in commit.moved_on(carried) {
            let seq = commit.meta.last_seq;
            if let Some(copying) = self.copied_since(group_id, &call.id, seq) {
                if copying.await.is_ok() {
                    continue;
                }
            }
            self.copier.write(group_id, call, seq).await?;
        }
        Ok(())
    }

    /// After commit `seq`, copies its calls that are settled (nothing more
    /// is owed for them, so they rarely change again) in the background:
    /// the thread's next command, which usually moves on from them, then
    /// need not wait for their copies (a fsync each). Its writer awaits a
    /// copy still under way, and writes one that failed itself.
    fn copy_settled(&self, group_id: &str, calls: &HashMap<String, CallRecord>, seq: u64) {
        let mut copying = self.copying.lock().expect("copying lock");
        if copying.len() > MAX_COPYING {
            copying.retain(|_, (_, copy)| copy.peek().is_none());
        }
        for call in calls.values().filter(|c| !c.is_unsettled()) {
            let (copier, group_id, call) = (self.copier.clone(), group_id.to_owned(), call.clone());
            let key = (group_id.clone(), call.id.clone());
            let copy = async move {
                copier
                    .write(&group_id, &call, seq)
                    .await
                    .map_err(|e| e.to_string())
            }
            .boxed()
            .shared();
            tokio::spawn(copy.clone());
            copying.insert(key, (seq, copy));
        }
    }

    /// The background copy of the call as of commit `seq`, if one was
    /// started.
    fn copied_since(&self, group_id: &str, id: &str, seq: u64) -> Option<Copying> {
        let key = (group_id.to_owned(), id.to_owned());
        let mut copying = self.copying.lock().expect("copying lock");
        match copying.remove(&key) {
            Some((copied, copy)) if copied == seq => Some(copy),
            _ => None,
        }
    }

    async fn publish(
        &self,
        subject: String,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<u64, Error> {
        publish(&self.js, subject, headers, body).await
    }

    /// Where to start reading a thread's log to find events after `after`.
    fn start_after(&self, group_id: &str, after: u64) -> u64 {
        let positions = self.positions.lock().expect("positions lock");
        positions
            .get(group_id)
            .and_then(|known| known.range(..=after).next_back())
            .map_or(0, |(_, stream_seq)| *stream_seq)
    }

    /// The subjects of partition `p`'s stream that `filter` matches.
    async fn subjects_under(&self, p: usize, filter: String) -> Result<Vec<String>, Error> {
        connected(&self.js)?;
        let stream = self.last.streams[p].clone();
        let mut subjects = stream.info_with_subjects(filter).await.map_err(backend)?;
        let mut out = vec![];
        while let Some(entry) = subjects.next().await {
            out.push(entry.map_err(backend)?.0);
        }
        Ok(out)
    }
}

/// Appends `body` to `subject`, as JetStream acknowledges it.
async fn publish(
    js: &jetstream::Context,
    subject: String,
    headers: HeaderMap,
    body: Bytes,
) -> Result<u64, Error> {
    connected(js)?;
    let ack = js
        .publish_with_headers(subject.clone(), headers, body)
        .await
        .map_err(|e| match e.kind() {
            // Never accepted, however often tried: not a NATS outage.
            PublishErrorKind::MaxPayloadExceeded => {
                Error::TooLarge(format!("a commit larger than NATS accepts: {e}"))
            }
            _ => backend(e),
        })?;
    match ack.await {
        Ok(ack) => Ok(ack.sequence),
        Err(e) if lost_race(&e) => Err(Error::Conflict(subject)),
        Err(e) => Err(backend(e)),
    }
}

/// The largest commit (encoded) a store keeps after appending it, for the
/// thread's next command: most commits are under a kilobyte, and one
/// holding a large result is read again rather than kept (10 000 threads'
/// commits at most: 160 MiB at worst).
const KEPT_COMMIT_BYTES: usize = 16 * 1024;

/// A background copy of a call: shared by the task that drives it and the
/// writer that awaits it.
type Copying = futures::future::Shared<futures::future::BoxFuture<'static, Result<(), String>>>;

/// Background copies kept track of at most; past it, finished ones go.
const MAX_COPYING: usize = 10_000;

/// Writes and reads calls' copies (`ferry.<p>.call.<g>.<id>`).
#[derive(Clone)]
struct Copier {
    js: jetstream::Context,
    layout: Layout,
    last: LastReads,
}

impl Copier {
    async fn read(&self, group_id: &str, id: &str) -> Result<Option<(u64, CallCopy)>, Error> {
        match self
            .last
            .on(group_id, self.layout.call(group_id, id))
            .await?
        {
            Some(message) => Ok(Some((message.sequence, codec::decode(&message.payload)?))),
            None => Ok(None),
        }
    }

    /// Writes the call's copy as of the thread's event `seq`, unless one at
    /// least as new is there. Most calls are copied once, so the first
    /// attempt expects no copy yet (no read); a conflict reads the copy
    /// there and tries again against it, unless it is as new as ours.
    async fn write(&self, group_id: &str, call: &CallRecord, seq: u64) -> Result<(), Error> {
        let subject = self.layout.call(group_id, &call.id);
        let body: Bytes = codec::encode(&CallCopy {
            seq,
            call: call.clone(),
        })
        .into();
        let mut expected = 0;
        for attempt in 1.. {
            let mut headers = HeaderMap::new();
            headers.insert(
                "Nats-Expected-Last-Subject-Sequence",
                expected.to_string().as_str(),
            );
            match publish(&self.js, subject.clone(), headers, body.clone()).await {
                Ok(_) => break,
                // Copies racing without end: give up like a lost commit
                // race, and let the command be decided again.
                Err(e @ Error::Conflict(_)) if attempt >= COPY_ATTEMPTS => return Err(e),
                Err(Error::Conflict(_)) => match self.read(group_id, &call.id).await? {
                    Some((_, c)) if c.seq >= seq => break,
                    Some((stream_seq, _)) => expected = stream_seq,
                    None => expected = 0,
                },
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Reads of the last message on a subject of a thread.
#[derive(Clone)]
struct LastReads {
    js: jetstream::Context,
    layout: Layout,
    /// Each partition's stream.
    streams: Arc<Vec<stream::Stream>>,
    /// With replicas, reads go to the stream's leader: a direct get may be
    /// answered by a follower that has not yet applied an acknowledged
    /// commit, and a refusal decided on it (an unknown call, say) would be
    /// final, as would a watcher's tip read short of a commit whose
    /// republish it missed. One replica answers both ways alike, and
    /// direct gets are cheaper.
    from_leader: bool,
}

impl LastReads {
    /// The stream thread `group_id` lives in.
    fn of(&self, group_id: &str) -> &stream::Stream {
        &self.streams[self.layout.partition(group_id)]
    }

    /// As up to date as the stream's leader.
    async fn on(&self, group_id: &str, subject: String) -> Result<Option<StreamMessage>, Error> {
        connected(&self.js)?;
        if self.from_leader {
            let stream = self.of(group_id);
            return match stream.get_last_raw_message_by_subject(&subject).await {
                Ok(message) => Ok(Some(message)),
                Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
                Err(e) => Err(backend(e)),
            };
        }
        self.direct(group_id, subject).await
    }

    /// From any replica.
    async fn direct(
        &self,
        group_id: &str,
        subject: String,
    ) -> Result<Option<StreamMessage>, Error> {
        connected(&self.js)?;
        match self.of(group_id).direct_get_last_for_subject(subject).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(backend(e)),
        }
    }

    /// The thread's last commit, as up to date as the leader.
    async fn tip(&self, group_id: &str) -> Result<Option<StreamMessage>, Error> {
        self.on(group_id, self.layout.log(group_id)).await
    }

    /// The thread's last commit, from any replica.
    async fn tip_direct(&self, group_id: &str) -> Result<Option<StreamMessage>, Error> {
        self.direct(group_id, self.layout.log(group_id)).await
    }
}

fn is_not_found(e: &stream::DirectGetError) -> bool {
    matches!(e.kind(), stream::DirectGetErrorKind::NotFound)
}

/// Whether a publish lost its compare-and-set. A stream's leader in a
/// cluster refuses a commit to a subject whose last commit is still in
/// flight with a code of its own (10164), which async-nats leaves as
/// `PublishErrorKind::Other`.
fn lost_race(e: &jetstream::context::PublishError) -> bool {
    use std::error::Error as _;
    e.kind() == PublishErrorKind::WrongLastSequence
        || e.source()
            .and_then(|s| s.downcast_ref::<jetstream::Error>())
            .is_some_and(|e| {
                e.error_code() == jetstream::ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
            })
}

/// How often a node looks whether its NATS client reconnected, dropped
/// messages, or failed to read a watched tip.
const CATCH_UP_CHECK: Duration = Duration::from_secs(1);

/// Failed reads in a row that end a round of [`read_tips`].
const FAILURES_IN_A_ROW: usize = 3;

type Tips = Mutex<HashMap<String, watch::Sender<u64>>>;
type Unread = Mutex<HashSet<String>>;

/// Reads the tips of `threads` that are still watched; returns those left
/// unread.
async fn read_tips(
    last: &LastReads,
    tips: &std::sync::Weak<Tips>,
    threads: HashSet<String>,
) -> Vec<String> {
    let mut threads = threads.into_iter();
    let mut failures = 0;
    let mut left = vec![];
    for group_id in threads.by_ref() {
        let Some(watched) = tips.upgrade() else {
            return vec![];
        };
        if !watched.lock().expect("tips lock").contains_key(&group_id) {
            continue;
        }
        drop(watched);
        if catch_up(last.tip(&group_id), tips, &group_id).await {
            failures = 0;
            continue;
        }
        left.push(group_id);
        failures += 1;
        if failures == FAILURES_IN_A_ROW {
            break;
        }
    }
    left.extend(threads);
    left
}

/// Moves the thread's tip to its last commit as `read` finds it. False if
/// the stream could not be read (a thread without commits is read: its
/// tip stays 0).
async fn catch_up(
    read: impl Future<Output = Result<Option<StreamMessage>, Error>>,
    tips: &std::sync::Weak<Tips>,
    group_id: &str,
) -> bool {
    let message = match read.await {
        Ok(Some(message)) => message,
        Ok(None) => return true,
        Err(e) => {
            debug!(group_id, error = %e, "reading a watched tip failed");
            return false;
        }
    };
    let seq = message
        .headers
        .get(LAST_SEQ_HEADER)
        .and_then(|v| v.as_str().parse::<u64>().ok());
    if let (Some(seq), Some(tips)) = (seq, tips.upgrade()) {
        advance(&tips, group_id, seq);
    }
    true
}

fn advance(tips: &Tips, group_id: &str, seq: u64) {
    let tips = tips.lock().expect("tips lock");
    if let Some(tip) = tips.get(group_id) {
        tip.send_if_modified(|tip| {
            let newer = seq > *tip;
            if newer {
                *tip = seq;
            }
            newer
        });
    }
}

#[async_trait]
impl Store for JetStreamStore {
    async fn load(&self, group_id: &str, call_ids: &[&str]) -> Result<ThreadState, Error> {
        let last = self.last(group_id).await?.map(Arc::new);
        self.state_at(group_id, call_ids, last).await
    }

    /// From the commit this process wrote or read last for the thread,
    /// when it has one: the write's compare-and-set refuses a decision on
    /// it if another process appended since.
    async fn load_optimistic(
        &self,
        group_id: &str,
        call_ids: &[&str],
    ) -> Result<(ThreadState, bool), Error> {
        let known = self
            .loaded
            .lock()
            .expect("loaded lock")
            .get(group_id)
            .cloned();
        match known {
            Some(last) => Ok((self.state_at(group_id, call_ids, Some(last)).await?, true)),
            None => Ok((self.load(group_id, call_ids).await?, false)),
        }
    }

    /// An acknowledged publish is durable: the [`Durable`] is ready.
    async fn append(&self, write: Write<'_>, _: Durability) -> Result<Durable, Error> {
        let group_id = write.state.meta.group_id.as_str();
        let cached = self.loaded.lock().expect("loaded lock").remove(group_id);
        // The commit the state was decided against, unless this process did
        // not load it (then fetch it); the compare-and-set below catches any
        // commit appended since.
        let last = match cached {
            Some(last) if last.commit.meta.last_seq == write.expected_last_seq => Some(last),
            _ => self.last(group_id).await?.map(Arc::new),
        };
        let (expected_stream_seq, last_seq) = last
            .as_ref()
            .map_or((0, 0), |l| (l.stream_seq, l.commit.meta.last_seq));
        if last_seq != write.expected_last_seq {
            return Err(Error::Conflict(group_id.to_owned()));
        }
        if let Some(last) = &last {
            // Keep the promise readers rely on: only the last commit's calls
            // may lack their copies.
            self.copy_calls(group_id, &last.commit, &write.state.calls)
                .await?;
        }
        let commit = Commit::of(&write);
        let body = codec::encode(&commit);
        let mut headers = HeaderMap::new();
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            expected_stream_seq.to_string().as_str(),
        );
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence-Subject",
            self.layout.log(group_id).as_str(),
        );
        headers.insert(LAST_SEQ_HEADER, commit.meta.last_seq.to_string().as_str());
        let subject = self
            .layout
            .commit(group_id, commit.dispatches().next().is_some());
        let size = body.len();
        let stream_seq = self.publish(subject, headers, body.into()).await?;
        // After the commit is stored, never for one that lost its race;
        // the request is answered once they are stored too.
        let audited = self.audit.send(write.audit).await?;
        self.copy_settled(group_id, &write.state.calls, commit.meta.last_seq);
        let last_seq = commit.meta.last_seq;
        self.remember(group_id, last_seq, stream_seq);
        if size <= KEPT_COMMIT_BYTES {
            let mut loaded = self.loaded.lock().expect("loaded lock");
            if loaded.len() > 10_000 {
                loaded.clear();
            }
            loaded.insert(group_id.to_owned(), Arc::new(Last { stream_seq, commit }));
        }
        debug!(group_id, last_seq, "commit appended");
        advance(&self.tips, group_id, last_seq);
        Ok(if audited.is_empty() {
            Durable::ready()
        } else {
            Durable::new(audit::confirm(audited))
        })
    }

    async fn durable(&self, _group_id: &str) -> Result<(), Error> {
        Ok(())
    }

    async fn flush(&self) -> Result<(), Error> {
        Ok(())
    }

    fn writable(&self) -> Result<(), Error> {
        connected(&self.js)
    }

    async fn events(&self, group_id: &str, after: u64, limit: usize) -> Result<Vec<Event>, Error> {
        self.events_to_tip(group_id, after, limit, 0).await
    }

    /// Reads commit after commit; without a `tip` above `after`, until the
    /// log's end (one more read, that finds nothing), else until the
    /// commit that reaches `tip`. A commit past it whose republish was
    /// lost is read once the tip moves, or within a second of the loss
    /// (`catch_up_when_missed`).
    async fn events_to_tip(
        &self,
        group_id: &str,
        after: u64,
        limit: usize,
        tip: u64,
    ) -> Result<Vec<Event>, Error> {
        connected(&self.js)?;
        let subject = self.layout.log(group_id);
        let stream = self.last.of(group_id);
        let mut from = self.start_after(group_id, after);
        let mut out = vec![];
        while out.len() < limit {
            let message = match stream
                .direct_get_next_for_subject(subject.clone(), Some(from + 1))
                .await
            {
                Ok(message) => message,
                Err(e) if is_not_found(&e) => break,
                Err(e) => return Err(backend(e)),
            };
            from = message.sequence;
            let commit: Commit = codec::decode(&message.payload)?;
            self.remember(group_id, commit.meta.last_seq, message.sequence);
            let reached = tip > after && commit.meta.last_seq >= tip;
            out.extend(commit.events.into_iter().filter(|e| e.seq > after));
            if reached {
                break;
            }
        }
        out.truncate(limit);
        Ok(out)
    }

    fn watch(&self, group_id: &str) -> Watch {
        let receiver = {
            let mut tips = self.tips.lock().expect("tips lock");
            tips.entry(group_id.to_owned())
                .or_insert_with(|| watch::Sender::new(0))
                .subscribe()
        };
        // The tip as stored now; commits after it arrive by subscription.
        // A direct get, which any replica answers: one per long poll or
        // stream, and a reader reads the log itself before it waits.
        let (last, tips) = (self.last.clone(), Arc::downgrade(&self.tips));
        let (thread, unread) = (group_id.to_owned(), self.tips_unread.clone());
        tokio::spawn(async move {
            if !catch_up(last.tip_direct(&thread), &tips, &thread).await {
                unread.lock().expect("unread lock").insert(thread);
            }
        });
        Watch::of_tip(receiver, &self.tips, group_id, |t| t.receiver_count() == 0)
    }

    async fn thread(&self, group_id: &str) -> Result<Option<ThreadMeta>, Error> {
        Ok(self.last(group_id).await?.map(|l| l.commit.meta))
    }

    async fn threads(&self) -> Result<Vec<ThreadMeta>, Error> {
        let mut out = vec![];
        let mut seen = HashSet::new();
        let mut all = vec![];
        for p in 0..self.layout.partitions() {
            all.extend(self.subjects_under(p, self.layout.logs(p)).await?);
        }
        for subject in all {
            let Some(group_id) = subjects::group_of(&subject) else {
                continue;
            };
            if seen.insert(group_id.clone()) {
                if let Some(meta) = self.thread(&group_id).await? {
                    out.push(meta);
                }
            }
        }
        Ok(out)
    }

    async fn calls(&self, group_id: &str) -> Result<Vec<CallRecord>, Error> {
        let last = self.last(group_id).await?;
        let mut out: HashMap<String, CallRecord> = HashMap::new();
        let p = self.layout.partition(group_id);
        for subject in self.subjects_under(p, self.layout.calls(group_id)).await? {
            let Some(id) = subjects::call_id_of(&subject) else {
                continue;
            };
            if let Some(call) = self.current_call(group_id, &id, last.as_ref()).await? {
                out.insert(id, call);
            }
        }
        // Calls created by the last commit may not have copies yet.
        for call in last.iter().flat_map(|l| &l.commit.calls) {
            out.insert(call.id.clone(), call.clone());
        }
        Ok(out.into_values().collect())
    }

    async fn call(&self, group_id: &str, id: &str) -> Result<Option<CallRecord>, Error> {
        let last = self.last(group_id).await?;
        self.current_call(group_id, id, last.as_ref()).await
    }

    /// Each thread's unsettled calls, from its last commit.
    async fn record_audit(&self, entries: &[AuditEntry]) -> Result<(), Error> {
        connected(&self.js)?;
        self.audit.record(entries).await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, Error> {
        connected(&self.js)?;
        self.audit.read(query).await
    }

    async fn open_calls(&self) -> Result<Vec<(String, String)>, Error> {
        let mut out = vec![];
        for meta in self.threads().await? {
            out.extend(
                meta.unsettled
                    .into_iter()
                    .map(|id| (meta.group_id.clone(), id)),
            );
        }
        Ok(out)
    }
}

#[async_trait]
impl CatalogStore for JetStreamStore {
    async fn put_toolset(&self, toolset: &StoredToolset) -> Result<(), Error> {
        let key = subjects::token(&format!("{}@{}", toolset.name, toolset.version));
        let value = codec::encode(toolset);
        self.toolsets
            .put(key, value.into())
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn delete_toolset(&self, name: &str, version: &semver::Version) -> Result<(), Error> {
        let key = subjects::token(&format!("{name}@{version}"));
        self.toolsets.purge(key).await.map_err(backend)?;
        Ok(())
    }

    async fn toolsets(&self) -> Result<Vec<StoredToolset>, Error> {
        every_value(&self.toolsets).await
    }

    async fn put_token(&self, token: &StoredToken) -> Result<(), Error> {
        let value = codec::encode(token);
        self.tokens
            .put(subjects::token(&token.id), value.into())
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn tokens(&self) -> Result<Vec<StoredToken>, Error> {
        every_value(&self.tokens).await
    }
}

/// Binds a catalog bucket, creating it on the first start: one value per
/// key, on file.
async fn catalog_bucket(
    js: &jetstream::Context,
    bucket: &str,
    replicas: usize,
) -> Result<kv::Store, Error> {
    crate::cluster::kv::bucket(js, bucket, replicas, std::time::Duration::ZERO)
        .await
        .map_err(backend)
}

/// Every value of a catalog bucket, decoded.
async fn every_value<T: serde::de::DeserializeOwned>(bucket: &kv::Store) -> Result<Vec<T>, Error> {
    let mut keys = bucket.keys().await.map_err(backend)?;
    let mut out = vec![];
    while let Some(key) = keys.next().await {
        let key = key.map_err(backend)?;
        if let Some(value) = bucket.get(key).await.map_err(backend)? {
            out.push(codec::decode(&value)?);
        }
    }
    Ok(out)
}
