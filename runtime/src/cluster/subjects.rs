//! NATS subject layout. A `group_id` (or call id) is arbitrary text, but a
//! subject is `.`-separated tokens where `*` and `>` are wildcards, so each
//! id becomes one token: its UTF-8 bytes in unpadded base64url, whose
//! alphabet (`A-Z a-z 0-9 - _`) holds none of `.`, `*`, `>`, `$` or white
//! space. Distinct ids give distinct tokens, and nothing can widen a
//! subscription or reach `$JS.API`.
//!
//! | subject | stream | what |
//! |---|---|---|
//! | `ferry.log.<g>` | `FERRY_THREADS` | the thread's log: one commit per command |
//! | `ferry.call.<g>.<id>` | `FERRY_THREADS` | the latest record of each call |
//! | `ferry.logged.<g>` | (republished by `FERRY_THREADS`) | the headers of each commit the stream *stored*, for runtime nodes to wake readers |
//! | `ferry.in.<g>` | `FERRY_INBOX` | requests relayed by runtime nodes, for workers to apply |
//! | `ferry.work.<g>` | `FERRY_WORK` | dispatch work for workers |
//! | `ferry.reply.<run>.<n>` | (core NATS) | a worker's answer to the node run awaiting it |

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

pub const LOG: &str = "ferry.log";
pub const CALL: &str = "ferry.call";
/// Where `FERRY_THREADS` republishes (headers only) each commit it
/// stored. Not `LOG` itself: a publish that loses its compare-and-set
/// still reaches core subscribers of its subject.
pub const LOGGED: &str = "ferry.logged";
pub const INBOX: &str = "ferry.in";
pub const WORK: &str = "ferry.work";
pub const REPLY: &str = "ferry.reply";

/// One subject token standing for `id`.
pub fn token(id: &str) -> String {
    URL_SAFE_NO_PAD.encode(id.as_bytes())
}

fn untoken(token: &str) -> Option<String> {
    String::from_utf8(URL_SAFE_NO_PAD.decode(token).ok()?).ok()
}

pub fn log(group_id: &str) -> String {
    format!("{LOG}.{}", token(group_id))
}

pub fn call(group_id: &str, id: &str) -> String {
    format!("{CALL}.{}.{}", token(group_id), token(id))
}

pub fn inbox(group_id: &str) -> String {
    format!("{INBOX}.{}", token(group_id))
}

pub fn work(group_id: &str) -> String {
    format!("{WORK}.{}", token(group_id))
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
            let subject = log(g);
            let tokens: Vec<&str> = subject.split('.').collect();
            assert_eq!(tokens.len(), 3, "{g:?} -> {subject}");
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
        assert_ne!(call("a", "b.c"), call("a.b", "c"));
    }
}
