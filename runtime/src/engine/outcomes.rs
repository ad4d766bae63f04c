//! The engine as the worker's [`Outcomes`]: dispatch results go through the
//! state machine like everything else.

use async_trait::async_trait;
use ferry_proto::api::CallStatus;
use ferry_worker::Outcomes;
use tracing::warn;

use super::{Engine, Error};
use crate::thread::Command;

#[async_trait]
impl Outcomes for Engine {
    async fn still_wanted(&self, group_id: &str, id: &str) -> bool {
        match self.store.call(group_id, id).await {
            Ok(Some(call)) => call.status == CallStatus::Queued,
            Ok(None) => false,
            // When in doubt, dispatch: the tool may see a call twice, the
            // agent never sees two results (invariant 4).
            Err(_) => true,
        }
    }

    async fn acknowledged(&self, group_id: &str, id: &str, attempts: u32) -> bool {
        self.record_dispatch(group_id, id, attempts, None)
            .await
            .is_ok()
    }

    async fn gave_up(&self, group_id: &str, id: &str, attempts: u32, text: String) -> bool {
        self.record_dispatch(group_id, id, attempts, Some(text))
            .await
            .is_ok()
    }
}

impl Engine {
    /// Records how a dispatch ended: acknowledged, or given up with the
    /// `Error: …` text. A call that moved on meanwhile (answered, cancelled)
    /// needs nothing recorded; only a store failure is an error.
    pub(crate) async fn record_dispatch(
        &self,
        group_id: &str,
        id: &str,
        attempts: u32,
        failure: Option<String>,
    ) -> Result<(), Error> {
        let failed = failure.is_some();
        let command = match failure {
            None => Command::DispatchAcked {
                id: id.into(),
                attempts,
            },
            Some(text) => Command::DispatchFailed {
                id: id.into(),
                attempts,
                text,
            },
        };
        match self.execute(group_id, command).await {
            Ok(_) => {
                if failed {
                    ::metrics::counter!(crate::metrics::OUTCOMES, "status" => "failed")
                        .increment(1);
                }
                Ok(())
            }
            Err(Error::Rejected(_)) => Ok(()),
            Err(e) => {
                warn!(group_id, call_id = id, error = %e, "could not record how a dispatch ended");
                Err(e)
            }
        }
    }
}
