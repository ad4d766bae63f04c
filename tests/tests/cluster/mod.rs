//! Cluster mode: a real `nats-server` with JetStream, two `ferry runtime`
//! nodes and three `ferry worker`s, RAP tools on loopback. A call accepted
//! on one node is answered through another and read on both; duplicates
//! split across nodes make one event; a consumer pulled through one node
//! is acknowledged through another; workers, runtime nodes and NATS are
//! killed and restarted under load.

mod across_nodes;
mod audit;
mod bad_input;
mod configuration;
mod consumers;
mod dispatch;
mod following;
mod fronts;
mod limits;
mod load;
mod max_payload;
mod nats_down;
mod order;
mod priorities;
mod stopping_workers;
mod toolsets;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{Info, PullConsumer};
use ferry_nats::cluster::streams;
use ferry_tests::api::seg;
use ferry_tests::{eventually, Api, Ferry, FerryOptions, FerryWorker, Nats, TestTool};
use serde_json::{json, Value};

/// The stream workers take work from, with one partition (the default).
const WORK_STREAM: &str = "FERRY_THREADS_0";

/// NATS, two runtime nodes (A and B), workers, and a RAP tool `t` with `op`.
struct Cluster {
    nats: Nats,
    a: Ferry,
    b: Ferry,
    workers: Vec<FerryWorker>,
    tool: Arc<TestTool>,
}

impl Cluster {
    async fn start(workers: usize) -> Cluster {
        Self::on(Nats::start().await, workers).await
    }

    /// [`Cluster::start`] on a NATS of the test's own.
    async fn on(nats: Nats, workers: usize) -> Cluster {
        let tool = Arc::new(TestTool::start("t", &["op"]).await);
        let a = Ferry::start(FerryOptions {
            tool_servers: vec![tool.url.clone()],
            ..FerryOptions::runtime(&nats.url())
        })
        .await;
        let b = Ferry::start(FerryOptions::runtime(&nats.url())).await;
        // Callbacks go to node A (as through a load balancer); tests post
        // some to B themselves.
        let mut started = vec![];
        for _ in 0..workers {
            started.push(FerryWorker::start(&nats.url(), &a.url).await);
        }
        // B learns the toolset A registered through the KV bucket.
        let b_api = b.api();
        eventually("B to list the tool", Duration::from_secs(20), || async {
            let (_, tools) = b_api.get("/v1/tools").await;
            tools.to_string().contains("\"op\"").then_some(())
        })
        .await;
        Cluster {
            nats,
            a,
            b,
            workers: started,
            tool,
        }
    }

    /// Submits on `node`; returns the callback URL the tool got, once the
    /// dispatch is recorded (a result posted earlier makes `call_dispatched`
    /// redundant, and the log one event shorter).
    async fn dispatched(&self, node: &Api, g: &str, id: &str) -> String {
        let (status, body) = node
            .submit(json!({"operation": "op", "arguments": {}, "group_id": g, "id": id}))
            .await;
        assert_eq!(status, 202, "{body}");
        // Decided, with its place in the log.
        assert!(body["seq"].as_u64().is_some_and(|seq| seq > 0), "{body}");
        let sent = self.tool.next_invocation().await.invocation;
        assert_eq!((sent.group_id.as_str(), sent.id.as_str()), (g, id));
        node.wait_for(g, id, "call_dispatched").await;
        sent.callback_url
    }
}

/// The callback URL's path, to post it to any node.
fn path_of(url: &str) -> String {
    url.split_once("/v1/")
        .map(|(_, p)| format!("/v1/{p}"))
        .unwrap()
}

fn result(g: &str, id: &str, text: &str) -> Value {
    json!({"type": "tool_result", "group_id": g, "id": id, "text": text})
}

/// A tool's callback side: answers every invocation with a `tool_result`
/// whose text is the call id, posted to the nodes in turn and retried until
/// one accepts it (as a real tool would through an outage). Returns the
/// task; abort it when done.
fn answer_everything(tool: Arc<TestTool>, nodes: Vec<String>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let mut turn = 0usize;
        while let Some(invoked) = tool.await_invocation().await {
            let invocation = invoked.invocation;
            let path = path_of(&invocation.callback_url);
            let body = result(&invocation.group_id, &invocation.id, &invocation.id).to_string();
            turn += 1;
            let (client, nodes, start) = (client.clone(), nodes.clone(), turn);
            tokio::spawn(async move {
                for attempt in 0.. {
                    let node = &nodes[(start + attempt) % nodes.len()];
                    let sent = client
                        .post(format!("{node}{path}"))
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await;
                    if sent.is_ok_and(|r| r.status().is_success()) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
    })
}

/// Submits `calls` calls over `threads` threads, alternating nodes, with a
/// few in flight at once; retries a submission a node could not take (the
/// same id: at most one call results). Returns `(group_id, id)` of each.
async fn submit_load(nodes: &[Api], threads: usize, calls: usize) -> Vec<(String, String)> {
    use futures::StreamExt;
    let all: Vec<(String, String)> = (0..calls)
        .map(|i| (format!("load-{}", i % threads), format!("c{i}")))
        .collect();
    futures::stream::iter(all.iter().enumerate())
        .for_each_concurrent(16, |(i, (g, id))| async move {
            let body = json!({"operation": "op", "arguments": {}, "group_id": g, "id": id});
            for attempt in 0..200 {
                let node = &nodes[(i + attempt) % nodes.len()];
                let sent = node
                    .client
                    .post(format!("{}/v1/calls", node.base))
                    .json(&body)
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status() == 202 || r.status() == 200 => return,
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            panic!("no node took call {id}");
        })
        .await;
    all
}

/// Waits until every call has its result, then checks each has exactly one
/// `call_accepted` and one `tool_result` (reading through `reader`).
async fn every_call_has_one_outcome(reader: &Api, calls: &[(String, String)]) {
    let mut threads: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (g, id) in calls {
        threads.entry(g).or_default().push(id);
    }
    for (g, ids) in threads {
        let events = eventually(
            &format!("every result of {g}"),
            Duration::from_secs(90),
            || async {
                let (status, body) = reader
                    .get(&format!("/v1/threads/{}/events?limit=10000", seg(g)))
                    .await;
                let events = body["events"].as_array().cloned().unwrap_or_default();
                let results = events.iter().filter(|e| e["type"] == "tool_result").count();
                (status == 200 && results >= ids.len()).then_some(events)
            },
        )
        .await;
        let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "{g}: dense, in order"
        );
        for id in ids {
            let of = |kind: &str| {
                events
                    .iter()
                    .filter(|e| e["type"] == kind && e["id"] == *id)
                    .count()
            };
            assert_eq!(of("call_accepted"), 1, "{g}/{id}");
            assert_eq!(of("tool_result"), 1, "{g}/{id}");
        }
    }
}

/// A runtime node on `nats` with `tool` registered and `args` besides.
async fn node_with(nats: &Nats, tool: &TestTool, args: &[&str]) -> Ferry {
    let mut options = FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::runtime(&nats.url())
    };
    options.args.extend(args.iter().map(|a| (*a).to_owned()));
    Ferry::start(options).await
}

/// Registers the toolset at `url` (named `name`) on node `a` and waits
/// until node `b` serves it too.
async fn registered_on_both(a: &Api, b: &Api, url: &str, name: &str) {
    let (status, body) = a.register(url).await;
    assert!(status < 300, "{body}");
    let path = format!("/v1/toolsets/{name}");
    eventually(
        "B to serve the toolset",
        Duration::from_secs(20),
        || async { (b.get(&path).await.0 == 200).then_some(()) },
    )
    .await;
}

/// A worker of `c` started with `flags` and its `/metrics` on a port of
/// its own (the address is returned).
async fn metered_worker(c: &Cluster, flags: &[&str]) -> (FerryWorker, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let with = [flags, &["--metrics-listen", &listen]].concat();
    let worker = FerryWorker::start_with(&c.nats.url(), &c.a.url, &with).await;
    (worker, listen)
}

/// The consumer all workers share on `stream`, on a client of its own.
async fn shared(nats: &Nats, stream: &str) -> PullConsumer {
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    js.get_stream(stream)
        .await
        .unwrap()
        .get_consumer(streams::CONSUMER)
        .await
        .unwrap()
}

/// What NATS says of the consumer all workers share on `stream`.
async fn consumer(nats: &Nats, stream: &str) -> Info {
    shared(nats, stream).await.info().await.unwrap().clone()
}
