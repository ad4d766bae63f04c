//! `POST /v1/calls`, `GET` and `DELETE /v1/threads/{group_id}/calls/{id}`.

use std::collections::HashMap;

use super::path::Path;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use ferry_proto::api::{SubmitCall, SubmitReply};
use ferry_proto::rap::{DisplaySegment, KnownSegment};
use serde::Deserialize;
use serde_json::{json, Value};

use super::body::JsonBody;
use super::views::CallView;
use super::{detached, ApiError, AppState};
use crate::engine::calls::Submitted;

/// 202 when the call is new and durable; 200 when the same call was already
/// submitted (nothing new is dispatched).
pub async fn submit(
    State(app): State<AppState>,
    JsonBody(req): JsonBody<SubmitCall>,
) -> Result<(StatusCode, Json<SubmitReply>), ApiError> {
    let engine = app.engine.clone();
    let (submitted, reply) = detached(async move { engine.submit(req).await }).await?;
    let status = match submitted {
        Submitted::Created => StatusCode::ACCEPTED,
        Submitted::Existing => StatusCode::OK,
    };
    Ok((status, Json(reply)))
}

/// `GET /v1/threads/{g}/calls/{id}[?display=diff,text]`: with `display`,
/// the answer also carries `display`: the first segment of the result's
/// `display_as` whose type is listed, else the plain text (rap-2
/// "Rendering Behavior").
pub async fn show(
    State(app): State<AppState>,
    Path((group_id, id)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let call = app.engine.call(&group_id, &id).await?;
    let display = query.get("display").map(|types| {
        let wanted: Vec<&str> = types.split(',').map(str::trim).collect();
        render(call.result.as_ref(), &wanted)
    });
    let mut view = serde_json::to_value(CallView::new(&group_id, call)).expect("views serialize");
    if let Some(display) = display {
        view["display"] = display;
    }
    Ok(Json(view))
}

/// The first supported segment, or the text fallback; `null` before there
/// is a result.
fn render(result: Option<&ferry_proto::api::CallResult>, wanted: &[&str]) -> Value {
    let Some(result) = result else {
        return Value::Null;
    };
    let segment_type = |s: &DisplaySegment| match s {
        DisplaySegment::Known(KnownSegment::Text(_)) => Some("text".to_owned()),
        DisplaySegment::Known(KnownSegment::Diff(_)) => Some("diff".to_owned()),
        DisplaySegment::Known(KnownSegment::Image(_)) => Some("image".to_owned()),
        DisplaySegment::Other(v) => v.get("type").and_then(Value::as_str).map(str::to_owned),
    };
    result
        .display_as
        .iter()
        .flatten()
        .find(|s| segment_type(s).is_some_and(|t| wanted.contains(&t.as_str())))
        .map(|s| serde_json::to_value(s).expect("segments serialize"))
        .unwrap_or_else(|| json!({"type": "text", "content": result.text}))
}

/// `POST /v1/threads/{g}/calls/{id}/choice`: `{"index": i}` or
/// `{"choice": "text"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Choice {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    choice: Option<String>,
}

pub async fn choose(
    State(app): State<AppState>,
    Path((group_id, id)): Path<(String, String)>,
    JsonBody(choice): JsonBody<Choice>,
) -> Result<Json<CallView>, ApiError> {
    let answer = match (choice.index, choice.choice) {
        (Some(i), None) => crate::thread::Answer::Index(i),
        (None, Some(text)) => crate::thread::Answer::Text(text),
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "give exactly one of \"index\" or \"choice\"",
            ))
        }
    };
    let (engine, g) = (app.engine.clone(), group_id.clone());
    let call = detached(async move { engine.answer_choice(&g, &id, answer).await }).await?;
    Ok(Json(CallView::new(&group_id, call)))
}

pub async fn cancel(
    State(app): State<AppState>,
    Path((group_id, id)): Path<(String, String)>,
) -> Result<Json<CallView>, ApiError> {
    let (engine, g) = (app.engine.clone(), group_id.clone());
    let call = detached(async move { engine.cancel_call(&g, &id).await }).await?;
    Ok(Json(CallView::new(&group_id, call)))
}
