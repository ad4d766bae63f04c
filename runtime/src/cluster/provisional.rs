//! Submissions a runtime node journaled and no worker has answered yet.
//!
//! A node cannot see a thread without a worker, so a submission it could
//! only journal is answered `202` provisionally (`"seq": 0`). Without this
//! record, a second submission of the same `(group_id, id)` with another
//! body, made in that window, was answered `202` too, and refused later
//! by the worker with nobody to hear the `409`. The node now refuses it at
//! once: the first is journaled ahead of it, so a worker would apply the
//! first and refuse this one anyway. Submissions taken by another node in
//! the same window still meet only at the worker (README, "What is not
//! built yet").
//!
//! An entry lives from its journaling until the worker's answer reaches
//! this node. Once relayed it carries its sequence in the inbox stream,
//! and the node keeps it on disk (`Outbox::keep_claim`): a restart loses
//! the answers owed to the run before, and the claim would go with them.
//! A claim whose answer never comes (a restart, an answer lost on the way)
//! is settled when its request is found gone from the inbox (a worker
//! decided it); the least recently claimed go first once [`CAPACITY`] are
//! held.

use std::collections::HashMap;
use std::num::NonZeroUsize;

use ferry_proto::api::SubmitCall;
use lru::LruCache;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// How many unanswered submissions a node keeps: far more than a node
/// journals during a minutes-long outage of NATS at the rate it can fsync.
pub const CAPACITY: usize = 65_536;

/// A digest of what makes two submissions of one id the same call: the
/// fields the state machine compares (`thread::decide`'s `submit`), with
/// `thread_ancestors: []` read as none, as the engine normalizes it.
pub type Fingerprint = [u8; 32];

pub fn fingerprint(call: &SubmitCall) -> Fingerprint {
    let mut digest = Sha256::new();
    let optional = |digest: &mut Sha256, text: Option<&str>| match text {
        None => digest.update(b"-"),
        Some(text) => string(digest, text),
    };
    string(&mut digest, &call.operation);
    value(&mut digest, &call.arguments);
    optional(&mut digest, call.call_id.as_deref());
    optional(&mut digest, call.user_id.as_deref());
    match call.thread_ancestors.as_ref().filter(|a| !a.is_empty()) {
        None => digest.update(b"-"),
        Some(ancestors) => {
            count(&mut digest, ancestors.len());
            for ancestor in ancestors {
                string(&mut digest, ancestor);
            }
        }
    }
    digest.finalize().into()
}

/// A string, tagged and length-delimited: `("ab", "c")` is not `("a", "bc")`.
fn string(digest: &mut Sha256, text: &str) {
    digest.update(b"s");
    count(digest, text.len());
    digest.update(text.as_bytes());
}

fn count(digest: &mut Sha256, n: usize) {
    digest.update((n as u64).to_be_bytes());
}

/// Feeds `v` to `digest` so that two values hash alike exactly when they
/// are equal as `serde_json::Value`s, the state machine's comparison:
/// object keys in sorted order whatever the map keeps, integers apart
/// from floats (`1` is not `1.0`), and `-0.0` as `0.0` (they are equal).
fn value(digest: &mut Sha256, v: &Value) {
    match v {
        Value::Null => digest.update(b"n"),
        Value::Bool(b) => digest.update(if *b { b"t" } else { b"f" }),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                digest.update(b"u");
                digest.update(u.to_be_bytes());
            } else if let Some(i) = n.as_i64() {
                digest.update(b"i");
                digest.update(i.to_be_bytes());
            } else {
                let f = n.as_f64().unwrap_or_default();
                digest.update(b"d");
                digest.update((if f == 0.0 { 0.0 } else { f }).to_bits().to_be_bytes());
            }
        }
        Value::String(s) => string(digest, s),
        Value::Array(items) => {
            digest.update(b"a");
            count(digest, items.len());
            for item in items {
                value(digest, item);
            }
        }
        Value::Object(map) => {
            digest.update(b"o");
            count(digest, map.len());
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (key, item) in entries {
                string(digest, key);
                value(digest, item);
            }
        }
    }
}

/// The call a submission claims, by thread and id.
type Key = (String, String);

/// A submission's hold on its id.
struct Claim {
    /// Its outbox entry.
    number: u64,
    fingerprint: Fingerprint,
    /// Its sequence in the inbox stream, once relayed.
    relayed: Option<u64>,
}

/// A relayed claim as the node keeps it on disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Relayed {
    pub group_id: String,
    pub id: String,
    pub fingerprint: Fingerprint,
    /// Its request's sequence in the inbox stream.
    pub seq: u64,
}

pub struct Provisional {
    by_call: LruCache<Key, Claim>,
    by_number: HashMap<u64, Key>,
}

/// Another body was journaled under the same id and not answered yet.
#[derive(Debug, PartialEq)]
pub struct Conflict {
    /// The outbox entry that holds the id.
    pub holder: u64,
    /// Its sequence in the inbox stream, if it was relayed.
    pub relayed: Option<u64>,
}

/// The outbox entry of a claim pushed out to make room, whose record on
/// disk can go.
pub type Evicted = Option<u64>;

impl Default for Provisional {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl Provisional {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            by_call: LruCache::new(NonZeroUsize::new(capacity.max(1)).expect("not zero")),
            by_number: HashMap::new(),
        }
    }

    /// Records that outbox entry `number` submits `call`, unless another
    /// body under its id is still unanswered. A same-body retry keeps the
    /// first entry's claim: its answer settles both.
    pub fn claim(
        &mut self,
        number: u64,
        call: &SubmitCall,
        fingerprint: Fingerprint,
    ) -> Result<Evicted, Conflict> {
        let Some(id) = &call.id else { return Ok(None) };
        let key = (call.group_id.clone(), id.clone());
        if let Some(held) = self.by_call.get(&key) {
            return if held.fingerprint == fingerprint {
                Ok(None)
            } else {
                Err(Conflict {
                    holder: held.number,
                    relayed: held.relayed,
                })
            };
        }
        let claim = Claim {
            number,
            fingerprint,
            relayed: None,
        };
        Ok(self.hold(key, claim))
    }

    fn hold(&mut self, key: Key, claim: Claim) -> Evicted {
        let number = claim.number;
        let evicted = self.by_call.push(key.clone(), claim).map(|(_, gone)| {
            self.by_number.remove(&gone.number);
            gone.number
        });
        self.by_number.insert(number, key);
        evicted
    }

    /// Entry `number` is in the inbox stream at `seq`: what the node keeps
    /// of its claim, if it holds one.
    pub fn relayed(&mut self, number: u64, seq: u64) -> Option<Relayed> {
        let key = self.by_number.get(&number)?;
        let claim = self.by_call.peek_mut(key)?;
        claim.relayed = Some(seq);
        Some(Relayed {
            group_id: key.0.clone(),
            id: key.1.clone(),
            fingerprint: claim.fingerprint,
            seq,
        })
    }

    /// Takes back a relayed claim an earlier run kept. One for an id
    /// already held (kept twice by a crash) is not taken.
    pub fn restore(&mut self, number: u64, relayed: Relayed) -> Evicted {
        let key = (relayed.group_id, relayed.id);
        if self.by_call.contains(&key) {
            return Some(number);
        }
        let claim = Claim {
            number,
            fingerprint: relayed.fingerprint,
            relayed: Some(relayed.seq),
        };
        self.hold(key, claim)
    }

    /// Entry `number` was answered by a worker, or never will be to this
    /// node (dropped, or its request left the inbox), or was not
    /// journaled after all. True if it held a relayed claim (whose record
    /// on disk can go).
    pub fn settle(&mut self, number: u64) -> bool {
        let Some(key) = self.by_number.remove(&number) else {
            return false;
        };
        if self.by_call.peek(&key).is_none_or(|c| c.number != number) {
            return false;
        }
        self.by_call
            .pop(&key)
            .is_some_and(|claim| claim.relayed.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str, arguments: serde_json::Value) -> SubmitCall {
        serde_json::from_value(json!({
            "operation": "op", "arguments": arguments, "group_id": "g", "id": id
        }))
        .unwrap()
    }

    fn claim(p: &mut Provisional, number: u64, call: &SubmitCall) -> Result<(), Conflict> {
        p.claim(number, call, fingerprint(call)).map(drop)
    }

    fn held(holder: u64, relayed: Option<u64>) -> Result<(), Conflict> {
        Err(Conflict { holder, relayed })
    }

    #[test]
    fn another_body_under_an_unanswered_id_conflicts_until_the_answer() {
        let mut p = Provisional::default();
        let first = call("c", json!({"n": 1}));
        let other = call("c", json!({"n": 2}));
        assert_eq!(claim(&mut p, 1, &first), Ok(()));
        assert_eq!(claim(&mut p, 2, &other), held(1, None));
        assert_eq!(claim(&mut p, 3, &first), Ok(()), "a same-body retry");
        assert_eq!(claim(&mut p, 4, &call("d", json!({"n": 2}))), Ok(()));
        // The retry's answer settles nothing: the first entry holds the id.
        p.settle(3);
        assert_eq!(claim(&mut p, 5, &other), held(1, None));
        p.settle(1);
        assert_eq!(claim(&mut p, 6, &other), Ok(()), "the worker decides now");
        assert_eq!(p.by_call.len(), 2);
    }

    #[test]
    fn the_fingerprint_is_the_state_machines_notion_of_the_same_body() {
        let base = call("c", json!({"a": 1, "b": [1, 2]}));
        let same = |value: serde_json::Value| {
            let mut c = base.clone();
            c.arguments = value;
            fingerprint(&c) == fingerprint(&base)
        };
        assert!(
            same(json!({"b": [1, 2], "a": 1})),
            "key order is not content"
        );
        assert!(
            !same(json!({"a": 1.0, "b": [1, 2]})),
            "1 and 1.0 differ (409)"
        );
        assert!(!same(json!({"a": 1, "b": [2, 1]})));
        assert!(!same(json!({"a": -1, "b": [1, 2]})));
        assert!(!same(json!({"a": "1", "b": [1, 2]})));
        assert!(!same(json!({"a": 1, "b": [1, 2], "c": null})));
        // `0.0 == -0.0` as values, so as bodies (a black-box review found
        // the first fingerprint told them apart).
        let zero = |text: &str| {
            let mut c = base.clone();
            c.arguments = serde_json::from_str(text).unwrap();
            fingerprint(&c)
        };
        assert_eq!(zero(r#"{"z": 0.0}"#), zero(r#"{"z": -0.0}"#));
        assert_eq!(zero(r#"{"z": 0.0}"#), zero(r#"{"z": -0}"#));
        assert_ne!(zero(r#"{"z": 0.0}"#), zero(r#"{"z": 0}"#));
        // Strings are delimited: ("ab", "c") is not ("a", "bc").
        assert_ne!(zero(r#"["ab", "c"]"#), zero(r#"["a", "bc"]"#));
        let mut rooted = base.clone();
        rooted.thread_ancestors = Some(vec![]);
        assert_eq!(fingerprint(&rooted), fingerprint(&base), "[] is no field");
        let mut other_user = base.clone();
        other_user.user_id = Some("u".into());
        assert_ne!(fingerprint(&other_user), fingerprint(&base));
        let mut other_thread = base.clone();
        other_thread.group_id = "h".into();
        assert_eq!(
            fingerprint(&other_thread),
            fingerprint(&base),
            "the key, not the body"
        );
    }

    /// The rule in one check: over pairs of sample bodies, equal
    /// fingerprints exactly when the values are equal.
    #[test]
    fn fingerprints_agree_with_value_equality() {
        let samples = [
            "null",
            "true",
            "false",
            "0",
            "-0",
            "0.0",
            "-0.0",
            "1",
            "1.0",
            "-1",
            "1e0",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "0.1",
            "\"\"",
            "\"0\"",
            "[]",
            "{}",
            "[null]",
            "[[]]",
            "[{}]",
            r#"{"a": 1, "b": 2}"#,
            r#"{"b": 2, "a": 1}"#,
            r#"{"a": {"b": 2}}"#,
            r#"{"ab": "c"}"#,
            r#"{"a": "bc"}"#,
            r#"["ab", "c"]"#,
            r#"["a", "bc"]"#,
        ];
        let values: Vec<serde_json::Value> = samples
            .iter()
            .map(|s| serde_json::from_str(s).unwrap())
            .collect();
        let print = |v: &serde_json::Value| fingerprint(&call("c", v.clone()));
        for a in &values {
            for b in &values {
                assert_eq!(print(a) == print(b), a == b, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn the_least_recently_claimed_go_first_when_full() {
        let mut p = Provisional::with_capacity(2);
        let (a, b, c) = (
            call("a", json!(1)),
            call("b", json!(1)),
            call("c", json!(1)),
        );
        claim(&mut p, 1, &a).unwrap();
        claim(&mut p, 2, &b).unwrap();
        assert_eq!(p.claim(3, &c, fingerprint(&c)), Ok(Some(1)));
        assert_eq!(p.by_call.len(), 2);
        assert!(
            !p.by_number.contains_key(&1),
            "the evicted entry's number goes too"
        );
        assert_eq!(
            claim(&mut p, 4, &call("a", json!(2))),
            Ok(()),
            "a was forgotten"
        );
    }

    #[test]
    fn a_relayed_claim_carries_its_inbox_sequence_and_comes_back_after_a_restart() {
        let mut p = Provisional::default();
        let (first, other) = (call("c", json!(1)), call("c", json!(2)));
        claim(&mut p, 1, &first).unwrap();
        assert_eq!(p.relayed(2, 7), None, "entry 2 claims nothing");
        let kept = p.relayed(1, 7).expect("1 holds c");
        assert_eq!(
            (kept.group_id.as_str(), kept.id.as_str(), kept.seq),
            ("g", "c", 7)
        );
        assert_eq!(claim(&mut p, 3, &other), held(1, Some(7)));
        assert!(p.settle(1), "a relayed claim's record can go");
        assert!(!p.settle(1));

        // The next run takes the kept claim back.
        let mut next = Provisional::default();
        assert_eq!(next.restore(1, kept.clone()), None);
        assert_eq!(claim(&mut next, 9, &other), held(1, Some(7)));
        assert_eq!(claim(&mut next, 10, &first), Ok(()), "a same-body retry");
        assert_eq!(next.restore(4, kept), Some(4), "kept twice: once is enough");
        assert!(next.settle(1));
        assert_eq!(claim(&mut next, 11, &other), Ok(()));
        assert!(!next.settle(11), "not relayed: nothing on disk");
    }
}
