//! A `ferry serve` child process with its own data dir.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::{Api, TEST_SECRET};

/// Runs `ferry` with `args` until it exits (a start it refuses): its exit
/// status, and what it wrote to stderr.
pub fn refused(args: &[&str]) -> (std::process::ExitStatus, String) {
    let out = Command::new(binary())
        .args(args)
        .output()
        .expect("running ferry");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `ferry serve` on a fresh data dir with `args` besides, until it
/// exits (a start it refuses): its exit status and stderr.
pub fn refused_serve(args: &[&str]) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().expect("a temporary dir");
    let data = dir.path().join("data");
    let mut all = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data",
        data.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    refused(&all)
}

/// Builds the `ferry` binary once per test process (a no-op when it is up
/// to date) and returns its path, next to the test executable's `deps/`.
pub fn binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        // The same selection as `ops/scripts/test.sh` builds: features are
        // unified over it, so this is a no-op when the binary is current
        // (building `-p ferry-ops` alone would resolve other features and
        // relink the binary every time).
        build.args(["build", "-q", "--workspace", "--bins", "--tests"]);
        // `cargo test` gives the test process its package's variables; a
        // build script that watches one (ring watches CARGO_MANIFEST_DIR)
        // would rerun, and everything above it rebuild.
        for (name, _) in std::env::vars() {
            let per_package = [
                "CARGO_MANIFEST_",
                "CARGO_PKG_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
                "CARGO_PRIMARY_",
                "CARGO_TARGET_TMPDIR",
            ];
            if per_package.iter().any(|p| name.starts_with(p)) {
                build.env_remove(name);
            }
        }
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("running cargo build");
        assert!(status.success(), "building the ferry binary failed");
        let bin = profile_dir.join("ferry");
        assert!(bin.exists(), "{} missing after build", bin.display());
        bin
    })
}

#[derive(Clone, Debug)]
pub struct FerryOptions {
    /// `serve` (one process) or `runtime` (a cluster node).
    pub command: &'static str,
    /// Extra arguments to the command.
    pub args: Vec<String>,
    pub demo: bool,
    pub tool_servers: Vec<String>,
    /// Where the process's log (stderr, at `info`) goes, when a test reads
    /// it; otherwise it is inherited at `warn` (or `FERRY_TEST_LOG`).
    pub log: Option<PathBuf>,
    /// The process's open-file limit (`ulimit -n`), when a test sets one.
    pub open_files: Option<u64>,
    /// `serve`'s `--data`, when a test chooses it (one not there yet, or
    /// one with a mode of its own); otherwise the harness's temp dir, which
    /// exists before Ferry starts.
    pub data: Option<PathBuf>,
}

impl Default for FerryOptions {
    fn default() -> Self {
        Self {
            // Short backoff so retry tests finish quickly.
            args: vec![
                "--initial-backoff-ms".into(),
                "20".into(),
                "--max-backoff-ms".into(),
                "200".into(),
            ],
            demo: false,
            tool_servers: vec![],
            log: None,
            open_files: None,
            data: None,
            command: "serve",
        }
    }
}

impl FerryOptions {
    /// `ferry serve --demo` with `args` besides the harness's own.
    pub fn demo_with(args: &[&str]) -> Self {
        let mut options = Self {
            demo: true,
            ..Self::default()
        };
        options.args.extend(args.iter().map(|a| a.to_string()));
        options
    }

    /// These options, with `--api-token token` added (repeatable).
    pub fn api_token(mut self, token: &str) -> Self {
        self.args.extend(["--api-token".into(), token.into()]);
        self
    }

    /// These options, with `args` added.
    pub fn with_args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// A cluster runtime node on `nats`.
    pub fn runtime(nats: &str) -> Self {
        Self {
            command: "runtime",
            args: vec!["--nats".into(), nats.into()],
            ..Self::default()
        }
    }
}

/// A running `ferry serve`; killed with SIGKILL when dropped.
pub struct Ferry {
    child: Option<Child>,
    pub data: tempfile::TempDir,
    pub port: u16,
    pub url: String,
    pub demo_url: Option<String>,
    options: FerryOptions,
}

impl Ferry {
    pub async fn start(options: FerryOptions) -> Ferry {
        // Owner-only, as `ferry serve` asks of its data dir: it warns at
        // every start about one others may enter.
        let data = tempfile::Builder::new()
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .expect("temp data dir");
        let mut ferry = Ferry {
            child: None,
            data,
            port: 0,
            url: String::new(),
            demo_url: None,
            options,
        };
        ferry.spawn().await;
        ferry
    }

    /// Starts `ferry serve` with `tool`'s server registered at start.
    pub async fn with_tool(tool: &crate::TestTool) -> Ferry {
        Ferry::start(FerryOptions {
            tool_servers: vec![tool.url.clone()],
            ..FerryOptions::default()
        })
        .await
    }

    /// Starts `ferry serve --demo` with default options.
    pub async fn with_demo() -> Ferry {
        Ferry::start(FerryOptions {
            demo: true,
            ..FerryOptions::default()
        })
        .await
    }

    async fn spawn(&mut self) {
        let mut cmd = match self.options.open_files {
            // The shell lowers its limit, then becomes ferry (same pid).
            Some(n) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(binary());
                sh
            }
            None => Command::new(binary()),
        };
        cmd.arg(self.options.command)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--secret")
            .arg(TEST_SECRET)
            .args(&self.options.args)
            .env(
                "RUST_LOG",
                std::env::var("FERRY_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(path) = &self.options.log {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .expect("opening the log file");
            cmd.env("RUST_LOG", "info").stderr(log);
        }
        if self.options.command == "serve" {
            // A runtime node keeps nothing locally.
            let data = self.options.data.as_deref().unwrap_or(self.data.path());
            cmd.arg("--data").arg(data);
        }
        if self.options.demo {
            cmd.arg("--demo");
        }
        for server in &self.options.tool_servers {
            cmd.arg("--tool-server").arg(server);
        }
        let mut child = cmd.spawn().expect("spawning ferry");
        let stdout = child.stdout.take().expect("piped stdout");
        // Read the announcement lines on a blocking thread.
        let lines = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut out = vec![];
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                out.push(line.trim().to_owned());
                line.clear();
                if out
                    .last()
                    .is_some_and(|l| l.starts_with("ferry listening on "))
                {
                    break;
                }
            }
            // Keep draining so the child never blocks on a full pipe.
            std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
            out
        });
        let lines = tokio::time::timeout(Duration::from_secs(60), lines)
            .await
            .expect("ferry did not announce its address in time")
            .expect("reader thread");
        let url = lines
            .iter()
            .find_map(|l| l.strip_prefix("ferry listening on "))
            .unwrap_or_else(|| panic!("ferry exited before listening: {lines:?}"))
            .to_owned();
        self.demo_url = lines
            .iter()
            .find_map(|l| l.strip_prefix("demo tool listening on "))
            .map(str::to_owned);
        self.port = url.rsplit(':').next().unwrap().parse().unwrap();
        self.url = url;
        self.child = Some(child);
    }

    pub fn api(&self) -> Api {
        Api::new(&self.url)
    }

    /// Whether the process is still running (it has not exited on its own).
    pub fn is_running(&mut self) -> bool {
        running(&mut self.child)
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL ferry");
            child.wait().expect("reaping ferry");
        }
    }

    /// SIGTERM, as an operator or a supervisor stops Ferry; returns how the
    /// process exited, or `None` if it still runs after `within` (it is
    /// then killed with the rest at drop).
    pub async fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        self.sigterm();
        self.exited(within).await
    }

    /// Sends SIGTERM and returns at once; see [`Ferry::exited`].
    pub fn sigterm(&self) {
        sigterm(self.child.as_ref().expect("ferry is running"));
    }

    /// How the process exited, once it has; `None` if it still runs after
    /// `within` (it is then killed with the rest at drop).
    pub async fn exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        exit_within(&mut self.child, within).await
    }

    /// Sets `flag`'s value for the next (re)start, in place of one given
    /// before.
    pub fn set_option(&mut self, flag: &str, value: &str) {
        let args = &mut self.options.args;
        match args.iter().position(|a| a == flag) {
            Some(i) => args[i + 1] = value.to_owned(),
            None => args.extend([flag.to_owned(), value.to_owned()]),
        }
    }

    /// Starts again on the same port and data dir (callback URLs already
    /// handed to tools stay valid).
    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn().await;
    }
}

impl Drop for Ferry {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Whether `child` is still running (it has not exited on its own).
pub(crate) fn running(child: &mut Option<Child>) -> bool {
    child
        .as_mut()
        .is_some_and(|c| c.try_wait().ok().flatten().is_none())
}

/// Sends SIGTERM to `child`, as an operator or a supervisor stops it.
pub fn sigterm(child: &Child) {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(sent.success(), "kill -TERM failed");
}

/// How `child` exited, once it has, taking it; `None` if it still runs
/// after `within`.
pub async fn exit_within(
    child: &mut Option<Child>,
    within: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = tokio::time::Instant::now() + within;
    // An exit is not an event this process can await: poll for it.
    while tokio::time::Instant::now() < deadline {
        let running = child.as_mut()?;
        if let Some(status) = running.try_wait().expect("polling the process") {
            *child = None;
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// `ferry ARGS` as an operator command against the Ferry at `url`, with
/// none of this environment's `FERRY_*` settings; stdout and stderr piped.
pub fn cli(url: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(binary());
    command
        .args(args)
        .env("FERRY_URL", url)
        .env_remove("FERRY_API_TOKEN")
        .env_remove("FERRY_REVIEWER")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}
