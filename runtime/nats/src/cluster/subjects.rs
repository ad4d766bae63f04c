//! NATS subject layout. A `group_id` (or call id) is arbitrary text, but a
//! subject is `.`-separated tokens where `*` and `>` are wildcards, so each
//! id becomes one token: its UTF-8 bytes in unpadded base64url, whose
//! alphabet (`A-Z a-z 0-9 - _`) holds none of `.`, `*`, `>`, `$` or white
//! space. Distinct ids give distinct tokens, and nothing can widen a
//! subscription or reach `$JS.API`.
//!
//! Threads are spread over `--partitions K` streams by a stable hash of
//! their `group_id` ([`Layout::partition`]); thread `g` lives in partition
//! `p` of them:
//!
//! | subject | stream | what |
//! |---|---|---|
//! | `ferry.<p>.log.<g>.d` | `FERRY_THREADS_<p>` | a commit of the thread's log that hands calls to dispatch: what workers consume |
//! | `ferry.<p>.log.<g>.c` | `FERRY_THREADS_<p>` | any other commit of the thread's log |
//! | `ferry.<p>.call.<g>.<id>` | `FERRY_THREADS_<p>` | the latest record of each call |
//! | `ferry.<p>.ready.<g>.<id>` | `FERRY_THREADS_<p>` | a call of a limited toolset given room after it waited: workers consume it too |
//! | `ferry.<p>.logged.<g>.<d\|c>` | (republished by `FERRY_THREADS_<p>`) | the headers of each commit the stream *stored*, for runtime nodes to wake readers |
//!
//! A thread's log is both commit subjects together, `ferry.<p>.log.<g>.*`:
//! appends compare-and-set on that filter's last sequence, and reads take
//! it whole.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

const LOG: &str = "log";
const CALL: &str = "call";
/// A call handed out of its lane's wait ([`ferry_engine::shared_lanes`]).
const READY: &str = "ready";
/// Where a stream republishes (headers only) each commit it stored. Not
/// the log itself: a publish that loses its compare-and-set still reaches
/// core subscribers of its subject.
const LOGGED: &str = "logged";
/// The last token of a commit that hands calls to dispatch.
const DISPATCHES: &str = "d";
/// The last token of any other commit.
const COMMITS: &str = "c";

/// The most partitions a cluster may have.
pub const MAX_PARTITIONS: usize = 64;

/// One subject token standing for `id`.
pub fn token(id: &str) -> String {
    URL_SAFE_NO_PAD.encode(id.as_bytes())
}

fn untoken(token: &str) -> Option<String> {
    String::from_utf8(URL_SAFE_NO_PAD.decode(token).ok()?).ok()
}

/// Where each thread's subjects are, for a cluster of `partitions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    partitions: usize,
}

impl Layout {
    pub fn new(partitions: usize) -> Self {
        Self {
            partitions: partitions.clamp(1, MAX_PARTITIONS),
        }
    }

    pub fn partitions(&self) -> usize {
        self.partitions
    }

    /// The thread's partition: FNV-1a of its `group_id`'s bytes, modulo
    /// the count. Stable across builds and machines, which a std hasher
    /// is not promised to be.
    pub fn partition(&self, group_id: &str) -> usize {
        let hash = group_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        (hash % self.partitions as u64) as usize
    }

    /// The stream of partition `p`.
    pub fn stream(&self, p: usize) -> String {
        format!("FERRY_THREADS_{p}")
    }

    /// What stream `p` holds.
    pub fn stream_subjects(&self, p: usize) -> Vec<String> {
        vec![
            format!("ferry.{p}.{LOG}.>"),
            format!("ferry.{p}.{CALL}.>"),
            format!("ferry.{p}.{READY}.>"),
        ]
    }

    /// What stream `p` republishes, and where.
    pub fn republished(&self, p: usize) -> (String, String) {
        (
            format!("ferry.{p}.{LOG}.>"),
            format!("ferry.{p}.{LOGGED}.>"),
        )
    }

    /// Every republished commit, of every partition.
    pub fn all_logged(&self) -> String {
        format!("ferry.*.{LOGGED}.>")
    }

    /// The whole log of a thread: a filter over both kinds of commit.
    pub fn log(&self, group_id: &str) -> String {
        let p = self.partition(group_id);
        format!("ferry.{p}.{LOG}.{}.*", token(group_id))
    }

    /// Where a commit of the thread goes: with `dispatches`, where workers
    /// take it from.
    pub fn commit(&self, group_id: &str, dispatches: bool) -> String {
        let p = self.partition(group_id);
        let kind = if dispatches { DISPATCHES } else { COMMITS };
        format!("ferry.{p}.{LOG}.{}.{kind}", token(group_id))
    }

    /// Every commit of partition `p` that hands calls to dispatch.
    pub fn dispatching(&self, p: usize) -> String {
        format!("ferry.{p}.{LOG}.*.{DISPATCHES}")
    }

    /// Where a call of a limited toolset goes once it was given room.
    pub fn ready(&self, group_id: &str, id: &str) -> String {
        let p = self.partition(group_id);
        format!("ferry.{p}.{READY}.{}.{}", token(group_id), token(id))
    }

    /// Every call of partition `p` given room after it waited.
    pub fn readies(&self, p: usize) -> String {
        format!("ferry.{p}.{READY}.>")
    }

    /// Every log subject of partition `p`.
    pub fn logs(&self, p: usize) -> String {
        format!("ferry.{p}.{LOG}.*.*")
    }

    pub fn call(&self, group_id: &str, id: &str) -> String {
        let p = self.partition(group_id);
        format!("ferry.{p}.{CALL}.{}.{}", token(group_id), token(id))
    }

    /// Every call subject of a thread.
    pub fn calls(&self, group_id: &str) -> String {
        let p = self.partition(group_id);
        format!("ferry.{p}.{CALL}.{}.*", token(group_id))
    }
}

/// The `group_id` a thread subject (`ferry.<p>.<kind>.<g>[.…]`) is about.
pub fn group_of(subject: &str) -> Option<String> {
    untoken(subject.split('.').nth(3)?)
}

/// Whether `subject` is a `ferry.<p>.ready.<g>.<id>` subject.
pub fn is_ready(subject: &str) -> bool {
    subject.split('.').nth(2) == Some(READY)
}

/// The call id of a `ferry.<p>.call.<g>.<id>` (or `ready`) subject.
pub fn call_id_of(subject: &str) -> Option<String> {
    untoken(subject.split('.').nth(4)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_ids_stay_one_token() {
        let layout = Layout::new(4);
        let dots = ".".repeat(255);
        for g in ["a.*.>", "$JS.API", "a b", "é🙂", ">", "*", dots.as_str()] {
            let subject = layout.commit(g, true);
            let tokens: Vec<&str> = subject.split('.').collect();
            assert_eq!(tokens.len(), 5, "{g:?} -> {subject}");
            assert!(
                tokens[3]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
                "{subject}"
            );
            assert_eq!(group_of(&subject).as_deref(), Some(g));
            let c = layout.call(g, "x.>");
            assert_eq!(group_of(&c).as_deref(), Some(g));
            assert_eq!(call_id_of(&c).as_deref(), Some("x.>"));
        }
    }

    #[test]
    fn distinct_ids_give_distinct_subjects() {
        let layout = Layout::new(1);
        assert_ne!(layout.log("a"), layout.log("a."));
        assert_ne!(layout.commit("a", false), layout.commit("a.", false));
        assert_ne!(layout.call("a", "b.c"), layout.call("a.b", "c"));
    }

    /// A thread's partition depends on its id and the count only: every
    /// process of a cluster finds it in the same stream.
    #[test]
    fn partitions_are_stable_and_spread_threads() {
        let layout = Layout::new(4);
        assert_eq!(
            layout.partition("thread-1"),
            Layout::new(4).partition("thread-1")
        );
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c.
        assert_eq!(
            layout.partition("a"),
            (0xaf63_dc4c_8601_ec8c_u64 % 4) as usize
        );
        let mut seen = [0; 4];
        for n in 0..1000 {
            seen[layout.partition(&format!("t{n}"))] += 1;
        }
        assert!(seen.iter().all(|&n| n > 150), "{seen:?}");
        assert!((0..100).all(|n| Layout::new(1).partition(&format!("t{n}")) == 0));
        for (p, _) in seen.iter().enumerate() {
            let subject = layout.commit(&format!("x{p}"), true);
            assert!(subject.starts_with(&format!(
                "ferry.{}.log.",
                layout.partition(&format!("x{p}"))
            )));
        }
    }
}
