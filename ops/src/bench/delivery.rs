//! `ferry bench --consumers`: delivery to agents through a consumer, beside
//! the load that makes the results. While the callers run at a level, a
//! consumer takes every `tool_result` of their threads: four pullers
//! (pull, acknowledge, pull again) or one webhook receiver in this process
//! (push). The figures are the events delivered per second against the
//! results stored per second in the same window, and the latency from the
//! event's `at` (when Ferry took the tool's callback) to its receipt.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::routing::post;
use axum::Router;
use serde::Serialize;
use serde_json::{json, Value};

use super::ferry::Ferry;
use super::load::{drive, percentile};
use super::rounds::Plan;

/// Pullers sharing the pull consumer.
const PULLERS: usize = 4;
/// The target for the end-to-end p99, in ms.
pub const TARGET_P99_MS: f64 = 50.0;
/// Delivered per stored at least this: the consumer keeps up.
pub const KEEPS_UP: f64 = 0.95;

/// One way of delivering, at one level, pooled over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryRow {
    pub mode: String,
    pub callers: usize,
    /// Results stored per second (calls answered in the window).
    pub stored_per_sec: f64,
    /// Events received per second in the same window.
    pub delivered_per_sec: f64,
    pub ratio: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub round_ratios: Vec<f64>,
}

impl DeliveryRow {
    pub fn met(&self) -> bool {
        self.ratio >= KEEPS_UP && self.p99_ms.is_some_and(|p| p < TARGET_P99_MS)
    }
}

/// What receivers saw: when each event arrived, and its latency.
#[derive(Default)]
struct Seen {
    arrivals: Vec<(Instant, Duration)>,
}

impl Seen {
    fn record(&mut self, event: &Value) {
        let now = Instant::now();
        let at = event["at"]
            .as_str()
            .and_then(|t| t.parse::<ferry_proto::time::Timestamp>().ok());
        let latency = at
            .and_then(|at| SystemTime::now().duration_since(at.to_system_time()).ok())
            .unwrap_or_default();
        self.arrivals.push((now, latency));
    }
}

type Shared = Arc<Mutex<Seen>>;

/// Measures both ways of delivering at `callers`, in alternating rounds.
pub(super) async fn measure(
    plan: &Plan,
    callers: usize,
    ferry: &Ferry,
) -> anyhow::Result<Vec<DeliveryRow>> {
    let receiver: Shared = Arc::default();
    let hook = super::serve(Router::new().route(
        "/hook",
        post({
            let receiver = receiver.clone();
            move |body: axum::body::Bytes| {
                let receiver = receiver.clone();
                async move {
                    if let Ok(event) = serde_json::from_slice::<Value>(&body) {
                        receiver.lock().expect("receiver lock").record(&event);
                    }
                    axum::http::StatusCode::OK
                }
            }
        }),
    ))
    .await?;
    let mut rows = vec![];
    for mode in ["pull x4", "push"] {
        let mut row = DeliveryRow {
            mode: mode.into(),
            callers,
            stored_per_sec: 0.0,
            delivered_per_sec: 0.0,
            ratio: 0.0,
            p50_ms: None,
            p99_ms: None,
            round_ratios: vec![],
        };
        let mut latencies = vec![];
        let (mut stored, mut delivered) = (0u64, 0u64);
        for _ in 0..plan.rounds {
            let seen: Shared = if mode == "push" {
                receiver.lock().expect("receiver lock").arrivals.clear();
                receiver.clone()
            } else {
                Arc::default()
            };
            let (s, d, l) = one_round(plan, callers, ferry, mode, &seen, hook).await?;
            row.round_ratios
                .push(if s == 0 { 0.0 } else { d as f64 / s as f64 });
            stored += s;
            delivered += d;
            latencies.extend(l);
        }
        let window = plan.duration.as_secs_f64() * plan.rounds as f64;
        row.stored_per_sec = stored as f64 / window;
        row.delivered_per_sec = delivered as f64 / window;
        row.ratio = if stored == 0 {
            0.0
        } else {
            delivered as f64 / stored as f64
        };
        latencies.sort_unstable();
        let ms = |p| percentile(&latencies, p).map(|d| d.as_secs_f64() * 1e3);
        row.p50_ms = ms(50.0);
        row.p99_ms = ms(99.0);
        rows.push(row);
    }
    Ok(rows)
}

/// One round: a consumer of this round's threads only, the callers' load,
/// and what arrived in the measured window.
async fn one_round(
    plan: &Plan,
    callers: usize,
    ferry: &Ferry,
    mode: &str,
    seen: &Shared,
    hook: std::net::SocketAddr,
) -> anyhow::Result<(u64, u64, Vec<Duration>)> {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let ferry = Ferry {
        run: run.clone(),
        streams: Arc::default(),
        ..ferry.clone()
    };
    let base = ferry.bases[0].clone();
    let name = format!("bench-{run}");
    let mut spec = json!({"name": name, "filter": {"types": ["tool_result"],
                          "group_prefix": format!("bench-{run}-")}});
    if mode == "push" {
        spec["push"] = json!({"url": format!("http://{hook}/hook"),
                              "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"});
    }
    let made = ferry
        .http
        .post(format!("{base}/v1/consumers"))
        .json(&spec)
        .send()
        .await?;
    anyhow::ensure!(
        made.status().is_success(),
        "making the bench consumer: {}",
        made.status()
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let pullers: Vec<_> = if mode == "push" {
        vec![]
    } else {
        (0..PULLERS)
            .map(|_| {
                tokio::spawn(pull(
                    ferry.http.clone(),
                    base.clone(),
                    name.clone(),
                    seen.clone(),
                    stopped.clone(),
                ))
            })
            .collect()
    };
    let begin = Instant::now() + plan.warmup;
    let end = begin + plan.duration;
    let f = ferry.clone();
    let tally = drive(
        callers,
        plan.warmup,
        plan.duration,
        (&[], None),
        move |c, n| f.clone().call(callers, c, n),
    )
    .await;
    let _ = stop.send(true);
    for puller in pullers {
        let _ = puller.await;
    }
    let _ = ferry
        .http
        .delete(format!("{base}/v1/consumers/{name}"))
        .send()
        .await;
    let stored = tally.latencies.len() as u64;
    let seen = seen.lock().expect("seen lock");
    let inside: Vec<Duration> = seen
        .arrivals
        .iter()
        .filter(|(at, _)| *at >= begin && *at <= end)
        .map(|(_, latency)| *latency)
        .collect();
    Ok((stored, inside.len() as u64, inside))
}

/// A puller: pulls up to 100, records them, acknowledges them, again.
async fn pull(
    http: reqwest::Client,
    base: String,
    name: String,
    seen: Shared,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let next = format!("{base}/v1/consumers/{name}/next?max=100&wait=1");
    let ack = format!("{base}/v1/consumers/{name}/ack");
    loop {
        if *stopped.borrow() {
            return;
        }
        let pulled = tokio::select! {
            _ = stopped.changed() => return,
            pulled = http.get(&next).send() => pulled,
        };
        let Ok(page) = pulled else { return };
        let Ok(page) = page.json::<Value>().await else {
            return;
        };
        let events = page["events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            continue;
        }
        {
            let mut seen = seen.lock().expect("seen lock");
            for event in &events {
                seen.record(event);
            }
        }
        let acks: Vec<Value> = events
            .iter()
            .map(|e| json!({"group_id": e["group_id"], "seq": e["seq"]}))
            .collect();
        if http
            .post(&ack)
            .json(&json!({"acks": acks}))
            .send()
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The rows as a Markdown table.
pub fn markdown(rows: &[DeliveryRow]) -> String {
    let mut out = String::from(
        "| delivery | callers | results stored/s | delivered/s | delivered per stored | per round | p50/p99 ms (callback to receipt) | met |\n\
         |---|---:|---:|---:|---:|---|---:|---|\n",
    );
    for r in rows {
        let rounds: Vec<String> = r.round_ratios.iter().map(|x| format!("{x:.2}")).collect();
        let ms = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}"));
        out += &format!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {} | {} / {} | {} |\n",
            r.mode,
            r.callers,
            r.stored_per_sec,
            r.delivered_per_sec,
            r.ratio,
            rounds.join(" "),
            ms(r.p50_ms),
            ms(r.p99_ms),
            if r.met() { "yes" } else { "no" },
        );
    }
    out += &format!(
        "\nTarget: delivered per stored >= {KEEPS_UP} (the consumer keeps up) and p99 < {TARGET_P99_MS} ms.\n"
    );
    out
}
