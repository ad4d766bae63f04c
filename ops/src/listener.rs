//! The HTTP listener of `ferry serve` and `ferry runtime`: how many
//! connections are served at once, and the clocks each connection runs on.
//! A peer on the network may open connections and send nothing, half a
//! request's header, or its body a byte at a time; without these bounds
//! each such connection holds a descriptor for as long as it likes, and a
//! few hundred of them leave none for the clients Ferry is for.
//!
//! A connection is in one of three phases, each with its own clock:
//! reading a request's header (`header`, from the connection's accept or
//! the first byte after an idle spell, until hyper has the whole header),
//! idle between requests (`idle`), or busy with a request until its
//! response's last byte is written (no clock: an SSE stream or a long-poll
//! may last). A request's body must arrive whole within `body` of its
//! header ([`Deadline`]). A connection over its phase's clock is closed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;
use tracing::{debug, warn};

/// The bounds on every connection (`--header-timeout-ms`,
/// `--body-timeout-ms`, `--idle-timeout-ms`, `--max-connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// From a connection's accept, or the first byte of a request after an
    /// idle spell, to the end of the request's header.
    pub header: Duration,
    /// From the end of a request's header to the end of its body.
    pub body: Duration,
    /// How long a connection may wait for its next request.
    pub idle: Duration,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
}

/// Header timeout by default: ample for any client on any network, short
/// enough that a flood of half-sent requests gives its descriptors back.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Body timeout by default: a 1 MiB body (the default limit) at 35 KiB/s.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle timeout by default: below the 90 s clients such as reqwest keep
/// an idle connection, so they see it closed rather than race its close.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Descriptors kept for everything but connections taken: the store's
/// files, the log, the listener, the connection to NATS.
const RESERVED_DESCRIPTORS: u64 = 64;

impl Default for Limits {
    fn default() -> Self {
        Self {
            header: HEADER_TIMEOUT,
            body: BODY_TIMEOUT,
            idle: IDLE_TIMEOUT,
            max_connections: default_max_connections(),
        }
    }
}

/// Half the process's descriptors (its soft `RLIMIT_NOFILE`) after
/// [`RESERVED_DESCRIPTORS`]: the other half stays for the connections
/// Ferry makes itself (to tools, to NATS), so that a full house of
/// clients cannot stop it dispatching or answering.
pub fn default_max_connections() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::from(u32::MAX));
    max_connections_for(limit)
}

fn max_connections_for(descriptors: u64) -> usize {
    let half = descriptors.saturating_sub(RESERVED_DESCRIPTORS) / 2;
    usize::try_from(half.clamp(16, u64::from(MAX_CONNECTIONS))).unwrap_or(usize::MAX)
}

/// How often a listener held at its cap says so.
const CAP_WARNING_EVERY: Duration = Duration::from_secs(60);

/// The most `--max-connections` takes (a semaphore's permits are counted
/// in a `u32` when a stop waits for them all).
pub const MAX_CONNECTIONS: u32 = 1 << 24;

/// Serves `app` on `listener` within `limits` until `shutdown` resolves;
/// then takes no more connections, lets each finish the request it is
/// serving (closing idle ones at once), and returns once all are closed.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopping) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    // At most one warning a minute however long the cap holds.
    let mut warned: Option<Instant> = None;
    loop {
        // A permit first: at the cap, connections wait in the listen
        // backlog until one closes (an idle or half-sent one does within
        // its clock), and take no descriptor meanwhile.
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if warned.is_none_or(|at| at.elapsed() >= CAP_WARNING_EVERY) {
                    warn!(
                        max_connections = limits.max_connections,
                        "at the connection cap: new connections wait until one closes"
                    );
                    warned = Some(Instant::now());
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => permit.expect("never closed"),
                    () = &mut shutdown => break,
                }
            }
        };
        let (mut tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors (or memory), or a connection reset
                    // before it was taken: wait a little rather than spin.
                    debug!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        crate::serve::no_delay(&mut tcp);
        let (app, stopping) = (app.clone(), stopping.clone());
        tokio::spawn(async move {
            connection(tcp, app, limits, stopping).await;
            debug!(%peer, "connection closed");
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop.send(true);
    // Every connection holds a permit until it is closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(MAX_CONNECTIONS);
    let _ = permits.acquire_many(all).await;
}

/// A connection's phase and since when (for its clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading a request's header, since the accept or its first byte.
    Header(Instant),
    /// Between requests, since the last response ended.
    Idle(Instant),
    /// Serving this many requests (their responses not yet written whole).
    Busy(u32),
}

/// Serves one connection until it ends, its phase's clock runs out, or the
/// server stops.
async fn connection(
    tcp: TcpStream,
    app: axum::Router,
    limits: Limits,
    mut stopping: watch::Receiver<bool>,
) {
    let (phase, watching) = watch::channel(Phase::Header(Instant::now()));
    let phase = Arc::new(phase);
    let io = TokioIo::new(Watched {
        tcp,
        phase: phase.clone(),
    });
    let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
        let busy = Busy::begin(phase.clone());
        let request = request.map(|body| Body::new(Deadline::new(body, limits.body)));
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await?;
            // Busy until the response's body is written whole (or dropped).
            Ok::<_, std::convert::Infallible>(
                response.map(|body| Body::new(Finishing { body, _busy: busy })),
            )
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.header_read_timeout(None);
    let mut conn = std::pin::pin!(builder.serve_connection(io, service));
    let mut clock = std::pin::pin!(clock(watching, limits));
    let mut stopped = false;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    debug!(error = %e, "connection ended in error");
                }
                return;
            }
            phase = &mut clock => {
                // Dropping the connection closes it: a header half-sent,
                // or no request, within the clock.
                debug!(?phase, "connection closed by its clock");
                return;
            }
            _ = stopping.wait_for(|stop| *stop), if !stopped => {
                stopped = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Resolves once the connection has stayed in a timed phase (reading a
/// header, idle) past its clock; returns that phase.
async fn clock(mut watching: watch::Receiver<Phase>, limits: Limits) -> Phase {
    loop {
        let phase = *watching.borrow_and_update();
        let deadline = match phase {
            Phase::Header(since) => Some(since + limits.header),
            Phase::Idle(since) => Some(since + limits.idle),
            Phase::Busy(_) => None,
        };
        let over = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = over => {
                if !watching.has_changed().unwrap_or(false) {
                    return phase;
                }
            }
            changed = watching.changed() => {
                if changed.is_err() {
                    // The connection is gone.
                    return std::future::pending().await;
                }
            }
        }
    }
}

/// The connection's socket, noting the first byte of a request after an
/// idle spell (its header's clock starts then).
struct Watched {
    tcp: TcpStream,
    phase: Arc<watch::Sender<Phase>>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.tcp).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.phase.send_if_modified(|phase| match phase {
                Phase::Idle(_) => {
                    *phase = Phase::Header(Instant::now());
                    true
                }
                _ => false,
            });
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// One request being served; the connection is idle again once none is.
struct Busy(Arc<watch::Sender<Phase>>);

impl Busy {
    fn begin(phase: Arc<watch::Sender<Phase>>) -> Self {
        phase.send_modify(|phase| {
            *phase = match *phase {
                Phase::Busy(n) => Phase::Busy(n + 1),
                _ => Phase::Busy(1),
            }
        });
        Self(phase)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.send_modify(|phase| {
            *phase = match *phase {
                Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
                _ => Phase::Idle(Instant::now()),
            }
        });
    }
}

/// A response's body, keeping its request [`Busy`] until it is written.
struct Finishing {
    body: Body,
    _busy: Busy,
}

impl HttpBody for Finishing {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A request's body that fails, as `io::ErrorKind::TimedOut`, once it has
/// not arrived whole by its deadline: the handler reading it answers 408
/// (`http/body.rs`), and the connection, its body unread, is closed.
pub struct Deadline<B> {
    body: B,
    deadline: Instant,
    within: Duration,
    /// Made only once the body keeps the reader waiting: most bodies are
    /// in the first read, and need no timer.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<B> Deadline<B> {
    pub fn new(body: B, within: Duration) -> Self {
        Self {
            body,
            deadline: Instant::now() + within,
            within,
            sleep: None,
        }
    }
}

impl<B> HttpBody for Deadline<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = self.deadline;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        ready!(sleep.as_mut().poll(cx));
        let message = format!(
            "the request body did not arrive within {:?} of its header",
            self.within
        );
        Poll::Ready(Some(Err(
            io::Error::new(io::ErrorKind::TimedOut, message).into()
        )))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_half_the_descriptors_left_after_the_reserve() {
        for (descriptors, cap) in [
            (300, 118),
            (1024, 480),
            (20_000, 9_968),
            // Never none, never past what a stop can count.
            (10, 16),
            (u64::MAX, MAX_CONNECTIONS as usize),
        ] {
            assert_eq!(max_connections_for(descriptors), cap, "{descriptors}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_slower_than_its_deadline_fails_as_timed_out() {
        use futures::StreamExt;
        let (mut send, body) =
            futures::channel::mpsc::channel::<Result<http_body::Frame<Bytes>, io::Error>>(4);
        let body = http_body_util::StreamBody::new(body);
        let mut stream = Body::new(Deadline::new(body, Duration::from_secs(30))).into_data_stream();
        send.try_send(Ok(http_body::Frame::data(Bytes::from_static(b"{"))))
            .unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), "{");
        // Nothing more: the deadline passes (paused time skips to it).
        let error = stream.next().await.unwrap().unwrap_err();
        let source = std::error::Error::source(&error).unwrap();
        let io = source.downcast_ref::<io::Error>().unwrap();
        assert_eq!(io.kind(), io::ErrorKind::TimedOut);
        assert!(error.to_string().contains("30s"), "{error}");
        drop(send);
    }
}
