//! Metric names of dispatch, described once at start-up.

use metrics::{describe_counter, describe_histogram, Unit};

pub const DISPATCH_ATTEMPTS: &str = "ferry_dispatch_attempts_total";
pub const DISPATCH_OUTCOMES: &str = "ferry_dispatch_outcomes_total";
pub const DISPATCH_LATENCY: &str = "ferry_dispatch_latency_seconds";

pub fn describe() {
    describe_counter!(DISPATCH_ATTEMPTS, "invocation POSTs to tools, by result");
    describe_counter!(
        DISPATCH_OUTCOMES,
        "dispatches ended: acknowledged, refused, unreachable, exhausted, not_wanted"
    );
    describe_histogram!(
        DISPATCH_LATENCY,
        Unit::Seconds,
        "from the first attempt to the tool's acknowledgement or giving up, retries included"
    );
}

pub(crate) fn record_attempt(result: &'static str) {
    metrics::counter!(DISPATCH_ATTEMPTS, "result" => result).increment(1);
}

pub(crate) fn record_outcome(outcome: &'static str, seconds: f64) {
    metrics::counter!(DISPATCH_OUTCOMES, "outcome" => outcome).increment(1);
    metrics::histogram!(DISPATCH_LATENCY).record(seconds);
}
