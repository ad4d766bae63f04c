//! The state machine's rules, one scenario per test: a sequence of commands
//! and what each must answer.

use ferry_proto::api::{CallStatus, EventKind, ToolTarget};
use ferry_proto::idempotency::IdempotencyKey;
use ferry_proto::rap::{Callback, OAuth, SubscriptionEvent, ToolResult, ViewUpdate};
use ferry_proto::time::Timestamp;
use serde_json::json;

use super::*;

const G: &str = "thread";
/// When every event of these scenarios happens: the rules never read it.
const AT: Timestamp = Timestamp::from_millis(0);

fn new_call(id: &str, arguments: serde_json::Value) -> NewCall {
    NewCall {
        id: id.into(),
        submission: Submission {
            operation: "echo".into(),
            arguments,
            call_id: None,
            user_id: None,
            thread_ancestors: None,
        },
        tool: "demo.echo@1.0.0".into(),
        target: Some(ToolTarget {
            tool_name: "echo".into(),
            base_url: "http://tool".into(),
            endpoint: "http://tool/invoke".into(),
        }),
        gate: None,
    }
}

/// A `view_update` sent with call `id`'s token.
fn view(id: &str, view_type: &str, content: serde_json::Value) -> Command {
    Command::View {
        id: id.into(),
        update: ViewUpdate {
            group_id: G.into(),
            view_type: view_type.into(),
            content,
        },
        key: None,
    }
}

/// Records call `id`, queued, in `state`.
fn submitted(state: &mut ThreadState, id: &str) {
    let decision = decide(state, &Command::Submit(new_call(id, json!({})))).unwrap();
    apply(state, AT, decision.changes);
}

/// Invariant 5: a view comes only from a call still waiting on its tool
/// (or a live subscription); a finished or cancelled call's token, or any
/// token in a closed thread, changes nothing.
#[test]
fn only_an_open_call_updates_views() {
    let v = || view("c", "diff", json!({"n": 1}));
    check(vec![
        (v(), Err(Rejection::UnknownCall("c".into()))),
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (Command::Cancel { id: "c".into() }, Ok(&["call_cancelled"])),
        (v(), Ok(&[])),
    ]);
    check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("c", "done", false), Ok(&["tool_result"])),
        (v(), Ok(&[])),
    ]);
    check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("c", "open", true), Ok(&["tool_result"])),
        (v(), Ok(&["view_update"])),
        (
            Command::Close,
            Ok(&["subscription_cancelled", "thread_closed"]),
        ),
        (view("c", "diff", json!({"n": 2})), Ok(&[])),
    ]);
}

/// A tool's callback without an `Idempotency-Key`.
fn unkeyed(callback: Callback) -> Command {
    Command::Callback {
        callback,
        key: None,
    }
}

/// `command`, a callback, sent with `Idempotency-Key: key` and a body
/// whose fingerprint is `body`.
fn keyed(command: Command, key: &str, body: &str) -> Command {
    let key = Some(IdempotencyKey {
        key: key.into(),
        fingerprint: body.into(),
    });
    match command {
        Command::Callback { callback, .. } => Command::Callback { callback, key },
        Command::View { id, update, .. } => Command::View { id, update, key },
        other => panic!("not a callback: {other:?}"),
    }
}

fn result(id: &str, text: &str, subscription: bool) -> Command {
    unkeyed(Callback::ToolResult(ToolResult {
        group_id: G.into(),
        id: id.into(),
        call_id: None,
        text: Some(text.into()),
        content: None,
        display_as: None,
        subscription,
    }))
}

fn sub_event(id: &str, text: &str, is_final: bool) -> Command {
    unkeyed(Callback::SubscriptionEvent(SubscriptionEvent {
        group_id: G.into(),
        tool_call_id: id.into(),
        text: text.into(),
        associative: true,
        is_final,
    }))
}

/// A tool's `user_choice` for call `id`.
fn user_choice(id: &str) -> Command {
    unkeyed(Callback::UserChoice(ferry_proto::rap::UserChoice {
        group_id: G.into(),
        id: id.into(),
        call_id: None,
        prompt: "which?".into(),
        choices: vec!["a".into(), "b".into()],
        default: 0,
        response_url: "http://tool/answer".into(),
    }))
}

fn oauth(id: &str, auth_url: &str) -> Command {
    unkeyed(Callback::OAuth(OAuth {
        group_id: G.into(),
        id: id.into(),
        call_id: None,
        auth_url: auth_url.into(),
    }))
}

/// What one command must answer: the event types it records, or a refusal.
type Expect = Result<&'static [&'static str], Rejection>;

/// Runs `steps` against one thread, checking each answer, and returns the
/// final state. A refused or no-op command must leave the state unchanged.
fn check(steps: Vec<(Command, Expect)>) -> ThreadState {
    check_more(ThreadState::new(G), steps)
}

/// [`check`], going on from `state`.
fn check_more(mut state: ThreadState, steps: Vec<(Command, Expect)>) -> ThreadState {
    for (i, (command, expected)) in steps.into_iter().enumerate() {
        let before = state.clone();
        match (decide(&state, &command), expected) {
            (Ok(decision), Ok(names)) => {
                let events = apply(&mut state, AT, decision.changes);
                let got: Vec<_> = events.iter().map(|e| e.kind.name()).collect();
                assert_eq!(got, names, "step {i}: {command:?}");
                if names.is_empty() {
                    assert_eq!(state, before, "step {i}: a no-op changed state");
                }
            }
            (Err(got), Err(want)) => {
                assert_eq!(got, want, "step {i}");
                assert_eq!(state, before);
            }
            (got, want) => panic!("step {i}: {command:?}: got {got:?}, want {want:?}"),
        }
    }
    state
}

fn status(state: &ThreadState, id: &str) -> CallStatus {
    state.calls[id].status
}

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

/// rap-3: "the `default` index if the user dismisses". A dismissal
/// answers the prompt's default, and says so in `choice_made`.
#[test]
fn a_dismissed_prompt_answers_its_default() {
    let Command::Callback {
        callback: Callback::UserChoice(mut asked),
        ..
    } = user_choice("u")
    else {
        unreachable!("a user_choice")
    };
    asked.default = 1;
    let state = check(vec![
        (
            Command::Submit(new_call("u", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (unkeyed(Callback::UserChoice(asked)), Ok(&["user_choice"])),
    ]);
    let dismiss = Command::Choose {
        id: "u".into(),
        answer: Answer::Dismissed,
    };
    let decision = decide(&state, &dismiss).unwrap();
    assert!(
        matches!(
            &decision.changes[..],
            [Change { kind: EventKind::ChoiceMade { index: 1, choice, dismissed: true }, .. }] if choice == "b"
        ),
        "{decision:?}"
    );
    let state = check_more(state, vec![(dismiss, Ok(&["choice_made"]))]);
    assert_eq!(
        state.calls["u"]
            .undelivered_choice
            .as_ref()
            .map(|a| a.index),
        Some(1)
    );
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
fn a_subscription_event_may_overtake_its_result() {
    let state = check(vec![
        (
            Command::Submit(new_call("s", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (sub_event("s", "early", false), Ok(&["subscription_event"])),
        (result("s", "subscribed", true), Ok(&["tool_result"])),
        (sub_event("s", "tick", false), Ok(&["subscription_event"])),
    ]);
    assert_eq!(status(&state, "s"), CallStatus::Subscribed);
    assert!(state.meta.active_subscriptions.contains("s"));
    assert_eq!(state.calls["s"].subscription_events, 2);
}

#[test]
fn a_thread_holds_at_most_its_bound_of_active_subscriptions() {
    let mut steps = vec![];
    for i in 0..MAX_ACTIVE_SUBSCRIPTIONS {
        let id = format!("s{i}");
        steps.push((
            Command::Submit(new_call(&id, json!({}))),
            Ok(&["call_accepted"][..]),
        ));
        steps.push((result(&id, "subscribed", true), Ok(&["tool_result"][..])));
    }
    for id in ["over", "plain"] {
        steps.push((
            Command::Submit(new_call(id, json!({}))),
            Ok(&["call_accepted"][..]),
        ));
    }
    // One more: the agent gets the result; the subscription is cancelled.
    steps.push((
        result("over", "subscribed", true),
        Ok(&["tool_result", "subscription_cancelled"][..]),
    ));
    // A plain result is not held back by the bound.
    steps.push((result("plain", "done", false), Ok(&["tool_result"][..])));
    steps.push((
        sub_event("over", "tick", false),
        Err(Rejection::SubscriptionGone("over".into())),
    ));
    // Once one ends, another may open.
    steps.push((
        sub_event("s0", "bye", true),
        Ok(&["subscription_event"][..]),
    ));
    steps.push((
        Command::Submit(new_call("next", json!({}))),
        Ok(&["call_accepted"][..]),
    ));
    steps.push((result("next", "subscribed", true), Ok(&["tool_result"][..])));
    let state = check(steps);
    assert_eq!(
        state.meta.active_subscriptions.len(),
        MAX_ACTIVE_SUBSCRIPTIONS
    );
    assert!(!state.meta.active_subscriptions.contains("over"));
    assert_eq!(status(&state, "over"), CallStatus::Cancelled);
    assert_eq!(
        state.calls["over"].result.as_ref().unwrap().text,
        "subscribed"
    );
    assert_eq!(status(&state, "plain"), CallStatus::Completed);
    assert_eq!(status(&state, "next"), CallStatus::Subscribed);
}

#[test]
fn a_tool_that_sent_events_is_not_failed_for_a_missing_ack() {
    let failed = Command::DispatchFailed {
        id: "s".into(),
        attempts: 5,
        text: "Error: the tool could not be reached after 5 attempts".into(),
    };
    let state = check(vec![
        (
            Command::Submit(new_call("s", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (sub_event("s", "early", false), Ok(&["subscription_event"])),
        // Its 200 never arrived (or it answered 4xx), but it is running the
        // call.
        (failed, Ok(&[])),
    ]);
    // Dispatched, not queued: a restart asks the tool about it
    // (`/tool_call_status`) instead of leaving it queued with nothing to
    // send, where it would stay stuck forever after a kill -9.
    assert_eq!(status(&state, "s"), CallStatus::Dispatched);
    assert!(!state.calls["s"].awaits_dispatch());
    assert_eq!(state.meta.counts.get(&CallStatus::Queued), Some(&0));
    assert_eq!(state.meta.counts.get(&CallStatus::Dispatched), Some(&1));
    let acked = Command::DispatchAcked {
        id: "s".into(),
        attempts: 1,
    };
    check_more(
        state,
        vec![
            (acked, Ok(&[])),
            (result("s", "subscribed", true), Ok(&["tool_result"])),
        ],
    );
}

#[test]
fn a_final_event_before_the_result_leaves_no_active_subscription() {
    let state = check(vec![
        (
            Command::Submit(new_call("s", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (sub_event("s", "last", true), Ok(&["subscription_event"])),
        (result("s", "subscribed", true), Ok(&["tool_result"])),
        (
            sub_event("s", "after final", false),
            Err(Rejection::SubscriptionGone("s".into())),
        ),
    ]);
    assert_eq!(status(&state, "s"), CallStatus::Completed);
    assert!(state.meta.active_subscriptions.is_empty());
}

#[test]
fn final_closes_and_cancel_makes_later_events_gone() {
    let state = check(vec![
        (
            Command::Submit(new_call("a", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("a", "sub", true), Ok(&["tool_result"])),
        (sub_event("a", "1", true), Ok(&["subscription_event"])),
        (
            sub_event("a", "2", false),
            Err(Rejection::SubscriptionGone("a".into())),
        ),
        (
            Command::Submit(new_call("b", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("b", "sub", true), Ok(&["tool_result"])),
        (
            Command::CancelSubscription { id: "b".into() },
            Ok(&["subscription_cancelled"]),
        ),
        (
            sub_event("b", "late", false),
            Err(Rejection::SubscriptionGone("b".into())),
        ),
        (
            Command::CancelSubscription { id: "b".into() },
            Err(Rejection::NotSubscribed("b".into())),
        ),
    ]);
    assert_eq!(status(&state, "a"), CallStatus::Completed);
    assert_eq!(status(&state, "b"), CallStatus::Cancelled);
    assert!(state.meta.active_subscriptions.is_empty());
}

#[test]
fn events_for_a_plain_finished_call_are_refused() {
    check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("c", "done", false), Ok(&["tool_result"])),
        (
            sub_event("c", "x", false),
            Err(Rejection::NotSubscribed("c".into())),
        ),
    ]);
}

#[test]
fn the_builtin_cancels_only_this_threads_active_subscriptions() {
    let builtin = |id: &str, target: &str| Command::CancelSubscriptionTool {
        call: NewCall {
            target: None,
            tool: "cancel_subscription".into(),
            ..new_call(id, json!({"tool_call_id": target}))
        },
        target: target.into(),
    };
    let state = check(vec![
        (
            Command::Submit(new_call("s", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("s", "sub", true), Ok(&["tool_result"])),
        (
            builtin("k1", "s"),
            Ok(&["call_accepted", "subscription_cancelled", "tool_result"]),
        ),
        (builtin("k2", "s"), Ok(&["call_accepted", "tool_result"])),
    ]);
    assert!(!state.calls["k1"].result.as_ref().unwrap().is_error);
    assert!(state.calls["k2"]
        .result
        .as_ref()
        .unwrap()
        .text
        .starts_with("Error: "));
    assert_eq!(status(&state, "k2"), CallStatus::Completed);
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

/// A thread already past the views' byte bound (a bound lowered since it
/// grew) still takes updates that shrink it, and refuses ones that grow it.
#[test]
fn views_past_the_byte_bound_may_shrink_but_not_grow() {
    let mut state = ThreadState::new(G);
    let big = |n: usize| json!("x".repeat(n));
    state.meta.views.insert("a".into(), big(MAX_VIEW_BYTES));
    state.meta.views.insert("b".into(), big(10));
    submitted(&mut state, "c");
    let update = |view_type: &str, content: serde_json::Value| view("c", view_type, content);
    assert!(decide(&state, &update("a", big(MAX_VIEW_BYTES - 1))).is_ok());
    assert!(decide(&state, &update("b", big(5))).is_ok());
    assert!(matches!(
        decide(&state, &update("b", big(11))),
        Err(Rejection::ViewsTooLarge { .. })
    ));
    assert!(matches!(
        decide(&state, &update("c", json!(1))),
        Err(Rejection::ViewsTooLarge { .. })
    ));
}

#[test]
fn view_updates_keep_the_latest_content() {
    let view = |n: i64| view("c", "diff", json!({"n": n}));
    let state = check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (view(1), Ok(&["view_update"])),
        (view(1), Ok(&[])),
        (view(2), Ok(&["view_update"])),
    ]);
    assert_eq!(state.meta.views["diff"], json!({"n": 2}));
}

#[test]
fn a_thread_holds_at_most_its_bound_of_views() {
    let view = |kind: &str, n: i64| view("c", kind, json!({"n": n}));
    let mut steps: Vec<(Command, Expect)> = vec![(
        Command::Submit(new_call("c", json!({}))),
        Ok(&["call_accepted"][..]),
    )];
    steps.extend((0..MAX_VIEWS).map(|i| (view(&format!("v{i}"), 1), Ok(&["view_update"][..]))));
    steps.push((
        view("one more", 1),
        Err(Rejection::TooManyViews("one more".into())),
    ));
    // A view it holds still updates.
    steps.push((view("v0", 2), Ok(&["view_update"][..])));
    let state = check(steps);
    assert_eq!(state.meta.views.len(), MAX_VIEWS);
    assert_eq!(state.meta.views["v0"], json!({"n": 2}));
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

/// The keys call `id` remembers, oldest first.
fn keys(state: &ThreadState, id: &str) -> Vec<String> {
    state.calls[id]
        .idempotency_keys
        .iter()
        .map(|k| k.key.clone())
        .collect()
}

/// What `command` does to `state`, which it then changes.
fn outcome(state: &mut ThreadState, command: &Command) -> Result<Outcome, Rejection> {
    let decision = decide(state, command)?;
    apply(state, AT, decision.changes);
    Ok(decision.outcome)
}

/// RAP gives a `subscription_event` no id: without a key, an event the
/// tool sends again (its answer lost) is a second event. Under the same
/// `Idempotency-Key` it is the same event, answered `Duplicate`, whatever
/// the call's state since (here, the subscription ended); another key is
/// another event, even with the same text; the same key with another body
/// is refused (the draft's 422).
#[test]
fn a_keyed_subscription_event_sent_again_is_recorded_once() {
    let mut state = check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("c", "watching", true), Ok(&["tool_result"])),
    ]);
    let tick = keyed(sub_event("c", "tick", false), "c/1", "f1");
    state = check_more(
        state,
        vec![
            (tick.clone(), Ok(&["subscription_event"])),
            (tick.clone(), Ok(&[])),
            (
                keyed(sub_event("c", "tick", false), "c/2", "f2"),
                Ok(&["subscription_event"]),
            ),
            (
                keyed(sub_event("c", "tock", false), "c/1", "f3"),
                Err(Rejection::KeyReused {
                    id: "c".into(),
                    key: "c/1".into(),
                }),
            ),
            (sub_event("c", "tick", false), Ok(&["subscription_event"])),
        ],
    );
    assert_eq!(outcome(&mut state, &tick), Ok(Outcome::Duplicate));
    assert_eq!(state.calls["c"].subscription_events, 3);
    assert_eq!(keys(&state, "c"), ["c/1", "c/2"]);
    let last = keyed(sub_event("c", "done", true), "c/3", "f4");
    state = check_more(state, vec![(last.clone(), Ok(&["subscription_event"]))]);
    assert_eq!(status(&state, "c"), CallStatus::Completed);
    assert_eq!(outcome(&mut state, &tick), Ok(Outcome::Duplicate));
    assert_eq!(outcome(&mut state, &last), Ok(Outcome::Duplicate));
    // A new key for the ended subscription is refused as before.
    let late = keyed(sub_event("c", "late", false), "c/4", "f5");
    check_more(
        state,
        vec![(late, Err(Rejection::SubscriptionGone("c".into())))],
    );
}

/// A keyed callback that recorded nothing (refused, or a no-op) leaves no
/// key: its repeat is decided again and answered the same way.
#[test]
fn a_callback_that_recorded_nothing_leaves_no_key() {
    let tick = || keyed(sub_event("c", "tick", false), "k", "f");
    let state = check(vec![
        (tick(), Err(Rejection::UnknownCall("c".into()))),
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (Command::Cancel { id: "c".into() }, Ok(&["call_cancelled"])),
        (tick(), Err(Rejection::SubscriptionGone("c".into()))),
        (tick(), Err(Rejection::SubscriptionGone("c".into()))),
        (keyed(result("c", "late", false), "r", "f"), Ok(&[])),
    ]);
    assert!(state.calls["c"].idempotency_keys.is_empty());
}

/// The keys live in the call's record, which every commit touching the
/// call carries: it keeps the most recent 64, and a key older than those
/// is decided again (here, recorded a second time).
#[test]
fn keys_past_the_bound_drop_the_oldest() {
    let mut state = check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (result("c", "watching", true), Ok(&["tool_result"])),
    ]);
    let tick = |n: usize| {
        keyed(
            sub_event("c", &format!("{n}"), false),
            &format!("k{n}"),
            "f",
        )
    };
    for n in 0..=MAX_IDEMPOTENCY_KEYS {
        assert_eq!(outcome(&mut state, &tick(n)), Ok(Outcome::Applied));
    }
    let kept = keys(&state, "c");
    assert_eq!(kept.len(), MAX_IDEMPOTENCY_KEYS);
    assert_eq!(kept.first().map(String::as_str), Some("k1"));
    assert_eq!(
        kept.last().map(String::as_str),
        Some(&*format!("k{MAX_IDEMPOTENCY_KEYS}"))
    );
    for n in 1..=MAX_IDEMPOTENCY_KEYS {
        assert_eq!(
            outcome(&mut state, &tick(n)),
            Ok(Outcome::Duplicate),
            "k{n}"
        );
    }
    // Forgotten: recorded again, and now the newest (k1 the oldest to go).
    assert_eq!(outcome(&mut state, &tick(0)), Ok(Outcome::Applied));
    let kept = keys(&state, "c");
    assert_eq!(kept.len(), MAX_IDEMPOTENCY_KEYS);
    let newest = &kept[MAX_IDEMPOTENCY_KEYS - 1];
    assert_eq!((kept[0].as_str(), newest.as_str()), ("k2", "k0"));
    let events = MAX_IDEMPOTENCY_KEYS as u64 + 2;
    assert_eq!(state.calls["c"].subscription_events, events);
}

/// Every callback that names a call (its token's, for a `view_update`)
/// is deduped by its key: a repeated `oauth`, `user_choice` or
/// `view_update` that the state alone would record again (an older view
/// over a newer one, a prompt asked anew after another) is not; a
/// `tool_result` was deduped by state already, and its key is checked
/// first.
#[test]
fn every_callback_naming_a_call_is_deduped_by_its_key() {
    let old_view = keyed(view("c", "diff", json!({"n": 1})), "v1", "a");
    let ask = keyed(user_choice("c"), "ask", "b");
    let auth = keyed(oauth("c", "http://tool/auth"), "auth", "c");
    let done = keyed(result("c", "done", false), "done", "d");
    let state = check(vec![
        (
            Command::Submit(new_call("c", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (old_view.clone(), Ok(&["view_update"])),
        (
            keyed(view("c", "diff", json!({"n": 2})), "v2", "e"),
            Ok(&["view_update"]),
        ),
        (old_view.clone(), Ok(&[])),
        (ask.clone(), Ok(&["user_choice"])),
        (auth.clone(), Ok(&["oauth"])),
        (ask.clone(), Ok(&[])),
        (auth.clone(), Ok(&[])),
        (done.clone(), Ok(&["tool_result"])),
        (done.clone(), Ok(&[])),
        (
            keyed(result("c", "other", false), "done", "x"),
            Err(Rejection::KeyReused {
                id: "c".into(),
                key: "done".into(),
            }),
        ),
    ]);
    assert_eq!(state.meta.views["diff"], json!({"n": 2}));
    assert_eq!(keys(&state, "c"), ["v1", "v2", "ask", "auth", "done"]);
}

fn gated(id: &str, inherited: Option<(PermissionKind, &str)>) -> Command {
    gated_under(id, inherited, None, None)
}

/// A gated call naming `named` ancestors, whose grants the engine read for
/// the ancestors `read_for`.
fn gated_under(
    id: &str,
    inherited: Option<(PermissionKind, &str)>,
    named: Option<&[&str]>,
    read_for: Option<&[&str]>,
) -> Command {
    let names = |list: Option<&[&str]>| list.map(|l| l.iter().map(|a| a.to_string()).collect());
    let mut call = new_call(id, json!({}));
    call.submission.thread_ancestors = names(named);
    Command::Submit(NewCall {
        gate: Some(Gate {
            deadline: "2026-01-01T00:05:00Z".parse().unwrap(),
            inherited: inherited.map(|(k, g)| (k, g.to_owned())),
            ancestors: names(read_for),
        }),
        ..call
    })
}

fn decide_as(id: &str, option: PermissionKind) -> Command {
    Command::Decide {
        id: id.into(),
        option,
        reviewer: Reviewer::Person("ana".into()),
        reason: Some("looks fine".into()),
    }
}

use ferry_proto::api::PermissionKind;

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

/// A new question from the tool drops the answer to the last one still
/// owed (rap-3: a runtime "MUST NOT cache or replay choice responses";
/// kept, the old answer would be delivered as the new prompt's), and a call
/// waiting on the user shows the prompt, not the spent `auth_url` (nor an
/// old prompt once it waits on consent).
#[test]
fn a_new_question_drops_what_the_last_one_left() {
    let answer = |index| Command::Choose {
        id: "u".into(),
        answer: Answer::Index(index),
    };
    let oauth = oauth("u", "https://idp.example/authorize");
    let state = check(vec![
        (
            Command::Submit(new_call("u", json!({}))),
            Ok(&["call_accepted"]),
        ),
        (oauth.clone(), Ok(&["oauth"])),
        (user_choice("u"), Ok(&["user_choice"])),
    ]);
    assert_eq!(status(&state, "u"), CallStatus::AwaitingUser);
    assert_eq!(state.calls["u"].auth_url, None);
    let state = check_more(
        state,
        vec![
            (answer(1), Ok(&["choice_made"])),
            (user_choice("u"), Ok(&["user_choice"])),
        ],
    );
    assert_eq!(state.calls["u"].undelivered_choice, None);
    assert!(
        state.meta.unsettled.contains("u"),
        "still waiting on the user"
    );
    let state = check_more(state, vec![(oauth, Ok(&["oauth"]))]);
    assert_eq!(status(&state, "u"), CallStatus::AwaitingAuth);
    assert_eq!(state.calls["u"].choice, None);
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
