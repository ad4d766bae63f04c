//! `notifications/cancelled` (MCP 2025 revisions, "Cancellation"): a client
//! that gives up on a `tools/call` of its session cancels the durable call
//! behind it, as `DELETE /v1/threads/{g}/calls/{id}` would, and is sent no
//! answer for it. Task-augmented calls are not tracked here: the spec has
//! them cancelled with `tasks/cancel`. Unknown, finished or malformed
//! references are ignored, as the spec allows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use super::tools::Accepted;
use crate::engine::requests::Request;
use crate::http::Perform;
use crate::identity::Identity;

/// A request, as the client named it: its session and its JSON-RPC id
/// (`7` and `"7"` are different ids).
type Key = (String, String);

/// The `tools/call`s still waiting for their call to settle, by request.
#[derive(Default)]
pub(super) struct Running(Arc<Mutex<HashMap<Key, Accepted>>>);

impl Running {
    /// Tracks `call`, the answer to request `id` of `session`, until the
    /// returned guard is dropped.
    pub fn track(&self, session: &str, id: &Value, call: &Accepted) -> Tracked {
        let key = (session.to_owned(), id.to_string());
        self.0
            .lock()
            .expect("running lock")
            .insert(key.clone(), call.clone());
        Tracked {
            running: self.0.clone(),
            key,
        }
    }

    /// Cancels the call behind the request a `notifications/cancelled` of
    /// `session` names, if it is still tracked.
    pub async fn cancelled(
        &self,
        perform: &dyn Perform,
        by: &Identity,
        session: &str,
        params: &Map<String, Value>,
    ) {
        let Some(id) = params
            .get("requestId")
            .filter(|id| id.is_string() || id.is_number())
        else {
            tracing::debug!("notifications/cancelled without a requestId ignored");
            return;
        };
        let key = (session.to_owned(), id.to_string());
        let Some(call) = self.0.lock().expect("running lock").remove(&key) else {
            tracing::debug!(request = ?id, "notifications/cancelled for no running tools/call ignored");
            return;
        };
        let reason = params.get("reason").and_then(Value::as_str).unwrap_or("");
        let request = Request::CancelCall {
            group_id: call.group_id.clone(),
            id: call.id.clone(),
        };
        match perform.perform(by, request).await {
            Ok(_) => {
                tracing::info!(group_id = ?call.group_id, id = ?call.id, reason, "MCP client cancelled its call")
            }
            // Settled meanwhile: "processing has already completed".
            Err(e) => {
                tracing::info!(group_id = ?call.group_id, id = ?call.id, error = %e, "MCP cancellation not applied")
            }
        }
    }
}

/// A tracked request; dropping it stops tracking.
pub(super) struct Tracked {
    running: Arc<Mutex<HashMap<Key, Accepted>>>,
    key: Key,
}

impl Tracked {
    /// Whether the client cancelled the request (its entry was taken).
    pub fn cancelled(&self) -> bool {
        !self
            .running
            .lock()
            .expect("running lock")
            .contains_key(&self.key)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.running.lock().expect("running lock").remove(&self.key);
    }
}
