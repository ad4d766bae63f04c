//! Commands and the decisions they produce. Every rule of the RAP callback
//! table (`rap-3`) that depends on a call's state is here.

use ferry_proto::api::{CallStatus, EventKind, PermissionKind, ResultOrigin};
use ferry_proto::idempotency::IdempotencyKey;
use ferry_proto::rap::{Callback, ViewUpdate};

use super::state::{grant_key, CallRecord, ChoiceAnswer, NewCall, Submission, ThreadState};
use super::{
    Reviewer, LOST_CALL_TEXT, LOST_SUBSCRIPTION_TEXT, MAX_ACTIVE_SUBSCRIPTIONS, MAX_VIEWS,
    MAX_VIEW_BYTES,
};

/// Something asked of a thread.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// An agent submits a call.
    Submit(NewCall),
    /// An agent submits call `id` again, though its tool no longer resolves
    /// or its arguments no longer validate (the toolset was deleted,
    /// refreshed, or its name now clashes): only a retry of a call already
    /// here can be answered.
    Resubmit {
        id: String,
        submission: Submission,
    },
    /// The built-in `cancel_subscription` tool: record the call, cancel the
    /// subscription `target` if it is active here, and answer at once.
    CancelSubscriptionTool {
        call: NewCall,
        target: String,
    },
    /// The tool acknowledged the invocation after `attempts` attempts.
    DispatchAcked {
        id: String,
        attempts: u32,
    },
    /// An attempt failed in a way worth retrying; the `attempts` made so
    /// far are recorded, so a dispatch resumed after a crash keeps to the
    /// same bound.
    DispatchRetrying {
        id: String,
        attempts: u32,
        reason: String,
        retry_in_ms: u64,
    },
    /// Dispatch gave up; `text` starts with `Error: `.
    DispatchFailed {
        id: String,
        attempts: u32,
        text: String,
    },
    /// A tool's callback; its token already named this thread and call.
    /// A `view_update` names no call, so it comes as [`Command::View`].
    /// `key` is its `Idempotency-Key`, if it had one: a key the call
    /// already remembers is a repeat, which records nothing.
    Callback {
        callback: Callback,
        key: Option<IdempotencyKey>,
    },
    /// The tool's `tool_result` for call `id` was refused for its size, and
    /// tools do not send a refused callback again (`rap-3`): the call ends
    /// with Ferry's error `text` where the result would be.
    ResultRefused {
        id: String,
        text: String,
    },
    /// A tool's `view_update`, sent with the token of call `id` (and
    /// recorded as that call's), with its `Idempotency-Key` if it had one.
    View {
        id: String,
        update: ViewUpdate,
        key: Option<IdempotencyKey>,
    },
    /// The agent cancels a call (or the subscription it opened).
    Cancel {
        id: String,
    },
    /// A human-facing client cancelled the permission prompt of call `id`:
    /// cancel it if it still waits for approval, refuse if it was decided.
    Withdraw {
        id: String,
    },
    /// The agent cancels an active subscription.
    CancelSubscription {
        id: String,
    },
    Close,
    /// Recovery found the tool server no longer processes the call.
    Lost {
        id: String,
    },
    /// A reviewer (or the timeout) decides a pending approval.
    Decide {
        id: String,
        option: PermissionKind,
        reviewer: Reviewer,
        reason: Option<String>,
    },
    /// Revokes the thread's standing grant for a tool (`Toolset.tool`).
    Revoke {
        tool: String,
    },
    /// The user answers the call's pending `user_choice`.
    Choose {
        id: String,
        answer: Answer,
    },
    /// The tool's `response_url` accepted `answer` (a later answer is
    /// still owed).
    ChoiceDelivered {
        id: String,
        answer: ChoiceAnswer,
    },
    /// The tool's `response_url` refused `answer` (a 4xx).
    ChoiceRefused {
        id: String,
        answer: ChoiceAnswer,
        status: u16,
    },
}

/// A user's answer: by index, by the text of a choice, or none (the
/// prompt dismissed, which answers its `default`).
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Index(usize),
    Text(String),
    Dismissed,
}

impl Command {
    /// The calls the command reads, so the store loads only those.
    pub fn call_ids(&self) -> Vec<&str> {
        match self {
            Command::Submit(call) => vec![&call.id],
            Command::Resubmit { id, .. } => vec![id],
            Command::CancelSubscriptionTool { call, target } => vec![&call.id, target],
            Command::DispatchAcked { id, .. }
            | Command::DispatchRetrying { id, .. }
            | Command::DispatchFailed { id, .. }
            | Command::ResultRefused { id, .. }
            | Command::Cancel { id }
            | Command::Withdraw { id }
            | Command::CancelSubscription { id }
            | Command::Lost { id }
            | Command::Decide { id, .. }
            | Command::Choose { id, .. }
            | Command::ChoiceDelivered { id, .. }
            | Command::ChoiceRefused { id, .. }
            | Command::View { id, .. } => vec![id],
            Command::Callback { callback, .. } => callback.call_id().into_iter().collect(),
            Command::Close | Command::Revoke { .. } => vec![],
        }
    }

    /// Whether the command also reads every call the thread still owes
    /// something (`meta.unsettled`), which the store then loads too.
    pub fn reads_unsettled_calls(&self) -> bool {
        matches!(self, Command::Close)
    }
}

/// One event to record, before it is numbered.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub id: Option<String>,
    /// The `Idempotency-Key` of the callback the event records, which
    /// `evolve` adds to the call's keys.
    pub idempotency_key: Option<IdempotencyKey>,
    pub kind: EventKind,
}

impl Change {
    fn of(id: &str, kind: EventKind) -> Self {
        Self {
            id: Some(id.to_owned()),
            idempotency_key: None,
            kind,
        }
    }

    /// A change that names no call.
    fn thread(kind: EventKind) -> Self {
        Self {
            id: None,
            idempotency_key: None,
            kind,
        }
    }
}

/// What a command did to the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// New events were recorded.
    Applied,
    /// The same thing was already recorded; nothing new.
    Duplicate,
    /// Accepted and deliberately dropped (a result for a cancelled call).
    Ignored,
}

impl Outcome {
    /// The name callbacks are answered with (`{"status": "applied"}`) and
    /// metrics are labelled by.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Duplicate => "duplicate",
            Outcome::Ignored => "ignored",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub changes: Vec<Change>,
    pub outcome: Outcome,
}

impl Decision {
    fn applied(changes: Vec<Change>) -> Self {
        Self {
            changes,
            outcome: Outcome::Applied,
        }
    }

    /// A decision that changes nothing, with its outcome.
    pub fn nothing(outcome: Outcome) -> Self {
        Self {
            changes: vec![],
            outcome,
        }
    }
}

/// Why a command was refused. Refusals change nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("no call {0:?} in this thread")]
    UnknownCall(String),
    #[error("call {0:?} already exists with a different body")]
    Conflict(String),
    #[error("the thread is closed")]
    ThreadClosed,
    #[error("the subscription of call {0:?} was cancelled or has ended")]
    SubscriptionGone(String),
    #[error("call {id:?} is already {status}")]
    Finished { id: String, status: CallStatus },
    #[error("call {0:?} is not an active subscription of this thread")]
    NotSubscribed(String),
    #[error("call {id:?} is {status}, not waiting for approval")]
    NotPendingApproval { id: String, status: CallStatus },
    #[error("call {0:?} was never dispatched: it waits for approval")]
    NotDispatched(String),
    #[error("this thread has no standing grant for {0:?}")]
    NoGrant(String),
    #[error("call {id:?} is {status}: it does not wait for the user's choice")]
    NotAwaitingChoice { id: String, status: CallStatus },
    #[error("{0}")]
    BadChoice(String),
    #[error("the thread already holds {MAX_VIEWS} views; {0:?} would be one more")]
    TooManyViews(String),
    #[error(
        "the thread's views would hold {bytes} bytes with {view_type:?}; at most {MAX_VIEW_BYTES}"
    )]
    ViewsTooLarge { view_type: String, bytes: usize },
    /// The call already took a callback under this `Idempotency-Key`,
    /// with another body (the draft's 422).
    #[error(
        "Idempotency-Key {key:?} was already used for call {id:?} with a different body; a new callback needs a new key"
    )]
    KeyReused { id: String, key: String },
    /// The asker may not act in this thread (`Identity::may_act_in`).
    #[error(
        "thread {0:?} belongs to another identity: this credential may act only in its own threads"
    )]
    ForeignThread(String),
}

impl Rejection {
    /// The native API's name for this refusal.
    pub fn code(&self) -> ferry_proto::ErrorCode {
        use ferry_proto::ErrorCode as C;
        match self {
            Rejection::UnknownCall(_) => C::UnknownCall,
            Rejection::Conflict(_) => C::Conflict,
            Rejection::ThreadClosed => C::ThreadClosed,
            Rejection::SubscriptionGone(_) => C::SubscriptionGone,
            Rejection::Finished { .. } => C::CallFinished,
            Rejection::NotSubscribed(_) => C::NotSubscribed,
            Rejection::NotPendingApproval { .. } => C::NotPendingApproval,
            Rejection::NotDispatched(_) => C::NotDispatched,
            Rejection::NoGrant(_) => C::NoGrant,
            Rejection::NotAwaitingChoice { .. } => C::NotAwaitingChoice,
            Rejection::BadChoice(_) => C::InvalidChoice,
            Rejection::TooManyViews(_) => C::TooManyViews,
            Rejection::ViewsTooLarge { .. } => C::ViewsTooLarge,
            Rejection::KeyReused { .. } => C::IdempotencyKeyReused,
            Rejection::ForeignThread(_) => C::Forbidden,
        }
    }
}

/// Decides what `command` does to `state`. Pure.
pub fn decide(state: &ThreadState, command: &Command) -> Result<Decision, Rejection> {
    match command {
        Command::Submit(call) => submit(state, call),
        Command::Resubmit { id, submission } => {
            if existing(state, id)?.submission == *submission {
                Ok(Decision::nothing(Outcome::Duplicate))
            } else {
                Err(Rejection::Conflict(id.clone()))
            }
        }
        Command::CancelSubscriptionTool { call, target } => {
            cancel_subscription_tool(state, call, target)
        }
        Command::DispatchAcked { id, attempts } => {
            let call = existing(state, id)?;
            Ok(match call.status {
                CallStatus::Cancelled | CallStatus::Failed | CallStatus::Rejected => {
                    Decision::nothing(Outcome::Ignored)
                }
                _ if call.attempts >= *attempts && call.status != CallStatus::Queued => {
                    Decision::nothing(Outcome::Duplicate)
                }
                _ => Decision::applied(vec![Change::of(
                    id,
                    EventKind::CallDispatched {
                        attempts: *attempts,
                        after_result: call.result.is_some(),
                    },
                )]),
            })
        }
        Command::DispatchRetrying {
            id,
            attempts,
            reason,
            retry_in_ms,
        } => {
            let call = existing(state, id)?;
            Ok(if !call.awaits_dispatch() {
                Decision::nothing(Outcome::Ignored)
            } else if call.attempts >= *attempts {
                // A redelivered dispatch's report, or an older one's.
                Decision::nothing(Outcome::Duplicate)
            } else {
                Decision::applied(vec![Change::of(
                    id,
                    EventKind::DispatchRetrying {
                        attempts: *attempts,
                        reason: reason.clone(),
                        retry_in_ms: *retry_in_ms,
                    },
                )])
            })
        }
        Command::DispatchFailed { id, attempts, text } => {
            let call = existing(state, id)?;
            // Failing a call the tool already has would make up an outcome,
            // and drop the tool's real result.
            if !call.awaits_dispatch() {
                return Ok(Decision::nothing(Outcome::Ignored));
            }
            // No `call_dispatched`: the tool never acknowledged the call.
            let mut failed = failure(id, text);
            if let EventKind::ToolResult { attempts: made, .. } = &mut failed.kind {
                *made = Some(*attempts);
            }
            Ok(Decision::applied(vec![failed]))
        }
        Command::Callback { callback: cb, key } => {
            keyed(state, cb.call_id(), key.as_ref(), |state| {
                callback(state, cb)
            })
        }
        Command::ResultRefused { id, text } => {
            // Wherever the refused result would have been taken, this is.
            let call = existing(state, id)?;
            Ok(match call.status {
                CallStatus::PendingApproval => return Err(Rejection::NotDispatched(id.clone())),
                s if s.is_pending() => Decision::applied(vec![failure(id, text)]),
                CallStatus::Cancelled => Decision::nothing(Outcome::Ignored),
                _ => Decision::nothing(Outcome::Duplicate),
            })
        }
        Command::View { id, update, key } => keyed(state, Some(id), key.as_ref(), |state| {
            let call = existing(state, id)?;
            // Invariant 5: only a call still waiting on its tool (or a live
            // subscription) takes callbacks; a late or leaked token's view
            // is dropped like a late result.
            let open = call.status.is_pending() || call.status == CallStatus::Subscribed;
            if !open || state.meta.closed {
                return Ok(Decision::nothing(Outcome::Ignored));
            }
            view_update(state, id, update)
        }),
        Command::Cancel { id } => {
            let call = existing(state, id)?;
            let kind = match call.status {
                s if s.is_pending() || s == CallStatus::PendingApproval => {
                    EventKind::CallCancelled {}
                }
                CallStatus::Subscribed => EventKind::SubscriptionCancelled { reason: None },
                status => {
                    return Err(Rejection::Finished {
                        id: id.clone(),
                        status,
                    })
                }
            };
            Ok(Decision::applied(vec![Change::of(id, kind)]))
        }
        Command::Withdraw { id } => match existing(state, id)?.status {
            CallStatus::PendingApproval => Ok(Decision::applied(vec![Change::of(
                id,
                EventKind::CallCancelled {},
            )])),
            status => Err(Rejection::NotPendingApproval {
                id: id.clone(),
                status,
            }),
        },
        Command::CancelSubscription { id } => {
            if !state.meta.active_subscriptions.contains(id) {
                return Err(Rejection::NotSubscribed(id.clone()));
            }
            Ok(Decision::applied(vec![Change::of(
                id,
                EventKind::SubscriptionCancelled { reason: None },
            )]))
        }
        Command::Close if state.meta.closed => Ok(Decision::nothing(Outcome::Duplicate)),
        Command::Close => close(state),
        Command::Lost { id } => {
            let call = existing(state, id)?;
            Ok(match call.status {
                s if s.is_pending() => Decision::applied(vec![failure(id, LOST_CALL_TEXT)]),
                CallStatus::Subscribed => Decision::applied(vec![Change::of(
                    id,
                    EventKind::SubscriptionEvent {
                        text: LOST_SUBSCRIPTION_TEXT.to_owned(),
                        associative: false,
                        is_final: true,
                    },
                )]),
                _ => Decision::nothing(Outcome::Ignored),
            })
        }
        Command::Decide {
            id,
            option,
            reviewer,
            reason,
        } => {
            let call = existing(state, id)?;
            if call.status != CallStatus::PendingApproval {
                return Err(Rejection::NotPendingApproval {
                    id: id.clone(),
                    status: call.status,
                });
            }
            Ok(Decision::applied(decided(
                id,
                &call.tool,
                *option,
                reviewer,
                reason.clone(),
            )))
        }
        Command::Choose { id, answer } => {
            let call = existing(state, id)?;
            let pending = match (&call.choice, call.status) {
                (Some(choice), CallStatus::AwaitingUser) => choice,
                _ => {
                    return Err(Rejection::NotAwaitingChoice {
                        id: id.clone(),
                        status: call.status,
                    })
                }
            };
            let index =
                match answer {
                    Answer::Index(i) if *i < pending.choices.len() => *i,
                    Answer::Index(i) => {
                        return Err(Rejection::BadChoice(format!(
                            "index {i} is out of range: there are {} choices",
                            pending.choices.len()
                        )))
                    }
                    Answer::Text(text) => pending
                        .choices
                        .iter()
                        .position(|c| c == text)
                        .ok_or_else(|| {
                            Rejection::BadChoice(format!("{text:?} is not one of the choices"))
                        })?,
                    // rap-3: "the `default` index if the user dismisses";
                    // checked in range when the prompt came.
                    Answer::Dismissed => pending.default,
                };
            Ok(Decision::applied(vec![Change::of(
                id,
                EventKind::ChoiceMade {
                    index,
                    choice: pending.choices[index].clone(),
                    dismissed: *answer == Answer::Dismissed,
                },
            )]))
        }
        Command::ChoiceDelivered { id, answer } => {
            let call = existing(state, id)?;
            Ok(if call.undelivered_choice.as_ref() == Some(answer) {
                Decision::applied(vec![Change::of(id, EventKind::ChoiceDelivered {})])
            } else {
                Decision::nothing(Outcome::Duplicate)
            })
        }
        Command::ChoiceRefused { id, answer, status } => {
            let call = existing(state, id)?;
            Ok(if call.undelivered_choice.as_ref() == Some(answer) {
                let refused = EventKind::ChoiceRefused { status: *status };
                Decision::applied(vec![Change::of(id, refused)])
            } else {
                Decision::nothing(Outcome::Duplicate)
            })
        }
        Command::Revoke { tool } => {
            if !state.meta.grants.contains_key(tool) {
                return Err(Rejection::NoGrant(tool.clone()));
            }
            Ok(Decision::applied(vec![Change::thread(
                EventKind::GrantRevoked { tool: tool.clone() },
            )]))
        }
    }
}

/// The events of an approval decision: the decision, and for a rejection
/// the result that ends the call so the agent can try something else.
fn decided(
    id: &str,
    tool: &str,
    option: PermissionKind,
    reviewer: &Reviewer,
    reason: Option<String>,
) -> Vec<Change> {
    let mut changes = vec![Change::of(
        id,
        EventKind::ApprovalDecided {
            option_id: option,
            tool: grant_key(tool).to_owned(),
            reviewer: reviewer.recorded(),
            reason: reason.clone(),
        },
    )];
    if !option.allows() {
        let why = reason.map(|r| format!(": {r}")).unwrap_or_default();
        let text = if *reviewer == Reviewer::Timeout {
            format!("Error: the call to {tool} was rejected: no reviewer approved it in time")
        } else {
            format!("Error: the call to {tool} was rejected by a reviewer{why}")
        };
        changes.push(failure(id, &text));
    }
    changes
}

fn existing<'s>(state: &'s ThreadState, id: &str) -> Result<&'s CallRecord, Rejection> {
    state
        .calls
        .get(id)
        .ok_or_else(|| Rejection::UnknownCall(id.to_owned()))
}

fn accepted(call: &NewCall) -> Change {
    Change::of(
        &call.id,
        EventKind::CallAccepted {
            operation: call.submission.operation.clone(),
            tool: call.tool.clone(),
            arguments: call.submission.arguments.clone(),
            call_id: call.submission.call_id.clone(),
            user_id: call.submission.user_id.clone(),
            thread_ancestors: call.submission.thread_ancestors.clone(),
            identity: Some(call.identity.clone()),
            user_verified: call.user_verified,
            target: call.target.clone(),
        },
    )
}

/// Closing a thread ends what is open in it, then closes it: its tools are
/// told the thread is over (`/close_thread`), so a queued call must not
/// reach them afterwards, and no result or event will come for the rest
/// (a subscription left in the active set would stay there for good).
/// Needs every unsettled call loaded ([`Command::reads_unsettled_calls`]).
fn close(state: &ThreadState) -> Result<Decision, Rejection> {
    let mut open: Vec<&CallRecord> = state
        .meta
        .unsettled
        .iter()
        .filter_map(|id| state.calls.get(id))
        .filter(|call| call.status.is_open())
        .collect();
    open.sort_by_key(|call| call.accepted_seq);
    let mut changes: Vec<Change> = open
        .into_iter()
        .map(|call| {
            let kind = match call.status {
                CallStatus::Subscribed => EventKind::SubscriptionCancelled { reason: None },
                _ => EventKind::CallCancelled {},
            };
            Change::of(&call.id, kind)
        })
        .collect();
    changes.push(Change::thread(EventKind::ThreadClosed {}));
    Ok(Decision::applied(changes))
}

/// The result Ferry records for call `id` that failed: an error, whatever
/// its text says (a tool's own results are errors by RAP's `Error: `
/// convention, `Callback::is_error`).
fn failure(id: &str, text: &str) -> Change {
    plain_result(id, text, true, ResultOrigin::Ferry)
}

/// A text-only `tool_result` for call `id`.
fn plain_result(id: &str, text: &str, is_error: bool, origin: ResultOrigin) -> Change {
    Change::of(
        id,
        EventKind::ToolResult {
            text: text.to_owned(),
            content: None,
            display_as: None,
            is_error,
            subscription: false,
            origin,
            attempts: None,
        },
    )
}

/// A resubmission of the same body is a duplicate; a different body under
/// the same id is a conflict (invariant 2).
fn submit(state: &ThreadState, call: &NewCall) -> Result<Decision, Rejection> {
    if let Some(existing) = state.calls.get(&call.id) {
        return if existing.submission == call.submission {
            Ok(Decision::nothing(Outcome::Duplicate))
        } else {
            Err(Rejection::Conflict(call.id.clone()))
        };
    }
    if state.meta.closed {
        return Err(Rejection::ThreadClosed);
    }
    let mut changes = vec![accepted(call)];
    if let Some(gate) = &call.gate {
        // A standing decision of this thread wins over an ancestor's.
        let own = state
            .meta
            .grants
            .get(grant_key(&call.tool))
            .map(|kind| (*kind, state.meta.group_id.clone()));
        // The ancestors the thread has once this call is applied (its
        // first call naming any sets them).
        let ancestors = state
            .meta
            .ancestors
            .as_ref()
            .or(call.submission.thread_ancestors.as_ref())
            .filter(|a| !a.is_empty());
        let inherited = gate
            .inherited
            .clone()
            .filter(|_| ancestors == gate.ancestors.as_ref().filter(|a| !a.is_empty()));
        match own.or(inherited) {
            Some((kind, from)) => changes.extend(decided(
                &call.id,
                &call.tool,
                kind,
                &Reviewer::Grant { from },
                None,
            )),
            None => changes.push(Change::of(
                &call.id,
                EventKind::ApprovalRequested {
                    tool: call.tool.clone(),
                    arguments: call.submission.arguments.clone(),
                    user_id: call.submission.user_id.clone(),
                    options: PermissionKind::ALL.iter().map(|k| k.option()).collect(),
                    deadline: gate.deadline,
                },
            )),
        }
    }
    Ok(Decision::applied(changes))
}

fn cancel_subscription_tool(
    state: &ThreadState,
    call: &NewCall,
    target: &str,
) -> Result<Decision, Rejection> {
    let mut decision = submit(state, call)?;
    if decision.outcome != Outcome::Applied {
        return Ok(decision);
    }
    let active = state.meta.active_subscriptions.contains(target);
    let text = if active {
        decision.changes.push(Change::of(
            target,
            EventKind::SubscriptionCancelled { reason: None },
        ));
        format!("Cancelled subscription {target}")
    } else {
        format!("Error: {target} is not an active subscription of this thread")
    };
    // The built-in tool's own result, as a RAP tool would give it.
    decision
        .changes
        .push(plain_result(&call.id, &text, !active, ResultOrigin::Tool));
    Ok(decision)
}

/// A live view's new content, within the thread's bounds, recorded as
/// call `id`'s (its token's).
fn view_update(state: &ThreadState, id: &str, v: &ViewUpdate) -> Result<Decision, Rejection> {
    if state.meta.views.get(&v.view_type) == Some(&v.content) {
        return Ok(Decision::nothing(Outcome::Duplicate));
    }
    if !state.meta.views.contains_key(&v.view_type) && state.meta.views.len() >= MAX_VIEWS {
        return Err(Rejection::TooManyViews(v.view_type.clone()));
    }
    // A view's name counts too. An update that does not grow the views
    // is taken even past the bound, so that the bound may be lowered.
    let size =
        |view_type: &str, content: &serde_json::Value| view_type.len() + content.to_string().len();
    let others: usize = state
        .meta
        .views
        .iter()
        .filter(|(view_type, _)| **view_type != v.view_type)
        .map(|(view_type, content)| size(view_type, content))
        .sum();
    let before = others
        + state
            .meta
            .views
            .get(&v.view_type)
            .map_or(0, |content| size(&v.view_type, content));
    let bytes = others + size(&v.view_type, &v.content);
    if bytes > MAX_VIEW_BYTES && bytes > before {
        return Err(Rejection::ViewsTooLarge {
            view_type: v.view_type.clone(),
            bytes,
        });
    }
    Ok(Decision::applied(vec![Change::of(
        id,
        EventKind::ViewUpdate {
            view_type: v.view_type.clone(),
            content: v.content.clone(),
        },
    )]))
}

/// Decides a tool's callback to call `id` under its `Idempotency-Key`, if
/// it had one. A key the call remembers is the same callback again
/// (`Duplicate`, whatever the call's state now: the first was recorded),
/// or, with another body, a reuse of the key (refused). Otherwise `decide`
/// rules, and the first event it records carries the key, which `evolve`
/// adds to the call's keys. A callback that recorded nothing leaves no
/// key: its repeat is decided again, and answered the same.
fn keyed(
    state: &ThreadState,
    id: Option<&str>,
    key: Option<&IdempotencyKey>,
    decide: impl FnOnce(&ThreadState) -> Result<Decision, Rejection>,
) -> Result<Decision, Rejection> {
    let (Some(id), Some(key)) = (id, key) else {
        return decide(state);
    };
    if let Some(seen) = existing(state, id)?.keyed(&key.key) {
        return if seen.fingerprint == key.fingerprint {
            Ok(Decision::nothing(Outcome::Duplicate))
        } else {
            Err(Rejection::KeyReused {
                id: id.to_owned(),
                key: key.key.clone(),
            })
        };
    }
    let mut decision = decide(state)?;
    if let Some(first) = decision.changes.first_mut() {
        first.idempotency_key = Some(key.clone());
    }
    Ok(decision)
}

fn callback(state: &ThreadState, cb: &Callback) -> Result<Decision, Rejection> {
    // A view_update names no call: without its token's, there is none.
    let id = cb
        .call_id()
        .ok_or_else(|| Rejection::UnknownCall(String::new()))?;
    let call = existing(state, id)?;
    if call.status == CallStatus::PendingApproval {
        return Err(Rejection::NotDispatched(id.to_owned()));
    }
    let change = |kind| Ok(Decision::applied(vec![Change::of(id, kind)]));
    match cb {
        Callback::ToolResult(r) => match call.status {
            s if s.is_pending() => {
                let result = Change::of(
                    id,
                    EventKind::ToolResult {
                        text: r.model_text(),
                        content: r.content.clone(),
                        display_as: r.display_as.clone(),
                        is_error: r.is_error(),
                        subscription: r.subscription,
                        origin: ResultOrigin::Tool,
                        attempts: None,
                    },
                );
                let opens = r.subscription && !call.subscription_ended;
                if opens && state.meta.active_subscriptions.len() >= MAX_ACTIVE_SUBSCRIPTIONS {
                    // The thread holds all it may: the agent gets the
                    // result, the tool is told to stop.
                    let reason = format!(
                        "the thread already holds {MAX_ACTIVE_SUBSCRIPTIONS} active subscriptions, the most it may"
                    );
                    let cancelled = Change::of(
                        id,
                        EventKind::SubscriptionCancelled {
                            reason: Some(reason),
                        },
                    );
                    return Ok(Decision::applied(vec![result, cancelled]));
                }
                Ok(Decision::applied(vec![result]))
            }
            CallStatus::Cancelled => Ok(Decision::nothing(Outcome::Ignored)),
            // Completed, failed or subscribed: the outcome is already
            // recorded, and a call has exactly one (invariant 2).
            _ => Ok(Decision::nothing(Outcome::Duplicate)),
        },
        Callback::SubscriptionEvent(e) => match call.status {
            CallStatus::Cancelled => Err(Rejection::SubscriptionGone(id.to_owned())),
            _ if call.subscription_ended => Err(Rejection::SubscriptionGone(id.to_owned())),
            // Pending: the event overtook the result that opens the
            // subscription; keep it (invariant 6).
            s if s.is_pending() || s == CallStatus::Subscribed => {
                change(EventKind::SubscriptionEvent {
                    text: e.text.clone(),
                    associative: e.associative,
                    is_final: e.is_final,
                })
            }
            _ => Err(Rejection::NotSubscribed(id.to_owned())),
        },
        Callback::OAuth(o) => match call.status {
            CallStatus::AwaitingAuth if call.auth_url.as_deref() == Some(&o.auth_url) => {
                Ok(Decision::nothing(Outcome::Duplicate))
            }
            s if s.is_pending() => change(EventKind::OAuth {
                auth_url: o.auth_url.clone(),
            }),
            CallStatus::Cancelled => Ok(Decision::nothing(Outcome::Ignored)),
            _ => Ok(Decision::nothing(Outcome::Duplicate)),
        },
        Callback::UserChoice(c) => {
            let same = call.choice.as_ref().is_some_and(|p| {
                p.prompt == c.prompt && p.choices == c.choices && p.response_url == c.response_url
            });
            match call.status {
                CallStatus::AwaitingUser if same => Ok(Decision::nothing(Outcome::Duplicate)),
                s if s.is_pending() => change(EventKind::UserChoice {
                    prompt: c.prompt.clone(),
                    choices: c.choices.clone(),
                    default: c.default,
                    response_url: c.response_url.clone(),
                }),
                CallStatus::Cancelled => Ok(Decision::nothing(Outcome::Ignored)),
                _ => Ok(Decision::nothing(Outcome::Duplicate)),
            }
        }
        Callback::ViewUpdate(_) => unreachable!("a view_update names no call"),
    }
}
