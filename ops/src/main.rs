//! The `ferry` command: `serve` (everything in one process on the embedded
//! default), the cluster roles `runtime` and `worker` (on NATS JetStream),
//! `demo-tool` (the RAP demo toolset on its own), `bench`, and the operator
//! commands (`toolsets`, `tools`, `calls`, `approvals`, `threads`,
//! `replay`), clients of a running Ferry.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use ferry_dispatch::{DispatchConfig, Networks};
use ferry_engine::limits::{Limit, RateLimits};
use ferry_fronts::http::auth::ApiTokens;
use ferry_fronts::http::jwt::{ClaimNames, Jwt, JwtConfig};
use ferry_ops::args::{http_url, tool_server_url};
use ferry_ops::cluster::{start_runtime, ClusterOptions, RuntimeOptions, WorkerOptions};
use ferry_ops::demo_tool::DemoTool;
use ferry_ops::listener;
use ferry_ops::operator::{self, Operator};
use ferry_ops::serve::{start, ServeOptions};
use tracing_subscriber::EnvFilter;

/// Ferry allocates many short-lived buffers per request (HTTP, JSON, sled
/// nodes); glibc's malloc took about a seventh of the CPU under load.
/// Built without transparent huge pages (`no_thp`): mimalloc asks for them,
/// and the kernel zeroing 2 MiB pages faulted in anew (sled allocates a
/// 512 KiB buffer per log segment) was 5% of the CPU at 64 callers.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "ferry",
    version,
    about = "A durable, queue-backed tool runtime for agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run Ferry in one process: sled plus an in-process bus, no NATS.
    Serve(Serve),
    /// Serve the RAP demo toolset (`demo`) on its own.
    DemoTool {
        #[arg(long, default_value = "127.0.0.1:8090", env = "FERRY_DEMO_LISTEN")]
        listen: SocketAddr,
    },
    /// A cluster runtime node: HTTP ingress and reads, on NATS JetStream.
    Runtime(Runtime),
    /// A cluster worker: applies requests and dispatches calls (stateless).
    Worker(WorkerArgs),
    /// Measure the whole path against direct RAP to the same tool.
    Bench(ferry_ops::bench::BenchArgs),
    #[command(flatten)]
    Operator(Operator),
}

#[derive(Args)]
#[command(args_override_self = true)]
struct Serve {
    /// Address of the HTTP API (agents and tool callbacks).
    #[arg(long, default_value = "127.0.0.1:8080", env = "FERRY_LISTEN")]
    listen: SocketAddr,
    /// Directory of the durable store and the callback secret.
    #[arg(long, default_value = "./ferry-data", env = "FERRY_DATA")]
    data: PathBuf,
    /// Base URL tools use to reach this process (default: http://LISTEN).
    #[arg(long, env = "FERRY_PUBLIC_URL", value_parser = http_url)]
    public_url: Option<String>,
    /// A RAP tool server's base URL to register at start (repeatable).
    #[arg(
        long = "tool-server",
        env = "FERRY_TOOL_SERVERS",
        value_delimiter = ',',
        value_parser = tool_server_url
    )]
    tool_servers: Vec<String>,
    /// Start the demo tool beside Ferry and register its toolset.
    #[arg(long)]
    demo: bool,
    /// Secret for callback tokens (default: generated and kept in --data).
    #[arg(long, env = "FERRY_SECRET", hide_env_values = true)]
    secret: Option<String>,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = 1 << 20, env = "FERRY_MAX_BODY_BYTES")]
    max_body_bytes: usize,
    /// The longest a push consumer waits between attempts at a receiver
    /// that fails, in milliseconds (the wait doubles from 500 up to it).
    #[arg(long, default_value_t = 60_000, env = "FERRY_PUSH_MAX_BACKOFF_MS", value_parser = clap::value_parser!(u64).range(500..=86_400_000))]
    push_max_backoff_ms: u64,
    #[command(flatten)]
    fronts: FrontArgs,
    #[command(flatten)]
    dispatch: DispatchArgs,
    #[command(flatten)]
    connections: ConnectionArgs,
    #[command(flatten)]
    drain: DrainArgs,
    #[command(flatten)]
    outbound: OutboundArgs,
}

/// The networks Ferry's own requests (discovery, invocations, notices,
/// `response_url`) may reach, on `serve`, runtime nodes and workers.
#[derive(Args)]
struct OutboundArgs {
    /// A network (CIDR) requests may reach (repeatable); given, no other.
    #[arg(long = "allow-network", value_name = "CIDR", env = "FERRY_ALLOW_NETWORKS",
          value_delimiter = ',', value_parser = network)]
    allow_networks: Vec<ipnet::IpNet>,
    /// A network (CIDR) requests may not reach (repeatable), even inside
    /// an allowed one: in production, at least 169.254.0.0/16 and the
    /// private networks the tools are not in.
    #[arg(long = "deny-network", value_name = "CIDR", env = "FERRY_DENY_NETWORKS",
          value_delimiter = ',', value_parser = network)]
    deny_networks: Vec<ipnet::IpNet>,
}

impl OutboundArgs {
    fn networks(&self) -> Networks {
        Networks::new(self.allow_networks.clone(), self.deny_networks.clone())
    }
}

/// A network in CIDR notation; a bare address is the network of it alone.
fn network(text: &str) -> Result<ipnet::IpNet, String> {
    let text = text.trim();
    text.parse::<ipnet::IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{text:?} is not a network in CIDR notation (e.g. 10.0.0.0/8)"))
}

/// How many connections the HTTP API serves at once, and how long each may
/// take to send a request, on `serve` and on cluster runtime nodes.
#[derive(Args)]
struct ConnectionArgs {
    /// Connections served at once; more wait to be accepted until one
    /// closes (default: half the process's open-file limit, after 64).
    #[arg(long, env = "FERRY_MAX_CONNECTIONS",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(listener::MAX_CONNECTIONS)))]
    max_connections: Option<u32>,
    /// How long a client may take to send a request's header, from the
    /// connection's start or the first byte after an idle spell, in
    /// milliseconds; then the connection is closed.
    #[arg(long, default_value_t = listener::HEADER_TIMEOUT.as_millis() as u64,
          env = "FERRY_HEADER_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_ms: u64,
    /// How long a client may take to send a request's body, from the end
    /// of its header, in milliseconds; then it is answered 408.
    #[arg(long, default_value_t = listener::BODY_TIMEOUT.as_millis() as u64,
          env = "FERRY_BODY_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout_ms: u64,
    /// How long a connection may wait for its next request, in
    /// milliseconds; then it is closed.
    #[arg(long, default_value_t = listener::IDLE_TIMEOUT.as_millis() as u64,
          env = "FERRY_IDLE_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout_ms: u64,
}

impl ConnectionArgs {
    fn limits(&self) -> listener::Limits {
        listener::Limits {
            header: Duration::from_millis(self.header_timeout_ms),
            body: Duration::from_millis(self.body_timeout_ms),
            idle: Duration::from_millis(self.idle_timeout_ms),
            max_connections: self
                .max_connections
                .map_or_else(listener::default_max_connections, |n| n as usize),
        }
    }
}

/// The native API's tokens and the MCP and OXP fronts, on `serve` and on
/// cluster runtime nodes.
#[derive(Args)]
struct FrontArgs {
    /// Require `Authorization: Bearer <token>` on the native API, but for
    /// tools' callbacks, `/healthz` and the dashboard's page, and on `/mcp`
    /// and `/oxp` unless they have credentials of their own (repeatable:
    /// any one is accepted; 16 to 512 characters of a bearer token).
    #[arg(
        long = "api-token",
        env = "FERRY_API_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    api_tokens: Vec<String>,
    /// Accept `Authorization: Bearer` JWTs signed HS256 with this secret
    /// (at least 32 bytes) as identities, on the native API, `/mcp` and
    /// OXP: name from `sub`, scopes from `scope` (see --jwt-claim-*).
    #[arg(long, env = "FERRY_JWT_SECRET", hide_env_values = true)]
    jwt_secret: Option<String>,
    /// Accept JWTs signed RS256 or ES256 by a key of this JWKS file (read
    /// at start; the token's `kid` picks the key).
    #[arg(long, env = "FERRY_JWT_JWKS", value_name = "FILE")]
    jwt_jwks: Option<PathBuf>,
    /// The `iss` every JWT must name.
    #[arg(long, env = "FERRY_JWT_ISSUER")]
    jwt_issuer: Option<String>,
    /// The `aud` every JWT must name (without it, a JWT naming any is refused).
    #[arg(long, env = "FERRY_JWT_AUDIENCE")]
    jwt_audience: Option<String>,
    /// The claim holding a JWT identity's name.
    #[arg(long, env = "FERRY_JWT_CLAIM_NAME", default_value = "sub")]
    jwt_claim_name: String,
    /// The claim holding its scopes: space-separated words or an array.
    #[arg(long, env = "FERRY_JWT_CLAIM_SCOPES", default_value = "scope")]
    jwt_claim_scopes: String,
    /// The claim holding the tools it may call (`Toolset` or `Toolset.tool`).
    #[arg(long, env = "FERRY_JWT_CLAIM_TOOLS", default_value = "ferry_tools")]
    jwt_claim_tools: String,
    /// The claim holding the `group_id` prefix of its threads.
    #[arg(
        long,
        env = "FERRY_JWT_CLAIM_GROUP_PREFIX",
        default_value = "ferry_group_prefix"
    )]
    jwt_claim_group_prefix: String,
    /// The claim holding the users it acts for.
    #[arg(long, env = "FERRY_JWT_CLAIM_USERS", default_value = "ferry_users")]
    jwt_claim_users: String,
    /// OXP: HS256 secret for `Authorization: Bearer` JWTs (turns OXP auth on).
    #[arg(long, env = "FERRY_OXP_JWT_SECRET", hide_env_values = true)]
    oxp_jwt_secret: Option<String>,
    /// OXP: the audience a JWT's `aud`, when present, must name.
    #[arg(long, env = "FERRY_OXP_JWT_AUDIENCE")]
    oxp_jwt_audience: Option<String>,
    /// OXP: a key accepted in the `OXP-API-Key` header (turns OXP auth on).
    #[arg(long, env = "FERRY_OXP_API_KEY", hide_env_values = true)]
    oxp_api_key: Option<String>,
    /// OXP: seconds `tools/call` waits for a result before "retry later".
    #[arg(
        long,
        default_value_t = 30,
        env = "FERRY_OXP_WAIT_SECS",
        value_parser = clap::value_parser!(u64).range(0..=MAX_OXP_WAIT_SECS)
    )]
    oxp_wait_secs: u64,
    /// A `Host` (`name` or `name:port`) `/mcp` and the native API accept
    /// besides loopback ones and the public URL's (repeatable):
    /// DNS-rebinding protection refuses any other.
    #[arg(
        long = "mcp-allowed-host",
        env = "FERRY_MCP_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    mcp_allowed_hosts: Vec<String>,
    /// An `Origin` `/mcp` accepts besides loopback ones (repeatable; `*`
    /// for any); a foreign Origin gets 403.
    #[arg(
        long = "mcp-allowed-origin",
        env = "FERRY_MCP_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    mcp_allowed_origins: Vec<String>,
    /// Require `Authorization: Bearer <token>` on `/mcp`.
    #[arg(long, env = "FERRY_MCP_BEARER_TOKEN", hide_env_values = true)]
    mcp_bearer_token: Option<String>,
    /// Every identity's calls, at most RATE a second and BURST at once
    /// (`RATE:BURST`); more are refused 429 with `Retry-After`.
    #[arg(long, env = "FERRY_RATE_LIMIT_IDENTITY", value_name = "RATE:BURST")]
    rate_limit_identity: Option<Limit>,
    /// Every `user_id`'s calls, as `--rate-limit-identity`.
    #[arg(long, env = "FERRY_RATE_LIMIT_USER", value_name = "RATE:BURST")]
    rate_limit_user: Option<Limit>,
    /// Every tool's calls (all callers together), as `--rate-limit-identity`.
    #[arg(long, env = "FERRY_RATE_LIMIT_TOOL", value_name = "RATE:BURST")]
    rate_limit_tool: Option<Limit>,
    /// Also write every audit entry this process records as a line of
    /// JSON to this file (appended; `-`: standard output), for a log
    /// shipper. The log itself is `GET /v1/audit` either way.
    #[arg(long, env = "FERRY_AUDIT_LOG", value_name = "PATH")]
    audit_log: Option<PathBuf>,
}

impl FrontArgs {
    fn rate_limits(&self) -> RateLimits {
        RateLimits {
            identity: self.rate_limit_identity,
            user: self.rate_limit_user,
            tool: self.rate_limit_tool,
        }
    }

    fn api_tokens(&self) -> anyhow::Result<ApiTokens> {
        let tokens =
            ApiTokens::new(&self.api_tokens).context("--api-token (or FERRY_API_TOKENS)")?;
        let jwt = Jwt::new(&JwtConfig {
            hs256_secret: self.jwt_secret.clone(),
            jwks_file: self.jwt_jwks.clone(),
            issuer: self.jwt_issuer.clone(),
            audience: self.jwt_audience.clone(),
            claims: ClaimNames {
                name: self.jwt_claim_name.clone(),
                scopes: self.jwt_claim_scopes.clone(),
                tools: self.jwt_claim_tools.clone(),
                group_prefix: self.jwt_claim_group_prefix.clone(),
                users: self.jwt_claim_users.clone(),
            },
        })?;
        Ok(tokens.with_jwt(jwt))
    }

    fn oxp(&self, max_body_bytes: usize) -> ferry_fronts::oxp::OxpConfig {
        ferry_fronts::oxp::OxpConfig {
            auth: ferry_fronts::oxp::AuthConfig {
                jwt_secret: self.oxp_jwt_secret.clone(),
                jwt_audience: self.oxp_jwt_audience.clone(),
                api_key: self.oxp_api_key.clone(),
                ..Default::default()
            },
            wait: Duration::from_secs(self.oxp_wait_secs),
            max_body_bytes,
            allowed_hosts: self.mcp_allowed_hosts.clone(),
        }
    }

    fn mcp(&self, max_body_bytes: usize) -> ferry_fronts::mcp::McpConfig {
        ferry_fronts::mcp::McpConfig {
            allowed_hosts: self.mcp_allowed_hosts.clone(),
            allowed_origins: self.mcp_allowed_origins.clone(),
            bearer_token: self.mcp_bearer_token.clone(),
            max_body_bytes,
            ..Default::default()
        }
    }
}

/// How calls are dispatched to tools.
#[derive(Args)]
struct DispatchArgs {
    /// Dispatch attempts per call before it fails.
    #[arg(long, default_value_t = DispatchConfig::default().max_attempts, env = "FERRY_MAX_ATTEMPTS")]
    max_attempts: u32,
    /// First retry delay, in milliseconds; each later one is 1.5 times the
    /// last, ±50% at random, up to about --max-backoff-ms.
    #[arg(long, default_value_t = 200, env = "FERRY_INITIAL_BACKOFF_MS")]
    initial_backoff_ms: u64,
    #[arg(long, default_value_t = 10_000, env = "FERRY_MAX_BACKOFF_MS")]
    max_backoff_ms: u64,
    /// Invocations awaiting a tool's answer at once, across calls; a call
    /// waiting to retry holds none.
    #[arg(long, default_value_t = DispatchConfig::default().max_in_flight, env = "FERRY_MAX_IN_FLIGHT")]
    max_in_flight: usize,
    /// How long one attempt waits for the tool's HTTP answer (RAP tools
    /// acknowledge at once and answer later), in milliseconds.
    #[arg(long, default_value_t = DispatchConfig::default().ack_timeout.as_millis() as u64, env = "FERRY_ACK_TIMEOUT_MS")]
    ack_timeout_ms: u64,
}

impl DispatchArgs {
    fn config(&self) -> anyhow::Result<DispatchConfig> {
        anyhow::ensure!(self.max_attempts >= 1, "--max-attempts must be at least 1");
        anyhow::ensure!(
            self.max_in_flight >= 1,
            "--max-in-flight must be at least 1"
        );
        anyhow::ensure!(
            self.ack_timeout_ms >= 1,
            "--ack-timeout-ms must be at least 1"
        );
        Ok(DispatchConfig {
            max_attempts: self.max_attempts,
            initial_backoff: Duration::from_millis(self.initial_backoff_ms),
            max_backoff: Duration::from_millis(self.max_backoff_ms),
            max_in_flight: self.max_in_flight,
            ack_timeout: Duration::from_millis(self.ack_timeout_ms),
        })
    }
}

/// The longest `--oxp-wait-secs`: a day (a wait is added to the clock, and
/// OXP clients give up after about a minute anyway).
const MAX_OXP_WAIT_SECS: u64 = 86_400;

/// One or more NATS URLs, comma-separated, none empty.
fn nats_urls(text: &str) -> Result<String, String> {
    if text.split(',').any(|u| u.trim().is_empty()) {
        return Err(format!(
            "{text:?} names no NATS server (e.g. nats://127.0.0.1:4222)"
        ));
    }
    Ok(text.to_owned())
}

/// The cluster's callback secret, checked before NATS is reached.
fn cluster_secret(text: &str) -> Result<String, String> {
    if text.len() < 16 {
        return Err(
            "the secret must be at least 16 bytes (and the same on every node and worker)".into(),
        );
    }
    Ok(text.to_owned())
}

/// What the cluster roles share.
#[derive(Args)]
struct ClusterArgs {
    /// NATS server URL(s), comma-separated.
    #[arg(long, default_value = "nats://127.0.0.1:4222", env = "FERRY_NATS", value_parser = nats_urls)]
    nats: String,
    /// Secret for callback tokens: the same on every runtime node and worker
    /// (at least 16 bytes).
    #[arg(long, env = "FERRY_SECRET", hide_env_values = true, value_parser = cluster_secret)]
    secret: String,
    /// Base URL tools reach the runtime nodes at (a load balancer, or one
    /// node). Required for workers (it goes into callback URLs); a runtime
    /// node defaults to its own address.
    #[arg(long, env = "FERRY_PUBLIC_URL", value_parser = http_url)]
    public_url: Option<String>,
    /// Replicas of each JetStream stream (3 on a three-node NATS cluster).
    #[arg(long, default_value_t = 1, env = "FERRY_REPLICAS")]
    replicas: usize,
    /// Streams the thread logs are spread over, by a stable hash of the
    /// `group_id`: on a NATS cluster their leaders spread over its servers,
    /// so no one server's writes cap every thread. Fixed by the first
    /// process to start; every node and worker must be given the same.
    /// About one per NATS server (or a few per server) is plenty.
    #[arg(long, default_value_t = 1, env = "FERRY_PARTITIONS",
          value_parser = clap::value_parser!(u16).range(1..=ferry_nats::cluster::subjects::MAX_PARTITIONS as i64))]
    partitions: u16,
    #[command(flatten)]
    outbound: OutboundArgs,
}

impl ClusterArgs {
    fn options(self) -> ClusterOptions {
        ClusterOptions {
            nats: self.nats,
            secret: self.secret,
            public_url: self.public_url,
            replicas: self.replicas,
            partitions: usize::from(self.partitions),
            networks: self.outbound.networks(),
        }
    }
}

#[derive(Args)]
struct Runtime {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Address of the HTTP API (agents and tool callbacks).
    #[arg(long, default_value = "127.0.0.1:8080", env = "FERRY_LISTEN")]
    listen: SocketAddr,
    /// A RAP tool server's base URL to register at start (repeatable).
    #[arg(
        long = "tool-server",
        env = "FERRY_TOOL_SERVERS",
        value_delimiter = ',',
        value_parser = tool_server_url
    )]
    tool_servers: Vec<String>,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = 1 << 20, env = "FERRY_MAX_BODY_BYTES")]
    max_body_bytes: usize,
    #[command(flatten)]
    fronts: FrontArgs,
    #[command(flatten)]
    connections: ConnectionArgs,
    #[command(flatten)]
    drain: DrainArgs,
}

#[derive(Args)]
#[command(args_override_self = true)]
struct WorkerArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    dispatch: DispatchArgs,
    /// Seconds a call a tool was given (dispatched, waiting on a person,
    /// subscribed) may go unchanged before the worker asks the tool about
    /// it (`/tool_call_status`); a tool that no longer runs it gets it
    /// settled with RAP's error. Every call a tool was given is asked about
    /// when a worker starts, whatever its age. The sweep runs every minute.
    #[arg(long, default_value_t = 600, env = "FERRY_RECONCILE_AFTER_SECS")]
    reconcile_after_secs: u64,
    /// Take work before workers with a higher number: a worker gets work
    /// only while every worker with a lower number is full (no room for
    /// more at once, give or take the sixteenth of its room it asks for
    /// in steps) or gone. Give workers that share a machine distinct
    /// numbers, so that they do not split a load one of them can carry;
    /// leave workers on machines of their own without. The first worker
    /// started with it gives the shared consumers a priority group (NATS
    /// 2.12 or later), after which only workers of this Ferry or later can
    /// pull: see --drop-priority-group.
    #[arg(long, env = "FERRY_PRIORITY", conflicts_with = "drop_priority_group",
          value_parser = clap::value_parser!(u8).range(0..=i64::from(ferry_nats::cluster::streams::MAX_PRIORITY)))]
    priority: Option<u8>,
    /// Take the priority group away from the shared consumers at start, so
    /// that workers share the work in turn again and workers of a Ferry
    /// older than --priority can pull (run it before rolling back).
    #[arg(long, env = "FERRY_DROP_PRIORITY_GROUP")]
    drop_priority_group: bool,
    /// Address to serve `/metrics` and `/healthz` on (a worker has no API;
    /// its dispatch metrics live in its process). None when not given.
    #[arg(long, env = "FERRY_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    drain: DrainArgs,
}

/// How long a stopping process goes on with what is under way.
#[derive(Args)]
struct DrainArgs {
    /// On SIGTERM or Ctrl-C, how long to finish what is under way before
    /// stopping anyway. `serve` and `runtime` take no new connections, end
    /// open streams and long-polls at once, and give requests still running
    /// this long. A worker takes no more work and hands back what only
    /// waits (for an attempt slot, or out a retry's backoff); for this long
    /// it finishes dispatch attempts waiting
    /// for their tool's answer, then hands back the rest.
    #[arg(long, default_value_t = 10_000, env = "FERRY_DRAIN_MS")]
    drain_ms: u64,
}

impl DrainArgs {
    fn drain(&self) -> Duration {
        Duration::from_millis(self.drain_ms)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The bench runs Ferry in-process; its per-call info logs would be noise.
    // Nor would an operator command's: its answer is on stdout.
    let default_filter = match cli.command {
        Command::Bench(_) | Command::Operator(_) => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Runtime(args) => runtime(args).await,
        Command::Worker(args) => {
            anyhow::ensure!(
                args.cluster.public_url.is_some(),
                "a worker needs --public-url: the runtime nodes' address, for callback URLs"
            );
            if let Some(listen) = args.metrics_listen {
                serve_metrics(listen).await?;
            }
            ferry_ops::cluster::run_worker(
                WorkerOptions {
                    dispatch: args.dispatch.config()?,
                    reconcile_after: Duration::from_secs(args.reconcile_after_secs),
                    cluster: args.cluster.options(),
                    priority: args.priority,
                    drop_priority_group: args.drop_priority_group,
                    drain: args.drain.drain(),
                },
                shutdown_signal(),
            )
            .await
        }
        Command::Bench(args) => ferry_ops::bench::main(args).await,
        Command::Operator(command) => match operator::run(command).await {
            Ok(()) => Ok(()),
            Err(failure) => {
                eprintln!("ferry: {failure}");
                std::process::exit(failure.exit_code());
            }
        },
        Command::DemoTool { listen } => {
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("binding {listen}"))?;
            println!("demo tool listening on http://{}", listener.local_addr()?);
            DemoTool::serve(listener).await?;
            Ok(())
        }
    }
}

async fn serve(args: Serve) -> anyhow::Result<()> {
    check_body_limit(args.max_body_bytes)?;
    let render = install_metrics()?;
    let options = ServeOptions {
        listen: args.listen,
        data: args.data,
        public_url: args.public_url,
        tool_servers: args.tool_servers,
        demo: args.demo,
        secret: args.secret,
        max_body_bytes: args.max_body_bytes,
        push_max_backoff: Duration::from_millis(args.push_max_backoff_ms),
        dispatch: args.dispatch.config()?,
        oxp: args.fronts.oxp(args.max_body_bytes),
        mcp: args.fronts.mcp(args.max_body_bytes),
        api_tokens: args.fronts.api_tokens()?,
        rate_limits: args.fronts.rate_limits(),
        audit_log: args.fronts.audit_log.clone(),
        drain: args.drain.drain(),
        limits: args.connections.limits(),
        networks: args.outbound.networks(),
    };
    let (running, server) = start(options, Some(render), shutdown_signal()).await?;
    // Lines on stdout for scripts and tests: where the demo tool and Ferry
    // listen, Ferry's last (readers stop at it).
    if let Some(demo) = &running.demo_url {
        println!("demo tool listening on {demo}");
    }
    println!("ferry listening on http://{}", running.addr);
    let served = server.await?;
    running.finish().await;
    served
}

async fn runtime(args: Runtime) -> anyhow::Result<()> {
    check_body_limit(args.max_body_bytes)?;
    let render = install_metrics()?;
    let options = RuntimeOptions {
        cluster: args.cluster.options(),
        listen: args.listen,
        tool_servers: args.tool_servers,
        max_body_bytes: args.max_body_bytes,
        oxp: args.fronts.oxp(args.max_body_bytes),
        mcp: args.fronts.mcp(args.max_body_bytes),
        api_tokens: args.fronts.api_tokens()?,
        rate_limits: args.fronts.rate_limits(),
        audit_log: args.fronts.audit_log.clone(),
        drain: args.drain.drain(),
        limits: args.connections.limits(),
    };
    let (running, server) = start_runtime(options, Some(render), shutdown_signal()).await?;
    // The same announcement as `serve`, for scripts and tests.
    println!("ferry listening on http://{}", running.addr);
    server.await??;
    Ok(())
}

/// The body limit both HTTP roles take: at least 1 KiB.
fn check_body_limit(max_body_bytes: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        max_body_bytes >= 1024,
        "--max-body-bytes must be at least 1024"
    );
    Ok(())
}

/// Serves the process's `/metrics` and `/healthz` on `listen`, in the
/// background.
async fn serve_metrics(listen: SocketAddr) -> anyhow::Result<()> {
    use axum::routing::get;
    let render = install_metrics()?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let metrics = move || {
        let text = render();
        async move {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4",
                )],
                text,
            )
        }
    };
    let healthz = || async { axum::Json(serde_json::json!({"status": "ok"})) };
    let router = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz));
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "the metrics listener failed");
        }
    });
    Ok(())
}

/// Installs the Prometheus recorder; `/metrics` renders it.
fn install_metrics() -> anyhow::Result<ferry_fronts::http::MetricsRender> {
    use ferry_dispatch::metrics::{DISPATCH_LATENCY, DISPATCH_LATENCY_BUCKETS};
    use metrics_exporter_prometheus::Matcher;
    // Buckets make it a Prometheus histogram (the issue asks for one); the
    // exporter's default is a summary, whose quantiles cannot be summed
    // across processes.
    let latency = Matcher::Full(DISPATCH_LATENCY.to_owned());
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(latency, DISPATCH_LATENCY_BUCKETS)
        .context("setting the dispatch latency buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    Ok(std::sync::Arc::new(move || prometheus.render()))
}

/// SIGTERM or SIGINT. The handlers are installed at once, not when the
/// future is first polled: a signal that comes while the process is still
/// starting then stops it cleanly too, instead of killing it.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    }
}
