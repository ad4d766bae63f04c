//! Who asks for a change: the identity a front authenticated, what it may
//! do (its scopes), and where (which threads, tools and users).
//!
//! A thread belongs to the identity whose call created it (its first
//! `call_accepted` names it). Its standing grants (`allow_always`) were
//! given to calls of that identity, so an identity that may act only in
//! its own threads may neither submit into another's thread nor name one
//! among its `thread_ancestors`: either would run gated calls on grants a
//! reviewer gave someone else. An identity bounded to a `group_id` prefix
//! is a tenant: it may act in every thread under its prefix (the agents of
//! one fleet carry on each other's threads), and in no other.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::thread::ThreadMeta;

/// What an identity may do. Each request needs one of them.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Submit calls, and cancel, answer and close what they started.
    Submit,
    /// Read threads, calls, events, streams and the tools it may call.
    Read,
    /// Decide approvals and revoke standing grants.
    Review,
    /// Register toolsets, set policies, manage tokens, read the audit log.
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Submit, Scope::Read, Scope::Review, Scope::Admin];

    pub fn name(self) -> &'static str {
        match self {
            Scope::Submit => "submit",
            Scope::Read => "read",
            Scope::Review => "review",
            Scope::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A scope name that is none of [`Scope::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scope {0:?}: the scopes are submit, read, review and admin")]
pub struct UnknownScope(pub String);

impl std::str::FromStr for Scope {
    type Err = UnknownScope;

    fn from_str(s: &str) -> Result<Self, UnknownScope> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.name() == s)
            .ok_or_else(|| UnknownScope(s.to_owned()))
    }
}

/// Where an identity may act, beyond its scopes. `None` bounds nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Bounds {
    /// The tools it may call and see: `Toolset` (each of its tools) or
    /// `Toolset.tool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<BTreeSet<String>>,
    /// The `group_id` prefix of every thread it may touch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_prefix: Option<String>,
    /// The users it acts for: a call's `user_id` must be one of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<BTreeSet<String>>,
}

impl Bounds {
    pub fn is_empty(&self) -> bool {
        self == &Bounds::default()
    }
}

/// A call's `user_id` that its identity may not claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserRefused {
    #[error("this credential acts for user(s) {allowed:?}, not {claimed:?}")]
    NotYours {
        claimed: String,
        allowed: Vec<String>,
    },
    #[error("this credential acts for several users ({0:?}): name one as user_id")]
    NameOne(Vec<String>),
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    name: String,
    reach: Reach,
    scopes: BTreeSet<Scope>,
    bounds: Arc<Bounds>,
}

/// The threads an identity may act in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Every thread: operators, Ferry itself, everyone when Ferry asks for
    /// no credentials at all, and named tokens that cannot submit
    /// (readers, reviewers), which own no threads.
    Everywhere,
    /// Threads this identity created, and new ones.
    OwnThreads,
    /// Threads whose `group_id` starts with the prefix: a tenant.
    Prefix(String),
}

impl Identity {
    /// The name of whoever reaches a Ferry that asks for no credentials.
    pub const ANONYMOUS: &'static str = "anonymous";
    /// The name Ferry acts under itself (approval timeouts, recovery).
    pub const FERRY: &'static str = "ferry";

    /// Without credentials configured, everyone is one identity that may
    /// do everything, as anyone who reaches the port could.
    pub fn anonymous() -> Self {
        Self::operator(Self::ANONYMOUS)
    }

    /// Ferry's own acts.
    pub fn ferry() -> Self {
        Self::operator(Self::FERRY)
    }

    /// An identity that may do everything, in every thread.
    pub fn operator(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            reach: Reach::Everywhere,
            scopes: Scope::ALL.into(),
            bounds: Arc::default(),
        }
    }

    /// An identity that submits and reads, bound to the threads it creates.
    pub fn agent(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            reach: Reach::OwnThreads,
            scopes: [Scope::Submit, Scope::Read].into(),
            bounds: Arc::default(),
        }
    }

    /// This identity, acting only for `user`, whom its credential names
    /// (an OXP JWT's `sub`): its calls' `user_id` is vouched for.
    pub fn acting_for(mut self, user: impl Into<String>) -> Self {
        let mut bounds = (*self.bounds).clone();
        bounds.users = Some([user.into()].into());
        self.bounds = Arc::new(bounds);
        self
    }

    /// A named token's identity. A prefix bounds its reach; without one, a
    /// token that may administer or cannot submit reaches every thread,
    /// and one that submits reaches only its own.
    pub fn bounded(name: impl Into<String>, scopes: BTreeSet<Scope>, bounds: Bounds) -> Self {
        let reach = match &bounds.group_prefix {
            Some(prefix) => Reach::Prefix(prefix.clone()),
            None if scopes.contains(&Scope::Admin) || !scopes.contains(&Scope::Submit) => {
                Reach::Everywhere
            }
            None => Reach::OwnThreads,
        };
        Self {
            name: name.into(),
            reach,
            scopes,
            bounds: Arc::new(bounds),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn reach(&self) -> &Reach {
        &self.reach
    }

    pub fn scopes(&self) -> &BTreeSet<Scope> {
        &self.scopes
    }

    pub fn bounds(&self) -> &Bounds {
        &self.bounds
    }

    /// Whether this identity holds `scope`.
    pub fn may(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope)
    }

    /// Whether this identity may act in (and read) thread `group_id`,
    /// whose state is `thread`: a new thread (no event yet) is anyone's to
    /// create within their reach. A thread whose first call named no
    /// identity (none was recorded then) is an operator's only.
    pub fn may_act_in(&self, group_id: &str, thread: &ThreadMeta) -> bool {
        match &self.reach {
            Reach::Everywhere => true,
            Reach::Prefix(prefix) => group_id.starts_with(prefix.as_str()),
            Reach::OwnThreads => {
                thread.last_seq == 0 || thread.owner.as_deref() == Some(self.name.as_str())
            }
        }
    }

    /// Whether thread `group_id` is within this identity's reach at all,
    /// before its state is read: false only outside a prefix.
    pub fn may_reach(&self, group_id: &str) -> bool {
        match &self.reach {
            Reach::Prefix(prefix) => group_id.starts_with(prefix.as_str()),
            Reach::Everywhere | Reach::OwnThreads => true,
        }
    }

    /// Whether this identity may call (and see) tool `tool` of `toolset`.
    pub fn may_call(&self, toolset: &str, tool: &str) -> bool {
        self.bounds.tools.as_ref().is_none_or(|tools| {
            tools.contains(toolset)
                || tools
                    .iter()
                    .any(|t| t.split_once('.') == Some((toolset, tool)))
        })
    }

    /// The `user_id` a call of this identity carries: the one it claims,
    /// if its identity may act for it; with no claim, its one user.
    pub fn user_for(&self, claimed: Option<&str>) -> Result<Option<String>, UserRefused> {
        let Some(users) = &self.bounds.users else {
            return Ok(claimed.map(str::to_owned));
        };
        let allowed = || users.iter().cloned().collect::<Vec<_>>();
        match claimed {
            Some(user) if users.contains(user) => Ok(Some(user.to_owned())),
            Some(user) => Err(UserRefused::NotYours {
                claimed: user.to_owned(),
                allowed: allowed(),
            }),
            None if users.len() == 1 => Ok(users.first().cloned()),
            None => Err(UserRefused::NameOne(allowed())),
        }
    }

    /// Whether the `user_id` of this identity's calls is vouched for by
    /// its credential rather than only claimed.
    pub fn vouches_for_users(&self) -> bool {
        self.bounds.users.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned_by(owner: Option<&str>, last_seq: u64) -> ThreadMeta {
        ThreadMeta {
            group_id: "g".into(),
            owner: owner.map(str::to_owned),
            last_seq,
            ..ThreadMeta::default()
        }
    }

    fn token(scopes: &[Scope], bounds: Bounds) -> Identity {
        Identity::bounded("t", scopes.iter().copied().collect(), bounds)
    }

    #[test]
    fn an_agent_acts_in_its_own_threads_and_new_ones_only() {
        let agent = Identity::agent("mcp");
        assert!(agent.may_act_in("g", &owned_by(None, 0)));
        assert!(agent.may_act_in("g", &owned_by(Some("mcp"), 3)));
        assert!(!agent.may_act_in("g", &owned_by(Some("oxp"), 3)));
        assert!(!agent.may_act_in("g", &owned_by(Some("MCP"), 3)));
        assert!(!agent.may_act_in("g", &owned_by(None, 3)));
        assert!(agent.may(Scope::Submit) && agent.may(Scope::Read));
        assert!(!agent.may(Scope::Review) && !agent.may(Scope::Admin));
    }

    #[test]
    fn an_operator_acts_everywhere() {
        for operator in [
            Identity::anonymous(),
            Identity::ferry(),
            Identity::operator("api-token"),
        ] {
            assert!(operator.may_act_in("g", &owned_by(Some("mcp"), 3)));
            assert!(operator.may_act_in("g", &owned_by(None, 3)));
            assert!(Scope::ALL.into_iter().all(|s| operator.may(s)));
            assert!(operator.may_call("Any", "tool"));
        }
    }

    #[test]
    fn a_prefix_is_a_tenant_and_reach_follows_the_scopes_without_one() {
        let prefixed = Bounds {
            group_prefix: Some("team-a/".into()),
            ..Bounds::default()
        };
        let tenant = token(&[Scope::Submit], prefixed.clone());
        assert!(tenant.may_act_in("team-a/1", &owned_by(Some("other"), 3)));
        assert!(tenant.may_act_in("team-a/new", &owned_by(None, 0)));
        assert!(!tenant.may_act_in("team-b/1", &owned_by(Some("t"), 3)));
        assert!(!tenant.may_reach("team-b/new"));
        let admin = token(&[Scope::Admin], prefixed);
        assert!(!admin.may_act_in("elsewhere", &owned_by(None, 0)));

        let submitter = token(&[Scope::Submit, Scope::Read], Bounds::default());
        assert_eq!(submitter.reach(), &Reach::OwnThreads);
        let reviewer = token(&[Scope::Read, Scope::Review], Bounds::default());
        assert_eq!(reviewer.reach(), &Reach::Everywhere);
        let admin = token(&[Scope::Submit, Scope::Admin], Bounds::default());
        assert_eq!(admin.reach(), &Reach::Everywhere);
    }

    #[test]
    fn tools_are_bounded_by_toolset_or_by_name() {
        let bounded = token(
            &[Scope::Submit],
            Bounds {
                tools: Some(["Files".into(), "Db.query".into()].into()),
                ..Bounds::default()
            },
        );
        assert!(bounded.may_call("Files", "read"));
        assert!(bounded.may_call("Db", "query"));
        assert!(!bounded.may_call("Db", "drop_table"));
        assert!(!bounded.may_call("Filesystem", "read"));
    }

    #[test]
    fn a_call_claims_only_the_users_its_credential_acts_for() {
        let one = token(
            &[Scope::Submit],
            Bounds {
                users: Some(["u1".into()].into()),
                ..Bounds::default()
            },
        );
        assert_eq!(one.user_for(Some("u1")), Ok(Some("u1".into())));
        assert_eq!(one.user_for(None), Ok(Some("u1".into())));
        assert!(matches!(
            one.user_for(Some("u2")),
            Err(UserRefused::NotYours { .. })
        ));
        let two = token(
            &[Scope::Submit],
            Bounds {
                users: Some(["u1".into(), "u2".into()].into()),
                ..Bounds::default()
            },
        );
        assert!(matches!(two.user_for(None), Err(UserRefused::NameOne(_))));
        assert_eq!(two.user_for(Some("u2")), Ok(Some("u2".into())));
        let free = Identity::agent("mcp");
        assert_eq!(free.user_for(Some("anyone")), Ok(Some("anyone".into())));
        assert_eq!(free.user_for(None), Ok(None));
        assert!(!free.vouches_for_users() && one.vouches_for_users());
    }

    #[test]
    fn scopes_are_named_on_the_wire() {
        assert_eq!("review".parse::<Scope>(), Ok(Scope::Review));
        assert_eq!(
            "Review".parse::<Scope>().unwrap_err().to_string(),
            "unknown scope \"Review\": the scopes are submit, read, review and admin"
        );
        assert_eq!(serde_json::to_string(&Scope::Admin).unwrap(), "\"admin\"");
    }
}
