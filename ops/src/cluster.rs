//! The cluster roles: `ferry runtime` (HTTP ingress; decides each request
//! against its thread's log in JetStream; reads) and `ferry worker`
//! (dispatches the calls the log hands out; approval timeouts; redelivery
//! of choices), joined through NATS JetStream. See ARCHITECTURE.md,
//! "Cluster mode".

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ferry_dispatch::{DispatchConfig, Dispatcher, Networks, Worker};
use ferry_engine::bus::InTheLog;
use ferry_engine::store::deferred::Deferred;
use ferry_engine::store::{CatalogStore, Store};
use ferry_engine::token::Capabilities;
use ferry_engine::{Acknowledgements, Config, Engine};
use ferry_fronts::http::auth::ApiTokens;
use ferry_fronts::http::MetricsRender;
use ferry_nats::cluster::deliveries::SharedDeliveries;
use ferry_nats::cluster::lanes::KvLanes;
use ferry_nats::cluster::mcp_sessions::SharedSessions;
use ferry_nats::cluster::rate_limits::KvBuckets;
use ferry_nats::cluster::stop::{Phase, Stop};
use ferry_nats::cluster::subjects::Layout;
use ferry_nats::cluster::{identity, pull, streams, worker};
use ferry_nats::jetstream::{ClientEvents, JetStreamStore};
use tokio::net::TcpListener;
use tracing::{info, warn};

mod consumers;

/// What both roles are told.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// NATS server URLs (comma-separated in the flag).
    pub nats: String,
    /// Callback-token secret shared by every node and worker.
    pub secret: String,
    /// Base URL tools reach the runtime nodes at (the load balancer); a
    /// runtime node defaults to its own address.
    pub public_url: Option<String>,
    /// Replicas of each stream (3 on a three-node NATS cluster).
    pub replicas: usize,
    /// Streams the thread logs are spread over; fixed when they are made.
    pub partitions: usize,
    /// The networks outbound requests may reach.
    pub networks: Networks,
}

#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    pub cluster: ClusterOptions,
    pub listen: SocketAddr,
    pub tool_servers: Vec<String>,
    pub max_body_bytes: usize,
    pub oxp: ferry_fronts::oxp::OxpConfig,
    pub mcp: ferry_fronts::mcp::McpConfig,
    /// The native API's tokens (none: it asks for none).
    pub api_tokens: ApiTokens,
    /// Rate limits on every call, kept in JetStream KV for every node.
    pub rate_limits: ferry_engine::limits::RateLimits,
    /// Where this node also writes the audit entries it records, as JSON
    /// lines (`-`: stdout).
    pub audit_log: Option<std::path::PathBuf>,
    /// How long a stopping node waits for the requests still running.
    pub drain: Duration,
    /// The connection cap and each connection's clocks.
    pub limits: crate::listener::Limits,
}

#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub cluster: ClusterOptions,
    pub dispatch: DispatchConfig,
    /// How long a call a tool was given may go unchanged before the
    /// worker's sweep asks the tool about it (`/tool_call_status`).
    pub reconcile_after: Duration,
    /// The priority it pulls work at, 0 first, up to
    /// [`streams::MAX_PRIORITY`]; given, it also gives the consumers their
    /// priority group. Without, it pulls at 0 when they have one.
    pub priority: Option<u8>,
    /// Takes the consumers' priority group away at start.
    pub drop_priority_group: bool,
    /// How long a stopping worker goes on with what is under way before it
    /// hands that back too ([`ferry_nats::cluster::stop`]).
    pub drain: Duration,
}

/// Connects to NATS; afterwards the client reconnects on its own, forever.
/// With `wait`, returns only once NATS answered (a worker has nothing to
/// do before); without, at once, connecting in the background (a runtime
/// node answers 503 meanwhile). Also returns what the client reports of
/// messages it dropped, which a runtime node's store acts on.
async fn connect(
    urls: &str,
    wait: bool,
) -> anyhow::Result<(async_nats::Client, Arc<ClientEvents>)> {
    let servers = urls
        .split(',')
        .map(|u| u.trim().parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--nats {urls:?}"))?;
    let events = Arc::new(ClientEvents::default());
    let mut delay = Duration::from_millis(100);
    loop {
        let seen = events.clone();
        let mut options = async_nats::ConnectOptions::new()
            .name("ferry")
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(2))
            // The client logs each event itself.
            .event_callback(move |event| {
                seen.record(&event);
                std::future::ready(())
            });
        if !wait {
            options = options.retry_on_initial_connect();
        }
        match options.connect(servers.clone()).await {
            Ok(client) => {
                warn_while_unreachable(client.clone(), urls.to_owned());
                return Ok((client, events));
            }
            Err(e) => {
                warn!(urls, error = %e, "NATS not reachable yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// How often a process away from NATS says so.
const UNREACHABLE_WARNING: Duration = Duration::from_secs(5);

/// Says every few seconds, while `client` is not connected, which NATS
/// URLs cannot be reached and why (the client's own log says neither):
/// what a newcomer with a wrong `--nats` must see.
fn warn_while_unreachable(client: async_nats::Client, urls: String) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UNREACHABLE_WARNING);
        every.tick().await;
        loop {
            every.tick().await;
            if client.connection_state() == async_nats::connection::State::Connected {
                continue;
            }
            let mut causes = vec![];
            for url in urls.split(',').map(str::trim) {
                causes.push(format!("{url}: {}", why_unreachable(url).await));
            }
            warn!(
                nats = urls,
                cause = causes.join("; "),
                "NATS unreachable: nothing can be stored, and requests that need the store are answered 503"
            );
        }
    });
}

/// What a plain TCP connection to a NATS URL's address meets.
async fn why_unreachable(url: &str) -> String {
    let Ok(addr) = url.parse::<async_nats::ServerAddr>() else {
        return "not a NATS URL".into();
    };
    let target = format!("{}:{}", addr.host(), addr.port());
    match tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(&target)).await {
        Err(_) => format!("no answer from {target} within 1 s"),
        Ok(Err(e)) => format!("{target}: {e}"),
        Ok(Ok(_)) => format!("{target} takes connections, but the NATS handshake fails (TLS, auth, or not a NATS server?)"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Serves readers: follows every thread's commits.
    Runtime,
    Worker,
}

/// Binds the streams and the JetStream store, retrying while JetStream is
/// not ready (a NATS cluster that just started may not have elected its
/// leader yet): `attempts` times half a second apart, or forever.
async fn jetstream_store(
    options: &ClusterOptions,
    role: Role,
    client: &async_nats::Client,
    events: &Arc<ClientEvents>,
    attempts: Option<u32>,
) -> anyhow::Result<Arc<JetStreamStore>> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let ready = async {
            let js = async_nats::jetstream::new(client.clone());
            let fingerprint = Capabilities::new(options.secret.as_bytes()).fingerprint();
            match identity::join(&js, options.replicas, &fingerprint, options.partitions).await {
                Err(e) if !e.is_transient() => return Ok(Err(e)),
                joined => joined?,
            }
            let follow = role == Role::Runtime;
            let layout = Layout::new(options.partitions);
            let store = JetStreamStore::connect(
                client.clone(),
                events.clone(),
                options.replicas,
                layout,
                follow,
            );
            anyhow::Ok(Ok(store.await?))
        };
        match ready.await {
            Ok(Ok(store)) => return Ok(store),
            Ok(Err(refused)) => return Err(refused.into()),
            Err(e) if attempts.is_none_or(|n| attempt < n) => {
                // Half a minute of refusals from a NATS that answers is not
                // an outage: say so louder (a node answers 503 meanwhile).
                let connected =
                    client.connection_state() == async_nats::connection::State::Connected;
                if connected && attempt % 60 == 0 {
                    tracing::error!(error = %e, attempt, "NATS answers but JetStream keeps refusing Ferry's streams (is --replicas more than the NATS cluster has?); retrying");
                } else {
                    warn!(error = %e, "JetStream not ready yet; retrying");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The engine both roles run, on `store`; the commits it writes are the
/// workers' work.
fn engine<S: Store + CatalogStore>(
    options: &ClusterOptions,
    config: Config,
    store: Arc<S>,
    lanes: Arc<KvLanes>,
) -> anyhow::Result<Engine> {
    anyhow::ensure!(
        options.secret.len() >= 16,
        "--secret must be at least 16 bytes (and the same on every node and worker)"
    );
    Ok(Engine::new(
        config,
        store.clone(),
        store,
        Arc::new(InTheLog),
        Capabilities::new(options.secret.as_bytes()),
        crate::serve::outbound(&options.networks)?,
    )
    .with_shared_lanes(lanes))
}

/// The shared concurrency limits of a cluster of `options.partitions`.
fn lanes(options: &ClusterOptions) -> Arc<KvLanes> {
    Arc::new(KvLanes::new(Layout::new(options.partitions)))
}

/// The engine configuration both roles start from.
fn engine_config(public_url: &str, max_body_bytes: usize) -> Config {
    Config {
        public_url: public_url.trim_end_matches('/').to_owned(),
        max_body_bytes,
        ..Config::default()
    }
}

/// Loads the toolsets and the named tokens into the engine now and
/// whenever any process changes one (a toolset registered or a token
/// revoked through any node reaches every process).
async fn follow_catalog(engine: &Arc<Engine>, store: &JetStreamStore) -> anyhow::Result<()> {
    engine.load_toolsets().await?;
    engine.load_tokens().await?;
    let mut changed = store.catalog_changed();
    let weak = Arc::downgrade(engine);
    tokio::spawn(async move {
        while changed.changed().await.is_ok() {
            let Some(engine) = weak.upgrade() else { return };
            if let Err(e) = engine.load_toolsets().await {
                warn!(error = %e, "reloading toolsets failed");
            }
            if let Err(e) = engine.load_tokens().await {
                warn!(error = %e, "reloading tokens failed");
            }
        }
    });
    Ok(())
}

/// A running runtime node.
pub struct RunningRuntime {
    pub addr: SocketAddr,
    pub engine: Arc<Engine>,
}

/// How long a runtime node waits for NATS before it serves anyway (503
/// for what needs the store, until it is reached).
const ATTACH_WAIT: Duration = Duration::from_secs(10);

/// The KV buckets a runtime node shares with the other processes, bound
/// once NATS answers.
struct Buckets {
    sessions: Arc<SharedSessions>,
    rate_limits: Arc<KvBuckets>,
    lanes: Arc<KvLanes>,
}

/// Binds the concurrency limits' bucket, for as long as it takes.
async fn attach_lanes(lanes: &KvLanes, js: &async_nats::jetstream::Context, replicas: usize) {
    while let Err(e) = lanes.attach(js, replicas).await {
        warn!(error = %e, "binding the concurrency-limits bucket failed; retrying");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Gives a runtime node its JetStream store once NATS answers, then its
/// toolsets and the tool servers it was told to register; each step is
/// retried for as long as it takes.
async fn attach(
    options: RuntimeOptions,
    client: async_nats::Client,
    events: Arc<ClientEvents>,
    store: Arc<Deferred>,
    engine: Arc<Engine>,
    shared: Buckets,
) {
    let jetstream = loop {
        match jetstream_store(&options.cluster, Role::Runtime, &client, &events, None).await {
            Ok(jetstream) => break jetstream,
            Err(e) if e.downcast_ref::<identity::Error>().is_some() => {
                // Serving would only ever answer 503: stop, and say why.
                tracing::error!(error = %e, "this node cannot join the cluster; stopping");
                eprintln!("ferry: {e}");
                std::process::exit(1);
            }
            Err(e) => warn!(error = %e, "binding JetStream failed; retrying"),
        }
    };
    // The toolsets before the store: a node that could decide calls with no
    // toolsets yet would refuse registered tools as unknown.
    loop {
        match jetstream.toolsets().await {
            Ok(toolsets) => break engine.use_toolsets(toolsets),
            Err(e) => {
                warn!(error = %e, "loading the toolsets failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    store.set(jetstream.clone());
    let js = async_nats::jetstream::new(client.clone());
    while let Err(e) = shared.sessions.attach(&js, options.cluster.replicas).await {
        warn!(error = %e, "binding the MCP sessions bucket failed; retrying");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    while let Err(e) = shared
        .rate_limits
        .attach(&js, options.cluster.replicas)
        .await
    {
        warn!(error = %e, "binding the rate-limits bucket failed; retrying");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    attach_lanes(&shared.lanes, &js, options.cluster.replicas).await;
    loop {
        let followed = async {
            let deliveries = SharedDeliveries::attach(&js, options.cluster.replicas).await?;
            consumers::follow(&engine, &client, Arc::new(deliveries), jetstream.clone()).await
        };
        match followed.await {
            Ok(()) => break,
            Err(e) => {
                warn!(error = %e, "loading the consumers failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    loop {
        match follow_catalog(&engine, &jetstream).await {
            Ok(()) => break,
            Err(e) => {
                warn!(error = %e, "loading the toolsets failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    crate::tool_servers::register(&engine, &options.tool_servers).await;
    info!("attached to NATS");
}

/// Starts a runtime node; it serves until `shutdown` resolves.
pub async fn start_runtime(
    options: RuntimeOptions,
    metrics: Option<MetricsRender>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(RunningRuntime, tokio::task::JoinHandle<anyhow::Result<()>>)> {
    let listener = TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("binding {}", options.listen))?;
    let addr = listener.local_addr()?;
    let (client, events) = connect(&options.cluster.nats, false).await?;
    let public_url = options
        .cluster
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{addr}"));
    // The store arrives when NATS answers; until then what needs it is
    // answered 503 with Retry-After, and nothing is kept anywhere.
    let store = Arc::new(Deferred::default());
    // Rate-limit buckets in JetStream KV, shared by every node.
    let buckets = Arc::new(KvBuckets::default());
    let mut config = engine_config(&public_url, options.max_body_bytes);
    config.rate_limits = options.rate_limits;
    let lanes = lanes(&options.cluster);
    let mut engine = engine(&options.cluster, config, store.clone(), lanes.clone())?
        .with_buckets(buckets.clone());
    if let Some(path) = &options.audit_log {
        engine = engine.with_audit_lines(crate::audit_lines::open(path)?);
    }
    let engine = Arc::new(engine);
    ferry_engine::metrics::describe();
    // MCP sessions in JetStream KV: any node serves any session.
    let sessions = Arc::new(SharedSessions::default());
    let attached = tokio::spawn(attach(
        options.clone(),
        client.clone(),
        events,
        store.clone(),
        engine.clone(),
        Buckets {
            sessions: sessions.clone(),
            rate_limits: buckets,
            lanes,
        },
    ));
    // NATS reachable: serve once attached. Not reachable: serve anyway
    // after a while (503s, a /healthz that says why), and attach later.
    match tokio::time::timeout(ATTACH_WAIT, attached).await {
        Ok(done) => done.context("attaching to NATS")?,
        Err(_) => warn!(
            wait = ?ATTACH_WAIT,
            nats = options.cluster.nats,
            "NATS not reachable: serving, but every request that needs the store is answered 503 until it is"
        ),
    }
    let perform = Arc::new(ferry_fronts::http::Local(engine.clone()));
    let app = ferry_fronts::http::router_with(
        engine.clone(),
        metrics,
        perform.clone(),
        options.api_tokens.clone(),
        &options.mcp.allowed_hosts,
    )
    .merge(crate::serve::protocol_fronts(
        &engine,
        perform,
        &public_url,
        &options.oxp,
        &ferry_fronts::mcp::McpConfig {
            sessions,
            ..options.mcp.clone()
        },
        &options.api_tokens,
    ));
    let server = tokio::spawn(crate::serve::serve_http(
        listener,
        app,
        engine.clone(),
        shutdown,
        options.drain,
        options.limits,
    ));
    info!(%addr, "ferry runtime listening");
    Ok((RunningRuntime { addr, engine }, server))
}

/// A worker connected, with its consumers bound.
struct StartedWorker {
    client: async_nats::Client,
    engine: Arc<Engine>,
    worker: Worker,
    work: Vec<pull::Puller>,
}

/// How long a worker waits after a tool's 200 before recording it: a fast
/// tool's result, recorded by a runtime node meanwhile, makes the record
/// needless ([`Acknowledgements::AfterGrace`]).
const DISPATCH_GRACE: Duration = Duration::from_millis(100);

/// Connects a worker and binds its consumers, waiting out a NATS outage.
async fn start_worker(options: &WorkerOptions) -> anyhow::Result<StartedWorker> {
    let (client, events) = connect(&options.cluster.nats, true).await?;
    let public_url = options
        .cluster
        .public_url
        .clone()
        .context("a worker needs --public-url")?;
    let store = jetstream_store(&options.cluster, Role::Worker, &client, &events, Some(60)).await?;
    let lanes = lanes(&options.cluster);
    let js = async_nats::jetstream::new(client.clone());
    attach_lanes(&lanes, &js, options.cluster.replicas).await;
    let engine = Arc::new(
        engine(
            &options.cluster,
            engine_config(&public_url, Config::default().max_body_bytes),
            store.clone(),
            lanes,
        )?
        .with_acknowledgements(Acknowledgements::AfterGrace(DISPATCH_GRACE)),
    );
    follow_catalog(&engine, &store).await?;
    ferry_engine::metrics::describe();
    engine.start_timers();
    let sweeper = engine.clone();
    let reconcile_after = options.reconcile_after;
    tokio::spawn(async move {
        let mut every = tokio::time::interval(SWEEP);
        // At start, every call a tool was given is asked about: this worker
        // may replace one that died, and with every worker down a tool may
        // have lost calls no one asked about.
        let mut ask_after = Duration::ZERO;
        loop {
            every.tick().await;
            match sweeper.rearm(ask_after).await {
                Ok((n, asking)) => {
                    info!(rearmed = n, "recovery sweep");
                    tokio::spawn(asking);
                }
                Err(e) => warn!(error = %e, "recovery sweep failed"),
            }
            match sweeper.sweep_lanes().await {
                Ok(0) => {}
                Ok(n) => info!(changed = n, "concurrency limits swept"),
                Err(e) => warn!(error = %e, "sweeping the concurrency limits failed"),
            }
            ask_after = reconcile_after;
        }
    });
    let worker = Worker::new(
        Dispatcher::new(
            crate::serve::outbound(&options.cluster.networks)?,
            options.dispatch.clone(),
        ),
        engine.clone(),
    );
    // Bind the consumers before saying so: work published from now on is
    // taken even if this worker is the first.
    let change = match (options.priority, options.drop_priority_group) {
        (_, true) => streams::GroupChange::Remove,
        (Some(_), false) => streams::GroupChange::Add,
        (None, false) => streams::GroupChange::Keep,
    };
    let priority = options.priority.unwrap_or(0);
    let layout = Layout::new(options.cluster.partitions);
    let mut work = vec![];
    for p in 0..layout.partitions() {
        work.push(pull::Puller::bind(client.clone(), layout, p, change, priority).await);
    }
    info!(priority, "ferry worker consuming");
    Ok(StartedWorker {
        client,
        engine,
        worker,
        work,
    })
}

/// How often a worker sweeps the open calls (approval timeouts, choices
/// owed, calls to ask their tools about).
const SWEEP: Duration = Duration::from_secs(60);

/// How long a stopped worker waits for NATS to take its last acks and
/// naks, once it gave up.
const LAST_ACKS: Duration = Duration::from_secs(5);

/// Runs a worker until `shutdown` resolves; then it drains
/// ([`ferry_nats::cluster::stop`]): it takes no more work, finishes
/// what is under way for up to `options.drain`, hands back the rest, and
/// returns. Stopped while it still starts (waiting for NATS, say), it
/// returns at once: it holds nothing yet.
pub async fn run_worker(
    options: WorkerOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let started = tokio::select! {
        started = start_worker(&options) => started?,
        () = &mut shutdown => {
            info!("stopped before it started");
            return Ok(());
        }
    };
    println!("ferry worker ready");
    let stop = Stop::default();
    let (nats, dispatching) = (started.client, started.worker.clone());
    let consuming = worker::dispatch_work(
        started.engine,
        started.worker,
        started.work,
        options.dispatch.max_in_flight,
        stop.clone(),
    );
    let stopping = async {
        shutdown.await;
        info!(drain = ?options.drain, "stopping: taking no more work");
        stop.enter(Phase::Draining);
        dispatching.stop();
        tokio::time::sleep(options.drain).await;
        warn!(drain = ?options.drain, "work still under way after the drain; handing it back");
        stop.enter(Phase::GivingUp);
        // Handing back needs NATS to take the naks (and the pulls' ends):
        // with NATS away the client's queue may be full, and the loops
        // would wait for good. What they did not hand back comes back
        // after the ack deadline.
        tokio::time::sleep(LAST_ACKS).await;
        warn!("the consumers did not end; stopping anyway");
    };
    tokio::select! {
        _ = consuming => {}
        () = stopping => {}
    }
    // Acks and naks are only queued on the connection: send them before the
    // process ends, or what was handed back waits out the ack deadline. Not
    // for long: with NATS away they would wait for good, and what they
    // leave comes back after the deadline anyway.
    match tokio::time::timeout(LAST_ACKS, nats.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "sending the last acks to NATS failed"),
        Err(_) => warn!(wait = ?LAST_ACKS, "NATS did not take the last acks in time"),
    }
    info!("ferry worker stopped");
    Ok(())
}
