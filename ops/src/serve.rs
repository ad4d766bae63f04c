//! `ferry serve`: the whole of Ferry in one process on the embedded default
//! (sled plus the in-process bus), assembled from the runtime and worker
//! crates.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use ferry_dispatch::{DispatchConfig, Dispatcher, Networks, Outbound, Worker};
use ferry_engine::bus::LocalBus;
use ferry_engine::limits::RateLimits;
use ferry_engine::token::Capabilities;
use ferry_engine::{Acknowledgements, Config, Engine};
use ferry_fronts::http::auth::ApiTokens;
use ferry_fronts::http::MetricsRender;
use ferry_store_sled::SledStore;
use futures::FutureExt;
use tokio::net::TcpListener;
use tracing::{info, warn};

/// Everything `ferry serve` is told.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub data: PathBuf,
    /// How tools reach this process; defaults to `http://{bound address}`.
    pub public_url: Option<String>,
    /// Tool server base URLs to register at start.
    pub tool_servers: Vec<String>,
    /// Start the demo tool beside Ferry and register it.
    pub demo: bool,
    /// Callback-token secret; defaults to one kept in the data dir.
    pub secret: Option<String>,
    pub max_body_bytes: usize,
    /// `Config::push_max_backoff`.
    pub push_max_backoff: Duration,
    pub dispatch: DispatchConfig,
    /// The OXP server's credentials and wait.
    pub oxp: ferry_fronts::oxp::OxpConfig,
    /// The MCP front's allow-lists and token.
    pub mcp: ferry_fronts::mcp::McpConfig,
    /// The native API's tokens (none: it asks for none).
    pub api_tokens: ApiTokens,
    /// Rate limits on every call.
    pub rate_limits: RateLimits,
    /// Where audit entries are also written as JSON lines (`-`: stdout).
    pub audit_log: Option<PathBuf>,
    /// How long a stopping process waits for the requests still running
    /// ([`serve_http`]).
    pub drain: Duration,
    /// The connection cap and each connection's clocks.
    pub limits: crate::listener::Limits,
    /// The networks outbound requests may reach.
    pub networks: Networks,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".parse().expect("valid address"),
            data: PathBuf::from("ferry-data"),
            public_url: None,
            tool_servers: vec![],
            demo: false,
            secret: None,
            max_body_bytes: Config::default().max_body_bytes,
            push_max_backoff: Config::default().push_max_backoff,
            dispatch: DispatchConfig::default(),
            oxp: Default::default(),
            mcp: Default::default(),
            api_tokens: ApiTokens::default(),
            rate_limits: RateLimits::default(),
            audit_log: None,
            drain: DRAIN,
            limits: crate::listener::Limits::default(),
            networks: Networks::default(),
        }
    }
}

/// A running Ferry: where it listens, and the future that serves it.
pub struct Running {
    pub addr: SocketAddr,
    pub public_url: String,
    pub demo_url: Option<String>,
    pub engine: Arc<Engine>,
    /// What dispatches the calls, for [`Running::finish`].
    worker: Worker,
    drain: Duration,
    /// When the stop began (the `shutdown` future resolved).
    stop_began: Arc<OnceLock<Instant>>,
}

impl Running {
    /// Ends a stop, once the HTTP intake has: waits for the dispatch
    /// attempts under way (no new one started since the stop began) until
    /// the drain that began with the stop is over, so that a tool that
    /// answers 200 meanwhile is not sent its call again after the restart;
    /// then writes the acknowledgements still waiting for their thread's
    /// next command, which would otherwise be lost. Calls whose attempt
    /// outlasts the drain, or whose dispatch only waited, go out again
    /// after the restart (invariant 4).
    pub async fn finish(&self) {
        // Stopped at the signal already, unless serving ended otherwise.
        self.worker.stop();
        let began = self.stop_began.get().copied().unwrap_or_else(Instant::now);
        let deadline = tokio::time::Instant::from_std(began + self.drain);
        if tokio::time::timeout_at(deadline, self.worker.idle())
            .await
            .is_err()
        {
            warn!(
                drain = ?self.drain,
                "dispatch attempts still under way after the drain; their calls go out again after the restart"
            );
        }
        self.engine.record_all_acks().await;
    }
}

/// Reads the secret kept in the data dir, creating it on first start.
pub(crate) fn secret(data: &Path, given: Option<&str>) -> anyhow::Result<Vec<u8>> {
    if let Some(s) = given {
        anyhow::ensure!(s.len() >= 16, "the secret must be at least 16 bytes");
        return Ok(s.as_bytes().to_vec());
    }
    let path = data.join("secret");
    if let Ok(existing) = std::fs::read(&path) {
        return Ok(existing);
    }
    let fresh: [u8; 32] = rand::random();
    let tmp = data.join("secret.tmp");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // Whoever reads the secret can forge callbacks: owner-only.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .context("writing the secret")?;
        file.write_all(&fresh)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, &path).context("installing the secret")?;
    Ok(fresh.to_vec())
}

/// The demo tool's listener, on the port it had before (kept in the data
/// dir): the calls it held when Ferry died point at that port, and only
/// there can recovery's `/tool_call_status` reach the demo tool again and
/// hear that they are lost. On a new port they would wait forever.
async fn demo_listener(data: &Path) -> anyhow::Result<TcpListener> {
    let path = data.join("demo-tool.port");
    let before = std::fs::read_to_string(&path)
        .ok()
        .and_then(|port| port.trim().parse::<u16>().ok());
    if let Some(port) = before {
        match TcpListener::bind(("127.0.0.1", port)).await {
            Ok(listener) => return Ok(listener),
            Err(e) => warn!(
                port,
                error = %e,
                "the demo tool's port is taken: it gets a new one, and calls it held are \
                 not asked about"
            ),
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    std::fs::write(&path, listener.local_addr()?.port().to_string())
        .context("keeping the demo tool's port")?;
    Ok(listener)
}

/// The client for tools: dispatch, notifications, discovery.
/// The client of every request Ferry makes ([`Outbound::new`]).
pub(crate) fn outbound(networks: &Networks) -> anyhow::Result<Outbound> {
    Ok(Outbound::new(networks.clone())?)
}

/// Starts Ferry and returns once it accepts requests; it serves until
/// `shutdown` resolves.
pub async fn start(
    options: ServeOptions,
    metrics: Option<MetricsRender>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(Running, tokio::task::JoinHandle<anyhow::Result<()>>)> {
    crate::data_dir::prepare(&options.data)?;
    let secret = secret(&options.data, options.secret.as_deref())?;
    let listener = TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("binding {}", options.listen))?;
    let addr = listener.local_addr()?;
    let public_url = options
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{addr}"))
        .trim_end_matches('/')
        .to_owned();
    let store = SledStore::open(&options.data.join("sled"))
        .with_context(|| format!("opening the store in {}", options.data.display()))?;
    let bus = LocalBus::new();
    let client = outbound(&options.networks)?;
    let config = Config {
        public_url: public_url.clone(),
        max_body_bytes: options.max_body_bytes,
        rate_limits: options.rate_limits,
        push_max_backoff: options.push_max_backoff,
        ..Config::default()
    };
    let store = Arc::new(store);
    let consumers = ferry_engine::delivery::Consumers::load(store.clone(), &*store)
        .await
        .context("loading the consumers")?;
    ferry_engine::delivery::describe();
    let mut engine = Engine::new(
        config,
        store.clone(),
        store,
        Arc::new(bus.clone()),
        Capabilities::new(&secret),
        client.clone(),
    )
    .with_acknowledgements(Acknowledgements::SINGLE_PROCESS)
    .with_concurrency_limits()
    .with_consumers(Arc::new(consumers));
    if let Some(path) = &options.audit_log {
        engine = engine.with_audit_lines(crate::audit_lines::open(path)?);
    }
    let engine = Arc::new(engine);
    engine.start_pushing();
    engine.start_counting_lag();
    let worker = Worker::new(
        Dispatcher::new(client, options.dispatch.clone()),
        engine.clone(),
    );
    let dispatching = worker.clone();
    bus.set_handler(Arc::new(move |work| {
        let worker = worker.clone();
        async move {
            // One process: an outcome that could not be stored means the
            // store is failing; recovery re-dispatches on restart.
            worker.handle(work).await;
        }
        .boxed()
    }));
    engine.start_timers();
    ferry_engine::metrics::describe();
    ferry_store_sled::commit::describe();
    let loaded = engine.load_toolsets().await?;
    info!(toolsets = loaded.len(), "toolsets loaded");
    engine.load_tokens().await?;

    let demo_url = if options.demo {
        let demo = demo_listener(&options.data).await?;
        let url = format!("http://{}", demo.local_addr()?);
        tokio::spawn(crate::demo_tool::DemoTool::serve(demo));
        Some(url)
    } else {
        None
    };
    let servers: Vec<String> = options
        .tool_servers
        .iter()
        .chain(&demo_url)
        .cloned()
        .collect();
    crate::tool_servers::register(&engine, &servers).await;

    let checks = engine.recover().await?;
    tokio::spawn(checks);

    let perform = Arc::new(ferry_fronts::http::Local(engine.clone()));
    let app = ferry_fronts::http::router(
        engine.clone(),
        metrics,
        options.api_tokens.clone(),
        &options.mcp.allowed_hosts,
    )
    .merge(protocol_fronts(
        &engine,
        perform,
        &public_url,
        &options.oxp,
        &options.mcp,
        &options.api_tokens,
    ));
    // From the stop on, no dispatch attempt starts: the calls stay queued
    // and go out after the restart.
    let stop_began = Arc::new(OnceLock::new());
    let shutdown = {
        let (stop_began, dispatching) = (stop_began.clone(), dispatching.clone());
        async move {
            shutdown.await;
            stop_began.get_or_init(Instant::now);
            dispatching.stop();
        }
    };
    let server = tokio::spawn(serve_http(
        listener,
        app,
        engine.clone(),
        shutdown,
        options.drain,
        options.limits,
    ));
    info!(%addr, %public_url, "ferry listening");
    Ok((
        Running {
            addr,
            public_url,
            demo_url,
            engine,
            worker: dispatching,
            drain: options.drain,
            stop_began,
        },
        server,
    ))
}

/// How long a stopping process waits by default for its open requests
/// once streams and long waits were told to end (`--drain-ms`): requests
/// still open then (a client sending its body slowly, say) are cut off.
/// Whatever was acknowledged is durable already.
pub const DRAIN: Duration = Duration::from_secs(10);

/// Serves `app` until `shutdown` resolves, then stops taking connections,
/// ends the engine's open streams and long waits (they would hold a
/// graceful shutdown open for as long as their agents stay), and waits up
/// to `drain` for the requests still running. Connections are served
/// within `limits` ([`crate::listener`]).
pub(crate) async fn serve_http(
    listener: TcpListener,
    app: axum::Router,
    engine: Arc<Engine>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    drain: Duration,
    limits: crate::listener::Limits,
) -> anyhow::Result<()> {
    // The drain's clock starts when the readers are told to stop.
    let drained = {
        let stopped = engine.readers_stop();
        async move {
            stopped.await;
            tokio::time::sleep(drain).await;
        }
    };
    let shutdown = async move {
        shutdown.await;
        info!("stopping: open streams and long waits end now");
        engine.stop_readers();
    };
    info!(?limits, "connection limits");
    tokio::select! {
        () = crate::listener::serve(listener, app, limits, shutdown) => {}
        () = drained => warn!(?drain, "requests still open after the drain; stopping anyway"),
    }
    // Everything acknowledged was flushed before it was answered.
    info!("HTTP intake stopped");
    Ok(())
}

/// Sends small writes (an SSE frame, a short answer) at once: with Nagle's
/// algorithm a frame could wait for the peer's delayed ACK of the last one.
pub fn no_delay(tcp: &mut tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
}

/// The MCP (`/mcp`) and OXP (`/oxp`) fronts, submitting through `perform`.
/// The public URL is how clients reach Ferry: `/mcp` accepts its authority
/// as a `Host` and its origin as an `Origin` (a page Ferry serves itself).
/// The native API's tokens guard both fronts where they have no
/// credentials of their own.
pub(crate) fn protocol_fronts(
    engine: &Arc<Engine>,
    perform: Arc<dyn ferry_fronts::http::Perform>,
    public_url: &str,
    oxp: &ferry_fronts::oxp::OxpConfig,
    mcp: &ferry_fronts::mcp::McpConfig,
    api_tokens: &ApiTokens,
) -> axum::Router {
    let api_tokens = api_tokens.clone().with_named(engine.clone());
    let mut oxp = oxp.clone();
    oxp.auth.api_tokens = api_tokens.clone();
    oxp.allowed_hosts = mcp.allowed_hosts.clone();
    let mut mcp = mcp.clone();
    mcp.api_tokens = api_tokens;
    if let Some(authority) = public_url
        .split("://")
        .nth(1)
        .and_then(|r| r.split('/').next())
    {
        mcp.allowed_hosts.push(authority.to_owned());
    }
    if let Ok(url) = reqwest::Url::parse(public_url) {
        let origin = url.origin();
        if origin.is_tuple() {
            mcp.allowed_origins.push(origin.ascii_serialization());
        }
    }
    ferry_fronts::oxp::router(engine.clone(), perform.clone(), &oxp)
        .merge(ferry_fronts::mcp::router(engine.clone(), perform, mcp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept_port(data: &Path) -> String {
        std::fs::read_to_string(data.join("demo-tool.port")).unwrap()
    }

    #[tokio::test]
    async fn the_demo_tool_keeps_its_port_and_moves_only_when_it_must() {
        let data = tempfile::tempdir().unwrap();
        let first = demo_listener(data.path()).await.unwrap();
        let port = first.local_addr().unwrap().port();
        assert_eq!(kept_port(data.path()), port.to_string());

        // Taken (here, by the first listener still open): a new port, kept.
        let second = demo_listener(data.path()).await.unwrap();
        let moved = second.local_addr().unwrap().port();
        assert_ne!(moved, port);
        assert_eq!(kept_port(data.path()), moved.to_string());

        // Free again: the kept one.
        drop(second);
        let again = demo_listener(data.path()).await.unwrap();
        assert_eq!(again.local_addr().unwrap().port(), moved);
        drop(again);

        // An unreadable file: a new port, which replaces it.
        std::fs::write(data.path().join("demo-tool.port"), "not a port").unwrap();
        let fresh = demo_listener(data.path()).await.unwrap();
        let fresh_port = fresh.local_addr().unwrap().port();
        assert_eq!(kept_port(data.path()), fresh_port.to_string());
    }
}
