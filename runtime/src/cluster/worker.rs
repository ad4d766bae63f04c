//! A worker's two loops: apply relayed requests (`FERRY_INBOX`) through the
//! engine and answer the node that waits, and carry out dispatch work
//! (`FERRY_WORK`). A message is acked only after its effect is stored, so a
//! worker killed at any point leaves its messages to another worker; the
//! state machine makes the repeat harmless (invariants 2 and 4).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use ferry_proto::bus::Work;
use ferry_worker::Worker;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tracing::{info_span, warn, Instrument};

use super::pull::Puller;
use super::relay::{REPLY_HEADER, REQUEST_HEADER};
use super::streams::{ACK_WAIT, MAX_ACK_PENDING};
use crate::engine::requests::{Refusal, Request};
use crate::engine::{self, Engine};
use crate::http::ApiError;
use crate::{bus, store};

/// Applies relayed requests pulled by `puller` (of [`super::streams::INBOX_STREAM`]),
/// forever (through NATS outages), answering the waiting node on `client`.
pub async fn apply_requests(
    engine: Arc<Engine>,
    client: async_nats::Client,
    puller: Puller,
    concurrency: usize,
) {
    let apply_one = move |message| {
        let (engine, client) = (engine.clone(), client.clone());
        async move { apply(&engine, &client, message).await }
    };
    consume(puller, "requests", concurrency, apply_one).await
}

/// Dispatch work a worker keeps in hand per attempt it may have in flight.
const IN_HAND_PER_ATTEMPT: usize = 4;

/// Carries out dispatch work, forever (through NATS outages). A message
/// waiting out a dispatch backoff stays in hand, so a bound of one per
/// attempt in flight would let one failing tool's calls stall every other
/// call: a worker keeps [`IN_HAND_PER_ATTEMPT`] times `max_in_flight`
/// (its dispatcher bounds the attempts themselves), and never so many that
/// the other workers sharing the consumer's `max_ack_pending` get nothing.
/// It takes the work `puller` (of [`super::streams::WORK_STREAM`]) brings.
pub async fn dispatch_work(worker: Worker, puller: Puller, max_in_flight: usize) {
    let carry_out_one = move |message| {
        let worker = worker.clone();
        async move { carry_out(&worker, message).await }
    };
    let in_hand = max_in_flight
        .saturating_mul(IN_HAND_PER_ATTEMPT)
        .min(MAX_ACK_PENDING / 4);
    consume(puller, "work", in_hand, carry_out_one).await
}

/// A worker asks for more once this share of its whole room (or one
/// message) is free and not asked for, or once nothing is asked for: so
/// at most a sixteenth of its room is open to workers after it, and a
/// pull holds at least a sixteenth of its room (not one message per pull
/// as its room frees one place at a time).
const TOP_UP_SHARE: usize = 16;

/// How long a worker waits after NATS refused a pull, so that a refusal
/// that keeps coming costs little.
const REFUSED_PAUSE: Duration = Duration::from_secs(1);

/// Pulls messages forever (pulling again after an outage), each handled on
/// its own task, at most `concurrency` at once. It asks only for the room
/// it has, and tops that up as room frees ([`super::pull`]): while it has
/// room a pull of its waits, and a full worker has none, leaving the work
/// to others.
async fn consume<F, Fut>(mut puller: Puller, what: &str, concurrency: usize, handle: F)
where
    F: Fn(jetstream::Message) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let limit = Arc::new(Semaphore::new(concurrency.max(1)));
    let top_up = (concurrency / TOP_UP_SHARE).max(1);
    let freed = Arc::new(Notify::new());
    loop {
        let room = limit.available_permits();
        let open = room.saturating_sub(puller.asked());
        if open > 0 && (puller.asked() == 0 || open >= top_up) {
            if let Err(e) = puller.ask(open).await {
                warn!(what, error = %e, "pulling failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        }
        if puller.asked() == 0 {
            // Full: wait for room.
            freed.notified().await;
            continue;
        }
        let next = tokio::select! {
            next = puller.next() => next,
            // Room freed: top up first.
            _ = freed.notified() => continue,
        };
        let message = match next {
            Ok(Some(message)) => message,
            Ok(None) => continue,
            Err(why) => {
                warn!(what, why, "NATS refused a pull; reading the consumer again");
                puller.refresh().await;
                tokio::time::sleep(REFUSED_PAUSE).await;
                continue;
            }
        };
        // Never more arrive than there was room for: this does not wait.
        let place = Place {
            permit: Some(limit.clone().acquire_owned().await.expect("never closed")),
            freed: freed.clone(),
        };
        let handled = handle(message);
        tokio::spawn(async move {
            handled.await;
            drop(place);
        });
    }
}

/// A message's place in a worker's room: given back, it wakes the pull
/// loop, even when its handler panicked (a loop waiting for room would
/// otherwise wait for good).
struct Place {
    permit: Option<OwnedSemaphorePermit>,
    freed: Arc<Notify>,
}

impl Drop for Place {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.freed.notify_one();
    }
}

async fn apply(engine: &Arc<Engine>, client: &async_nats::Client, message: jetstream::Message) {
    let request: Request = match rmp_serde::from_slice(&message.payload) {
        Ok(request) => request,
        Err(e) => {
            // Nothing can ever apply it: drop it rather than loop on it.
            warn!(error = %e, "unreadable relayed request dropped");
            let _ = message.ack_with(AckKind::Term).await;
            return;
        }
    };
    let span = info_span!("request", group_id = request.group_id().unwrap_or(""));
    let id = message
        .headers
        .as_ref()
        .and_then(|h| h.get(REQUEST_HEADER))
        .map(|id| id.to_string());
    // A request slower than the ack deadline (NATS slow to answer, say)
    // must not be handed to a second worker meanwhile: say we are at it.
    let applied = store::jetstream::applying(id, engine.perform(request));
    let answer = at_work(&message, applied.instrument(span)).await;
    if let Err(e) = &answer {
        if is_transient(e) {
            // Leave it for a later attempt (by this or another worker).
            warn!(error = %e, "request not applied yet; retrying later");
            let _ = message
                .ack_with(AckKind::Nak(Some(Duration::from_millis(500))))
                .await;
            return;
        }
    }
    let answer = answer.map_err(|e| Refusal::from(ApiError::from(e)));
    if let Some(reply_to) = message.headers.as_ref().and_then(|h| h.get(REPLY_HEADER)) {
        let body = rmp_serde::to_vec_named(&answer).expect("answers serialize");
        if let Err(e) = client.publish(reply_to.to_string(), body.into()).await {
            warn!(error = %e, "answering the runtime node failed");
        }
    }
    // A plain ack, not a double one: waiting for NATS to confirm it cost a
    // round trip per message (about 10% of a call's CPU at 64 callers), and
    // the confirmation changed nothing (a failed ack was only logged). A
    // lost ack brings the request back after the ack deadline, as a worker
    // dying here would: a command that wrote finds its commit id already
    // applied; one that was refused or wrote nothing is answered again and
    // changes nothing.
    if let Err(e) = message.ack().await {
        warn!(error = %e, "acking a request failed; it may be applied again");
    }
}

/// Runs `work` on `message`, telling JetStream every third of the ack
/// deadline that it is still in progress (`+WPI`), so that the message is
/// not redelivered to another worker while this one is at it.
async fn at_work<T>(message: &jetstream::Message, work: impl std::future::Future<Output = T>) -> T {
    tokio::pin!(work);
    let mut ticks = tokio::time::interval(ACK_WAIT / 3);
    ticks.tick().await;
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = ticks.tick() => { let _ = message.ack_with(AckKind::Progress).await; }
        }
    }
}

/// Failures of the cluster's plumbing rather than refusals of the request.
fn is_transient(e: &engine::Error) -> bool {
    matches!(
        e,
        engine::Error::Store(store::Error::Unavailable(_) | store::Error::Conflict(_))
            | engine::Error::Bus(bus::Error::Unavailable(_))
    )
}

async fn carry_out(worker: &Worker, message: jetstream::Message) {
    let work: Work = match rmp_serde::from_slice(&message.payload) {
        Ok(work) => work,
        Err(e) => {
            warn!(error = %e, "unreadable work dropped");
            let _ = message.ack_with(AckKind::Term).await;
            return;
        }
    };
    // Dispatch retries can outlast the ack deadline.
    let recorded = at_work(&message, worker.handle(work)).await;
    if !recorded {
        // Dispatch again later: the outcome is not stored anywhere.
        let _ = message
            .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
            .await;
        return;
    }
    // A plain ack, as for requests: lost, it brings the work back, and the
    // call, no longer waiting for dispatch, is not sent again (or the tool
    // sees it twice, which RAP allows; the agent never sees two results).
    if let Err(e) = message.ack().await {
        warn!(error = %e, "acking work failed; it may be dispatched again");
    }
}
