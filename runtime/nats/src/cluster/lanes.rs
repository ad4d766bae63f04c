//! Concurrency limits shared by every process, in the JetStream KV bucket
//! `ferry_lanes`: one entry per lane (a toolset version) holding its
//! [`Lane`] record, read, changed by the pure rules of
//! [`ferry_engine::shared_lanes`] and written back only if no other process
//! wrote it in between (the entry's revision), else read again. A limit
//! therefore holds across every node and worker exactly: no more than
//! `limit` calls of a lane hold room at once.
//!
//! A call given room after it waited is handed to dispatch by a message on
//! `ferry.<p>.ready.<g>.<id>` in its thread's partition stream, which the
//! workers' consumer takes beside the commits. Its `Nats-Msg-Id` names the
//! grant of room, so handing one out again (the sweep, after a lost
//! publish) is dropped by the stream within its duplicate window.

use async_nats::jetstream::{self, kv};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;

use ferry_engine::shared_lanes::{CallKey, Entered, Lane, Order, SharedLanes};
use ferry_store as store;
use store::codec;

use super::kv::key_of;
use super::subjects::Layout;

pub const BUCKET: &str = "ferry_lanes";

/// Reads and writes an entry or a leave may go through before it gives up
/// (503 to a writer; a worker takes the call again later).
const ATTEMPTS: usize = 32;

/// A lane's entry: its name (the key is a digest) and its record.
#[derive(Serialize, Deserialize)]
struct Stored {
    lane: String,
    record: Lane,
}

pub struct KvLanes {
    bucket: OnceCell<kv::Store>,
    js: OnceCell<jetstream::Context>,
    layout: Layout,
}

impl KvLanes {
    pub fn new(layout: Layout) -> Self {
        Self {
            bucket: OnceCell::new(),
            js: OnceCell::new(),
            layout,
        }
    }

    /// Binds the bucket, making it when it is not there yet.
    pub async fn attach(
        &self,
        js: &jetstream::Context,
        replicas: usize,
    ) -> Result<(), store::Error> {
        let bucket = super::kv::bucket(js, BUCKET, replicas, std::time::Duration::ZERO)
            .await
            .map_err(unavailable)?;
        let _ = self.bucket.set(bucket);
        let _ = self.js.set(js.clone());
        Ok(())
    }

    fn kv(&self) -> Result<&kv::Store, store::Error> {
        self.bucket
            .get()
            .ok_or_else(|| unavailable("this process is not attached to NATS yet"))
    }

    /// Applies `change` to `lane`'s record until a write of it wins, then
    /// hands out the calls it gave room to.
    async fn change<T>(
        &self,
        lane: &str,
        change: impl Fn(&mut Lane, u64) -> (T, Vec<CallKey>),
    ) -> Result<T, store::Error> {
        let kv = self.kv()?;
        let key = key_of(lane);
        for _ in 0..ATTEMPTS {
            let entry = kv.entry(&key).await.map_err(unavailable)?;
            let (mut record, revision) = match entry {
                Some(e) if e.operation == kv::Operation::Put => (
                    codec::decode::<Stored>(&e.value)
                        .map(|s| s.record)
                        .unwrap_or_default(),
                    Some(e.revision),
                ),
                Some(e) => (Lane::default(), Some(e.revision)),
                None => (Lane::default(), None),
            };
            let before = record.clone();
            let now = now_ms();
            let (answer, promoted) = change(&mut record, now);
            if record == before {
                return Ok(answer);
            }
            let value = codec::encode(&Stored {
                lane: lane.to_owned(),
                record: record.clone(),
            })
            .into();
            if let Err(e) = super::kv::put_if(kv, &key, value, revision).await {
                tracing::debug!(lane, error = %e, "lane changed under this write; reading again");
                continue;
            }
            for key in &promoted {
                let since = record
                    .running
                    .iter()
                    .find(|r| &r.key == key)
                    .map_or(now, |r| r.since_ms);
                if let Err(e) = self.publish_ready(key, since).await {
                    // The sweep hands it out again.
                    tracing::warn!(group_id = key.0, id = key.1, error = %e, "could not hand a call given room to dispatch");
                }
            }
            return Ok(answer);
        }
        Err(store::Error::Conflict(format!(
            "lane {lane} kept changing under this write"
        )))
    }

    async fn publish_ready(&self, (group_id, id): &CallKey, since_ms: u64) -> Result<(), String> {
        let js = self.js.get().ok_or("not attached")?;
        let mut headers = async_nats::HeaderMap::new();
        let grant = ferry_engine::digest::sha256_hex(format!("{group_id}\0{id}\0{since_ms}"), 16);
        headers.insert("Nats-Msg-Id", grant.as_str());
        js.publish_with_headers(self.layout.ready(group_id, id), headers, Vec::new().into())
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

fn now_ms() -> u64 {
    ferry_engine::engine::now().as_millis()
}

fn unavailable(e: impl std::fmt::Display) -> store::Error {
    store::Error::Unavailable(format!("NATS JetStream (concurrency limits): {e}"))
}

#[async_trait]
impl SharedLanes for KvLanes {
    async fn enter(
        &self,
        lane: &str,
        limit: usize,
        key: &CallKey,
        order: Order,
    ) -> Result<Entered, store::Error> {
        self.change(lane, |record, now| {
            record.enter(limit, key, order.clone(), now)
        })
        .await
    }

    async fn leave(&self, lane: &str, limit: usize, key: &CallKey) -> Result<(), store::Error> {
        self.change(lane, |record, now| ((), record.leave(limit, key, now).1))
            .await
    }

    async fn promote(&self, lane: &str, limit: usize) -> Result<(), store::Error> {
        self.change(lane, |record, now| ((), record.promote(limit, now)))
            .await
    }

    async fn hand_out(&self, key: &CallKey, since_ms: u64) -> Result<(), store::Error> {
        self.publish_ready(key, since_ms).await.map_err(unavailable)
    }

    async fn lanes(&self) -> Result<Vec<(String, Lane)>, store::Error> {
        use futures::TryStreamExt;
        let kv = self.kv()?;
        let keys: Vec<String> = match kv.keys().await {
            Ok(keys) => keys.try_collect().await.map_err(unavailable)?,
            Err(e) => return Err(unavailable(e)),
        };
        let mut lanes = vec![];
        for key in keys {
            if let Some(value) = kv.get(&key).await.map_err(unavailable)? {
                if let Ok(stored) = codec::decode::<Stored>(&value) {
                    if !stored.record.is_empty() {
                        lanes.push((stored.lane, stored.record));
                    }
                }
            }
        }
        Ok(lanes)
    }
}
