//! The engine: the one place that runs commands against threads. It loads
//! state from the store, decides with the pure state machine, writes the
//! events atomically, waits for group commit, and only then lets anyone see
//! or hear of them. The HTTP fronts and the worker call into it.
//!
//! **Invariant:** nothing is answered before it is durable (invariant 1):
//! `execute` returns only after the store's flush.

mod acks;
mod approvals;
pub mod audit;
mod callbacks;
pub mod calls;
mod choices;
mod consumers;
mod discovery;
mod health;
mod lanes;
mod outcomes;
mod push;
pub mod reads;
mod recovery;
pub mod requests;
pub(crate) mod stopping;
pub mod tokens;
mod toolsets;
mod turns;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use ferry_dispatch::Notifier;
use ferry_proto::api::Event;
use ferry_proto::time::Timestamp;
use ferry_proto::ErrorCode;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::bus::{self, Bus};
use crate::identity::Identity;
use crate::store::{self, CatalogStore, Durability, Store, Write};
use crate::thread::{self, Command, Decision, Rejection, ThreadState};
use crate::token::Capabilities;
use crate::toolsets::{ArgumentErrors, Registry};
use turns::{Turn, Turns};

pub use approvals::MAX_REASON_BYTES;
pub use toolsets::{RegisteredToolset, ToolView};

/// How a tool's 200 (`call_dispatched`) is recorded. For a fast tool the
/// result follows within milliseconds, and recording the 200 as a command
/// of its own costs about as much as recording the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acknowledgements {
    /// As a command of its own, at once.
    AtOnce,
    /// Waiting in memory for up to this long for the thread's next command
    /// to carry it, in one write ([`acks`]): where one process records
    /// both the 200 and the result (`ferry serve`).
    RideWithNext(std::time::Duration),
    /// After this grace, and only if the call still waits for it then:
    /// where another process records the result (a cluster worker), whose
    /// write then says the tool had the call and the 200 costs none. The
    /// worker acks its work only once the 200 is recorded or found moot, so
    /// a crash in the grace re-dispatches the call (invariant 4).
    AfterGrace(std::time::Duration),
}

impl Acknowledgements {
    /// Where one process records both the 200 and the result: a tool that
    /// answers at once calls back well within 5 ms.
    pub const SINGLE_PROCESS: Self = Self::RideWithNext(std::time::Duration::from_millis(5));
}

/// Limits and addresses of the runtime.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// How tools reach this node: callback URLs start with it.
    pub public_url: String,
    /// Longest `group_id` or call `id`, in bytes (400 beyond).
    pub max_id_bytes: usize,
    /// Largest request body, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Longest long-poll `wait`, in seconds.
    pub max_wait_secs: u64,
    /// Rate limits on every call, besides each toolset's own.
    pub rate_limits: crate::limits::RateLimits,
    /// The longest a push consumer waits between attempts at a receiver
    /// that fails (the wait doubles from half a second up to this).
    pub push_max_backoff: std::time::Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            public_url: "http://127.0.0.1:8080".into(),
            max_id_bytes: 512,
            max_body_bytes: 1 << 20,
            max_wait_secs: 60,
            rate_limits: crate::limits::RateLimits::default(),
            push_max_backoff: std::time::Duration::from_secs(60),
        }
    }
}

/// Why the engine refused or failed a request. The HTTP front maps each
/// variant to a status and an error code in one place (`http::error`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    UnknownTool(String),
    #[error("{0}")]
    AmbiguousTool(String),
    #[error("arguments do not match the tool's inputSchema")]
    InvalidArguments(ArgumentErrors),
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error("forged or malformed callback token")]
    Forged,
    #[error("the callback names {0}, which its token was not issued for")]
    Mismatch(String),
    #[error("{0}")]
    BadCallback(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    InvalidOption(String),
    #[error("{0}")]
    ToolsetUnreachable(String),
    #[error("{0}")]
    InvalidToolset(String),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Bus(#[from] bus::Error),
    /// A fault of Ferry's own (a command's task ended without an answer).
    #[error("{0}")]
    Forbidden(String),
    /// Over a rate limit: try again after `retry_after`.
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after: std::time::Duration,
    },
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// What went wrong, as the native API names it; each front maps it to
    /// its protocol's shape.
    pub fn code(&self) -> ErrorCode {
        use ErrorCode as C;
        match self {
            Error::InvalidRequest(_) => C::InvalidRequest,
            Error::UnknownTool(_) => C::UnknownTool,
            Error::AmbiguousTool(_) => C::AmbiguousTool,
            Error::InvalidArguments(_) => C::InvalidArguments,
            Error::Rejected(r) => r.code(),
            Error::Forged | Error::Mismatch(_) => C::Forbidden,
            Error::BadCallback(_) => C::InvalidCallback,
            Error::NotFound(_) => C::NotFound,
            Error::InvalidOption(_) => C::InvalidOption,
            Error::ToolsetUnreachable(_) => C::ToolsetUnreachable,
            Error::InvalidToolset(_) => C::InvalidToolset,
            Error::Store(store::Error::Conflict(_)) => C::Busy,
            Error::Store(store::Error::Unavailable(_)) => C::Unavailable,
            // What a result would be stored as, with the thread's metadata,
            // is more than NATS carries: refused like a body over the limit
            // (a tool's result then fails its call, `http::callbacks`).
            Error::Store(store::Error::TooLarge(_)) => C::PayloadTooLarge,
            Error::Store(_) => C::StorageError,
            Error::Bus(_) => C::BusUnavailable,
            Error::Forbidden(_) => C::Forbidden,
            Error::RateLimited { .. } => C::RateLimited,
            Error::Conflict(_) => C::Conflict,
            Error::Internal(_) => C::InternalError,
        }
    }

    /// A refusal that rests on the registered toolsets (the tool, its
    /// schema) rather than on the request alone: it may change when they do.
    pub fn rests_on_toolsets(&self) -> bool {
        matches!(
            self,
            Error::UnknownTool(_) | Error::AmbiguousTool(_) | Error::InvalidArguments(_)
        )
    }
}

/// Shards of the per-thread lock: commands of one thread run one at a time
/// (RAP: "within one group_id, the runtime processes messages one at a
/// time"); a fixed table bounds memory whatever the number of threads.
const LOCK_SHARDS: usize = 1024;

/// Attempts at a write that lost a compare-and-set race before giving up.
const MAX_CONFLICT_RETRIES: usize = 16;

/// A choice's answer being delivered, and what wakes its delivery from a
/// pause when a newer answer comes.
type Delivery = (crate::thread::ChoiceAnswer, Arc<tokio::sync::Notify>);

pub struct Engine {
    pub(crate) config: Config,
    pub(crate) store: Arc<dyn Store>,
    catalog: Arc<dyn CatalogStore>,
    bus: Arc<dyn Bus>,
    pub(crate) registry: Registry,
    caps: Capabilities,
    notifier: Notifier,
    outbound: ferry_dispatch::Outbound,
    locks: Vec<Mutex<()>>,
    /// Each thread's commands' turns at the bus, in write order.
    turns: Arc<Turns>,
    /// Where approval timeouts are armed; `start_timers` takes the queue.
    timers: tokio::sync::mpsc::UnboundedSender<approvals::Timer>,
    timer_queue: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<approvals::Timer>>>,
    /// Calls whose user's answer this process is delivering: the answer,
    /// and what wakes its delivery from a pause when a newer one comes.
    delivering: std::sync::Mutex<std::collections::HashMap<(String, String), Delivery>>,
    /// Held across each change of the registered toolsets (read, change,
    /// store), so two changes never undo each other.
    toolset_writes: tokio::sync::Mutex<()>,
    /// Named API tokens' records, as last loaded.
    tokens: std::sync::RwLock<tokens::TokenIndex>,
    /// Held across each change of the tokens, as `toolset_writes`.
    token_writes: tokio::sync::Mutex<()>,
    /// Where rate-limit buckets are kept.
    buckets: Arc<dyn crate::limiter::Buckets>,
    /// Approval timeouts armed in this process, by call: one each, however
    /// often recovery asks (with its task once it runs).
    armed: std::sync::Mutex<
        std::collections::HashMap<(String, String), Option<tokio::task::AbortHandle>>,
    >,
    /// Dispatch acknowledgements waiting to ride with their thread's next
    /// command.
    acks: acks::Acks,
    /// Set when the process stops: open streams and long waits end
    /// (`stopping.rs`).
    stopping: tokio::sync::watch::Sender<bool>,
    /// [`Engine::with_acknowledgements`].
    acknowledgements: Acknowledgements,
    /// Refused requests recorded in the audit log lately.
    refusals: audit::Refusals,
    /// [`Engine::with_audit_lines`].
    audit_lines: Option<audit::AuditLines>,
    /// Calls held back by their toolset's `max_concurrent_calls`
    /// ([`Engine::with_concurrency_limits`]; none on a cluster).
    pub(crate) lanes: Option<crate::concurrency::Lanes<ferry_proto::bus::Work>>,
    /// The same limits, shared by every process of a cluster
    /// ([`Engine::with_shared_lanes`]).
    pub(crate) shared_lanes: Option<Arc<dyn crate::shared_lanes::SharedLanes>>,
    /// [`Engine::with_consumers`].
    consumers: std::sync::OnceLock<Arc<crate::delivery::Consumers>>,
    /// Push consumers being delivered, by name: one loop each.
    pushing: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// What executing a command did: the decision, the events it recorded, and
/// the state after them.
pub struct Executed {
    pub decision: Decision,
    pub events: Vec<Event>,
    pub state: ThreadState,
    /// The command's turn at the bus, if it asked for one
    /// ([`Engine::execute_in_turn`]).
    pub(crate) turn: Option<Turn>,
}

impl Engine {
    pub fn new(
        config: Config,
        store: Arc<dyn Store>,
        catalog: Arc<dyn CatalogStore>,
        bus: Arc<dyn Bus>,
        caps: Capabilities,
        outbound: impl Into<ferry_dispatch::Outbound>,
    ) -> Self {
        let (timers, timer_queue) = approvals::timer_channel();
        let outbound = outbound.into();
        Self {
            timers,
            timer_queue: std::sync::Mutex::new(Some(timer_queue)),
            config,
            store,
            catalog,
            tokens: Default::default(),
            token_writes: Default::default(),
            buckets: Arc::new(crate::limiter::InMemory::default()),
            bus,
            registry: Registry::default(),
            caps,
            notifier: Notifier::new(outbound.clone()),
            outbound,
            locks: (0..LOCK_SHARDS).map(|_| Mutex::new(())).collect(),
            turns: Arc::default(),
            delivering: Default::default(),
            toolset_writes: Default::default(),
            armed: Default::default(),
            acks: Default::default(),
            stopping: tokio::sync::watch::Sender::new(false),
            acknowledgements: Acknowledgements::AtOnce,
            refusals: audit::Refusals::default(),
            audit_lines: None,
            lanes: None,
            shared_lanes: None,
            consumers: std::sync::OnceLock::new(),
            pushing: Default::default(),
        }
    }

    /// Keeps rate-limit buckets in `buckets` (a cluster's shared ones)
    /// instead of this process's memory.
    pub fn with_buckets(mut self, buckets: Arc<dyn crate::limiter::Buckets>) -> Self {
        self.buckets = buckets;
        self
    }

    /// Keeps toolsets' `max_concurrent_calls`: for one process, which
    /// dispatches every call itself (`ferry serve`).
    pub fn with_concurrency_limits(mut self) -> Self {
        self.lanes = Some(crate::concurrency::Lanes::default());
        self
    }

    /// Keeps toolsets' `max_concurrent_calls` in `lanes`, which every
    /// process of a cluster shares: workers enter calls there before they
    /// dispatch them, and every process leaves for the calls whose end it
    /// writes.
    pub fn with_shared_lanes(mut self, lanes: Arc<dyn crate::shared_lanes::SharedLanes>) -> Self {
        self.shared_lanes = Some(lanes);
        self
    }

    /// Also writes each audit entry this process records to `out`, as a
    /// line of JSON.
    pub fn with_audit_lines(mut self, out: Box<dyn std::io::Write + Send>) -> Self {
        self.audit_lines = Some(audit::AuditLines::new(out));
        self
    }

    /// How tools' 200s are recorded (at once, unless told otherwise).
    pub fn with_acknowledgements(mut self, acknowledgements: Acknowledgements) -> Self {
        self.acknowledgements = acknowledgements;
        self
    }

    /// How long an acknowledgement may wait for its thread's next command.
    fn ack_hold(&self) -> std::time::Duration {
        match self.acknowledgements {
            Acknowledgements::RideWithNext(hold) => hold,
            _ => std::time::Duration::ZERO,
        }
    }

    fn lock_for(&self, group_id: &str) -> &Mutex<()> {
        let mut h = DefaultHasher::new();
        group_id.hash(&mut h);
        &self.locks[(h.finish() as usize) % LOCK_SHARDS]
    }

    /// Runs `command` against thread `group_id` and returns once its events
    /// are durable and visible to readers.
    pub async fn execute(&self, group_id: &str, command: Command) -> Result<Executed, Error> {
        self.execute_with(group_id, command, None, Durability::Await, false)
            .await
    }

    /// Like [`Engine::execute`], for a command `by` asks: refused
    /// ([`Rejection::ForeignThread`]) unless it may act in the thread, as
    /// decided on the same state as the command itself.
    pub(crate) async fn execute_as(
        &self,
        by: &Identity,
        group_id: &str,
        command: Command,
    ) -> Result<Executed, Error> {
        self.execute_with(group_id, command, Some(by), Durability::Await, false)
            .await
    }

    /// Like [`Engine::execute_as`], for a command that may hand a call to
    /// the bus: it takes a turn in its thread's line ([`turns`]), which the
    /// caller waits for before publishing.
    pub(crate) async fn execute_in_turn(
        &self,
        by: &Identity,
        group_id: &str,
        command: Command,
    ) -> Result<Executed, Error> {
        self.execute_with(group_id, command, Some(by), Durability::Await, true)
            .await
    }

    /// Like [`Engine::execute`], but for a command nobody is answered on:
    /// returns once the events are written, and the store shows them to
    /// readers once it made them durable. A crash before that loses
    /// them, which must be harmless (a lost `call_dispatched` means the
    /// call is dispatched again: invariant 4 allows it).
    pub async fn record(&self, group_id: &str, command: Command) -> Result<Executed, Error> {
        self.execute_with(group_id, command, None, Durability::Background, false)
            .await
    }

    async fn execute_with(
        &self,
        group_id: &str,
        command: Command,
        by: Option<&Identity>,
        durability: Durability,
        in_turn: bool,
    ) -> Result<Executed, Error> {
        self.run(group_id, Some((&command, by)), durability, in_turn)
            .await
    }

    /// Records the thread's waiting acknowledgements on their own.
    async fn record_acks(&self, group_id: &str, durability: Durability) -> Result<(), Error> {
        self.run(group_id, None, durability, false).await.map(drop)
    }

    /// Writes the thread's waiting acknowledgements before a read of its
    /// state, which then shows a call as dispatched once its tool said so.
    pub(crate) async fn acks_before_read(&self, group_id: &str) -> Result<(), Error> {
        if self.acks.waits(group_id) {
            self.record_acks(group_id, Durability::Background).await?;
        }
        Ok(())
    }

    /// Records every waiting acknowledgement, durably: for a clean stop.
    pub async fn record_all_acks(&self) {
        for group_id in self.acks.threads() {
            if let Err(e) = self.record_acks(&group_id, Durability::Await).await {
                tracing::warn!(group_id, error = %e, "could not record dispatch");
            }
        }
    }

    /// Runs `command` (none: only the acknowledgements) after the thread's
    /// waiting acknowledgements, in one write; asked by an identity, when
    /// one is named, which must be allowed in the thread.
    async fn run(
        &self,
        group_id: &str,
        asked: Option<(&Command, Option<&Identity>)>,
        durability: Durability,
        in_turn: bool,
    ) -> Result<Executed, Error> {
        let at = now();
        // The first attempt decides on the store's last known commit of
        // the thread; a decision that writes nothing is then made again
        // on the tip (the compare-and-set guards only writes).
        let command = asked.map(|(command, _)| command);
        let mut optimistic = true;
        for _ in 0..MAX_CONFLICT_RETRIES {
            let guard = self.lock_for(group_id).lock().await;
            let turn = in_turn.then(|| self.turns.take(group_id));
            let acks = self.acks.take(group_id);
            let loaded = self.load_for(group_id, command, &acks, optimistic).await;
            optimistic = false;
            let (mut state, maybe_stale) = match loaded {
                Ok(loaded) => loaded,
                Err(e) => {
                    self.acks.restore(group_id, acks, self.ack_hold());
                    return Err(e);
                }
            };
            let expected_last_seq = state.meta.last_seq;
            let active_before = state.meta.active_subscriptions.len();
            let mut events = apply_acks(&mut state, &acks);
            let acked = events.len();
            // After an acknowledgement that kept its tool's later time.
            let at = if acked > 0 && state.meta.updated_at > at {
                state.meta.updated_at
            } else {
                at
            };
            let decided = match asked {
                Some((_, Some(by))) if !by.may_act_in(group_id, &state.meta) => {
                    Err(Rejection::ForeignThread(group_id.to_owned()))
                }
                Some((command, _)) => thread::decide(&state, command),
                None => Ok(Decision::nothing(thread::Outcome::Applied)),
            };
            if let Ok(decision) = &decided {
                events.extend(thread::apply(&mut state, at, decision.changes.clone()));
            }
            let audit = audited(&state, &events[acked..], asked, &decided);
            if events.is_empty() && maybe_stale {
                drop(guard);
                self.acks.restore(group_id, acks, self.ack_hold());
                continue;
            }
            if events.is_empty() {
                drop(guard);
                // Nothing new, but what the answer rests on (a call another
                // request just wrote, say) must be durable before we answer.
                // A refusal too rests on the state it was decided against,
                // which may hold another request's write not yet flushed
                // (or a held one): a crash must not take its reason back.
                self.store.durable(group_id).await?;
                if !audit.is_empty() {
                    self.store_audit(&audit).await?;
                }
                return Ok(Executed {
                    decision: decided?,
                    events,
                    state,
                    turn,
                });
            }
            // A refusal that comes after acknowledgements it carries is
            // answered once they are durable, as any refusal.
            let durability = if decided.is_err() {
                Durability::Await
            } else {
                durability
            };
            let write = Write {
                expected_last_seq,
                state: &state,
                events: &events,
                audit: &audit,
            };
            let written = self.store.append(write, durability).await;
            drop(guard);
            let durable = match written {
                Err(store::Error::Conflict(_)) => {
                    self.acks.restore(group_id, acks, self.ack_hold());
                    ::metrics::counter!(crate::metrics::WRITE_CONFLICTS).increment(1);
                    tracing::debug!(
                        group_id,
                        "write lost a compare-and-set race; deciding again"
                    );
                    continue;
                }
                Err(e) => return Err(e.into()),
                Ok(durable) => durable,
            };
            // Every way a subscription opens or ends (a result, `final`, a
            // cancel of either kind, the built-in tool, a lost call) is a
            // change of the active set, counted here once.
            let opened = state.meta.active_subscriptions.len() as f64 - active_before as f64;
            if opened != 0.0 {
                ::metrics::gauge!(crate::metrics::ACTIVE_SUBSCRIPTIONS).increment(opened);
            }
            // The command's own events, after the acknowledgements it carried.
            let events = events.split_off(acked);
            // Readers see the events only once they are durable; a failed
            // flush releases the write without showing it. Nobody waits
            // for a background write: the store finishes it on its own.
            if durability == Durability::Await {
                durable.await?;
            }
            self.ship_audit(&audit);
            if let Some(consumers) = self.consumers.get().filter(|c| c.any_takes(group_id)) {
                if durability == Durability::Await {
                    consumers.touched(group_id);
                } else {
                    // Consumers read durable events only: look once they are.
                    let (store, consumers) = (self.store.clone(), consumers.clone());
                    let group_id = group_id.to_owned();
                    tokio::spawn(async move {
                        if store.durable(&group_id).await.is_ok() {
                            consumers.touched(&group_id);
                        }
                    });
                }
            }
            self.release_lanes(&state, &events).await;
            return Ok(Executed {
                decision: decided?,
                events,
                state,
                turn,
            });
        }
        Err(store::Error::Conflict(group_id.to_owned()).into())
    }

    /// Loads what `command` reads: the calls it names and, for one that
    /// reads them, every call the thread still owes something. Another
    /// process may add such a call between two loads (in a cluster), so
    /// this loads until none is missing; the write's compare-and-set then
    /// holds it to that state.
    /// The calls of `acks` are loaded too.
    async fn load_for(
        &self,
        group_id: &str,
        command: Option<&Command>,
        acks: &[acks::Ack],
        optimistic: bool,
    ) -> Result<(ThreadState, bool), Error> {
        let mut named = command.map(Command::call_ids).unwrap_or_default();
        named.extend(acks.iter().map(|a| a.id.as_str()));
        let (mut state, mut maybe_stale) = if optimistic {
            self.store.load_optimistic(group_id, &named).await?
        } else {
            (self.store.load(group_id, &named).await?, false)
        };
        let mut loads = 1;
        while command.is_some_and(Command::reads_unsettled_calls) {
            let unsettled: Vec<String> = state.meta.unsettled.iter().cloned().collect();
            if unsettled.iter().all(|id| state.calls.contains_key(id)) {
                break;
            }
            if loads > MAX_CONFLICT_RETRIES {
                return Err(store::Error::Conflict(group_id.to_owned()).into());
            }
            let ids: Vec<&str> = named
                .iter()
                .copied()
                .chain(unsettled.iter().map(String::as_str))
                .collect();
            state = self.store.load(group_id, &ids).await?;
            maybe_stale = false;
            loads += 1;
        }
        Ok((state, maybe_stale))
    }

    /// Checks a `group_id` or call `id` against the documented limits.
    pub(crate) fn check_id(&self, what: &str, value: &str) -> Result<(), Error> {
        if value.is_empty() {
            return Err(Error::InvalidRequest(format!("{what} must not be empty")));
        }
        if value == "." || value == ".." {
            // URL normalisation removes these as path segments, even
            // percent-encoded, so such a thread could never be read.
            return Err(Error::InvalidRequest(format!(
                "{what} must not be \".\" or \"..\": it cannot be addressed in a URL path"
            )));
        }
        if value.len() > self.config.max_id_bytes {
            return Err(Error::InvalidRequest(format!(
                "{what} is {} bytes long; the limit is {}",
                value.len(),
                self.config.max_id_bytes
            )));
        }
        Ok(())
    }

    /// The registered toolsets, as this process holds them.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Sends `/cancel_tool_call` for `call` to its own tool server (a
    /// built-in has none), best effort and without waiting. Only to its
    /// own: any other would learn of a thread and a call it never saw.
    fn tell_cancelled(&self, group_id: &str, call: &crate::thread::CallRecord) {
        if let Some(target) = &call.target {
            let server = self.registry.authorised(&target.base_url, &target.base_url);
            let notice = self.notifier.cancel_tool_call(server, group_id, &call.id);
            tokio::spawn(notice);
        }
    }
}

/// Applies the waiting acknowledgements, oldest first. One whose call
/// moved on meanwhile (answered, cancelled) records nothing, as it would
/// have recorded nothing had it come after that. Each keeps the time the
/// tool answered, unless an event written since is later: a thread's
/// timestamps never go back.
/// What the audit log records of a write: its events' entries and, when
/// the command repeats one already recorded, its calls' entries again (a
/// crash may have cut the first short before they were stored; their keys
/// keep them once).
fn audited(
    state: &ThreadState,
    events: &[Event],
    asked: Option<(&Command, Option<&Identity>)>,
    decided: &Result<Decision, Rejection>,
) -> Vec<ferry_proto::audit::AuditEntry> {
    let by = asked.and_then(|(_, by)| by).map(Identity::name);
    let mut entries = crate::audit::of_events(state, events, by);
    if let (Some((command, _)), Ok(decision)) = (asked, decided) {
        if decision.outcome == thread::Outcome::Duplicate {
            for call in command
                .call_ids()
                .into_iter()
                .filter_map(|id| state.calls.get(id))
            {
                entries.extend(crate::audit::of_call(&state.meta.group_id, call));
            }
        }
    }
    entries
}

fn apply_acks(state: &mut ThreadState, acks: &[acks::Ack]) -> Vec<Event> {
    let mut events = vec![];
    for ack in acks {
        if let Ok(decision) = thread::decide(state, &ack.command()) {
            let at = ack.at.max(state.meta.updated_at);
            events.extend(thread::apply(state, at, decision.changes));
        }
    }
    events
}

/// The current time, to the millisecond.
pub fn now() -> Timestamp {
    Timestamp::from(std::time::SystemTime::now())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bus::LocalBus;
    use crate::thread::{NewCall, Reviewer};
    use ferry_store_sled::SledStore;

    pub(crate) use crate::testing::{call, engine, engine_with};

    /// `call`, for a tool at `base`.
    fn to_tool(mut call: NewCall, base: &str) -> NewCall {
        call.target = Some(ferry_proto::api::ToolTarget {
            tool_name: "echo".into(),
            base_url: base.into(),
            endpoint: format!("{base}/invoke"),
        });
        call
    }

    /// An allowed call whose dispatch work was lost (its worker died
    /// between the commit and the enqueue; here, no worker was attached) is
    /// enqueued again when the decision is applied again.
    #[tokio::test]
    async fn a_repeated_approval_enqueues_a_call_still_queued() {
        use futures::FutureExt;
        let dir = tempfile::tempdir().unwrap();
        let bus = LocalBus::new();
        let store = Arc::new(SledStore::open(dir.path()).unwrap());
        let engine = Arc::new(engine_with(store, bus.clone()));
        let mut gated = to_tool(call("c1", "a"), "http://tool");
        gated.gate = Some(crate::thread::Gate {
            deadline: "2099-01-01T00:00:00Z".parse().unwrap(),
            inherited: None,
            ancestors: None,
        });
        engine.execute("g", Command::Submit(gated)).await.unwrap();
        // Allowed and stored, but the work reaches no worker.
        let lost = engine
            .decide_approval(
                &Identity::anonymous(),
                "g",
                "c1",
                "allow_once",
                Reviewer::Person("ana".into()),
                None,
            )
            .await;
        assert!(matches!(lost, Err(Error::Bus(_))), "{:?}", lost.err());
        let (sent, mut work) = tokio::sync::mpsc::unbounded_channel();
        bus.set_handler(Arc::new(move |w| {
            let _ = sent.send(w);
            async {}.boxed()
        }));
        let again = engine
            .decide_approval(
                &Identity::anonymous(),
                "g",
                "c1",
                "allow_once",
                Reviewer::Person("ana".into()),
                None,
            )
            .await;
        assert!(
            matches!(
                again,
                Err(Error::Rejected(Rejection::NotPendingApproval { .. }))
            ),
            "{:?}",
            again.err()
        );
        let wait = std::time::Duration::from_secs(10);
        let dispatched = tokio::time::timeout(wait, work.recv()).await;
        let ferry_proto::bus::Work::Dispatch { invocation, .. } = dispatched
            .expect("the call is handed to the workers")
            .unwrap();
        assert_eq!(invocation.id, "c1");
    }

    /// The gate's deadline is kept to the second; it is rounded up, never
    /// down (rounded down, a timeout of 1 s can fire after 0.04 s).
    #[tokio::test]
    async fn an_approval_deadline_is_never_before_its_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(Arc::new(SledStore::open(dir.path()).unwrap()));
        for _ in 0..20 {
            let earliest = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
            let gate = engine
                .gate(&Identity::anonymous(), "demo.echo@1.0.0", 1, "g", None)
                .await
                .unwrap();
            let deadline = gate.deadline.to_system_time();
            assert!(deadline >= earliest, "{} is early", gate.deadline);
            tokio::time::sleep(std::time::Duration::from_millis(37)).await;
        }
    }

    /// The sweep ends only the timers armed before its listing: a call
    /// accepted (and armed) while it walks every thread is not in its list,
    /// yet still waits for its timeout (ended by this sweep, such a timeout
    /// would fire a minute late, at the next one).
    #[tokio::test]
    async fn a_sweep_ends_only_timers_armed_before_it_listed_the_calls() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(engine(Arc::new(SledStore::open(dir.path()).unwrap())));
        let armed = |id: &str| {
            let new = call(id, "a");
            let mut record = crate::thread::CallRecord::queued(
                id,
                new.submission,
                new.tool,
                None,
                1,
                Timestamp::UNIX_EPOCH,
            );
            record.approval_deadline = Some("2099-01-01T00:00:00Z".parse().unwrap());
            engine.arm("g", &record);
        };
        armed("decided-elsewhere");
        let before = engine.armed_keys();
        armed("accepted-during-the-sweep");
        engine.disarm_all_but(&Default::default(), &before);
        let left: Vec<String> = engine.armed_keys().into_iter().map(|(_, id)| id).collect();
        assert_eq!(left, ["accepted-during-the-sweep"]);
    }

    /// Recovery re-arms every pending approval each time it runs (every
    /// minute on a cluster worker): one timer per call, not one per sweep.
    #[tokio::test]
    async fn an_approval_timeout_is_armed_once_and_a_decision_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(engine(Arc::new(SledStore::open(dir.path()).unwrap())));
        engine.start_timers();
        let new = call("c1", "a");
        let mut record = crate::thread::CallRecord::queued(
            "c1",
            new.submission,
            new.tool,
            None,
            1,
            Timestamp::UNIX_EPOCH,
        );
        record.approval_deadline = Some("2099-01-01T00:00:00Z".parse().unwrap());
        let armed = || engine.armed.lock().unwrap().len();
        for _ in 0..3 {
            engine.arm("g", &record);
        }
        assert_eq!(armed(), 1);
        engine.disarm("g", "c1");
        assert_eq!(armed(), 0);
        engine.arm("g", &record);
        assert_eq!(armed(), 1, "a call armed again after a decision");
        // The recovery sweep ends the timers of calls no longer pending (here
        // one the store never held: decided elsewhere, say).
        let (_, asking) = engine.rearm(std::time::Duration::MAX).await.unwrap();
        assert_eq!(
            asking.await.checked,
            0,
            "no call is old enough to ask about"
        );
        assert_eq!(armed(), 0);
    }
}
