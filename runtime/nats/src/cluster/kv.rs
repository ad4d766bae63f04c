//! Compare-and-set on a JetStream KV entry, as the shared rate limits and
//! concurrency lanes write theirs.

use async_nats::jetstream::kv;

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
