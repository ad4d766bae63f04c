//! Consumers through the engine: who may make, read, pull from and
//! acknowledge them, and the long-poll of a pull. The delivery itself is
//! [`crate::delivery`]'s.

use std::sync::Arc;
use std::time::Duration;

use super::tokens::require;
use super::{now, Engine, Error};
use crate::consumer::ConsumerSpec;
use crate::delivery::{self, AckReply, ConsumerView, Consumers, Delivered, Live, ReplayFrom};
use crate::identity::{Identity, Reach, Scope};

/// Most events one pull hands out, and most pairs one acknowledgement
/// names.
pub const MAX_BATCH: usize = 1000;
/// Longest a pull waits for an event.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

impl From<delivery::Error> for Error {
    fn from(e: delivery::Error) -> Self {
        match e {
            delivery::Error::Unknown(_) => Error::NotFound(e.to_string()),
            delivery::Error::Conflict(_) => Error::Conflict(e.to_string()),
            delivery::Error::Store(e) => Error::Store(e),
        }
    }
}

fn now_ms() -> u64 {
    now().as_millis()
}

impl Engine {
    /// Keeps consumers: their specs and records in the store `consumers`
    /// was loaded from.
    pub fn with_consumers(self, consumers: Arc<Consumers>) -> Self {
        self.set_consumers(consumers);
        self
    }

    /// [`Engine::with_consumers`] once the engine is shared: a cluster node
    /// serves before NATS answers, and loads its consumers once it does.
    /// The first consumers set stay.
    pub fn set_consumers(&self, consumers: Arc<Consumers>) {
        let _ = self.consumers.set(consumers);
    }

    /// The consumers kept, once loaded.
    pub fn consumers(&self) -> Option<&Arc<Consumers>> {
        self.consumers.get()
    }

    fn deliveries(&self) -> Result<&Consumers, Error> {
        self.consumers.get().map(|c| &**c).ok_or_else(|| {
            Error::Store(crate::store::Error::Unavailable(
                "consumers are not loaded yet: the store is not reachable".into(),
            ))
        })
    }

    /// A consumer `by` may pull from and read: one whose threads are all
    /// within its reach (an agent's own threads are not a prefix: it pulls
    /// nothing).
    fn reachable(&self, by: &Identity, name: &str) -> Result<Arc<Live>, Error> {
        require(by, Scope::Read)?;
        let live = self.deliveries()?.get(name)?;
        let within = match by.reach() {
            Reach::Everywhere => true,
            Reach::Prefix(prefix) => live
                .spec()
                .filter
                .group_prefix
                .as_deref()
                .is_some_and(|p| p.starts_with(prefix.as_str())),
            Reach::OwnThreads => false,
        };
        if !within {
            return Err(Error::Forbidden(format!(
                "consumer {name:?} takes threads beyond {}'s reach",
                by.name()
            )));
        }
        Ok(live)
    }

    /// [`Engine::reachable`], for pulling: a push consumer is delivered by
    /// Ferry, and refuses pullers.
    fn pulled(&self, by: &Identity, name: &str) -> Result<Arc<Live>, Error> {
        let live = self.reachable(by, name)?;
        if live.spec().push.is_some() {
            return Err(Error::InvalidRequest(format!(
                "consumer {name:?} pushes its events to its URL: it is not pulled from or acknowledged by hand"
            )));
        }
        Ok(live)
    }

    /// `POST /v1/consumers`: `true` when it was made, `false` when the
    /// same one was there.
    pub async fn create_consumer(
        self: &Arc<Self>,
        by: &Identity,
        spec: ConsumerSpec,
    ) -> Result<(ConsumerView, bool), Error> {
        require(by, Scope::Admin)?;
        let consumers = self.deliveries()?;
        let spec = spec
            .checked()
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        let (live, made) = consumers
            .create(spec, by.name(), now(), &*self.store)
            .await?;
        if made {
            tracing::info!(consumer = live.spec().name, by = by.name(), "consumer made");
        }
        if live.spec().push.is_some() {
            self.push_to(&live.spec().name);
        }
        let view = consumers.view(&*self.store, &live, now(), false).await?;
        Ok((view, made))
    }

    pub async fn list_consumers(&self, by: &Identity) -> Result<Vec<ConsumerView>, Error> {
        require(by, Scope::Read)?;
        let consumers = self.deliveries()?;
        let mut views = vec![];
        for live in consumers.all() {
            if self.reachable(by, &live.spec().name).is_ok() {
                views.push(consumers.view(&*self.store, &live, now(), false).await?);
            }
        }
        Ok(views)
    }

    pub async fn show_consumer(&self, by: &Identity, name: &str) -> Result<ConsumerView, Error> {
        let live = self.reachable(by, name)?;
        Ok(self
            .deliveries()?
            .view(&*self.store, &live, now(), true)
            .await?)
    }

    pub async fn delete_consumer(&self, by: &Identity, name: &str) -> Result<(), Error> {
        require(by, Scope::Admin)?;
        self.deliveries()?.delete(name).await?;
        tracing::info!(consumer = name, by = by.name(), "consumer deleted");
        Ok(())
    }

    /// `GET /v1/consumers/{name}/next`: at most `max` events, waiting up to
    /// `wait` for one.
    pub async fn consumer_next(
        &self,
        by: &Identity,
        name: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivered>, Error> {
        if !(1..=MAX_BATCH).contains(&max) {
            return Err(Error::InvalidRequest(format!(
                "max must be 1 to {MAX_BATCH}"
            )));
        }
        if wait > MAX_WAIT {
            return Err(Error::InvalidRequest(format!(
                "wait must be at most {} seconds",
                MAX_WAIT.as_secs()
            )));
        }
        let live = self.pulled(by, name)?;
        let consumers = self.deliveries()?;
        let deadline = tokio::time::Instant::now() + wait;
        let mut stopping = self.stopping.subscribe();
        loop {
            let woken = live.woken.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let taken = consumers.take(&*self.store, &live, max, now_ms()).await?;
            if !taken.is_empty() || tokio::time::Instant::now() >= deadline || *stopping.borrow() {
                return Ok(taken);
            }
            if consumers.get(name).is_err() {
                return Err(delivery::Error::Unknown(name.to_owned()).into());
            }
            // An event out comes back at its deadline: wake for it too.
            let back = live.next_overdue_ms().await.map(|at| {
                let wait = Duration::from_millis(at.saturating_sub(now_ms()));
                tokio::time::Instant::now() + wait
            });
            let until = back.map_or(deadline, |b| b.min(deadline));
            tokio::select! {
                () = &mut woken => {}
                () = tokio::time::sleep_until(until) => {}
                _ = stopping.changed() => {}
            }
        }
    }

    /// `POST /v1/consumers/{name}/replay`: how many threads moved back.
    pub async fn consumer_replay(
        &self,
        by: &Identity,
        name: &str,
        from: ReplayFrom,
        group_id: Option<&str>,
    ) -> Result<usize, Error> {
        require(by, Scope::Admin)?;
        if from == ReplayFrom::Seq(0) {
            return Err(Error::InvalidRequest(
                "from.seq must be at least 1 (a thread's first event)".into(),
            ));
        }
        let consumers = self.deliveries()?;
        let live = consumers.get(name)?;
        if let Some(g) = group_id {
            if self.store.thread(g).await?.is_none() {
                return Err(Error::NotFound(format!("no thread {g:?}")));
            }
        }
        let moved = consumers
            .replay(&*self.store, &live, from, group_id)
            .await?;
        tracing::info!(
            consumer = name,
            by = by.name(),
            ?from,
            group_id,
            moved,
            "consumer replayed"
        );
        Ok(moved)
    }

    /// `POST /v1/consumers/{name}/ack`.
    pub async fn consumer_ack(
        &self,
        by: &Identity,
        name: &str,
        acks: &[(String, u64)],
    ) -> Result<AckReply, Error> {
        if !(1..=MAX_BATCH).contains(&acks.len()) {
            return Err(Error::InvalidRequest(format!(
                "acks must name 1 to {MAX_BATCH} events"
            )));
        }
        let live = self.pulled(by, name)?;
        Ok(self.deliveries()?.ack(&live, acks).await?)
    }
}
