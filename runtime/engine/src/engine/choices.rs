//! Answering a tool's `user_choice`: the answer is recorded durably, then
//! POSTed to the tool's `response_url` until the tool accepts it (or
//! refuses it with a 4xx), through the tool's outages, without a restart.

use std::sync::Arc;
use std::time::Duration;

use ferry_dispatch::ChoiceDelivery;
use tracing::{info, warn};

use super::{Engine, Error};
use crate::identity::Identity;
use crate::thread::{Answer, CallRecord, ChoiceAnswer, Command};

/// The first pause between deliveries of one answer; it doubles up to
/// [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);

impl Engine {
    /// Records the user's answer and starts delivering it to the tool.
    pub async fn answer_choice(
        self: &Arc<Self>,
        by: &Identity,
        group_id: &str,
        id: &str,
        answer: Answer,
    ) -> Result<CallRecord, Error> {
        let executed = self
            .execute_as(
                by,
                group_id,
                Command::Choose {
                    id: id.into(),
                    answer,
                },
            )
            .await?;
        let call = executed.state.calls[id].clone();
        if let Some(answer) = call.undelivered_choice.clone() {
            info!(group_id, call_id = id, index = answer.index, "choice made");
            self.deliver(group_id, id, answer);
        }
        Ok(call)
    }

    /// Delivers an answer in the background and records how it went. One
    /// delivery per call at a time in this process: the recovery sweep asks
    /// again for answers still owed, and must not start a second. A newer
    /// answer that arrives meanwhile wakes the one under way from its
    /// pause, which then ends, and is delivered next (the same answer
    /// asked again leaves the pause alone).
    pub(crate) fn deliver(self: &Arc<Self>, group_id: &str, id: &str, answer: ChoiceAnswer) {
        let key = (group_id.to_owned(), id.to_owned());
        let woken = {
            let mut delivering = self.delivering.lock().expect("lock");
            if let Some((under_way, woken)) = delivering.get(&key) {
                if *under_way != answer {
                    woken.notify_one();
                }
                return;
            }
            let woken = Arc::new(tokio::sync::Notify::new());
            delivering.insert(key.clone(), (answer.clone(), woken.clone()));
            woken
        };
        let engine = self.clone();
        tokio::spawn(async move {
            let (group_id, id) = (&key.0, &key.1);
            let command = engine.delivery(group_id, id, &answer, &woken).await;
            if let Some(command) = command {
                if let Err(e) = engine.execute(group_id, command).await {
                    warn!(group_id, call_id = id, error = %e, "could not record how the choice's delivery went");
                }
            }
            engine.delivering.lock().expect("lock").remove(&key);
            // The user may have answered a newer prompt while this answer
            // held the call's place.
            if let Ok(Some(call)) = engine.store.call(group_id, id).await {
                if let Some(newer) = call.undelivered_choice.filter(|a| *a != answer) {
                    engine.deliver(group_id, id, newer);
                }
            }
        });
    }

    /// Sends `answer` until the tool accepts or refuses it; `None` when the
    /// call stopped owing it meanwhile (cancelled, or delivered by another
    /// worker).
    async fn delivery(
        &self,
        group_id: &str,
        id: &str,
        answer: &ChoiceAnswer,
        woken: &tokio::sync::Notify,
    ) -> Option<Command> {
        let mut delay = FIRST_RETRY_DELAY;
        loop {
            let sent = self
                .notifier
                .deliver_choice(&answer.response_url, id, answer.index)
                .await;
            match sent {
                ChoiceDelivery::Accepted => {
                    return Some(Command::ChoiceDelivered {
                        id: id.into(),
                        answer: answer.clone(),
                    });
                }
                ChoiceDelivery::Refused(status) => {
                    warn!(
                        group_id,
                        call_id = id,
                        status,
                        "the tool refused the choice"
                    );
                    return Some(Command::ChoiceRefused {
                        id: id.into(),
                        answer: answer.clone(),
                        status,
                    });
                }
                ChoiceDelivery::Failed => {}
            }
            // A newer answer ends the pause early.
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = woken.notified() => {}
            }
            delay = (delay * 2).min(MAX_RETRY_DELAY);
            // A store error leaves the answer owed: keep trying.
            if let Ok(call) = self.store.call(group_id, id).await {
                if call.and_then(|c| c.undelivered_choice).as_ref() != Some(answer) {
                    return None;
                }
            }
        }
    }
}
