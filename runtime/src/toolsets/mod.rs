//! Registered toolsets: discovery (`rap-3`), all-or-nothing validation, and
//! the in-memory index that resolves an `operation` to a tool.

mod discovery;
mod policy;
mod registry;
mod resolve;
mod validate;

use ferry_proto::rap::Manifest;
use serde::{Deserialize, Serialize};

pub use discovery::{fetch_manifest, DiscoveryError};
pub use policy::{
    ApprovalMode, ApprovalPolicy, PolicyPatch, ToolPolicy, DEFAULT_APPROVAL_TIMEOUT_SECS,
};
pub use registry::{Registry, Resolved};
pub use resolve::{OperationName, ResolveError};
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
    pub registered_at: String,
    /// Ferry's approval policy for the toolset's tools.
    #[serde(default)]
    pub policy: ApprovalPolicy,
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
