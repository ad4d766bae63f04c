//! The engine's mutating requests as data. A single process runs them
//! directly; in the cluster a runtime node journals them, relays them over
//! NATS, and a worker runs them here and sends the [`Reply`] back.

use std::sync::Arc;

use ferry_proto::api::{ErrorBody, SubmitCall, SubmitReply};
use serde::{Deserialize, Serialize};

use super::calls::Submitted;
use super::{Engine, Error};
use crate::thread::{Answer, CallRecord, Outcome, Rejection};

/// A change an agent, a reviewer or a tool asks of a thread.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    Submit {
        call: SubmitCall,
        /// The tool the node that took the call resolved its `operation`
        /// to (`Toolset.tool@version`), set by [`Engine::precheck`]: the
        /// worker applies the call to that tool, not to whatever its own
        /// registry resolves the name to, which may lag the node's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
    },
    Callback {
        token: String,
        #[serde(with = "serde_bytes")]
        body: Vec<u8>,
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
        /// Written only when set: older workers read the same request.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        dismissed: bool,
    },
    Decide {
        group_id: String,
        id: String,
        option_id: String,
        reviewer: String,
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

/// What a request did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
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
    /// Journaled on a runtime node whose bus is unreachable (or whose
    /// workers did not answer in time): durable, applied when relayed. A
    /// submission's `id` (given or generated) comes back with it.
    Journaled {
        id: Option<String>,
    },
}

/// A refusal as it crosses the wire: the HTTP status and the error body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Refusal {
    pub status: u16,
    pub body: ErrorBody,
}

impl Refusal {
    /// The engine error a refusal stands for where the protocol fronts tell
    /// it apart; any other keeps its status and message as
    /// [`Error::Refused`]. `id` is the call the refused submission named.
    pub fn into_submit_error(self, id: &str) -> Error {
        let detail = &self.body.error;
        match detail.code.as_str() {
            "unknown_tool" => Error::UnknownTool(detail.message.clone()),
            "ambiguous_tool" => Error::AmbiguousTool(detail.message.clone()),
            "invalid_request" => Error::InvalidRequest(detail.message.clone()),
            "invalid_arguments" => {
                Error::InvalidArguments(detail.parameter_errors.clone().unwrap_or_default())
            }
            "conflict" => Error::Rejected(Rejection::Conflict(id.to_owned())),
            "thread_closed" => Error::Rejected(Rejection::ThreadClosed),
            _ => Error::Refused(self),
        }
    }
}

impl Request {
    /// The thread the request is about, where the request names it (a
    /// callback's thread is inside its token).
    pub fn group_id(&self) -> Option<&str> {
        match self {
            Request::Submit { call, .. } => Some(&call.group_id),
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
    /// Runs one request to its end.
    pub async fn perform(self: &Arc<Self>, request: Request) -> Result<Reply, Error> {
        let call = |call: CallRecord| Reply::Call {
            call: Box::new(call),
        };
        let answered = |outcome: Outcome| Reply::Callback {
            outcome: outcome.name().to_owned(),
        };
        Ok(match request {
            Request::Submit { call, tool } => {
                let (submitted, reply) = self.submit_to(call, tool.as_deref()).await?;
                Reply::Submitted {
                    created: submitted == Submitted::Created,
                    reply,
                }
            }
            Request::Callback { token, body } => answered(self.callback(&token, &body).await?),
            Request::ResultRefused { token, limit } => {
                answered(self.result_refused(&token, limit).await?)
            }
            Request::CancelCall { group_id, id } => call(self.cancel_call(&group_id, &id).await?),
            Request::Withdraw { group_id, id } => call(self.withdraw(&group_id, &id).await?),
            Request::CancelSubscription { group_id, id } => {
                call(self.cancel_subscription(&group_id, &id).await?)
            }
            Request::Close { group_id } => Reply::Closed {
                last_seq: self.close_thread(&group_id).await?,
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
                call(self.answer_choice(&group_id, &id, answer).await?)
            }
            Request::Decide {
                group_id,
                id,
                option_id,
                reviewer,
                reason,
            } => call(
                self.decide_approval(&group_id, &id, &option_id, &reviewer, reason)
                    .await?,
            ),
            Request::RevokeGrant { group_id, tool } => {
                self.revoke_grant(&group_id, &tool).await?;
                Reply::Revoked
            }
        })
    }

    /// What a runtime node can check before it journals a request, without
    /// reading the thread: ids, the tool and its arguments, a callback's
    /// token and body. Fills in a submission's `id` when absent, so the
    /// agent learns it even when the request is only journaled.
    pub fn precheck(&self, request: &mut Request) -> Result<(), Error> {
        match request {
            Request::Submit { call, tool } => {
                *tool = self.check_submission(call)?.map(|r| r.qualified);
                if call.id.is_none() {
                    call.id = Some(super::calls::fresh_id());
                }
                Ok(())
            }
            Request::Callback { token, body } => self.check_callback(token, body).map(drop),
            Request::ResultRefused { token, .. } => {
                self.caps.open(token).map(drop).map_err(|_| Error::Forged)
            }
            Request::CancelCall { group_id, id }
            | Request::CancelSubscription { group_id, id }
            | Request::Choose { group_id, id, .. }
            | Request::Decide { group_id, id, .. }
            | Request::Withdraw { group_id, id } => {
                self.check_id("group_id", group_id)?;
                self.check_id("id", id)
            }
            Request::Close { group_id } | Request::RevokeGrant { group_id, .. } => {
                self.check_id("group_id", group_id)
            }
        }
    }

    /// Whether a submission `precheck` refused for its tool or arguments
    /// names a call already in its thread: then it is a retry, answered by
    /// that call ([`Engine::submit`]), not refused.
    pub async fn retries_a_call(&self, request: &Request, refused: &Error) -> bool {
        let Request::Submit { call, .. } = request else {
            return false;
        };
        let Some(id) = &call.id else { return false };
        refused.rests_on_toolsets()
            && matches!(self.store.call(&call.group_id, id).await, Ok(Some(_)))
    }

    /// The thread a request is about, callbacks included.
    pub fn thread_of(&self, request: &Request) -> Result<String, Error> {
        match request {
            Request::Callback { token, .. } | Request::ResultRefused { token, .. } => self
                .caps
                .open(token)
                .map(|(group_id, _)| group_id)
                .map_err(|_| Error::Forged),
            other => Ok(other.group_id().unwrap_or_default().to_owned()),
        }
    }
}
