//! Answering a tool's `user_choice`: the answer is recorded durably, then
//! POSTed to the tool's `response_url` (retried; re-sent after a restart
//! until the tool accepts it).

use std::sync::Arc;

use tracing::{info, warn};

use super::{Engine, Error};
use crate::thread::{Answer, CallRecord, ChoiceAnswer, Command};

/// Delivery attempts per try (each restart tries again).
const DELIVERY_ATTEMPTS: u32 = 5;

impl Engine {
    /// Records the user's answer and starts delivering it to the tool.
    pub async fn answer_choice(
        self: &Arc<Self>,
        group_id: &str,
        id: &str,
        answer: Answer,
    ) -> Result<CallRecord, Error> {
        let executed = self
            .execute(
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

    /// Sends an answer in the background and records its delivery.
    pub(crate) fn deliver(self: &Arc<Self>, group_id: &str, id: &str, answer: ChoiceAnswer) {
        let engine = self.clone();
        let (group_id, id) = (group_id.to_owned(), id.to_owned());
        tokio::spawn(async move {
            let delivered = engine
                .notifier
                .deliver_choice(&answer.response_url, &id, answer.index, DELIVERY_ATTEMPTS)
                .await;
            if !delivered {
                warn!(
                    group_id,
                    call_id = id,
                    "the tool did not take the choice; retried at next start"
                );
                return;
            }
            let command = Command::ChoiceDelivered { id: id.clone() };
            if let Err(e) = engine.execute(&group_id, command).await {
                warn!(group_id, call_id = id, error = %e, "could not record the choice's delivery");
            }
        });
    }
}
