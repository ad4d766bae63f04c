//! Pulling a shared consumer's messages only for the room a worker has.
//!
//! A worker never asks NATS for more messages than it can start at once:
//! the messages it asked for and has not received yet stay within its free
//! room, so a worker that is full or stuck has no pull waiting, and NATS
//! gives the work to the others. It tops its pulls up as its room frees
//! (`worker::consume`), so that while it has room a pull of its is always
//! waiting. With the consumer's priority group
//! ([`streams::PRIORITY_GROUP`]) that is what makes priorities work: a
//! pull at a higher number gets messages only while no lower one waits.
//! (async-nats's `messages()` keeps a pull of 200 waiting whatever room
//! its user has, and its `batch()` cannot carry a priority.)
//!
//! Each pull answers on an inbox of its own, so what each still owes is
//! known exactly: a pull that NATS ends, refuses, or drops without a word
//! (a restart, a full wait list, a leader change) takes its own count
//! away, and no other's.

use std::future::poll_fn;
use std::task::Poll;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::BatchConfig;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::{self};
use async_nats::{StatusCode, Subscriber};
use futures::StreamExt;
use tokio::time::Instant;
use tracing::warn;

use super::streams::{self, GroupChange};
use super::subjects::Layout;

/// How long a pull waits at NATS before it expires (a pull that expired
/// is made again; while it waits, it holds the worker's place).
const EXPIRES: Duration = Duration::from_secs(30);
/// How often NATS says a waiting pull is still there.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// Silence after which a pull counts as lost (NATS restarted, say). NATS
/// also keeps quiet on a pull while it is busy giving messages to other
/// pulls; such a pull is merely made again.
const LOST_AFTER: Duration = Duration::from_secs(5);
/// The header of NATS's answer to an ended pull: how many of the messages
/// it asked for it did not bring.
const PENDING_MESSAGES: &str = "Nats-Pending-Messages";

/// One worker's pulls from the shared consumer of a stream.
pub struct Puller {
    client: async_nats::Client,
    js: jetstream::Context,
    layout: Layout,
    partition: usize,
    /// The partition's stream, for the log.
    stream: String,
    consumer: PullConsumer,
    /// What this worker wants of the consumer's priority group, kept for
    /// binding it again (made anew after it was deleted).
    change: GroupChange,
    priority: u8,
    pulls: Vec<Pull>,
}

/// A pull waiting at NATS, on its own inbox.
struct Pull {
    inbox: Subscriber,
    /// Messages it asked for and has not brought yet.
    owed: usize,
    /// When it was made, or last heard from.
    heard: Instant,
}

impl Puller {
    /// Binds the consumer of partition `partition` (changing its priority
    /// group as `change` says), waiting out a NATS outage. The worker pulls
    /// at `priority` whenever the consumer has a priority group.
    pub async fn bind(
        client: async_nats::Client,
        layout: Layout,
        partition: usize,
        change: GroupChange,
        priority: u8,
    ) -> Self {
        let js = jetstream::new(client.clone());
        let consumer = bound(&js, layout, partition, change).await;
        Puller {
            client,
            js,
            layout,
            partition,
            stream: layout.stream(partition),
            consumer,
            change,
            priority,
            pulls: Vec::new(),
        }
    }

    /// Messages asked for and not received yet.
    pub fn asked(&self) -> usize {
        self.pulls.iter().map(|p| p.owed).sum()
    }

    /// Asks for `n` more messages, in pulls no larger than the consumer
    /// allows (`max_batch`, `max_expires`: a server's limits give them).
    pub async fn ask(&mut self, n: usize) -> Result<(), String> {
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
            let reply = self.client.new_inbox();
            let inbox = self
                .client
                .subscribe(reply.clone())
                .await
                .map_err(|e| e.to_string())?;
            self.consumer
                .request_batch(request, reply.into())
                .await
                .map_err(|e| e.to_string())?;
            self.pulls.push(Pull {
                inbox,
                owed: batch,
                heard: Instant::now(),
            });
            left -= batch;
        }
        Ok(())
    }

    /// The next message; `None` when a pull ended (filled, expired, or
    /// lost after [`LOST_AFTER`] of silence: asking again is up to the
    /// caller); an error when NATS refused a pull (a wrong group, a
    /// deleted consumer, ...). A pull that ends takes what it still owed
    /// off [`Puller::asked`]. Cancel-safe: a `select!` may drop it to ask
    /// for more.
    pub async fn next(&mut self) -> Result<Option<jetstream::Message>, String> {
        loop {
            let Some(quietest) = self.pulls.iter().map(|p| p.heard).min() else {
                return Ok(None);
            };
            let heard = tokio::time::timeout_at(
                quietest + LOST_AFTER,
                poll_fn(|cx| {
                    for (i, pull) in self.pulls.iter_mut().enumerate() {
                        if let Poll::Ready(message) = pull.inbox.poll_next_unpin(cx) {
                            return Poll::Ready((i, message));
                        }
                    }
                    Poll::Pending
                }),
            )
            .await;
            let (i, message) = match heard {
                Ok((i, Some(message))) => (i, message),
                // Its subscription ended (the client closed).
                Ok((i, None)) => {
                    self.pulls.swap_remove(i);
                    return Ok(None);
                }
                Err(_) => {
                    let now = Instant::now();
                    self.pulls.retain(|p| p.heard + LOST_AFTER > now);
                    return Ok(None);
                }
            };
            let pull = &mut self.pulls[i];
            pull.heard = Instant::now();
            match message.status {
                None | Some(StatusCode::OK) => {
                    pull.owed = pull.owed.saturating_sub(1);
                    if pull.owed == 0 {
                        self.pulls.swap_remove(i);
                    }
                    return Ok(Some(jetstream::Message {
                        message,
                        context: self.js.clone(),
                    }));
                }
                Some(StatusCode::IDLE_HEARTBEAT) => continue,
                Some(status) => {
                    self.pulls.swap_remove(i);
                    let ended = message
                        .headers
                        .as_ref()
                        .is_some_and(|h| h.get(PENDING_MESSAGES).is_some());
                    // Ended (expired, say) without all it asked for: fine.
                    if ended {
                        return Ok(None);
                    }
                    return Err(format!(
                        "{status}: {}",
                        message.description.as_deref().unwrap_or("")
                    ));
                }
            }
        }
    }

    /// Ends this worker's pulls, for a worker that stops taking work: their
    /// inboxes are unsubscribed (NATS drops a waiting pull nobody listens
    /// to), and each message they had brought and the worker had not taken
    /// yet is handed back (a nak: another worker gets it at once). Returns
    /// how many were. A message NATS sent just before it saw the
    /// unsubscribe is lost to this worker, and comes back to another after
    /// the ack deadline.
    pub async fn hand_back(&mut self) -> usize {
        let mut handed_back = 0;
        for mut pull in self.pulls.drain(..) {
            if let Err(e) = pull.inbox.unsubscribe().await {
                warn!(stream = %self.stream, error = %e, "ending a pull failed");
            }
            // Unsubscribed, the inbox yields what it holds and ends.
            while let Some(message) = pull.inbox.next().await {
                if matches!(message.status, None | Some(StatusCode::OK)) {
                    let message = jetstream::Message {
                        message,
                        context: self.js.clone(),
                    };
                    super::worker::hand_back(&message).await;
                    handed_back += 1;
                }
            }
        }
        handed_back
    }

    /// Reads the consumer again after a refused pull: another worker may
    /// have added or removed its priority group (NATS refuses a pull
    /// without the group the consumer has), or it may have been deleted
    /// (it is made again, with the group this worker asked for at start).
    pub async fn refresh(&mut self) {
        match self.consumer.info().await {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ConsumerInfoErrorKind::NotFound | ConsumerInfoErrorKind::StreamNotFound
                ) =>
            {
                warn!(
                    stream = %self.stream,
                    "the consumer is gone; binding it again"
                );
                // nats-server removes a deleted consumer's files after it
                // answered the delete: a consumer of the same name made at
                // once can lose its own files to that removal, and then
                // refuses every write for good (code 10012).
                tokio::time::sleep(REBIND_PAUSE).await;
                self.consumer = bound(&self.js, self.layout, self.partition, self.change).await;
            }
            // NATS between leaders, say: the next pull tells again.
            Err(e) => warn!(stream = %self.stream, error = %e, "reading the consumer again failed"),
        }
    }
}

/// How long a worker waits before it makes a deleted consumer again.
const REBIND_PAUSE: Duration = Duration::from_secs(1);

/// The shared consumer of `stream`, with its priority group changed as
/// `change` says, waiting out a NATS outage.
async fn bound(
    js: &jetstream::Context,
    layout: Layout,
    partition: usize,
    change: GroupChange,
) -> PullConsumer {
    loop {
        match streams::bind(js, layout, partition, change).await {
            Ok(consumer) => return consumer,
            Err(e) => {
                let stream = layout.stream(partition);
                warn!(stream, error = %e, "binding the consumer failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
