//! Group commit: concurrent flush requests share one fsync.

use std::sync::Weak;

use tokio::sync::{mpsc, oneshot};

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
    /// The task holds the database weakly: dropping the store closes sled
    /// (and releases its directory lock) even while the task is parked.
    pub fn start(db: Weak<sled::Db>) -> Self {
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
                let Some(db) = db.upgrade() else {
                    return;
                };
                let outcome = tokio::task::spawn_blocking(move || db.flush())
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map(drop).map_err(|e| e.to_string()));
                metrics::histogram!(crate::metrics::COMMIT_BATCH).record(waiting.len() as f64);
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
