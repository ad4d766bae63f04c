//! Where the 2025 revisions' sessions are kept. `ferry serve` keeps them in
//! memory ([`InMemory`]); a cluster keeps them in JetStream KV
//! (`cluster::mcp_sessions`), so that any runtime node serves any session
//! and a load balancer needs no stickiness.

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lru::LruCache;

/// A session idle this long is forgotten (clients rarely send `DELETE`);
/// its client gets 404 and initializes again.
pub const IDLE: Duration = Duration::from_secs(24 * 3600);

/// Sessions kept at most. Past it, opening one forgets the least recently
/// used, whose client gets 404 and initializes again as the spec tells it
/// to: a flood of `initialize` costs bounded space and constant time.
pub const MAX_SESSIONS: usize = 10_000;

/// Sessions could not be read or written (a cluster node without NATS).
#[derive(Debug, thiserror::Error)]
#[error("MCP sessions are unavailable: {0}")]
pub struct Unavailable(pub String);

/// An open session: its revision, and the identity that opened it, the
/// only one it serves.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Session {
    pub version: String,
    pub holder: String,
}

/// The sessions port: open, look up (marking the session used), close.
#[async_trait::async_trait]
pub trait Sessions: std::fmt::Debug + Send + Sync + 'static {
    /// Opens a session under `version` for identity `holder`; returns its
    /// id.
    async fn open(&self, version: &str, holder: &str) -> Result<String, Unavailable>;

    /// The session, marking it used; `None` for one unknown, closed,
    /// pushed out or idle too long.
    async fn get(&self, id: &str) -> Result<Option<Session>, Unavailable>;

    /// Ends the session; `false` when there was none to end.
    async fn close(&self, id: &str) -> Result<bool, Unavailable>;
}

/// A new session id: `mcp-` and 32 hex digits, which is a valid thread
/// name and a valid JetStream KV key alike.
pub fn new_id() -> String {
    format!("mcp-{}", uuid::Uuid::new_v4().simple())
}

/// One process's sessions, in memory: after a restart a client's session
/// id is answered 404 and the client initializes again (the thread a
/// session used stays readable under its id).
#[derive(Debug)]
pub struct InMemory {
    /// Session id → (session, last use), least recently used first out.
    live: Mutex<LruCache<String, (Session, Instant)>>,
    idle: Duration,
}

impl Default for InMemory {
    fn default() -> Self {
        Self::with_limits(MAX_SESSIONS, IDLE)
    }
}

impl InMemory {
    fn with_limits(max: usize, idle: Duration) -> Self {
        let max = NonZeroUsize::new(max.max(1)).expect("not zero");
        Self {
            live: Mutex::new(LruCache::new(max)),
            idle,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<String, (Session, Instant)>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait::async_trait]
impl Sessions for InMemory {
    async fn open(&self, version: &str, holder: &str) -> Result<String, Unavailable> {
        let id = new_id();
        let session = Session {
            version: version.to_owned(),
            holder: holder.to_owned(),
        };
        self.lock().put(id.clone(), (session, Instant::now()));
        Ok(id)
    }

    async fn get(&self, id: &str) -> Result<Option<Session>, Unavailable> {
        let mut live = self.lock();
        let Some((session, used)) = live.get_mut(id) else {
            return Ok(None);
        };
        if used.elapsed() >= self.idle {
            live.pop(id);
            return Ok(None);
        }
        *used = Instant::now();
        Ok(Some(session.clone()))
    }

    async fn close(&self, id: &str) -> Result<bool, Unavailable> {
        Ok(self.lock().pop(id).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sessions_past_the_limit_push_out_the_least_recently_used() {
        let sessions = InMemory::with_limits(2, IDLE);
        let a = sessions.open("2025-11-25", "mcp").await.unwrap();
        let b = sessions.open("2025-06-18", "mcp").await.unwrap();
        let version = |id: String| {
            let sessions = &sessions;
            async move { sessions.get(&id).await.unwrap().map(|s| s.version) }
        };
        assert_eq!(version(a.clone()).await.as_deref(), Some("2025-11-25"));
        let c = sessions.open("2025-03-26", "mcp").await.unwrap();
        assert_eq!(version(b).await, None, "b was used least recently");
        assert_eq!(version(a).await.as_deref(), Some("2025-11-25"));
        assert_eq!(version(c.clone()).await.as_deref(), Some("2025-03-26"));
        assert!(sessions.close(&c).await.unwrap());
        assert!(!sessions.close(&c).await.unwrap());
        assert_eq!(version(c).await, None);
    }

    #[tokio::test]
    async fn an_idle_session_is_forgotten() {
        let sessions = InMemory::with_limits(2, Duration::ZERO);
        let a = sessions.open("2025-11-25", "mcp").await.unwrap();
        assert_eq!(sessions.get(&a).await.unwrap(), None);
        assert!(
            !sessions.close(&a).await.unwrap(),
            "forgotten, not only refused"
        );
    }
}
