//! Warnings at a bounded rate. What a stranger can cause at will (a forged
//! callback, a cross-site request) is worth a log line, but a flood of them
//! must not flood the log: a few lines per interval are written, and the
//! first line of a later interval says how many were left out meanwhile.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most `burst` lines per `interval`, for one kind of warning (a
/// `static` each: `LogRate::new` is `const`).
pub struct LogRate {
    interval: Duration,
    burst: u32,
    window: Mutex<Window>,
}

struct Window {
    started: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl LogRate {
    pub const fn new(interval: Duration, burst: u32) -> Self {
        Self {
            interval,
            burst,
            window: Mutex::new(Window {
                started: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether to write the line now: `Some(n)` with the lines left out
    /// since the last one written (to log beside it), or `None` to leave it
    /// out.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        // A poisoned lock only means a panic elsewhere mid-update of three
        // counters: they are still usable.
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let expired = window
            .started
            .is_none_or(|started| now.saturating_duration_since(started) >= self.interval);
        if expired {
            window.started = Some(now);
            window.logged = 0;
        }
        if window.logged >= self.burst {
            window.suppressed += 1;
            return None;
        }
        window.logged += 1;
        Some(std::mem::take(&mut window.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_lines_an_interval_then_the_count_of_those_left_out() {
        let rate = LogRate::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        let first: Vec<_> = (0..5).map(|_| rate.admit_at(t0)).collect();
        assert_eq!(first, [Some(0), Some(0), None, None, None]);
        // Still the same interval.
        assert_eq!(rate.admit_at(t0 + Duration::from_secs(9)), None);
        let later = t0 + Duration::from_secs(10);
        assert_eq!(rate.admit_at(later), Some(4));
        assert_eq!(rate.admit_at(later), Some(0));
        assert_eq!(rate.admit_at(later), None);
        // A quiet interval reports nothing left out but what was.
        assert_eq!(rate.admit_at(later + Duration::from_secs(60)), Some(1));
    }
}
