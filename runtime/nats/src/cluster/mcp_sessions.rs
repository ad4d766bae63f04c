//! MCP sessions (2025 revisions) kept in the JetStream KV bucket
//! `ferry_mcp_sessions`, so that any runtime node serves a session another
//! opened, and a session one node ends is ended on all of them: a
//! round-robin load balancer needs no stickiness.
//!
//! The bucket is a KV stream made by hand rather than with
//! `create_key_value`, for the one setting KV does not offer: at most
//! [`MAX_SESSIONS`] messages with the oldest discarded, so that a flood of
//! `initialize` pushes out the sessions written longest ago (as the
//! in-memory LRU does) instead of refusing new ones. Entries expire
//! [`IDLE`] after their last write; a node rewrites a session it serves at
//! most once a [`REFRESH`], so a session in use stays, one idle a day goes.

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use lru::LruCache;
use tokio::sync::OnceCell;

use ferry_engine::sessions::{new_id, Session, Sessions, Unavailable, IDLE, MAX_SESSIONS};

pub const BUCKET: &str = "ferry_mcp_sessions";

/// How often, at most, a node rewrites a session it serves to keep it from
/// expiring: a write a minute per busy session, and an idle session
/// forgotten between a day and a day and a minute after its last use.
const REFRESH: Duration = Duration::from_secs(60);

/// The bucket, once the node is attached to NATS; until then every
/// session request answers 503.
#[derive(Debug)]
pub struct SharedSessions {
    bucket: OnceCell<kv::Store>,
    /// Session id → when this node last rewrote it.
    refreshed: Mutex<LruCache<String, Instant>>,
}

impl Default for SharedSessions {
    fn default() -> Self {
        Self {
            bucket: OnceCell::new(),
            refreshed: Mutex::new(LruCache::new(
                NonZeroUsize::new(MAX_SESSIONS).expect("not zero"),
            )),
        }
    }
}

impl SharedSessions {
    /// Binds the bucket, making it when it is not there yet.
    pub async fn attach(
        &self,
        js: &jetstream::Context,
        replicas: usize,
    ) -> Result<(), Unavailable> {
        let bucket = match js.get_key_value(BUCKET).await {
            Ok(bucket) => bucket,
            Err(_) => {
                js.get_or_create_stream(stream::Config {
                    name: format!("KV_{BUCKET}"),
                    subjects: vec![format!("$KV.{BUCKET}.>")],
                    max_messages_per_subject: 1,
                    max_messages: MAX_SESSIONS as i64,
                    discard: stream::DiscardPolicy::Old,
                    max_age: IDLE,
                    storage: stream::StorageType::File,
                    num_replicas: replicas.max(1),
                    allow_rollup: true,
                    deny_delete: true,
                    allow_direct: true,
                    ..Default::default()
                })
                .await
                .map_err(unavailable)?;
                js.get_key_value(BUCKET).await.map_err(unavailable)?
            }
        };
        let _ = self.bucket.set(bucket);
        Ok(())
    }

    fn bucket(&self) -> Result<&kv::Store, Unavailable> {
        self.bucket
            .get()
            .ok_or_else(|| Unavailable("this node is not attached to NATS yet".into()))
    }

    /// The session's entry while it is open; `None` for an id no key can
    /// be (never asked of NATS), one never opened, ended or expired.
    async fn live(&self, id: &str) -> Result<Option<(&kv::Store, kv::Entry)>, Unavailable> {
        if !valid_key(id) {
            return Ok(None);
        }
        let bucket = self.bucket()?;
        let entry = bucket.entry(id).await.map_err(unavailable)?;
        Ok(entry
            .filter(|e| e.operation == kv::Operation::Put)
            .map(|e| (bucket, e)))
    }

    /// Whether this node rewrote `id` within the last [`REFRESH`]; marks it
    /// rewritten now when not.
    fn due(&self, id: &str) -> bool {
        let mut refreshed = self.refreshed.lock().unwrap_or_else(|p| p.into_inner());
        match refreshed.get(id) {
            Some(at) if at.elapsed() < REFRESH => false,
            _ => {
                refreshed.put(id.to_owned(), Instant::now());
                true
            }
        }
    }
}

fn unavailable(e: impl std::fmt::Display) -> Unavailable {
    Unavailable(format!("NATS JetStream: {e}"))
}

/// Whether a client's session id can be a key at all; any other is no
/// session (404), never a request to NATS.
fn valid_key(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_=".contains(&b))
}

#[async_trait::async_trait]
impl Sessions for SharedSessions {
    async fn open(&self, version: &str, holder: &str) -> Result<String, Unavailable> {
        let id = new_id();
        let session = Session {
            version: version.to_owned(),
            holder: holder.to_owned(),
        };
        let value = serde_json::to_vec(&session).map_err(unavailable)?;
        self.bucket()?
            .create(&id, Bytes::from(value))
            .await
            .map_err(unavailable)?;
        self.due(&id);
        Ok(id)
    }

    async fn get(&self, id: &str) -> Result<Option<Session>, Unavailable> {
        let Some((bucket, entry)) = self.live(id).await? else {
            return Ok(None);
        };
        let Ok(session) = serde_json::from_slice::<Session>(&entry.value) else {
            return Ok(None);
        };
        if self.due(id) {
            // Against the revision read: a session another node ended
            // meanwhile is not brought back. Losing the race, or NATS, only
            // leaves the refresh to a later request.
            if let Err(e) = bucket.update(id, entry.value, entry.revision).await {
                tracing::debug!(session = id, error = %e, "MCP session not refreshed");
            }
        }
        Ok(Some(session))
    }

    async fn close(&self, id: &str) -> Result<bool, Unavailable> {
        let Some((bucket, _)) = self.live(id).await? else {
            return Ok(false);
        };
        bucket.delete(id).await.map_err(unavailable)?;
        self.refreshed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop(id);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ids_that_can_be_keys_are_looked_up() {
        assert!(valid_key(&new_id()));
        for bad in ["", "a.b", "a b", "a*", "a>", "ä", &"x".repeat(257)] {
            assert!(!valid_key(bad), "{bad:?}");
        }
    }
}
