//! A worker's two loops: apply relayed requests (`FERRY_INBOX`) through the
//! engine and answer the node that waits, and carry out dispatch work
//! (`FERRY_WORK`). A message is acked only after its effect is stored, so a
//! worker killed at any point leaves its messages to another worker; the
//! state machine makes the repeat harmless (invariants 2 and 4). Both loops
//! end when the worker stops ([`super::stop`]).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use ferry_proto::bus::Work;
use ferry_worker::{Handled, Worker};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tracing::{info, info_span, warn, Instrument};

use super::pull::Puller;
use super::relay::{REPLY_HEADER, REQUEST_HEADER};
use super::stop::{Phase, Stop};
use super::streams::{ACK_WAIT, MAX_ACK_PENDING};
use crate::engine::requests::{Refusal, Request};
use crate::engine::{self, Engine};
use crate::http::ApiError;
use crate::{bus, store};

/// Applies relayed requests pulled by `puller` (of [`super::streams::INBOX_STREAM`]),
/// through NATS outages, answering the waiting node on `client`, until
/// the worker stops.
pub async fn apply_requests(
    engine: Arc<Engine>,
    client: async_nats::Client,
    puller: Puller,
    concurrency: usize,
    stop: Stop,
) {
    let apply_one = {
        let stop = stop.clone();
        move |message| {
            let (engine, client, stop) = (engine.clone(), client.clone(), stop.clone());
            async move { apply(&engine, &client, message, &stop).await }
        }
    };
    consume(puller, "requests", concurrency, apply_one, &stop).await
}

/// Dispatch work a worker keeps in hand per attempt it may have in flight.
const IN_HAND_PER_ATTEMPT: usize = 4;

/// Carries out dispatch work, forever (through NATS outages). A message
/// waiting out a dispatch backoff stays in hand, so a bound of one per
/// attempt in flight would let one failing tool's calls stall every other
/// call: a worker keeps [`IN_HAND_PER_ATTEMPT`] times `max_in_flight`
/// (its dispatcher bounds the attempts themselves), and never so many that
/// the other workers sharing the consumer's `max_ack_pending` get nothing.
/// It takes the work `puller` (of [`super::streams::WORK_STREAM`]) brings,
/// until the worker stops (whose dispatcher the caller stops with it).
pub async fn dispatch_work(worker: Worker, puller: Puller, max_in_flight: usize, stop: Stop) {
    let carry_out_one = {
        let stop = stop.clone();
        move |message| {
            let (worker, stop) = (worker.clone(), stop.clone());
            async move { carry_out(&worker, message, &stop).await }
        }
    };
    let in_hand = max_in_flight
        .saturating_mul(IN_HAND_PER_ATTEMPT)
        .min(MAX_ACK_PENDING / 4);
    consume(puller, "work", in_hand, carry_out_one, &stop).await
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

/// Pulls messages (pulling again after an outage), each handled on its own
/// task, at most `concurrency` at once. It asks only for the room it has,
/// and tops that up as room frees ([`super::pull`]): while it has room a
/// pull of its waits, and a full worker has none, leaving the work to
/// others. Once the worker drains, it ends its pulls, hands back what
/// they still hold, and returns when every message it took is handled (or
/// handed back, when the worker gives up).
async fn consume<F, Fut>(mut puller: Puller, what: &str, concurrency: usize, handle: F, stop: &Stop)
where
    F: Fn(jetstream::Message) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let places = concurrency.max(1);
    let limit = Arc::new(Semaphore::new(places));
    let top_up = (concurrency / TOP_UP_SHARE).max(1);
    let freed = Arc::new(Notify::new());
    while !stop.at(Phase::Draining) {
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
            tokio::select! {
                () = stop.reached(Phase::Draining) => {}
                () = freed.notified() => {}
            }
            continue;
        }
        let next = tokio::select! {
            biased;
            () = stop.reached(Phase::Draining) => continue,
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
    let handed_back = puller.hand_back().await;
    let under_way = places - limit.available_permits();
    info!(
        what,
        handed_back, under_way, "stopped taking work; finishing what is under way"
    );
    // Every place comes back: its work ends, or is handed back once the
    // worker gives up.
    let _all = limit
        .acquire_many(u32::try_from(places).unwrap_or(u32::MAX))
        .await;
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

async fn apply(
    engine: &Arc<Engine>,
    client: &async_nats::Client,
    message: jetstream::Message,
    stop: &Stop,
) {
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
    let Some(answer) = at_work(&message, applied.instrument(span), stop).await else {
        // Handed back: the node waiting on it gets the answer from the
        // worker that applies it (or finds it applied: invariant 2).
        return;
    };
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
/// not redelivered to another worker while this one is at it. `None` when
/// the worker gave up on it while stopping: the message is handed back,
/// for another worker to take at once.
async fn at_work<T>(
    message: &jetstream::Message,
    work: impl std::future::Future<Output = T>,
    stop: &Stop,
) -> Option<T> {
    tokio::pin!(work);
    let mut ticks = tokio::time::interval(ACK_WAIT / 3);
    ticks.tick().await;
    loop {
        tokio::select! {
            biased;
            done = &mut work => return Some(done),
            () = stop.reached(Phase::GivingUp) => {
                hand_back(message).await;
                return None;
            }
            _ = ticks.tick() => { let _ = message.ack_with(AckKind::Progress).await; }
        }
    }
}

/// Gives `message` back to JetStream for another worker, at once.
pub(crate) async fn hand_back(message: &jetstream::Message) {
    if let Err(e) = message.ack_with(AckKind::Nak(None)).await {
        warn!(error = %e, "handing a message back failed; it comes back after the ack deadline");
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

async fn carry_out(worker: &Worker, message: jetstream::Message, stop: &Stop) {
    let work: Work = match rmp_serde::from_slice(&message.payload) {
        Ok(work) => work,
        Err(e) => {
            warn!(error = %e, "unreadable work dropped");
            let _ = message.ack_with(AckKind::Term).await;
            return;
        }
    };
    // Dispatch retries can outlast the ack deadline.
    match at_work(&message, worker.handle(work), stop).await {
        Some(Handled::Recorded) => {}
        Some(Handled::Unrecorded) => {
            // Dispatch again later: the outcome is not stored anywhere.
            let _ = message
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            return;
        }
        Some(Handled::HandedBack) => return hand_back(&message).await,
        // Handed back already.
        None => return,
    }
    // A plain ack, as for requests: lost, it brings the work back, and the
    // call, no longer waiting for dispatch, is not sent again (or the tool
    // sees it twice, which RAP allows; the agent never sees two results).
    if let Err(e) = message.ack().await {
        warn!(error = %e, "acking work failed; it may be dispatched again");
    }
}
