//! `ferry worker` child processes for cluster tests (runtime nodes are
//! [`crate::Ferry`]s started with [`crate::FerryOptions::runtime`]).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::TEST_SECRET;

/// A running `ferry worker`; killed with SIGKILL when dropped.
pub struct FerryWorker {
    child: Option<Child>,
    nats: String,
    public_url: String,
    /// Arguments after the defaults (a later flag wins).
    extra: Vec<String>,
}

impl FerryWorker {
    /// A worker on `nats` whose callback URLs point at `public_url`.
    pub async fn start(nats: &str, public_url: &str) -> FerryWorker {
        Self::start_with(nats, public_url, &[]).await
    }

    /// [`FerryWorker::start`] with `extra` arguments.
    pub async fn start_with(nats: &str, public_url: &str, extra: &[&str]) -> FerryWorker {
        let mut worker = FerryWorker {
            child: None,
            nats: nats.to_owned(),
            public_url: public_url.to_owned(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        worker.spawn().await;
        worker
    }

    async fn spawn(&mut self) {
        let mut child = Command::new(crate::ferry::binary())
            .args([
                "worker",
                "--nats",
                &self.nats,
                "--public-url",
                &self.public_url,
            ])
            .args(["--secret", TEST_SECRET])
            .args(["--initial-backoff-ms", "20", "--max-backoff-ms", "200"])
            .args(&self.extra)
            .env(
                "RUST_LOG",
                std::env::var("FERRY_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning ferry worker");
        let stdout = child.stdout.take().expect("piped stdout");
        let ready = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let mut ready = false;
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                if line.starts_with("ferry worker ready") {
                    ready = true;
                    break;
                }
                line.clear();
            }
            std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
            ready
        });
        let ready = tokio::time::timeout(Duration::from_secs(60), ready)
            .await
            .expect("the worker did not get ready in time")
            .expect("reader thread");
        assert!(ready, "ferry worker exited before it was ready");
        self.child = Some(child);
    }

    /// SIGKILL: whatever it held goes back to the other workers.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL worker");
            child.wait().expect("reaping worker");
        }
    }

    /// Sends SIGTERM, as a supervisor stopping the worker does; see
    /// [`FerryWorker::exited`].
    pub fn sigterm(&self) {
        crate::ferry::sigterm(self.child.as_ref().expect("the worker runs"));
    }

    /// How the worker exited, once it has; `None` if it still runs after
    /// `within`.
    pub async fn exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        crate::ferry::exit_within(&mut self.child, within).await
    }

    /// Whether the process is still running (it has not exited on its own).
    pub fn is_running(&mut self) -> bool {
        crate::ferry::running(&mut self.child)
    }

    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn().await;
    }
}

impl Drop for FerryWorker {
    fn drop(&mut self) {
        self.kill9();
    }
}
