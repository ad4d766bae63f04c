//! Request bodies, read with the configured size limit and refused in the
//! API's error shape: 413 for a body over the limit, 400 `invalid_json` for
//! malformed JSON, 400 `invalid_request` for JSON of the wrong shape, 408
//! `request_timeout` for a body that did not arrive in time.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use ferry_proto::rap::{Ending, Peek};
use ferry_proto::ErrorCode;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::mpsc;

use super::{ApiError, AppState};

/// How much of an oversized body is read and dropped before answering 413.
/// Answering before the client finished sending would reset the connection
/// under it, and the client would see a broken pipe instead of the 413.
const DRAIN_FACTOR: usize = 16;

pub struct JsonBody<T>(pub T);

pub(super) fn too_large() -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        "the request body is larger than the configured limit",
    )
}

/// Why a body was not read whole.
pub enum BodyError {
    /// Over the limit. `peek`: what the body said, when that was asked for
    /// and the body was read (not when its declared length alone was past
    /// what is drained).
    TooLarge { peek: Option<Peek> },
    /// Reading it failed.
    Unreadable(ApiError),
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::TooLarge { .. } => too_large(),
            BodyError::Unreadable(e) => e,
        }
    }
}

/// Why a body could not be read: 408 when it did not arrive in time (the
/// listener's deadline fails it as `io::ErrorKind::TimedOut`), else 400.
fn unreadable(e: &axum::Error) -> ApiError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        let timed_out = error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
        if timed_out {
            return ApiError::new(ErrorCode::RequestTimeout, error.to_string());
        }
        source = error.source();
    }
    ApiError::new(ErrorCode::InvalidRequest, format!("reading the body: {e}"))
}

/// Reads the whole body if it fits in `limit` bytes.
pub async fn read_bytes(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    Ok(read_body(req, limit, false).await?)
}

/// [`read_bytes`]; with `peek`, a body over the limit is also read for
/// what it says ([`Peek`]) while it drains, on a blocking thread, keeping
/// none of it.
pub async fn read_body(req: Request, limit: usize, mut peek: bool) -> Result<Bytes, BodyError> {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let drain_limit = limit.saturating_mul(DRAIN_FACTOR);
    if declared.is_some_and(|n| n > drain_limit) {
        return Err(BodyError::TooLarge { peek: None });
    }
    let mut stream = req.into_body().into_data_stream();
    let mut body = Vec::with_capacity(declared.unwrap_or(0).min(limit));
    let mut seen = 0usize;
    let mut peeker: Option<Peeker> = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| BodyError::Unreadable(unreadable(&e)))?;
        seen += chunk.len();
        if seen > drain_limit {
            break;
        }
        if seen <= limit {
            body.extend_from_slice(&chunk);
        } else if let Some(peeker) = &peeker {
            peeker.feed(chunk).await;
        } else if std::mem::take(&mut peek) {
            // Once: with no thread to spare, what follows only drains.
            let prefix = Bytes::from(std::mem::take(&mut body));
            if let Some(started) = Peeker::start() {
                started.feed(prefix).await;
                started.feed(chunk).await;
                peeker = Some(started);
            }
        }
    }
    if seen > limit {
        let peek = match peeker {
            Some(peeker) => {
                let mut peek = peeker.finish().await;
                // Read to its end, a body that stops inside its object is
                // malformed; cut at the drain limit, it is only unread.
                if seen <= drain_limit && peek.ending == Ending::Cut {
                    peek.ending = Ending::Malformed;
                }
                Some(peek)
            }
            None => None,
        };
        return Err(BodyError::TooLarge { peek });
    }
    Ok(Bytes::from(body))
}

/// Bodies read through at once. Each holds a blocking thread for as long
/// as its sender takes to send it, and the blocking pool also runs the
/// store's fsyncs: past this many, an oversized body only drains.
const MAX_PEEKERS: usize = 8;

static PEEKERS: AtomicUsize = AtomicUsize::new(0);

/// A [`Peek`] of a body as it arrives: the chunks go to a blocking
/// thread that parses them and lets them go.
struct Peeker {
    chunks: mpsc::Sender<Bytes>,
    peek: tokio::task::JoinHandle<Peek>,
    _slot: PeekerSlot,
}

/// One of the [`MAX_PEEKERS`], given back when dropped.
struct PeekerSlot;

impl PeekerSlot {
    fn take() -> Option<Self> {
        PEEKERS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_PEEKERS).then_some(n + 1)
            })
            .ok()
            .map(|_| PeekerSlot)
    }
}

impl Drop for PeekerSlot {
    fn drop(&mut self) {
        PEEKERS.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Peeker {
    /// A peeker, unless [`MAX_PEEKERS`] are at work.
    fn start() -> Option<Self> {
        let slot = PeekerSlot::take()?;
        let (chunks, arriving) = mpsc::channel(8);
        let peek = tokio::task::spawn_blocking(move || {
            Peek::from_reader(std::io::BufReader::new(Arriving {
                chunks: arriving,
                chunk: Bytes::new(),
            }))
        });
        Some(Self {
            chunks,
            peek,
            _slot: slot,
        })
    }

    /// Passes a chunk on; once the parser is done (the object ended, or
    /// the JSON went wrong), the rest only drains.
    async fn feed(&self, chunk: Bytes) {
        let _ = self.chunks.send(chunk).await;
    }

    async fn finish(self) -> Peek {
        drop(self.chunks);
        self.peek.await.unwrap_or_default()
    }
}

/// The chunks sent to a [`Peeker`], as a blocking reader.
struct Arriving {
    chunks: mpsc::Receiver<Bytes>,
    chunk: Bytes,
}

impl std::io::Read for Arriving {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.chunk = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let bytes = read_bytes(req, state.engine.config().max_body_bytes).await?;
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::new(ErrorCode::InvalidJson, format!("malformed JSON: {e}")))?;
        // Every body this API takes is an object; serde would also take a
        // struct's fields as an array, in order.
        if !value.is_object() {
            let message = "the request body must be a JSON object";
            return Err(ApiError::new(ErrorCode::InvalidRequest, message));
        }
        let parsed = serde_json::from_value(value)
            .map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.to_string()))?;
        Ok(JsonBody(parsed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn post(chunks: Vec<&'static str>) -> Request {
        let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
        Request::post("/").body(Body::from_stream(stream)).unwrap()
    }

    /// The only test that takes peekers, so the count is its own.
    #[tokio::test]
    async fn a_body_over_the_limit_is_read_through_by_a_bounded_number_of_peekers() {
        let body = vec![
            r#"{"group_id":"g","text":"xx"#,
            "xxxxxxxxxx",
            r#"","type":"tool_result"}"#,
        ];
        // Under the limit: the body itself, nothing peeked.
        let read = read_body(post(body.clone()), 1 << 10, true).await;
        assert!(read.is_ok_and(|b| b.ends_with(b"}")));
        // Over it: what it says, however it was cut into chunks.
        let Err(BodyError::TooLarge { peek: Some(peek) }) =
            read_body(post(body.clone()), 16, true).await
        else {
            panic!("over the limit, peeked");
        };
        assert_eq!(peek.kind.as_deref(), Some("tool_result"));
        assert_eq!(peek.group_id.as_deref(), Some("g"));
        assert_eq!(peek.ending, Ending::Whole);
        // Past what is read through (16 times the limit): cut, not
        // malformed.
        let Err(BodyError::TooLarge { peek: Some(cut) }) =
            read_body(post(body.clone()), 2, true).await
        else {
            panic!("over the limit, peeked");
        };
        assert_eq!(cut.ending, Ending::Cut, "{cut:?}");
        assert_eq!(cut.group_id.as_deref(), Some("g"), "{cut:?}");
        // Sent whole but stopping inside its object: malformed.
        let unterminated = body[..2].to_vec();
        let Err(BodyError::TooLarge { peek: Some(short) }) =
            read_body(post(unterminated), 16, true).await
        else {
            panic!("over the limit, peeked");
        };
        assert_eq!(short.ending, Ending::Malformed, "{short:?}");
        // Not asked to peek: only refused.
        let refused = read_body(post(body.clone()), 16, false).await;
        assert!(matches!(refused, Err(BodyError::TooLarge { peek: None })));
        // With every peeker taken, a body only drains; a slot given back
        // is taken again.
        assert_eq!(PEEKERS.load(Ordering::Acquire), 0, "all given back");
        let taken: Vec<_> = (0..MAX_PEEKERS)
            .map(|_| PeekerSlot::take().unwrap())
            .collect();
        let drained = read_body(post(body.clone()), 16, true).await;
        assert!(matches!(drained, Err(BodyError::TooLarge { peek: None })));
        drop(taken);
        let again = read_body(post(body), 16, true).await;
        assert!(matches!(again, Err(BodyError::TooLarge { peek: Some(_) })));
        assert_eq!(PEEKERS.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_body_cut_off_for_time_is_a_408_and_one_broken_a_400() {
        let failing = |error: std::io::Error| {
            let chunks = vec![Ok(Bytes::from_static(b"{")), Err(error)];
            Request::post("/")
                .body(Body::from_stream(futures::stream::iter(chunks)))
                .unwrap()
        };
        let late = std::io::Error::new(std::io::ErrorKind::TimedOut, "did not arrive within 1s");
        let refused = read_bytes(failing(late), 1 << 10).await.unwrap_err();
        assert_eq!(
            refused.status,
            super::super::status_of(ErrorCode::RequestTimeout)
        );
        assert_eq!(refused.body.error.code, "request_timeout");
        assert!(refused.body.error.message.contains("within 1s"));
        let broken = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let refused = read_bytes(failing(broken), 1 << 10).await.unwrap_err();
        assert_eq!(refused.body.error.code, "invalid_request");
    }
}
