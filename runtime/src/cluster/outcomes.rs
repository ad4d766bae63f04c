//! A cluster worker's [`Outcomes`]: how a dispatch ended is sent through the
//! thread's inbox partition, to be recorded by whichever worker applies
//! that partition, in order with the thread's callbacks. (Recording it
//! directly would race the tool's callback, which is often already on its
//! way, on the log's compare-and-set.)

use std::sync::Arc;

use async_nats::jetstream;
use async_trait::async_trait;
use ferry_worker::Outcomes;
use tracing::warn;

use super::subjects;
use crate::engine::requests::Request;
use crate::engine::Engine;

pub struct InboxOutcomes {
    engine: Arc<Engine>,
    js: jetstream::Context,
}

impl InboxOutcomes {
    pub fn new(engine: Arc<Engine>, js: jetstream::Context) -> Self {
        Self { engine, js }
    }

    /// True once JetStream holds the request.
    async fn send(&self, request: Request) -> bool {
        let group_id = request.group_id().unwrap_or_default().to_owned();
        let body = rmp_serde::to_vec_named(&request).expect("requests serialize");
        let stored = async {
            self.js
                .publish(subjects::inbox(&group_id), body.into())
                .await?
                .await
        };
        match stored.await {
            Ok(_) => true,
            Err(e) => {
                warn!(group_id, error = %e, "could not send how a dispatch ended");
                false
            }
        }
    }
}

#[async_trait]
impl Outcomes for InboxOutcomes {
    async fn still_wanted(&self, group_id: &str, id: &str) -> bool {
        self.engine.still_wanted(group_id, id).await
    }

    async fn acknowledged(&self, group_id: &str, id: &str, attempts: u32) -> bool {
        self.send(Request::DispatchOutcome {
            group_id: group_id.into(),
            id: id.into(),
            attempts,
            failure: None,
        })
        .await
    }

    async fn gave_up(&self, group_id: &str, id: &str, attempts: u32, text: String) -> bool {
        self.send(Request::DispatchOutcome {
            group_id: group_id.into(),
            id: id.into(),
            attempts,
            failure: Some(text),
        })
        .await
    }
}
