//! OXP tool ids (`Toolkit.Tool@x.y.z`) for Ferry's tools, and back.
//!
//! OXP ids allow only `[A-Za-z0-9_]` in each part, while Ferry toolset names
//! may hold any character but `@` and tool names may hold `-`. The mapping
//! rule (documented in README.md): a name made only of `[A-Za-z0-9_]` is
//! used as is; any other name has each other character replaced by `_` and
//! gets `_` plus the first 8 hex digits of the SHA-256 of the original name
//! appended, so two names never merge silently (`my-tools` →
//! `my_tools_<hash>`, distinct from a toolset really named `my_tools`).
//! Should two tools still map to one id, neither is served under it and a
//! warning is logged. A tool's OXP `name` is `Toolkit_Tool`; where two
//! tools would share one (`a_b.echo` and `a.b_echo`), each gets its id's
//! hash appended, so a model never sees two functions of one name. Versions with pre-release or build parts cannot be
//! written in an OXP id and are not served over OXP.

use std::collections::{BTreeMap, HashMap, HashSet};

use semver::Version;

use crate::engine::RegisteredToolset;

/// The longest OXP tool `name` (`^[A-Za-z0-9_-]{1,64}$`).
const MAX_NAME: usize = 64;

fn fits(part: &str) -> bool {
    !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn short_hash(text: &str) -> String {
    crate::digest::sha256_hex(text, 4)
}

/// One part of an OXP id for a Ferry toolset or tool name.
pub fn oxp_part(name: &str) -> String {
    if fits(name) {
        return name.to_owned();
    }
    let replaced: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{replaced}_{}", short_hash(name))
}

/// The OXP `name` of a tool: `Toolkit_Tool`, shortened with a hash when it
/// would pass 64 characters.
fn oxp_name(toolkit: &str, tool: &str) -> String {
    let name = format!("{toolkit}_{tool}");
    if name.len() <= MAX_NAME {
        return name;
    }
    format!("{}_{}", &name[..MAX_NAME - 9], short_hash(&name))
}

/// The `name` of tool `key` when another tool's would be the same: its
/// id's hash appended.
fn distinct_name(name: &str, (toolkit, tool): &(String, String)) -> String {
    let hash = short_hash(&format!("{toolkit}.{tool}"));
    let keep = name.len().min(MAX_NAME - 9);
    format!("{}_{hash}", &name[..keep])
}

/// One servable tool version.
#[derive(Debug, Clone)]
pub struct OxpTool {
    /// `Toolkit.Tool@x.y.z`.
    pub id: String,
    pub name: String,
    pub description: String,
    pub version: Version,
    pub input_schema: serde_json::Value,
    /// Ferry's own names, for the native `operation`.
    pub toolset: String,
    pub tool: String,
}

impl OxpTool {
    /// The native operation naming exactly this version.
    pub fn operation(&self) -> String {
        format!("{}.{}@{}", self.toolset, self.tool, self.version)
    }
}

/// Every servable tool by `(Toolkit, Tool)`, then version.
#[derive(Debug, Default)]
pub struct Index {
    tools: BTreeMap<(String, String), BTreeMap<Version, OxpTool>>,
}

/// Why an OXP tool id did not resolve.
#[derive(Debug, thiserror::Error)]
pub enum NotFound {
    #[error("Tool '{0}' was not found")]
    Tool(String),
    #[error("Tool '{tool}' has no version {version}")]
    Version {
        tool: String,
        version: Version,
        available: Vec<String>,
    },
}

impl Index {
    pub fn build(toolsets: &[RegisteredToolset]) -> Self {
        let mut index = Index::default();
        let mut clashes = HashSet::new();
        for toolset in toolsets {
            let v = &toolset.version;
            if !v.pre.is_empty() || !v.build.is_empty() {
                continue;
            }
            let toolkit = oxp_part(&toolset.name);
            for tool in &toolset.tools {
                let part = oxp_part(&tool.name);
                let key = (toolkit.clone(), part.clone());
                let entry = OxpTool {
                    id: format!("{toolkit}.{part}@{v}"),
                    name: oxp_name(&toolkit, &part),
                    description: tool.description.clone(),
                    version: v.clone(),
                    input_schema: tool.input_schema.clone(),
                    toolset: toolset.name.clone(),
                    tool: tool.name.clone(),
                };
                let versions = index.tools.entry(key.clone()).or_default();
                if let Some(other) = versions.get(v) {
                    if other.toolset != entry.toolset || other.tool != entry.tool {
                        tracing::warn!(id = ?entry.id, a = ?other.operation(), b = ?entry.operation(),
                            "two tools map to one OXP id; neither is served under it");
                        clashes.insert((key, v.clone()));
                    }
                    continue;
                }
                versions.insert(v.clone(), entry);
            }
        }
        for (key, v) in clashes {
            if let Some(versions) = index.tools.get_mut(&key) {
                versions.remove(&v);
            }
        }
        index.tools.retain(|_, versions| !versions.is_empty());
        let mut named: HashMap<String, usize> = HashMap::new();
        for versions in index.tools.values() {
            for name in versions.values().map(|t| &t.name).collect::<HashSet<_>>() {
                *named.entry(name.clone()).or_default() += 1;
            }
        }
        for (key, versions) in &mut index.tools {
            for tool in versions.values_mut() {
                if named[&tool.name] > 1 {
                    tool.name = distinct_name(&tool.name, key);
                }
            }
        }
        index
    }

    /// Every servable tool, by id.
    pub fn all(&self) -> impl Iterator<Item = &OxpTool> {
        self.tools.values().flat_map(|v| v.values())
    }

    /// Resolves a pattern-checked id by the OXP rules: `@x.y.z` exact, `@x`
    /// means `x.0.0`, no version the latest.
    pub fn resolve(&self, tool_id: &str) -> Result<&OxpTool, NotFound> {
        let id = ToolId::parse(tool_id);
        let name = id.name();
        let versions = self
            .tools
            .get(&(id.toolkit.to_owned(), id.tool.to_owned()))
            .ok_or_else(|| NotFound::Tool(name.clone()))?;
        let wanted = match id.version {
            None => {
                return crate::toolsets::latest(versions.keys())
                    .and_then(|v| versions.get(v))
                    .ok_or(NotFound::Tool(name));
            }
            Some(Some(wanted)) => wanted,
            Some(None) => return Err(NotFound::Tool(tool_id.to_owned())),
        };
        versions.get(&wanted).ok_or_else(|| NotFound::Version {
            tool: name,
            version: wanted.clone(),
            available: versions.keys().map(Version::to_string).collect(),
        })
    }
}

/// A pattern-checked OXP tool id, in parts.
struct ToolId<'a> {
    toolkit: &'a str,
    tool: &'a str,
    /// `None` without `@`; `Some(None)` for a version that is no number.
    version: Option<Option<Version>>,
}

impl<'a> ToolId<'a> {
    fn parse(tool_id: &'a str) -> Self {
        let (name, version) = match tool_id.split_once('@') {
            Some((name, v)) => (name, Some(v)),
            None => (tool_id, None),
        };
        let (toolkit, tool) = name.split_once('.').unwrap_or((name, ""));
        // OXP's `x` and `x.y.z` are integers, so `01.0.0` is `1.0.0`
        // (semver's own parser refuses leading zeros).
        let version = version.map(|v| {
            let numbers: Result<Vec<u64>, _> = v.split('.').map(str::parse).collect();
            match numbers.as_deref() {
                Ok(&[major]) => Some(Version::new(major, 0, 0)),
                Ok(&[major, minor, patch]) => Some(Version::new(major, minor, patch)),
                _ => None,
            }
        });
        ToolId {
            toolkit,
            tool,
            version,
        }
    }

    fn name(&self) -> String {
        format!("{}.{}", self.toolkit, self.tool)
    }
}

/// Whether `operation`, the native operation an OXP call was stored under
/// (`Toolset.tool@x.y.z`), is what `tool_id` names by OXP's naming rule,
/// whatever is registered now: a retry of that call then attaches to it
/// even after a newer version was registered or its own was removed.
pub fn names_operation(tool_id: &str, operation: &str) -> bool {
    let Ok(crate::toolsets::OperationName::Qualified {
        toolset,
        tool,
        version: Some(stored),
    }) = crate::toolsets::OperationName::parse(operation)
    else {
        return false;
    };
    let id = ToolId::parse(tool_id);
    oxp_part(toolset) == id.toolkit
        && oxp_part(tool) == id.tool
        && id.version.is_none_or(|wanted| wanted == Some(stored))
}

/// Whether `tool_id` matches OXP's `ToolId` pattern
/// `^[A-Za-z0-9_]+\.[A-Za-z0-9_]+(@([0-9]+|[0-9]+\.[0-9]+\.[0-9]+))?$`.
pub fn valid_tool_id(tool_id: &str) -> bool {
    let (name, version) = match tool_id.split_once('@') {
        Some((name, v)) => (name, Some(v)),
        None => (tool_id, None),
    };
    let name_ok = matches!(name.split_once('.'), Some((a, b)) if fits(a) && fits(b));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let version_ok = version.is_none_or(|v| {
        let parts: Vec<&str> = v.split('.').collect();
        matches!(parts.len(), 1 | 3) && parts.iter().all(|p| digits(p))
    });
    name_ok && version_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_operation_is_named_by_its_oxp_id_with_or_without_its_version() {
        assert!(names_operation("demo.echo", "demo.echo@1.2.0"));
        assert!(names_operation("demo.echo@1", "demo.echo@1.0.0"));
        assert!(names_operation("demo.echo@01.0.0", "demo.echo@1.0.0"));
        assert!(names_operation("demo.echo@1.2.0", "demo.echo@1.2.0"));
        assert!(!names_operation("demo.echo@1", "demo.echo@1.2.0"));
        assert!(!names_operation("demo.echo", "demo.other@1.0.0"));
        assert!(!names_operation("demo.echo", "other.echo@1.0.0"));
        let dashed = format!("{}.{}", oxp_part("my-tools"), oxp_part("look-up"));
        assert!(names_operation(&dashed, "my-tools.look-up@2.0.0"));
        assert!(!names_operation(
            "my_tools.look_up",
            "my-tools.look-up@2.0.0"
        ));
        // Not how OXP calls are stored: no version, or not qualified.
        assert!(!names_operation("demo.echo", "demo.echo"));
        assert!(!names_operation("demo.echo", "echo"));
    }

    #[test]
    fn names_that_fit_stay_and_others_never_merge() {
        assert_eq!(oxp_part("demo"), "demo");
        assert_eq!(oxp_part("pick_region"), "pick_region");
        let dashed = oxp_part("my-tools");
        assert!(dashed.starts_with("my_tools_") && fits(&dashed), "{dashed}");
        assert_ne!(dashed, oxp_part("my_tools"));
        assert_ne!(oxp_part("a.b"), oxp_part("a-b"));
        assert!(oxp_name(&"x".repeat(60), &"y".repeat(60)).len() <= MAX_NAME);
    }

    fn toolset(name: &str, tool: &str) -> RegisteredToolset {
        RegisteredToolset {
            name: name.into(),
            version: Version::new(1, 0, 0),
            url: String::new(),
            endpoint: String::new(),
            description: None,
            registered_at: ferry_proto::time::Timestamp::UNIX_EPOCH,
            policy: Default::default(),
            tools: vec![crate::engine::ToolView {
                name: tool.into(),
                qualified: format!("{name}.{tool}@1.0.0"),
                description: String::new(),
                input_schema: serde_json::json!({}),
                annotations: None,
                approval: crate::toolsets::ApprovalMode::Auto,
            }],
            available: vec![],
            unavailable: vec![],
        }
    }

    #[test]
    fn two_tools_never_share_a_name() {
        let index = Index::build(&[
            toolset("a_b", "echo"),
            toolset("a", "b_echo"),
            toolset("c", "d"),
        ]);
        let mut names: Vec<&str> = index.all().map(|t| t.name.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names.contains(&"c_d"), "{names:?}");
        for tool in index.all().filter(|t| t.name != "c_d") {
            assert!(tool.name.starts_with("a_b_echo_"), "{}", tool.name);
            assert!(tool.name.len() <= MAX_NAME && fits(&tool.name));
        }
        assert_eq!(index.resolve("a_b.echo").unwrap().toolset, "a_b");
        assert_eq!(index.resolve("a.b_echo").unwrap().toolset, "a");
    }

    #[test]
    fn versions_are_integers_so_leading_zeros_name_the_same_version() {
        let index = Index::build(&[toolset("c", "d")]);
        for id in ["c.d", "c.d@1", "c.d@01", "c.d@1.0.0", "c.d@01.00.000"] {
            assert_eq!(index.resolve(id).unwrap().toolset, "c", "{id}");
        }
        for id in ["c.d@2", "c.d@1.0.1", "c.d@99999999999999999999"] {
            assert!(index.resolve(id).is_err(), "{id}");
        }
    }

    #[test]
    fn tool_id_pattern() {
        for ok in ["A.b", "Calc.Add@1", "Calc.Add@1.0.0", "a_1.b_2@10.20.30"] {
            assert!(valid_tool_id(ok), "{ok}");
        }
        for bad in [
            "Add",
            "Calc.Add@1.0",
            "Calc.Add@",
            "Calc.Add@x",
            "a-b.c",
            "a.b.c",
            ".b",
            "a.",
            "a.b@1.2.3.4",
        ] {
            assert!(!valid_tool_id(bad), "{bad}");
        }
    }
}
