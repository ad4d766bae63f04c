//! What every process's KV buckets share: binding a bucket (made on the
//! first start), a key for any text, and compare-and-set on an entry, as
//! the shared rate limits and concurrency lanes write theirs.

use std::time::Duration;

use async_nats::jetstream::{self, kv};

/// Binds bucket `name`, making it on the first start: one value per key,
/// on file, each kept `max_age` after its last write (zero: for good).
pub(crate) async fn bucket(
    js: &jetstream::Context,
    name: &str,
    replicas: usize,
    max_age: Duration,
) -> Result<kv::Store, String> {
    match js.get_key_value(name).await {
        Ok(bucket) => Ok(bucket),
        Err(_) => js
            .create_key_value(kv::Config {
                bucket: name.into(),
                history: 1,
                max_age,
                storage: jetstream::stream::StorageType::File,
                num_replicas: replicas.max(1),
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string()),
    }
}

/// A KV key for `name`, which may hold any text a key may not.
pub(crate) fn key_of(name: &str) -> String {
    ferry_engine::digest::sha256_hex(name, 16)
}

/// Writes `value` under `key` if the entry is still at `revision` (`None`:
/// if there is none yet). `Err` when another process wrote it in between
/// (or NATS is away), with the reason.
pub(crate) async fn put_if(
    kv: &kv::Store,
    key: &str,
    value: bytes::Bytes,
    revision: Option<u64>,
) -> Result<(), String> {
    match revision {
        Some(revision) => kv
            .update(key, value, revision)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        None => kv
            .create(key, value)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
    }
}
