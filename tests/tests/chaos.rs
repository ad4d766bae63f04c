//! A bounded chaos run of a whole cluster: two runtime nodes, two workers
//! and one `nats-server` (fsyncing every write), one of them SIGKILLed
//! every few seconds and started again, under a mix of plain calls,
//! subscriptions with many events, callbacks sent twice to both nodes,
//! and approval decisions. Agents, tools and reviewers retry each request
//! with the same ids and keys until some node answers it 2xx, as DESIGN.md
//! asks of them. Then an audit through every node: every acknowledged
//! request applied exactly once, no event duplicated, seqs dense, both
//! nodes identical, no acknowledged call left without its outcome. The
//! figures are printed, so that CI's log shows them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_tests::api::seg;
use ferry_tests::{eventually, Ferry, FerryOptions, FerryWorker, Nats, TestTool};
use serde_json::{json, Value};

/// How long calls are made and processes killed.
const LOAD: Duration = Duration::from_secs(35);
/// How long, after the load, every acknowledged call has to reach its
/// outcome: the whole test stays inside 90 s on a machine at its usual
/// speed.
const SETTLE: Duration = Duration::from_secs(40);
/// Threads of each kind (plain calls, a subscription, a gated call).
const THREADS: usize = 16;
/// Calls in a plain thread, events of a subscription.
const CALLS: usize = 3;
const EVENTS: usize = 10;

/// Writes a line to stderr past the test harness's capture (which keeps
/// only a failing test's output), so that CI's log shows the run's figures
/// when it passes too.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A small deterministic generator (xorshift64*): the run's seed is
/// printed, so a failing schedule can be looked at again.
struct Dice(u64);

impl Dice {
    fn seeded() -> Dice {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        say(&format!("chaos: seed {seed}"));
        Dice(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// What some node answered 2xx, which must therefore be in the log once.
#[derive(Default)]
struct Ledger {
    /// `(group_id, id)` of every call a node accepted.
    calls: BTreeSet<(String, String)>,
    /// `(group_id, idempotency key)` of every subscription event a node
    /// acknowledged.
    events: BTreeSet<(String, String)>,
    /// `(group_id, id)` of every approval decision a node acknowledged.
    decisions: BTreeSet<(String, String)>,
    /// Requests answered 2xx, sent again on purpose to the other node.
    copies: usize,
    /// Answers that were not 2xx (503s, refused connections, timeouts),
    /// each followed by a retry.
    retries: usize,
    /// Answers that are neither 2xx nor a reason to retry.
    refused: Vec<String>,
}

struct Run {
    nodes: [String; 2],
    client: reqwest::Client,
    ledger: Mutex<Ledger>,
    /// Requests stop being retried after this: the run is bounded.
    deadline: Instant,
}

/// Whether a request that was not answered 2xx should be sent again.
fn retriable(status: u16) -> bool {
    matches!(status, 502..=504 | 429)
}

impl Run {
    /// Sends `body` to `path` on the nodes in turn, starting at `first`,
    /// until one answers 2xx (`Some(answer)`), or the deadline passes.
    async fn until_2xx(
        &self,
        first: usize,
        path: &str,
        body: &Value,
        key: Option<&str>,
    ) -> Option<Value> {
        for attempt in 0.. {
            if Instant::now() > self.deadline {
                return None;
            }
            let node = &self.nodes[(first + attempt) % 2];
            let mut request = self
                .client
                .post(format!("{node}{path}"))
                .timeout(Duration::from_secs(10))
                .json(body);
            if let Some(key) = key {
                request = request.header("idempotency-key", format!("\"{key}\""));
            }
            match request.send().await {
                Ok(r) if r.status().is_success() => {
                    return Some(r.json().await.unwrap_or(Value::Null));
                }
                Ok(r) if !retriable(r.status().as_u16()) => {
                    let status = r.status().as_u16();
                    let text = r.text().await.unwrap_or_default();
                    self.ledger
                        .lock()
                        .unwrap()
                        .refused
                        .push(format!("{path}: {status} {text}"));
                    return None;
                }
                _ => self.ledger.lock().unwrap().retries += 1,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        unreachable!()
    }

    /// Sends once more what a node already answered 2xx, to the other
    /// node: the copy must change nothing.
    async fn copy(&self, to: usize, path: &str, body: &Value, key: Option<&str>) {
        let mut request = self
            .client
            .post(format!("{}{path}", self.nodes[to % 2]))
            .timeout(Duration::from_secs(10))
            .json(body);
        if let Some(key) = key {
            request = request.header("idempotency-key", format!("\"{key}\""));
        }
        if request.send().await.is_ok() {
            self.ledger.lock().unwrap().copies += 1;
        }
    }

    async fn submit(&self, first: usize, g: &str, id: &str, operation: &str) {
        let body = json!({"operation": operation, "arguments": {}, "group_id": g, "id": id});
        if self
            .until_2xx(first, "/v1/calls", &body, None)
            .await
            .is_some()
        {
            let mut ledger = self.ledger.lock().unwrap();
            ledger.calls.insert((g.to_owned(), id.to_owned()));
        }
    }

    /// GET through either node, retried while the cluster is away.
    async fn read(&self, path: &str) -> Option<Value> {
        for attempt in 0..4 {
            let node = &self.nodes[attempt % 2];
            let sent = self
                .client
                .get(format!("{node}{path}"))
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            if let Ok(r) = sent {
                if r.status().is_success() {
                    return r.json().await.ok();
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    /// A reviewer: waits for the gated call's approval request, then
    /// allows it through either node.
    async fn review(&self, first: usize, g: &str, id: &str) {
        let path = format!("/v1/threads/{}/calls/{}", seg(g), seg(id));
        loop {
            if Instant::now() > self.deadline {
                return;
            }
            if let Some(call) = self.read(&path).await {
                if call["status"] == "pending_approval" {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let decision = json!({"optionId": "allow_once", "reviewer": "chaos"});
        let path = format!("/v1/approvals/{}/{}", seg(g), seg(id));
        if self
            .until_2xx(first, &path, &decision, None)
            .await
            .is_some()
        {
            let mut ledger = self.ledger.lock().unwrap();
            ledger.decisions.insert((g.to_owned(), id.to_owned()));
        }
    }

    /// The tool's side of one invocation: a result (a subscription's opens
    /// it, and its events follow in order, each under its own key), some
    /// sent a second time to the other node.
    async fn answer(&self, turn: usize, invocation: ferry_proto::Invocation) {
        let path = invocation
            .callback_url
            .find("/v1/")
            .map(|i| invocation.callback_url[i..].to_owned())
            .expect("a callback path");
        let (g, id) = (&invocation.group_id, &invocation.id);
        let watching = invocation.operation.ends_with("watch");
        let result = json!({"type": "tool_result", "group_id": g, "id": id,
                            "text": id, "subscription": watching});
        if self.until_2xx(turn, &path, &result, None).await.is_none() {
            return;
        }
        if turn.is_multiple_of(3) {
            self.copy(turn + 1, &path, &result, None).await;
        }
        if !watching {
            return;
        }
        for n in 0..EVENTS {
            let key = format!("{id}/{n}");
            let event = json!({"type": "subscription_event", "group_id": g, "tool_call_id": id,
                               "text": format!("tick {n}"), "final": n + 1 == EVENTS});
            if self
                .until_2xx(turn + n, &path, &event, Some(&key))
                .await
                .is_none()
            {
                return;
            }
            self.ledger
                .lock()
                .unwrap()
                .events
                .insert((g.clone(), key.clone()));
            if n.is_multiple_of(2) {
                self.copy(turn + n + 1, &path, &event, Some(&key)).await;
            }
        }
    }
}

/// The processes, each killed and started again by the chaos loop.
struct Processes {
    nats: Nats,
    nodes: Vec<Ferry>,
    workers: Vec<FerryWorker>,
}

#[derive(Default, Debug)]
struct Kills {
    nodes: usize,
    workers: usize,
    nats: usize,
}

/// Kills a random process every 2–4 s until `until`, starting each again
/// (NATS after 1–3 s away); returns what it killed.
async fn chaos(processes: &mut Processes, dice: &mut Dice, until: Instant) -> Kills {
    let mut kills = Kills::default();
    while Instant::now() + Duration::from_secs(4) < until {
        tokio::time::sleep(Duration::from_millis(2000 + dice.below(2000))).await;
        match dice.below(5) {
            0 | 1 => {
                let node = &mut processes.nodes[dice.below(2) as usize];
                node.restart().await;
                kills.nodes += 1;
            }
            2 | 3 => {
                let worker = &mut processes.workers[dice.below(2) as usize];
                worker.restart().await;
                kills.workers += 1;
            }
            _ => {
                processes.nats.kill9();
                tokio::time::sleep(Duration::from_millis(1000 + dice.below(2000))).await;
                processes.nats.restart().await;
                kills.nats += 1;
            }
        }
    }
    kills
}

/// What the audit of one thread found wrong.
#[derive(Default, Debug)]
struct Findings {
    lost: Vec<String>,
    duplicated: Vec<String>,
    stuck: Vec<String>,
    gaps: Vec<String>,
    differ: Vec<String>,
}

fn audit(g: &str, on_a: &[Value], on_b: &[Value], ledger: &Ledger, found: &mut Findings) {
    if on_a != on_b {
        found.differ.push(g.to_owned());
    }
    let seqs: Vec<u64> = on_a.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    if seqs != (1..=seqs.len() as u64).collect::<Vec<_>>() {
        found.gaps.push(format!("{g}: {seqs:?}"));
    }
    let mut per_call: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut keys: BTreeMap<String, usize> = BTreeMap::new();
    for e in on_a {
        let kind = e["type"].as_str().unwrap_or("").to_owned();
        if kind == "subscription_event" {
            let key = e["idempotency_key"]["key"].as_str().unwrap_or("(none)");
            *keys.entry(key.to_owned()).or_default() += 1;
        } else if let Some(id) = e["id"].as_str() {
            *per_call.entry((kind, id.to_owned())).or_default() += 1;
        }
    }
    for ((kind, id), n) in &per_call {
        let once = [
            "call_accepted",
            "tool_result",
            "approval_requested",
            "approval_decided",
        ];
        if *n > 1 && once.contains(&kind.as_str()) {
            found.duplicated.push(format!("{g}/{id}: {kind} ×{n}"));
        }
    }
    for (key, n) in &keys {
        if *n > 1 {
            found.duplicated.push(format!("{g}: event {key} ×{n}"));
        }
    }
    let has = |kind: &str, id: &str| per_call.contains_key(&(kind.to_owned(), id.to_owned()));
    for (cg, id) in ledger.calls.iter().filter(|(cg, _)| cg == g) {
        if !has("call_accepted", id) {
            found.lost.push(format!("{cg}/{id}: call"));
        } else if !has("tool_result", id) {
            found.stuck.push(format!("{cg}/{id}"));
        }
    }
    for (_, id) in ledger.decisions.iter().filter(|(dg, _)| dg == g) {
        if !has("approval_decided", id) {
            found.lost.push(format!("{g}/{id}: decision"));
        }
    }
    for (_, key) in ledger.events.iter().filter(|(eg, _)| eg == g) {
        if !keys.contains_key(key) {
            found.lost.push(format!("{g}: event {key}"));
        }
    }
}

/// Every acknowledged call has its outcome, read through either node (a
/// subscription's comes with its final event).
async fn settled(run: &Run) -> bool {
    let calls: Vec<(String, String)> = run.ledger.lock().unwrap().calls.iter().cloned().collect();
    for (g, id) in calls {
        let path = format!("/v1/threads/{}/calls/{}", seg(&g), seg(&id));
        match run.read(&path).await {
            Some(call) if call["status"] == "completed" => {}
            _ => return false,
        }
    }
    true
}

/// DESIGN.md's invariants under SIGKILL: "Nothing acknowledged is ever
/// lost", "each callback is applied once", "a thread's events are in one
/// order, the same for every reader" — with every process of the cluster
/// killed in turn while agents, tools and reviewers keep working.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_killed_process_by_process_loses_and_repeats_nothing() {
    let started = Instant::now();
    let mut dice = Dice::seeded();
    let tool = Arc::new(
        TestTool::with_manifest(json!({"name": "t", "tools": [
            {"name": "op", "description": "a plain call", "inputSchema": {"type": "object"}},
            {"name": "watch", "description": "a subscription", "inputSchema": {"type": "object"}},
            {"name": "drop", "description": "gated", "inputSchema": {"type": "object"},
             "annotations": {"destructive": true}},
        ]}))
        .await,
    );
    let nats = Nats::start().await;
    let a = Ferry::start(FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::runtime(&nats.url())
    })
    .await;
    let b = Ferry::start(FerryOptions::runtime(&nats.url())).await;
    let nodes = [a.url.clone(), b.url.clone()];
    let mut workers = vec![];
    for _ in 0..2 {
        workers.push(FerryWorker::start(&nats.url(), &a.url).await);
    }
    eventually("B to list the tools", Duration::from_secs(20), || async {
        let (_, tools) = b.api().get("/v1/tools").await;
        tools.to_string().contains("\"drop\"").then_some(())
    })
    .await;
    let mut processes = Processes {
        nats,
        nodes: vec![a, b],
        workers,
    };
    let load_end = Instant::now() + LOAD;
    let run = Arc::new(Run {
        nodes,
        client: reqwest::Client::builder().no_proxy().build().unwrap(),
        ledger: Mutex::default(),
        deadline: load_end + SETTLE / 2,
    });

    // The tool answers every invocation, each in a task of its own.
    let answering = {
        let (run, tool) = (run.clone(), tool.clone());
        tokio::spawn(async move {
            let mut turn = 0;
            while let Some(invoked) = tool.await_invocation().await {
                turn += 1;
                let run = run.clone();
                tokio::spawn(async move { run.answer(turn, invoked.invocation).await });
            }
        })
    };
    // Agents and reviewers: the threads start spread over the load.
    let kinds = ["op", "watch", "drop"];
    let threads: Vec<(String, &str)> = (0..THREADS * kinds.len())
        .map(|i| (format!("chaos-{i}"), kinds[i % kinds.len()]))
        .collect();
    let spacing = LOAD.mul_f64(0.8) / threads.len() as u32;
    let agents: Vec<_> = threads
        .iter()
        .enumerate()
        .map(|(i, (g, kind))| {
            let (run, g, kind) = (run.clone(), g.clone(), *kind);
            tokio::spawn(async move {
                tokio::time::sleep(spacing * i as u32).await;
                match kind {
                    "op" => {
                        for n in 0..CALLS {
                            run.submit(i + n, &g, &format!("c{n}"), "op").await;
                        }
                    }
                    "watch" => run.submit(i, &g, "w", "watch").await,
                    _ => {
                        run.submit(i, &g, "d", "drop").await;
                        run.review(i + 1, &g, "d").await;
                    }
                }
            })
        })
        .collect();

    let kills = chaos(&mut processes, &mut dice, load_end).await;
    for agent in agents {
        agent.await.unwrap();
    }
    // Everything is up again: what was acknowledged must now settle.
    let settle_by = Instant::now() + SETTLE;
    let mut all_in = false;
    while Instant::now() < settle_by {
        if settled(&run).await {
            all_in = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    answering.abort();

    let (on_a, on_b) = (processes.nodes[0].api(), processes.nodes[1].api());
    let mut logs = vec![];
    for (g, _) in &threads {
        logs.push((g, on_a.events(g, 0).await, on_b.events(g, 0).await));
    }
    let mut found = Findings::default();
    let ledger = run.ledger.lock().unwrap();
    for (g, ea, eb) in &logs {
        audit(g, ea, eb, &ledger, &mut found);
    }
    say(&format!(
        "chaos: {:.0} s; acknowledged: {} calls, {} subscription events, {} decisions; \
         {} copies sent again, {} retries; kills: {} nodes, {} workers, {} NATS; \
         lost {}, duplicated {}, stuck {}, gaps {}, nodes differing {}, refused {}; settled: {all_in}",
        started.elapsed().as_secs_f64(),
        ledger.calls.len(),
        ledger.events.len(),
        ledger.decisions.len(),
        ledger.copies,
        ledger.retries,
        kills.nodes,
        kills.workers,
        kills.nats,
        found.lost.len(),
        found.duplicated.len(),
        found.stuck.len(),
        found.gaps.len(),
        found.differ.len(),
        ledger.refused.len(),
    ));
    assert!(ledger.refused.is_empty(), "{:?}", ledger.refused);
    assert!(
        found.lost.is_empty()
            && found.duplicated.is_empty()
            && found.stuck.is_empty()
            && found.gaps.is_empty()
            && found.differ.is_empty(),
        "{found:#?}"
    );
    // The run made its point: most requests were acknowledged despite the
    // kills, and each kind of process was killed.
    assert!(
        ledger.calls.len() >= THREADS * (CALLS + 2) * 9 / 10,
        "{}",
        ledger.calls.len()
    );
    assert!(kills.nodes + kills.workers + kills.nats >= 4, "{kills:?}");
}
