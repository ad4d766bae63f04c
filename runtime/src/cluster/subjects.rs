//! NATS subject layout. A `group_id` (or call id) is arbitrary text, but a
//! subject is `.`-separated tokens where `*` and `>` are wildcards, so each
//! id becomes one token: its UTF-8 bytes in unpadded base64url, whose
//! alphabet (`A-Z a-z 0-9 - _`) holds none of `.`, `*`, `>`, `$` or white
//! space. Distinct ids give distinct tokens, and nothing can widen a
//! subscription or reach `$JS.API`.
//!
//! | subject | stream | what |
//! |---|---|---|
//! | `ferry.log.<g>.d` | `FERRY_THREADS` | a commit of the thread's log that hands calls to dispatch: what workers consume |
//! | `ferry.log.<g>.c` | `FERRY_THREADS` | any other commit of the thread's log |
//! | `ferry.call.<g>.<id>` | `FERRY_THREADS` | the latest record of each call |
//! | `ferry.logged.<g>.<d\|c>` | (republished by `FERRY_THREADS`) | the headers of each commit the stream *stored*, for runtime nodes to wake readers |
//!
//! A thread's log is both subjects together, `ferry.log.<g>.*`: appends
//! compare-and-set on that filter's last sequence, and reads take it whole.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

pub const LOG: &str = "ferry.log";
pub const CALL: &str = "ferry.call";
/// Where `FERRY_THREADS` republishes (headers only) each commit it
/// stored. Not `LOG` itself: a publish that loses its compare-and-set
/// still reaches core subscribers of its subject.
pub const LOGGED: &str = "ferry.logged";
/// The last token of a commit that hands calls to dispatch.
const DISPATCHES: &str = "d";
/// The last token of any other commit.
const COMMITS: &str = "c";

/// One subject token standing for `id`.
pub fn token(id: &str) -> String {
    URL_SAFE_NO_PAD.encode(id.as_bytes())
}

fn untoken(token: &str) -> Option<String> {
    String::from_utf8(URL_SAFE_NO_PAD.decode(token).ok()?).ok()
}

/// The whole log of a thread: a filter over both kinds of commit.
pub fn log(group_id: &str) -> String {
    format!("{LOG}.{}.*", token(group_id))
}

/// Where a commit of the thread goes: with `dispatches`, where workers
/// take it from.
pub fn commit(group_id: &str, dispatches: bool) -> String {
    let kind = if dispatches { DISPATCHES } else { COMMITS };
    format!("{LOG}.{}.{kind}", token(group_id))
}

/// Every commit that hands calls to dispatch, of every thread.
pub fn dispatching() -> String {
    format!("{LOG}.*.{DISPATCHES}")
}

pub fn call(group_id: &str, id: &str) -> String {
    format!("{CALL}.{}.{}", token(group_id), token(id))
}

/// The `group_id` a thread subject (`ferry.<kind>.<g>[.…]`) is about.
pub fn group_of(subject: &str) -> Option<String> {
    untoken(subject.split('.').nth(2)?)
}

/// The call id of a `ferry.call.<g>.<id>` subject.
pub fn call_id_of(subject: &str) -> Option<String> {
    untoken(subject.split('.').nth(3)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_ids_stay_one_token() {
        let dots = ".".repeat(255);
        for g in ["a.*.>", "$JS.API", "a b", "é🙂", ">", "*", dots.as_str()] {
            let subject = commit(g, true);
            let tokens: Vec<&str> = subject.split('.').collect();
            assert_eq!(tokens.len(), 4, "{g:?} -> {subject}");
            assert!(
                tokens[2]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
                "{subject}"
            );
            assert_eq!(group_of(&subject).as_deref(), Some(g));
            let c = call(g, "x.>");
            assert_eq!(group_of(&c).as_deref(), Some(g));
            assert_eq!(call_id_of(&c).as_deref(), Some("x.>"));
        }
    }

    #[test]
    fn distinct_ids_give_distinct_subjects() {
        assert_ne!(log("a"), log("a."));
        assert_ne!(commit("a", false), commit("a.", false));
        assert_ne!(call("a", "b.c"), call("a.b", "c"));
    }
}
