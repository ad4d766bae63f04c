//! The durable consumer all workers share on each partition's stream: it
//! takes the commits of every thread's log that hand calls to dispatch
//! (`ferry.<p>.log.*.d` in `FERRY_THREADS_<p>`) and the calls of limited
//! toolsets given room after they waited (`ferry.<p>.ready.>`), so any
//! worker takes any
//! call, and a commit not acked
//! in time goes to another worker. A consumer made anew (the first worker
//! ever, or after an operator deleted it) starts from the stream's first
//! commit: each call it finds no longer waiting is acked without a
//! dispatch (`Outcomes::still_wanted`).

use std::time::Duration;

use async_nats::jetstream::consumer::FromConsumer;
use async_nats::jetstream::{self, consumer, stream};

use super::subjects::Layout;

/// The durable consumer every worker pulls from.
pub const CONSUMER: &str = "workers";
/// The consumers' priority group, there only once a worker asked for it
/// (`ferry worker --priority`): with it (nats-server 2.12's `prioritized`
/// policy), a pull at a higher number gets messages only while no pull at
/// a lower one waits. Workers pull in it when the consumer has it, and
/// without it when not (NATS refuses the other way round).
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

/// What a starting worker does to the consumers' [`PRIORITY_GROUP`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupChange {
    /// Leaves the consumer as it is.
    #[default]
    Keep,
    /// Gives the consumer the group (a worker asked for a priority).
    Add,
    /// Takes the group away, so that workers of a Ferry older than
    /// priorities can pull again (they pull without a group).
    Remove,
}

/// Whether workers pull from `consumer` in [`PRIORITY_GROUP`].
pub fn has_priority_group(consumer: &consumer::PullConsumer) -> bool {
    let config = &consumer.cached_info().config;
    config.priority_policy == consumer::PriorityPolicy::Prioritized
        && config.priority_groups.iter().any(|g| g == PRIORITY_GROUP)
}

/// The shared consumer of `stream`, with its priority group changed as
/// `change` says. NATS older than 2.12 refuses the group (2.10 ignores
/// it): the consumer is then used as it is, and workers share the work
/// in turn, as they do without priorities.
pub async fn bind(
    js: &jetstream::Context,
    layout: Layout,
    partition: usize,
    change: GroupChange,
) -> Result<consumer::PullConsumer, Error> {
    let bound = consumer(js, layout, partition).await?;
    let (policy, groups) = match change {
        GroupChange::Keep => return Ok(bound),
        GroupChange::Add if has_priority_group(&bound) => return Ok(bound),
        GroupChange::Remove if !has_priority_group(&bound) => return Ok(bound),
        GroupChange::Add => (
            consumer::PriorityPolicy::Prioritized,
            vec![PRIORITY_GROUP.to_string()],
        ),
        GroupChange::Remove => (consumer::PriorityPolicy::None, vec![]),
    };
    let current = bound.cached_info().config.clone();
    let wanted = consumer::pull::Config {
        priority_policy: policy,
        priority_groups: groups,
        ..consumer::pull::Config::try_from_consumer_config(current).map_err(nats)?
    };
    let stream = js
        .get_stream(layout.stream(partition))
        .await
        .map_err(nats)?;
    match stream.update_consumer(wanted).await {
        Ok(updated) if change == GroupChange::Add && !has_priority_group(&updated) => {
            tracing::warn!("NATS kept the consumer without a priority group (a server older than 2.12?); workers share the work in turn");
            Ok(updated)
        }
        Ok(updated) => Ok(updated),
        // Refused by JetStream itself for good (not a cluster between
        // leaders, nor lost on the way: those are tried again).
        Err(e) if refused_for_good(&e) => {
            tracing::warn!(error = %e, ?change, "NATS refused to change the consumer's priority group; it stays as it is");
            Ok(bound)
        }
        Err(e) => Err(nats(e)),
    }
}

/// Whether JetStream refused a consumer update for a reason that trying
/// again will not change (a server too old for the change, say).
fn refused_for_good(e: &stream::ConsumerUpdateError) -> bool {
    use jetstream::ErrorCode;
    let stream::ConsumerUpdateErrorKind::JetStream(e) = e.kind() else {
        return false;
    };
    // A failure of the server's own (a 500: say, the consumer made again
    // while its old files are still being removed), not a refusal.
    if e.code() >= 500 {
        return false;
    }
    let passing = [
        ErrorCode::CLUSTER_INCOMPLETE,
        ErrorCode::CLUSTER_NO_PEERS,
        ErrorCode::CLUSTER_NOT_ACTIVE,
        ErrorCode::CLUSTER_NOT_ASSIGNED,
        ErrorCode::CLUSTER_NOT_AVAILABLE,
        ErrorCode::CLUSTER_NOT_LEADER,
        ErrorCode::RAFT_GENERAL,
        ErrorCode::INSUFFICIENT_RESOURCES,
        ErrorCode(10118), // the stream is offline
        ErrorCode(10119), // the consumer is offline
    ];
    !passing.contains(&e.error_code())
}

/// The shared durable pull consumer of partition `partition`'s stream: the
/// commits that hand calls to dispatch, and the calls of limited toolsets
/// given room after they waited.
pub async fn consumer(
    js: &jetstream::Context,
    layout: Layout,
    partition: usize,
) -> Result<consumer::PullConsumer, Error> {
    let stream = js
        .get_stream(layout.stream(partition))
        .await
        .map_err(nats)?;
    let filters = vec![layout.dispatching(partition), layout.readies(partition)];
    let bound = stream
        .get_or_create_consumer(
            CONSUMER,
            consumer::pull::Config {
                durable_name: Some(CONSUMER.into()),
                filter_subjects: filters.clone(),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_ack_pending: MAX_ACK_PENDING as i64,
                ..Default::default()
            },
        )
        .await
        .map_err(nats)?;
    let current = bound.cached_info().config.clone();
    if current.filter_subjects == filters {
        return Ok(bound);
    }
    // Made by an older Ferry, which took the commits only.
    let wanted = consumer::pull::Config {
        filter_subject: String::new(),
        filter_subjects: filters,
        ..consumer::pull::Config::try_from_consumer_config(current).map_err(nats)?
    };
    stream.update_consumer(wanted).await.map_err(nats)
}
