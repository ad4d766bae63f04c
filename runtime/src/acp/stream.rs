//! `GET /v1/threads/{group_id}/acp`: the thread as Server-Sent Events of
//! ACP JSON-RPC messages. The SSE `id:` is the seq of the event a message
//! comes from; `Last-Event-ID` (or `?after=`) resumes after it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use ferry_proto::api::Event;
use ferry_proto::rap::Annotations;
use futures::stream::{self, Stream, StreamExt};

use super::messages::message;
use crate::engine::Engine;
use crate::http::{ApiError, AppState};

/// Events read per page.
const PAGE: usize = 1000;

fn invalid(message: &str) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
}

pub async fn stream(
    State(app): State<AppState>,
    Path(group_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let seq = |v: &str| v.trim().parse::<u64>().ok();
    let after = match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(seq)
            .ok_or_else(|| invalid("Last-Event-ID must be a sequence number"))?,
        None => match query.get("after") {
            Some(v) => seq(v).ok_or_else(|| invalid("after must be a sequence number"))?,
            None => 0,
        },
    };
    let engine = app.engine.clone();
    let tip = engine.watch(&group_id)?;
    let pages = stream::unfold((after, tip), move |(cursor, mut tip)| {
        let engine = engine.clone();
        let group_id = group_id.clone();
        async move {
            loop {
                match engine.events(&group_id, cursor, PAGE, Duration::ZERO).await {
                    Ok(events) if !events.is_empty() => {
                        let next = events.last().map_or(cursor, |e| e.seq);
                        return Some((events, (next, tip)));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(group_id = %group_id, error = %e, "ACP stream read failed");
                        return None;
                    }
                }
                tip.wait_for(|seq| *seq > cursor).await.ok()?;
            }
        }
    });
    let engine = app.engine.clone();
    let messages = pages.flat_map(move |page| {
        let engine = engine.clone();
        stream::iter(page.into_iter().filter_map(move |e| to_sse(&engine, &e)))
    });
    Ok(Sse::new(messages).keep_alive(KeepAlive::default()))
}

fn to_sse(engine: &Engine, event: &Event) -> Option<Result<SseEvent, Infallible>> {
    let lookup = |tool: &str| annotations(engine, tool);
    let message = message(event, &lookup)?;
    Some(Ok(SseEvent::default()
        .id(event.seq.to_string())
        .data(message.to_string())))
}

/// The annotations of `Toolset.tool@version`, while it is registered.
fn annotations(engine: &Engine, qualified: &str) -> Option<Annotations> {
    let (name, version) = qualified.rsplit_once('@')?;
    let (toolset, tool) = name.rsplit_once('.')?;
    let version = semver::Version::parse(version).ok()?;
    let loaded = engine.registry.get(toolset, Some(&version))?;
    loaded
        .stored
        .manifest
        .tools
        .iter()
        .find(|t| t.name == tool)?
        .annotations
        .clone()
}
