//! Callbacks deduped by their `Idempotency-Key`.

use super::*;

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
