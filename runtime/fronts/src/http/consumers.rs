//! `/v1/consumers`: durable delivery cursors over every thread's events
//! (docs/api.md "Consumers"). Made and deleted with `admin`; read, pulled
//! from and acknowledged with `read`, by identities whose reach covers the
//! consumer's threads.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use ferry_proto::ErrorCode;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Caller;
use super::body::JsonBody;
use super::path::Path;
use super::threads::number;
use super::{detached, ApiError, AppState};
use ferry_engine::consumer::ConsumerSpec;

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message)
}

fn view(view: impl serde::Serialize) -> Value {
    serde_json::to_value(view).unwrap_or_default()
}

/// `POST /v1/consumers`: 201 when made, 200 when the same one was there,
/// 409 when one of the name differs.
pub async fn create(
    State(app): State<AppState>,
    Caller(by): Caller,
    JsonBody(spec): JsonBody<ConsumerSpec>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let engine = app.engine.clone();
    let (made, new) = detached(async move { engine.create_consumer(&by, spec).await }).await?;
    let status = if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view(made))))
}

/// `GET /v1/consumers`: those the caller may read.
pub async fn list(
    State(app): State<AppState>,
    Caller(by): Caller,
) -> Result<Json<Value>, ApiError> {
    let all = app.engine.list_consumers(&by).await?;
    Ok(Json(json!({ "consumers": all })))
}

/// `GET /v1/consumers/{name}`: its spec, lag and dead letters.
pub async fn show(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(view(app.engine.show_consumer(&by, &name).await?)))
}

/// `DELETE /v1/consumers/{name}`.
pub async fn delete(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let engine = app.engine.clone();
    let deleted = name.clone();
    detached(async move { engine.delete_consumer(&by, &name).await }).await?;
    Ok(Json(json!({ "deleted": deleted })))
}

/// `GET /v1/consumers/{name}/next?max=100&wait=30`.
pub async fn next(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let max = number::<usize>(&query, "max")?.unwrap_or(100);
    let wait = number::<f64>(&query, "wait")?.unwrap_or(0.0);
    if !wait.is_finite() || wait < 0.0 {
        return Err(invalid("wait must be a non-negative number of seconds"));
    }
    let wait = Duration::try_from_secs_f64(wait).map_err(|_| invalid("wait is too long"))?;
    let events = app.engine.consumer_next(&by, &name, max, wait).await?;
    Ok(Json(json!({ "events": events })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replay {
    from: ferry_engine::delivery::ReplayFrom,
    #[serde(default)]
    group_id: Option<String>,
}

/// `POST /v1/consumers/{name}/replay` `{"from": {"seq": N} | {"time": T},
/// "group_id"?}`: `{"threads": n}`, how many threads deliver again.
pub async fn replay(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<Replay>,
) -> Result<Json<Value>, ApiError> {
    let engine = app.engine.clone();
    let moved = detached(async move {
        engine
            .consumer_replay(&by, &name, body.from, body.group_id.as_deref())
            .await
    })
    .await?;
    Ok(Json(json!({ "threads": moved })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Acks {
    acks: Vec<Ack>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Ack {
    group_id: String,
    seq: u64,
}

/// `POST /v1/consumers/{name}/ack` `{"acks": [{"group_id", "seq"}]}`:
/// idempotent; what changed nothing is listed in `ignored`, with why.
pub async fn ack(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<Acks>,
) -> Result<Json<Value>, ApiError> {
    let acks: Vec<(String, u64)> = body.acks.into_iter().map(|a| (a.group_id, a.seq)).collect();
    let engine = app.engine.clone();
    let reply = detached(async move { engine.consumer_ack(&by, &name, &acks).await }).await?;
    Ok(Json(view(reply)))
}
