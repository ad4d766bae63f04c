//! Whose a thread is: the identity of the call that created it, recorded
//! in its log, never changed by later calls.

use super::*;
use crate::identity::Identity;

fn by(identity: &str, id: &str) -> Command {
    let mut call = new_call(id, json!({}));
    call.identity = identity.into();
    Command::Submit(call)
}

#[test]
fn the_first_call_makes_the_thread_its_identitys() {
    let state = check(vec![
        (by("mcp", "a"), Ok(&["call_accepted"])),
        // An operator's call later does not take the thread over.
        (by("api-token", "b"), Ok(&["call_accepted"])),
    ]);
    assert_eq!(state.meta.owner.as_deref(), Some("mcp"));
    assert_eq!(state.calls["a"].identity.as_deref(), Some("mcp"));
    assert_eq!(state.calls["b"].identity.as_deref(), Some("api-token"));
    assert!(Identity::agent("mcp").may_act_in("g", &state.meta));
    assert!(!Identity::agent("oxp").may_act_in("g", &state.meta));
}

#[test]
fn call_accepted_names_the_identity_that_submitted() {
    let state = check(vec![(by("oxp:ana", "a"), Ok(&["call_accepted"]))]);
    let EventKind::CallAccepted { identity, .. } = &decided_events(&by("oxp:ana", "x"))[0] else {
        panic!("not a call_accepted");
    };
    assert_eq!(identity.as_deref(), Some("oxp:ana"));
    assert_eq!(state.meta.owner.as_deref(), Some("oxp:ana"));
}

/// The events a command decides on a new thread.
fn decided_events(command: &Command) -> Vec<EventKind> {
    let state = ThreadState::new("g");
    decide(&state, command)
        .unwrap()
        .changes
        .into_iter()
        .map(|c| c.kind)
        .collect()
}
