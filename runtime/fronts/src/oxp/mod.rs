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
    /// Names besides loopback and the public URL's that requests may give
    /// in `Host` (as for the native API and `/mcp`).
    pub allowed_hosts: Vec<String>,
}

impl Default for OxpConfig {
    fn default() -> Self {
        Self {
            auth: AuthConfig::default(),
            wait: Duration::from_secs(30),
            max_body_bytes: 1 << 20,
            allowed_hosts: vec![],
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
    let origins =
        crate::http::origin::Origins::new(&engine.config().public_url, &config.allowed_hosts);
    let state = Arc::new(Oxp {
        origins: origins.clone(),
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
        // A page whose name was made to point at this machine (DNS
        // rebinding) is refused before any tool is listed or called.
        .layer(axum::middleware::from_fn_with_state(
            origins,
            refuse_foreign_host,
        ))
        .with_state(state)
}

/// The native API's `Host` check, answered as an OXP error: 400 with the
/// reason for the developer.
async fn refuse_foreign_host(
    axum::extract::State(origins): axum::extract::State<crate::http::origin::Origins>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match crate::http::origin::foreign_host(&origins, &request) {
        Some(refusal) => wire::OxpError::server(
            "Requests naming another server are refused",
            refusal.body.error.message,
        )
        .into_response(),
        None => next.run(request).await,
    }
}
