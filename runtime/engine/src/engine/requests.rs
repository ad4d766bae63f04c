//! The engine's mutating requests as data: what the HTTP fronts ask of
//! the engine, each run by [`Engine::perform`] to its end.

use std::sync::Arc;

use ferry_proto::api::{SubmitCall, SubmitReply};

use super::calls::Submitted;
use super::{Engine, Error};
use crate::identity::{Identity, Scope};
use crate::thread::{Answer, CallRecord, Outcome, Reviewer};

/// A change an agent, a reviewer or a tool asks of a thread.
#[derive(Debug, Clone)]
pub enum Request {
    Submit {
        call: SubmitCall,
    },
    Callback {
        token: String,
        body: Vec<u8>,
        /// Its `Idempotency-Key`, quotes removed, if it had one.
        idempotency_key: Option<String>,
    },
    /// The token's call's `tool_result` was refused for its size (over
    /// `limit` bytes, when known): end the call (`Engine::result_refused`).
    ResultRefused {
        token: String,
        limit: Option<u64>,
    },
    CancelCall {
        group_id: String,
        id: String,
    },
    CancelSubscription {
        group_id: String,
        id: String,
    },
    Close {
        group_id: String,
    },
    Choose {
        group_id: String,
        id: String,
        index: Option<usize>,
        text: Option<String>,
        /// The user dismissed the prompt (neither `index` nor `text`).
        dismissed: bool,
    },
    Decide {
        group_id: String,
        id: String,
        option_id: String,
        reviewer: Reviewer,
        reason: Option<String>,
    },
    /// The call's requester takes back a call still waiting for approval
    /// (an ACP client's `cancelled` outcome).
    Withdraw {
        group_id: String,
        id: String,
    },
    RevokeGrant {
        group_id: String,
        tool: String,
    },
}

impl Request {
    /// The scope asking for this needs: none for a tool's callback, whose
    /// token is its authority.
    pub fn scope(&self) -> Option<Scope> {
        match self {
            Request::Submit { .. }
            | Request::CancelCall { .. }
            | Request::CancelSubscription { .. }
            | Request::Close { .. }
            | Request::Choose { .. }
            | Request::Withdraw { .. } => Some(Scope::Submit),
            Request::Decide { .. } | Request::RevokeGrant { .. } => Some(Scope::Review),
            Request::Callback { .. } | Request::ResultRefused { .. } => None,
        }
    }
}

/// What a request did.
#[derive(Debug, Clone)]
pub enum Reply {
    Submitted {
        created: bool,
        reply: SubmitReply,
    },
    /// A callback's outcome: `applied`, `duplicate` or `ignored`.
    Callback {
        outcome: String,
    },
    Call {
        call: Box<CallRecord>,
    },
    Closed {
        last_seq: u64,
    },
    Revoked,
}

impl Request {
    /// The thread the request is about, where the request names it (a
    /// callback's thread is inside its token).
    pub fn group_id(&self) -> Option<&str> {
        match self {
            Request::Submit { call } => Some(&call.group_id),
            Request::Callback { .. } | Request::ResultRefused { .. } => None,
            Request::CancelCall { group_id, .. }
            | Request::CancelSubscription { group_id, .. }
            | Request::Close { group_id }
            | Request::Choose { group_id, .. }
            | Request::Decide { group_id, .. }
            | Request::Withdraw { group_id, .. }
            | Request::RevokeGrant { group_id, .. } => Some(group_id),
        }
    }
}

impl Engine {
    /// Runs one request of `by` to its end. A callback is authorized by its
    /// token, whoever sends it; every other request acts in its thread
    /// only if `by` may ([`Identity::may_act_in`]).
    pub async fn perform(
        self: &Arc<Self>,
        by: &Identity,
        request: Request,
    ) -> Result<Reply, Error> {
        let call = |call: CallRecord| Reply::Call {
            call: Box::new(call),
        };
        let answered = |outcome: Outcome| Reply::Callback {
            outcome: outcome.name().to_owned(),
        };
        if let Some(scope) = request.scope() {
            super::tokens::require(by, scope)?;
        }
        Ok(match request {
            Request::Submit { call } => {
                let (submitted, reply) = self.submit(by, call).await?;
                Reply::Submitted {
                    created: submitted == Submitted::Created,
                    reply,
                }
            }
            Request::Callback {
                token,
                body,
                idempotency_key,
            } => answered(
                self.callback(&token, &body, idempotency_key.as_deref())
                    .await?,
            ),
            Request::ResultRefused { token, limit } => {
                answered(self.result_refused(&token, limit).await?)
            }
            Request::CancelCall { group_id, id } => {
                call(self.cancel_call(by, &group_id, &id).await?)
            }
            Request::Withdraw { group_id, id } => call(self.withdraw(by, &group_id, &id).await?),
            Request::CancelSubscription { group_id, id } => {
                call(self.cancel_subscription(by, &group_id, &id).await?)
            }
            Request::Close { group_id } => Reply::Closed {
                last_seq: self.close_thread(by, &group_id).await?,
            },
            Request::Choose {
                group_id,
                id,
                index,
                text,
                dismissed,
            } => {
                let answer = match (index, text, dismissed) {
                    (Some(i), None, false) => Answer::Index(i),
                    (None, Some(text), false) => Answer::Text(text),
                    (None, None, true) => Answer::Dismissed,
                    _ => {
                        return Err(Error::InvalidRequest(
                            "give exactly one of \"index\", \"choice\" or \"dismiss\": true".into(),
                        ))
                    }
                };
                call(self.answer_choice(by, &group_id, &id, answer).await?)
            }
            Request::Decide {
                group_id,
                id,
                option_id,
                reviewer,
                reason,
            } => call(
                self.decide_approval(by, &group_id, &id, &option_id, reviewer, reason)
                    .await?,
            ),
            Request::RevokeGrant { group_id, tool } => {
                self.revoke_grant(by, &group_id, &tool).await?;
                Reply::Revoked
            }
        })
    }
}
