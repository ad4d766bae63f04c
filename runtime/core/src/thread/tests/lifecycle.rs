//! A call's way from acceptance to its outcome: results, duplicates,
//! cancels, dispatch failures, retries, closing the thread, and the fold of
//! the log.

use super::*;

#[test]
fn a_call_runs_to_completion_and_numbers_its_events() {
    let state = check(vec![
        (
            Command::Submit(new_call("c", json!({"text": "hi"}))),
            Ok(&["call_accepted"]),
        ),
        (
            Command::DispatchAcked {
                id: "c".into(),
                attempts: 3,
            },
            Ok(&["call_dispatched"]),
        ),
        (result("c", "hi", false), Ok(&["tool_result"])),
    ]);
    assert_eq!(status(&state, "c"), CallStatus::Completed);
    assert_eq!(state.calls["c"].attempts, 3);
    assert_eq!(state.meta.last_seq, 3);
    assert_eq!(state.meta.counts.get(&CallStatus::Completed), Some(&1));
    assert_eq!(state.meta.counts.get(&CallStatus::Queued), Some(&0));
}

/// What recovery walks: a call is unsettled from its acceptance until
/// nothing is owed, including a user's answer the tool has not taken.
#[test]
fn unsettled_calls_are_those_ferry_still_owes_something() {
    let choice = user_choice("u");
    let state = check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (
            Command::Submit(new_call("u", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("c", "done", false), Ok(&["tool_result"])),
        (choice, Ok(&["user_choice"])),
        (
            Command::Choose {
                id: "u".into(),
                answer: Answer::Index(1),
            },
            Ok(&["choice_made"]),
        ),
    ]);
    assert_eq!(status(&state, "u"), CallStatus::Dispatched);
    assert_eq!(
        state.meta.unsettled,
        ["u".to_owned()].into(),
        "its answer is owed"
    );
    // The tool's result ends what it was owed: it waits for no answer.
    let mut done = state.clone();
    let finished = decide(&done, &result("u", "done", false)).unwrap();
    apply(&mut done, AT, finished.changes);
    assert_eq!(status(&done, "u"), CallStatus::Completed);
    assert_eq!(done.calls["u"].undelivered_choice, None);
    assert!(done.meta.unsettled.is_empty());
    let answer = state.calls["u"].undelivered_choice.clone().unwrap();
    // The delivery of another answer settles nothing: an older one, late,
    // even if it picked the same choice on the same `response_url`.
    let older = ChoiceAnswer {
        seq: answer.seq - 1,
        ..answer.clone()
    };
    let late = Command::ChoiceDelivered {
        id: "u".into(),
        answer: older,
    };
    assert_eq!(decide(&state, &late).unwrap().outcome, Outcome::Duplicate);
    let mut delivered = state.clone();
    let command = Command::ChoiceDelivered {
        id: "u".into(),
        answer: answer.clone(),
    };
    let changes = decide(&delivered, &command).unwrap();
    apply(&mut delivered, AT, changes.changes);
    assert_eq!(delivered.calls["u"].undelivered_choice, None);
    assert!(
        delivered.meta.unsettled.contains("u"),
        "it waits for the result"
    );
    // A tool that refuses the answer (a 4xx) is not owed it any more, and
    // hearing so twice records nothing.
    let refused = Command::ChoiceRefused {
        id: "u".into(),
        answer,
        status: 410,
    };
    let mut state = state;
    let changes = decide(&state, &refused).unwrap();
    assert_eq!(
        changes.changes[0].kind,
        EventKind::ChoiceRefused { status: 410 }
    );
    apply(&mut state, AT, changes.changes);
    assert_eq!(state.calls["u"].undelivered_choice, None);
    assert_eq!(status(&state, "u"), CallStatus::Dispatched);
    assert_eq!(
        decide(&state, &refused).unwrap().outcome,
        Outcome::Duplicate
    );
}

#[test]
fn a_cancelled_call_owes_its_tool_no_answer() {
    let choice = user_choice("u");
    let state = check(vec![
        (
            Command::Submit(new_call("u", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (choice, Ok(&["user_choice"])),
        (
            Command::Choose {
                id: "u".into(),
                answer: Answer::Index(1),
            },
            Ok(&["choice_made"]),
        ),
        (Command::Cancel { id: "u".into() }, Ok(&["call_cancelled"])),
    ]);
    assert_eq!(state.calls["u"].undelivered_choice, None);
    assert!(state.meta.unsettled.is_empty());
}

#[test]
fn resubmission_is_idempotent_and_a_different_body_conflicts() {
    check(vec![
        (
            Command::Submit(new_call("c", json!({"a": 1}))),
            Ok(&["call_accepted"]),
        ),
        (Command::Submit(new_call("c", json!({"a": 1}))), Ok(&[])),
        (
            Command::Submit(new_call("c", json!({"a": 2}))),
            Err(Rejection::Conflict("c".into())),
        ),
    ]);
}

#[test]
fn duplicate_results_record_one_outcome() {
    check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("c", "one", false), Ok(&["tool_result"])),
        (result("c", "one", false), Ok(&[])),
        (result("c", "another", false), Ok(&[])),
        // The acknowledgement may be recorded after the result: one attempt
        // is already implied, so it adds nothing; more attempts do.
        (
            Command::DispatchAcked {
                id: "c".into(),
                attempts: 1,
            },
            Ok(&[]),
        ),
        (
            Command::DispatchAcked {
                id: "c".into(),
                attempts: 3,
            },
            Ok(&["call_dispatched"]),
        ),
    ]);
}

/// A late acknowledgement says so, so that views of the call's progress
/// (ACP) do not show a finished call running again; an ordinary one does
/// not.
#[test]
fn an_acknowledgement_after_the_result_is_marked_late() {
    let dispatched = |state: &ThreadState, attempts| {
        let ack = Command::DispatchAcked {
            id: "c".into(),
            attempts,
        };
        let changes = decide(state, &ack).unwrap().changes;
        match &changes[..] {
            [Change {
                kind: EventKind::CallDispatched { after_result, .. },
                ..
            }] => *after_result,
            other => panic!("{other:?}"),
        }
    };
    let mut state = check(vec![(
        Command::Submit(new_call("c", json!({}))),
        Ok(&["call_accepted"]),
    )]);
    assert!(!dispatched(&state, 1));
    let result = decide(&state, &result("c", "done", false)).unwrap();
    apply(&mut state, AT, result.changes);
    assert!(dispatched(&state, 2));
}

#[test]
fn results_for_unknown_calls_are_refused() {
    check(vec![(
        result("nope", "x", false),
        Err(Rejection::UnknownCall("nope".into())),
    )]);
}

#[test]
fn cancel_ends_pending_calls_and_later_results_are_ignored() {
    let state = check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (Command::Cancel { id: "c".into() }, Ok(&["call_cancelled"])),
        (result("c", "late", false), Ok(&[])),
        (
            Command::DispatchAcked {
                id: "c".into(),
                attempts: 1,
            },
            Ok(&[]),
        ),
        (
            Command::Cancel { id: "c".into() },
            Err(Rejection::Finished {
                id: "c".into(),
                status: CallStatus::Cancelled,
            }),
        ),
    ]);
    assert_eq!(status(&state, "c"), CallStatus::Cancelled);
    assert!(state.calls["c"].result.is_none());
}

#[test]
fn dispatch_failure_fails_only_a_queued_call() {
    let failed = |id: &str| Command::DispatchFailed {
        id: id.into(),
        attempts: 5,
        text: "Error: the tool could not be reached".into(),
    };
    let state = check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (failed("c"), Ok(&["tool_result"])),
        (result("c", "late", false), Ok(&[])),
        (
            Command::Submit(new_call("d", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("d", "fast", false), Ok(&["tool_result"])),
        (failed("d"), Ok(&[])),
    ]);
    assert_eq!(status(&state, "c"), CallStatus::Failed);
    assert!(state.calls["c"].result.as_ref().unwrap().is_error);
    assert_eq!(status(&state, "d"), CallStatus::Completed);
}

#[test]
fn oauth_waits_then_the_result_completes() {
    let oauth = oauth("c", "https://auth");
    let state = check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (oauth.clone(), Ok(&["oauth"])),
        (oauth, Ok(&[])),
    ]);
    assert_eq!(status(&state, "c"), CallStatus::AwaitingAuth);
    assert_eq!(state.calls["c"].auth_url.as_deref(), Some("https://auth"));
}

#[test]
fn a_closed_thread_refuses_calls() {
    check(vec![
        (Command::Close, Ok(&["thread_closed"])),
        (Command::Close, Ok(&[])),
        (
            Command::Submit(new_call("c", json!({}))),
            Err(Rejection::ThreadClosed),
        ),
    ]);
}

#[test]
fn lost_calls_fail_and_lost_subscriptions_end() {
    let state = check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (Command::Lost { id: "c".into() }, Ok(&["tool_result"])),
        (
            Command::Submit(new_call("s", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("s", "sub", true), Ok(&["tool_result"])),
        (
            Command::Lost { id: "s".into() },
            Ok(&["subscription_event"]),
        ),
        (Command::Lost { id: "s".into() }, Ok(&[])),
    ]);
    assert_eq!(status(&state, "c"), CallStatus::Failed);
    assert_eq!(
        state.calls["c"].result.as_ref().unwrap().text,
        LOST_CALL_TEXT
    );
    assert_eq!(status(&state, "s"), CallStatus::Completed);
    assert!(state.meta.active_subscriptions.is_empty());
}

#[test]
fn the_fold_of_the_log_rebuilds_the_state() {
    let mut live = ThreadState::new(G);
    let mut log = vec![];
    for command in [
        Command::Submit(new_call("c", json!({"x": 1}))),
        Command::DispatchAcked {
            id: "c".into(),
            attempts: 2,
        },
        result("c", "sub", true),
        sub_event("c", "1", false),
        keyed(sub_event("c", "2", false), "k1", "f1"),
        keyed(view("c", "diff", json!({"n": 1})), "k2", "f2"),
        Command::CancelSubscription { id: "c".into() },
        Command::Close,
    ] {
        let decision = decide(&live, &command).unwrap();
        log.extend(apply(&mut live, AT, decision.changes));
    }
    let mut replayed = ThreadState::new(G);
    for event in &log {
        evolve(&mut replayed, event);
    }
    assert_eq!(replayed, live);
    assert!(matches!(log[0].kind, EventKind::CallAccepted { .. }));
    assert_eq!(
        log.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6, 7, 8]
    );
    // The keys are in the events, and the call's keys are their fold.
    let carried: Vec<_> = log
        .iter()
        .filter_map(|e| e.idempotency_key.as_ref().map(|k| k.key.as_str()))
        .collect();
    assert_eq!(carried, ["k1", "k2"]);
    assert_eq!(keys(&replayed, "c"), ["k1", "k2"]);
}

#[test]
fn a_result_refused_for_its_size_ends_only_a_call_still_waiting() {
    let refused = |id: &str| Command::ResultRefused {
        id: id.into(),
        text: "Error: too large".into(),
    };
    let state = check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (refused("c"), Ok(&["tool_result"])),
        // Ended: neither it again nor the tool's own result changes it.
        (refused("c"), Ok(&[])),
        (result("c", "late", false), Ok(&[])),
        (
            Command::Submit(new_call("done", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("done", "fine", false), Ok(&["tool_result"])),
        (refused("done"), Ok(&[])),
        (
            Command::Submit(new_call("gone", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (
            Command::Cancel { id: "gone".into() },
            Ok(&["call_cancelled"]),
        ),
        (refused("gone"), Ok(&[])),
        (
            refused("ghost"),
            Err(Rejection::UnknownCall("ghost".into())),
        ),
    ]);
    assert_eq!(status(&state, "c"), CallStatus::Failed);
    let result = state.calls["c"].result.as_ref().unwrap();
    assert_eq!(
        (result.text.as_str(), result.is_error),
        ("Error: too large", true)
    );
    assert_eq!(status(&state, "done"), CallStatus::Completed);
    assert_eq!(status(&state, "gone"), CallStatus::Cancelled);
}

/// A retry whose tool no longer resolves is answered by the call already
/// here (same body) or refused (409, another body); with no such call it
/// is `UnknownCall`, and the engine keeps the original refusal.
#[test]
fn a_resubmission_is_answered_only_by_a_call_already_here() {
    let resubmit = |id: &str, text: &str| Command::Resubmit {
        id: id.into(),
        submission: new_call(id, json!({"text": text})).submission,
    };
    check(vec![
        (resubmit("a", "x"), Err(Rejection::UnknownCall("a".into()))),
        (
            Command::Submit(new_call("a", json!({"text": "x"}))),
            Ok(&["call_accepted"]),
        ),
        (resubmit("a", "x"), Ok(&[])),
        (resubmit("a", "y"), Err(Rejection::Conflict("a".into()))),
    ]);
}

/// Closing a thread ends what is open in it, in the order the calls were
/// accepted, before `thread_closed`: its tools are told the thread is over,
/// so a queued call must not reach them and nothing more will come for the
/// rest (else a subscription stays active for good, and queued calls are
/// dispatched after `/close_thread`). What already ended stays.
#[test]
fn closing_a_thread_ends_what_is_open_in_it() {
    let state = check(vec![
        (
            Command::Submit(new_call("done", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("done", "ok", false), Ok(&["tool_result"])),
        (
            Command::Submit(new_call("sub", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("sub", "on", true), Ok(&["tool_result"])),
        (
            Command::Submit(new_call("queued", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (
            gated("gated", None),
            Ok(&["call_accepted", "approval_requested"]),
        ),
        (
            Command::Close,
            Ok(&[
                "subscription_cancelled",
                "call_cancelled",
                "call_cancelled",
                "thread_closed",
            ]),
        ),
        (Command::Close, Ok(&[])),
        (
            sub_event("sub", "tick", false),
            Err(Rejection::SubscriptionGone("sub".into())),
        ),
        (result("queued", "late", false), Ok(&[])),
        (
            decide_as("gated", PermissionKind::AllowOnce),
            Err(Rejection::NotPendingApproval {
                id: "gated".into(),
                status: CallStatus::Cancelled,
            }),
        ),
    ]);
    assert_eq!(status(&state, "done"), CallStatus::Completed);
    for id in ["sub", "queued", "gated"] {
        assert_eq!(status(&state, id), CallStatus::Cancelled, "{id}");
    }
    assert!(state.meta.active_subscriptions.is_empty());
    assert!(state.meta.unsettled.is_empty());
    assert!(state.meta.closed);
}

#[test]
fn retries_are_recorded_once_each_and_only_while_the_call_waits_for_dispatch() {
    let retry = |id: &str, attempts| Command::DispatchRetrying {
        id: id.into(),
        attempts,
        reason: "the tool answered HTTP 503".into(),
        retry_in_ms: 200,
    };
    let state = check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (retry("c", 1), Ok(&["dispatch_retrying"])),
        // A redelivered report, or one older than what is recorded.
        (retry("c", 1), Ok(&[])),
        (retry("c", 2), Ok(&["dispatch_retrying"])),
        (retry("c", 1), Ok(&[])),
        (
            retry("nobody", 1),
            Err(Rejection::UnknownCall("nobody".into())),
        ),
    ]);
    assert_eq!(status(&state, "c"), CallStatus::Queued);
    assert_eq!(state.calls["c"].attempts, 2);
    assert!(state.calls["c"].awaits_dispatch());
    // Acknowledged on the third attempt: a late report of a retry changes
    // nothing, nor does one after a cancel.
    let state = check_more(
        state,
        vec![
            (
                Command::DispatchAcked {
                    id: "c".into(),
                    attempts: 3,
                },
                Ok(&["call_dispatched"]),
            ),
            (retry("c", 4), Ok(&[])),
            (
                Command::Submit(new_call("d", json!({}))),
                Ok(&["call_accepted"]),
            ),
            (Command::Cancel { id: "d".into() }, Ok(&["call_cancelled"])),
            (retry("d", 1), Ok(&[])),
        ],
    );
    assert_eq!(state.calls["c"].attempts, 3);
    assert_eq!(state.calls["d"].attempts, 0);
}

/// A thread keeps the tool servers its calls were accepted for, once each:
/// they, and no others, are told when it closes. A built-in call has none,
/// and a resubmission adds none.
#[test]
fn a_thread_keeps_the_tool_servers_its_calls_were_accepted_for() {
    let on = |id: &str, base: &str| {
        let mut call = new_call(id, json!({}));
        call.target = Some(ToolTarget {
            tool_name: "echo".into(),
            base_url: base.into(),
            endpoint: format!("{base}/invoke"),
        });
        Command::Submit(call)
    };
    let mut built_in = new_call("builtin", json!({}));
    built_in.target = None;
    let state = check(vec![
        (on("a1", "http://a"), Ok(&["call_accepted"])),
        (on("a2", "http://a"), Ok(&["call_accepted"])),
        (on("b1", "http://b"), Ok(&["call_accepted"])),
        (Command::Submit(built_in), Ok(&["call_accepted"])),
        // The same call again, resolved meanwhile to another server: the
        // call already here answers it, and records nothing.
        (on("a1", "http://c"), Ok(&[])),
    ]);
    let servers: Vec<&str> = state.meta.tool_servers.iter().map(String::as_str).collect();
    assert_eq!(servers, ["http://a", "http://b"]);
}

/// Thread metadata stored before it kept its tool servers decodes, with
/// none; one without any stores none.
#[test]
fn thread_metadata_without_tool_servers_decodes() {
    let meta = ThreadMeta {
        group_id: G.into(),
        ..ThreadMeta::default()
    };
    let stored = serde_json::to_value(&meta).unwrap();
    assert!(stored.get("tool_servers").is_none(), "{stored}");
    let read: ThreadMeta = serde_json::from_value(stored).unwrap();
    assert_eq!(read, meta);
}
