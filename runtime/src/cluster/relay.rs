//! The runtime node's side of a request: check what can be checked
//! locally, journal the request in the outbox (durable), relay it to
//! `ferry.in.<g>`, and wait for the worker's answer. When NATS or the
//! workers do not answer in time, the request is still durable and will be
//! applied: the node answers `202` ("journaled") instead of guessing.
//!
//! A thread's requests are relayed one at a time: the next waits until a
//! worker answered the one before ([`InFlight`]), so workers that share
//! the inbox apply them in the order this node journaled them, also when
//! they were journaled during an outage and relayed all at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use async_nats::HeaderMap;
use async_trait::async_trait;
use axum::http::StatusCode;
use ferry_proto::api::SubmitCall;
use futures::StreamExt;
use tokio::sync::{oneshot, Notify};
use tracing::{debug, info, warn};

use super::outbox::{Entry, Outbox};
use super::provisional::{self, Provisional};
use super::{streams, subjects};
use crate::engine::requests::{Refusal, Reply, Request};
use crate::engine::{Engine, Error};
use crate::http::{ApiError, Perform};
use crate::thread::Rejection;

/// The header naming the subject a worker sends its answer to.
pub const REPLY_HEADER: &str = "Ferry-Reply";

/// The header naming a relayed request (`<node>-<outbox number>`): the
/// worker applying it gives its commits message ids derived from it, so a
/// request applied twice is stored once (`store::jetstream::applying`).
pub const REQUEST_HEADER: &str = "Ferry-Request";

/// JetStream's dedupe header.
const NATS_MSG_ID: &str = "Nats-Msg-Id";

/// How many outbox entries one relay round publishes before awaiting acks.
const RELAY_BATCH: usize = 256;

/// How long a thread's relayed request may stay unanswered before the
/// thread's next request is relayed anyway (a request no worker could
/// read, an answer lost): order while answers come, progress when not.
const ORDER_WAIT: Duration = Duration::from_secs(15);

/// How many times a request's bytes may appear in the commit it becomes:
/// a result's text sits in its event and in the call's record, each as
/// `text` and as `content`.
const COMMIT_GROWTH: usize = 4;

type Answer = Result<Reply, Refusal>;

pub struct Relay {
    engine: Arc<Engine>,
    outbox: Arc<Outbox>,
    js: jetstream::Context,
    /// Stable across restarts: with the entry number it makes `Nats-Msg-Id`.
    node: String,
    /// This process's reply subject prefix.
    replies: String,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    in_flight: Mutex<InFlight>,
    /// Submissions journaled and not answered yet: another body under one
    /// of their ids is refused here, not answered a provisional `202`.
    provisional: Mutex<Provisional>,
    /// Entries this run published whose ack did not come: a copy may be
    /// stored, with this run's reply subject, and its answer will come.
    unacked: Mutex<std::collections::HashSet<u64>>,
    wake: Notify,
    reply_wait: Duration,
}

impl Relay {
    /// Starts the reply listener and the relay loop (which first relays
    /// whatever a previous run of the node left journaled).
    pub async fn start(
        engine: Arc<Engine>,
        outbox: Arc<Outbox>,
        client: async_nats::Client,
        node: String,
        reply_wait: Duration,
    ) -> Result<Arc<Self>, async_nats::SubscribeError> {
        let run = uuid::Uuid::new_v4().simple().to_string();
        // Submissions a previous run relayed, or journaled and did not
        // relay, without an answer are still provisional.
        let mut provisional = Provisional::default();
        let mut evicted = vec![];
        for (number, claim) in outbox.claims() {
            evicted.extend(provisional.restore(number, claim));
        }
        for (number, entry) in outbox.entries() {
            if let Request::Submit { call, .. } = &entry.request {
                let claimed = provisional.claim(number, call, provisional::fingerprint(call));
                evicted.extend(claimed.ok().flatten());
            }
        }
        for number in evicted {
            if let Err(e) = outbox.forget_claim(number) {
                warn!(error = %e, "forgetting a claim failed");
            }
        }
        let replies = format!("{}.{run}", subjects::REPLY);
        let mut answers = client.subscribe(format!("{replies}.*")).await?;
        let relay = Arc::new(Self {
            engine,
            outbox,
            js: jetstream::new(client),
            node,
            replies,
            waiting: Mutex::default(),
            in_flight: Mutex::default(),
            provisional: Mutex::new(provisional),
            unacked: Mutex::default(),
            wake: Notify::new(),
            reply_wait,
        });
        let weak = Arc::downgrade(&relay);
        tokio::spawn(async move {
            while let Some(message) = answers.next().await {
                let Some(relay) = weak.upgrade() else { return };
                let number = message
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|n| n.parse().ok());
                let answer = rmp_serde::from_slice::<Answer>(&message.payload);
                if let Some(n) = number {
                    relay.finish(n);
                }
                let waiter = number.and_then(|n| relay.waiting.lock().expect("lock").remove(&n));
                match (waiter, answer) {
                    (Some(waiter), Ok(answer)) => drop(waiter.send(answer)),
                    (_, Err(e)) => warn!(error = %e, "unreadable answer from a worker"),
                    (None, _) => {}
                }
            }
        });
        tokio::spawn(relay.clone().relay_loop());
        Ok(relay)
    }

    /// Refuses (413) a request NATS could not carry, relayed or as the
    /// commit it becomes (up to [`COMMIT_GROWTH`] times its size).
    /// Journaled anyway, it would wait in the outbox, or on a worker,
    /// forever.
    /// `size` is the journaled entry's, a little over the relayed request's.
    fn check_size(&self, size: usize) -> Result<(), ApiError> {
        let max = self.js.client().max_payload();
        if max == 0 || size.saturating_mul(COMMIT_GROWTH) <= max {
            return Ok(());
        }
        Err(too_large(size, max))
    }

    /// Entries not yet relayed.
    pub fn backlog(&self) -> usize {
        self.outbox.len()
    }

    async fn relay_loop(self: Arc<Self>) {
        let mut pause = Duration::from_millis(50);
        loop {
            // A thread's next request only once its previous one was
            // answered; other threads' requests pass waiting ones.
            let now = Instant::now();
            let busy = {
                let mut in_flight = self.in_flight.lock().expect("lock");
                in_flight.expire(now);
                in_flight.by_thread.clone()
            };
            // One entry per thread, and none of a thread whose earlier
            // request is still unanswered (the read holds no lock).
            let mut picked = std::collections::HashSet::new();
            let batch = self.outbox.pending(RELAY_BATCH, |number, group_id| {
                let waits = busy
                    .get(group_id)
                    .is_some_and(|(earlier, _)| *earlier != number);
                !waits && picked.insert(group_id.to_owned())
            });
            if let Ok(batch) = &batch {
                let mut in_flight = self.in_flight.lock().expect("lock");
                for (number, entry) in batch {
                    in_flight.take(&entry.group_id, *number, now);
                }
            }
            let batch = match batch {
                Ok(batch) => batch,
                Err(e) => {
                    warn!(error = %e, "reading the outbox failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            // Nothing to relay, or every entry waits for an answer to its
            // thread's previous one: a new entry or an answer wakes us.
            if batch.is_empty() {
                let _ = tokio::time::timeout(Duration::from_secs(1), self.wake.notified()).await;
                continue;
            }
            if self.relay(batch).await {
                pause = Duration::from_millis(50);
            } else {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }

    /// A thread's request was answered, or will never be: the thread's
    /// next request may go.
    fn release(&self, number: u64) {
        if self.in_flight.lock().expect("lock").release(number) {
            self.wake.notify_one();
        }
    }

    /// No answer to entry `number` will come (or it came): its thread's
    /// next request may go, and its call's id is the worker's to decide
    /// again.
    fn finish(&self, number: u64) {
        self.release(number);
        // Under the lock, so that a claim is forgotten after it was kept.
        let mut provisional = self.provisional.lock().expect("lock");
        if provisional.settle(number) {
            self.forget_claim(number);
        }
    }

    fn forget_claim(&self, number: u64) {
        if let Err(e) = self.outbox.forget_claim(number) {
            warn!(number, error = %e, "forgetting a settled claim failed");
        }
    }

    /// Entry `number` is in the inbox at `seq`: a submission's claim on
    /// its id is kept on disk until its answer, so a restart, which loses
    /// the answers owed to the run before, keeps it.
    fn relayed(&self, number: u64, seq: u64) {
        let mut provisional = self.provisional.lock().expect("lock");
        if let Some(claim) = provisional.relayed(number, seq) {
            if let Err(e) = self.outbox.keep_claim(number, &claim) {
                warn!(number, error = %e, "keeping a relayed claim failed");
            }
        }
    }

    /// The name of entry `number` in NATS (`Nats-Msg-Id`, `Ferry-Request`).
    fn request_name(&self, number: u64) -> String {
        format!("{}-{number}", self.node)
    }

    /// Claims `call`'s id for entry `number`, or refuses it (`409`) while
    /// another body under it waits for a worker: journaled here, or
    /// relayed and still in the inbox. One relayed that left the inbox
    /// was decided by a worker whose answer did not reach this run: the
    /// id is the worker's to decide again.
    async fn claim(&self, number: u64, call: &SubmitCall) -> Result<(), ApiError> {
        let fingerprint = provisional::fingerprint(call);
        let mut held = match self.try_claim(number, call, fingerprint) {
            Ok(()) => return Ok(()),
            Err(held) => held,
        };
        if let Some(seq) = held.relayed {
            if self.left_the_inbox(held.holder, seq).await {
                self.finish(held.holder);
                match self.try_claim(number, call, fingerprint) {
                    Ok(()) => return Ok(()),
                    Err(again) => held = again,
                }
            }
        }
        let id = call.id.clone().unwrap_or_default();
        info!(group_id = %call.group_id, id = %id, holder = held.holder, "submission refused: another body under its id is journaled and not applied yet");
        Err(Error::Rejected(Rejection::Conflict(id)).into())
    }

    fn try_claim(
        &self,
        number: u64,
        call: &SubmitCall,
        fingerprint: provisional::Fingerprint,
    ) -> Result<(), provisional::Conflict> {
        let mut provisional = self.provisional.lock().expect("lock");
        if let Some(evicted) = provisional.claim(number, call, fingerprint)? {
            self.forget_claim(evicted);
        }
        Ok(())
    }

    /// Whether entry `number`, relayed at `seq`, is known to be gone from
    /// the inbox (a worker acked it). Not when NATS cannot tell.
    async fn left_the_inbox(&self, number: u64, seq: u64) -> bool {
        if self.js.client().connection_state() != async_nats::connection::State::Connected {
            return false;
        }
        let Ok(inbox) = self.js.get_stream_no_info(streams::INBOX_STREAM).await else {
            return false;
        };
        match inbox.get_raw_message(seq).await {
            // Another message under that number: the stream was made anew.
            Ok(message) => message
                .headers
                .get(NATS_MSG_ID)
                .is_none_or(|id| id.as_str() != self.request_name(number)),
            Err(e) => e.kind() == stream::RawMessageErrorKind::NoMessageFound,
        }
    }

    /// Publishes a batch (its entries are their threads' requests in
    /// flight, see [`InFlight`]) and forgets each entry JetStream
    /// acknowledged; false when NATS failed (the rest stay for the next
    /// round).
    async fn relay(&self, batch: Vec<(u64, Entry)>) -> bool {
        let mut acks = Vec::with_capacity(batch.len());
        let mut failed = false;
        let mut entries = batch.into_iter();
        for (number, entry) in entries.by_ref() {
            let mut headers = HeaderMap::new();
            let id = self.request_name(number);
            headers.insert(NATS_MSG_ID, id.as_str());
            headers.insert(REQUEST_HEADER, id.as_str());
            // The answer comes to this run of the node, whichever run
            // journaled the request: it releases the thread's next one.
            headers.insert(REPLY_HEADER, format!("{}.{number}", self.replies).as_str());
            let body = rmp_serde::to_vec_named(&entry.request).expect("requests serialize");
            let body_len = body.len();
            match self
                .js
                .publish_with_headers(subjects::inbox(&entry.group_id), headers, body.into())
                .await
            {
                Ok(ack) => acks.push((number, ack)),
                Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                    // Never relayable (journaled before the size check, or
                    // NATS's limit shrank): refuse it rather than let it
                    // hold back every entry after it.
                    warn!(number, error = %e, "journaled request too large for NATS dropped");
                    self.finish(number);
                    if let Err(e) = self.outbox.remove(number) {
                        warn!(error = %e, "forgetting a too large entry failed");
                        break;
                    }
                    if let Some(waiter) = self.waiting.lock().expect("lock").remove(&number) {
                        let refused = too_large(body_len, self.js.client().max_payload());
                        let _ = waiter.send(Err(refused.into()));
                    }
                }
                Err(e) => {
                    debug!(error = %e, "relay publish failed");
                    self.release(number);
                    failed = true;
                    break;
                }
            }
        }
        // Entries a failure left unpublished free their threads again.
        for (number, _) in entries {
            self.release(number);
        }
        let mut all = !failed;
        for (number, ack) in acks {
            match ack.await {
                Ok(ack) => {
                    // A repeat: of a copy this run published (its answer
                    // will come), or of one an earlier run did (applied,
                    // or to be, without an answer to us: its thread's next
                    // request may go, and its claim holds while the copy
                    // is in the inbox, at the sequence the ack gives).
                    let ours = self.unacked.lock().expect("lock").remove(&number);
                    if ack.duplicate && !ours {
                        self.release(number);
                    }
                    self.relayed(number, ack.sequence);
                    if let Err(e) = self.outbox.remove(number) {
                        warn!(error = %e, "forgetting a relayed entry failed");
                    }
                }
                Err(e) => {
                    debug!(error = %e, "relay not acknowledged");
                    self.unacked.lock().expect("lock").insert(number);
                    self.release(number);
                    all = false;
                }
            }
        }
        // Forgotten for good before the next round: a node that crashed
        // with removals only in memory, and restarted after the inbox's
        // dedupe window, would relay (and apply) them again.
        if let Err(e) = self.outbox.flush().await {
            warn!(error = %e, "making the relayed entries' removal durable failed");
        }
        all
    }
}

#[async_trait]
impl Perform for Relay {
    async fn perform(&self, request: Request) -> Result<Reply, ApiError> {
        self.perform_within(request, self.reply_wait).await
    }

    async fn perform_within(
        &self,
        mut request: Request,
        wait: Duration,
    ) -> Result<Reply, ApiError> {
        if let Err(refused) = self.engine.precheck(&mut request) {
            // A retry of a call accepted before its toolset changed is
            // answered by that call (the worker compares the bodies).
            if !self.engine.retries_a_call(&request, &refused).await {
                return Err(refused.into());
            }
        }
        let group_id = self.engine.thread_of(&request)?;
        let number = self.outbox.next_number().map_err(unavailable)?;
        let entry = Entry {
            group_id,
            reply_to: Some(format!("{}.{number}", self.replies)),
            request,
        };
        let bytes = Outbox::encode(&entry);
        self.check_size(bytes.len())?;
        if let Request::Submit { call, .. } = &entry.request {
            self.claim(number, call).await?;
        }
        let (answered, answer) = oneshot::channel();
        self.waiting.lock().expect("lock").insert(number, answered);
        // However this ends (answered, timed out, refused, or dropped with
        // its client's connection), the waiter goes.
        let _unwait = Unwait {
            waiting: &self.waiting,
            number,
        };
        if let Err(e) = self.outbox.append(number, bytes).await {
            self.finish(number);
            return Err(unavailable(e));
        }
        self.wake.notify_one();
        match tokio::time::timeout(wait, answer).await {
            Ok(Ok(Ok(reply))) => Ok(reply),
            Ok(Ok(Err(refusal))) => Err(refusal.into()),
            _ => {
                let id = match &entry.request {
                    Request::Submit { call, .. } => call.id.clone(),
                    _ => None,
                };
                Ok(Reply::Journaled { id })
            }
        }
    }
}

/// Per thread, the relayed request not yet answered. The thread's next
/// request waits for it (at most [`ORDER_WAIT`]).
#[derive(Default)]
struct InFlight {
    by_thread: HashMap<String, (u64, Instant)>,
    by_number: HashMap<u64, String>,
}

impl InFlight {
    /// Whether request `number` of `group_id` may be relayed now; if so,
    /// it is the thread's request in flight.
    fn take(&mut self, group_id: &str, number: u64, now: Instant) -> bool {
        if let Some((earlier, since)) = self.by_thread.get(group_id) {
            if *earlier != number && now.duration_since(*since) < ORDER_WAIT {
                return false;
            }
            let earlier = *earlier;
            self.by_number.remove(&earlier);
        }
        self.by_thread.insert(group_id.to_owned(), (number, now));
        self.by_number.insert(number, group_id.to_owned());
        true
    }

    /// Forgets requests in flight for [`ORDER_WAIT`] or longer, whose
    /// threads are free again.
    fn expire(&mut self, now: Instant) {
        let by_number = &mut self.by_number;
        self.by_thread.retain(|_, (number, since)| {
            let keep = now.duration_since(*since) < ORDER_WAIT;
            if !keep {
                by_number.remove(number);
            }
            keep
        });
    }

    /// Request `number` was answered (or never will be); whether it was
    /// its thread's request in flight.
    fn release(&mut self, number: u64) -> bool {
        let Some(group_id) = self.by_number.remove(&number) else {
            return false;
        };
        if self
            .by_thread
            .get(&group_id)
            .is_some_and(|(n, _)| *n == number)
        {
            self.by_thread.remove(&group_id);
        }
        true
    }
}

/// Removes a request's waiter from the relay when dropped.
struct Unwait<'a> {
    waiting: &'a Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    number: u64,
}

impl Drop for Unwait<'_> {
    fn drop(&mut self) {
        self.waiting.lock().expect("lock").remove(&self.number);
    }
}

fn too_large(size: usize, max: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!(
            "the request is {size} bytes; with what its commit repeats it would exceed NATS's \
             max_payload of {max} bytes (at most {} bytes per request here): raise max_payload \
             in the NATS configuration",
            max / COMMIT_GROWTH
        ),
    )
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("the request could not be journaled: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_next_request_waits_for_the_answer_to_the_one_before() {
        let mut in_flight = InFlight::default();
        let now = Instant::now();
        assert!(in_flight.take("g", 1, now));
        assert!(!in_flight.take("g", 2, now), "g waits for 1");
        assert!(in_flight.take("h", 3, now), "other threads do not");
        assert!(in_flight.take("g", 1, now), "1 again (a failed publish)");
        assert!(in_flight.release(1));
        assert!(!in_flight.release(1), "answered once");
        assert!(in_flight.take("g", 2, now));
        // An answer that never comes holds the thread for ORDER_WAIT only.
        assert!(!in_flight.take("g", 4, now + ORDER_WAIT / 2));
        assert!(in_flight.take("g", 4, now + ORDER_WAIT));
        assert!(!in_flight.release(2), "2 was given up on");
        assert!(in_flight.release(4));
        // Threads whose answers never come are forgotten.
        in_flight.expire(now + ORDER_WAIT);
        assert!(in_flight.by_thread.is_empty() && in_flight.by_number.is_empty());
    }
}
