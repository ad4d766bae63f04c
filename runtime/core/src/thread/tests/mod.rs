//! The state machine's rules, one scenario per test: a sequence of commands
//! and what each must answer.

mod approvals;
mod choices;
mod idempotency;
mod lifecycle;
mod ownership;
mod subscriptions;
mod views;

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
        identity: "agent".into(),
        user_verified: false,
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

/// Records call `id`, queued, in `state`.
fn submitted(state: &mut ThreadState, id: &str) {
    let decision = decide(state, &Command::Submit(new_call(id, json!({})))).unwrap();
    apply(state, AT, decision.changes);
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

use ferry_proto::api::PermissionKind;

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

/// The keys call `id` remembers, oldest first.
fn keys(state: &ThreadState, id: &str) -> Vec<String> {
    state.calls[id]
        .idempotency_keys
        .iter()
        .map(|k| k.key.clone())
        .collect()
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
