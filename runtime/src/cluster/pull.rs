//! Pulling a shared consumer's messages only for the room a worker has.
//!
//! A worker never asks NATS for more messages than it can start at once:
//! the messages it asked for and has not received yet stay within its free
//! room, so a worker that is full or stuck has no pull waiting, and NATS
//! gives the work to the others. It asks again once less than half its
//! room is asked for, so that while it has room a pull of its is always
//! waiting. With the consumer's priority group
//! ([`streams::PRIORITY_GROUP`]) that is what makes priorities work: a
//! pull at a higher number gets messages only while no lower one waits.
//! (async-nats's `messages()` keeps a pull of 200 waiting whatever room
//! its user has, and its `batch()` cannot carry a priority.)

use std::time::Duration;

use async_nats::jetstream::consumer::pull::BatchConfig;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self};
use async_nats::{StatusCode, Subject, Subscriber};
use futures::StreamExt;
use tokio::time::Instant;
use tracing::warn;

use super::streams::{self, GroupChange};

/// How long a pull waits at NATS before it expires (a pull that expired
/// is made again; while it waits, it holds the worker's place).
const EXPIRES: Duration = Duration::from_secs(30);
/// How often NATS says a waiting pull is still there.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// Silence after which the pulls waiting count as lost (NATS restarted).
const LOST_AFTER: Duration = Duration::from_secs(5);
/// The header of NATS's answer to an ended pull: how many of the messages
/// it asked for it did not bring.
const PENDING_MESSAGES: &str = "Nats-Pending-Messages";

/// One worker's pulls from the shared consumer of a stream: every pull's
/// messages (and NATS's word on them) arrive on one inbox.
pub struct Puller {
    client: async_nats::Client,
    js: jetstream::Context,
    stream: &'static str,
    consumer: PullConsumer,
    /// What this worker wants of the consumer's priority group, kept for
    /// binding it again (made anew after it was deleted).
    change: GroupChange,
    priority: u8,
    inbox: (Subject, Subscriber),
    /// The pulls on `inbox` are forgotten: the next ask takes a new one.
    stale: bool,
    /// Messages asked for and not received yet, across pulls.
    asked: usize,
    /// When the inbox last heard from NATS (or the last ask).
    heard: Instant,
}

impl Puller {
    /// Binds the consumer of `stream` (changing its priority group as
    /// `change` says), waiting out a NATS outage. The worker pulls at
    /// `priority` whenever the consumer has a priority group.
    pub async fn bind(
        client: async_nats::Client,
        stream: &'static str,
        change: GroupChange,
        priority: u8,
    ) -> Self {
        let js = jetstream::new(client.clone());
        let consumer = bound(&js, stream, change).await;
        let inbox = loop {
            match subscribe(&client).await {
                Ok(inbox) => break inbox,
                Err(e) => {
                    warn!(stream, error = %e, "subscribing to an inbox failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        Puller {
            client,
            js,
            stream,
            consumer,
            change,
            priority,
            inbox,
            stale: false,
            asked: 0,
            heard: Instant::now(),
        }
    }

    /// Messages asked for and not received yet.
    pub fn asked(&self) -> usize {
        self.asked
    }

    /// Asks for `n` more messages, in pulls no larger than the consumer
    /// allows (`max_batch`, `max_expires`: a server's limits give them).
    pub async fn ask(&mut self, n: usize) -> Result<(), String> {
        if self.stale {
            self.inbox = subscribe(&self.client).await.map_err(|e| e.to_string())?;
            self.stale = false;
        }
        let config = &self.consumer.cached_info().config;
        let largest = usize::try_from(config.max_batch)
            .ok()
            .filter(|&m| m > 0)
            .unwrap_or(usize::MAX);
        let expires = match config.max_expires {
            limit if limit.is_zero() => EXPIRES,
            limit => EXPIRES.min(limit),
        };
        let grouped = streams::has_priority_group(&self.consumer);
        let mut left = n;
        while left > 0 {
            let batch = left.min(largest);
            let request = BatchConfig {
                batch,
                expires: Some(expires),
                // NATS wants at least two heartbeats per pull.
                idle_heartbeat: HEARTBEAT.min(expires / 2),
                group: grouped.then(|| streams::PRIORITY_GROUP.to_string()),
                priority: grouped.then_some(usize::from(self.priority)),
                ..Default::default()
            };
            self.consumer
                .request_batch(request, self.inbox.0.clone())
                .await
                .map_err(|e| e.to_string())?;
            self.asked += batch;
            left -= batch;
        }
        self.heard = Instant::now();
        Ok(())
    }

    /// The next message; `None` when a pull ended (expired, or lost with
    /// the rest after [`LOST_AFTER`] of silence: asking again is up to the
    /// caller); an error when NATS refused a pull (a wrong group, a
    /// deleted consumer, a pull over its limits, ...), after which nothing
    /// counts as asked. Cancel-safe: a `select!` may drop it to ask more.
    pub async fn next(&mut self) -> Result<Option<jetstream::Message>, String> {
        loop {
            let deadline = self.heard + LOST_AFTER;
            let message = match tokio::time::timeout_at(deadline, self.inbox.1.next()).await {
                Ok(Some(message)) => message,
                Ok(None) | Err(_) => {
                    self.forget();
                    return Ok(None);
                }
            };
            self.heard = Instant::now();
            match message.status {
                None | Some(StatusCode::OK) => {
                    self.asked = self.asked.saturating_sub(1);
                    return Ok(Some(jetstream::Message {
                        message,
                        context: self.js.clone(),
                    }));
                }
                Some(StatusCode::IDLE_HEARTBEAT) => continue,
                Some(status) => {
                    let unbrought = message
                        .headers
                        .as_ref()
                        .and_then(|h| h.get(PENDING_MESSAGES))
                        .and_then(|n| n.as_str().parse::<usize>().ok());
                    match unbrought {
                        // A pull ended (expired, say) without all it asked.
                        Some(n) => {
                            self.asked = self.asked.saturating_sub(n);
                            return Ok(None);
                        }
                        None => {
                            self.forget();
                            return Err(format!(
                                "{status}: {}",
                                message.description.as_deref().unwrap_or("")
                            ));
                        }
                    }
                }
            }
        }
    }

    /// Reads the consumer again after a refused pull: another worker may
    /// have added or removed its priority group (NATS refuses a pull
    /// without the group the consumer has), or it may have been deleted
    /// (it is made again, with the group this worker wants).
    pub async fn refresh(&mut self) {
        if let Err(e) = self.consumer.info().await {
            warn!(stream = self.stream, error = %e, "reading the consumer again failed; binding it again");
            self.consumer = bound(&self.js, self.stream, self.change).await;
        }
    }

    /// Forgets the pulls waiting: later ones use a new inbox, so what the
    /// old ones still bring is not counted (NATS gives those messages to a
    /// worker again after the ack deadline).
    fn forget(&mut self) {
        self.asked = 0;
        self.stale = true;
    }
}

/// A new inbox, subscribed to.
async fn subscribe(
    client: &async_nats::Client,
) -> Result<(Subject, Subscriber), async_nats::SubscribeError> {
    let inbox = Subject::from(client.new_inbox());
    let subscriber = client.subscribe(inbox.clone()).await?;
    Ok((inbox, subscriber))
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
