//! The engine as the worker's [`Outcomes`]: dispatch results go through the
//! state machine like everything else.

use std::time::Duration;

use async_trait::async_trait;
use ferry_dispatch::Outcomes;
use tracing::warn;

use super::{Engine, Error};
use crate::thread::Command;

#[async_trait]
impl Outcomes for Engine {
    async fn still_wanted(&self, group_id: &str, id: &str) -> Option<u32> {
        if self.acks.waits_for(group_id, id) {
            // Acknowledged; the record says so with the thread's next write.
            return None;
        }
        match self.store.call(group_id, id).await {
            Ok(Some(call)) => call.awaits_dispatch().then_some(call.attempts),
            Ok(None) => None,
            // When in doubt, dispatch: the tool may see a call twice, the
            // agent never sees two results (invariant 4).
            Err(_) => Some(0),
        }
    }

    async fn retrying(
        &self,
        group_id: &str,
        id: &str,
        attempts: u32,
        reason: String,
        wait: Duration,
    ) {
        let command = Command::DispatchRetrying {
            id: id.into(),
            attempts,
            reason,
            retry_in_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        };
        if let Err(e) = self.record(group_id, command).await {
            if !matches!(e, Error::Rejected(_)) {
                warn!(group_id, call_id = id, error = %e, "could not record a retry");
            }
        }
    }

    /// Recorded as [`super::Acknowledgements`] says: waiting for the
    /// thread's next command to carry it ([`super::acks`]), after a grace,
    /// or at once.
    async fn acknowledged(&self, group_id: &str, id: &str, attempts: u32) -> bool {
        let ack = super::acks::Ack {
            id: id.into(),
            attempts,
            at: super::now(),
        };
        let command = match self.acks.wait(group_id, ack, self.ack_hold()) {
            Ok(()) => return true,
            Err(ack) => ack.command(),
        };
        if let super::Acknowledgements::AfterGrace(grace) = self.acknowledgements {
            tokio::time::sleep(grace).await;
        }
        match self.record(group_id, command).await {
            Ok(_) | Err(Error::Rejected(_)) => true,
            Err(e) => {
                warn!(group_id, call_id = id, error = %e, "could not record dispatch");
                false
            }
        }
    }

    async fn gave_up(&self, group_id: &str, id: &str, attempts: u32, text: String) -> bool {
        let command = Command::DispatchFailed {
            id: id.into(),
            attempts,
            text,
        };
        match self.execute(group_id, command).await {
            Ok(_) => {
                ::metrics::counter!(crate::metrics::OUTCOMES, "status" => "failed").increment(1);
                true
            }
            // The call moved on (answered or cancelled meanwhile).
            Err(Error::Rejected(_)) => true,
            Err(e) => {
                warn!(group_id, call_id = id, error = %e, "could not record dispatch failure");
                false
            }
        }
    }
}
