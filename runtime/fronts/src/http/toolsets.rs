//! `/v1/toolsets` and `/v1/tools`.

use ferry_proto::ErrorCode;
use std::collections::{BTreeMap, HashMap};

use super::auth::Caller;
use super::path::Path;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::body::JsonBody;
use super::{detached, ApiError, AppState};
use crate::engine::RegisteredToolset;
use crate::identity::Scope;
use crate::limits::RateLimits;
use crate::toolsets::{
    cancel_subscription_schema, ApprovalMode, ApprovalPolicy, PolicyPatch, ToolPolicy,
    CANCEL_SUBSCRIPTION,
};

/// `POST /v1/toolsets`: where to fetch the manifest, under which version,
/// and Ferry's approval policy for its tools.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Register {
    url: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    approval: Option<ApprovalMode>,
    #[serde(default)]
    tools: BTreeMap<String, ToolPolicy>,
    #[serde(default)]
    approval_timeout_secs: Option<u64>,
    #[serde(default)]
    rate_limits: RateLimits,
    #[serde(default)]
    max_concurrent_calls: Option<u32>,
}

pub async fn register(
    State(app): State<AppState>,
    Caller(by): Caller,
    JsonBody(req): JsonBody<Register>,
) -> Result<(StatusCode, Json<RegisteredToolset>), ApiError> {
    // No policy given: a version already registered keeps its own.
    let policy = ApprovalPolicy {
        approval: req.approval,
        tools: req.tools,
        approval_timeout_secs: req.approval_timeout_secs,
        rate_limits: req.rate_limits,
        max_concurrent_calls: req.max_concurrent_calls,
    };
    let policy = (policy != ApprovalPolicy::default()).then_some(policy);
    let engine = app.engine.clone();
    let registered = detached(async move {
        engine
            .register_toolset(&by, &req.url, req.version.as_deref(), policy)
            .await
    })
    .await?;
    Ok((StatusCode::CREATED, Json(registered)))
}

/// `PATCH /v1/toolsets/{name}[?version=]`: changes the approval policy of
/// one version, or of all, without fetching the manifest again.
pub async fn set_policy(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    JsonBody(patch): JsonBody<PolicyPatch>,
) -> Result<Json<Value>, ApiError> {
    let version = version(&query)?;
    let (engine, n) = (app.engine.clone(), name.clone());
    let changed =
        detached(async move { engine.set_policy(&by, &n, version.as_ref(), &patch).await }).await?;
    Ok(Json(json!({"name": name, "versions": changed})))
}

pub async fn list(State(app): State<AppState>) -> Json<Value> {
    Json(json!({"toolsets": app.engine.toolsets()}))
}

/// `GET /v1/toolsets/{name}[?version=]`: every version registered, or
/// only the one asked for (404 when it is not), with the latest of all.
pub async fn show(
    State(app): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let wanted = version(&query)?;
    let mut versions = app.engine.toolset(&name)?;
    let latest = crate::toolsets::latest_by(&versions, |v| &v.version).cloned();
    if let Some(wanted) = &wanted {
        versions.retain(|v| v.version == *wanted);
        if versions.is_empty() {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!("no toolset {name:?} at version {wanted}"),
            ));
        }
    }
    Ok(Json(
        json!({"name": name, "latest": latest, "versions": versions}),
    ))
}

/// `?version=`, read as an operation's `@version` is: `1` and `1.2` are
/// `1.0.0` and `1.2.0`.
fn version(query: &HashMap<String, String>) -> Result<Option<semver::Version>, ApiError> {
    query
        .get("version")
        .map(|v| {
            crate::toolsets::parse_version(v)
                .map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.to_string()))
        })
        .transpose()
}

pub async fn refresh(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<RegisteredToolset>, ApiError> {
    let version = version(&query)?;
    Ok(Json(
        detached({
            let engine = app.engine.clone();
            async move { engine.refresh_toolset(&by, &name, version.as_ref()).await }
        })
        .await?,
    ))
}

pub async fn remove(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let version = version(&query)?;
    let (engine, n) = (app.engine.clone(), name.clone());
    let removed =
        detached(async move { engine.delete_toolset(&by, &n, version.as_ref()).await }).await?;
    Ok(Json(json!({"name": name, "removed_versions": removed})))
}

/// Every callable tool: each toolset's tools by qualified name (with the
/// bare name where it is unambiguous), and the built-in tools.
/// Only the tools the caller may call are shown.
pub async fn tools(
    State(app): State<AppState>,
    Caller(by): Caller,
) -> Result<Json<Value>, ApiError> {
    super::auth::need(&by, &[Scope::Read, Scope::Submit])?;
    let mut tools = vec![json!({
        "name": CANCEL_SUBSCRIPTION,
        "qualified": CANCEL_SUBSCRIPTION,
        "builtin": true,
        "description": "Cancel an active subscription of this thread, named by the call that opened it.",
        "inputSchema": cancel_subscription_schema(),
    })];
    for toolset in app.engine.toolsets() {
        for tool in toolset.tools {
            if !by.may_call(&toolset.name, &tool.name) {
                continue;
            }
            let bare = toolset.available.contains(&tool.name);
            tools.push(json!({
                "name": tool.name,
                "qualified": tool.qualified,
                "bare_name_callable": bare,
                "toolset": toolset.name,
                "version": toolset.version,
                "description": tool.description,
                "inputSchema": tool.input_schema,
                "annotations": tool.annotations,
            }));
        }
    }
    Ok(Json(json!({"tools": tools})))
}
