//! Tools' callbacks: authenticate the token, parse the message, check it
//! names what the token was issued for, and apply it through the state
//! machine (which dedupes and refuses what does not match).

use ferry_proto::api::{CallStatus, EventKind};
use ferry_proto::idempotency::{self, IdempotencyKey};
use ferry_proto::rap::{Callback, Ending, Peek};
use tracing::{info, instrument, warn};

use super::{Engine, Error};
use crate::log_rate::LogRate;
use crate::metrics;
use crate::thread::{Command, Outcome};

/// Refused callbacks, logged a few a minute: anyone who can reach Ferry
/// can send them.
static REFUSED: LogRate = LogRate::new(std::time::Duration::from_secs(60), 5);

impl Engine {
    /// Applies one callback, under its `Idempotency-Key` (without quotes)
    /// if it had one. Returns what it did once that is durable.
    #[instrument(skip_all, fields(group_id, call_id))]
    pub async fn callback(
        &self,
        token: &str,
        body: &[u8],
        key: Option<&str>,
    ) -> Result<Outcome, Error> {
        let result = self.callback_inner(token, body, key).await;
        let (kind, outcome) = match &result {
            Ok((kind, outcome)) => (*kind, outcome.name()),
            Err(e) => {
                let kind = type_label(Peek::of(body).kind.as_deref());
                if let Some(suppressed) = REFUSED.admit() {
                    warn!(kind, error = %e, suppressed, "callback refused");
                }
                (kind, "rejected")
            }
        };
        ::metrics::counter!(metrics::CALLBACKS, "type" => kind, "outcome" => outcome).increment(1);
        result.map(|(_, outcome)| outcome)
    }

    /// Counts and logs a callback refused for its token before its body was
    /// read (403): someone probing callback URLs shows in both.
    pub fn forged_callback(&self) {
        if let Some(suppressed) = REFUSED.admit() {
            warn!(error = %Error::Forged, suppressed, "callback refused");
        }
        ::metrics::counter!(metrics::CALLBACKS, "type" => "unknown", "outcome" => "rejected")
            .increment(1);
    }

    /// Counts and logs a callback refused for its size (413), under the
    /// type its body named as far as `peek` read it: it never reaches
    /// [`Engine::callback`], which counts the others.
    pub fn oversized_callback(&self, peek: &Peek) {
        let kind = type_label(peek.kind.as_deref());
        if let Some(suppressed) = REFUSED.admit() {
            warn!(
                kind,
                suppressed, "callback refused: larger than the body limit"
            );
        }
        ::metrics::counter!(metrics::CALLBACKS, "type" => kind, "outcome" => "rejected")
            .increment(1);
    }

    /// Counts and logs a callback refused for its `Content-Type` (415): RAP
    /// tools send `application/json`.
    pub fn unsupported_callback(&self, content_type: Option<&str>) {
        if let Some(suppressed) = REFUSED.admit() {
            warn!(
                ?content_type,
                suppressed, "callback refused: not application/json"
            );
        }
        ::metrics::counter!(metrics::CALLBACKS, "type" => "unknown", "outcome" => "rejected")
            .increment(1);
    }

    /// Authenticates the token and parses the body, checking it names what
    /// the token was issued for: `(group_id, call id, callback)`.
    pub fn check_callback(
        &self,
        token: &str,
        body: &[u8],
    ) -> Result<(String, String, Callback), Error> {
        let (group_id, id) = self.caps.open(token).map_err(|_| Error::Forged)?;
        let callback = Callback::from_slice(body).map_err(|e| Error::BadCallback(e.to_string()))?;
        if callback.group_id() != group_id {
            return Err(Error::Mismatch(format!(
                "group_id {:?}",
                callback.group_id()
            )));
        }
        if let Some(named) = callback.call_id() {
            if named != id {
                return Err(Error::Mismatch(format!("call {named:?}")));
            }
        }
        Ok((group_id, id, callback))
    }

    /// Whether `token` is one this runtime minted (a callback capability).
    pub fn is_genuine(&self, token: &str) -> bool {
        self.caps.open(token).is_ok()
    }

    /// Whether a callback refused for its size is its token's call's
    /// `tool_result`, by what `peek` read of its body: then
    /// [`Engine::result_refused`] should end the call. A forged token, a
    /// body of another type, naming another call (or none), with one of
    /// those fields misshapen, or malformed JSON (a 400 had it fit), is
    /// only refused. A body cut where Ferry stopped reading it through
    /// counts by the fields read before the cut.
    pub fn is_refused_result(&self, token: &str, peek: &Peek) -> bool {
        let Ok((group_id, id)) = self.caps.open(token) else {
            return false;
        };
        peek.ending != Ending::Malformed
            && !peek.misshapen
            && peek.kind.as_deref() == Some("tool_result")
            && peek.group_id.as_deref() == Some(group_id.as_str())
            && peek.id.as_deref() == Some(id.as_str())
    }

    /// Ends the token's call with an error result in place of a
    /// `tool_result` refused for its size (`limit`, when known), since the
    /// tool will not send it again, and tells the tool the call is over.
    /// What ended already stays as it was.
    #[instrument(skip_all, fields(group_id, call_id))]
    pub async fn result_refused(&self, token: &str, limit: Option<u64>) -> Result<Outcome, Error> {
        let (group_id, id) = self.caps.open(token).map_err(|_| Error::Forged)?;
        in_call_span(&group_id, &id);
        let limit = limit.map_or(String::new(), |n| format!(" (at most {n} bytes)"));
        let text = format!(
            "Error: the tool's result was larger than this runtime accepts{limit}, so it could \
             not be recorded. Ask for a smaller result (fewer items, a narrower range) and call \
             the tool again."
        );
        let command = Command::ResultRefused {
            id: id.clone(),
            text,
        };
        let executed = self.execute(&group_id, command).await?;
        let outcome = executed.decision.outcome;
        if outcome == Outcome::Applied {
            warn!(group_id, call_id = ?id, "the tool's result was too large to record; the call failed");
            ::metrics::counter!(metrics::OUTCOMES, "status" => "failed").increment(1);
            self.tell_cancelled(&group_id, &executed.state.calls[&id]);
        }
        Ok(outcome)
    }

    async fn callback_inner(
        &self,
        token: &str,
        body: &[u8],
        key: Option<&str>,
    ) -> Result<(&'static str, Outcome), Error> {
        let (group_id, id, callback) = self.check_callback(token, body)?;
        in_call_span(&group_id, &id);
        let kind = callback.kind();
        let key = key
            .map(|key| {
                idempotency::check(key).map_err(|e| Error::BadCallback(e.to_string()))?;
                Ok::<_, Error>(IdempotencyKey {
                    key: key.to_owned(),
                    // The body as it came: a retry sends the same bytes.
                    fingerprint: crate::digest::sha256_hex(body, 8),
                })
            })
            .transpose()?;
        let command = match callback {
            // A view_update names no call; its token's must still be open.
            Callback::ViewUpdate(update) => Command::View {
                id: id.clone(),
                update,
                key,
            },
            callback => Command::Callback { callback, key },
        };
        let executed = self.execute(&group_id, command).await?;
        let outcome = executed.decision.outcome;
        for event in &executed.events {
            match &event.kind {
                EventKind::ToolResult {
                    subscription: true, ..
                } if executed.state.calls[&id].status == CallStatus::Subscribed => {
                    info!(group_id, call_id = ?id, "subscription opened");
                }
                EventKind::ToolResult { is_error, .. } => {
                    let status = executed.state.calls[&id].status;
                    ::metrics::counter!(metrics::OUTCOMES, "status" => status_label(status))
                        .increment(1);
                    info!(group_id, call_id = ?id, ?status, is_error, "call finished");
                }
                EventKind::SubscriptionCancelled { .. } => {
                    warn!(
                        group_id, call_id = ?id, limit = crate::thread::MAX_ACTIVE_SUBSCRIPTIONS,
                        "subscription refused: the thread holds as many active subscriptions as it may"
                    );
                    self.tell_cancelled(&group_id, &executed.state.calls[&id]);
                }
                EventKind::SubscriptionEvent { is_final: true, .. }
                    if executed.state.calls[&id].status == CallStatus::Completed =>
                {
                    info!(group_id, call_id = ?id, "subscription ended");
                }
                _ => {}
            }
        }
        if outcome != Outcome::Applied {
            info!(group_id, call_id = ?id, kind, ?outcome, "callback had no effect");
        }
        Ok((kind, outcome))
    }
}

/// Names the call in the current span, once the token has said which.
fn in_call_span(group_id: &str, id: &str) {
    let span = tracing::Span::current();
    span.record("group_id", group_id);
    span.record("call_id", id);
}

/// A status as its API name (`awaiting_auth`), for metric labels: serde's
/// rename is the one list of names.
fn status_label(status: CallStatus) -> String {
    serde_json::to_value(status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The callback type a refused body names, if it is one of RAP's, for the
/// metrics label; `unknown` otherwise (only refusals pay for reading it).
fn type_label(named: Option<&str>) -> &'static str {
    Callback::TYPES
        .into_iter()
        .find(|k| named == Some(*k))
        .unwrap_or("unknown")
}
