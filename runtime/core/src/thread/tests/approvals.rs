//! Approval gates: one decision per call, rejections, standing grants and
//! what an ancestor's grant may decide.

use super::*;

#[test]
fn a_gated_call_waits_for_one_decision() {
    let state = check(vec![
        (
            gated("c", None),
            Ok(&["call_accepted", "approval_requested"]),
        ),
        (
            result("c", "too early", false),
            Err(Rejection::NotDispatched("c".into())),
        ),
        (
            decide_as("c", PermissionKind::AllowOnce),
            Ok(&["approval_decided"]),
        ),
        (
            decide_as("c", PermissionKind::RejectOnce),
            Err(Rejection::NotPendingApproval {
                id: "c".into(),
                status: CallStatus::Queued,
            }),
        ),
    ]);
    assert_eq!(status(&state, "c"), CallStatus::Queued);
    assert!(state.meta.grants.is_empty());
    assert_eq!(state.calls["c"].approval.as_ref().unwrap().reviewer, "ana");
}

#[test]
fn a_rejection_ends_the_call_with_an_error_result() {
    let state = check(vec![
        (
            gated("c", None),
            Ok(&["call_accepted", "approval_requested"]),
        ),
        (
            decide_as("c", PermissionKind::RejectOnce),
            Ok(&["approval_decided", "tool_result"]),
        ),
        (
            Command::DispatchAcked {
                id: "c".into(),
                attempts: 1,
            },
            Ok(&[]),
        ),
    ]);
    assert_eq!(status(&state, "c"), CallStatus::Rejected);
    let result = state.calls["c"].result.as_ref().unwrap();
    assert!(result.is_error && result.text.contains("rejected by a reviewer: looks fine"));
}

#[test]
fn standing_grants_apply_to_later_calls_until_revoked() {
    let state = check(vec![
        (
            gated("a", None),
            Ok(&["call_accepted", "approval_requested"]),
        ),
        (
            decide_as("a", PermissionKind::AllowAlways),
            Ok(&["approval_decided"]),
        ),
        (gated("b", None), Ok(&["call_accepted", "approval_decided"])),
        // This thread's own grant wins over an ancestor's.
        (
            gated("c", Some((PermissionKind::RejectAlways, "root"))),
            Ok(&["call_accepted", "approval_decided"]),
        ),
        (
            Command::Revoke {
                tool: "demo.echo".into(),
            },
            Ok(&["grant_revoked"]),
        ),
        (
            Command::Revoke {
                tool: "demo.echo".into(),
            },
            Err(Rejection::NoGrant("demo.echo".into())),
        ),
        (
            gated("d", None),
            Ok(&["call_accepted", "approval_requested"]),
        ),
        (
            gated("e", Some((PermissionKind::RejectAlways, "root"))),
            Ok(&["call_accepted", "approval_decided", "tool_result"]),
        ),
    ]);
    assert_eq!(status(&state, "b"), CallStatus::Queued);
    assert_eq!(
        state.calls["b"].approval.as_ref().unwrap().reviewer,
        "grant:thread"
    );
    assert_eq!(status(&state, "c"), CallStatus::Queued);
    assert_eq!(status(&state, "d"), CallStatus::PendingApproval);
    assert_eq!(status(&state, "e"), CallStatus::Rejected);
    assert_eq!(
        state.calls["e"].approval.as_ref().unwrap().reviewer,
        "grant:root"
    );
}

/// A call let through (or refused) by an ancestor's grant records who
/// decided (`grant:root`) but grants nothing here: the ancestor revoking or
/// changing its grant must reach this thread's next call, and this thread
/// must pass nothing of its own to its children (a copy would outlive the
/// revocation, and let a destructive tool run without approval).
#[test]
fn an_inherited_grant_is_applied_not_copied() {
    let state = check(vec![
        (
            gated("a", Some((PermissionKind::AllowAlways, "root"))),
            Ok(&["call_accepted", "approval_decided"]),
        ),
        (
            gated("b", Some((PermissionKind::RejectAlways, "root"))),
            Ok(&["call_accepted", "approval_decided", "tool_result"]),
        ),
        // The ancestor's grant is gone: the next call waits for a reviewer.
        (
            gated("c", None),
            Ok(&["call_accepted", "approval_requested"]),
        ),
    ]);
    assert!(state.meta.grants.is_empty(), "{:?}", state.meta.grants);
    assert_eq!(status(&state, "a"), CallStatus::Queued);
    assert_eq!(status(&state, "b"), CallStatus::Rejected);
}

/// A gate's grant is read before the thread's turn. Two first calls at
/// once, naming different ancestors: the one applied first gives the thread
/// its ancestors, and the other, whose grant was read for its own, must not
/// be decided by it (otherwise a call runs on such a grant, in 2 threads
/// of 60). Read for the ancestors the thread has, the grant decides.
#[test]
fn a_grant_read_for_other_ancestors_than_the_threads_decides_nothing() {
    let state = check(vec![
        (
            gated_under("a", None, Some(&["NG"]), Some(&["NG"])),
            Ok(&["call_accepted", "approval_requested"]),
        ),
        (
            gated_under(
                "b",
                Some((PermissionKind::AllowAlways, "PG")),
                Some(&["PG"]),
                Some(&["PG"]),
            ),
            Ok(&["call_accepted", "approval_requested"]),
        ),
        (
            gated_under(
                "c",
                Some((PermissionKind::AllowAlways, "NG")),
                Some(&["PG"]),
                Some(&["NG"]),
            ),
            Ok(&["call_accepted", "approval_decided"]),
        ),
    ]);
    assert_eq!(state.meta.ancestors, Some(vec!["NG".to_owned()]));
    assert_eq!(status(&state, "b"), CallStatus::PendingApproval);
    assert_eq!(status(&state, "c"), CallStatus::Queued);
}

#[test]
fn a_pending_approval_can_be_cancelled_and_then_not_decided() {
    let state = check(vec![
        (
            gated("c", None),
            Ok(&["call_accepted", "approval_requested"]),
        ),
        (Command::Cancel { id: "c".into() }, Ok(&["call_cancelled"])),
        (
            decide_as("c", PermissionKind::AllowOnce),
            Err(Rejection::NotPendingApproval {
                id: "c".into(),
                status: CallStatus::Cancelled,
            }),
        ),
    ]);
    // The deadline stays in the record: it tells the ACP front that Ferry
    // did ask (its answer to a late response is 409, not 404).
    assert!(state.calls["c"].approval_deadline.is_some());
}

/// A client's cancelled permission prompt cancels only a call still
/// waiting for approval: once decided, it is refused, not cancelled.
#[test]
fn a_withdrawn_prompt_cancels_only_a_call_pending_approval() {
    let withdraw = |id: &str| Command::Withdraw { id: id.into() };
    let state = check(vec![
        (
            gated("a", None),
            Ok(&["call_accepted", "approval_requested"]),
        ),
        (withdraw("a"), Ok(&["call_cancelled"])),
        (
            gated("b", None),
            Ok(&["call_accepted", "approval_requested"]),
        ),
        (
            decide_as("b", PermissionKind::AllowOnce),
            Ok(&["approval_decided"]),
        ),
        (
            withdraw("b"),
            Err(Rejection::NotPendingApproval {
                id: "b".into(),
                status: CallStatus::Queued,
            }),
        ),
    ]);
    assert_eq!(status(&state, "a"), CallStatus::Cancelled);
    assert_eq!(status(&state, "b"), CallStatus::Queued);
}
