//! A thread's log as both adapters keep it: one [`Commit`] per command,
//! holding the command's events, the thread's metadata after them, and the
//! calls the command loaded (as they are after it).
//!
//! A call's latest record is in the thread's *last* commit if that commit
//! carries it, else in a copy kept beside the log (the sled store keeps a
//! pointer to commit N instead, which holds the same record). Before a
//! writer appends commit N+1, it copies the calls of commit N that N+1 does
//! not carry ([`Commit::moved_on`]), so the copies lag only for the last
//! commit's calls, and readers take the last commit's version over a copy.
//! A call touched by consecutive commits (a call's usual life: accepted,
//! dispatched, answered) is copied once, when the thread moves on.

use std::collections::HashMap;

use ferry_proto::api::{Event, EventKind};
use serde::{Deserialize, Serialize};

use crate::Write;
use ferry_core::thread::{CallRecord, ThreadMeta, ThreadState};

/// One command's changes to a thread.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Commit {
    pub meta: ThreadMeta,
    pub calls: Vec<CallRecord>,
    pub events: Vec<Event>,
}

/// Only a commit's events: readers of a thread's events decode this and
/// skip the rest of each commit.
#[derive(Deserialize)]
pub struct CommitEvents {
    pub events: Vec<Event>,
}

/// A commit without its events, which decoding skips: what a thread's last
/// commit is kept as, and what finding a call in a commit needs.
#[derive(Deserialize)]
pub struct CommitHead {
    pub meta: ThreadMeta,
    pub calls: Vec<CallRecord>,
}

impl From<CommitHead> for Commit {
    fn from(head: CommitHead) -> Self {
        Self {
            meta: head.meta,
            calls: head.calls,
            events: vec![],
        }
    }
}

impl Commit {
    pub fn of(write: &Write<'_>) -> Self {
        Self {
            meta: write.state.meta.clone(),
            calls: write.state.calls.values().cloned().collect(),
            events: write.events.to_vec(),
        }
    }

    pub fn call(&self, id: &str) -> Option<&CallRecord> {
        self.calls.iter().find(|c| c.id == id)
    }

    /// The calls this commit hands to dispatch: accepted, or allowed by a
    /// decision, in this very commit, and waiting for dispatch after it.
    /// In a cluster such a commit is itself the workers' work item.
    pub fn dispatches(&self) -> impl Iterator<Item = &CallRecord> {
        self.calls.iter().filter(|call| {
            call.target.is_some()
                && call.awaits_dispatch()
                && self.events.iter().any(|e| {
                    e.id.as_deref() == Some(call.id.as_str())
                        && matches!(
                            e.kind,
                            EventKind::CallAccepted { .. } | EventKind::ApprovalDecided { .. }
                        )
                })
        })
    }

    /// This commit's calls that the next commit, which leaves the thread in
    /// `next`, does not carry: their copies must be written before it is.
    pub fn moved_on<'a>(
        &'a self,
        next: &'a HashMap<String, CallRecord>,
    ) -> impl Iterator<Item = &'a CallRecord> {
        self.calls.iter().filter(|c| !next.contains_key(&c.id))
    }

    /// The state a command starts from: this commit's metadata and the named
    /// calls, each from this commit if it carries it, else from `copy`.
    pub fn state<E>(
        last: Option<&Commit>,
        group_id: &str,
        call_ids: &[&str],
        mut copy: impl FnMut(&str) -> Result<Option<CallRecord>, E>,
    ) -> Result<ThreadState, E> {
        let mut state = ThreadState::new(group_id);
        if let Some(last) = last {
            state.meta = last.meta.clone();
        }
        for id in call_ids {
            let call = match last.and_then(|l| l.call(id)) {
                Some(call) => Some(call.clone()),
                None => copy(id)?,
            };
            if let Some(call) = call {
                state.calls.insert((*id).to_owned(), call);
            }
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::call;
    use ferry_proto::api::CallStatus;

    #[test]
    fn only_calls_the_next_commit_drops_are_copied() {
        let commit = Commit {
            meta: ThreadMeta::default(),
            calls: vec![call("a"), call("b")],
            events: vec![],
        };
        let next = HashMap::from([("b".to_owned(), call("b")), ("c".to_owned(), call("c"))]);
        let moved: Vec<_> = commit.moved_on(&next).map(|c| c.id.as_str()).collect();
        assert_eq!(moved, ["a"]);
    }

    #[test]
    fn the_last_commit_wins_over_a_copy() {
        let mut newer = call("a");
        newer.status = CallStatus::Completed;
        let commit = Commit {
            meta: ThreadMeta::default(),
            calls: vec![newer.clone()],
            events: vec![],
        };
        let state = Commit::state(Some(&commit), "g", &["a", "b", "x"], |id| {
            Ok::<_, ()>((id != "x").then(|| call(id)))
        })
        .unwrap();
        assert_eq!(state.calls["a"], newer);
        assert_eq!(state.calls["b"], call("b"));
        assert!(!state.calls.contains_key("x"));
    }
}
