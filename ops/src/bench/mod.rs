//! `ferry bench`: the whole path (submit, dispatch to a RAP tool on loopback,
//! callback, result readable) against a baseline measured in the same run —
//! the same client talking RAP directly to the same tool, nothing durable.
//!
//! Everything runs in this one process: the instant tool, the baseline's
//! callback receiver, a real Ferry (`serve::start` on sled in a temporary
//! directory, fsync group commit included) and the callers. The figures are
//! therefore ratios on one machine, not absolute capacities.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use ferry_proto::api::{Event, EventKind, SubmitCall};
use ferry_proto::rap::{Callback, Invocation, Manifest, ToolDef, ToolResult};
use futures::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::serve::{start, ServeOptions};

mod cluster;
mod quota;

/// The target: Ferry's throughput at 64 callers is at least this
/// fraction of the baseline's.
pub const TARGET_RATIO: f64 = 0.25;
/// The caller count the target is stated for.
pub const TARGET_CALLERS: usize = 64;
/// Longest a single call may take before it counts as an error; generous,
/// so that a slow call shows in p99 rather than as an error.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The toolset and tool the bench registers and calls.
const TOOLSET: &str = "bench";
const TOOL: &str = "echo";

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

/// Runs the bench and prints its report; the exit status does not depend on
/// the ratio, because this is a measurement, not a test.
pub async fn main(args: BenchArgs) -> anyhow::Result<()> {
    let report = run(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.markdown());
    }
    Ok(())
}

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

/// Nearest-rank percentile (`p` in 0..=100) of sorted samples: the smallest
/// sample with at least `p`% of the samples at or below it.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Reads a seconds argument; `zero_ok` for the warmup, which may be skipped.
fn secs(name: &str, value: f64, zero_ok: bool) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| zero_ok || !d.is_zero())
        .with_context(|| format!("{name} must be a positive number of seconds, got {value}"))
}

/// Starts the tool, the baseline receiver and Ferry, then measures each
/// level: baseline first, then Ferry.
pub async fn run(args: &BenchArgs) -> anyhow::Result<Report> {
    let duration = secs("--duration", args.duration, false)?;
    let warmup = secs("--warmup", args.warmup, true)?;
    ensure!(
        !args.concurrency.is_empty() && !args.concurrency.contains(&0),
        "--concurrency needs caller counts of at least 1"
    );
    ensure!(args.rounds >= 1, "--rounds must be at least 1");
    ensure!(
        args.cpu_quota.is_none() || args.cluster,
        "--cpu-quota limits cluster nodes and workers: give --cluster too"
    );
    let plan = Plan {
        warmup,
        duration,
        rounds: args.rounds,
    };
    let http = client()?;
    let tool = serve(tool_router(http.clone())).await?;
    let receiver = Receiver::start().await?;
    let data = tempfile::Builder::new().prefix("ferry-bench-").tempdir()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let options = ServeOptions {
        listen: "127.0.0.1:0".parse()?,
        data: data.path().to_owned(),
        tool_servers: vec![format!("http://{tool}")],
        ..ServeOptions::default()
    };
    let (running, server) = start(options, None, async {
        let _ = stopped.await;
    })
    .await?;
    let ferry = Ferry {
        http: http.clone(),
        bases: vec![format!("http://{}", running.addr)],
        run: uuid::Uuid::new_v4().simple().to_string()[..8].to_owned(),
        streams: Arc::default(),
        calls: Arc::default(),
        processes: vec![],
        nats_varz: None,
    };
    ferry.check_registered().await?;
    let baseline = Baseline {
        http,
        endpoint: format!("http://{tool}/invoke"),
        receiver,
    };
    let mut rows = Vec::new();
    for &callers in &args.concurrency {
        rows.push(
            plan.compare("serve".into(), callers, &baseline, &ferry)
                .await,
        );
    }
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    if args.cluster {
        // Every shape runs at once (idle but for its turn), so that each
        // round can measure them all in turn.
        let binary = cluster::nats_binary(args.nats_server.as_deref())?;
        let (mut deployments, mut targets) = (vec![], vec![]);
        let shapes = args
            .shapes
            .iter()
            .flat_map(|&(n, w)| args.partitions.iter().map(move |&k| (n, w, usize::from(k))));
        for (runtimes, workers, partitions) in shapes {
            let tool = format!("http://{tool}");
            let shape = cluster::Shape {
                runtimes,
                workers,
                partitions,
                cpu_quota: args.cpu_quota,
                tool: &tool,
            };
            let deployment = cluster::deploy(&binary, &args.nats_sync_interval, shape).await?;
            let ferry = Ferry {
                bases: deployment.bases.clone(),
                run: uuid::Uuid::new_v4().simple().to_string()[..8].to_owned(),
                streams: Arc::default(),
                calls: Arc::default(),
                processes: deployment.pids(),
                nats_varz: Some(deployment.nats_varz()),
                ..ferry.clone()
            };
            ferry.wait_registered().await?;
            deployments.push(deployment);
            let mut mode = format!("cluster {runtimes}x{workers}");
            if partitions > 1 {
                mode += &format!(" K={partitions}");
            }
            if let Some(quota) = args.cpu_quota {
                mode += &format!(" Q={quota}");
            }
            targets.push((mode, ferry));
        }
        for &callers in &args.concurrency {
            rows.extend(plan.compare_each(callers, &baseline, &targets).await);
        }
        drop(deployments);
    }
    Ok(Report {
        duration,
        warmup,
        rounds: args.rounds,
        rows,
    })
}

/// How long each side runs, and how often.
struct Plan {
    warmup: Duration,
    duration: Duration,
    rounds: usize,
}

impl Plan {
    /// One level: the baseline and Ferry in alternating rounds, pooled.
    async fn compare(
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
    async fn compare_each(
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

/// One HTTP client for every caller (and one for the tool's callbacks):
/// pooled keep-alive connections, never a proxy, since all is loopback.
/// Its timeout is per read, not per request: a caller's event stream stays
/// open across rounds (Ferry sends a keep-alive comment every 15 s).
fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(CALL_TIMEOUT)
        .read_timeout(CALL_TIMEOUT)
        .build()?)
}

/// Serves `router` on a fresh loopback port for the rest of the process.
async fn serve(router: Router) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener.tap_io(crate::serve::no_delay), router).await });
    Ok(addr)
}

/// What callers did over a run.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    errors: u64,
    first_error: Option<String>,
    /// What the machine did in the measured window.
    window: Counters,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.window.add(other.window);
        self.latencies.extend(other.latencies);
        self.errors += other.errors;
        self.first_error = self.first_error.take().or(other.first_error);
    }
}

/// The machine's counters: read at an edge of a measured window, so far;
/// as a difference of two readings, over the window.
#[derive(Default)]
struct Counters {
    /// CPU time of this process and the processes doing Ferry's work
    /// beside it.
    cpu: Duration,
    /// Messages sent to NATS, for a cluster.
    nats_msgs: Option<u64>,
    /// Messages stored in JetStream's streams, for a cluster.
    stored_msgs: Option<u64>,
    /// TCP segments the machine retransmitted.
    tcp_retransmits: Option<u64>,
    /// Its TCP retransmission timeouts.
    tcp_timeouts: Option<u64>,
}

impl Counters {
    /// Reads them now: the CPU of `processes` (`self` or pids), the
    /// messages of the `nats-server` whose `/varz` is given.
    async fn read(processes: &[String], varz: Option<&str>) -> Counters {
        Counters {
            cpu: processes.iter().map(|p| process_cpu(p)).sum(),
            nats_msgs: nats_in_msgs(varz).await,
            stored_msgs: jetstream_messages(varz).await,
            tcp_retransmits: tcp_retransmitted(),
            tcp_timeouts: tcp_timeouts(),
        }
    }

    /// From reading `before` to this one.
    fn since(self, before: Counters) -> Counters {
        let between = |before: Option<u64>, after: Option<u64>| {
            before.zip(after).map(|(b, a)| a.saturating_sub(b))
        };
        Counters {
            cpu: self.cpu.saturating_sub(before.cpu),
            nats_msgs: between(before.nats_msgs, self.nats_msgs),
            stored_msgs: between(before.stored_msgs, self.stored_msgs),
            tcp_retransmits: between(before.tcp_retransmits, self.tcp_retransmits),
            tcp_timeouts: between(before.tcp_timeouts, self.tcp_timeouts),
        }
    }

    /// Adds another window's; a count either lacks is the other's.
    fn add(&mut self, other: Counters) {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.cpu += other.cpu;
        self.nats_msgs = sum(self.nats_msgs, other.nats_msgs);
        self.stored_msgs = sum(self.stored_msgs, other.stored_msgs);
        self.tcp_retransmits = sum(self.tcp_retransmits, other.tcp_retransmits);
        self.tcp_timeouts = sum(self.tcp_timeouts, other.tcp_timeouts);
    }
}

/// Runs `callers` concurrent loops of `call(caller, n)` for warmup plus
/// duration. A call counts if it ends inside the measured window; its
/// latency is from just before it started to its end. No new call starts
/// once the window is over. `others` are processes doing Ferry's work
/// beside this one; `varz`, a `nats-server`'s, whose messages are counted.
async fn drive<F, Fut>(
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

/// `in_msgs` of a `nats-server`'s `/varz`: every message its clients sent
/// it so far. `None` without a server or when it did not answer.
async fn nats_in_msgs(varz: Option<&str>) -> Option<u64> {
    let varz: Value = reqwest::get(varz?).await.ok()?.json().await.ok()?;
    varz.get("in_msgs")?.as_u64()
}

/// `messages` of a `nats-server`'s `/jsz` (beside the `/varz` given):
/// every message its JetStream streams hold. Ferry's streams keep every
/// message (limits retention, no age), so its growth over a window is
/// what the window stored.
async fn jetstream_messages(varz: Option<&str>) -> Option<u64> {
    let jsz = varz?.strip_suffix("/varz")?.to_owned() + "/jsz";
    let jsz: Value = reqwest::get(jsz).await.ok()?.json().await.ok()?;
    jsz.get("messages")?.as_u64()
}

/// TCP segments this machine (its network namespace) retransmitted so
/// far; `None` where that cannot be read.
fn tcp_retransmitted() -> Option<u64> {
    let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
    kernel_counter(&snmp, "Tcp:", "RetransSegs")
}

/// The retransmission timeouts this machine's TCP had so far; `None`
/// where that cannot be read.
fn tcp_timeouts() -> Option<u64> {
    let netstat = std::fs::read_to_string("/proc/net/netstat").ok()?;
    kernel_counter(&netstat, "TcpExt:", "TCPTimeouts")
}

/// One counter of `/proc/net/snmp` or `/proc/net/netstat`: each group is
/// two lines starting with its `prefix`, a header of field names, then
/// their values in the same order.
fn kernel_counter(table: &str, prefix: &str, name: &str) -> Option<u64> {
    let mut group = table.lines().filter_map(|l| l.strip_prefix(prefix));
    let (names, values) = (group.next()?, group.next()?);
    let at = names.split_whitespace().position(|n| n == name)?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// User plus system CPU time of every thread of a process (`self` or a
/// pid) so far, from `/proc/{process}/stat` (in clock ticks of 1/100 s,
/// Linux's fixed `USER_HZ`); zero where that file does not exist.
fn process_cpu(process: &str) -> Duration {
    cpu_of_stat(&std::fs::read_to_string(format!("/proc/{process}/stat")).unwrap_or_default())
}

/// utime + stime of a `/proc/{pid}/stat` line.
fn cpu_of_stat(stat: &str) -> Duration {
    // The fields after the command name, which is in parentheses and may
    // hold spaces or parentheses: state is field 3, utime 14 and stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

fn summarize(mut tally: Tally, duration: Duration) -> Stats {
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

// ---------------------------------------------------------------- the tool

/// The instant RAP tool: acks every invocation at once and sends the result
/// straight away, so that what is measured is the path, not the tool.
fn tool_router(http: reqwest::Client) -> Router {
    Router::new()
        .route("/.well-known/rap-toolset", get(manifest))
        .route("/invoke", post(invoke))
        .with_state(http)
}

/// The manifest names the endpoint by the `Host` the caller used.
async fn manifest(headers: HeaderMap) -> Json<Manifest> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    Json(Manifest {
        name: TOOLSET.to_owned(),
        description: Some("Ferry's bench tool: answers at once.".to_owned()),
        endpoint: format!("http://{host}/invoke"),
        tools: vec![ToolDef {
            name: TOOL.to_owned(),
            description: "Answers with the given text, at once.".to_owned(),
            input_schema: json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            }),
            annotations: None,
            display_script: None,
        }],
        needs_migration: None,
    })
}

/// Acks 200 and calls back in a spawned task (rap-1: never block the ack).
async fn invoke(State(http): State<reqwest::Client>, body: Bytes) -> StatusCode {
    let Ok(inv) = serde_json::from_slice::<Invocation>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    tokio::spawn(call_back(http, inv));
    StatusCode::OK
}

/// POSTs the echo result to the invocation's callback URL; retried twice on
/// a transport error or 5xx so that a transient hiccup is not a lost call.
async fn call_back(http: reqwest::Client, inv: Invocation) {
    let text = match inv.arguments.get("text").and_then(Value::as_str) {
        Some(t) if inv.operation == TOOL => t.to_owned(),
        _ => format!("Error: the bench tool only has {TOOL}(text)"),
    };
    let result = Callback::ToolResult(ToolResult {
        group_id: inv.group_id,
        id: inv.id,
        call_id: inv.call_id,
        text: Some(text),
        content: None,
        display_as: None,
        subscription: false,
    });
    for attempt in 1..=3 {
        match http.post(&inv.callback_url).json(&result).send().await {
            Ok(r) if !r.status().is_server_error() => return,
            Ok(r) => tracing::warn!(status = %r.status(), attempt, "bench callback failed"),
            Err(e) => tracing::warn!(error = %e, attempt, "bench callback failed"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ------------------------------------------------------------ the baseline

/// Pending baseline calls by `id`, each woken when its callback arrives.
type Pending = Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>;

/// The baseline's callback receiver: a loopback server that completes the
/// pending call a `tool_result` names. It keeps nothing.
#[derive(Clone)]
struct Receiver {
    url: String,
    pending: Pending,
}

impl Receiver {
    async fn start() -> anyhow::Result<Self> {
        let pending = Pending::default();
        let router = Router::new()
            .route("/cb", post(receive))
            .with_state(pending.clone());
        let addr = serve(router).await?;
        Ok(Self {
            url: format!("http://{addr}/cb"),
            pending,
        })
    }

    fn expect(&self, id: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id.to_owned(), tx);
        rx
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<()>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Parses the callback as Ferry would and wakes the waiting caller.
async fn receive(State(pending): State<Pending>, body: Bytes) -> StatusCode {
    let Ok(callback) = Callback::from_slice(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    let Some(id) = callback.call_id() else {
        return StatusCode::BAD_REQUEST;
    };
    let waiter = pending.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    match waiter {
        Some(tx) => {
            let _ = tx.send(());
            StatusCode::OK
        }
        None => StatusCode::NOT_FOUND,
    }
}

/// A baseline caller: RAP straight to the tool, nothing durable.
#[derive(Clone)]
struct Baseline {
    http: reqwest::Client,
    endpoint: String,
    receiver: Receiver,
}

impl Baseline {
    /// Invocation, ack, callback received.
    async fn call(self, caller: usize, n: u64) -> anyhow::Result<()> {
        let id = format!("b{caller}-{n}");
        let done = self.receiver.expect(&id);
        let inv = Invocation {
            operation: TOOL.to_owned(),
            arguments: json!({"text": format!("hello {n}")}),
            id: id.clone(),
            call_id: None,
            callback_url: self.receiver.url.clone(),
            group_id: format!("baseline-{caller}"),
            thread_ancestors: None,
            user_id: None,
        };
        let outcome = async {
            let r = self.http.post(&self.endpoint).json(&inv).send().await?;
            ensure!(r.status() == StatusCode::OK, "tool answered {}", r.status());
            tokio::time::timeout(CALL_TIMEOUT, done)
                .await
                .context("no callback in time")?
                .context("callback waiter dropped")
        }
        .await;
        if outcome.is_err() {
            self.receiver.lock().remove(&id);
        }
        outcome
    }
}

// --------------------------------------------------------------- Ferry

/// A Ferry caller: the native API, each caller on its own thread, reading
/// results the way an agent following its thread does: one SSE stream per
/// thread, opened before the first call and kept, asking for results only.
#[derive(Clone)]
struct Ferry {
    http: reqwest::Client,
    /// The runtime nodes (one for `serve`); caller `c` uses node
    /// `c % bases.len()`, as a load balancer would spread agents.
    bases: Vec<String>,
    /// Keeps thread ids of separate runs apart.
    run: String,
    /// Each caller's open stream, by `(level, caller)`.
    streams: Arc<Mutex<HashMap<(usize, usize), StreamSlot>>>,
    /// Numbers call ids, unique across rounds.
    calls: Arc<AtomicU64>,
    /// Other processes doing Ferry's work (a cluster's `nats-server`),
    /// whose CPU time counts with this process's.
    processes: Vec<u32>,
    /// A cluster's `nats-server` `/varz`, whose message count is read.
    nats_varz: Option<String>,
}

/// A caller's stream, opened on its first call.
type StreamSlot = Arc<tokio::sync::Mutex<Option<EventStream>>>;

/// The events of one thread, read from `GET /v1/threads/{g}/stream`.
struct EventStream {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<Bytes>> + Send>>,
    buf: Vec<u8>,
}

impl EventStream {
    async fn open(http: &reqwest::Client, url: String) -> anyhow::Result<Self> {
        let response = http.get(url).send().await?.error_for_status()?;
        Ok(Self {
            body: Box::pin(response.bytes_stream()),
            buf: Vec::new(),
        })
    }

    /// The next event on the stream (keep-alive comments skipped).
    async fn next(&mut self) -> anyhow::Result<Event> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = std::str::from_utf8(&block)?;
                if let Some(data) = text.lines().find_map(|l| l.strip_prefix("data:")) {
                    return Ok(serde_json::from_str(data.trim_start())?);
                }
                continue;
            }
            match self.body.next().await {
                Some(chunk) => self.buf.extend_from_slice(&chunk?),
                None => bail!("the event stream ended"),
            }
        }
    }
}

impl Ferry {
    fn base(&self, caller: usize) -> &str {
        &self.bases[caller % self.bases.len()]
    }

    /// Waits (up to 20 s) until every node lists the bench tool: a toolset
    /// registered on one node reaches the others through the KV bucket.
    async fn wait_registered(&self) -> anyhow::Result<()> {
        for base in &self.bases {
            let this = Ferry {
                bases: vec![base.clone()],
                ..self.clone()
            };
            let mut tries = 0;
            while let Err(e) = this.check_registered().await {
                tries += 1;
                if tries > 200 {
                    return Err(e);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Fails early, and clearly, if the bench toolset did not register.
    async fn check_registered(&self) -> anyhow::Result<()> {
        let tools: Value = self
            .http
            .get(format!("{}/v1/tools", self.bases[0]))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let text = tools.to_string();
        ensure!(
            text.contains(&format!("{TOOLSET}.{TOOL}")),
            "the bench toolset is not registered with Ferry: {text}"
        );
        Ok(())
    }

    /// Submit, then read the thread's stream until the call's `tool_result`.
    async fn call(self, level: usize, caller: usize, n: u64) -> anyhow::Result<()> {
        let group_id = format!("bench-{}-{level}x-{caller}", self.run);
        let slot = self
            .streams
            .lock()
            .expect("streams lock")
            .entry((level, caller))
            .or_default()
            .clone();
        let mut stream = slot.lock().await;
        if stream.is_none() {
            let url = format!(
                "{}/v1/threads/{group_id}/stream?types=tool_result",
                self.base(caller)
            );
            *stream = Some(EventStream::open(&self.http, url).await?);
        }
        let stream = stream.as_mut().expect("opened above");
        let id = format!("c{}", self.calls.fetch_add(1, Ordering::Relaxed));
        let submit = SubmitCall {
            operation: format!("{TOOLSET}.{TOOL}"),
            arguments: json!({"text": format!("hello {n}")}),
            group_id: group_id.clone(),
            id: Some(id.clone()),
            call_id: None,
            user_id: None,
            thread_ancestors: None,
        };
        let r = self
            .http
            .post(format!("{}/v1/calls", self.base(caller)))
            .json(&submit)
            .send()
            .await?;
        ensure!(
            r.status() == StatusCode::ACCEPTED,
            "submit answered {}: {}",
            r.status(),
            r.text().await.unwrap_or_default()
        );
        tokio::time::timeout(CALL_TIMEOUT, async {
            loop {
                let event = stream.next().await?;
                if let (Some(eid), EventKind::ToolResult { is_error, text, .. }) =
                    (&event.id, &event.kind)
                {
                    if *eid == id {
                        ensure!(!is_error, "the call failed: {text}");
                        return Ok(());
                    }
                }
            }
        })
        .await
        .map_err(|_| anyhow::anyhow!("no tool_result for {group_id}/{id} in {CALL_TIMEOUT:?}"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn zero_rounds_or_callers_are_refused_before_anything_starts() {
        let args = |rounds, concurrency| BenchArgs {
            duration: 1.0,
            warmup: 0.0,
            rounds,
            concurrency,
            json: false,
            cluster: false,
            nats_server: None,
            nats_sync_interval: "always".into(),
            shapes: vec![(1, 1)],
            partitions: vec![1],
            cpu_quota: None,
        };
        let error = run(&args(0, vec![1])).await.expect_err("refused");
        assert!(error.to_string().contains("--rounds"), "{error}");
        let error = run(&args(1, vec![0])).await.expect_err("refused");
        assert!(error.to_string().contains("--concurrency"), "{error}");
    }

    #[test]
    fn cpu_time_is_utime_plus_stime_whatever_the_command_name() {
        let stat = "4242 (tokio (rt) 1) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0 9";
        assert_eq!(cpu_of_stat(stat), Duration::from_millis(1750));
        assert_eq!(cpu_of_stat(""), Duration::ZERO);
    }

    #[test]
    fn kernel_counters_are_read_by_their_field_name() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Tcp: RtoAlgorithm RtoMin ActiveOpens RetransSegs InErrs\n\
                    Tcp: 1 200 7 1347 0\n\
                    Udp: InDatagrams\nUdp: 5\n";
        assert_eq!(kernel_counter(snmp, "Tcp:", "RetransSegs"), Some(1347));
        // `MPTcpExt:` also ends in `TcpExt:`; only the group itself counts.
        let netstat = "TcpExt: SyncookiesSent TCPTimeouts TCPLossProbes\n\
                       TcpExt: 0 12 5031\n\
                       MPTcpExt: TCPTimeouts\nMPTcpExt: 99\n";
        assert_eq!(kernel_counter(netstat, "TcpExt:", "TCPTimeouts"), Some(12));
        for bad in [
            "",
            "Tcp: RtoAlgorithm RetransSegs\n",
            "Tcp: RtoAlgorithm InErrs\nTcp: 1 0\n",
            "Tcp: RetransSegs\nTcp: many\n",
            "Tcp: RtoAlgorithm RetransSegs\nTcp: 1\n",
        ] {
            assert_eq!(kernel_counter(bad, "Tcp:", "RetransSegs"), None, "{bad:?}");
        }
        assert!(
            tcp_retransmitted().is_some() && tcp_timeouts().is_some(),
            "this machine's /proc/net/snmp and /proc/net/netstat count them"
        );
    }

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
