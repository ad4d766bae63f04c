//! Views (`view_update`): who may update one, and the bounds on them.

use super::*;

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
