//! Reads: a call, a thread's metadata, and its events (with long-poll).

use std::time::Duration;

use ferry_proto::api::Event;

use super::{Engine, Error};
use crate::identity::{Identity, Reach};
use crate::thread::{CallRecord, ThreadMeta};

impl Engine {
    /// Returns what was `read` of the thread once all of it is durable: a
    /// reader must never see a state a crash could take back. Read first,
    /// then wait: a write that lands between a durability check and the
    /// read would otherwise be shown before its flush (the store shows a
    /// write once it is inserted, and a flush started after that covers
    /// it).
    async fn durable_read<T>(&self, group_id: &str, read: T) -> Result<T, Error> {
        self.store.durable(group_id).await?;
        Ok(read)
    }

    pub async fn call(&self, group_id: &str, id: &str) -> Result<CallRecord, Error> {
        self.check_id("group_id", group_id)?;
        self.acks_before_read(group_id).await?;
        let call = self.store.call(group_id, id).await?;
        self.durable_read(group_id, call)
            .await?
            .ok_or_else(|| Error::NotFound(format!("no call {id:?} in thread {group_id:?}")))
    }

    /// Whether `by` may read and act in thread `group_id`: one that does not
    /// exist yet has nothing to show, and would be `by`'s to create.
    pub async fn may_act_in(&self, by: &Identity, group_id: &str) -> Result<bool, Error> {
        if *by.reach() == Reach::Everywhere {
            return Ok(true);
        }
        if !by.may_reach(group_id) {
            return Ok(false);
        }
        let thread = self.store.thread(group_id).await?;
        Ok(thread.is_none_or(|meta| by.may_act_in(group_id, &meta)))
    }

    pub async fn thread(&self, group_id: &str) -> Result<ThreadMeta, Error> {
        self.check_id("group_id", group_id)?;
        self.acks_before_read(group_id).await?;
        let thread = self.store.thread(group_id).await?;
        self.durable_read(group_id, thread)
            .await?
            .ok_or_else(|| Error::NotFound(format!("no thread {group_id:?}")))
    }

    /// The most recently active threads, newest first (each as durable).
    /// Only threads `by` may act in.
    pub async fn recent_threads_of(
        &self,
        by: &Identity,
        limit: usize,
    ) -> Result<Vec<ThreadMeta>, Error> {
        let mut threads = self.store.threads().await?;
        threads.retain(|meta| by.may_act_in(&meta.group_id, meta));
        threads.sort_by_key(|meta| std::cmp::Reverse(meta.updated_at));
        threads.truncate(limit);
        // Concurrently: one group commit covers the threads that need one.
        let durable = threads.iter().map(|t| self.store.durable(&t.group_id));
        futures::future::try_join_all(durable).await?;
        Ok(threads)
    }

    /// A thread's calls, oldest first.
    pub async fn calls(&self, group_id: &str) -> Result<Vec<CallRecord>, Error> {
        self.check_id("group_id", group_id)?;
        self.acks_before_read(group_id).await?;
        let calls = self.store.calls(group_id).await?;
        let mut calls = self.durable_read(group_id, calls).await?;
        calls.sort_by_key(|c| c.accepted_seq);
        Ok(calls)
    }

    /// [`Engine::events`] without a wait, for a reader following the
    /// thread whose tip is `tip` ([`crate::store::Store::events_to_tip`]).
    pub async fn events_to_tip(
        &self,
        group_id: &str,
        after: u64,
        limit: usize,
        tip: u64,
    ) -> Result<Vec<Event>, Error> {
        self.check_id("group_id", group_id)?;
        Ok(self
            .store
            .events_to_tip(group_id, after, limit, tip)
            .await?)
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
        // A stopping process waits for nothing new.
        if wait.is_zero() || self.readers_stopped() {
            return Ok(self.store.events(group_id, after, limit).await?);
        }
        // Watch before reading, so an event landing in between wakes us.
        let mut tip = self.store.watch(group_id);
        let wait = wait.min(Duration::from_secs(self.config.max_wait_secs));
        let seen = (*tip).clone();
        let read = || {
            self.store
                .events_to_tip(group_id, after, limit, *seen.borrow())
        };
        let page = next_page(after, &mut tip, false, limit, read);
        // A stopping process answers what there is: nothing yet.
        let page = tokio::select! {
            biased;
            page = tokio::time::timeout(wait, page) => page,
            () = self.readers_stop() => return Ok(vec![]),
        };
        match page {
            Ok(Ok(Some(page))) => Ok(page.events),
            Ok(Ok(None)) | Err(_) => Ok(vec![]),
            Ok(Err(e)) => Err(e.into()),
        }
    }

    /// Reads the call until `done` holds for it or `wait` passes (or the
    /// process stops: [`Engine::stop_readers`]), re-reading after every new
    /// durable event of its thread; returns the call as last read. The
    /// protocol fronts (MCP, OXP) use it to answer with a result.
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
            let changed = tokio::select! {
                biased;
                changed = tokio::time::timeout_at(deadline, tip.changed()) => changed,
                () = self.readers_stop() => return Ok(call),
            };
            match changed {
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

/// A page of a thread's events, as [`next_page`] read it.
#[derive(Debug, PartialEq)]
pub struct Page {
    pub events: Vec<Event>,
    /// The read found the end of the log, at or past the tip known when it
    /// read: nothing newer is worth reading until the tip moves past it.
    pub at_tip: bool,
}

/// The next non-empty page after `cursor`, of at most `limit` events:
/// `read` it, or wait on `tip` for more. A reader whose last page was
/// `at_tip` waits for the tip to move before reading: reading first would
/// only find nothing (in a cluster, a wasted round trip to NATS per page).
/// Every page still reads to the end of the log, not only to the tip: a
/// cluster's tip moves on a republish that core NATS delivers at most
/// once, so a commit whose republish was lost is still read with the
/// next. A read that finds nothing though the tip is past the cursor
/// comes from a replica that has not yet stored what its leader announced
/// (a cluster on replicated streams): it is tried again after a growing
/// pause rather than at once, which would spin until the replica caught
/// up. `None` when the tip can no longer move.
pub async fn next_page<F, Fut, E>(
    cursor: u64,
    tip: &mut tokio::sync::watch::Receiver<u64>,
    at_tip: bool,
    limit: usize,
    mut read: F,
) -> Result<Option<Page>, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Event>, E>>,
{
    if at_tip && *tip.borrow() <= cursor && tip.wait_for(|seq| *seq > cursor).await.is_err() {
        return Ok(None);
    }
    let mut behind = BEHIND_FIRST;
    loop {
        let seen = *tip.borrow();
        let events = read().await?;
        if let Some(last) = events.last() {
            // Short of `limit`: the read found the log's end. Short of the
            // tip too: a replica behind, or more to come; read on.
            let at_tip = events.len() < limit && last.seq >= seen;
            return Ok(Some(Page { events, at_tip }));
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
            at: ferry_proto::time::Timestamp::UNIX_EPOCH,
            idempotency_key: None,
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
        let page = next_page(4, &mut tip, false, 10, read)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(page.events, vec![event(5)]);
        assert!(page.at_tip);
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
        let page = next_page(4, &mut tip, false, 10, read)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(page.events, vec![event(5)]);
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        drop(mover.await.unwrap());
        assert_eq!(
            next_page(5, &mut tip, false, 10, || async { Ok::<_, ()>(vec![]) }).await,
            Ok(None)
        );
    }

    /// A stream whose last page reached the tip reads nothing until the tip
    /// moves, then reads once; a page that ends the log at or past the tip
    /// is at the tip again.
    #[tokio::test(start_paused = true)]
    async fn at_the_tip_a_stream_waits_before_reading() {
        let (tx, mut tip) = tokio::sync::watch::channel(5u64);
        let reads = AtomicU32::new(0);
        let read = || {
            reads.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, ()>(vec![event(6), event(7)]) }
        };
        let mover = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            tx.send(6).unwrap();
            tx
        });
        let started = Instant::now();
        let page = next_page(5, &mut tip, true, 10, read)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), 1, "one read");
        assert!(
            started.elapsed() >= Duration::from_secs(30),
            "after the tip moved"
        );
        // Read to the log's end: 7 too, though the tip announced only 6.
        assert_eq!(page.events, vec![event(6), event(7)]);
        assert!(page.at_tip);
        drop(mover.await.unwrap());
    }

    /// A page that is not at the tip: the next read goes ahead at once.
    #[tokio::test(start_paused = true)]
    async fn a_full_page_or_one_short_of_the_tip_is_not_at_it() {
        let (_tx, mut tip) = tokio::sync::watch::channel(9u64);
        let page = |events: Vec<u64>| {
            let events: Vec<Event> = events.into_iter().map(event).collect();
            move || {
                let events = events.clone();
                async move { Ok::<_, ()>(events) }
            }
        };
        // Full: the log may go on past the page, whatever the tip says.
        let full = next_page(7, &mut tip, false, 2, page(vec![8, 9])).await;
        assert!(!full.unwrap().unwrap().at_tip);
        // Short of the tip: a replica behind, or a page cut short.
        let short = next_page(7, &mut tip, false, 10, page(vec![8])).await;
        assert!(!short.unwrap().unwrap().at_tip);
        // Past a tip not yet known (0): the end of the log.
        let (_tx, mut unknown) = tokio::sync::watch::channel(0u64);
        let first = next_page(0, &mut unknown, false, 10, page(vec![1])).await;
        assert!(first.unwrap().unwrap().at_tip);
        // Not at the tip, a reader reads at once even if the tip is behind.
        let started = Instant::now();
        let again = next_page(9, &mut tip, false, 10, page(vec![10])).await;
        assert_eq!(again.unwrap().unwrap().events, vec![event(10)]);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
