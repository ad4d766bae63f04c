//! The in-process bus: a FIFO per thread, drained by one task per busy
//! thread.
//!
//! Nothing here bounds how many threads' items are handled at once: an item
//! may wait minutes in a dispatch backoff, and a bound held through that
//! wait let one failing tool stall every other tool's calls. The dispatcher
//! bounds what costs something, the attempts in flight.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use ferry_proto::bus::Work;
use futures::future::BoxFuture;

use super::{Bus, Error};

/// What carries out one work item (the worker).
pub type Handler = Arc<dyn Fn(Work) -> BoxFuture<'static, ()> + Send + Sync>;

#[derive(Clone, Default)]
pub struct LocalBus {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Threads with work queued or in progress. A thread is present exactly
    /// while its drainer task runs, so each thread has at most one.
    queues: Mutex<HashMap<String, VecDeque<Work>>>,
    handler: OnceLock<Handler>,
}

impl LocalBus {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the handler, once, before anything is published (publishing
    /// without one is refused).
    pub fn set_handler(&self, handler: Handler) {
        if self.inner.handler.set(handler).is_err() {
            panic!("LocalBus handler set twice");
        }
    }
}

impl Inner {
    async fn drain(self: Arc<Self>, group_id: String, mut work: Work) {
        loop {
            let handler = self
                .handler
                .get()
                .expect("publish checks the handler is set");
            handler(work).await;
            let mut queues = self.queues.lock().expect("bus lock");
            let queue = queues.get_mut(&group_id).expect("drainer owns its entry");
            match queue.pop_front() {
                Some(next) => work = next,
                None => {
                    queues.remove(&group_id);
                    return;
                }
            }
        }
    }
}

#[async_trait]
impl Bus for LocalBus {
    async fn publish(&self, work: Work) -> Result<(), Error> {
        if self.inner.handler.get().is_none() {
            return Err(Error::Unavailable(
                "no worker is attached to the bus".into(),
            ));
        }
        let group_id = work.group_id().to_owned();
        let mut queues = self.inner.queues.lock().expect("bus lock");
        if let Some(queue) = queues.get_mut(&group_id) {
            // A resubmitted call enqueues its work again (the first copy may
            // never have reached a bus); one copy waiting is enough, or a
            // client retrying behind a slow call would grow the queue.
            if !queue.iter().any(|w| w.call_id() == work.call_id()) {
                queue.push_back(work);
            }
            return Ok(());
        }
        queues.insert(group_id.clone(), VecDeque::new());
        tokio::spawn(self.inner.clone().drain(group_id, work));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::Invocation;
    use futures::FutureExt;
    use tokio::sync::mpsc;

    fn work(group: &str, id: &str) -> Work {
        Work::Dispatch {
            endpoint: String::new(),
            invocation: Invocation {
                operation: "op".into(),
                arguments: serde_json::json!({}),
                id: id.into(),
                call_id: None,
                callback_url: String::new(),
                group_id: group.into(),
                thread_ancestors: None,
                user_id: None,
                identity: None,
                user_verified: false,
            },
        }
    }

    #[tokio::test]
    async fn one_thread_in_order_while_others_proceed() {
        let bus = LocalBus::new();
        let (done, mut seen) = mpsc::unbounded_channel();
        let (release, gate) = tokio::sync::watch::channel(false);
        bus.set_handler(Arc::new(move |w: Work| {
            let done = done.clone();
            let mut gate = gate.clone();
            async move {
                let Work::Dispatch { invocation, .. } = w;
                if invocation.group_id == "slow" {
                    gate.wait_for(|open| *open).await.unwrap();
                }
                done.send(format!("{}/{}", invocation.group_id, invocation.id))
                    .unwrap();
            }
            .boxed()
        }));
        for i in 0..3 {
            bus.publish(work("slow", &i.to_string())).await.unwrap();
        }
        // Work for a call already waiting is not queued twice.
        bus.publish(work("slow", "2")).await.unwrap();
        bus.publish(work("fast", "0")).await.unwrap();
        // The blocked thread does not hold up another thread.
        assert_eq!(seen.recv().await.unwrap(), "fast/0");
        release.send(true).unwrap();
        for i in 0..3 {
            assert_eq!(seen.recv().await.unwrap(), format!("slow/{i}"));
        }
        // Next in the thread's order: not a second slow/2.
        bus.publish(work("slow", "end")).await.unwrap();
        assert_eq!(seen.recv().await.unwrap(), "slow/end");
    }
}
