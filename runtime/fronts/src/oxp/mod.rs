//! The OXP 1.0 server under `/oxp` (`GET /health`, `GET /tools`,
//! `POST /tools/call`): a thin adapter over the engine's call path, never a
//! side path. Shapes follow `oxp-1.0-openapi.json`; the name mapping is in
//! `names`, the thread rule and result mapping in `call`, credentials in
//! `auth`.

mod auth;
mod call;
mod names;
mod tools;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;

use crate::engine::Engine;
use crate::http::Perform;

pub use auth::AuthConfig;
pub use call::thread_of;
pub use names::oxp_part;

/// How `ferry serve` configures OXP.
#[derive(Debug, Clone)]
pub struct OxpConfig {
    pub auth: AuthConfig,
    /// How long `tools/call` waits for a call to settle before answering
    /// "retry with the same call_id" (under the clients' usual 60 s timeout).
    pub wait: Duration,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
}

impl Default for OxpConfig {
    fn default() -> Self {
        Self {
            auth: AuthConfig::default(),
            wait: Duration::from_secs(30),
            max_body_bytes: 1 << 20,
        }
    }
}

/// The OXP handlers' shared state.
pub struct Oxp {
    engine: Arc<Engine>,
    /// Where calls are submitted: the engine, detached from the client.
    perform: Arc<dyn Perform>,
    auth: auth::Auth,
    /// A call is a change: a page on another site must not make one
    /// through a browser when no credentials are configured.
    origins: crate::http::origin::Origins,
    wait: Duration,
    max_body_bytes: usize,
}

/// The `/oxp` routes, to merge beside the native API.
pub fn router(engine: Arc<Engine>, perform: Arc<dyn Perform>, config: &OxpConfig) -> Router {
    let state = Arc::new(Oxp {
        origins: crate::http::origin::Origins::new(&engine.config().public_url, &[]),
        engine,
        perform,
        auth: auth::Auth::new(&config.auth),
        wait: config.wait,
        max_body_bytes: config.max_body_bytes,
    });
    Router::new()
        .route("/oxp/health", get(tools::health))
        .route("/oxp/tools", get(tools::list))
        .route("/oxp/tools/call", post(call::call))
        .with_state(state)
}
