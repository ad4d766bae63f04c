//! `ferry serve`'s data directory: owner-only, since it holds the callback
//! secret, the toolsets (with the credentials in their URLs), and every
//! call's arguments and results.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use anyhow::Context;
use tracing::warn;

/// Makes what this process creates from now on owner-only, and `dir` a
/// directory only its owner may enter: created with mode 0700 when it is
/// not there; warned about, but left as it is, when it exists and others
/// may read or enter it (its owner chose that, or must be told).
pub fn prepare(dir: &Path) -> anyhow::Result<()> {
    // The umask, not a chmod after opening: sled creates its files itself,
    // at open and later (snapshots, blobs), and a chmod would miss those
    // that come after it. The umask is the process's, and covers them all
    // (and anything else written here); `ferry serve` writes nothing that
    // others should read.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    match std::fs::metadata(dir) {
        Ok(meta) => {
            anyhow::ensure!(
                meta.is_dir(),
                "data dir {} is not a directory",
                dir.display()
            );
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                warn!(
                    path = %dir.display(),
                    mode = %format!("{mode:04o}"),
                    "the data dir is open to other users, and holds tool credentials, arguments \
                     and results: make it owner-only (chmod 700)"
                );
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating data dir {}", dir.display())),
        Err(e) => Err(e).with_context(|| format!("reading data dir {}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_data_dir_and_its_parents_are_owner_only() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        prepare(&dir).unwrap();
        std::fs::write(dir.join("file"), "x").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root.path().join("a")), 0o700);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("file")), 0o600);
    }
}
