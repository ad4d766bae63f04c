//! Ferry's approval policy for a toolset: set when it is registered (the
//! manifest belongs to the tool server, the policy to whoever runs Ferry).

use std::collections::BTreeMap;

use ferry_proto::rap::{Manifest, ToolDef};
use serde::{Deserialize, Serialize};

use crate::limits::RateLimits;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    Required,
    Auto,
}

/// Per-tool override.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalMode>,
}

/// Also the body of `PATCH /v1/toolsets/{name}`, hence no unknown fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalPolicy {
    /// The toolset-wide mode; when absent, tools annotated `destructive`
    /// require approval and the others do not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalMode>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolPolicy>,
    /// Seconds a gated call waits for a decision before it is rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout_secs: Option<u64>,
    /// Rate limits on calls to this toolset's tools, besides Ferry's own.
    #[serde(default, skip_serializing_if = "RateLimits::is_empty")]
    pub rate_limits: RateLimits,
    /// At most this many calls to one version of the toolset dispatched
    /// and not yet answered at once; the rest wait, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_calls: Option<u32>,
}

/// The largest `max_concurrent_calls` a policy may set.
pub const MAX_CONCURRENT_CALLS: u32 = 10_000;

/// The approval timeout when the policy names none: five minutes.
pub const DEFAULT_APPROVAL_TIMEOUT_SECS: u64 = 300;

/// The longest approval wait a policy may set: a year. A deadline is a
/// timestamp, and a far larger number of seconds has none.
pub const MAX_APPROVAL_TIMEOUT_SECS: u64 = 366 * 24 * 3600;

impl ApprovalPolicy {
    /// The timeout, in seconds, if calls to `tool` need approval. A per-tool
    /// setting wins, then the toolset's; by default only tools annotated
    /// `destructive: true` are gated (RAP asks runtimes to confirm them).
    pub fn gate(&self, tool: &ToolDef) -> Option<u64> {
        let destructive = tool
            .annotations
            .as_ref()
            .and_then(|a| a.destructive)
            .unwrap_or(false);
        let mode = self
            .tools
            .get(&tool.name)
            .and_then(|t| t.approval)
            .or(self.approval)
            .unwrap_or(if destructive {
                ApprovalMode::Required
            } else {
                ApprovalMode::Auto
            });
        (mode == ApprovalMode::Required).then(|| {
            self.approval_timeout_secs
                .unwrap_or(DEFAULT_APPROVAL_TIMEOUT_SECS)
        })
    }

    /// Checks the policy's own values, as stored policies are checked too.
    pub fn check(&self) -> Result<(), String> {
        self.rate_limits.check()?;
        if let Some(n) = self.max_concurrent_calls {
            if !(1..=MAX_CONCURRENT_CALLS).contains(&n) {
                return Err(format!(
                    "max_concurrent_calls must be 1 to {MAX_CONCURRENT_CALLS}, not {n}"
                ));
            }
        }
        match self.approval_timeout_secs {
            Some(0) => return Err("approval_timeout_secs must be at least 1".into()),
            Some(secs) if secs > MAX_APPROVAL_TIMEOUT_SECS => {
                return Err(format!(
                    "approval_timeout_secs must be at most {MAX_APPROVAL_TIMEOUT_SECS} (a year)"
                ))
            }
            _ => {}
        }
        Ok(())
    }

    /// Checks that every tool the policy names is in `manifest`: what an
    /// operator sets must govern a tool that exists. Only what is being
    /// set is checked: a stored entry may outlive a tool its server
    /// dropped, and it is kept (it applies again if the tool comes back,
    /// rather than leave that tool ungated) without refusing the refresh.
    pub fn check_names(&self, manifest: &Manifest) -> Result<(), String> {
        check_tool_names(self.tools.keys(), manifest)
    }

    /// Applies a change as a JSON merge patch (RFC 7396): a field given
    /// replaces this one, `null` removes it (back to the default), an
    /// absent one is kept; per-tool entries merge the same way.
    pub fn apply(&mut self, patch: &PolicyPatch) {
        if let Some(approval) = patch.approval {
            self.approval = approval;
        }
        if let Some(secs) = patch.approval_timeout_secs {
            self.approval_timeout_secs = secs;
        }
        if let Some(limits) = patch.rate_limits {
            self.rate_limits = limits.unwrap_or_default();
        }
        if let Some(n) = patch.max_concurrent_calls {
            self.max_concurrent_calls = n;
        }
        for (name, tool) in &patch.tools {
            match tool {
                Some(tool) => self.tools.insert(name.clone(), tool.clone()),
                None => self.tools.remove(name),
            };
        }
    }
}

/// The body of `PATCH /v1/toolsets/{name}`: each field absent (kept),
/// `null` (back to the default) or a value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyPatch {
    #[serde(default, deserialize_with = "present")]
    pub approval: Option<Option<ApprovalMode>>,
    #[serde(default)]
    pub tools: BTreeMap<String, Option<ToolPolicy>>,
    #[serde(default, deserialize_with = "present")]
    pub approval_timeout_secs: Option<Option<u64>>,
    /// Replaces the toolset's rate limits whole (`null`: none).
    #[serde(default, deserialize_with = "present")]
    pub rate_limits: Option<Option<RateLimits>>,
    #[serde(default, deserialize_with = "present")]
    pub max_concurrent_calls: Option<Option<u32>>,
}

/// A field that is present: `null` is `Some(None)`, so that it can be told
/// from an absent one (`None`, by `#[serde(default)]`).
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

impl PolicyPatch {
    /// Checks that every tool the patch sets is in `manifest` (see
    /// [`ApprovalPolicy::check_names`]); removing an entry needs no tool,
    /// so one left by a tool its server dropped can be removed too.
    pub fn check_names(&self, manifest: &Manifest) -> Result<(), String> {
        let set = self.tools.iter().filter(|(_, tool)| tool.is_some());
        check_tool_names(set.map(|(name, _)| name), manifest)
    }
}

/// Refuses the first of `names` that is not a tool of `manifest`.
fn check_tool_names<'a>(
    names: impl IntoIterator<Item = &'a String>,
    manifest: &Manifest,
) -> Result<(), String> {
    match names
        .into_iter()
        .find(|name| !manifest.tools.iter().any(|t| &t.name == *name))
    {
        Some(name) => Err(format!(
            "the policy names tool {name:?}, which toolset {:?} does not have",
            manifest.name
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::rap::Annotations;
    use serde_json::json;

    fn tool(name: &str, destructive: bool) -> ToolDef {
        ToolDef {
            name: name.into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
            annotations: destructive.then(|| Annotations {
                destructive: Some(true),
                ..Annotations::default()
            }),
            display_script: None,
        }
    }

    #[test]
    fn the_approval_timeout_is_a_second_to_a_year() {
        let with = |secs| ApprovalPolicy {
            approval_timeout_secs: Some(secs),
            ..Default::default()
        };
        assert!(with(0).check().is_err());
        assert!(with(1).check().is_ok());
        assert!(with(MAX_APPROVAL_TIMEOUT_SECS).check().is_ok());
        // u64::MAX seconds from now overflows the clock: refused, not a panic
        // at the first call.
        for secs in [MAX_APPROVAL_TIMEOUT_SECS + 1, u64::MAX] {
            assert!(with(secs).check().is_err(), "{secs}");
        }
    }

    #[test]
    fn who_wins() {
        let required = Some(ApprovalMode::Required);
        let auto = Some(ApprovalMode::Auto);
        let per_tool = |mode| BTreeMap::from([("t".to_owned(), ToolPolicy { approval: mode })]);
        let cases = [
            (ApprovalPolicy::default(), false, None),
            (ApprovalPolicy::default(), true, Some(300)),
            (
                ApprovalPolicy {
                    approval: auto,
                    ..Default::default()
                },
                true,
                None,
            ),
            (
                ApprovalPolicy {
                    approval: required,
                    approval_timeout_secs: Some(9),
                    ..Default::default()
                },
                false,
                Some(9),
            ),
            (
                ApprovalPolicy {
                    approval: required,
                    tools: per_tool(auto),
                    ..Default::default()
                },
                true,
                None,
            ),
            (
                ApprovalPolicy {
                    tools: per_tool(required),
                    ..Default::default()
                },
                false,
                Some(300),
            ),
        ];
        for (i, (policy, destructive, expected)) in cases.into_iter().enumerate() {
            assert_eq!(policy.gate(&tool("t", destructive)), expected, "case {i}");
        }
    }
}
