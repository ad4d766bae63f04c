//! Real `nats-server` processes with JetStream on loopback: one server, or
//! a three-node cluster. Each has its own store directory, survives a
//! restart on the same port and store, and is stopped by process id.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `nats-server` binary: `$NATS_SERVER`, else the one
/// `ops/scripts/install-nats.sh` puts under `target/nats/bin`, else `PATH`.
pub fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("NATS_SERVER") {
        return path.into();
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let local = workspace.join("target/nats/bin/nats-server");
    if local.exists() {
        return local;
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("nats-server"))
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!("nats-server not found: run `bash ops/scripts/install-nats.sh` (the README's test command does)")
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One `nats-server -js`.
pub struct Nats {
    child: Option<Child>,
    config: PathBuf,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Nats {
    /// A single server with JetStream, fsyncing every write
    /// (`sync_interval: always`, as `ops/nats/` configures production).
    pub async fn start() -> Nats {
        Self::start_with("").await
    }

    /// [`Nats::start`] with `jetstream` added to its `jetstream` block
    /// (server-wide limits, say).
    pub async fn start_with(jetstream: &str) -> Nats {
        let dir = tempfile::tempdir().expect("nats dir");
        let port = free_port();
        let config = dir.path().join("nats.conf");
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:{port}\nserver_name: single\njetstream {{\n  store_dir: {:?}\n  sync_interval: always\n  {jetstream}\n}}\n",
                dir.path().join("js")
            ),
        )
        .expect("writing nats.conf");
        let mut nats = Nats {
            child: None,
            config,
            port,
            dir,
        };
        nats.spawn().await;
        nats
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("nats.log")).expect("log file");
        let child = Command::new(binary())
            .arg("-c")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning nats-server");
        self.child = Some(child);
        wait_ready(self.port, &self.dir.path().join("nats.log")).await;
    }

    /// SIGKILL, by process id.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("killing nats-server");
            child.wait().expect("reaping nats-server");
        }
    }

    /// Starts again on the same port and store.
    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn().await;
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Waits until the server accepts connections and says JetStream is ready.
async fn wait_ready(port: u16, log: &Path) {
    crate::eventually(
        "nats-server to be ready",
        Duration::from_secs(30),
        || async {
            let listening = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok();
            let ready = std::fs::read_to_string(log)
                .map(|l| l.contains("Server is ready"))
                .unwrap_or(false);
            (listening && ready).then_some(())
        },
    )
    .await;
}

/// Three `nats-server`s clustered on loopback, JetStream on each.
pub struct NatsCluster {
    pub nodes: Vec<Nats>,
}

impl NatsCluster {
    pub async fn start() -> NatsCluster {
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, cluster)| format!("nats-route://127.0.0.1:{cluster}"))
            .collect();
        let mut nodes = vec![];
        for (i, (port, cluster)) in ports.iter().enumerate() {
            let dir = tempfile::tempdir().expect("nats dir");
            let config = dir.path().join("nats.conf");
            std::fs::write(
                &config,
                format!(
                    "listen: 127.0.0.1:{port}\nserver_name: n{i}\njetstream {{\n  store_dir: {:?}\n  sync_interval: always\n}}\ncluster {{\n  name: ferry\n  listen: 127.0.0.1:{cluster}\n  routes: [{}]\n}}\n",
                    dir.path().join("js"),
                    routes.join(", ")
                ),
            )
            .expect("writing nats.conf");
            let log = std::fs::File::create(dir.path().join("nats.log")).expect("log file");
            let child = Command::new(binary())
                .arg("-c")
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawning nats-server");
            nodes.push(Nats {
                child: Some(child),
                config,
                port: *port,
                dir,
            });
        }
        for node in &nodes {
            wait_ready(node.port, &node.dir.path().join("nats.log")).await;
        }
        NatsCluster { nodes }
    }

    /// Every node's URL, for clients that fail over.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(Nats::url)
            .collect::<Vec<_>>()
            .join(",")
    }
}
