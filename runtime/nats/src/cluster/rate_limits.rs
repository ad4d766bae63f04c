//! Rate-limit buckets shared by every runtime node, in the JetStream KV
//! bucket `ferry_rate_limits`: a call reads each of its buckets, and
//! writes each back only if no other node wrote it in between (the
//! entry's revision), else reads again. A limit therefore holds across
//! nodes to the call, but for two things: the nodes' clocks (a bucket
//! refills by the clock of the node that takes from it), and a call whose
//! later bucket lost a race after an earlier one was written, which uses
//! that earlier token without being admitted (never more than the limit,
//! at worst a little less).

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use async_trait::async_trait;
use tokio::sync::OnceCell;

use super::kv::key_of;
use ferry_engine::limiter::Buckets;
use ferry_engine::limits::{Bucket, Limit};
use ferry_store as store;
use store::codec;

pub const BUCKET: &str = "ferry_rate_limits";

/// How long an untouched bucket is kept: one idle that long is full again
/// for any limit that refills within a day, the same as one never seen.
const KEEP: Duration = Duration::from_secs(24 * 3600);

/// Reads and writes a call may go through before it is answered 503.
const ATTEMPTS: usize = 16;

#[derive(Default)]
pub struct KvBuckets {
    bucket: OnceCell<kv::Store>,
}

impl KvBuckets {
    /// Binds the bucket, making it when it is not there yet.
    pub async fn attach(
        &self,
        js: &jetstream::Context,
        replicas: usize,
    ) -> Result<(), store::Error> {
        let bucket = super::kv::bucket(js, BUCKET, replicas, KEEP)
            .await
            .map_err(unavailable)?;
        let _ = self.bucket.set(bucket);
        Ok(())
    }
}

fn unavailable(e: impl std::fmt::Display) -> store::Error {
    store::Error::Unavailable(format!("NATS JetStream (rate limits): {e}"))
}

#[async_trait]
impl Buckets for KvBuckets {
    async fn take(
        &self,
        buckets: &[(String, Limit)],
        now: u64,
    ) -> Result<Result<(), Duration>, store::Error> {
        let kv = self
            .bucket
            .get()
            .ok_or_else(|| unavailable("this node is not attached to NATS yet"))?;
        'attempt: for _ in 0..ATTEMPTS {
            let mut read = Vec::with_capacity(buckets.len());
            for (name, limit) in buckets {
                let key = key_of(name);
                let entry = kv.entry(&key).await.map_err(unavailable)?;
                let (state, revision) = match entry {
                    Some(e) if e.operation == kv::Operation::Put => {
                        (codec::decode::<Bucket>(&e.value).ok(), Some(e.revision))
                    }
                    Some(e) => (None, Some(e.revision)),
                    None => (None, None),
                };
                match Bucket::at(state, *limit, now).take(*limit) {
                    Ok(after) => read.push((key, after, revision)),
                    Err(wait) => return Ok(Err(wait)),
                }
            }
            for (key, after, revision) in read {
                let value = codec::encode(&after).into();
                if let Err(e) = super::kv::put_if(kv, &key, value, revision).await {
                    // Another node wrote the bucket since it was read (or
                    // NATS is away: the next read says so).
                    tracing::debug!(error = %e, "rate-limit bucket changed under this call; reading again");
                    continue 'attempt;
                }
            }
            return Ok(Ok(()));
        }
        Err(store::Error::Conflict(
            "rate-limit buckets kept changing under this call".into(),
        ))
    }
}
