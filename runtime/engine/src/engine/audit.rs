//! The audit log's other entries (a thread's come with its writes, in
//! `Engine::run`), and reading it.

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry_proto::audit::{AuditEntry, AuditKind, AuditQuery, AuditRecord};

use super::{now, Engine, Error};
use crate::audit;
use crate::identity::{Identity, Scope};

/// Refused requests recorded per [`REFUSALS_WINDOW`] at most: anyone can
/// send them, and each would be a write. The rest are counted, and the
/// count is recorded with the next one let through.
pub const REFUSALS_PER_WINDOW: u32 = 20;
pub const REFUSALS_WINDOW: Duration = Duration::from_secs(10);

/// How many refusals this window has recorded, and left out.
#[derive(Debug)]
pub(crate) struct Refusals {
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    recorded: u32,
    left_out: u64,
}

impl Default for Refusals {
    fn default() -> Self {
        Self {
            window: Mutex::new(Window {
                started: Instant::now(),
                recorded: 0,
                left_out: 0,
            }),
        }
    }
}

impl Refusals {
    /// Whether one more may be recorded now, with how many were left out
    /// since the last one recorded.
    fn admit(&self, at: Instant) -> Option<u64> {
        let mut window = self.window.lock().expect("refusals lock");
        if at.duration_since(window.started) >= REFUSALS_WINDOW {
            window.started = at;
            window.recorded = 0;
        }
        if window.recorded >= REFUSALS_PER_WINDOW {
            window.left_out += 1;
            return None;
        }
        window.recorded += 1;
        Some(std::mem::take(&mut window.left_out))
    }
}

/// Where the audit log's entries are also written as JSON lines, for a
/// log shipper: each entry this process records, once it is durable. A
/// retried action may be written twice here (its `key` tells); the log
/// itself holds it once.
pub struct AuditLines {
    out: Mutex<Box<dyn Write + Send>>,
    failed: std::sync::atomic::AtomicBool,
}

impl AuditLines {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out: Mutex::new(out),
            failed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn write(&self, entries: &[AuditEntry]) {
        let mut out = self.out.lock().expect("audit lines lock");
        let written = entries.iter().try_for_each(|entry| {
            let line = serde_json::to_string(entry).map_err(std::io::Error::other)?;
            writeln!(out, "{line}")
        });
        if let Err(e) = written.and_then(|()| out.flush()) {
            // Said once: the log itself has the entries, and a full disk
            // would otherwise add a line to the other log per entry.
            if !self.failed.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::error!(error = %e, "could not write audit lines (--audit-log)");
            }
        }
    }
}

impl Engine {
    /// Writes entries this process recorded to `--audit-log`, if set.
    pub(crate) fn ship_audit(&self, entries: &[AuditEntry]) {
        if let (Some(lines), false) = (&self.audit_lines, entries.is_empty()) {
            lines.write(entries);
        }
    }

    /// Records entries outside a thread's write (or a repeat's, which
    /// writes nothing else), durably.
    pub(crate) async fn store_audit(&self, entries: &[AuditEntry]) -> Result<(), Error> {
        self.store.record_audit(entries).await?;
        self.ship_audit(entries);
        Ok(())
    }

    /// Records a change outside any thread (a toolset, a token) made by
    /// `by`, durably, before the change is answered.
    pub(crate) async fn audit_change(
        &self,
        by: &Identity,
        kind: AuditKind,
        subject: String,
        detail: Option<String>,
    ) -> Result<(), Error> {
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let entry = audit::entry(kind, now(), by.name(), Some(subject), detail, &[&unique]);
        self.store_audit(&[entry]).await
    }

    /// Records a request refused for its credential (`who`: the identity,
    /// or what was presented), at a bounded rate, in the background: the
    /// refusal is answered at once and changes nothing else.
    pub fn audit_refusal(self: &std::sync::Arc<Self>, who: &str, what: String) {
        let Some(left_out) = self.refusals.admit(Instant::now()) else {
            return;
        };
        let detail = match left_out {
            0 => what,
            n => format!("{what} ({n} more refused before this and not recorded)"),
        };
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let entry = audit::entry(
            AuditKind::AuthRefused,
            now(),
            who,
            None,
            Some(detail),
            &[&unique],
        );
        let engine = self.clone();
        tokio::spawn(async move {
            if let Err(e) = engine.store_audit(&[entry]).await {
                tracing::warn!(error = %e, "could not record a refused request in the audit log");
            }
        });
    }

    /// The audit log's entries `query` wants: `admin` only.
    pub async fn audit_log(
        &self,
        by: &Identity,
        query: &AuditQuery,
    ) -> Result<Vec<AuditRecord>, Error> {
        super::tokens::require(by, Scope::Admin)?;
        Ok(self.store.audit(query).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_past_the_window_s_allowance_are_counted_and_told_with_the_next() {
        let refusals = Refusals::default();
        let start = Instant::now();
        for _ in 0..REFUSALS_PER_WINDOW {
            assert_eq!(refusals.admit(start), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(refusals.admit(start), None);
        }
        let later = start + REFUSALS_WINDOW;
        assert_eq!(refusals.admit(later), Some(5));
        assert_eq!(refusals.admit(later), Some(0));
    }
}
