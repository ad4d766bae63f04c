//! Named API tokens: what an administrator asks for (a name, scopes and
//! bounds), the checks on it, and the record Ferry keeps. The secret is
//! shown once, when the token is made; Ferry keeps only its SHA-256, and
//! finds a presented token by that digest.

use std::collections::BTreeSet;

use ferry_proto::time::Timestamp;
use serde::{Deserialize, Serialize};

use crate::identity::{Bounds, Identity, Scope};

/// Longest name, bound entry or prefix.
pub const MAX_NAME_CHARS: usize = 128;
/// Most entries in one bound (tools or users).
pub const MAX_BOUND_ENTRIES: usize = 256;
/// What every named token's secret starts with, so that one found in a log
/// or a repository can be recognized as Ferry's.
pub const SECRET_PREFIX: &str = "ferry_";

/// Names that belong to Ferry's own identities: a token under one of them
/// would act as that identity (own its threads). OXP's `oxp:<sub>`
/// cannot be written: a name holds no `:`.
const RESERVED: &[&str] = &[
    Identity::ANONYMOUS,
    Identity::FERRY,
    "api-token",
    "mcp",
    "oxp",
];

/// What an administrator asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSpec {
    /// The identity's name: what events, audit records and reviewers'
    /// decisions show. Two tokens of one name are one identity (a
    /// rotation: make the new one, then revoke the old).
    pub name: String,
    pub scopes: Vec<String>,
    #[serde(flatten)]
    pub bounds: Bounds,
}

/// Why a [`TokenSpec`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("name must be 1 to {MAX_NAME_CHARS} of A-Z a-z 0-9 . _ - @ (got {0:?})")]
    BadName(String),
    #[error("name {0:?} is one of Ferry's own identities; choose another")]
    Reserved(String),
    #[error("give at least one scope: submit, read, review or admin")]
    NoScopes,
    #[error(transparent)]
    UnknownScope(#[from] crate::identity::UnknownScope),
    #[error("{field} must name at least one entry, or be left out to bound nothing")]
    EmptyBound { field: &'static str },
    #[error("{field} holds more than {MAX_BOUND_ENTRIES} entries")]
    TooMany { field: &'static str },
    #[error("{field} entry {entry:?} is not {shape}")]
    BadEntry {
        field: &'static str,
        entry: String,
        shape: &'static str,
    },
}

/// `A-Z a-z 0-9 . _ - @`, 1 to [`MAX_NAME_CHARS`]: what a name, a user or
/// a prefix is made of (a prefix may also hold `/` and `:`).
fn plain(text: &str, extra: &[u8]) -> bool {
    !text.is_empty()
        && text.len() <= MAX_NAME_CHARS
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b) || extra.contains(&b))
}

impl TokenSpec {
    /// The spec's scopes, checked, with every bound well formed.
    pub fn check(&self) -> Result<BTreeSet<Scope>, SpecError> {
        if !plain(&self.name, b"") {
            return Err(SpecError::BadName(self.name.chars().take(64).collect()));
        }
        if RESERVED.contains(&self.name.as_str()) {
            return Err(SpecError::Reserved(self.name.clone()));
        }
        let scopes = self
            .scopes
            .iter()
            .map(|s| s.parse())
            .collect::<Result<BTreeSet<Scope>, _>>()?;
        if scopes.is_empty() {
            return Err(SpecError::NoScopes);
        }
        let b = &self.bounds;
        check_entries("tools", b.tools.as_ref(), "Toolset or Toolset.tool", |t| {
            t.split('.').count() <= 2 && t.split('.').all(|part| plain(part, b""))
        })?;
        check_entries("users", b.users.as_ref(), "a user id", |u| plain(u, b":/"))?;
        if let Some(prefix) = &b.group_prefix {
            if !plain(prefix, b":/") {
                return Err(SpecError::BadEntry {
                    field: "group_prefix",
                    entry: prefix.chars().take(64).collect(),
                    shape: "1 to 128 of A-Z a-z 0-9 . _ - @ : /",
                });
            }
        }
        Ok(scopes)
    }
}

fn check_entries(
    field: &'static str,
    entries: Option<&BTreeSet<String>>,
    shape: &'static str,
    ok: impl Fn(&str) -> bool,
) -> Result<(), SpecError> {
    let Some(entries) = entries else {
        return Ok(());
    };
    if entries.is_empty() {
        return Err(SpecError::EmptyBound { field });
    }
    if entries.len() > MAX_BOUND_ENTRIES {
        return Err(SpecError::TooMany { field });
    }
    match entries.iter().find(|e| !ok(e)) {
        Some(bad) => Err(SpecError::BadEntry {
            field,
            entry: bad.chars().take(64).collect(),
            shape,
        }),
        None => Ok(()),
    }
}

/// The record of one named token, as stored and listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredToken {
    /// Public and stable: what `list` shows and `revoke` takes.
    pub id: String,
    pub name: String,
    pub scopes: BTreeSet<Scope>,
    #[serde(flatten)]
    pub bounds: Bounds,
    /// The secret's SHA-256, hex.
    pub digest: String,
    pub created_at: Timestamp,
    /// The identity that made it.
    pub created_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<String>,
}

impl StoredToken {
    pub fn live(&self) -> bool {
        self.revoked_at.is_none()
    }

    /// The identity whoever presents this token's secret is.
    pub fn identity(&self) -> Identity {
        Identity::bounded(self.name.clone(), self.scopes.clone(), self.bounds.clone())
    }
}

/// The hex SHA-256 under which a presented secret is looked up.
pub fn digest_of(secret: &str) -> String {
    crate::digest::sha256_hex(secret, 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> Result<TokenSpec, serde_json::Error> {
        serde_json::from_value(json)
    }

    #[test]
    fn a_well_formed_spec_is_checked_to_its_scopes() {
        let s = spec(serde_json::json!({
            "name": "agent-7",
            "scopes": ["submit", "read"],
            "tools": ["Files", "Db.query"],
            "group_prefix": "team-a/",
            "users": ["u1"],
        }))
        .unwrap();
        assert_eq!(s.check(), Ok([Scope::Submit, Scope::Read].into()));
    }

    #[test]
    fn every_malformed_spec_is_refused_by_name() {
        let refused = |json: serde_json::Value| spec(json).unwrap().check().unwrap_err();
        use serde_json::json;
        assert!(matches!(
            refused(json!({"name": "", "scopes": ["read"]})),
            SpecError::BadName(_)
        ));
        assert!(matches!(
            refused(json!({"name": "has space", "scopes": ["read"]})),
            SpecError::BadName(_)
        ));
        let long = "a".repeat(MAX_NAME_CHARS + 1);
        assert!(matches!(
            refused(json!({"name": long, "scopes": ["read"]})),
            SpecError::BadName(_)
        ));
        for reserved in ["anonymous", "ferry", "api-token", "mcp", "oxp"] {
            assert!(matches!(
                refused(json!({"name": reserved, "scopes": ["read"]})),
                SpecError::Reserved(_)
            ));
        }
        assert_eq!(
            refused(json!({"name": "a", "scopes": []})),
            SpecError::NoScopes
        );
        assert!(matches!(
            refused(json!({"name": "a", "scopes": ["root"]})),
            SpecError::UnknownScope(_)
        ));
        assert_eq!(
            refused(json!({"name": "a", "scopes": ["read"], "users": []})),
            SpecError::EmptyBound { field: "users" }
        );
        assert!(matches!(
            refused(json!({"name": "a", "scopes": ["read"], "tools": ["A.b.c"]})),
            SpecError::BadEntry { field: "tools", .. }
        ));
        assert!(matches!(
            refused(json!({"name": "a", "scopes": ["read"], "group_prefix": ""})),
            SpecError::BadEntry {
                field: "group_prefix",
                ..
            }
        ));
        let many: Vec<String> = (0..=MAX_BOUND_ENTRIES).map(|i| format!("u{i}")).collect();
        assert_eq!(
            refused(json!({"name": "a", "scopes": ["read"], "users": many})),
            SpecError::TooMany { field: "users" }
        );
        assert!(spec(json!({"name": "a", "scopes": ["read"], "extra": 1})).is_err());
    }

    #[test]
    fn the_stored_record_names_no_secret_and_round_trips() {
        let record = StoredToken {
            id: "tok_1".into(),
            name: "agent".into(),
            scopes: [Scope::Submit].into(),
            bounds: Bounds::default(),
            digest: digest_of("ferry_secret"),
            created_at: Timestamp::from_millis(1),
            created_by: "api-token".into(),
            revoked_at: None,
            revoked_by: None,
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["scopes"], serde_json::json!(["submit"]));
        assert!(json.get("tools").is_none());
        assert_eq!(serde_json::from_value::<StoredToken>(json).unwrap(), record);
        assert_eq!(record.digest.len(), 64);
        assert!(record.live());
        assert_eq!(record.identity().name(), "agent");
    }
}
