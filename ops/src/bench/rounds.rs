//! The measurement plan: each level as alternating rounds of the baseline and
//! Ferry, pooled into report rows.

use std::time::Duration;

use super::baseline::Baseline;
use super::ferry::Ferry;
use super::load::{drive, summarize, Tally};
use super::report::Row;

/// How long each side runs, and how often.
pub(super) struct Plan {
    pub(super) warmup: Duration,
    pub(super) duration: Duration,
    pub(super) rounds: usize,
}

impl Plan {
    /// One level: the baseline and Ferry in alternating rounds, pooled.
    pub(super) async fn compare(
        &self,
        mode: String,
        callers: usize,
        baseline: &Baseline,
        ferry: &Ferry,
    ) -> Row {
        let mut rows = self
            .compare_each(callers, baseline, &[(mode, ferry.clone())])
            .await;
        rows.pop().expect("one target, one row")
    }

    /// One level for several deployments of Ferry: each round measures
    /// every deployment in turn, each beside its own baseline round, so a
    /// drift of the machine's speed hits every deployment alike.
    pub(super) async fn compare_each(
        &self,
        callers: usize,
        baseline: &Baseline,
        targets: &[(String, Ferry)],
    ) -> Vec<Row> {
        let mut tallies: Vec<(Tally, Tally, Vec<f64>, Vec<f64>)> = targets
            .iter()
            .map(|_| (Tally::default(), Tally::default(), vec![], vec![]))
            .collect();
        for _ in 0..self.rounds {
            for ((_, ferry), (base, fer, round_ratios, round_rates)) in
                targets.iter().zip(&mut tallies)
            {
                let b = baseline.clone();
                let round_base = drive(
                    callers,
                    self.warmup,
                    self.duration,
                    (&[], None),
                    move |c, n| b.clone().call(c, n),
                )
                .await;
                let f = ferry.clone();
                let others = (&ferry.processes[..], ferry.nats_varz.clone());
                let round_fer = drive(callers, self.warmup, self.duration, others, move |c, n| {
                    f.clone().call(callers, c, n)
                })
                .await;
                round_ratios.push(ratio(round_fer.latencies.len(), round_base.latencies.len()));
                round_rates.push(round_fer.latencies.len() as f64 / self.duration.as_secs_f64());
                base.merge(round_base);
                fer.merge(round_fer);
            }
        }
        let window = self.duration * self.rounds as u32;
        targets
            .iter()
            .zip(tallies)
            .map(
                |((mode, _), (base, fer, round_ratios, round_calls_per_sec))| {
                    let baseline = summarize(base, window);
                    let ferry = summarize(fer, window);
                    Row {
                        mode: mode.clone(),
                        callers,
                        ratio: ratio(ferry.calls as usize, baseline.calls as usize),
                        round_ratios,
                        round_calls_per_sec,
                        cpu_ratio: baseline
                            .cpu_us_per_call
                            .zip(ferry.cpu_us_per_call)
                            .map(|(b, f)| b / f),
                        baseline,
                        ferry,
                    }
                },
            )
            .collect()
    }
}

/// Ferry's calls over the baseline's in the same time.
fn ratio(ferry: usize, baseline: usize) -> f64 {
    if baseline == 0 {
        0.0
    } else {
        ferry as f64 / baseline as f64
    }
}
