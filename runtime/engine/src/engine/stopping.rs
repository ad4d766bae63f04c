//! Ending what readers hold open when the process stops. An SSE stream, a
//! long-poll or a protocol front waiting on a call may never end on its
//! own, and a graceful shutdown waits for every open request: without this
//! a `ferry serve` followed by any agent would not stop on SIGTERM. Each
//! reader resumes after a restart where it was (`Last-Event-ID`, `after`,
//! the call's id).

use std::future::Future;

use super::Engine;

impl Engine {
    /// Ends every open stream and long wait, now and from now on: streams
    /// end cleanly, long-polls answer what they have, waits on a call
    /// answer the call as it is.
    pub fn stop_readers(&self) {
        self.stopping.send_replace(true);
    }

    /// Whether [`Engine::stop_readers`] was called.
    pub fn readers_stopped(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Resolves once [`Engine::stop_readers`] is called (at once if it was).
    pub fn readers_stop(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stopping = self.stopping.subscribe();
        async move {
            // The sender lives as long as the engine; if it is gone, so is
            // everything a reader would wait for.
            let _ = stopping.wait_for(|stopped| *stopped).await;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use ferry_store_sled::SledStore;

    use ferry_proto::api::CallStatus;

    /// Longer than any wait below may last once readers are stopped.
    const LONG: Duration = Duration::from_secs(600);
    const PROMPTLY: Duration = Duration::from_secs(10);

    use crate::testing::queued;

    #[tokio::test]
    async fn stopping_ends_long_polls_and_waits_on_a_call_open_or_still_to_come() {
        let dir = tempfile::tempdir().unwrap();
        let engine = queued(Arc::new(SledStore::open(dir.path()).unwrap())).await;
        let poll = tokio::spawn({
            let engine = engine.clone();
            async move { engine.events("g", 99, 10, LONG).await }
        });
        let wait = tokio::spawn({
            let engine = engine.clone();
            async move {
                let done = |c: &crate::thread::CallRecord| c.status == CallStatus::Completed;
                engine.wait_for_call("g", "c1", LONG, done).await
            }
        });
        assert!(!engine.readers_stopped());
        engine.stop_readers();
        let page = tokio::time::timeout(PROMPTLY, poll)
            .await
            .expect("the long poll ends when readers stop")
            .unwrap()
            .unwrap();
        assert!(page.is_empty(), "nothing new: {page:?}");
        let waited = tokio::time::timeout(PROMPTLY, wait)
            .await
            .expect("the wait on the call ends when readers stop")
            .unwrap()
            .unwrap();
        assert_eq!(waited.status, CallStatus::Queued, "the call as it is");
        // Begun after the stop, they answer at once, and reads still work.
        let page = tokio::time::timeout(PROMPTLY, engine.events("g", 99, 10, LONG)).await;
        assert!(page.expect("answered at once").unwrap().is_empty());
        assert_eq!(engine.events("g", 0, 10, LONG).await.unwrap().len(), 1);
    }
}
