//! Registered toolsets: discovery (`rap-3`), all-or-nothing validation, and
//! the in-memory index that resolves an `operation` to a tool.

mod discovery;
mod policy;
mod registry;
mod resolve;
mod validate;

use ferry_proto::rap::Manifest;
use ferry_proto::time::Timestamp;
use serde::{Deserialize, Serialize};

pub use discovery::{
    check_base_url, check_endpoint, read_manifest, redacted, with_credentials_of,
    without_credentials, DiscoveryError, MAX_MANIFEST_BYTES, NOT_A_MANIFEST,
};
pub use policy::{
    ApprovalMode, ApprovalPolicy, PolicyPatch, ToolPolicy, DEFAULT_APPROVAL_TIMEOUT_SECS,
};
pub use registry::{Registry, Resolved};
pub use resolve::{parse_version, OperationName, ResolveError};
pub use validate::{check_arguments, validate, ArgumentErrors, LoadedToolset};

/// A toolset as registered: what was fetched, from where, under which
/// version. Stored durably; the registry is rebuilt from these at start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredToolset {
    pub name: String,
    pub version: semver::Version,
    /// The tool server's base URL the manifest was fetched from.
    pub url: String,
    pub manifest: Manifest,
    pub registered_at: Timestamp,
    /// Ferry's approval policy for the toolset's tools.
    #[serde(default)]
    pub policy: ApprovalPolicy,
}

/// What "the latest version" means wherever a toolset's version is left
/// out: the greatest release, or the greatest pre-release when only
/// pre-releases are registered. A `2.0.0-beta` registered to try it out
/// beside `1.4.0` must not take over every call that names no version
/// (semver ranks it above `1.4.0`).
pub fn latest<'a>(
    versions: impl IntoIterator<Item = &'a semver::Version>,
) -> Option<&'a semver::Version> {
    latest_by(versions, |v| v)
}

/// The item of `items` (versions of one toolset) whose `version` is the
/// [`latest`].
pub fn latest_by<T>(
    items: impl IntoIterator<Item = T>,
    version: impl Fn(&T) -> &semver::Version,
) -> Option<T> {
    items.into_iter().max_by(|a, b| {
        let (a, b) = (version(a), version(b));
        (a.pre.is_empty(), a).cmp(&(b.pre.is_empty(), b))
    })
}

/// The name and schema of the built-in tool that cancels a subscription.
pub const CANCEL_SUBSCRIPTION: &str = "cancel_subscription";

/// The built-in tool's schema, compiled once.
pub fn cancel_subscription_validator() -> &'static jsonschema::Validator {
    static VALIDATOR: std::sync::OnceLock<jsonschema::Validator> = std::sync::OnceLock::new();
    VALIDATOR.get_or_init(|| {
        jsonschema::validator_for(&cancel_subscription_schema()).expect("built-in schema compiles")
    })
}

pub fn cancel_subscription_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {"tool_call_id": {"type": "string", "minLength": 1}},
        "required": ["tool_call_id"],
        "additionalProperties": false
    })
}

#[cfg(test)]
mod tests {
    use super::latest;
    use semver::Version;

    #[test]
    fn the_latest_is_the_greatest_release_before_any_pre_release() {
        let of = |versions: &[&str]| {
            let parsed: Vec<Version> = versions
                .iter()
                .map(|v| Version::parse(v).unwrap())
                .collect();
            latest(&parsed).map(Version::to_string)
        };
        assert_eq!(
            of(&["1.0.0", "2.0.0-beta.1", "1.4.0", "1.5.0-rc.1"]).as_deref(),
            Some("1.4.0")
        );
        assert_eq!(
            of(&["2.0.0-alpha", "2.0.0-beta"]).as_deref(),
            Some("2.0.0-beta")
        );
        assert_eq!(of(&["1.0.0", "2.0.0"]).as_deref(), Some("2.0.0"));
        assert_eq!(of(&[]), None);
    }
}
