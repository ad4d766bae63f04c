//! The cluster roles: `ferry runtime` (HTTP ingress, outbox, relay, reads)
//! and `ferry worker` (applies relayed requests, dispatches calls), joined
//! through NATS JetStream. See ARCHITECTURE.md, "Cluster mode".

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ferry_runtime::bus::jetstream::JetStreamBus;
use ferry_runtime::cluster::stop::{Phase, Stop};
use ferry_runtime::cluster::{outbox::Outbox, pull, relay::Relay, streams, worker};
use ferry_runtime::http::auth::ApiTokens;
use ferry_runtime::http::MetricsRender;
use ferry_runtime::store::deferred::Deferred;
use ferry_runtime::store::jetstream::{ClientEvents, JetStreamStore};
use ferry_runtime::store::Store;
use ferry_runtime::token::Capabilities;
use ferry_runtime::toolsets::StoredToolset;
use ferry_runtime::{Config, Engine};
use ferry_worker::{DispatchConfig, Dispatcher, Worker};
use tokio::net::TcpListener;
use tracing::{info, warn};

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
}

#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    pub cluster: ClusterOptions,
    pub listen: SocketAddr,
    pub data: PathBuf,
    pub tool_servers: Vec<String>,
    pub max_body_bytes: usize,
    /// How long a node waits for a worker's answer before it answers
    /// `202 journaled`.
    pub reply_wait: Duration,
    pub oxp: ferry_runtime::oxp::OxpConfig,
    pub mcp: ferry_runtime::mcp::McpConfig,
    /// The native API's tokens (none: it asks for none).
    pub api_tokens: ApiTokens,
    /// How long a stopping node waits for the requests still running.
    pub drain: Duration,
}

#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub cluster: ClusterOptions,
    pub dispatch: DispatchConfig,
    /// Relayed requests being applied at once.
    pub concurrency: usize,
    /// The priority it pulls work at, 0 first, up to
    /// [`streams::MAX_PRIORITY`]; given, it also gives the consumers their
    /// priority group. Without, it pulls at 0 when they have one.
    pub priority: Option<u8>,
    /// Takes the consumers' priority group away at start.
    pub drop_priority_group: bool,
    /// How long a stopping worker goes on with what is under way before it
    /// hands that back too ([`ferry_runtime::cluster::stop`]).
    pub drain: Duration,
}

/// Connects to NATS; afterwards the client reconnects on its own, forever.
/// With `wait`, returns only once NATS answered (a worker has nothing to
/// do before); without, at once, connecting in the background (a runtime
/// node journals meanwhile). Also returns what the client reports of
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
            Ok(client) => return Ok((client, events)),
            Err(e) => {
                warn!(urls, error = %e, "NATS not reachable yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
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
    let js = async_nats::jetstream::new(client.clone());
    let mut attempt = 0;
    loop {
        attempt += 1;
        let ready = async {
            streams::ensure(&js, options.replicas).await?;
            let follow = role == Role::Runtime;
            let store =
                JetStreamStore::connect(client.clone(), events.clone(), options.replicas, follow);
            anyhow::Ok(store.await?)
        };
        match ready.await {
            Ok(store) => return Ok(store),
            Err(e) if attempts.is_none_or(|n| attempt < n) => {
                // Half a minute of refusals from a NATS that answers is not
                // an outage: say so louder (a node keeps journaling).
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

/// The engine both roles run, on `store` and the JetStream bus.
fn engine(
    options: &ClusterOptions,
    public_url: &str,
    client: &async_nats::Client,
    store: Arc<dyn Store>,
    max_body_bytes: usize,
) -> anyhow::Result<Arc<Engine>> {
    anyhow::ensure!(
        options.secret.len() >= 16,
        "--secret must be at least 16 bytes (and the same on every node and worker)"
    );
    let config = Config {
        public_url: public_url.trim_end_matches('/').to_owned(),
        max_body_bytes,
        ..Config::default()
    };
    Ok(Arc::new(Engine::new(
        config,
        store,
        Arc::new(JetStreamBus::new(async_nats::jetstream::new(
            client.clone(),
        ))),
        Capabilities::new(options.secret.as_bytes()),
        crate::serve::http_client()?,
    )))
}

/// Loads the toolsets into the engine now and whenever any process changes
/// one (toolsets registered through any node reach every process); `keep`
/// sees each load.
async fn follow_toolsets(
    engine: &Arc<Engine>,
    store: &JetStreamStore,
    keep: impl Fn(&[StoredToolset]) + Send + 'static,
) -> anyhow::Result<()> {
    keep(&engine.load_toolsets().await?);
    let mut changed = store.toolsets_changed();
    let weak = Arc::downgrade(engine);
    tokio::spawn(async move {
        while changed.changed().await.is_ok() {
            let Some(engine) = weak.upgrade() else { return };
            match engine.load_toolsets().await {
                Ok(loaded) => keep(&loaded),
                Err(e) => warn!(error = %e, "reloading toolsets failed"),
            }
        }
    });
    Ok(())
}

/// A running runtime node.
pub struct RunningRuntime {
    pub addr: SocketAddr,
    pub engine: Arc<Engine>,
    pub relay: Arc<Relay>,
}

/// How long a runtime node waits for NATS before it serves its journal.
const ATTACH_WAIT: Duration = Duration::from_secs(10);

/// Gives a runtime node its JetStream store once NATS answers, then its
/// toolsets (kept in the outbox for the next start) and the tool servers it
/// was told to register; each step is retried for as long as it takes.
async fn attach(
    options: RuntimeOptions,
    client: async_nats::Client,
    events: Arc<ClientEvents>,
    store: Arc<Deferred>,
    engine: Arc<Engine>,
    outbox: Arc<Outbox>,
) {
    let jetstream = loop {
        match jetstream_store(&options.cluster, Role::Runtime, &client, &events, None).await {
            Ok(jetstream) => break jetstream,
            Err(e) => warn!(error = %e, "binding JetStream failed; retrying"),
        }
    };
    store.set(jetstream.clone());
    loop {
        let outbox = outbox.clone();
        let keep = move |toolsets: &[StoredToolset]| {
            if let Err(e) = outbox.keep_toolsets(toolsets) {
                warn!(error = %e, "keeping the toolsets failed");
            }
        };
        match follow_toolsets(&engine, &jetstream, keep).await {
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
    std::fs::create_dir_all(&options.data)
        .with_context(|| format!("creating data dir {}", options.data.display()))?;
    // The journal first: what a previous run left there is relayed as soon
    // as NATS is reachable.
    let outbox = Arc::new(
        Outbox::open(&options.data.join("outbox"))
            .with_context(|| format!("opening the outbox in {}", options.data.display()))?,
    );
    if outbox.unreadable() > 0 {
        warn!(
            entries = outbox.unreadable(),
            "the outbox holds journal entries this build cannot read (its `unreadable` tree); they are not relayed"
        );
    }
    let node = node_id(&options.data)?;
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
    // The store arrives when NATS answers; until then the node validates
    // calls against the toolsets it kept, and journals them.
    let store = Arc::new(Deferred::default());
    let engine = engine(
        &options.cluster,
        &public_url,
        &client,
        store.clone(),
        options.max_body_bytes,
    )?;
    engine.use_toolsets(outbox.kept_toolsets()?);
    ferry_runtime::metrics::describe();
    let attached = tokio::spawn(attach(
        options.clone(),
        client.clone(),
        events,
        store.clone(),
        engine.clone(),
        outbox.clone(),
    ));
    // NATS reachable: serve once attached, as a node always did. Not
    // reachable: serve the journal after a while, and attach later.
    match tokio::time::timeout(ATTACH_WAIT, attached).await {
        Ok(done) => done.context("attaching to NATS")?,
        Err(_) => warn!(
            wait = ?ATTACH_WAIT,
            "NATS not reachable: accepting calls into the journal, reads unavailable until it is"
        ),
    }
    let relay = Relay::start(
        engine.clone(),
        outbox.clone(),
        client,
        node.clone(),
        options.reply_wait,
    )
    .await?;
    info!(backlog = relay.backlog(), node, "relay started");
    let app = ferry_runtime::http::router_with(
        engine.clone(),
        metrics,
        relay.clone(),
        options.api_tokens.clone(),
    )
    .merge(crate::serve::protocol_fronts(
        &engine,
        relay.clone(),
        &public_url,
        &options.oxp,
        &options.mcp,
        &options.api_tokens,
    ));
    let server = tokio::spawn(crate::serve::serve_http(
        listener,
        app,
        engine.clone(),
        shutdown,
        options.drain,
    ));
    info!(%addr, "ferry runtime listening");
    Ok((
        RunningRuntime {
            addr,
            engine,
            relay,
        },
        server,
    ))
}

/// This node's name in `Nats-Msg-Id`s, kept in the data dir so a relay
/// repeated after a restart dedupes against the first.
fn node_id(data: &std::path::Path) -> anyhow::Result<String> {
    let path = data.join("node-id");
    if let Ok(id) = std::fs::read_to_string(&path) {
        return Ok(id.trim().to_owned());
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let tmp = data.join("node-id.tmp");
    std::fs::write(&tmp, &id)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(id)
}

/// A worker connected, with its consumers bound.
struct StartedWorker {
    client: async_nats::Client,
    engine: Arc<Engine>,
    worker: Worker,
    requests: pull::Puller,
    work: pull::Puller,
}

/// Connects a worker and binds its consumers, waiting out a NATS outage.
async fn start_worker(options: &WorkerOptions) -> anyhow::Result<StartedWorker> {
    let (client, events) = connect(&options.cluster.nats, true).await?;
    let public_url = options
        .cluster
        .public_url
        .clone()
        .context("a worker needs --public-url")?;
    let store = jetstream_store(&options.cluster, Role::Worker, &client, &events, Some(60)).await?;
    let engine = engine(
        &options.cluster,
        &public_url,
        &client,
        store.clone(),
        Config::default().max_body_bytes,
    )?;
    follow_toolsets(&engine, &store, |_| {}).await?;
    ferry_runtime::metrics::describe();
    engine.start_timers();
    let sweeper = engine.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(60));
        loop {
            every.tick().await;
            match sweeper.rearm().await {
                Ok(n) => info!(rearmed = n, "recovery sweep"),
                Err(e) => warn!(error = %e, "recovery sweep failed"),
            }
        }
    });
    let worker = Worker::new(
        Dispatcher::new(crate::serve::http_client()?, options.dispatch.clone()),
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
    let requests =
        pull::Puller::bind(client.clone(), streams::INBOX_STREAM, change, priority).await;
    let work = pull::Puller::bind(client.clone(), streams::WORK_STREAM, change, priority).await;
    info!(priority, "ferry worker consuming");
    Ok(StartedWorker {
        client,
        engine,
        worker,
        requests,
        work,
    })
}

/// How long a stopped worker waits for NATS to take its last acks and
/// naks, once it gave up.
const LAST_ACKS: Duration = Duration::from_secs(5);

/// Runs a worker until `shutdown` resolves; then it drains
/// ([`ferry_runtime::cluster::stop`]): it takes no more work, finishes
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
    let (nats, dispatching) = (started.client.clone(), started.worker.clone());
    let consuming = async {
        tokio::join!(
            worker::apply_requests(
                started.engine,
                started.client,
                started.requests,
                options.concurrency,
                stop.clone()
            ),
            worker::dispatch_work(
                started.worker,
                started.work,
                options.dispatch.max_in_flight,
                stop.clone()
            ),
        )
    };
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
