//! Registering, refreshing, listing and removing toolsets. Registration is
//! durable before it is answered, and all-or-nothing.

use ferry_proto::time::Timestamp;
use semver::Version;
use serde::Serialize;
use serde_json::Value;
use tracing::info;

use super::discovery::fetch_manifest;
use super::{now, Engine, Error};
use crate::identity::Identity;
use crate::toolsets::{
    self, ApprovalPolicy, DiscoveryError, LoadedToolset, PolicyPatch, StoredToolset,
};
use ferry_proto::audit::AuditKind;

/// A registered toolset as the API shows it: what it holds, and which of
/// its tools can be called by bare name.
#[derive(Debug, Clone, Serialize)]
pub struct RegisteredToolset {
    pub name: String,
    pub version: Version,
    pub url: String,
    pub endpoint: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub registered_at: Timestamp,
    /// Ferry's approval policy for these tools.
    pub policy: ApprovalPolicy,
    pub tools: Vec<ToolView>,
    /// Tools callable by bare name.
    pub available: Vec<String>,
    /// Tools whose bare name clashes with another toolset's, and why; they
    /// stay callable by qualified name.
    pub unavailable: Vec<Unavailable>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToolView {
    pub name: String,
    /// `Toolset.tool@version`: always callable.
    pub qualified: String,
    pub description: String,
    #[serde(rename = "inputSchema")]
    pub input_schema: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<ferry_proto::rap::Annotations>,
    /// `required` or `auto`, as the policy and annotations decide.
    pub approval: toolsets::ApprovalMode,
}

#[derive(Debug, Clone, Serialize)]
pub struct Unavailable {
    pub tool: String,
    pub reason: String,
}

impl Engine {
    /// Loads the registry from the store at start-up. A stored toolset that
    /// no longer validates is skipped with a warning rather than stopping
    /// start-up.
    pub async fn load_toolsets(&self) -> Result<Vec<StoredToolset>, Error> {
        // Read and replace under the writers' lock: a snapshot read before
        // a registration's write, applied after its insert, would take the
        // new version out of the registry until the next reload.
        let _writing = self.toolset_writes.lock().await;
        let stored = self.catalog.toolsets().await?;
        self.use_toolsets(stored.clone());
        Ok(stored)
    }

    /// Makes `stored` the registered toolsets (as read from the store, or
    /// a cluster node's copy of them while NATS is unreachable): one
    /// deleted elsewhere is gone here too.
    pub fn use_toolsets(&self, stored: Vec<StoredToolset>) {
        let loaded = stored
            .into_iter()
            .filter_map(|toolset| match toolsets::validate(toolset) {
                Ok(loaded) => Some(loaded),
                Err(problems) => {
                    tracing::warn!(?problems, "stored toolset no longer valid");
                    None
                }
            })
            .collect();
        self.registry.replace(loaded);
    }

    /// Fetches `{url}/.well-known/rap-toolset`, validates it, and registers
    /// it under `version` (default 1.0.0), replacing that version if present.
    /// Without a `policy`, a version already registered keeps its own (a
    /// restart's `--tool-server` must not ungate what a reviewer gated).
    pub async fn register_toolset(
        &self,
        by: &Identity,
        url: &str,
        version: Option<&str>,
        policy: Option<ApprovalPolicy>,
    ) -> Result<RegisteredToolset, Error> {
        let version = match version {
            Some(v) => Version::parse(v)
                .map_err(|e| Error::InvalidRequest(format!("version {v:?} is not semver: {e}")))?,
            None => Version::new(1, 0, 0),
        };
        // Semver gives build metadata no precedence: `1.0.0+b` beside
        // `1.0.0` would be two registrations of one version, and which is
        // the latest a tie-break of text.
        if !version.build.is_empty() {
            let plain = Version {
                build: semver::BuildMetadata::EMPTY,
                ..version.clone()
            };
            return Err(Error::InvalidRequest(format!(
                "version {version} has build metadata, which semver ranks as no version of its own: register it as {plain}"
            )));
        }
        let (url, manifest) = fetch_manifest(&self.outbound, url)
            .await
            .map_err(|e| match e {
                DiscoveryError::BadUrl(_) | DiscoveryError::Closed { .. } => {
                    Error::InvalidRequest(e.to_string())
                }
                DiscoveryError::Unreachable { .. } => Error::ToolsetUnreachable(e.to_string()),
                DiscoveryError::Invalid { .. } => Error::InvalidToolset(e.to_string()),
            })?;
        let _writing = self.toolset_writes.lock().await;
        // The stored policy, not this process's copy of it: in a cluster
        // another node may have changed it a moment ago.
        let policy = match policy {
            Some(policy) => {
                policy
                    .check_names(&manifest)
                    .map_err(Error::InvalidToolset)?;
                policy
            }
            None => self
                .catalog
                .toolsets()
                .await?
                .into_iter()
                .find(|t| t.name == manifest.name && t.version == version)
                .map(|t| t.policy)
                .unwrap_or_default(),
        };
        let stored = StoredToolset {
            name: manifest.name.clone(),
            version,
            url,
            manifest,
            registered_at: now(),
            policy,
        };
        let registered = self.install(stored).await?;
        self.audit_toolset(by, AuditKind::ToolsetRegistered, &registered, None)
            .await?;
        Ok(registered)
    }

    /// Changes the approval policy of one version, or of every version, of
    /// a toolset, without fetching it again.
    pub async fn set_policy(
        &self,
        by: &Identity,
        name: &str,
        version: Option<&Version>,
        patch: &PolicyPatch,
    ) -> Result<Vec<RegisteredToolset>, Error> {
        let _writing = self.toolset_writes.lock().await;
        let targets: Vec<_> = self
            .registry
            .list()
            .into_iter()
            .filter(|t| t.stored.name == name && version.is_none_or(|v| *v == t.stored.version))
            .collect();
        if targets.is_empty() {
            return Err(no_toolset(name, version));
        }
        // Every version checked before any is changed: a policy one of
        // them cannot take changes none.
        let mut checked = vec![];
        for target in targets {
            patch
                .check_names(&target.stored.manifest)
                .map_err(Error::InvalidToolset)?;
            let mut stored = target.stored.clone();
            stored.policy.apply(patch);
            checked.push(checked_toolset(stored)?);
        }
        let mut changed = vec![];
        for loaded in checked {
            // The policy as it now is, whole.
            let policy = serde_json::to_string(&loaded.stored.policy).ok();
            let registered = self.install_checked(loaded).await?;
            self.audit_toolset(by, AuditKind::PolicyChanged, &registered, policy)
                .await?;
            changed.push(registered);
        }
        Ok(changed)
    }

    /// Fetches a registered toolset again from where it came.
    pub async fn refresh_toolset(
        &self,
        by: &Identity,
        name: &str,
        version: Option<&Version>,
    ) -> Result<RegisteredToolset, Error> {
        let current = self
            .registry
            .get(name, version)
            .ok_or_else(|| no_toolset(name, version))?;
        let (url, manifest) = fetch_manifest(&self.outbound, &current.stored.url)
            .await
            .map_err(|e| match e {
                DiscoveryError::Invalid { .. } => Error::InvalidToolset(e.to_string()),
                // Stored URLs were checked when registered; kept total.
                DiscoveryError::BadUrl(_) | DiscoveryError::Closed { .. } => {
                    Error::InvalidRequest(e.to_string())
                }
                DiscoveryError::Unreachable { .. } => Error::ToolsetUnreachable(e.to_string()),
            })?;
        if manifest.name != name {
            return Err(Error::InvalidToolset(format!(
                "the server now publishes toolset {:?}, not {name:?}",
                manifest.name
            )));
        }
        // The policy as it is now, not as it was before the fetch: a PATCH
        // answered meanwhile must stand.
        let _writing = self.toolset_writes.lock().await;
        let version = current.stored.version.clone();
        let Some(current) = self.registry.get(name, Some(&version)) else {
            return Err(Error::NotFound(format!("no toolset {name:?}")));
        };
        let stored = StoredToolset {
            name: name.to_owned(),
            version,
            url,
            manifest,
            registered_at: now(),
            policy: current.stored.policy.clone(),
        };
        let registered = self.install(stored).await?;
        let refreshed = Some("fetched again".to_owned());
        self.audit_toolset(by, AuditKind::ToolsetRegistered, &registered, refreshed)
            .await?;
        Ok(registered)
    }

    /// Records a change of a toolset in the audit log, before it is
    /// answered.
    async fn audit_toolset(
        &self,
        by: &Identity,
        kind: AuditKind,
        toolset: &RegisteredToolset,
        detail: Option<String>,
    ) -> Result<(), Error> {
        let subject = format!("{}@{}", toolset.name, toolset.version);
        self.audit_change(by, kind, subject, detail).await
    }

    async fn install(&self, stored: StoredToolset) -> Result<RegisteredToolset, Error> {
        self.install_checked(checked_toolset(stored)?).await
    }

    async fn install_checked(&self, loaded: LoadedToolset) -> Result<RegisteredToolset, Error> {
        if self.lanes.is_none()
            && self.shared_lanes.is_none()
            && loaded.stored.policy.max_concurrent_calls.is_some()
        {
            return Err(Error::InvalidRequest(
                "max_concurrent_calls is not kept by this process".into(),
            ));
        }
        self.catalog.put_toolset(&loaded.stored).await?;
        let (name, version) = (loaded.stored.name.clone(), loaded.stored.version.clone());
        self.registry.insert(loaded);
        info!(toolset = ?name, %version, "toolset registered");
        let registered = self
            .registry
            .get(&name, Some(&version))
            .expect("just inserted");
        Ok(self.view(&registered))
    }

    /// Removes one version, or every version, of a toolset.
    pub async fn delete_toolset(
        &self,
        by: &Identity,
        name: &str,
        version: Option<&Version>,
    ) -> Result<usize, Error> {
        let _writing = self.toolset_writes.lock().await;
        let removed = self.registry.remove(name, version);
        if removed.is_empty() {
            return Err(no_toolset(name, version));
        }
        for toolset in &removed {
            self.catalog
                .delete_toolset(&toolset.name, &toolset.version)
                .await?;
            let subject = format!("{}@{}", toolset.name, toolset.version);
            self.audit_change(by, AuditKind::ToolsetRemoved, subject, None)
                .await?;
        }
        info!(toolset = name, versions = removed.len(), "toolset removed");
        Ok(removed.len())
    }

    pub fn toolsets(&self) -> Vec<RegisteredToolset> {
        self.registry.list().iter().map(|t| self.view(t)).collect()
    }

    /// The toolsets with only the tools `by` may call (a toolset left with
    /// none is left out): what each front lists to `by`, and what OXP
    /// resolves its tool ids against.
    pub fn toolsets_for(&self, by: &Identity) -> Vec<RegisteredToolset> {
        let mut visible = self.toolsets();
        if by.bounds().tools.is_none() {
            return visible;
        }
        for toolset in &mut visible {
            let name = toolset.name.clone();
            toolset.tools.retain(|t| by.may_call(&name, &t.name));
            toolset.available.retain(|t| by.may_call(&name, t));
        }
        visible.retain(|t| !t.tools.is_empty());
        visible
    }

    /// Every version of one toolset.
    pub fn toolset(&self, name: &str) -> Result<Vec<RegisteredToolset>, Error> {
        let found: Vec<_> = self
            .registry
            .list()
            .iter()
            .filter(|t| t.stored.name == name)
            .map(|t| self.view(t))
            .collect();
        if found.is_empty() {
            return Err(Error::NotFound(format!("no toolset {name:?}")));
        }
        Ok(found)
    }

    fn view(&self, loaded: &LoadedToolset) -> RegisteredToolset {
        let s = &loaded.stored;
        let latest = self
            .registry
            .get(&s.name, None)
            .is_some_and(|l| l.stored.version == s.version);
        let mut available = vec![];
        let mut unavailable = vec![];
        for tool in &s.manifest.tools {
            let defining = self.registry.defining(&tool.name);
            if tool.name == toolsets::CANCEL_SUBSCRIPTION {
                unavailable.push(Unavailable {
                    tool: tool.name.clone(),
                    reason: "the bare name is Ferry's built-in tool".into(),
                });
            } else if !latest {
                unavailable.push(Unavailable {
                    tool: tool.name.clone(),
                    reason: format!("bare names resolve to the latest version of {:?}", s.name),
                });
            } else if defining.len() > 1 {
                unavailable.push(Unavailable {
                    tool: tool.name.clone(),
                    reason: format!(
                        "bare name clashes across toolsets {defining:?}; call it as {}.{}",
                        s.name, tool.name
                    ),
                });
            } else {
                available.push(tool.name.clone());
            }
        }
        RegisteredToolset {
            name: s.name.clone(),
            version: s.version.clone(),
            url: toolsets::redacted(&s.url),
            endpoint: s.manifest.endpoint.clone(),
            description: s.manifest.description.clone(),
            registered_at: s.registered_at,
            policy: s.policy.clone(),
            tools: s
                .manifest
                .tools
                .iter()
                .map(|t| ToolView {
                    name: t.name.clone(),
                    qualified: format!("{}.{}@{}", s.name, t.name, s.version),
                    description: t.description.clone(),
                    input_schema: t.input_schema.clone(),
                    annotations: t.annotations.clone(),
                    approval: if s.policy.gate(t).is_some() {
                        toolsets::ApprovalMode::Required
                    } else {
                        toolsets::ApprovalMode::Auto
                    },
                })
                .collect(),
            available,
            unavailable,
        }
    }
}

/// A toolset validated for installing.
fn checked_toolset(stored: StoredToolset) -> Result<LoadedToolset, Error> {
    toolsets::validate(stored).map_err(|problems| Error::InvalidToolset(problems.join("; ")))
}

/// 404 for a toolset, naming the version asked for, if one was.
fn no_toolset(name: &str, version: Option<&Version>) -> Error {
    match version {
        Some(version) => Error::NotFound(format!("no toolset {name:?} at version {version}")),
        None => Error::NotFound(format!("no toolset {name:?}")),
    }
}
