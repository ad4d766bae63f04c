//! `POST /v1/calls`, `GET` and `DELETE /v1/threads/{group_id}/calls/{id}`.

use ferry_proto::ErrorCode;
use std::collections::HashMap;

use super::path::Path;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use ferry_proto::api::SubmitCall;
use ferry_proto::rap::{DisplaySegment, KnownSegment};
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Caller;
use super::body::JsonBody;
use super::views::CallView;
use super::{unexpected, ApiError, AppState};
use crate::engine::requests::{Reply, Request};
use crate::identity::Identity;
use axum::response::{IntoResponse, Response};

/// 202 when the call is new and durable; 200 when the same call was already
/// submitted (nothing new is dispatched).
pub async fn submit(
    State(app): State<AppState>,
    Caller(by): Caller,
    JsonBody(req): JsonBody<SubmitCall>,
) -> Result<Response, ApiError> {
    match app.perform(&by, Request::Submit { call: req }).await? {
        Reply::Submitted { created, reply } => {
            let status = if created {
                StatusCode::ACCEPTED
            } else {
                StatusCode::OK
            };
            Ok((status, Json(reply)).into_response())
        }
        other => Err(unexpected(other)),
    }
}

/// Shapes a reply that carries a call.
pub(crate) async fn call_reply(
    app: &AppState,
    by: &Identity,
    group_id: &str,
    request: Request,
) -> Result<Response, ApiError> {
    match app.perform(by, request).await? {
        Reply::Call { call } => Ok(Json(CallView::new(group_id, *call)).into_response()),
        other => Err(unexpected(other)),
    }
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

/// `POST /v1/threads/{g}/calls/{id}/choice`: `{"index": i}`,
/// `{"choice": "text"}`, or `{"dismiss": true}` (the prompt's `default`
/// is sent, rap-3).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Choice {
    /// Any JSON number, so a negative or huge index is out of range (422)
    /// like any other ([`choice_index`]).
    #[serde(default)]
    index: Option<serde_json::Number>,
    #[serde(default)]
    choice: Option<String>,
    #[serde(default)]
    dismiss: bool,
}

pub async fn choose(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path((group_id, id)): Path<(String, String)>,
    JsonBody(choice): JsonBody<Choice>,
) -> Result<Response, ApiError> {
    let given = [
        choice.index.is_some(),
        choice.choice.is_some(),
        choice.dismiss,
    ];
    if given.into_iter().filter(|g| *g).count() != 1 {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "give exactly one of \"index\", \"choice\" or \"dismiss\": true",
        ));
    }
    let index = choice.index.as_ref().map(choice_index).transpose()?;
    let request = Request::Choose {
        group_id: group_id.clone(),
        id,
        index,
        text: choice.choice,
        dismissed: choice.dismiss,
    };
    call_reply(&app, &by, &group_id, request).await
}

/// An answer's index as a position among the choices (the state machine
/// checks it against them). Negative and huge integers (serde_json reads
/// those beyond 64 bits as floats) are out of range, 422 like any other;
/// a number with a fraction is malformed, 400.
fn choice_index(n: &serde_json::Number) -> Result<usize, ApiError> {
    let out_of_range = || {
        ApiError::new(
            ErrorCode::InvalidChoice,
            format!("index {n} is not one of the choices"),
        )
    };
    if let Some(i) = n.as_u64() {
        return usize::try_from(i).map_err(|_| out_of_range());
    }
    match n.as_f64() {
        // `2.0` is the integer 2, as JSON Schema counts it.
        Some(f) if f.fract() == 0.0 && (0.0..=u32::MAX.into()).contains(&f) => Ok(f as usize),
        Some(f) if f.fract() == 0.0 => Err(out_of_range()),
        _ => Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("index {n} is not an integer"),
        )),
    }
}

pub async fn cancel(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path((group_id, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let request = Request::CancelCall {
        group_id: group_id.clone(),
        id,
    };
    call_reply(&app, &by, &group_id, request).await
}
