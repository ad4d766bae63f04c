//! Metric names of dispatch, described once at start-up.

use metrics::{describe_counter, describe_histogram, Unit};

pub const DISPATCH_ATTEMPTS: &str = "ferry_dispatch_attempts_total";
pub const DISPATCH_OUTCOMES: &str = "ferry_dispatch_outcomes_total";
pub const DISPATCH_LATENCY: &str = "ferry_dispatch_latency_seconds";

/// Bucket bounds of [`DISPATCH_LATENCY`], in seconds: a loopback ack takes
/// a millisecond, retries with backoff take seconds to minutes.
pub const DISPATCH_LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

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
