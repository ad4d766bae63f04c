//! `ferry bench --cpu-quota Q`: each runtime node and each worker of a
//! cluster shape runs as a `ferry` process of its own, in a cgroup of its
//! own limited to `Q` of one core. Two cores cannot show capacity growing
//! with nodes while every process competes for them; with a cap small
//! enough that Ferry's processes, not NATS or the load generator, are the
//! bottleneck, each process stands for a host of its own (the network
//! between hosts is not modelled).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context};

/// The period the quota is a share of, in microseconds (the kernel's
/// default).
const PERIOD_US: u64 = 100_000;

/// Where a process's CPU limit is set.
#[derive(Debug, Clone, Copy)]
enum Hierarchy {
    /// cgroup v1: the `cpu` controller's own tree.
    V1,
    /// cgroup v2: the unified tree, `cpu.max`.
    V2,
}

/// A cgroup made for one process; removed on drop (once the process is
/// gone).
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// A cgroup named `name` limited to `quota` of one core.
    pub fn limited(name: &str, quota: f64) -> anyhow::Result<Self> {
        let quota_us = (quota * PERIOD_US as f64).round() as u64;
        anyhow::ensure!(
            quota_us >= 1000,
            "--cpu-quota {quota} is below what the kernel takes (1 ms in 100 ms: 0.01)"
        );
        let (hierarchy, root) = hierarchy()?;
        let path = root.join(name);
        std::fs::create_dir_all(&path)
            .with_context(|| format!("making the cgroup {}", path.display()))?;
        let cgroup = Cgroup { path };
        match hierarchy {
            Hierarchy::V1 => {
                cgroup.write("cpu.cfs_period_us", &PERIOD_US.to_string())?;
                cgroup.write("cpu.cfs_quota_us", &quota_us.to_string())?;
            }
            Hierarchy::V2 => cgroup.write("cpu.max", &format!("{quota_us} {PERIOD_US}"))?,
        }
        Ok(cgroup)
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    pub fn add(&self, pid: u32) -> anyhow::Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    fn write(&self, file: &str, value: &str) -> anyhow::Result<()> {
        let path = self.path.join(file);
        std::fs::write(&path, value)
            .with_context(|| format!("writing {value} to {}", path.display()))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// The writable cgroup tree for CPU limits: v1's `cpu` controller, else
/// v2's unified tree with the `cpu` controller enabled for children.
fn hierarchy() -> anyhow::Result<(Hierarchy, PathBuf)> {
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    if v1.join("cpu.cfs_quota_us").exists() && writable(v1) {
        return Ok((Hierarchy::V1, v1.to_owned()));
    }
    let v2 = Path::new("/sys/fs/cgroup");
    let controllers =
        std::fs::read_to_string(v2.join("cgroup.subtree_control")).unwrap_or_default();
    if controllers.split_whitespace().any(|c| c == "cpu") && writable(v2) {
        return Ok((Hierarchy::V2, v2.to_owned()));
    }
    bail!(
        "--cpu-quota needs a writable cgroup tree with the cpu controller: neither cgroup v1 \
         (/sys/fs/cgroup/cpu/cpu.cfs_quota_us) nor v2 (/sys/fs/cgroup with \"cpu\" in \
         cgroup.subtree_control) can be written here (run as root, or without --cpu-quota)"
    )
}

/// Whether a cgroup can be made under `dir`.
fn writable(dir: &Path) -> bool {
    let probe = dir.join(format!("ferry-bench-probe-{}", std::process::id()));
    let made = std::fs::create_dir(&probe).is_ok();
    let _ = std::fs::remove_dir(&probe);
    made
}

/// A `ferry` child process in a cgroup of its own; killed on drop.
pub struct Limited {
    child: Child,
    /// Dropped after the child is gone.
    _cgroup: Cgroup,
}

impl Limited {
    /// Starts `ferry args…` (this very binary), puts it in a cgroup limited
    /// to `quota`, and waits for the line starting with `ready` on its
    /// stdout; returns it and that line.
    pub fn start(
        name: &str,
        quota: f64,
        args: &[String],
        ready: &str,
    ) -> anyhow::Result<(Self, String)> {
        let cgroup = Cgroup::limited(name, quota)?;
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting a ferry process")?;
        let stdout = child.stdout.take().context("its stdout")?;
        // From here on a failure kills the child (drop).
        let limited = Limited {
            child,
            _cgroup: cgroup,
        };
        limited._cgroup.add(limited.child.id())?;
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            if lines.read_line(&mut line)? == 0 {
                bail!("{name} exited before it was ready");
            }
            if line.starts_with(ready) {
                break;
            }
        }
        // Keep reading, so the child never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
        Ok((limited, line.trim().to_owned()))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_below_what_the_kernel_takes_is_refused() {
        let refused = Cgroup::limited("ferry-bench-test-tiny", 0.001)
            .err()
            .unwrap();
        assert!(refused.to_string().contains("0.01"), "{refused}");
    }
}
