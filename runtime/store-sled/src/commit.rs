//! Group commit: concurrent flush requests share one fsync.

use std::sync::{Arc, Weak};

use tokio::sync::{mpsc, oneshot};

/// The histogram of how many writes one fsync made durable.
pub const COMMIT_BATCH: &str = "ferry_commit_batch_size";

/// Describes the sled store's metrics to whatever recorder is installed.
pub fn describe() {
    metrics::describe_histogram!(
        COMMIT_BATCH,
        metrics::Unit::Count,
        "writes made durable by one fsync"
    );
}

type Reply = oneshot::Sender<Result<(), String>>;

/// A handle to the task that fsyncs sled on behalf of every waiting writer.
#[derive(Clone)]
pub struct GroupCommit {
    requests: mpsc::UnboundedSender<Reply>,
}

impl GroupCommit {
    /// Starts the flusher task. Each round takes every request queued so far
    /// and answers all of them with one `sled::Db::flush`, which covers every
    /// write made before the round began.
    ///
    /// One round runs at a time: letting a second start during the first's
    /// fsync was measured and gained nothing (BENCHMARKS.md).
    ///
    /// The task holds the database weakly: dropping the store closes sled
    /// (and releases its directory lock) even while the task is parked.
    pub fn start(db: Weak<sled::Db>) -> Self {
        Self::with(move || match db.upgrade() {
            Some(db) => db.flush().map(drop).map_err(|e| e.to_string()),
            None => Err("the store is closed".to_owned()),
        })
    }

    /// Starts the flusher task with `flush` as its fsync, run on the
    /// blocking pool once per round.
    fn with(flush: impl Fn() -> Result<(), String> + Send + Sync + 'static) -> Self {
        let flush = Arc::new(flush);
        let (requests, mut queue) = mpsc::unbounded_channel::<Reply>();
        tokio::spawn(async move {
            while let Some(first) = queue.recv().await {
                // Let writers that are already running reach the queue, so
                // one fsync serves more of them (costs no time when idle).
                for _ in 0..4 {
                    tokio::task::yield_now().await;
                }
                let mut waiting = vec![first];
                while let Ok(more) = queue.try_recv() {
                    waiting.push(more);
                }
                let flush = flush.clone();
                let outcome = tokio::task::spawn_blocking(move || flush())
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()));
                metrics::histogram!(COMMIT_BATCH).record(waiting.len() as f64);
                for reply in waiting {
                    let _ = reply.send(outcome.clone());
                }
            }
        });
        Self { requests }
    }

    /// Waits until everything written before this call is on disk.
    pub async fn flush(&self) -> Result<(), String> {
        let (reply, done) = oneshot::channel();
        self.requests
            .send(reply)
            .map_err(|_| "the flusher stopped".to_owned())?;
        done.await.map_err(|_| "the flusher stopped".to_owned())?
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;
    use std::time::Duration;

    use super::*;

    /// A flush that blocks until the test releases it: each round hands the
    /// test its own release.
    fn held_flushes() -> (GroupCommit, mpsc::UnboundedReceiver<std_mpsc::Sender<()>>) {
        let (started, rounds) = mpsc::unbounded_channel();
        let commit = GroupCommit::with(move || {
            let (release, released) = std_mpsc::channel();
            started.send(release).unwrap();
            released.recv().unwrap();
            Ok(())
        });
        (commit, rounds)
    }

    fn flush(commit: &GroupCommit) -> tokio::task::JoinHandle<Result<(), String>> {
        let commit = commit.clone();
        tokio::spawn(async move { commit.flush().await })
    }

    /// The next round to start, which must start.
    async fn next_round(
        rounds: &mut mpsc::UnboundedReceiver<std_mpsc::Sender<()>>,
    ) -> std_mpsc::Sender<()> {
        tokio::time::timeout(Duration::from_secs(10), rounds.recv())
            .await
            .expect("no flush round started")
            .unwrap()
    }

    /// Waits briefly for a round that should not start.
    async fn no_round(rounds: &mut mpsc::UnboundedReceiver<std_mpsc::Sender<()>>) -> bool {
        tokio::time::timeout(Duration::from_millis(100), rounds.recv())
            .await
            .is_err()
    }

    #[tokio::test]
    async fn a_round_answers_only_requests_made_before_it_began() {
        let (commit, mut rounds) = held_flushes();
        let first = flush(&commit);
        let first_round = next_round(&mut rounds).await;
        // Made while the first round waits on the disk.
        let later = flush(&commit);
        assert!(no_round(&mut rounds).await);
        first_round.send(()).unwrap();
        first.await.unwrap().unwrap();
        // The first round is over; the later request waits for its own.
        let later_round = next_round(&mut rounds).await;
        assert!(!later.is_finished());
        later_round.send(()).unwrap();
        later.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_failed_flush_fails_its_waiters() {
        let commit = GroupCommit::with(|| Err("disk on fire".to_owned()));
        assert_eq!(commit.flush().await, Err("disk on fire".to_owned()));
    }
}
