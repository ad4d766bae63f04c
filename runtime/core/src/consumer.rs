//! Consumers: named, durable delivery cursors over every thread's events,
//! in the spirit of JetStream's durable consumers. What an administrator
//! asks for ([`ConsumerSpec`]) and its checks, which events a consumer
//! takes ([`Filter`]), and the rules of delivery to one thread
//! ([`ThreadDelivery`]): one event of a thread out at a time, in order, so
//! pullers sharing a consumer never see a thread's events out of order.

use ferry_proto::api::EventKind;
use serde::{Deserialize, Serialize};

/// Longest consumer name.
pub const MAX_NAME_CHARS: usize = 64;
/// Bounds of `ack_wait_secs` (default [`DEFAULT_ACK_WAIT_SECS`]).
pub const MAX_ACK_WAIT_SECS: u64 = 24 * 3600;
pub const DEFAULT_ACK_WAIT_SECS: u64 = 30;
/// Most deliveries `max_deliver` may ask for.
pub const MAX_DELIVER: u32 = 1000;
/// Most event types or toolsets a filter may name.
pub const MAX_FILTER_ENTRIES: usize = 64;
/// Longest `group_prefix`: a `group_id`'s bound.
pub const MAX_PREFIX_BYTES: usize = 512;

/// What an administrator asks for: `POST /v1/consumers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSpec {
    pub name: String,
    pub filter: Filter,
    /// How long a puller may hold an event before it is handed out again.
    #[serde(default = "default_ack_wait")]
    pub ack_wait_secs: u64,
    /// Deliveries after which an event not acknowledged is dead-lettered
    /// (none: it is delivered until acknowledged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_deliver: Option<u32>,
    /// Ferry POSTs each event to a receiver instead of waiting for pulls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<Push>,
}

fn default_ack_wait() -> u64 {
    DEFAULT_ACK_WAIT_SECS
}

/// Where a push consumer delivers: each event POSTed to `url`, signed the
/// Standard Webhooks way with `secret`, retried for up to `max_age_secs`
/// and dead-lettered after that.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Push {
    pub url: String,
    /// `whsec_` and base64 of 24 to 64 bytes; never shown back.
    pub secret: String,
    #[serde(default = "default_max_age")]
    pub max_age_secs: u64,
}

/// How long a push consumer retries an event by default: three days.
pub const DEFAULT_MAX_AGE_SECS: u64 = 3 * 24 * 3600;
/// The longest it may be asked to: thirty days.
pub const MAX_AGE_SECS: u64 = 30 * 24 * 3600;

fn default_max_age() -> u64 {
    DEFAULT_MAX_AGE_SECS
}

/// Which events a consumer takes: of these types, in threads whose
/// `group_id` starts with `group_prefix`, of calls to these toolsets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    pub types: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_prefix: Option<String>,
    /// Toolset names; an event of no call (`thread_closed`) or of a
    /// built-in tool has no toolset, and does not pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolsets: Option<Vec<String>>,
}

/// Why a [`ConsumerSpec`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(
        "name must be 1 to {MAX_NAME_CHARS} of A-Z a-z 0-9 . _ -, and not . or .. (got {0:?})"
    )]
    BadName(String),
    #[error("filter.types must name at least one event type")]
    NoTypes,
    #[error("filter.types: {0:?} is not an event type (one of {types})", types = EventKind::NAMES.join(", "))]
    UnknownType(String),
    #[error("filter.{field} holds more than {MAX_FILTER_ENTRIES} entries")]
    TooMany { field: &'static str },
    #[error("filter.toolsets must name at least one toolset, or be left out")]
    NoToolsets,
    #[error("filter.toolsets: {0:?} is not a toolset name")]
    BadToolset(String),
    #[error("filter.group_prefix must be 1 to {MAX_PREFIX_BYTES} bytes, or be left out")]
    BadPrefix,
    #[error("ack_wait_secs must be 1 to {MAX_ACK_WAIT_SECS}")]
    BadAckWait,
    #[error("max_deliver must be 1 to {MAX_DELIVER}")]
    BadMaxDeliver,
    #[error("push.url must be an http(s) URL with a host and no user name or password (got {0})")]
    BadPushUrl(String),
    #[error("{0}")]
    BadSecret(String),
    #[error("push.max_age_secs must be 1 to {MAX_AGE_SECS}")]
    BadMaxAge,
}

impl ConsumerSpec {
    /// The spec as Ferry keeps it (types deduplicated and sorted, so that
    /// two asks for the same consumer compare equal), or why it is refused.
    pub fn checked(mut self) -> Result<Self, SpecError> {
        // `.` and `..` are path segments URL normalisation removes: such
        // a consumer could not be named in a URL.
        let name_ok = !matches!(self.name.as_str(), "." | "..")
            && (1..=MAX_NAME_CHARS).contains(&self.name.chars().count())
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !name_ok {
            return Err(SpecError::BadName(self.name));
        }
        let filter = &mut self.filter;
        if filter.types.is_empty() {
            return Err(SpecError::NoTypes);
        }
        if filter.types.len() > MAX_FILTER_ENTRIES {
            return Err(SpecError::TooMany { field: "types" });
        }
        if let Some(unknown) = filter
            .types
            .iter()
            .find(|t| !EventKind::NAMES.contains(&t.as_str()))
        {
            return Err(SpecError::UnknownType(unknown.clone()));
        }
        filter.types.sort();
        filter.types.dedup();
        if let Some(prefix) = &filter.group_prefix {
            if prefix.is_empty() || prefix.len() > MAX_PREFIX_BYTES {
                return Err(SpecError::BadPrefix);
            }
        }
        if let Some(toolsets) = &mut filter.toolsets {
            if toolsets.is_empty() {
                return Err(SpecError::NoToolsets);
            }
            if toolsets.len() > MAX_FILTER_ENTRIES {
                return Err(SpecError::TooMany { field: "toolsets" });
            }
            if let Some(bad) = toolsets.iter().find(|t| !is_toolset_name(t)) {
                return Err(SpecError::BadToolset(bad.clone()));
            }
            toolsets.sort();
            toolsets.dedup();
        }
        if !(1..=MAX_ACK_WAIT_SECS).contains(&self.ack_wait_secs) {
            return Err(SpecError::BadAckWait);
        }
        if self
            .max_deliver
            .is_some_and(|n| !(1..=MAX_DELIVER).contains(&n))
        {
            return Err(SpecError::BadMaxDeliver);
        }
        if let Some(push) = &self.push {
            let shown = crate::toolsets::redacted(&push.url);
            match url::Url::parse(&push.url) {
                Ok(url)
                    if matches!(url.scheme(), "http" | "https")
                        && url.host_str().is_some()
                        && url.username().is_empty()
                        && url.password().is_none() => {}
                _ => return Err(SpecError::BadPushUrl(format!("{shown:?}"))),
            }
            crate::webhook::secret_key(&push.secret).map_err(SpecError::BadSecret)?;
            if !(1..=MAX_AGE_SECS).contains(&push.max_age_secs) {
                return Err(SpecError::BadMaxAge);
            }
        }
        Ok(self)
    }
}

/// A toolset's name as manifests may give it: letters, digits, `_`, `-`.
fn is_toolset_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
}

impl Filter {
    /// Whether the filter takes threads named `group_id` at all.
    pub fn takes_thread(&self, group_id: &str) -> bool {
        self.group_prefix
            .as_deref()
            .is_none_or(|p| group_id.starts_with(p))
    }

    /// Whether an event of `kind` in a thread the filter takes passes,
    /// `toolset` being that of the event's call (`None`: no call, or a
    /// built-in tool).
    pub fn takes(&self, kind: &str, toolset: Option<&str>) -> bool {
        self.types.iter().any(|t| t == kind)
            && self
                .toolsets
                .as_ref()
                .is_none_or(|names| toolset.is_some_and(|t| names.iter().any(|n| n == t)))
    }

    /// Whether the filter needs an event's toolset to decide (so the
    /// engine looks the call up only then).
    pub fn needs_toolset(&self) -> bool {
        self.toolsets.is_some()
    }
}

/// The toolset of a qualified tool name (`Toolset.tool@1.2.3`); `None` for
/// a built-in tool, which has no toolset.
pub fn toolset_of(qualified: &str) -> Option<&str> {
    let (name, _) = qualified.split_once('@').unwrap_or((qualified, ""));
    name.split_once('.').map(|(toolset, _)| toolset)
}

/// One consumer's delivery of one thread: every event through `done` is
/// acknowledged, dead-lettered or not taken by the filter; at most one
/// event is out (`out`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadDelivery {
    pub done: u64,
    pub out: Option<Out>,
}

/// An event handed out and not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Out {
    pub seq: u64,
    /// How many times it was handed out, this time included.
    pub deliveries: u32,
    /// When it is handed out again (ms since the epoch).
    pub until_ms: u64,
    /// When it was first handed out.
    pub since_ms: u64,
}

/// When a consumer gives an event up: after so many deliveries, or (a
/// push consumer) so long after the first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GiveUp {
    pub max_deliver: Option<u32>,
    pub max_age_ms: Option<u64>,
}

impl ConsumerSpec {
    pub fn give_up(&self) -> GiveUp {
        GiveUp {
            max_deliver: self.max_deliver,
            max_age_ms: self
                .push
                .as_ref()
                .map(|p| p.max_age_secs.saturating_mul(1000)),
        }
    }
}

/// What an acknowledgement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acked {
    /// The event out was acknowledged: the thread moves on.
    Done,
    /// Acknowledged before (or passed over): nothing changes.
    Already,
    /// Not an event this consumer handed out.
    NotDelivered,
}

/// What a due event is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Hand it out (again): the `deliveries`th time.
    Deliver(u32),
    /// Out too many times without an acknowledgement: dead-letter it.
    DeadLetter,
}

impl ThreadDelivery {
    /// Whether the thread has an event out that is not overdue at `now`.
    pub fn held(&self, now_ms: u64) -> bool {
        self.out.as_ref().is_some_and(|o| o.until_ms > now_ms)
    }

    /// What to do with the thread's next event `seq` (the first the filter
    /// takes after `done`), if it may go at `now`: an event out and not
    /// overdue holds the thread back.
    pub fn due(&self, seq: u64, now_ms: u64, give_up: GiveUp) -> Option<Due> {
        match &self.out {
            Some(out) if out.until_ms > now_ms => None,
            Some(out) if out.seq == seq => {
                let too_many = give_up.max_deliver.is_some_and(|max| out.deliveries >= max);
                let too_old = give_up
                    .max_age_ms
                    .is_some_and(|age| now_ms.saturating_sub(out.since_ms) >= age);
                if too_many || too_old {
                    Some(Due::DeadLetter)
                } else {
                    Some(Due::Deliver(out.deliveries + 1))
                }
            }
            _ => Some(Due::Deliver(1)),
        }
    }

    /// Hands `seq` out at `now_ms` until `until_ms`, the `deliveries`th
    /// time.
    pub fn hand_out(&mut self, seq: u64, deliveries: u32, now_ms: u64, until_ms: u64) {
        let since_ms = match &self.out {
            Some(out) if out.seq == seq => out.since_ms,
            _ => now_ms,
        };
        self.out = Some(Out {
            seq,
            deliveries,
            until_ms,
            since_ms,
        });
    }

    /// The event out is handed out again no sooner than `until_ms` (a push
    /// that failed waits out its backoff).
    pub fn hold_until(&mut self, seq: u64, until_ms: u64) {
        if let Some(out) = self.out.as_mut().filter(|o| o.seq == seq) {
            out.until_ms = until_ms;
        }
    }

    /// Passes over everything through `seq` (events the filter does not
    /// take, or one dead-lettered).
    pub fn pass(&mut self, seq: u64) {
        self.done = self.done.max(seq);
        if self.out.as_ref().is_some_and(|o| o.seq <= seq) {
            self.out = None;
        }
    }

    /// A puller acknowledges `seq`.
    pub fn ack(&mut self, seq: u64) -> Acked {
        match &self.out {
            Some(out) if out.seq == seq => {
                self.pass(seq);
                Acked::Done
            }
            _ if seq <= self.done => Acked::Already,
            _ => Acked::NotDelivered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn push(push: serde_json::Value) -> serde_json::Value {
        json!({"name": "r", "filter": {"types": ["tool_result"]}, "push": push})
    }

    fn spec(body: serde_json::Value) -> Result<ConsumerSpec, String> {
        serde_json::from_value::<ConsumerSpec>(body)
            .map_err(|e| e.to_string())?
            .checked()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_spec_is_kept_in_one_form_and_bad_ones_say_what_is_wrong() {
        let kept = spec(serde_json::json!({"name": "results",
            "filter": {"types": ["tool_result", "call_accepted", "tool_result"]}}))
        .unwrap();
        assert_eq!(kept.filter.types, ["call_accepted", "tool_result"]);
        assert_eq!(kept.ack_wait_secs, DEFAULT_ACK_WAIT_SECS);
        for (bad, says) in [
            (
                serde_json::json!({"name": "", "filter": {"types": ["tool_result"]}}),
                "name",
            ),
            (
                serde_json::json!({"name": "a b", "filter": {"types": ["tool_result"]}}),
                "name",
            ),
            (
                serde_json::json!({"name": "..", "filter": {"types": ["tool_result"]}}),
                "name",
            ),
            (
                serde_json::json!({"name": "r", "filter": {"types": []}}),
                "at least one",
            ),
            (
                serde_json::json!({"name": "r", "filter": {"types": ["nope"]}}),
                "\"nope\"",
            ),
            (serde_json::json!({"name": "r", "filter": {}}), "types"),
            (
                serde_json::json!({"name": "r", "filter": {"types": ["tool_result"], "extra": 1}}),
                "extra",
            ),
            (
                serde_json::json!({"name": "r", "filter": {"types": ["tool_result"], "toolsets": []}}),
                "toolsets",
            ),
            (
                serde_json::json!({"name": "r", "filter": {"types": ["tool_result"], "toolsets": ["a.b"]}}),
                "a.b",
            ),
            (
                serde_json::json!({"name": "r", "filter": {"types": ["tool_result"], "group_prefix": ""}}),
                "group_prefix",
            ),
            (
                serde_json::json!({"name": "r", "filter": {"types": ["tool_result"]}, "ack_wait_secs": 0}),
                "ack_wait_secs",
            ),
            (
                serde_json::json!({"name": "r", "filter": {"types": ["tool_result"]}, "max_deliver": 0}),
                "max_deliver",
            ),
            (
                push(json!({"url": "ftp://h/", "secret": SECRET})),
                "push.url",
            ),
            (
                push(json!({"url": "http://u:pw@h/", "secret": SECRET})),
                "***",
            ),
            (
                push(json!({"url": "not a url", "secret": SECRET})),
                "push.url",
            ),
            (
                push(json!({"url": "http://h/", "secret": "plain"})),
                "whsec_",
            ),
            (
                push(json!({"url": "http://h/", "secret": SECRET, "max_age_secs": 0})),
                "max_age_secs",
            ),
            (push(json!({"url": "http://h/"})), "secret"),
            (
                push(json!({"url": "http://h/", "secret": SECRET, "extra": 1})),
                "extra",
            ),
        ] {
            let error = spec(bad.clone()).expect_err(&bad.to_string());
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn a_filter_takes_its_types_threads_and_toolsets() {
        let filter = Filter {
            types: vec!["tool_result".into()],
            group_prefix: Some("team-a/".into()),
            toolsets: Some(vec!["ops".into()]),
        };
        assert!(filter.takes_thread("team-a/1") && !filter.takes_thread("team-b/1"));
        assert!(filter.takes("tool_result", Some("ops")));
        assert!(!filter.takes("tool_result", Some("web")));
        assert!(!filter.takes("tool_result", None));
        assert!(!filter.takes("call_accepted", Some("ops")));
        assert_eq!(toolset_of("ops.deploy@1.0.0"), Some("ops"));
        assert_eq!(toolset_of("cancel_subscription"), None);
    }

    #[test]
    fn one_event_of_a_thread_is_out_at_a_time_and_comes_back_when_overdue() {
        let twice = GiveUp {
            max_deliver: Some(2),
            max_age_ms: None,
        };
        let mut thread = ThreadDelivery::default();
        assert_eq!(thread.due(3, 0, twice), Some(Due::Deliver(1)));
        thread.hand_out(3, 1, 0, 100);
        assert!(thread.held(50));
        assert_eq!(thread.due(3, 50, twice), None, "out, not overdue");
        assert_eq!(thread.due(3, 100, twice), Some(Due::Deliver(2)));
        thread.hand_out(3, 2, 100, 200);
        assert_eq!(thread.due(3, 200, twice), Some(Due::DeadLetter));
        assert_eq!(thread.due(3, 200, GiveUp::default()), Some(Due::Deliver(3)));
        // A push consumer gives up by age, counted from the first delivery.
        let a_while = GiveUp {
            max_deliver: None,
            max_age_ms: Some(250),
        };
        assert_eq!(thread.due(3, 249, a_while), Some(Due::Deliver(3)));
        assert_eq!(thread.due(3, 250, a_while), Some(Due::DeadLetter));
        thread.hold_until(3, 400);
        assert!(thread.held(399));
        assert_eq!(thread.ack(4), Acked::NotDelivered);
        assert_eq!(thread.ack(3), Acked::Done);
        assert_eq!(thread.done, 3);
        assert_eq!(thread.ack(3), Acked::Already);
        assert_eq!(thread.ack(2), Acked::Already);
        thread.pass(7);
        assert_eq!((thread.done, thread.out.is_none()), (7, true));
    }
}
