//! Reads: a call, a thread's metadata, and its events (with long-poll).

use std::time::Duration;

use ferry_proto::api::Event;

use super::{Engine, Error};
use crate::thread::{CallRecord, ThreadMeta};

impl Engine {
    /// Returns what was `read` of the thread once all of it is durable: a
    /// reader must never see a state a crash could take back. Read first,
    /// then wait: a write that lands between a durability check and the
    /// read would otherwise be shown before its flush (the store shows a
    /// write once it is inserted, and a flush started after that covers
    /// it).
    async fn durable_read<T>(&self, group_id: &str, read: T) -> Result<T, Error> {
        self.make_durable(group_id, 0).await?;
        Ok(read)
    }

    pub async fn call(&self, group_id: &str, id: &str) -> Result<CallRecord, Error> {
        self.check_id("group_id", group_id)?;
        let call = self.store.call(group_id, id).await?;
        self.durable_read(group_id, call)
            .await?
            .ok_or_else(|| Error::NotFound(format!("no call {id:?} in thread {group_id:?}")))
    }

    pub async fn thread(&self, group_id: &str) -> Result<ThreadMeta, Error> {
        self.check_id("group_id", group_id)?;
        let thread = self.store.thread(group_id).await?;
        self.durable_read(group_id, thread)
            .await?
            .ok_or_else(|| Error::NotFound(format!("no thread {group_id:?}")))
    }

    /// The most recently active threads, newest first (each as durable).
    pub async fn recent_threads(&self, limit: usize) -> Result<Vec<ThreadMeta>, Error> {
        let mut threads = self.store.threads().await?;
        threads.sort_by(|a, b| b.updated_at.cmp(&a.updated_at));
        threads.truncate(limit);
        let mut pending = false;
        for thread in &threads {
            if !self.store.is_durable(&thread.group_id, 0) {
                self.store.settle(&thread.group_id).await?;
                pending = true;
            }
        }
        if pending {
            self.store.flush().await?;
        }
        Ok(threads)
    }

    /// A thread's calls, oldest first.
    pub async fn calls(&self, group_id: &str) -> Result<Vec<CallRecord>, Error> {
        self.check_id("group_id", group_id)?;
        let calls = self.store.calls(group_id).await?;
        let mut calls = self.durable_read(group_id, calls).await?;
        calls.sort_by_key(|c| c.accepted_seq);
        Ok(calls)
    }

    /// Events after `after`, at most `limit`; when there are none yet, waits
    /// up to `wait` for the next one.
    pub async fn events(
        &self,
        group_id: &str,
        after: u64,
        limit: usize,
        wait: Duration,
    ) -> Result<Vec<Event>, Error> {
        self.check_id("group_id", group_id)?;
        // Watch before reading, so an event landing in between wakes us.
        let mut tip = self.store.watch(group_id);
        let events = self.store.events(group_id, after, limit).await?;
        if !events.is_empty() || wait.is_zero() {
            return Ok(events);
        }
        let wait = wait.min(Duration::from_secs(self.config.max_wait_secs));
        if tokio::time::timeout(wait, tip.wait_for(|seq| *seq > after))
            .await
            .is_err()
        {
            return Ok(vec![]);
        }
        Ok(self.store.events(group_id, after, limit).await?)
    }

    /// Reads the call until `done` holds for it or `wait` passes, re-reading
    /// after every new durable event of its thread; returns the call as last
    /// read. The protocol fronts (MCP, OXP) use it to answer with a result.
    pub async fn wait_for_call(
        &self,
        group_id: &str,
        id: &str,
        wait: Duration,
        done: impl Fn(&CallRecord) -> bool,
    ) -> Result<CallRecord, Error> {
        let mut tip = self.watch(group_id)?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Mark the tip seen before reading, so an event landing between
            // the read and the wait still wakes us.
            tip.borrow_and_update();
            let call = self.call(group_id, id).await?;
            if done(&call) {
                return Ok(call);
            }
            match tokio::time::timeout_at(deadline, tip.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Ok(call),
            }
        }
    }

    /// Waits up to `wait` for a call to be in the thread's log: one a
    /// cluster node journaled is there once a worker applied it. Returns
    /// whether it is.
    pub async fn wait_until_recorded(
        &self,
        group_id: &str,
        id: &str,
        wait: Duration,
    ) -> Result<bool, Error> {
        let mut tip = self.watch(group_id)?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            tip.borrow_and_update();
            match self.call(group_id, id).await {
                Ok(_) => return Ok(true),
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
            match tokio::time::timeout_at(deadline, tip.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Ok(false),
            }
        }
    }

    /// A receiver of the thread's last durable sequence number, for streams.
    pub fn watch(&self, group_id: &str) -> Result<crate::store::Watch, Error> {
        self.check_id("group_id", group_id)?;
        Ok(self.store.watch(group_id))
    }
}
