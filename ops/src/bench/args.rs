//! `ferry bench`'s flags: [`BenchArgs`], the parsers of its values, and the
//! check of its seconds arguments.

use std::time::Duration;

use anyhow::Context;

/// `ferry bench` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Seconds measured per round (each of baseline and Ferry, per level).
    #[arg(long, default_value_t = 3.0)]
    pub duration: f64,
    /// Rounds per level: each measures the baseline, then Ferry. The
    /// figures pool every round; alternating keeps a drift of the machine's
    /// speed (±20% over seconds here) from favouring one side.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds of unmeasured calls before each measured run.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Concurrent callers per level, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub concurrency: Vec<usize>,
    /// Print the results as JSON instead of a Markdown table.
    #[arg(long)]
    pub json: bool,
    /// Also measure cluster mode (runtime nodes x workers on a real
    /// nats-server) beside the same baseline.
    #[arg(long)]
    pub cluster: bool,
    /// The nats-server binary for --cluster (default: target/nats/bin, then
    /// PATH).
    #[arg(long)]
    pub nats_server: Option<std::path::PathBuf>,
    /// JetStream's `sync_interval` for --cluster: `always` (every write on
    /// disk before its ack: what one durable server needs) or a duration
    /// such as `2m` (the default of NATS; durable only with R3).
    #[arg(long, default_value = "always", value_parser = sync_interval)]
    pub nats_sync_interval: String,
    /// The cluster shapes for --cluster, as NODESxWORKERS, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1x1,1x3,2x1,2x3", value_parser = shape)]
    pub shapes: Vec<(usize, usize)>,
    /// Runs each cluster node and worker as a process of its own, in a
    /// cgroup limited to this share of one core (0.1: a tenth), so that
    /// each stands for a host of its own and capacity can grow with
    /// nodes on a small machine. Needs a writable cgroup tree (v1 or v2).
    #[arg(long, value_parser = cpu_quota)]
    pub cpu_quota: Option<f64>,
    /// The partition counts each cluster shape runs with (`ferry runtime
    /// --partitions`), comma-separated: `1,4` runs every shape twice.
    #[arg(long, value_delimiter = ',', default_value = "1",
          value_parser = clap::value_parser!(u16).range(1..=ferry_nats::cluster::subjects::MAX_PARTITIONS as i64))]
    pub partitions: Vec<u16>,
    /// Also measure `ferry serve` locked down, in the same rounds: calls
    /// made with a named token bounded to the bench tool, under generous
    /// rate limits per identity, user and tool (what authentication and
    /// limits cost).
    #[arg(long)]
    pub secured: bool,
    /// Also measure delivery through a consumer at each level (serve):
    /// four pullers, then one webhook receiver, taking every result of the
    /// callers' threads while they run.
    #[arg(long)]
    pub consumers: bool,
}

/// A share of one core: more than 0, at most the machine's cores.
fn cpu_quota(text: &str) -> Result<f64, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    match text.parse::<f64>() {
        Ok(q) if q > 0.0 && q <= cores => Ok(q),
        _ => Err(format!(
            "{text:?} is not a share of a core between 0 and {cores}, such as 0.1"
        )),
    }
}

/// `2x3` → 2 runtime nodes and 3 workers, each at least 1.
fn shape(text: &str) -> Result<(usize, usize), String> {
    let parsed = text
        .split_once('x')
        .and_then(|(n, w)| Some((n.parse::<usize>().ok()?, w.parse::<usize>().ok()?)));
    match parsed {
        Some((nodes, workers)) if nodes >= 1 && workers >= 1 => Ok((nodes, workers)),
        _ => Err(format!(
            "{text:?} is not NODESxWORKERS (each at least 1), such as 2x3"
        )),
    }
}

/// `always`, or a duration as NATS reads one (`2m`, `500ms`, `1m30s`,
/// `1.5s`): the value goes into the server's configuration file as it is.
fn sync_interval(text: &str) -> Result<String, String> {
    const UNITS: [&str; 7] = ["ns", "us", "µs", "ms", "s", "m", "h"];
    let mut rest = text;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = |s: &str| s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let whole = digits(rest);
        let number = match rest[whole..].strip_prefix('.') {
            Some(after) if whole > 0 && digits(after) > 0 => whole + 1 + digits(after),
            _ => whole,
        };
        let unit = UNITS
            .iter()
            .filter(|u| rest[number..].starts_with(*u))
            .max_by_key(|u| u.len());
        match unit {
            Some(unit) if number > 0 => rest = &rest[number + unit.len()..],
            _ => break,
        }
        parts += 1;
    }
    if text == "always" || (parts > 0 && rest.is_empty()) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is neither `always` nor a duration such as 2m, 500ms or 1m30s"
        ))
    }
}

/// Reads a seconds argument; `zero_ok` for the warmup, which may be skipped.
pub(super) fn secs(name: &str, value: f64, zero_ok: bool) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| zero_ok || !d.is_zero())
        .with_context(|| format!("{name} must be a positive number of seconds, got {value}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_nodes_by_workers_of_at_least_one() {
        assert_eq!(shape("2x3"), Ok((2, 3)));
        for bad in ["", "2", "x3", "2x", "0x1", "1x0", "-1x2", "2x3x4", "axb"] {
            assert!(shape(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn sync_intervals_are_always_or_a_duration() {
        for good in [
            "always", "2m", "500ms", "1m30s", "10s", "1h", "250us", "1.5s",
        ] {
            assert_eq!(sync_interval(good).as_deref(), Ok(good));
        }
        for bad in [
            "",
            "bogus",
            "2",
            "m",
            "2x",
            "2m\nlisten: 0",
            "-1s",
            "1.s",
            ".5s",
            "Always",
        ] {
            assert!(sync_interval(bad).is_err(), "{bad:?} accepted");
        }
    }
}
