//! The audit log's entries, as stored and as `GET /v1/audit` gives them:
//! who did what, when, and how it ended. rap-1 asks runtimes to keep one
//! ("operation, timestamp, outcome"); Ferry also records who decided each
//! approval, every change of its toolsets and tokens, and refused
//! authentication.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Timestamp;

/// One entry in its place in the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Its place, assigned when it was stored; increasing, with gaps. The
    /// cursor `GET /v1/audit?since=` takes.
    pub seq: u64,
    #[serde(flatten)]
    pub entry: AuditEntry,
}

/// What happened, as the process that did it records it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: Timestamp,
    pub kind: AuditKind,
    /// Who acted: the name of the identity Ferry authenticated (`tool` for
    /// a tool's callback, `ferry` for what Ferry did on its own, such as an
    /// approval that timed out).
    pub identity: String,
    /// Names this action, so that a repeat of it (an agent retrying a
    /// submission whose answer it lost, a tool resending a callback) is
    /// stored once: a digest of what identifies the action.
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    /// The call's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The operation as the agent named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// The tool it resolved to, fully qualified (`Toolset.tool@version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The `user_id` the call was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// How it ended: a call's `completed`, `failed`, `cancelled`,
    /// `subscribed` or `subscription_ended`; an approval's option
    /// (`allow_once`, `reject_always`, ...); `refused` for authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// What was changed: a toolset's `name@version`, a token's id and name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// A reviewer's reason, what a refusal was for, what a change was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What kind of action an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    /// A call was accepted (whatever happens to it next).
    #[default]
    CallSubmitted,
    /// A call reached its outcome.
    CallSettled,
    /// A reviewer, a standing grant or the timeout decided an approval.
    ApprovalDecided,
    /// A standing grant was revoked.
    GrantRevoked,
    ThreadClosed,
    ToolsetRegistered,
    ToolsetRemoved,
    /// A toolset's approval policy (or rate limits) changed.
    PolicyChanged,
    TokenCreated,
    TokenRevoked,
    /// A request was refused for its credential: none, unknown, revoked,
    /// or without the scope it needs.
    AuthRefused,
}

impl AuditKind {
    pub const ALL: [AuditKind; 11] = [
        AuditKind::CallSubmitted,
        AuditKind::CallSettled,
        AuditKind::ApprovalDecided,
        AuditKind::GrantRevoked,
        AuditKind::ThreadClosed,
        AuditKind::ToolsetRegistered,
        AuditKind::ToolsetRemoved,
        AuditKind::PolicyChanged,
        AuditKind::TokenCreated,
        AuditKind::TokenRevoked,
        AuditKind::AuthRefused,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AuditKind::CallSubmitted => "call_submitted",
            AuditKind::CallSettled => "call_settled",
            AuditKind::ApprovalDecided => "approval_decided",
            AuditKind::GrantRevoked => "grant_revoked",
            AuditKind::ThreadClosed => "thread_closed",
            AuditKind::ToolsetRegistered => "toolset_registered",
            AuditKind::ToolsetRemoved => "toolset_removed",
            AuditKind::PolicyChanged => "policy_changed",
            AuditKind::TokenCreated => "token_created",
            AuditKind::TokenRevoked => "token_revoked",
            AuditKind::AuthRefused => "auth_refused",
        }
    }
}

impl fmt::Display for AuditKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no [`AuditKind`]'s.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("unknown audit kind {0:?} (one of {kinds})", kinds = AuditKind::ALL.map(AuditKind::name).join(", "))]
pub struct UnknownKind(pub String);

impl FromStr for AuditKind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AuditKind::ALL
            .into_iter()
            .find(|kind| kind.name() == s)
            .ok_or_else(|| UnknownKind(s.to_owned()))
    }
}

/// Which entries a read wants.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AuditQuery {
    /// After this place in the log.
    pub after: u64,
    /// At or after this time.
    pub from: Option<Timestamp>,
    /// Only these kinds; empty: every kind.
    pub kinds: Vec<AuditKind>,
    pub limit: usize,
}

impl AuditQuery {
    pub fn wants(&self, record: &AuditRecord) -> bool {
        record.seq > self.after
            && self.from.is_none_or(|from| record.entry.at >= from)
            && (self.kinds.is_empty() || self.kinds.contains(&record.entry.kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_from_its_name() {
        for kind in AuditKind::ALL {
            assert_eq!(kind.name().parse::<AuditKind>(), Ok(kind));
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, kind.name());
        }
        let unknown = "call".parse::<AuditKind>().unwrap_err();
        assert!(unknown.to_string().contains("call_settled"), "{unknown}");
    }

    #[test]
    fn a_record_is_flat_and_omits_what_it_lacks() {
        let record = AuditRecord {
            seq: 7,
            entry: AuditEntry {
                kind: AuditKind::TokenRevoked,
                identity: "admin".into(),
                key: "k".into(),
                subject: Some("tok_1 ci".into()),
                ..AuditEntry::default()
            },
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["seq"], 7);
        assert_eq!(json["kind"], "token_revoked");
        assert!(json.get("group_id").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<AuditRecord>(json).unwrap(), record);
    }
}
