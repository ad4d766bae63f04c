//! Who asks for a change: the identity a front authenticated, and which
//! threads it may act in.
//!
//! A thread belongs to the identity whose call created it (its first
//! `call_accepted` names it). Its standing grants (`allow_always`) were
//! given to calls of that identity, so an identity that may act only in
//! its own threads may neither submit into another's thread nor name one
//! among its `thread_ancestors`: either would run gated calls on grants a
//! reviewer gave someone else.

use crate::thread::ThreadMeta;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    name: String,
    reach: Reach,
}

/// The threads an identity may act in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Every thread: operators, Ferry itself, and everyone when Ferry asks
    /// for no credentials at all.
    Everywhere,
    /// Threads this identity created, and new ones.
    OwnThreads,
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

    /// An identity that may act in every thread.
    pub fn operator(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            reach: Reach::Everywhere,
        }
    }

    /// An identity bound to the threads it creates.
    pub fn agent(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            reach: Reach::OwnThreads,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn reach(&self) -> Reach {
        self.reach
    }

    /// Whether this identity may act in `thread`: a new thread (no event
    /// yet) is anyone's to create. A thread whose first call named no
    /// identity (none was recorded then) is an operator's only.
    pub fn may_act_in(&self, thread: &ThreadMeta) -> bool {
        match self.reach {
            Reach::Everywhere => true,
            Reach::OwnThreads => {
                thread.last_seq == 0 || thread.owner.as_deref() == Some(self.name.as_str())
            }
        }
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

    #[test]
    fn an_agent_acts_in_its_own_threads_and_new_ones_only() {
        let agent = Identity::agent("mcp");
        assert!(agent.may_act_in(&owned_by(None, 0)));
        assert!(agent.may_act_in(&owned_by(Some("mcp"), 3)));
        assert!(!agent.may_act_in(&owned_by(Some("oxp"), 3)));
        assert!(!agent.may_act_in(&owned_by(Some("MCP"), 3)));
        assert!(!agent.may_act_in(&owned_by(None, 3)));
    }

    #[test]
    fn an_operator_acts_everywhere() {
        for operator in [
            Identity::anonymous(),
            Identity::ferry(),
            Identity::operator("api-token"),
        ] {
            assert!(operator.may_act_in(&owned_by(Some("mcp"), 3)));
            assert!(operator.may_act_in(&owned_by(None, 3)));
        }
    }
}
