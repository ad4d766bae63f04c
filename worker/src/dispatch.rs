//! Handing one invocation to its tool until the tool acknowledges it: each
//! attempt goes through the tool's protocol ([`ToolProtocol`]), which says
//! whether it was acknowledged, is worth another try (after the tool's
//! `Retry-After`, if it gave one) or is final; transient failures are
//! retried with exponential backoff up to a bounded number of attempts.
//!
//! What is bounded is the attempts in flight (HTTP requests waiting for a
//! tool's answer), not the calls being dispatched: a call waiting out its
//! backoff, or a `Retry-After` of minutes, holds no slot, so a failing tool
//! cannot keep every other tool's calls from being sent.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backoff::backoff::Backoff;
use backoff::ExponentialBackoffBuilder;
use ferry_proto::Invocation;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Semaphore};

use crate::metrics::record_attempt;
use crate::rap::Rap;
use crate::Outcomes;

/// The longest `Retry-After` honoured: a broken header must not park a
/// call for hours.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// How a tool protocol hands a tool one call: one attempt, classified for
/// the retry rules, which are the same for every protocol. RAP
/// ([`Rap`]: a POST of the invocation) is the one built in.
#[async_trait]
pub trait ToolProtocol: Send + Sync + 'static {
    /// Sends `invocation` to `endpoint` once, waiting at most `timeout`
    /// for the tool's answer.
    async fn attempt(&self, endpoint: &str, invocation: &Invocation, timeout: Duration) -> Attempt;
}

/// Retry policy and the one clock of a dispatch: the acknowledgement
/// timeout of a single attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct DispatchConfig {
    /// Attempts before giving up, the first included.
    pub max_attempts: u32,
    #[serde(with = "millis")]
    pub initial_backoff: Duration,
    #[serde(with = "millis")]
    pub max_backoff: Duration,
    /// How long one attempt waits for the tool's HTTP answer.
    #[serde(with = "millis")]
    pub ack_timeout: Duration,
    /// Attempts in flight at once, across calls (at least 1).
    pub max_in_flight: usize,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            ack_timeout: Duration::from_secs(10),
            max_in_flight: 256,
        }
    }
}

mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// Why a dispatch ended without an acknowledgement. The `Display` text is
/// what the agent reads: it starts with `Error: ` and carries no internals.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("Error: the tool refused the call (HTTP {status})")]
    Refused { status: u16, attempts: u32 },
    #[error("Error: the tool could not be reached after {attempts} attempts")]
    Unreachable { attempts: u32 },
    /// The tool's address is in a network Ferry may not reach: no attempt
    /// could go through until the operator opens it.
    #[error("Error: the tool's address is in a network Ferry may not reach")]
    Closed { attempts: u32 },
    #[error("Error: the tool kept failing (HTTP {status}) after {attempts} attempts")]
    Exhausted { status: u16, attempts: u32 },
    /// Resumed after a restart with no attempt left.
    #[error("Error: the tool did not acknowledge the call in {attempts} attempts")]
    OutOfAttempts { attempts: u32 },
    /// The call was cancelled or answered meanwhile; nothing to record.
    #[error("the call no longer waits for dispatch")]
    NotWanted { attempts: u32 },
    /// The worker is stopping ([`Dispatcher::stop`]) and the call was only
    /// waiting (for a free slot, or out a backoff): it is for another
    /// worker to dispatch; nothing to record.
    #[error("the worker stopped before the call was dispatched")]
    Stopped { attempts: u32 },
}

impl Failure {
    pub fn attempts(&self) -> u32 {
        match self {
            Failure::Refused { attempts, .. }
            | Failure::Unreachable { attempts }
            | Failure::Closed { attempts }
            | Failure::Exhausted { attempts, .. }
            | Failure::OutOfAttempts { attempts }
            | Failure::NotWanted { attempts }
            | Failure::Stopped { attempts } => *attempts,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Refused { .. } => "refused",
            Failure::Unreachable { .. } => "unreachable",
            Failure::Closed { .. } => "closed",
            Failure::Exhausted { .. } | Failure::OutOfAttempts { .. } => "exhausted",
            Failure::NotWanted { .. } => "not_wanted",
            Failure::Stopped { .. } => "handed_back",
        }
    }
}

/// How one attempt went, classified for the retry decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Acknowledged,
    /// Worth another try, after `retry_after` if the tool said so.
    Transient {
        status: Option<u16>,
        retry_after: Option<Duration>,
    },
    Final {
        status: u16,
    },
    /// Not sent: the destination is in a network Ferry may not reach.
    Closed,
}

/// How often a call waiting out a backoff asks whether it is still wanted:
/// a call cancelled meanwhile frees its thread's queue within this, not
/// after the rest of a `Retry-After` of minutes.
const RECHECK: Duration = Duration::from_secs(1);

/// Sleeps `wait`, asking `wanted` every [`RECHECK`]; false once it says no.
async fn wait_while_wanted<F, Fut>(wait: Duration, wanted: &F) -> bool
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + wait;
    loop {
        let now = tokio::time::Instant::now();
        if now >= until {
            return true;
        }
        tokio::time::sleep_until(until.min(now + RECHECK)).await;
        if tokio::time::Instant::now() < until && !wanted().await {
            return false;
        }
    }
}

/// Sends invocations; cheap to clone (clones share the in-flight bound
/// and the stop).
#[derive(Clone)]
pub struct Dispatcher {
    protocol: Arc<dyn ToolProtocol>,
    config: DispatchConfig,
    in_flight: Arc<Semaphore>,
    /// Raised by [`Dispatcher::stop`].
    stopping: Arc<watch::Sender<bool>>,
}

impl Dispatcher {
    /// A dispatcher to RAP tools.
    pub fn new(outbound: impl Into<crate::Outbound>, config: DispatchConfig) -> Self {
        Self::with_protocol(Arc::new(Rap::new(outbound)), config)
    }

    /// A dispatcher whose attempts go through `protocol`.
    pub fn with_protocol(protocol: Arc<dyn ToolProtocol>, config: DispatchConfig) -> Self {
        let in_flight = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
        Self {
            protocol,
            config,
            in_flight,
            stopping: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Starts no attempt from now on: a dispatch waiting for a free slot or
    /// out a backoff ends at once with [`Failure::Stopped`], so that its
    /// work goes to another worker now rather than when this one is gone.
    /// Attempts already sent run to their end: the tool has the call, and
    /// its answer saves sending it again.
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Resolves once [`Dispatcher::stop`] was called.
    async fn stopped(&self) {
        let mut stopping = self.stopping.subscribe();
        // The sender lives as long as `self`.
        let _ = stopping.wait_for(|stopping| *stopping).await;
    }

    /// Dispatches until acknowledged, refused, or out of attempts, counting
    /// the attempts `outcomes` recorded before (a dispatch a crash
    /// interrupted). `outcomes` is asked before every attempt and every
    /// [`RECHECK`] of a wait whether the call is still wanted, so a
    /// cancelled call stops retrying and frees its thread soon, and is told
    /// of every failed attempt that will be retried.
    /// Returns the number of attempts made.
    pub async fn dispatch(
        &self,
        endpoint: &str,
        invocation: &Invocation,
        outcomes: &dyn Outcomes,
    ) -> Result<u32, Failure> {
        let (group_id, id) = (invocation.group_id.as_str(), invocation.id.as_str());
        let wanted = || async move { outcomes.still_wanted(group_id, id).await.is_some() };
        let max = self.config.max_attempts.max(1);
        let mut policy = ExponentialBackoffBuilder::new()
            .with_initial_interval(self.config.initial_backoff)
            .with_max_interval(self.config.max_backoff)
            .with_max_elapsed_time(None)
            .build();
        let mut attempts = 0;
        loop {
            let wait = {
                // Taken before asking: the wait for a slot may be long, and
                // a call cancelled meanwhile must not be sent.
                let _slot = tokio::select! {
                    biased;
                    () = self.stopped() => return Err(Failure::Stopped { attempts }),
                    slot = self.in_flight.acquire() => slot.expect("never closed"),
                };
                match outcomes.still_wanted(group_id, id).await {
                    None => return Err(Failure::NotWanted { attempts }),
                    Some(recorded) => attempts = attempts.max(recorded),
                }
                // Stopped while it asked: the attempt is not sent.
                if *self.stopping.borrow() {
                    return Err(Failure::Stopped { attempts });
                }
                if attempts >= max {
                    // Only when resumed: the attempts before the crash used
                    // the bound up.
                    return Err(Failure::OutOfAttempts { attempts });
                }
                attempts += 1;
                let sent = self
                    .protocol
                    .attempt(endpoint, invocation, self.config.ack_timeout);
                let (status, retry_after) = match sent.await {
                    Attempt::Acknowledged => {
                        record_attempt("acknowledged");
                        return Ok(attempts);
                    }
                    Attempt::Final { status } => {
                        record_attempt("refused");
                        return Err(Failure::Refused { status, attempts });
                    }
                    Attempt::Closed => {
                        record_attempt("closed");
                        return Err(Failure::Closed { attempts });
                    }
                    Attempt::Transient {
                        status,
                        retry_after,
                    } => (status, retry_after),
                };
                record_attempt(if status.is_some() {
                    "retryable_status"
                } else {
                    "unreachable"
                });
                if attempts >= max {
                    return Err(match status {
                        Some(status) => Failure::Exhausted { status, attempts },
                        None => Failure::Unreachable { attempts },
                    });
                }
                // Honour the tool's Retry-After, bounded.
                let wait = match retry_after {
                    Some(asked) => asked.min(MAX_RETRY_AFTER),
                    None => policy.next_backoff().unwrap_or(self.config.max_backoff),
                };
                let reason = match status {
                    Some(status) => format!("the tool answered HTTP {status}"),
                    None => "the tool could not be reached".to_owned(),
                };
                outcomes
                    .retrying(group_id, id, attempts, reason, wait)
                    .await;
                wait
            };
            let still = tokio::select! {
                biased;
                () = self.stopped() => return Err(Failure::Stopped { attempts }),
                still = wait_while_wanted(wait, &wanted) => still,
            };
            if !still {
                return Err(Failure::NotWanted { attempts });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a runtime recorded about one call (the attempts made before),
    /// for the dispatcher alone; it says when an attempt failed.
    struct Recorded {
        attempts: u32,
        failed: tokio::sync::Notify,
    }

    impl Recorded {
        fn new(attempts: u32) -> Arc<Self> {
            Arc::new(Recorded {
                attempts,
                failed: tokio::sync::Notify::new(),
            })
        }
    }

    #[async_trait::async_trait]
    impl Outcomes for Recorded {
        async fn still_wanted(&self, _: &str, _: &str) -> Option<u32> {
            Some(self.attempts)
        }
        async fn retrying(&self, _: &str, _: &str, _: u32, _: String, _: Duration) {
            self.failed.notify_one();
        }
        async fn acknowledged(&self, _: &str, _: &str, _: u32) -> bool {
            unreachable!()
        }
        async fn gave_up(&self, _: &str, _: &str, _: u32, _: String) -> bool {
            unreachable!()
        }
    }

    /// An invocation to port 9, which refuses connections: every attempt
    /// fails and would be retried.
    fn refused() -> (&'static str, Invocation) {
        let invocation = serde_json::from_value(serde_json::json!({
            "operation": "op", "arguments": {}, "group_id": "g", "id": "c",
            "callback_url": "http://127.0.0.1:9/cb",
        }))
        .unwrap();
        ("http://127.0.0.1:9/invoke", invocation)
    }

    /// A dispatch resumed with the bound already used up (a lower
    /// `--max-attempts` after a restart) gives up without sending.
    #[tokio::test]
    async fn a_resumed_dispatch_with_no_attempt_left_gives_up_at_once() {
        let config = DispatchConfig {
            max_attempts: 3,
            ..DispatchConfig::default()
        };
        let dispatcher = Dispatcher::new(reqwest::Client::new(), config);
        let (endpoint, invocation) = refused();
        let failed = dispatcher
            .dispatch(endpoint, &invocation, Recorded::new(4).as_ref())
            .await;
        assert_eq!(failed, Err(Failure::OutOfAttempts { attempts: 4 }));
        assert!(failed.unwrap_err().to_string().starts_with("Error: "));
    }

    /// A stopped dispatcher starts no attempt: a dispatch waiting out its
    /// backoff ends at once, and so does one begun after the stop.
    #[tokio::test]
    async fn a_stopped_dispatcher_hands_back_what_only_waits() {
        let config = DispatchConfig {
            initial_backoff: Duration::from_secs(3600),
            max_backoff: Duration::from_secs(3600),
            ..DispatchConfig::default()
        };
        let dispatcher = Dispatcher::new(reqwest::Client::new(), config);
        let (endpoint, invocation) = refused();
        let outcomes = Recorded::new(0);
        // The first attempt fails, and the next would follow in an hour.
        let waiting = tokio::spawn({
            let (dispatcher, outcomes) = (dispatcher.clone(), outcomes.clone());
            let invocation = invocation.clone();
            async move {
                dispatcher
                    .dispatch(endpoint, &invocation, outcomes.as_ref())
                    .await
            }
        });
        outcomes.failed.notified().await;
        dispatcher.stop();
        let ended = tokio::time::timeout(Duration::from_secs(10), waiting).await;
        let ended = ended.expect("the backoff ends with the stop").unwrap();
        assert_eq!(ended, Err(Failure::Stopped { attempts: 1 }));
        let later = dispatcher
            .dispatch(endpoint, &invocation, outcomes.as_ref())
            .await;
        assert_eq!(later, Err(Failure::Stopped { attempts: 0 }));
    }

    #[test]
    fn failure_texts_are_errors_for_the_model() {
        for f in [
            Failure::Refused {
                status: 404,
                attempts: 1,
            },
            Failure::Unreachable { attempts: 3 },
            Failure::OutOfAttempts { attempts: 5 },
            Failure::Exhausted {
                status: 503,
                attempts: 3,
            },
        ] {
            assert!(f.to_string().starts_with("Error: "), "{f}");
        }
    }
}
