//! The toolset manifest a tool server publishes at
//! `/.well-known/rap-toolset` (`rap-3`, "Toolsets and discovery").

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A toolset manifest, as fetched. Validation (name lengths, tool names,
/// schemas) is the registry's job; this type only carries the shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub endpoint: String,
    pub tools: Vec<ToolDef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_migration: Option<bool>,
}

/// One tool of a manifest. `input_schema` stays a raw JSON value: it is
/// compiled by the registry, which reports what is wrong with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_script: Option<String>,
}

/// Tool annotations; custom `x-…` keys are kept in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Annotations {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_auth: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_running: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}
