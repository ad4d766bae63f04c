//! Consumers on a runtime node: loaded from the buckets every node shares
//! (`ferry_nats::cluster::deliveries`), and kept current with what the
//! other nodes do: consumers they make and delete, records they write
//! (an event they handed out or had acknowledged), and commits they
//! append (a thread with new events).

use std::sync::Arc;
use std::time::Duration;

use ferry_engine::delivery::Consumers;
use ferry_engine::Engine;
use ferry_nats::cluster::deliveries::{Change, SharedDeliveries};
use ferry_nats::jetstream::JetStreamStore;
use futures::StreamExt;
use tokio::sync::broadcast::error::RecvError;
use tracing::warn;

/// How often a node checks whether its NATS client reconnected: commits
/// appended meanwhile were not seen, and every thread is looked at again.
const RECONNECT_CHECK: Duration = Duration::from_secs(2);

/// Loads the consumers into `engine` and follows every node's changes
/// for as long as the engine lives.
pub(super) async fn follow(
    engine: &Arc<Engine>,
    client: &async_nats::Client,
    deliveries: Arc<SharedDeliveries>,
    store: Arc<JetStreamStore>,
) -> anyhow::Result<()> {
    // Following before loading: a change made while loading is not missed
    // (one seen twice is harmless: a record is kept only if newer).
    let mut changes = Box::pin(deliveries.changes().await?);
    let mut committed = store.committed();
    let consumers = Arc::new(Consumers::load(deliveries.clone(), &*store).await?);
    engine.set_consumers(consumers.clone());
    ferry_engine::delivery::describe();
    engine.start_pushing();
    engine.start_counting_lag();
    let statistics = client.statistics();
    let connects = move || {
        statistics
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let weak = Arc::downgrade(engine);
    tokio::spawn(async move {
        let mut seen = connects();
        let mut every = tokio::time::interval(RECONNECT_CHECK);
        // Every thread is owed a look after changes may have been missed;
        // one that fails is tried again at the next check.
        let mut owed = false;
        loop {
            let missed = tokio::select! {
                change = changes.next() => match change {
                    Some(Change::Consumers) => {
                        if let Err(e) = consumers.refresh(&*store).await {
                            warn!(error = %e, "reloading consumers failed");
                        }
                        let Some(engine) = weak.upgrade() else { return };
                        engine.start_pushing();
                        false
                    }
                    Some(Change::Record { consumer, record }) => {
                        consumers.apply(&consumer, record).await;
                        false
                    }
                    None => {
                        warn!("the feed of consumer changes ended; following again");
                        tokio::time::sleep(RECONNECT_CHECK).await;
                        match deliveries.changes().await {
                            Ok(again) => changes = Box::pin(again),
                            Err(e) => warn!(error = %e, "following consumer changes failed"),
                        }
                        if let Err(e) = consumers.refresh(&*store).await {
                            warn!(error = %e, "reloading consumers failed");
                        }
                        true
                    }
                },
                group_id = committed.recv() => match group_id {
                    Ok(group_id) => {
                        consumers.touched(&group_id);
                        false
                    }
                    Err(RecvError::Lagged(_)) => true,
                    Err(RecvError::Closed) => return,
                },
                _ = every.tick() => {
                    let now = connects();
                    std::mem::replace(&mut seen, now) != now || owed
                }
            };
            if missed {
                match consumers.touched_all(&*store).await {
                    Ok(()) => owed = false,
                    Err(e) => {
                        owed = true;
                        warn!(error = %e, "looking at every thread for consumers failed");
                    }
                }
            }
        }
    });
    Ok(())
}
