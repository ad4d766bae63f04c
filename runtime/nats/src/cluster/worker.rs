//! A worker's loop: it carries out the commits that hand calls to dispatch
//! (`ferry.<p>.log.*.d`, see [`super::streams`]) and the calls of limited
//! toolsets given room after they waited (`ferry.<p>.ready.*.*`, see
//! [`super::lanes`]). A commit is acked only after
//! each of its calls' outcomes is stored (or the call is found no longer
//! waiting), so a worker killed at any point leaves it to another worker;
//! the state machine makes the repeat harmless (invariants 2 and 4). The
//! loop ends when the worker stops ([`super::stop`]).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use ferry_dispatch::{Handled, Worker};
use ferry_proto::bus::Work;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tracing::{info, warn};

use super::pull::Puller;
use super::stop::{Phase, Stop};
use super::streams::{ACK_WAIT, MAX_ACK_PENDING};
use super::subjects;
use crate::engine::Engine;
use crate::store::codec;
use crate::store::log::Commit;

/// Dispatch work a worker keeps in hand per attempt it may have in flight.
const IN_HAND_PER_ATTEMPT: usize = 4;

/// Carries out dispatch work, forever (through NATS outages). A message
/// waiting out a dispatch backoff stays in hand, so a bound of one per
/// attempt in flight would let one failing tool's calls stall every other
/// call: a worker keeps [`IN_HAND_PER_ATTEMPT`] times `max_in_flight`
/// (its dispatcher bounds the attempts themselves), and never so many that
/// the other workers sharing the consumer's `max_ack_pending` get nothing.
/// It takes the commits `pullers` bring (one per partition, sharing that
/// room), until the worker stops (whose dispatcher the caller stops with
/// it); `engine` makes each call's invocation.
pub async fn dispatch_work(
    engine: Arc<Engine>,
    worker: Worker,
    pullers: Vec<Puller>,
    max_in_flight: usize,
    stop: Stop,
) {
    let in_hand = max_in_flight
        .saturating_mul(IN_HAND_PER_ATTEMPT)
        .min(MAX_ACK_PENDING / 4);
    let share = (in_hand / pullers.len().max(1)).max(1);
    let loops = pullers.into_iter().map(|puller| {
        let carry_out_one = {
            let (engine, worker, stop) = (engine.clone(), worker.clone(), stop.clone());
            move |message| {
                let (engine, worker, stop) = (engine.clone(), worker.clone(), stop.clone());
                async move { carry_out(&engine, &worker, message, &stop).await }
            }
        };
        let stop = stop.clone();
        async move { consume(puller, "work", share, carry_out_one, &stop).await }
    });
    futures::future::join_all(loops).await;
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

/// What one message hands to dispatch: the work to do now, and the calls
/// of limited lanes among it (`(group_id, id)`), which leave their lane
/// afterwards if they have ended.
#[derive(Default)]
struct Taken {
    work: Vec<Work>,
    limited: Vec<(String, String)>,
    /// A call of a limited lane could not enter it (NATS away): the
    /// message comes back later for it.
    unentered: bool,
}

/// The calls a commit of `ferry.<p>.log.<g>.d` hands to dispatch, each
/// entered in its lane first when its toolset limits how many run at once
/// (one without room waits there, and comes back as a `ready` message).
async fn work_in(engine: &Engine, message: &jetstream::Message) -> Result<Taken, String> {
    let group_id = subjects::group_of(&message.subject).ok_or("not a thread's subject")?;
    if subjects::is_ready(&message.subject) {
        let id = subjects::call_id_of(&message.subject).ok_or("not a call's subject")?;
        let mut taken = Taken::default();
        match engine.ready_work(&group_id, &id).await {
            Ok(work) => taken.work.extend(work),
            Err(e) => {
                warn!(group_id, id, error = %e, "could not read a call given room; taking it again later");
                taken.unentered = true;
            }
        }
        taken.limited.push((group_id, id));
        return Ok(taken);
    }
    let commit: Commit = codec::decode(&message.payload).map_err(|e| e.to_string())?;
    let seq = message.info().map_or(0, |i| i.stream_sequence);
    let mut taken = Taken::default();
    for call in commit.dispatches() {
        let Some(work) = engine.work_for(&group_id, call, commit.meta.ancestors.as_deref()) else {
            continue;
        };
        if !engine.in_limited_lane(call) {
            taken.work.push(work);
            continue;
        }
        match engine.enter_lane(&group_id, call, seq).await {
            Ok(true) => {
                taken.work.push(work);
                taken.limited.push((group_id.clone(), call.id.clone()));
            }
            // It waits in its lane, which hands it out again.
            Ok(false) => {}
            Err(e) => {
                warn!(group_id, id = call.id, error = %e, "could not enter a call in its toolset's lane; taking it again later");
                taken.unentered = true;
            }
        }
    }
    Ok(taken)
}

async fn carry_out(engine: &Engine, worker: &Worker, message: jetstream::Message, stop: &Stop) {
    let taken = match work_in(engine, &message).await {
        Ok(taken) => taken,
        Err(e) => {
            warn!(subject = %message.subject, error = %e, "unreadable commit dropped");
            let _ = message.ack_with(AckKind::Term).await;
            return;
        }
    };
    // Dispatch retries can outlast the ack deadline. A commit hands out
    // one call as a rule; several go out at once.
    let all = futures::future::join_all(taken.work.into_iter().map(|w| worker.handle(w)));
    let handled = match at_work(&message, all, stop).await {
        Some(handled) => handled,
        // Handed back already.
        None => return,
    };
    for (group_id, id) in &taken.limited {
        if let Err(e) = engine.after_lane_dispatch(group_id, id).await {
            // The workers' sweep finds it ended and leaves for it.
            warn!(group_id, id, error = %e, "could not leave an ended call's lane");
        }
    }
    if handled.contains(&Handled::HandedBack) {
        return hand_back(&message).await;
    }
    if handled.contains(&Handled::Unrecorded) || taken.unentered {
        // Dispatch again later: an outcome is not stored anywhere. The
        // calls recorded meanwhile are no longer waiting, and are skipped.
        let _ = message
            .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
            .await;
        return;
    }
    // A plain ack: lost, it brings the commit back, and its calls, no
    // longer waiting for dispatch, are not sent again (or the tool sees
    // one twice, which RAP allows; the agent never sees two results).
    if let Err(e) = message.ack().await {
        warn!(error = %e, "acking work failed; it may be dispatched again");
    }
}
