//! `GET /v1/threads/{group_id}/acp`: the thread as Server-Sent Events of
//! ACP JSON-RPC messages. The SSE `id:` is the seq of the event a message
//! comes from; `Last-Event-ID` (or `?after=`) resumes after it. A permission
//! request is sent only while its call still waits for the answer.

use std::collections::HashMap;
use std::convert::Infallible;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use ferry_proto::api::{CallStatus, Event, EventKind};
use ferry_proto::rap::Annotations;
use futures::stream::{Stream, StreamExt};

use super::messages::message;
use crate::engine::Engine;
use crate::http::path::Path;
use crate::http::threads::{follow, resume_point};
use crate::http::{ApiError, AppState};

pub async fn stream(
    State(app): State<AppState>,
    Path(group_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let after = resume_point(&headers, &query)?;
    let engine = app.engine.clone();
    let messages = follow(app.engine.clone(), group_id, after)?.filter_map(move |e| {
        let engine = engine.clone();
        async move { to_sse(&engine, &e).await }
    });
    Ok(Sse::new(messages).keep_alive(KeepAlive::default()))
}

async fn to_sse(engine: &Engine, event: &Event) -> Option<Result<SseEvent, Infallible>> {
    if matches!(event.kind, EventKind::ApprovalRequested { .. })
        && !still_asked(engine, event).await
    {
        return None;
    }
    let lookup = |tool: &str| annotations(engine, tool);
    let message = message(event, &lookup)?;
    Some(Ok(SseEvent::default()
        .id(event.seq.to_string())
        .data(message.to_string())))
}

/// Whether the permission request of `event` still waits for an answer. A
/// client replaying the thread (from 0, say) is not asked again about a
/// call that was decided, cancelled or timed out since: its answer could
/// only be refused. When the call cannot be read the request is sent; an
/// answer to it is checked against the call anyway.
async fn still_asked(engine: &Engine, event: &Event) -> bool {
    let Some(id) = event.id.as_deref() else {
        return true;
    };
    match engine.call(&event.group_id, id).await {
        Ok(call) => call.status == CallStatus::PendingApproval,
        Err(_) => true,
    }
}

/// The annotations of `Toolset.tool@version`, while it is registered.
fn annotations(engine: &Engine, qualified: &str) -> Option<Annotations> {
    let (name, version) = qualified.rsplit_once('@')?;
    let (toolset, tool) = name.rsplit_once('.')?;
    let version = semver::Version::parse(version).ok()?;
    let loaded = engine.registry().get(toolset, Some(&version))?;
    loaded
        .stored
        .manifest
        .tools
        .iter()
        .find(|t| t.name == tool)?
        .annotations
        .clone()
}
