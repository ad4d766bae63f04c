//! A thread's metadata, its events (long-poll and SSE), cancelling its
//! subscriptions, and closing it.

use ferry_proto::ErrorCode;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use super::auth::Caller;
use super::path::Path;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::Json;
use ferry_proto::api::{Event, EventKind};
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::views::{CallView, ThreadView};
use super::{unexpected, ApiError, AppState};
use crate::engine::requests::{Reply, Request};
use crate::engine::{reads, Engine};
use crate::identity::Scope;

/// Events per page when `limit` is not given, and the most one page holds.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// `GET /v1/threads?limit=N`: the most recently active threads.
/// Only threads within the caller's reach are listed.
pub async fn list(
    State(app): State<AppState>,
    Caller(by): Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    super::auth::need(&by, &[Scope::Read])?;
    let limit = page_size(&query, 50, 500)?;
    let threads: Vec<ThreadView> = app
        .engine
        .recent_threads_of(&by, limit)
        .await?
        .into_iter()
        .map(ThreadView::from)
        .collect();
    Ok(Json(json!({"threads": threads})))
}

/// `GET /v1/threads/{group_id}/calls`: the thread's calls, oldest first.
pub async fn calls(
    State(app): State<AppState>,
    Path(group_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let calls: Vec<CallView> = app
        .engine
        .calls(&group_id)
        .await?
        .into_iter()
        .map(|c| CallView::new(&group_id, c))
        .collect();
    Ok(Json(json!({"group_id": group_id, "calls": calls})))
}

pub async fn show(
    State(app): State<AppState>,
    Path(group_id): Path<String>,
) -> Result<Json<ThreadView>, ApiError> {
    Ok(Json(app.engine.thread(&group_id).await?.into()))
}

fn invalid(message: String) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message)
}

pub(crate) fn number<T: std::str::FromStr>(
    query: &HashMap<String, String>,
    name: &str,
) -> Result<Option<T>, ApiError> {
    query
        .get(name)
        .map(|v| {
            v.parse()
                .map_err(|_| invalid(format!("{name}={v:?} is not a valid number")))
        })
        .transpose()
}

/// `?limit=`: `default` when absent; a page never holds more than `max`,
/// so a larger limit is served as `max`; `0` asks for nothing and is
/// refused, as are negatives and non-numbers.
fn page_size(
    query: &HashMap<String, String>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    let too_big = query.get("limit").is_some_and(|v| {
        v.parse::<usize>()
            .is_err_and(|e| *e.kind() == std::num::IntErrorKind::PosOverflow)
    });
    if too_big {
        // Larger than any page, however large: served as `max`.
        return Ok(max);
    }
    match number::<usize>(query, "limit")? {
        None => Ok(default),
        Some(0) => Err(invalid("limit must be at least 1".into())),
        Some(n) => Ok(n.min(max)),
    }
}

/// `?types=tool_result,subscription_event`: the event types a reader
/// wants; the others are skipped (their sequence numbers still advance the
/// reader's position). An agent that only waits for results reads one event
/// per call instead of three.
#[derive(Debug, Clone, Default)]
pub(crate) struct Types(Option<Vec<&'static str>>);

impl Types {
    fn parse(query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let Some(list) = query.get("types") else {
            return Ok(Self(None));
        };
        let names = list
            .split(',')
            .map(|name| {
                let name = name.trim();
                EventKind::NAMES
                    .into_iter()
                    .find(|known| *known == name)
                    .ok_or_else(|| {
                        invalid(format!(
                            "types: {name:?} is not an event type (known: {})",
                            EventKind::NAMES.join(", ")
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self(Some(names)))
    }

    fn wants(&self, event: &Event) -> bool {
        self.0
            .as_ref()
            .is_none_or(|names| names.contains(&event.kind.name()))
    }
}

/// `GET /v1/threads/{group_id}/events?after=N&wait=S&limit=L&types=T,U`.
/// With `types`, a page holds the wanted events of the first page (of
/// `limit` events) that has any, scanning up to `MAX_SCANNED` events;
/// `next_after` is where the scan stopped, and a long-poll waits for a
/// wanted event (or the deadline).
pub async fn events(
    State(app): State<AppState>,
    Path(group_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let types = Types::parse(&query)?;
    let after = number::<u64>(&query, "after")?.unwrap_or(0);
    let limit = page_size(&query, DEFAULT_LIMIT, MAX_LIMIT)?;
    let wait = number::<f64>(&query, "wait")?.unwrap_or(0.0);
    if !wait.is_finite() || wait < 0.0 {
        return Err(invalid(
            "wait must be a non-negative number of seconds".into(),
        ));
    }
    // The documented bound holds for the whole request, however many pages
    // of filtered-out events it reads.
    let max_wait = app.engine.config().max_wait_secs as f64;
    let deadline = Instant::now() + Duration::from_secs_f64(wait.min(max_wait));
    let mut next = after;
    let mut scanned = 0;
    loop {
        let wait = deadline.saturating_duration_since(Instant::now());
        let page = app.engine.events(&group_id, next, limit, wait).await?;
        let Some(last) = page.last() else {
            // Nothing new before the deadline.
            return Ok(Json(json!({"events": [], "next_after": next})));
        };
        next = last.seq;
        scanned += page.len();
        // A full page may have more behind it: scan on (with or without
        // `wait`, the same), up to a bound per request, so an empty page
        // only means the scan stopped there.
        let more = page.len() == limit && scanned < MAX_SCANNED;
        let events: Vec<Event> = page.into_iter().filter(|e| types.wants(e)).collect();
        if !events.is_empty() || (!more && Instant::now() >= deadline) {
            return Ok(Json(json!({"events": events, "next_after": next})));
        }
    }
}

/// Events one filtered read scans at most before it answers an empty page
/// (with `next_after` where it stopped): a thread of millions of unwanted
/// events costs a request this much, not the whole log.
const MAX_SCANNED: usize = 10 * MAX_LIMIT;

/// `GET /v1/threads/{group_id}/stream`: Server-Sent Events whose `id:` is
/// the sequence number; resumes after `Last-Event-ID`, or `?after=`; only
/// the `?types=` wanted, when given.
pub async fn stream(
    State(app): State<AppState>,
    Path(group_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let types = Types::parse(&query)?;
    let after = resume_point(&headers, &query)?;
    let events = follow(app.engine.clone(), group_id, after)?
        .filter(move |event| std::future::ready(types.wants(event)))
        .map(to_sse);
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

/// Where a stream resumes: after `Last-Event-ID`, else `?after=`, else 0.
/// An empty `Last-Event-ID` is none: in the SSE model an empty last event
/// id means the client has none (an `id:` line with no value resets it),
/// and browsers then leave the header out.
pub(crate) fn resume_point(
    headers: &HeaderMap,
    query: &HashMap<String, String>,
) -> Result<u64, ApiError> {
    let last_event_id = headers
        .get("last-event-id")
        .map(|v| v.to_str().map(str::trim))
        .filter(|v| !matches!(v, Ok("")));
    match last_event_id {
        Some(v) => v
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| invalid("Last-Event-ID must be a sequence number".into())),
        None => Ok(number::<u64>(query, "after")?.unwrap_or(0)),
    }
}

/// The first pause before a stream reads again after its storage was
/// unavailable, and the longest.
const UNAVAILABLE_FIRST: Duration = Duration::from_millis(250);
const UNAVAILABLE_MOST: Duration = Duration::from_secs(5);

/// The thread's durable events after `after`, then each new one as it
/// becomes durable, read a page at a time; while the store is unavailable
/// it waits and reads again, and it ends on any other failed read, or when
/// the process stops ([`Engine::stop_readers`]). Both SSE views of a thread
/// (native events, ACP messages) follow it.
pub(crate) fn follow(
    engine: Arc<Engine>,
    group_id: String,
    after: u64,
) -> Result<impl Stream<Item = Event>, ApiError> {
    let tip = engine.watch(&group_id)?;
    let stop = engine.readers_stop();
    let pages = stream::unfold((after, tip, false), move |(cursor, mut tip, mut at_tip)| {
        let engine = engine.clone();
        let group_id = group_id.clone();
        async move {
            let seen = (*tip).clone();
            let read = || engine.events_to_tip(&group_id, cursor, MAX_LIMIT, *seen.borrow());
            let mut pause = UNAVAILABLE_FIRST;
            let mut taken_again = false;
            loop {
                match reads::next_page(cursor, &mut tip, at_tip, MAX_LIMIT, read).await {
                    Ok(Some(page)) => {
                        let next = page.events.last().map_or(cursor, |e| e.seq);
                        return Some((page.events, (next, tip, page.at_tip)));
                    }
                    // A watch taken before a cluster node first reached NATS
                    // ends when it does: take the real one, once, and read.
                    Ok(None) if !taken_again => {
                        let Ok(fresh) = engine.watch(&group_id) else {
                            return None;
                        };
                        (tip, at_tip, taken_again) = (fresh, false, true);
                    }
                    Ok(None) => return None,
                    // NATS unreachable for a while: the stream waits it
                    // out (its keep-alives go on) rather than ending.
                    Err(crate::engine::Error::Store(crate::store::Error::Unavailable(e))) => {
                        tracing::warn!(group_id = ?group_id, error = %e, "stream read failed; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(UNAVAILABLE_MOST);
                    }
                    Err(e) => {
                        tracing::warn!(group_id = ?group_id, error = %e, "stream read failed");
                        return None;
                    }
                }
            }
        }
    });
    Ok(pages.flat_map(stream::iter).take_until(stop))
}

fn to_sse(event: Event) -> Result<SseEvent, Infallible> {
    let data = serde_json::to_string(&event).expect("events serialize");
    Ok(SseEvent::default()
        .id(event.seq.to_string())
        .event(event.kind.name())
        .data(data))
}

pub async fn cancel_subscription(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path((group_id, id)): Path<(String, String)>,
) -> Result<axum::response::Response, ApiError> {
    let request = Request::CancelSubscription {
        group_id: group_id.clone(),
        id,
    };
    super::calls::call_reply(&app, &by, &group_id, request).await
}

pub async fn close(
    State(app): State<AppState>,
    Caller(by): Caller,
    Path(group_id): Path<String>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let request = Request::Close {
        group_id: group_id.clone(),
    };
    match app.perform(&by, request).await? {
        Reply::Closed { last_seq } => Ok(Json(
            json!({"group_id": group_id, "closed": true, "last_seq": last_seq}),
        )
        .into_response()),
        other => Err(unexpected(other)),
    }
}
