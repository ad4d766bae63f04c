//! `ferry bench`: the whole path (submit, dispatch to a RAP tool on loopback,
//! callback, result readable) against a baseline measured in the same run —
//! the same client talking RAP directly to the same tool, nothing durable.
//!
//! Everything runs in this one process: the instant tool, the baseline's
//! callback receiver, a real Ferry (`serve::start` on sled in a temporary
//! directory, fsync group commit included) and the callers. The figures are
//! therefore ratios on one machine, not absolute capacities.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use axum::serve::ListenerExt;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::serve::{start, ServeOptions};

use args::secs;
use baseline::{Baseline, Receiver};
use ferry::Ferry;
use rounds::Plan;
use tool::tool_router;

pub use args::BenchArgs;
pub use load::percentile;
pub use report::{Report, Row, Stats};

mod args;
mod baseline;
mod cluster;
mod counters;
mod delivery;
mod ferry;
mod load;
mod quota;
mod report;
mod rounds;
mod secured;
mod tool;

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
    let mut locked = None;
    if args.secured {
        let secured = secured::Secured::start(tool, &ferry).await?;
        let targets = [
            ("serve".to_owned(), ferry.clone()),
            ("serve secured".to_owned(), secured.ferry.clone()),
        ];
        for &callers in &args.concurrency {
            rows.extend(plan.compare_each(callers, &baseline, &targets).await);
        }
        locked = Some(secured);
    } else {
        for &callers in &args.concurrency {
            rows.push(
                plan.compare("serve".into(), callers, &baseline, &ferry)
                    .await,
            );
        }
    }
    let mut deliveries = vec![];
    if args.consumers {
        for &callers in &args.concurrency {
            deliveries.extend(delivery::measure(&plan, callers, &ferry).await?);
        }
    }
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    if let Some(secured) = locked {
        secured.stop().await;
    }
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
        deliveries,
    })
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
            secured: false,
            consumers: false,
            cpu_quota: None,
        };
        let error = run(&args(0, vec![1])).await.expect_err("refused");
        assert!(error.to_string().contains("--rounds"), "{error}");
        let error = run(&args(1, vec![0])).await.expect_err("refused");
        assert!(error.to_string().contains("--concurrency"), "{error}");
    }
}
