//! `/v1/tokens`: named API tokens, made, listed and revoked with the
//! `admin` scope. A token's secret is in the answer that made it, and
//! nowhere else ever again.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::auth::Caller;
use super::body::JsonBody;
use super::path::Path;
use super::{detached, ApiError, AppState};
use crate::credential::{StoredToken, TokenSpec};

/// A token's record as the API shows it: everything but its digest.
fn view(token: &StoredToken) -> Value {
    let mut value = serde_json::to_value(token).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        fields.remove("digest");
        fields.insert("live".into(), json!(token.live()));
    }
    value
}

/// `POST /v1/tokens`: 201 with the record and `token`, the secret.
pub async fn create(
    State(app): State<AppState>,
    Caller(by): Caller,
    JsonBody(spec): JsonBody<TokenSpec>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let engine = app.engine.clone();
    let made = detached(async move { engine.create_token(&by, spec).await }).await?;
    let mut answer = view(&made.record);
    answer["token"] = json!(made.secret);
    Ok((StatusCode::CREATED, Json(answer)))
}

/// `GET /v1/tokens`: every token's record, oldest first, revoked ones too.
pub async fn list(
    State(app): State<AppState>,
    Caller(by): Caller,
) -> Result<Json<Value>, ApiError> {
    let tokens: Vec<Value> = app.engine.tokens(&by)?.iter().map(view).collect();
    Ok(Json(json!({ "tokens": tokens })))
}

/// `DELETE /v1/tokens/{id}`: 200 with the revoked record; 404 for an
/// unknown id.
pub async fn revoke(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let engine = app.engine.clone();
    let revoked = detached(async move { engine.revoke_token(&by, &id).await }).await?;
    Ok(Json(view(&revoked)))
}

/// `GET /v1/whoami`: the caller's identity, scopes and bounds, for any
/// caller, so that a client (the dashboard) can tell whom its credential
/// names and what it may do before it tries. Without credentials
/// configured, that is `anonymous` with every scope.
pub async fn whoami(Caller(by): Caller) -> Json<Value> {
    let scopes: Vec<&str> = by.scopes().iter().map(|s| s.name()).collect();
    Json(json!({
        "identity": by.name(),
        "scopes": scopes,
        "bounds": by.bounds(),
    }))
}
