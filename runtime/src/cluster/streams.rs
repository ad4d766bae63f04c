//! The work-queue streams between runtime nodes and workers, and the one
//! durable consumer all workers share on each (any worker takes any
//! message; a message not acked in time goes to another worker).

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};

use super::subjects;

/// Requests relayed by runtime nodes: `ferry.in.<g>`.
pub const INBOX_STREAM: &str = "FERRY_INBOX";
/// Dispatch work: `ferry.work.<g>`.
pub const WORK_STREAM: &str = "FERRY_WORK";
/// The durable consumer every worker pulls from.
pub const CONSUMER: &str = "workers";
/// How long a worker may hold a message without acking it or saying it is
/// still at work (`+WPI`) before it is given to another worker.
pub const ACK_WAIT: Duration = Duration::from_secs(10);

/// Messages of a stream delivered and not yet acked, across workers.
pub const MAX_ACK_PENDING: usize = 10_000;

#[derive(Debug, thiserror::Error)]
#[error("NATS JetStream: {0}")]
pub struct Error(String);

fn nats(e: impl std::fmt::Display) -> Error {
    Error(e.to_string())
}

/// Creates the streams if they do not exist.
pub async fn ensure(js: &jetstream::Context, replicas: usize) -> Result<(), Error> {
    for (name, subject) in [
        (INBOX_STREAM, subjects::INBOX),
        (WORK_STREAM, subjects::WORK),
    ] {
        js.get_or_create_stream(stream::Config {
            name: name.into(),
            subjects: vec![format!("{subject}.>")],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            num_replicas: replicas,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(nats)?;
    }
    Ok(())
}

/// The shared durable pull consumer of `stream`.
pub async fn consumer(
    js: &jetstream::Context,
    stream: &str,
) -> Result<consumer::PullConsumer, Error> {
    js.get_stream(stream)
        .await
        .map_err(nats)?
        .get_or_create_consumer(
            CONSUMER,
            consumer::pull::Config {
                durable_name: Some(CONSUMER.into()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_ack_pending: MAX_ACK_PENDING as i64,
                ..Default::default()
            },
        )
        .await
        .map_err(nats)
}
