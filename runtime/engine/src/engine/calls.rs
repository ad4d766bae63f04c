//! Agents' calls: submit (with idempotent resubmission), cancel, the
//! built-in `cancel_subscription`, and closing a thread.

use ferry_proto::api::{CallStatus, EventKind, SubmitCall, SubmitReply};
use ferry_proto::bus::Work;
use ferry_proto::Invocation;
use tracing::{info, instrument};

use super::{Engine, Error, Executed};
use crate::identity::{Identity, Reach};
use crate::metrics;
use crate::thread::{CallRecord, Command, NewCall, Outcome, Rejection, Submission};
use crate::toolsets::{self, ResolveError, CANCEL_SUBSCRIPTION};

/// Whether a submission created the call or found it already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    Created,
    Existing,
}

impl Engine {
    /// Validates, records and enqueues a call. Answers once it is durable.
    #[instrument(skip_all, fields(group_id = ?req.group_id, call_id = req.id.as_deref()))]
    pub async fn submit(
        &self,
        by: &Identity,
        req: SubmitCall,
    ) -> Result<(Submitted, SubmitReply), Error> {
        let result = self.submit_inner(by, req.normalized()).await;
        if let Err(e) = &result {
            ::metrics::counter!(metrics::CALLS_REJECTED, "code" => e.code().as_str()).increment(1);
        }
        result
    }

    /// Everything about a submission that can be checked without reading
    /// its thread: ids, the tool, and the arguments against its schema.
    /// Returns the resolved tool (none for the built-in
    /// `cancel_subscription`).
    pub fn check_submission(&self, req: &SubmitCall) -> Result<Option<toolsets::Resolved>, Error> {
        self.check_id("group_id", &req.group_id)?;
        if let Some(id) = &req.id {
            self.check_id("id", id)?;
        }
        for ancestor in req.thread_ancestors.iter().flatten() {
            self.check_id("thread_ancestors entry", ancestor)?;
        }
        if req.operation.is_empty() {
            return Err(Error::InvalidRequest("operation must not be empty".into()));
        }
        if req.operation == CANCEL_SUBSCRIPTION {
            toolsets::check_arguments(toolsets::cancel_subscription_validator(), &req.arguments)
                .map_err(Error::InvalidArguments)?;
            Ok(None)
        } else {
            let resolved = self.resolve(&req.operation)?;
            toolsets::check_arguments(&resolved.validator, &req.arguments)
                .map_err(Error::InvalidArguments)?;
            Ok(Some(resolved))
        }
    }

    fn resolve(&self, operation: &str) -> Result<toolsets::Resolved, Error> {
        self.registry.resolve(operation).map_err(|e| match e {
            ResolveError::Ambiguous { .. } => Error::AmbiguousTool(e.to_string()),
            _ => Error::UnknownTool(e.to_string()),
        })
    }

    async fn submit_inner(
        &self,
        by: &Identity,
        req: SubmitCall,
    ) -> Result<(Submitted, SubmitReply), Error> {
        let mut req = req;
        req.user_id = by
            .user_for(req.user_id.as_deref())
            .map_err(|e| Error::Forbidden(e.to_string()))?;
        let resolved = match self.check_submission(&req) {
            Err(refused) if refused.rests_on_toolsets() && req.id.is_some() => {
                return self.resubmit(by, req, refused).await;
            }
            checked => checked?,
        };
        if let Some(resolved) = &resolved {
            if !by.may_call(&resolved.toolset, &resolved.target.tool_name) {
                return Err(Error::Forbidden(format!(
                    "{} may not call {}",
                    by.name(),
                    resolved.qualified
                )));
            }
            self.within_rate_limits(by, &req, resolved).await?;
        }
        self.check_ancestors(by, req.thread_ancestors.as_deref())
            .await?;
        let id = req.id.clone().unwrap_or_else(fresh_id);
        if req.id.is_none() {
            // The span names the call from here on, with the id Ferry chose.
            tracing::Span::current().record("call_id", id.as_str());
        }
        let group_id = req.group_id.clone();
        let (command, target) = if let Some(resolved) = resolved {
            let gate = match resolved.approval_timeout {
                Some(secs) => Some(
                    self.gate(
                        by,
                        &resolved.qualified,
                        secs,
                        &req.group_id,
                        req.thread_ancestors.as_deref(),
                    )
                    .await?,
                ),
                None => None,
            };
            let target = Some(resolved.target);
            let mut call = new_call(by, req, id.clone(), resolved.qualified, target);
            call.gate = gate;
            (Command::Submit(call), None)
        } else {
            let target = req.arguments["tool_call_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let call = new_call(by, req, id.clone(), CANCEL_SUBSCRIPTION.into(), None);
            (
                Command::CancelSubscriptionTool {
                    call,
                    target: target.clone(),
                },
                Some(target),
            )
        };
        let Executed {
            decision,
            state,
            turn,
            ..
        } = self.execute_in_turn(by, &group_id, command).await?;
        if let Some(turn) = &turn {
            // Calls of one thread accepted at once go out in seq order.
            turn.come().await;
        }
        let call = &state.calls[&id];
        if decision.outcome != Outcome::Applied {
            // Still queued: the first submission may have been cut short
            // before it reached the bus. Enqueue again; the worker skips
            // work for calls no longer queued (invariant 4 allows a tool to
            // see an id twice).
            if call.status == CallStatus::Queued && target.is_none() {
                self.enqueue(&group_id, call, state.meta.ancestors.as_deref())
                    .await?;
            }
            return Ok((Submitted::Existing, reply(&group_id, call)));
        }
        ::metrics::counter!(metrics::CALLS_ACCEPTED).increment(1);
        info!(
            operation = ?call.submission.operation, tool = ?call.tool, user_id = call.submission.user_id.as_deref().unwrap_or(""),
            at = %call.created_at, "call accepted"
        );
        if let Some(cancelled) = target {
            let did_cancel = decision
                .changes
                .iter()
                .any(|c| matches!(c.kind, EventKind::SubscriptionCancelled { .. }));
            if did_cancel {
                self.call_cancelled(&group_id, &state.calls[&cancelled]);
            }
        } else {
            match call.status {
                CallStatus::Queued => {
                    self.enqueue(&group_id, call, state.meta.ancestors.as_deref())
                        .await?
                }
                CallStatus::PendingApproval => {
                    info!(tool = ?call.tool, deadline = %call.approval_deadline.map_or_else(String::new, |d| d.to_string()), "approval requested");
                    self.arm(&group_id, call);
                }
                _ => {}
            }
        }
        Ok((Submitted::Created, reply(&group_id, call)))
    }

    /// Takes a token from each bucket the call counts against (Ferry's
    /// limits, then its toolset's), or refuses it: 429, nothing recorded.
    async fn within_rate_limits(
        &self,
        by: &Identity,
        req: &SubmitCall,
        resolved: &toolsets::Resolved,
    ) -> Result<(), Error> {
        let tool = format!("{}.{}", resolved.toolset, resolved.target.tool_name);
        let user = req.user_id.as_deref();
        let mut buckets = self.config.rate_limits.buckets("", by.name(), user, &tool);
        let scope = format!("toolset:{}", resolved.toolset);
        buckets.extend(resolved.rate_limits.buckets(&scope, by.name(), user, &tool));
        if buckets.is_empty() {
            return Ok(());
        }
        let Err(wait) = self
            .buckets
            .take(&buckets, super::now().as_millis())
            .await?
        else {
            return Ok(());
        };
        // A retry of an accepted call changes nothing: no limit holds it.
        if let Some(id) = &req.id {
            if self.store.call(&req.group_id, id).await?.is_some() {
                return Ok(());
            }
        }
        Err(Error::RateLimited {
            message: format!(
                "{} is over a rate limit for {tool}: retry in {} ms",
                by.name(),
                wait.as_millis().max(1)
            ),
            retry_after: wait,
        })
    }

    /// A submission refused for its tool or arguments may be the retry of a
    /// call accepted before its toolset changed (deleted, refreshed, or its
    /// name now clashing): the existing call answers it as it answers any
    /// retry (invariant 2), 409 if the body differs. Otherwise `refused`.
    async fn resubmit(
        &self,
        by: &Identity,
        req: SubmitCall,
        refused: Error,
    ) -> Result<(Submitted, SubmitReply), Error> {
        let (group_id, id) = (req.group_id.clone(), req.id.clone().unwrap_or_default());
        let submission = new_call(by, req, id.clone(), String::new(), None).submission;
        let command = Command::Resubmit {
            id: id.clone(),
            submission,
        };
        let executed = match self.execute_as(by, &group_id, command).await {
            Err(Error::Rejected(Rejection::UnknownCall(_))) => return Err(refused),
            executed => executed?,
        };
        let call = &executed.state.calls[&id];
        if call.status == CallStatus::Queued {
            // As for any retry: its first submission may have been cut
            // short before it reached the bus.
            let ancestors = executed.state.meta.ancestors.as_deref();
            self.enqueue(&group_id, call, ancestors).await?;
        }
        Ok((Submitted::Existing, reply(&group_id, call)))
    }

    /// Refuses `ancestors` naming a thread `by` may not act in, whose
    /// grants it would otherwise borrow. One that does not exist yet is
    /// not refused; [`Engine::gate`] skips it if another identity creates
    /// it later.
    async fn check_ancestors(
        &self,
        by: &Identity,
        ancestors: Option<&[String]>,
    ) -> Result<(), Error> {
        if *by.reach() == Reach::Everywhere {
            return Ok(());
        }
        for ancestor in ancestors.unwrap_or_default() {
            let foreign = match self.store.thread(ancestor).await? {
                Some(meta) => !by.may_act_in(ancestor, &meta),
                None => !by.may_reach(ancestor),
            };
            if foreign {
                return Err(Rejection::ForeignThread(ancestor.clone()).into());
            }
        }
        Ok(())
    }

    /// The ancestors thread `group_id` recorded, for an [`Engine::enqueue`]
    /// that has no state of the thread in hand.
    pub(crate) async fn recorded_ancestors(
        &self,
        group_id: &str,
    ) -> Result<Option<Vec<String>>, Error> {
        Ok(self.store.thread(group_id).await?.and_then(|t| t.ancestors))
    }

    /// Hands a queued call to the bus.
    pub(crate) async fn enqueue(
        &self,
        group_id: &str,
        call: &CallRecord,
        thread_ancestors: Option<&[String]>,
    ) -> Result<(), Error> {
        let work = self.work_for(group_id, call, thread_ancestors);
        if let Some(work) = work.and_then(|work| self.admit(group_id, call, work)) {
            self.bus.publish(work).await?;
        }
        Ok(())
    }

    /// The dispatch of a queued call to its tool (none for a built-in
    /// tool): the RAP invocation, with the call's capability in its
    /// callback URL. The invocation's `thread_ancestors` are the thread's
    /// recorded ones, else the call's.
    pub fn work_for(
        &self,
        group_id: &str,
        call: &CallRecord,
        thread_ancestors: Option<&[String]>,
    ) -> Option<Work> {
        let target = call.target.as_ref()?;
        let token = self.caps.mint(group_id, &call.id);
        let invocation = Invocation {
            operation: target.tool_name.clone(),
            arguments: call.submission.arguments.clone(),
            id: call.id.clone(),
            call_id: call.submission.call_id.clone(),
            callback_url: format!("{}/v1/callbacks/{token}", self.config.public_url),
            group_id: group_id.to_owned(),
            thread_ancestors: thread_ancestors
                .map(<[String]>::to_vec)
                .or_else(|| call.submission.thread_ancestors.clone()),
            user_id: call.submission.user_id.clone(),
            identity: call.identity.clone(),
            user_verified: call.user_verified,
        };
        Some(Work::Dispatch {
            endpoint: self.registry.authorised(&target.base_url, &target.endpoint),
            invocation,
        })
    }

    /// Cancels a pending call, or the subscription it opened.
    #[instrument(skip(self))]
    pub async fn cancel_call(
        &self,
        by: &Identity,
        group_id: &str,
        id: &str,
    ) -> Result<CallRecord, Error> {
        let executed = self
            .execute_as(by, group_id, Command::Cancel { id: id.into() })
            .await?;
        let call = executed.state.calls[id].clone();
        if call.status == CallStatus::Cancelled {
            self.call_cancelled(group_id, &call);
        }
        Ok(call)
    }

    /// Cancels a call still waiting for approval (a client cancelled its
    /// permission prompt). One decided meanwhile is refused (409), in the
    /// same decision, so a racing approval and cancel yield one outcome.
    pub async fn withdraw(
        &self,
        by: &Identity,
        group_id: &str,
        id: &str,
    ) -> Result<CallRecord, Error> {
        self.end(by, group_id, id, Command::Withdraw { id: id.into() })
            .await
    }

    /// Cancels an active subscription of this thread.
    #[instrument(skip(self))]
    pub async fn cancel_subscription(
        &self,
        by: &Identity,
        group_id: &str,
        id: &str,
    ) -> Result<CallRecord, Error> {
        let command = Command::CancelSubscription { id: id.into() };
        self.end(by, group_id, id, command).await
    }

    /// Runs `command`, which cancels call `id` or refuses, and ends what
    /// the call still had here.
    async fn end(
        &self,
        by: &Identity,
        group_id: &str,
        id: &str,
        command: Command,
    ) -> Result<CallRecord, Error> {
        let executed = self.execute_as(by, group_id, command).await?;
        let call = executed.state.calls[id].clone();
        self.call_cancelled(group_id, &call);
        Ok(call)
    }

    /// Ends what a cancelled call (or subscription) still had here, its
    /// approval timeout, and tells its tool server.
    fn call_cancelled(&self, group_id: &str, call: &CallRecord) {
        self.disarm(group_id, &call.id);
        info!(group_id, call_id = call.id, "call cancelled");
        ::metrics::counter!(metrics::OUTCOMES, "status" => "cancelled").increment(1);
        self.tell_cancelled(group_id, call);
    }

    /// Closes a thread: what is open in it is cancelled (each call's tool
    /// is told, as for any cancel), later calls are refused, and the tool
    /// servers that had calls in it are told the thread is closed.
    #[instrument(skip(self))]
    pub async fn close_thread(&self, by: &Identity, group_id: &str) -> Result<u64, Error> {
        self.check_id("group_id", group_id)?;
        let executed = match self.execute_as(by, group_id, Command::Close).await {
            // One commit carrying every open call is more than the store
            // takes (NATS's `max_payload`, in a cluster): end them one
            // commit each, then close what is left.
            Err(Error::Store(crate::store::Error::TooLarge(_))) => {
                let open = self.store.load(group_id, &[]).await?.meta.unsettled;
                for id in open {
                    match self.cancel_call(by, group_id, &id).await {
                        Ok(_) | Err(Error::Rejected(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                self.execute_as(by, group_id, Command::Close).await?
            }
            executed => executed?,
        };
        if executed.decision.outcome == Outcome::Applied {
            for event in &executed.events {
                let ended = matches!(
                    event.kind,
                    EventKind::CallCancelled {} | EventKind::SubscriptionCancelled { .. }
                );
                // `Close` reads every call it may end.
                let call = event
                    .id
                    .as_ref()
                    .and_then(|id| executed.state.calls.get(id));
                if let (true, Some(call)) = (ended, call) {
                    self.call_cancelled(group_id, call);
                }
            }
            // Only the servers that had calls here (`ThreadMeta::tool_servers`).
            let servers = (executed.state.meta.tool_servers.iter())
                .map(|server| self.registry.authorised(server, server))
                .collect();
            tokio::spawn(self.notifier.close_thread(servers, group_id));
        }
        Ok(executed.state.meta.last_seq)
    }
}

/// A call id for a submission that named none.
pub fn fresh_id() -> String {
    format!("call_{}", uuid::Uuid::new_v4().simple())
}

fn new_call(
    by: &Identity,
    req: SubmitCall,
    id: String,
    tool: String,
    target: Option<ferry_proto::api::ToolTarget>,
) -> NewCall {
    NewCall {
        id,
        identity: by.name().to_owned(),
        // `user_for` took the user from the credential, or refused it.
        user_verified: by.vouches_for_users() && req.user_id.is_some(),
        submission: Submission {
            operation: req.operation,
            arguments: req.arguments,
            call_id: req.call_id,
            user_id: req.user_id,
            thread_ancestors: req.thread_ancestors,
        },
        tool,
        target,
        gate: None,
    }
}

fn reply(group_id: &str, call: &CallRecord) -> SubmitReply {
    SubmitReply {
        group_id: group_id.to_owned(),
        id: call.id.clone(),
        status: call.status,
        seq: call.accepted_seq,
        result: call.result.clone().filter(|_| call.target.is_none()),
    }
}
