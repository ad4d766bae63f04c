//! Pulling a shared consumer's messages only for the room a worker has.
//!
//! A worker asks NATS for as many messages as it can start at once and
//! asks again once those arrived or the pull expired; a worker that is
//! full or stuck has no pull waiting, so NATS gives the work to the
//! others. With the consumer's priority group ([`streams::PRIORITY_GROUP`])
//! that is what makes priorities safe: a pull at a higher number gets
//! messages only while no lower one waits, and a full worker's does not.
//! (async-nats's `messages()` keeps a pull of 200 waiting whatever room
//! its user has, and its `batch()` cannot carry a priority.)

use std::time::Duration;

use async_nats::jetstream::consumer::pull::BatchConfig;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self};
use async_nats::{StatusCode, Subscriber};
use futures::StreamExt;
use tracing::warn;

use super::streams::{self, GroupChange};

/// How long a pull waits at NATS for messages before it is renewed.
const EXPIRES: Duration = Duration::from_secs(5);
/// How often NATS says a waiting pull is still there.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// Silence after which a pull counts as lost (NATS restarted, say).
const LOST_AFTER: Duration = Duration::from_secs(3);

/// One worker's hold on the shared consumer of a stream.
pub struct Puller {
    client: async_nats::Client,
    js: jetstream::Context,
    stream: &'static str,
    consumer: PullConsumer,
    priority: u8,
}

impl Puller {
    /// Binds the consumer of `stream`, waiting out a NATS outage. The
    /// worker pulls at `priority` whenever the consumer has a priority
    /// group.
    pub async fn bind(client: async_nats::Client, stream: &'static str, priority: u8) -> Self {
        let js = jetstream::new(client.clone());
        let consumer = bound(&js, stream, GroupChange::Keep).await;
        Puller {
            client,
            js,
            stream,
            consumer,
            priority,
        }
    }

    /// Asks for at most `room` messages (at least one).
    pub async fn pull(&self, room: usize) -> Result<Pull, String> {
        let inbox = self.client.new_inbox();
        let subscriber = self
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| e.to_string())?;
        let grouped = streams::has_priority_group(&self.consumer);
        let request = BatchConfig {
            batch: room.max(1),
            expires: Some(EXPIRES),
            idle_heartbeat: HEARTBEAT,
            group: grouped.then(|| streams::PRIORITY_GROUP.to_string()),
            priority: grouped.then_some(usize::from(self.priority)),
            ..Default::default()
        };
        self.consumer
            .request_batch(request, inbox.into())
            .await
            .map_err(|e| e.to_string())?;
        Ok(Pull {
            subscriber,
            left: room.max(1),
            js: self.js.clone(),
        })
    }

    /// Reads the consumer again after a refused pull: another worker may
    /// have added or removed its priority group (NATS refuses a pull in a
    /// group the consumer lacks, and one without the group it has), or it
    /// may have been deleted (it is made again).
    pub async fn refresh(&mut self) {
        if let Err(e) = self.consumer.info().await {
            warn!(stream = self.stream, error = %e, "reading the consumer again failed; binding it again");
            self.consumer = bound(&self.js, self.stream, GroupChange::Keep).await;
        }
    }
}

/// The shared consumer of `stream`, waiting out a NATS outage.
pub async fn bound(js: &jetstream::Context, stream: &str, change: GroupChange) -> PullConsumer {
    loop {
        match streams::bind(js, stream, change).await {
            Ok(consumer) => return consumer,
            Err(e) => {
                warn!(stream, error = %e, "binding the consumer failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// One pull's messages as they arrive.
pub struct Pull {
    subscriber: Subscriber,
    left: usize,
    js: jetstream::Context,
}

impl Pull {
    /// The next message; `None` once all asked for arrived, the pull
    /// expired, or it was lost; an error when NATS refused the pull (a
    /// wrong group, a deleted consumer, ...).
    pub async fn next(&mut self) -> Result<Option<jetstream::Message>, String> {
        while self.left > 0 {
            let message = match tokio::time::timeout(LOST_AFTER, self.subscriber.next()).await {
                Ok(Some(message)) => message,
                Ok(None) | Err(_) => return Ok(None),
            };
            match message.status {
                None | Some(StatusCode::OK) => {
                    self.left -= 1;
                    return Ok(Some(jetstream::Message {
                        message,
                        context: self.js.clone(),
                    }));
                }
                Some(StatusCode::IDLE_HEARTBEAT) => continue,
                // Expired, or nothing left for a pull that asked no wait.
                Some(StatusCode::TIMEOUT | StatusCode::NOT_FOUND) => return Ok(None),
                Some(status) => {
                    return Err(format!(
                        "{status}: {}",
                        message.description.as_deref().unwrap_or("")
                    ))
                }
            }
        }
        Ok(None)
    }
}
