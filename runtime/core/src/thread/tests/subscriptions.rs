//! Subscriptions: events before and after the result, `final`, cancels,
//! and the bound of active subscriptions.

use super::*;

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
