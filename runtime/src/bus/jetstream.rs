//! The bus on NATS JetStream: dispatch work goes to `ferry.work.<g>` in the
//! work-queue stream `FERRY_WORK`, which every worker consumes.

use async_nats::jetstream;
use async_nats::HeaderMap;
use async_trait::async_trait;
use ferry_proto::bus::Work;
use sha2::{Digest, Sha256};

use super::{Bus, Error};
use crate::cluster::subjects;

pub struct JetStreamBus {
    js: jetstream::Context,
}

impl JetStreamBus {
    pub fn new(js: jetstream::Context) -> Self {
        Self { js }
    }
}

#[async_trait]
impl Bus for JetStreamBus {
    async fn publish(&self, work: Work) -> Result<(), Error> {
        let unavailable = |e: &dyn std::fmt::Display| Error::Unavailable(e.to_string());
        let Work::Dispatch { invocation, .. } = &work;
        // The same call enqueued again within the stream's duplicate window
        // (a request redelivered after a worker died between its commit and
        // this publish) is stored once.
        let digest = Sha256::digest(format!("{}\0{}", invocation.group_id, invocation.id));
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("dispatch-{digest:x}").as_str());
        let body = rmp_serde::to_vec_named(&work).expect("work serializes");
        self.js
            .publish_with_headers(subjects::work(work.group_id()), headers, body.into())
            .await
            .map_err(|e| unavailable(&e))?
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(())
    }
}
