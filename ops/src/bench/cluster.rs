//! The cluster side of `ferry bench --cluster`: a real `nats-server` (a
//! child process, fsyncing every write as `ops/nats/` configures it) and
//! runtime nodes and workers run in this process, as many as a
//! configuration asks for.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use super::quota::Limited;
use crate::cluster::{run_worker, start_runtime, ClusterOptions, RuntimeOptions, WorkerOptions};

/// The `nats-server` to run: the flag, else `target/nats/bin` (where the
/// test command installs it), else `PATH`.
pub fn nats_binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path.to_owned());
    }
    let local = PathBuf::from("target/nats/bin/nats-server");
    if local.exists() {
        return Ok(local);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("nats-server"))
                .find(|p| p.exists())
        })
        .context("nats-server not found: pass --nats-server or run ops/scripts/install-nats.sh")
}

/// One `nats-server -js` in a temporary directory; killed on drop.
struct Nats {
    child: Child,
    url: String,
    /// Its monitoring endpoint's `/varz`, which counts the messages clients
    /// sent it.
    varz: String,
    _dir: tempfile::TempDir,
}

impl Nats {
    async fn start(binary: &Path, sync_interval: &str) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ferry-bench-nats-")
            .tempdir()?;
        let free_port = || -> std::io::Result<u16> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port())
        };
        let (port, monitor) = (free_port()?, free_port()?);
        let config = dir.path().join("nats.conf");
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\njetstream {{\n  store_dir: {:?}\n  sync_interval: {sync_interval}\n}}\n",
                dir.path().join("js")
            ),
        )?;
        let mut child = Command::new(binary)
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let listening = |port| async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        };
        for _ in 0..200 {
            // Both ports: the first window reads `/varz`.
            if listening(port).await && listening(monitor).await {
                return Ok(Self {
                    child,
                    url: format!("nats://127.0.0.1:{port}"),
                    varz: format!("http://127.0.0.1:{monitor}/varz"),
                    _dir: dir,
                });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        bail!("nats-server did not listen on {port} and {monitor}")
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running cluster: the runtime nodes' base URLs. Dropping it stops the
/// nodes, the workers and NATS.
pub struct Deployment {
    pub bases: Vec<String>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// With `--cpu-quota`, the nodes and workers as processes of their own.
    children: Vec<Limited>,
    nats: Nats,
}

impl Deployment {
    /// The processes doing Ferry's work beside this one, for their CPU:
    /// `nats-server`, and the nodes and workers when they run apart.
    pub fn pids(&self) -> Vec<u32> {
        std::iter::once(self.nats.child.id())
            .chain(self.children.iter().map(Limited::pid))
            .collect()
    }

    /// The URL of its `nats-server`'s `/varz`.
    pub fn nats_varz(&self) -> String {
        self.nats.varz.clone()
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What to deploy.
pub struct Shape<'a> {
    pub runtimes: usize,
    pub workers: usize,
    pub partitions: usize,
    /// Each node and worker a process of its own, limited to this share of
    /// a core; in this process when `None`.
    pub cpu_quota: Option<f64>,
    /// The tool server the first node registers.
    pub tool: &'a str,
}

/// Starts NATS, the shape's nodes (the first registers the tool) and
/// workers, whose callbacks go to the first node.
pub async fn deploy(
    binary: &Path,
    sync_interval: &str,
    shape: Shape<'_>,
) -> anyhow::Result<Deployment> {
    let nats = Nats::start(binary, sync_interval).await?;
    if let Some(quota) = shape.cpu_quota {
        return deploy_apart(nats, &shape, quota).await;
    }
    let Shape {
        runtimes,
        workers,
        partitions,
        tool,
        ..
    } = shape;
    let secret = uuid::Uuid::new_v4().simple().to_string();
    let cluster = |public_url: Option<String>| ClusterOptions {
        nats: nats.url.clone(),
        secret: secret.clone(),
        public_url,
        replicas: 1,
        partitions,
        networks: Default::default(),
    };
    let (mut bases, mut tasks) = (vec![], vec![]);
    for i in 0..runtimes {
        let options = RuntimeOptions {
            cluster: cluster(None),
            listen: "127.0.0.1:0".parse()?,
            tool_servers: if i == 0 {
                vec![tool.to_owned()]
            } else {
                vec![]
            },
            max_body_bytes: 1 << 20,
            oxp: Default::default(),
            mcp: Default::default(),
            api_tokens: Default::default(),
            rate_limits: Default::default(),
            audit_log: None,
            drain: crate::serve::DRAIN,
            limits: Default::default(),
        };
        let (running, server) = start_runtime(options, None, std::future::pending()).await?;
        bases.push(format!("http://{}", running.addr));
        tasks.push(server);
    }
    for i in 0..workers {
        let options = WorkerOptions {
            cluster: cluster(Some(bases[0].clone())),
            dispatch: ferry_dispatch::DispatchConfig::default(),
            reconcile_after: Duration::from_secs(600),
            // They share two cores: each takes work only when the ones
            // before it are full, as `--priority` advises.
            priority: (workers > 1).then(|| {
                u8::try_from(i)
                    .unwrap_or(u8::MAX)
                    .min(ferry_nats::cluster::streams::MAX_PRIORITY)
            }),
            drop_priority_group: false,
            drain: crate::serve::DRAIN,
        };
        tasks.push(tokio::spawn(run_worker(options, std::future::pending())));
    }
    Ok(Deployment {
        bases,
        tasks,
        children: vec![],
        nats,
    })
}

/// [`deploy`] with each node and worker a `ferry` process of its own, in
/// a cgroup limited to `quota` of a core.
async fn deploy_apart(nats: Nats, shape: &Shape<'_>, quota: f64) -> anyhow::Result<Deployment> {
    let secret = uuid::Uuid::new_v4().simple().to_string();
    let run = &secret[..8];
    let common = |role: &str| -> Vec<String> {
        [
            role,
            "--nats",
            &nats.url,
            "--secret",
            &secret,
            "--partitions",
            &shape.partitions.to_string(),
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let (mut bases, mut children) = (vec![], vec![]);
    for i in 0..shape.runtimes {
        let mut args = common("runtime");
        args.extend(["--listen".into(), "127.0.0.1:0".into()]);
        if i == 0 {
            args.extend(["--tool-server".into(), shape.tool.to_owned()]);
        }
        let name = format!("ferry-bench-{run}-node-{i}");
        let (node, said) = tokio::task::spawn_blocking(move || {
            Limited::start(&name, quota, &args, "ferry listening on ")
        })
        .await??;
        let base = said
            .strip_prefix("ferry listening on ")
            .context("the node's address")?
            .to_owned();
        bases.push(base);
        children.push(node);
    }
    for i in 0..shape.workers {
        let mut args = common("worker");
        args.extend(["--public-url".into(), bases[0].clone()]);
        let name = format!("ferry-bench-{run}-worker-{i}");
        let (worker, _) = tokio::task::spawn_blocking(move || {
            Limited::start(&name, quota, &args, "ferry worker ready")
        })
        .await??;
        children.push(worker);
    }
    Ok(Deployment {
        bases,
        tasks: vec![],
        children,
        nats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::counters::nats_in_msgs;

    /// The bench's count of NATS messages per call rests on `/varz`
    /// counting what clients publish: a real server, three publishes. The
    /// server adds a read's messages to its count after it answered the
    /// flush's PING, so the count is awaited, not read once.
    #[tokio::test]
    async fn varz_counts_the_messages_clients_send() {
        // Tests run in `ops/`, not where the test command installs it.
        let installed =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/nats/bin/nats-server");
        let given = std::env::var_os("NATS_SERVER")
            .map(PathBuf::from)
            .or_else(|| installed.exists().then_some(installed));
        let binary =
            nats_binary(given.as_deref()).expect("nats-server (ops/scripts/install-nats.sh)");
        let nats = Nats::start(&binary, "always")
            .await
            .expect("nats-server starts");
        let before = nats_in_msgs(Some(&nats.varz)).await.expect("varz answers");
        let client = async_nats::connect(&nats.url).await.expect("connects");
        for n in 0..3 {
            client
                .publish("bench.test", n.to_string().into())
                .await
                .expect("published");
        }
        client.flush().await.expect("flushed");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let after = nats_in_msgs(Some(&nats.varz)).await.expect("varz answers");
            if after >= before + 3 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "before {before}, after {after}: the publishes were not counted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(nats_in_msgs(None).await, None);
    }
}
