//! What a bench run found: each side's [`Stats`], one [`Row`] per mode and
//! caller count, and the [`Report`] printed as a Markdown table or as JSON.

use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use super::{TARGET_CALLERS, TARGET_RATIO};

/// What one side (baseline or Ferry) did at one caller count.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// Calls completed inside the measured window.
    pub calls: u64,
    pub errors: u64,
    pub calls_per_sec: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// CPU time (user + system, every thread) of this process and, for a
    /// cluster, its `nats-server`, in the measured windows, per counted
    /// call.
    pub cpu_us_per_call: Option<f64>,
    /// For a cluster: the messages Ferry's processes sent NATS (publishes,
    /// direct gets, acks, replies: `in_msgs` of its `/varz`) in the
    /// measured windows, per counted call. A count of work, so unlike
    /// calls/s it does not drift with the machine's speed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats_msgs_per_call: Option<f64>,
    /// For a cluster: the messages JetStream's streams stored (commits,
    /// call copies) in the measured windows, per counted call. Also a
    /// count of work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_msgs_per_call: Option<f64>,
    /// TCP segments the machine retransmitted in the measured windows
    /// (`RetransSegs` of `/proc/net/snmp`). On loopback most are tail-loss
    /// probes: a sender's ACK came late (a busy receiver), it sent its last
    /// segment again, and nothing waited. `None` where it cannot be read.
    pub tcp_retransmits: Option<u64>,
    /// Of those, the ones sent because the retransmission timer ran out
    /// (`TCPTimeouts` of `/proc/net/netstat`): each is a stall of at least
    /// 200 ms, which a starved machine causes and Ferry's seven messages
    /// per call meet more often than the baseline's four, so a run with
    /// any says more about the machine than about Ferry.
    pub tcp_timeouts: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// One concurrency level of one deployment: the baseline beside Ferry.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `serve`, or `cluster RxW` (runtime nodes x workers).
    pub mode: String,
    pub callers: usize,
    pub baseline: Stats,
    pub ferry: Stats,
    /// Ferry's calls/s over the baseline's, pooled over the rounds.
    pub ratio: f64,
    /// The same ratio in each round, to show its spread.
    pub round_ratios: Vec<f64>,
    /// Ferry's calls/s in each round.
    pub round_calls_per_sec: Vec<f64>,
    /// The baseline's CPU per call over Ferry's: what the calls/s ratio
    /// would be if both got the same CPU. Steadier than the calls/s ratio
    /// when the machine's speed drifts.
    pub cpu_ratio: Option<f64>,
}

/// Every level, with the run's parameters.
#[derive(Debug, Clone)]
pub struct Report {
    pub duration: Duration,
    pub warmup: Duration,
    pub rounds: usize,
    pub rows: Vec<Row>,
    /// `--consumers`: delivery through a consumer, per way and level.
    pub deliveries: Vec<super::delivery::DeliveryRow>,
}

impl Row {
    /// Whether either side's windows saw a TCP retransmission timeout.
    fn stalled(&self) -> bool {
        [&self.baseline, &self.ferry]
            .iter()
            .any(|s| s.tcp_timeouts.is_some_and(|n| n > 0))
    }
}

impl Report {
    /// Whether the target level met the ratio; `None` if it was not run.
    pub fn target_met(&self) -> Option<bool> {
        let row = self
            .rows
            .iter()
            .find(|r| r.callers == TARGET_CALLERS && r.mode == "serve")?;
        Some(row.ratio >= TARGET_RATIO)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "duration_s": self.duration.as_secs_f64(),
            "warmup_s": self.warmup.as_secs_f64(),
            "rounds": self.rounds,
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "rows": self.rows,
            "deliveries": self.deliveries,
            "target": {
                "callers": TARGET_CALLERS,
                "min_ratio": TARGET_RATIO,
                "met": self.target_met(),
            },
        })
    }

    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| mode | callers | baseline calls/s | ferry calls/s | ferry calls/s per round | ratio | ratio per round | baseline p50/p99 ms | ferry p50/p99 ms | CPU µs/call baseline / ferry | CPU ratio | NATS msgs/call | stored msgs/call | TCP retransmits (timeouts) baseline / ferry |\n\
             |---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.rows {
            let rounds: Vec<String> = r.round_ratios.iter().map(|x| format!("{x:.2}")).collect();
            let rates: Vec<String> = r
                .round_calls_per_sec
                .iter()
                .map(|x| format!("{x:.0}"))
                .collect();
            out += &format!(
                "| {} | {} | {:.0} | {:.0} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.mode,
                r.callers,
                r.baseline.calls_per_sec,
                r.ferry.calls_per_sec,
                rates.join(" "),
                r.ratio,
                rounds.join(" "),
                latency(&r.baseline),
                latency(&r.ferry),
                cpu(&r.baseline, &r.ferry),
                r.cpu_ratio.map_or("-".into(), |x| format!("{x:.2}")),
                r.ferry
                    .nats_msgs_per_call
                    .map_or("-".into(), |x| format!("{x:.1}")),
                r.ferry
                    .stored_msgs_per_call
                    .map_or("-".into(), |x| format!("{x:.2}")),
                retransmits(&r.baseline, &r.ferry),
            );
        }
        out += &format!(
            "\n{} rounds of {:.1} s measured (after {:.1} s warmup) per side and level.\n",
            self.rounds,
            self.duration.as_secs_f64(),
            self.warmup.as_secs_f64()
        );
        out += "\n";
        for r in &self.rows {
            for (side, s) in [("baseline", &r.baseline), ("ferry", &r.ferry)] {
                if s.errors > 0 {
                    out += &format!(
                        "{} {} callers, {side}: {} errors (first: {})\n",
                        r.mode,
                        r.callers,
                        s.errors,
                        s.first_error.as_deref().unwrap_or("?")
                    );
                }
            }
        }
        if let Some(stalled) = self.rows.iter().find(|r| r.stalled()) {
            out += &format!(
                "Loopback stalls: TCP retransmission timeouts in the measured windows ({} {} callers: {}). \
                 Each is a stall of 200 ms or more, from the machine rather than Ferry; rerun when they are gone.\n",
                stalled.mode,
                stalled.callers,
                retransmits(&stalled.baseline, &stalled.ferry)
            );
        }
        out += &match self.target_met() {
            Some(met) => format!(
                "Target (ferry >= {TARGET_RATIO} x baseline calls/s at {TARGET_CALLERS} callers): {}\n",
                if met { "met" } else { "NOT met" }
            ),
            None => format!("Target not measured: no run at {TARGET_CALLERS} callers.\n"),
        };
        if !self.deliveries.is_empty() {
            out += "\n";
            out += &super::delivery::markdown(&self.deliveries);
        }
        out
    }
}

/// `p50 / p99` in milliseconds, or `-` when nothing completed.
fn latency(s: &Stats) -> String {
    match (s.p50_ms, s.p99_ms) {
        (Some(p50), Some(p99)) => format!("{p50:.2} / {p99:.2}"),
        _ => "-".to_owned(),
    }
}

/// `retransmits (timeouts)` per side.
fn retransmits(baseline: &Stats, ferry: &Stats) -> String {
    both_sides(baseline, ferry, |s| {
        let timeouts = s.tcp_timeouts.map_or("-".into(), |n| n.to_string());
        s.tcp_retransmits.map(|n| format!("{n} ({timeouts})"))
    })
}

fn cpu(baseline: &Stats, ferry: &Stats) -> String {
    both_sides(baseline, ferry, |s| {
        s.cpu_us_per_call.map(|x| format!("{x:.0}"))
    })
}

/// `baseline / ferry` of one figure, `-` where a side has none.
fn both_sides(
    baseline: &Stats,
    ferry: &Stats,
    figure: impl Fn(&Stats) -> Option<String>,
) -> String {
    let shown = |s| figure(s).unwrap_or_else(|| "-".into());
    format!("{} / {}", shown(baseline), shown(ferry))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_row_with_retransmission_timeouts_is_flagged_as_stalled() {
        let stats = |retransmits, timeouts| Stats {
            calls: 10,
            errors: 0,
            calls_per_sec: 10.0,
            p50_ms: Some(1.0),
            p99_ms: Some(2.0),
            cpu_us_per_call: None,
            nats_msgs_per_call: None,
            stored_msgs_per_call: None,
            tcp_retransmits: retransmits,
            tcp_timeouts: timeouts,
            first_error: None,
        };
        let report = |ferry| Report {
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            rounds: 1,
            rows: vec![Row {
                mode: "serve".into(),
                callers: TARGET_CALLERS,
                baseline: stats(Some(0), Some(0)),
                ferry,
                ratio: 1.0,
                round_ratios: vec![1.0],
                round_calls_per_sec: vec![10.0],
                cpu_ratio: None,
            }],
            deliveries: vec![],
        };
        let calm = report(stats(Some(0), Some(0))).markdown();
        assert!(calm.contains("| 0 (0) / 0 (0) |"), "{calm}");
        assert!(!calm.contains("Loopback stalls"), "{calm}");
        let unknown = report(stats(None, None)).markdown();
        assert!(unknown.contains("| 0 (0) / - |"), "{unknown}");
        assert!(!unknown.contains("Loopback stalls"), "{unknown}");
        // Tail-loss probes alone: late ACKs, nothing waited.
        let probed = report(stats(Some(34), Some(0))).markdown();
        assert!(probed.contains("| 0 (0) / 34 (0) |"), "{probed}");
        assert!(!probed.contains("Loopback stalls"), "{probed}");
        let stalled = report(stats(Some(3), Some(2))).markdown();
        assert!(stalled.contains("| 0 (0) / 3 (2) |"), "{stalled}");
        assert!(
            stalled.contains("Loopback stalls: TCP retransmission timeouts in the measured windows (serve 64 callers: 0 (0) / 3 (2))"),
            "{stalled}"
        );
    }
}
