//! The baseline: a caller talking RAP straight to the tool, and the
//! callback receiver that completes its calls, nothing durable.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::{ensure, Context};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use ferry_proto::rap::{Callback, Invocation};
use serde_json::json;
use tokio::sync::oneshot;

use super::{serve, CALL_TIMEOUT, TOOL};

/// Pending baseline calls by `id`, each woken when its callback arrives.
type Pending = Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>;

/// The baseline's callback receiver: a loopback server that completes the
/// pending call a `tool_result` names. It keeps nothing.
#[derive(Clone)]
pub(super) struct Receiver {
    url: String,
    pending: Pending,
}

impl Receiver {
    pub(super) async fn start() -> anyhow::Result<Self> {
        let pending = Pending::default();
        let router = Router::new()
            .route("/cb", post(receive))
            .with_state(pending.clone());
        let addr = serve(router).await?;
        Ok(Self {
            url: format!("http://{addr}/cb"),
            pending,
        })
    }

    fn expect(&self, id: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id.to_owned(), tx);
        rx
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<()>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Parses the callback as Ferry would and wakes the waiting caller.
async fn receive(State(pending): State<Pending>, body: Bytes) -> StatusCode {
    let Ok(callback) = Callback::from_slice(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    let Some(id) = callback.call_id() else {
        return StatusCode::BAD_REQUEST;
    };
    let waiter = pending.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    match waiter {
        Some(tx) => {
            let _ = tx.send(());
            StatusCode::OK
        }
        None => StatusCode::NOT_FOUND,
    }
}

/// A baseline caller: RAP straight to the tool, nothing durable.
#[derive(Clone)]
pub(super) struct Baseline {
    pub(super) http: reqwest::Client,
    pub(super) endpoint: String,
    pub(super) receiver: Receiver,
}

impl Baseline {
    /// Invocation, ack, callback received.
    pub(super) async fn call(self, caller: usize, n: u64) -> anyhow::Result<()> {
        let id = format!("b{caller}-{n}");
        let done = self.receiver.expect(&id);
        let inv = Invocation {
            operation: TOOL.to_owned(),
            arguments: json!({"text": format!("hello {n}")}),
            id: id.clone(),
            call_id: None,
            callback_url: self.receiver.url.clone(),
            group_id: format!("baseline-{caller}"),
            thread_ancestors: None,
            user_id: None,
            // As Ferry sends it, so both carry the same bytes.
            identity: Some("anonymous".into()),
            user_verified: false,
        };
        let outcome = async {
            let r = self.http.post(&self.endpoint).json(&inv).send().await?;
            ensure!(r.status() == StatusCode::OK, "tool answered {}", r.status());
            tokio::time::timeout(CALL_TIMEOUT, done)
                .await
                .context("no callback in time")?
                .context("callback waiter dropped")
        }
        .await;
        if outcome.is_err() {
            self.receiver.lock().remove(&id);
        }
        outcome
    }
}
