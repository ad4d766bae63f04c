//! `--audit-log PATH`: where audit entries are also written as JSON lines
//! (`-`: standard output), for a log shipper.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context;

/// Opens `path` for appending (created owner-only: entries name users,
/// threads and tools), or standard output for `-`.
pub fn open(path: &Path) -> anyhow::Result<Box<dyn Write + Send>> {
    if path == Path::new("-") {
        return Ok(Box::new(std::io::stdout()));
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("--audit-log: cannot open {} for appending", path.display()))?;
    Ok(Box::new(std::io::LineWriter::new(file)))
}
