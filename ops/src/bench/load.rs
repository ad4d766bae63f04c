//! The closed-loop load generator: callers making calls back to back for a
//! warmup and a measured window, what they did, and its summary.

use std::future::Future;
use std::time::{Duration, Instant};

use super::counters::Counters;
use super::report::Stats;

/// What callers did over a run.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) latencies: Vec<Duration>,
    errors: u64,
    first_error: Option<String>,
    /// What the machine did in the measured window.
    window: Counters,
}

impl Tally {
    pub(super) fn merge(&mut self, other: Tally) {
        self.window.add(other.window);
        self.latencies.extend(other.latencies);
        self.errors += other.errors;
        self.first_error = self.first_error.take().or(other.first_error);
    }
}

/// Runs `callers` concurrent loops of `call(caller, n)` for warmup plus
/// duration. A call counts if it ends inside the measured window; its
/// latency is from just before it started to its end. No new call starts
/// once the window is over. `others` are processes doing Ferry's work
/// beside this one; `varz`, a `nats-server`'s, whose messages are counted.
pub(super) async fn drive<F, Fut>(
    callers: usize,
    warmup: Duration,
    duration: Duration,
    (others, varz): (&[u32], Option<String>),
    call: F,
) -> Tally
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let begin = Instant::now() + warmup;
    let end = begin + duration;
    let processes: Vec<String> = std::iter::once("self".to_owned())
        .chain(others.iter().map(u32::to_string))
        .collect();
    let window = tokio::spawn(async move {
        tokio::time::sleep_until(begin.into()).await;
        let before = Counters::read(&processes, varz.as_deref()).await;
        tokio::time::sleep_until(end.into()).await;
        Counters::read(&processes, varz.as_deref())
            .await
            .since(before)
    });
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                for n in 0.. {
                    let started = Instant::now();
                    if started >= end {
                        break;
                    }
                    let outcome = call(caller, n).await;
                    let ended = Instant::now();
                    if ended < begin || ended > end {
                        continue;
                    }
                    match outcome {
                        Ok(()) => tally.latencies.push(ended - started),
                        Err(e) => {
                            tally.errors += 1;
                            tally.first_error.get_or_insert_with(|| format!("{e:#}"));
                        }
                    }
                }
                tally
            })
        })
        .collect();
    let mut all = Tally::default();
    for task in tasks {
        if let Ok(t) = task.await {
            all.merge(t);
        }
    }
    all.window = window.await.unwrap_or_default();
    all
}

pub(super) fn summarize(mut tally: Tally, duration: Duration) -> Stats {
    tally.latencies.sort_unstable();
    let ms = |p| percentile(&tally.latencies, p).map(|d| d.as_secs_f64() * 1e3);
    Stats {
        calls: tally.latencies.len() as u64,
        errors: tally.errors,
        calls_per_sec: tally.latencies.len() as f64 / duration.as_secs_f64(),
        p50_ms: ms(50.0),
        p99_ms: ms(99.0),
        cpu_us_per_call: (!tally.latencies.is_empty())
            .then(|| tally.window.cpu.as_secs_f64() * 1e6 / tally.latencies.len() as f64),
        nats_msgs_per_call: tally
            .window
            .nats_msgs
            .filter(|_| !tally.latencies.is_empty())
            .map(|m| m as f64 / tally.latencies.len() as f64),
        stored_msgs_per_call: tally
            .window
            .stored_msgs
            .filter(|_| !tally.latencies.is_empty())
            .map(|m| m as f64 / tally.latencies.len() as f64),
        tcp_retransmits: tally.window.tcp_retransmits,
        tcp_timeouts: tally.window.tcp_timeouts,
        first_error: tally.first_error,
    }
}

/// Nearest-rank percentile (`p` in 0..=100) of sorted samples: the smallest
/// sample with at least `p`% of the samples at or below it.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        let hundred: Vec<u64> = (1..=100).collect();
        let cases: &[(&[u64], f64, Option<u64>)] = &[
            (&[], 50.0, None),
            (&[7], 0.0, Some(7)),
            (&[7], 50.0, Some(7)),
            (&[7], 99.0, Some(7)),
            (&[1, 2], 50.0, Some(1)),
            (&[1, 2], 51.0, Some(2)),
            (&[1, 2, 3], 50.0, Some(2)),
            (&hundred, 50.0, Some(50)),
            (&hundred, 99.0, Some(99)),
            (&hundred, 100.0, Some(100)),
            (&hundred, 0.0, Some(1)),
        ];
        for &(samples, p, want) in cases {
            assert_eq!(
                percentile(&ms(samples), p),
                want.map(Duration::from_millis),
                "p{p} of {samples:?}"
            );
        }
    }
}
