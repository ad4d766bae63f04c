//! The in-memory index of loaded toolsets, rebuilt from the store at start.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use ferry_proto::api::ToolTarget;
use jsonschema::Validator;
use semver::Version;

use super::discovery::{with_credentials_of, without_credentials};
use super::resolve::{OperationName, ResolveError};
use super::{LoadedToolset, StoredToolset};

type Toolsets = BTreeMap<String, BTreeMap<Version, Arc<LoadedToolset>>>;

/// Toolsets by name, then version.
#[derive(Default)]
pub struct Registry {
    toolsets: RwLock<Toolsets>,
    /// The registered URL of each tool server whose URL has a user name or
    /// password, by its URL without them (as a call's target records it).
    credentials: RwLock<HashMap<String, String>>,
}

/// A resolved tool, ready to validate arguments and dispatch.
pub struct Resolved {
    /// `Toolset.tool@version`.
    pub qualified: String,
    /// The toolset's name.
    pub toolset: String,
    pub target: ToolTarget,
    pub validator: Arc<Validator>,
    /// Seconds a call waits for approval, if the tool is gated.
    pub approval_timeout: Option<u64>,
    /// The toolset's own rate limits.
    pub rate_limits: crate::limits::RateLimits,
}

impl Registry {
    pub fn insert(&self, toolset: LoadedToolset) {
        let mut all = self.toolsets.write().expect("registry lock");
        let s = &toolset.stored;
        all.entry(s.name.clone())
            .or_default()
            .insert(s.version.clone(), Arc::new(toolset));
        self.credentials_of(&all);
    }

    /// Makes `toolsets` the whole registry, at once: a toolset another
    /// process deleted leaves this one too.
    pub fn replace(&self, toolsets: Vec<LoadedToolset>) {
        let mut fresh: BTreeMap<String, BTreeMap<Version, Arc<LoadedToolset>>> = BTreeMap::new();
        for toolset in toolsets {
            let s = &toolset.stored;
            fresh
                .entry(s.name.clone())
                .or_default()
                .insert(s.version.clone(), Arc::new(toolset));
        }
        let mut all = self.toolsets.write().expect("registry lock");
        *all = fresh;
        self.credentials_of(&all);
    }

    /// Removes one version, or all versions when `version` is `None`.
    /// Returns what was removed.
    pub fn remove(&self, name: &str, version: Option<&Version>) -> Vec<StoredToolset> {
        let mut all = self.toolsets.write().expect("registry lock");
        let Some(versions) = all.get_mut(name) else {
            return vec![];
        };
        let removed: Vec<_> = match version {
            Some(v) => versions.remove(v).into_iter().collect(),
            None => std::mem::take(versions).into_values().collect(),
        };
        if versions.is_empty() {
            all.remove(name);
        }
        self.credentials_of(&all);
        removed.into_iter().map(|t| t.stored.clone()).collect()
    }

    /// Indexes the credentials of `all`, under its write lock so that the
    /// index never lags the toolsets. A tool server registered under more
    /// than one toolset with different credentials is sent those of the
    /// last by name, then version.
    fn credentials_of(&self, all: &Toolsets) {
        let credentials = all
            .values()
            .flat_map(|versions| versions.values())
            .filter_map(|t| {
                let bare = without_credentials(&t.stored.url);
                (bare != t.stored.url).then(|| (bare, t.stored.url.clone()))
            })
            .collect();
        *self.credentials.write().expect("registry lock") = credentials;
    }

    /// `url` on the tool server at `base_url` (a call's target, which holds
    /// no credentials) as it is sent: with the user name and password the
    /// server was registered with, while a toolset at that URL is
    /// registered. A target recorded with its credentials keeps them.
    pub fn authorised(&self, base_url: &str, url: &str) -> String {
        let credentials = self.credentials.read().expect("registry lock");
        match credentials.get(base_url) {
            Some(registered) => with_credentials_of(url, registered),
            None => url.to_owned(),
        }
    }

    /// Every registered toolset, by name then version.
    pub fn list(&self) -> Vec<Arc<LoadedToolset>> {
        let all = self.toolsets.read().expect("registry lock");
        all.values().flat_map(|v| v.values().cloned()).collect()
    }

    /// One toolset: the given version, or the latest.
    pub fn get(&self, name: &str, version: Option<&Version>) -> Option<Arc<LoadedToolset>> {
        let all = self.toolsets.read().expect("registry lock");
        let versions = all.get(name)?;
        match version {
            Some(v) => versions.get(v).cloned(),
            None => versions.get(super::latest(versions.keys())?).cloned(),
        }
    }

    /// Toolsets (latest versions) that define a tool named `tool`: more than
    /// one means the bare name is ambiguous.
    pub fn defining(&self, tool: &str) -> Vec<String> {
        let all = self.toolsets.read().expect("registry lock");
        all.iter()
            .filter(|(_, versions)| {
                super::latest(versions.keys())
                    .and_then(|v| versions.get(v))
                    .is_some_and(|t| t.validators.contains_key(tool))
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    pub fn resolve(&self, operation: &str) -> Result<Resolved, ResolveError> {
        let unknown = || ResolveError::Unknown(operation.to_owned());
        let (toolset, tool) = match OperationName::parse(operation)? {
            OperationName::Bare(tool) => {
                let defining = self.defining(tool);
                match defining.as_slice() {
                    [] => return Err(unknown()),
                    [one] => (self.get(one, None).ok_or_else(unknown)?, tool),
                    _ => {
                        return Err(ResolveError::Ambiguous {
                            name: tool.to_owned(),
                            toolsets: defining,
                        })
                    }
                }
            }
            OperationName::Qualified {
                toolset,
                tool,
                version,
            } => (
                self.get(toolset, version.as_ref()).ok_or_else(unknown)?,
                tool,
            ),
        };
        let validator = toolset.validators.get(tool).ok_or_else(unknown)?.clone();
        let s = &toolset.stored;
        let def = s
            .manifest
            .tools
            .iter()
            .find(|t| t.name == tool)
            .ok_or_else(unknown)?;
        let approval_timeout = s.policy.gate(def);
        Ok(Resolved {
            qualified: format!("{}.{}@{}", s.name, tool, s.version),
            toolset: s.name.clone(),
            target: ToolTarget {
                tool_name: tool.to_owned(),
                // Every reader of the thread sees the target: the
                // credentials are added at send (`authorised`).
                base_url: without_credentials(&s.url),
                endpoint: without_credentials(&s.manifest.endpoint),
            },
            validator,
            approval_timeout,
            rate_limits: s.policy.rate_limits,
        })
    }
}
