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
/// The consumer's priority group: workers pull in it with their
/// `--priority`, and a pull with a higher number gets messages only while
/// no pull with a lower one waits (nats-server 2.12's `prioritized`
/// policy). Workers of one priority share the work in turn.
pub const PRIORITY_GROUP: &str = "workers";
/// The highest priority number NATS takes.
pub const MAX_PRIORITY: u8 = 9;
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

/// The shared durable pull consumer of `stream`. One an older Ferry made
/// without the priority group gains it; if NATS refuses (a server older
/// than 2.12), the consumer is used as it is and workers pull without
/// priorities ([`takes_priorities`]).
pub async fn consumer(
    js: &jetstream::Context,
    stream: &str,
) -> Result<consumer::PullConsumer, Error> {
    let config = consumer::pull::Config {
        durable_name: Some(CONSUMER.into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        max_ack_pending: MAX_ACK_PENDING as i64,
        priority_policy: consumer::PriorityPolicy::Prioritized,
        priority_groups: vec![PRIORITY_GROUP.into()],
        ..Default::default()
    };
    let stream = js.get_stream(stream).await.map_err(nats)?;
    let mut bound = match stream
        .get_or_create_consumer(CONSUMER, config.clone())
        .await
    {
        Ok(bound) => bound,
        // Refused by JetStream itself (not a timeout or an outage).
        Err(e) if matches!(e.kind(), stream::ConsumerErrorKind::JetStream(_)) => {
            tracing::warn!(error = %e, "NATS refused a consumer with priorities; workers share work without them");
            let plain = consumer::pull::Config {
                priority_policy: consumer::PriorityPolicy::None,
                priority_groups: vec![],
                ..config.clone()
            };
            return stream
                .get_or_create_consumer(CONSUMER, plain)
                .await
                .map_err(nats);
        }
        Err(e) => return Err(nats(e)),
    };
    if !takes_priorities(&bound) {
        match stream.update_consumer(config).await {
            Ok(updated) => bound = updated,
            Err(e) => {
                tracing::warn!(error = %e, "NATS kept the consumer without priorities; workers share work without them")
            }
        }
    }
    Ok(bound)
}

/// Whether workers pull from `consumer` in [`PRIORITY_GROUP`].
pub fn takes_priorities(consumer: &consumer::PullConsumer) -> bool {
    let config = &consumer.cached_info().config;
    config.priority_policy == consumer::PriorityPolicy::Prioritized
        && config.priority_groups.iter().any(|g| g == PRIORITY_GROUP)
}
