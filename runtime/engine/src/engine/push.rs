//! Push consumers: one loop per consumer POSTs each event handed out to
//! its receiver, signed the Standard Webhooks way (`core/webhook.rs`); a
//! 2xx acknowledges it. A receiver that fails pauses the whole consumer
//! (the wait doubles from half a second up to `Config::push_max_backoff`),
//! since it is one receiver: its events are tried again after the pause,
//! still one per thread at a time and so in order, until their
//! `max_age_secs` passes and they are dead-lettered.

use std::sync::Arc;
use std::time::Duration;

use super::{now, Engine};
use crate::delivery::Delivered;
use crate::webhook;

/// Events one round hands out and POSTs at once (each of another thread):
/// enough that a round's one acknowledgement (a durable write) serves
/// many deliveries.
const ROUND: usize = 64;
/// The first pause after a failure.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// How often every consumer's lag is counted for the gauges.
const LAG_EVERY: Duration = Duration::from_secs(15);
/// Longest one POST may take.
const POST_TIMEOUT: Duration = Duration::from_secs(30);

impl Engine {
    /// Delivers every push consumer there is: at start, once the engine is
    /// shared.
    pub fn start_pushing(self: &Arc<Self>) {
        let Some(consumers) = self.consumers.get() else {
            return;
        };
        for live in consumers.all() {
            if live.spec().push.is_some() {
                self.push_to(&live.spec().name);
            }
        }
    }

    /// Counts every consumer's lag every [`LAG_EVERY`], so that the
    /// `ferry_consumer_pending` and `ferry_consumer_oldest_pending_seconds`
    /// gauges stay current without anyone asking.
    pub fn start_counting_lag(self: &Arc<Self>) {
        let Some(consumers) = self.consumers.get().cloned() else {
            return;
        };
        let engine = self.clone();
        tokio::spawn(async move {
            let mut stopping = engine.stopping.subscribe();
            let mut every = tokio::time::interval(LAG_EVERY);
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = stopping.changed() => return,
                }
                for live in consumers.all() {
                    if let Err(e) = consumers.view(&*engine.store, &live, now(), false).await {
                        tracing::debug!(consumer = live.spec().name, error = %e, "could not count a consumer's lag");
                    }
                }
            }
        });
    }

    /// Starts the loop of push consumer `name`, unless it runs.
    pub(crate) fn push_to(self: &Arc<Self>, name: &str) {
        if !self
            .pushing
            .lock()
            .expect("pushing lock")
            .insert(name.to_owned())
        {
            return;
        }
        let engine = self.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            engine.push_loop(&name).await;
            engine.pushing.lock().expect("pushing lock").remove(&name);
        });
    }

    async fn push_loop(&self, name: &str) {
        let Some(consumers) = self.consumers.get().cloned() else {
            return;
        };
        let mut stopping = self.stopping.subscribe();
        let mut pause = Duration::ZERO;
        loop {
            if *stopping.borrow() {
                return;
            }
            // Deleted: the loop ends (a consumer made again under the name
            // starts its own).
            let Ok(live) = consumers.get(name) else {
                return;
            };
            let Some(push) = live.spec().push.clone() else {
                return;
            };
            let Ok(key) = webhook::secret_key(&push.secret) else {
                return;
            };
            let woken = live.woken.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let round = match consumers
                .take(&*self.store, &live, ROUND, now().as_millis())
                .await
            {
                Ok(round) => round,
                Err(e) => {
                    tracing::warn!(consumer = name, error = %e, "push consumer could not read its events");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if round.is_empty() {
                let back = live
                    .next_overdue_ms()
                    .await
                    .map(|at| Duration::from_millis(at.saturating_sub(now().as_millis())));
                tokio::select! {
                    () = &mut woken => {}
                    () = tokio::time::sleep(back.unwrap_or(Duration::from_secs(3600))) => {}
                    _ = stopping.changed() => {}
                }
                continue;
            }
            let sent = futures::future::join_all(
                round
                    .iter()
                    .map(|d| self.post_event(name, &push.url, &key, d)),
            )
            .await;
            let acks: Vec<(String, u64)> = round
                .iter()
                .zip(&sent)
                .filter(|(_, ok)| **ok)
                .map(|(d, _)| (d.event.group_id.clone(), d.event.seq))
                .collect();
            if !acks.is_empty() {
                if let Err(e) = consumers.ack(&live, &acks).await {
                    // Not durable: they go out again, and the receiver
                    // drops the repeats by `webhook-id`.
                    tracing::warn!(consumer = name, error = %e, "could not record deliveries");
                }
            }
            if acks.len() == round.len() {
                pause = Duration::ZERO;
                continue;
            }
            pause = (pause * 2).clamp(FIRST_PAUSE, self.config.push_max_backoff.max(FIRST_PAUSE));
            let until = now().as_millis().saturating_add(pause.as_millis() as u64);
            for (delivered, _) in round.iter().zip(&sent).filter(|(_, ok)| !**ok) {
                let event = &delivered.event;
                if let Err(e) = consumers
                    .retry_later(&live, &event.group_id, event.seq, until)
                    .await
                {
                    // It goes out again at its ack_wait instead.
                    tracing::debug!(consumer = name, error = %e, "could not hold a failed push back");
                }
            }
            tracing::debug!(consumer = name, ?pause, "push receiver failed; pausing");
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = stopping.changed() => {}
            }
        }
    }

    /// POSTs one event; whether the receiver took it (a 2xx).
    async fn post_event(&self, name: &str, url: &str, key: &[u8], delivered: &Delivered) -> bool {
        let event = &delivered.event;
        let Ok(body) = serde_json::to_vec(delivered) else {
            return false;
        };
        if let Err(refused) = self.outbound.check_str(url) {
            tracing::warn!(consumer = name, "push not sent: {refused}");
            return false;
        }
        let id = webhook::message_id(name, &event.group_id, event.seq);
        let timestamp = now().as_millis() / 1000;
        let signature = webhook::signature(key, &id, timestamp, &body);
        let sent = self
            .outbound
            .client()
            .post(url)
            .timeout(POST_TIMEOUT)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => true,
            Ok(response) => {
                tracing::debug!(consumer = name, group_id = event.group_id, seq = event.seq, status = %response.status(), "push receiver refused an event");
                false
            }
            Err(e) => {
                tracing::debug!(consumer = name, group_id = event.group_id, seq = event.seq, error = %e.without_url(), "push failed");
                false
            }
        }
    }
}
