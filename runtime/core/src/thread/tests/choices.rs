//! A user's choices (`user_choice`): defaults and new questions.

use super::*;

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
