//! The native HTTP API (axum). Handlers are thin: parse, call the engine,
//! shape the answer. Status codes and error codes are chosen in `error`.

mod approvals;
mod audit;
pub mod auth;
pub(crate) mod body;
mod callbacks;
pub(crate) mod calls;
mod consumers;
mod error;
pub(crate) mod host;
pub mod jwt;
mod media;
mod ops;
pub(crate) mod origin;
pub(crate) mod path;
pub(crate) mod threads;
mod tokens;
mod toolsets;
mod ui;
mod views;

use ferry_proto::ErrorCode;
use std::sync::Arc;

use axum::routing::{delete, get, post};
use axum::Router;

use crate::engine::requests::{Reply, Request};
use crate::engine::Engine;
use crate::identity::Identity;
use ferry_proto::api::SubmitCall;

pub use error::{status_of, ApiError};

/// The token of an `Authorization: Bearer <token>` header value (the
/// scheme is case-insensitive, RFC 7235).
pub(crate) fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Runs an engine command to its end even if the client goes away. axum
/// drops a handler's future when its connection closes; a command cut
/// between its write and its flush would leave the thread's new events
/// unpublished to readers (and a new call undispatched).
pub(crate) async fn detached<T, F>(command: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T, crate::engine::Error>> + Send + 'static,
{
    match tokio::spawn(command).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            ErrorCode::InternalError,
            format!("the command did not complete: {e}"),
        )),
    }
}

/// Where mutating requests go: the engine of this process, which decides
/// each against its thread's log and answers once the decision is durable
/// (sled in `ferry serve`, JetStream on a cluster node).
#[async_trait::async_trait]
pub trait Perform: Send + Sync + 'static {
    /// Runs `request`, asked by `by` ([`Engine::perform`]).
    async fn perform(&self, by: &Identity, request: Request)
        -> Result<Reply, crate::engine::Error>;
}

/// The engine, detached from the connection.
pub struct Local(pub Arc<Engine>);

#[async_trait::async_trait]
impl Perform for Local {
    async fn perform(
        &self,
        by: &Identity,
        request: Request,
    ) -> Result<Reply, crate::engine::Error> {
        let (engine, by) = (self.0.clone(), by.clone());
        match tokio::spawn(async move { engine.perform(&by, request).await }).await {
            Ok(result) => result,
            Err(e) => Err(crate::engine::Error::Internal(format!(
                "the command did not complete: {e}"
            ))),
        }
    }
}

/// Submits a call for a protocol front (MCP, OXP) the way the native API
/// does, through `perform`; returns the call's id. Refusals are engine
/// errors, so each front keeps one mapping.
pub(crate) async fn submit_call(
    perform: &dyn Perform,
    by: &Identity,
    mut call: SubmitCall,
) -> Result<String, crate::engine::Error> {
    let id = call
        .id
        .get_or_insert_with(crate::engine::calls::fresh_id)
        .clone();
    match perform.perform(by, Request::Submit { call }).await? {
        Reply::Submitted { reply, .. } => Ok(reply.id),
        other => Err(crate::engine::Error::Internal(format!(
            "unexpected reply {other:?} to the submission of {id:?}"
        ))),
    }
}

/// A reply of an unexpected kind: a bug.
pub(crate) fn unexpected(reply: Reply) -> ApiError {
    ApiError::new(
        ErrorCode::InternalError,
        format!("unexpected reply {reply:?}"),
    )
}

/// Renders the Prometheus exposition of the process's metrics.
pub type MetricsRender = Arc<dyn Fn() -> String + Send + Sync>;

#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    pub metrics: Option<MetricsRender>,
    pub perform: Arc<dyn Perform>,
}

impl AppState {
    pub(crate) async fn perform(&self, by: &Identity, request: Request) -> Result<Reply, ApiError> {
        Ok(self.perform.perform(by, request).await?)
    }
}

/// The whole native API of a single process, answering to loopback names,
/// the public URL's and `hosts` (as `/mcp` does).
pub fn router(
    engine: Arc<Engine>,
    metrics: Option<MetricsRender>,
    tokens: auth::ApiTokens,
    hosts: &[String],
) -> Router {
    let perform = Arc::new(Local(engine.clone()));
    router_with(engine, metrics, perform, tokens, hosts)
}

/// The whole native API, with mutating requests going to `perform`. With
/// `tokens`, all of it but tools' callbacks, the health check and the
/// dashboard's page asks for one of them. Requests must name Ferry in
/// `Host` (`origin::refuse_foreign_host`), changes come only from Ferry's
/// own origin (`origin::refuse_cross_site`), and bodies are declared JSON
/// (`media::require_json`).
pub fn router_with(
    engine: Arc<Engine>,
    metrics: Option<MetricsRender>,
    perform: Arc<dyn Perform>,
    tokens: auth::ApiTokens,
    hosts: &[String],
) -> Router {
    let open = Router::new()
        .route("/v1/callbacks/{token}", post(callbacks::receive))
        .route("/ui", get(ui::page))
        .route("/ui/", get(ui::page))
        .route("/healthz", get(ops::healthz));
    let app = AppState {
        engine: engine.clone(),
        metrics,
        perform,
    };
    let guarded = guarded_routes(&app).layer(axum::middleware::from_fn_with_state(
        tokens.with_named(engine.clone()),
        auth::authenticate,
    ));
    let origins = origin::Origins::new(&engine.config().public_url, hosts);
    // The last layer runs first: `Host`, then `Origin`, then the body's type.
    open.merge(guarded)
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        // Bodies are limited by `body::read_bytes`, which answers 413 itself.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(
            engine.config().max_body_bytes,
            media::require_json,
        ))
        .layer(axum::middleware::from_fn_with_state(
            origins.clone(),
            origin::refuse_cross_site,
        ))
        .layer(axum::middleware::from_fn_with_state(
            origins,
            origin::refuse_foreign_host,
        ))
        .with_state(app)
}

/// Every route an API token guards (when there are tokens), each with the
/// scope it needs: administration `admin`; a thread's routes the thread
/// within reach (and `read` to read it); `/v1/whoami` none, as every
/// caller may learn who it is; the rest check in their handler, or in the
/// engine for what they change.
fn guarded_routes(app: &AppState) -> Router<AppState> {
    let admin = Router::new()
        .route("/v1/toolsets", post(toolsets::register).get(toolsets::list))
        .route(
            "/v1/toolsets/{name}",
            get(toolsets::show)
                .delete(toolsets::remove)
                .patch(toolsets::set_policy),
        )
        .route("/v1/toolsets/{name}/refresh", post(toolsets::refresh))
        .route("/v1/tokens", post(tokens::create).get(tokens::list))
        .route("/v1/tokens/{id}", delete(tokens::revoke))
        .route("/v1/audit", get(audit::list))
        .route_layer(axum::middleware::from_fn(auth::admin_only));
    let thread = Router::new()
        .route("/v1/threads/{group_id}", get(threads::show))
        .route("/v1/threads/{group_id}/calls", get(threads::calls))
        .route(
            "/v1/threads/{group_id}/calls/{id}",
            get(calls::show).delete(calls::cancel),
        )
        .route(
            "/v1/threads/{group_id}/calls/{id}/choice",
            post(calls::choose),
        )
        .route("/v1/threads/{group_id}/events", get(threads::events))
        .route("/v1/threads/{group_id}/stream", get(threads::stream))
        .route(
            "/v1/threads/{group_id}/acp",
            get(crate::acp::stream).post(crate::acp::respond),
        )
        .route(
            "/v1/threads/{group_id}/subscriptions/{id}",
            delete(threads::cancel_subscription),
        )
        .route("/v1/threads/{group_id}/close", post(threads::close))
        .route(
            "/v1/threads/{group_id}/grants/{tool}",
            delete(approvals::revoke),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            auth::thread_access,
        ));
    Router::new()
        .merge(admin)
        .merge(thread)
        .route("/v1/whoami", get(tokens::whoami))
        .route(
            "/v1/consumers",
            post(consumers::create).get(consumers::list),
        )
        .route(
            "/v1/consumers/{name}",
            get(consumers::show).delete(consumers::delete),
        )
        .route("/v1/consumers/{name}/next", get(consumers::next))
        .route("/v1/consumers/{name}/ack", post(consumers::ack))
        .route("/v1/consumers/{name}/replay", post(consumers::replay))
        .route("/v1/tools", get(toolsets::tools))
        .route("/v1/calls", post(calls::submit))
        .route("/v1/threads", get(threads::list))
        .route("/v1/approvals", get(approvals::list))
        .route("/v1/approvals/{group_id}/{id}", post(approvals::decide))
        .route("/metrics", get(ops::metrics))
}
