//! The thread state machine, pure: `decide(state, command) -> changes |
//! rejection`, then `apply` numbers the changes into events and folds them
//! into the state. No I/O, no clocks: the caller passes the time.
//!
//! **Invariant:** state changes only through `evolve` of an event, so a
//! thread's metadata is exactly the fold of its log.

mod decide;
mod evolve;
mod reviewer;
mod state;

pub use decide::{decide, Answer, Change, Command, Decision, Outcome, Rejection};
pub use evolve::{apply, evolve};
pub use reviewer::{Reviewer, GRANT_REVIEWER_PREFIX, MAX_REVIEWER_BYTES};
pub use state::{
    grant_key, ApprovalRecord, CallRecord, ChoiceAnswer, Gate, NewCall, Submission, ThreadMeta,
    ThreadState,
};

/// The text of the failure Ferry records when a tool server no longer knows
/// a call it was sent (`rap-3`, recovery).
pub const LOST_CALL_TEXT: &str = "Error: the tool server is no longer processing this call";

/// The final subscription event Ferry records when a tool server no longer
/// knows an active subscription.
pub const LOST_SUBSCRIPTION_TEXT: &str =
    "Error: the tool server is no longer processing this subscription";

/// Active subscriptions one thread may hold (`rap-3`: "A runtime should
/// bound the number of active subscriptions per thread"). A result that
/// would open one more is recorded, and its subscription cancelled at once.
pub const MAX_ACTIVE_SUBSCRIPTIONS: usize = 64;

/// Live views (`view_type`s) one thread may hold. Their latest contents are
/// part of the thread's metadata, which every command loads and every
/// commit carries: a tool inventing view types without end would make the
/// thread heavier with each one.
pub const MAX_VIEWS: usize = 32;

/// The `Idempotency-Key`s a call remembers: those of its most recent keyed
/// callbacks that recorded something, oldest dropped first. A key is
/// remembered among its call's last 64 keyed callbacks, not for a time: a
/// tool's retry of a callback comes before many more of the same call's.
/// Bounded because the keys live in the call's record, which every commit
/// touching the call carries (up to 64 keys of at most 256 bytes each).
pub const MAX_IDEMPOTENCY_KEYS: usize = 64;

/// The bytes (names, and contents as JSON) one thread's views may hold
/// together, for the same reason: every later commit of the thread carries
/// them. A cluster commit must also fit NATS's `max_payload` (1 MiB by
/// default) beside the request it records.
pub const MAX_VIEW_BYTES: usize = 128 * 1024;

#[cfg(test)]
mod tests;
