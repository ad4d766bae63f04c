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
        if wait.is_zero() {
            return Ok(self.store.events(group_id, after, limit).await?);
        }
        // Watch before reading, so an event landing in between wakes us.
        let mut tip = self.store.watch(group_id);
        let wait = wait.min(Duration::from_secs(self.config.max_wait_secs));
        let read = || self.store.events(group_id, after, limit);
        match tokio::time::timeout(wait, next_page(after, &mut tip, read)).await {
            Ok(Ok(Some(events))) => Ok(events),
            Ok(Ok(None)) | Err(_) => Ok(vec![]),
            Ok(Err(e)) => Err(e.into()),
        }
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

    /// A receiver of the thread's last durable sequence number, for streams.
    pub fn watch(&self, group_id: &str) -> Result<crate::store::Watch, Error> {
        self.check_id("group_id", group_id)?;
        Ok(self.store.watch(group_id))
    }
}

/// The first pause before reading again when a read lags the tip, and the
/// longest.
const BEHIND_FIRST: Duration = Duration::from_millis(1);
const BEHIND_MOST: Duration = Duration::from_millis(100);

/// The next non-empty page after `cursor`: `read` it, or wait on `tip` for
/// more. A read that finds nothing though the tip is past the cursor comes
/// from a replica that has not yet stored what its leader announced (a
/// cluster on replicated streams): it is tried again after a growing pause
/// rather than at once, which would spin until the replica caught up.
/// `None` when the tip can no longer move.
pub(crate) async fn next_page<F, Fut, E>(
    cursor: u64,
    tip: &mut tokio::sync::watch::Receiver<u64>,
    mut read: F,
) -> Result<Option<Vec<Event>>, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Event>, E>>,
{
    let mut behind = BEHIND_FIRST;
    loop {
        let events = read().await?;
        if !events.is_empty() {
            return Ok(Some(events));
        }
        if *tip.borrow() > cursor {
            tokio::time::sleep(behind).await;
            behind = (behind * 2).min(BEHIND_MOST);
        } else if tip.wait_for(|seq| *seq > cursor).await.is_err() {
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::api::EventKind;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::time::Instant;

    fn event(seq: u64) -> Event {
        Event {
            seq,
            group_id: "g".into(),
            id: None,
            at: String::new(),
            kind: EventKind::ThreadClosed {},
        }
    }

    /// A replica three reads behind its tip: the stream pauses between
    /// those reads (1 + 2 + 4 ms) instead of spinning, then returns the page.
    #[tokio::test(start_paused = true)]
    async fn a_read_behind_the_tip_is_retried_after_a_pause() {
        let (_tx, mut tip) = tokio::sync::watch::channel(5u64);
        let reads = AtomicU32::new(0);
        let started = Instant::now();
        let read = || {
            let n = reads.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, ()>(if n < 3 { vec![] } else { vec![event(5)] }) }
        };
        let page = next_page(4, &mut tip, read).await.unwrap().unwrap();
        assert_eq!(page, vec![event(5)]);
        assert_eq!(reads.load(Ordering::SeqCst), 4);
        assert!(started.elapsed() >= Duration::from_millis(7));
    }

    /// Caught up with the tip: the next read waits for it to move.
    #[tokio::test(start_paused = true)]
    async fn at_the_tip_the_stream_waits_for_it_to_move() {
        let (tx, mut tip) = tokio::sync::watch::channel(4u64);
        let reads = AtomicU32::new(0);
        let read = || {
            let n = reads.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, ()>(if n == 0 { vec![] } else { vec![event(5)] }) }
        };
        let mover = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            tx.send(5).unwrap();
            tx
        });
        let page = next_page(4, &mut tip, read).await.unwrap().unwrap();
        assert_eq!(page, vec![event(5)]);
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        drop(mover.await.unwrap());
        assert_eq!(
            next_page(5, &mut tip, || async { Ok::<_, ()>(vec![]) }).await,
            Ok(None)
        );
    }
}
