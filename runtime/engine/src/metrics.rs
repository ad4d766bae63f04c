//! Metric names of the runtime, described once at start-up.

use metrics::{describe_counter, describe_gauge};

pub const CALLS_ACCEPTED: &str = "ferry_calls_accepted_total";
pub const CALLS_REJECTED: &str = "ferry_calls_rejected_total";
pub const CALLBACKS: &str = "ferry_callbacks_total";
pub const OUTCOMES: &str = "ferry_call_outcomes_total";
pub const ACTIVE_SUBSCRIPTIONS: &str = "ferry_active_subscriptions";
pub const WRITE_CONFLICTS: &str = "ferry_write_conflicts_total";
pub const UNAUTHORIZED: &str = "ferry_api_unauthorized_total";

/// Registers descriptions with whatever recorder is installed.
pub fn describe() {
    describe_counter!(CALLS_ACCEPTED, "calls accepted and made durable");
    describe_counter!(CALLS_REJECTED, "calls refused, by error code");
    describe_counter!(
        CALLBACKS,
        "tool callbacks received, by type and outcome (applied, duplicate, ignored, rejected)"
    );
    describe_counter!(OUTCOMES, "calls ended, by status");
    describe_counter!(
        UNAUTHORIZED,
        "native API requests refused for a missing or wrong --api-token"
    );
    describe_counter!(
        WRITE_CONFLICTS,
        "thread writes that lost a compare-and-set race and were decided again"
    );
    describe_gauge!(
        ACTIVE_SUBSCRIPTIONS,
        "subscriptions opened minus closed since start"
    );
    ferry_dispatch::metrics::describe();
}
