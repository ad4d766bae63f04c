//! A store that is not there yet: a cluster runtime node started while NATS
//! is unreachable serves at once, and gets its JetStream store when NATS
//! answers. Until then every read and write is [`Error::Unavailable`],
//! which the fronts answer 503 with `Retry-After`.

use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use ferry_proto::api::Event;
use ferry_proto::audit::{AuditEntry, AuditQuery, AuditRecord};
use tokio::sync::watch;

use crate::{CatalogStore, Durability, Durable, Error, Store, Watch, Write};
use ferry_core::credential::StoredToken;
use ferry_core::thread::{CallRecord, ThreadMeta, ThreadState};
use ferry_core::toolsets::StoredToolset;

pub struct Deferred {
    inner: OnceLock<Arc<dyn Store>>,
    toolsets: OnceLock<Arc<dyn CatalogStore>>,
    /// What watches taken before the store is there follow: it never
    /// moves, and ends when the store arrives, so that their readers take
    /// a watch of the real store (a stream that caught up would otherwise
    /// wait on this one for good).
    still: Mutex<Option<watch::Sender<u64>>>,
}

impl Default for Deferred {
    fn default() -> Self {
        Self {
            inner: OnceLock::new(),
            toolsets: OnceLock::new(),
            still: Mutex::new(Some(watch::Sender::new(0))),
        }
    }
}

impl Deferred {
    /// Hands over the real store; later calls go to it. Only the first
    /// counts. Watches taken before end.
    pub fn set<S: Store + CatalogStore>(&self, store: Arc<S>) {
        let _ = self.toolsets.set(store.clone());
        let _ = self.inner.set(store);
        self.still.lock().expect("still lock").take();
    }

    pub fn is_ready(&self) -> bool {
        self.inner.get().is_some()
    }

    fn get(&self) -> Result<&Arc<dyn Store>, Error> {
        self.inner.get().ok_or_else(unreached)
    }

    fn catalog(&self) -> Result<&Arc<dyn CatalogStore>, Error> {
        self.toolsets.get().ok_or_else(unreached)
    }
}

fn unreached() -> Error {
    Error::Unavailable("NATS has not been reached since this node started".into())
}

#[async_trait]
impl Store for Deferred {
    async fn load(&self, group_id: &str, call_ids: &[&str]) -> Result<ThreadState, Error> {
        self.get()?.load(group_id, call_ids).await
    }

    async fn load_optimistic(
        &self,
        group_id: &str,
        call_ids: &[&str],
    ) -> Result<(ThreadState, bool), Error> {
        self.get()?.load_optimistic(group_id, call_ids).await
    }

    fn writable(&self) -> Result<(), Error> {
        self.get()?.writable()
    }

    async fn append(&self, write: Write<'_>, durability: Durability) -> Result<Durable, Error> {
        self.get()?.append(write, durability).await
    }

    /// Nothing is written before the store is there.
    async fn durable(&self, group_id: &str) -> Result<(), Error> {
        match self.inner.get() {
            Some(store) => store.durable(group_id).await,
            None => Ok(()),
        }
    }

    async fn flush(&self) -> Result<(), Error> {
        self.get()?.flush().await
    }

    async fn events_to_tip(
        &self,
        group_id: &str,
        after: u64,
        limit: usize,
        tip: u64,
    ) -> Result<Vec<Event>, Error> {
        self.get()?.events_to_tip(group_id, after, limit, tip).await
    }

    async fn events(&self, group_id: &str, after: u64, limit: usize) -> Result<Vec<Event>, Error> {
        self.get()?.events(group_id, after, limit).await
    }

    /// Before the store is there, a watch that never moves until it ends
    /// with the store's arrival: its reader's next read is refused as
    /// unavailable anyway.
    fn watch(&self, group_id: &str) -> Watch {
        if let Some(store) = self.inner.get() {
            return store.watch(group_id);
        }
        let still = self.still.lock().expect("still lock");
        match &*still {
            Some(still) => Watch::new(still.subscribe(), Box::new(|| {})),
            // The store arrived meanwhile (`set` fills `inner` first).
            None => {
                drop(still);
                self.get()
                    .expect("set before still is taken")
                    .watch(group_id)
            }
        }
    }

    async fn thread(&self, group_id: &str) -> Result<Option<ThreadMeta>, Error> {
        self.get()?.thread(group_id).await
    }

    async fn threads(&self) -> Result<Vec<ThreadMeta>, Error> {
        self.get()?.threads().await
    }

    async fn calls(&self, group_id: &str) -> Result<Vec<CallRecord>, Error> {
        self.get()?.calls(group_id).await
    }

    async fn call(&self, group_id: &str, id: &str) -> Result<Option<CallRecord>, Error> {
        self.get()?.call(group_id, id).await
    }

    async fn open_calls(&self) -> Result<Vec<(String, String)>, Error> {
        self.get()?.open_calls().await
    }

    async fn record_audit(&self, entries: &[AuditEntry]) -> Result<(), Error> {
        self.get()?.record_audit(entries).await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, Error> {
        self.get()?.audit(query).await
    }
}

#[async_trait]
impl CatalogStore for Deferred {
    async fn put_toolset(&self, toolset: &StoredToolset) -> Result<(), Error> {
        self.catalog()?.put_toolset(toolset).await
    }

    async fn delete_toolset(&self, name: &str, version: &semver::Version) -> Result<(), Error> {
        self.catalog()?.delete_toolset(name, version).await
    }

    async fn toolsets(&self) -> Result<Vec<StoredToolset>, Error> {
        self.catalog()?.toolsets().await
    }

    async fn put_token(&self, token: &StoredToken) -> Result<(), Error> {
        self.catalog()?.put_token(token).await
    }

    async fn tokens(&self) -> Result<Vec<StoredToken>, Error> {
        self.catalog()?.tokens().await
    }
}
