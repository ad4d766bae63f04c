//! `GET /oxp/health` and `GET /oxp/tools`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::names::Index;
use super::wire::{OxpError, SCHEMA};
use super::Oxp;

/// 200 when a call could be made durable now, 503 otherwise. No auth.
pub async fn health(State(oxp): State<Arc<Oxp>>) -> StatusCode {
    match oxp.engine.ready().await {
        Ok(()) => StatusCode::OK,
        Err(e) => {
            tracing::warn!(error = %e, "OXP health: cannot accept calls");
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

/// Every servable tool version as a `ToolDefinition`, sorted by id.
pub async fn list(State(oxp): State<Arc<Oxp>>, headers: HeaderMap) -> Response {
    let caller = match oxp.auth.check(&headers) {
        Ok(caller) => caller,
        Err(e) => return OxpError::unauthorized(e.to_string()).into_response(),
    };
    // As `GET /v1/tools`: who neither submits nor reads may call nothing,
    // and is shown nothing.
    use crate::identity::Scope;
    let listed = if caller.identity.may(Scope::Read) || caller.identity.may(Scope::Submit) {
        oxp.engine.toolsets_for(&caller.identity)
    } else {
        vec![]
    };
    let index = Index::build(&listed);
    let items: Vec<Value> = index
        .all()
        .map(|t| {
            json!({
                "id": t.id,
                "name": t.name,
                "description": t.description,
                "version": t.version.to_string(),
                "input_schema": t.input_schema,
            })
        })
        .collect();
    Json(json!({"$schema": SCHEMA, "items": items})).into_response()
}
