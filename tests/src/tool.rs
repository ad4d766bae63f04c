//! A programmable RAP tool server on loopback. It records every invocation
//! (with its `callback_url`), answers each as told, and lets the test send
//! the callbacks itself: early, twice, or never.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ferry_proto::Invocation;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// How long a test waits for the tool to hear something it is owed. Only
/// a failing test waits this long, so it is generous: CI machines have run
/// at a sixth of their usual speed. Answerers that run beside a test use
/// [`TestTool::await_invocation`], which has no deadline.
const ARRIVAL: Duration = Duration::from_secs(60);

/// How the tool answers one invocation POST.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ack {
    Ok,
    Status(u16),
    /// A status with `Retry-After: secs`.
    RetryAfter(u16, u64),
    /// Never answer (until the connection is dropped).
    Hang,
    /// Answer 200 once the test calls [`TestTool::release`].
    Held,
}

/// How the tool answers `/tool_call_status`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Liveness {
    Alive(bool),
    Status(u16),
    Garbage,
}

/// One invocation the tool received.
#[derive(Debug, Clone)]
pub struct Invoked {
    pub invocation: Invocation,
    pub at: std::time::Instant,
}

struct Shared {
    manifest: Mutex<Value>,
    acks: Mutex<VecDeque<Ack>>,
    liveness: Mutex<Liveness>,
    invoked: mpsc::UnboundedSender<Invoked>,
    notices: mpsc::UnboundedSender<(String, Value)>,
    all: Mutex<Vec<Invocation>>,
    release: tokio::sync::Notify,
    manifest_fetches: std::sync::atomic::AtomicUsize,
    manifest_status: Mutex<u16>,
    /// Each request's route and its `Authorization` header, in order.
    authorizations: Mutex<Vec<(String, Option<String>)>>,
}

impl Shared {
    fn heard(&self, route: &str, headers: &HeaderMap) {
        let authorization = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (self.authorizations.lock().unwrap()).push((route.to_owned(), authorization));
    }
}

pub struct TestTool {
    pub url: String,
    shared: Arc<Shared>,
    invoked: tokio::sync::Mutex<mpsc::UnboundedReceiver<Invoked>>,
    notices: tokio::sync::Mutex<mpsc::UnboundedReceiver<(String, Value)>>,
    server: tokio::task::JoinHandle<()>,
}

/// A schema accepting `{"text": string}` (optional).
pub fn text_schema() -> Value {
    json!({"type": "object", "properties": {"text": {"type": "string"}}})
}

impl TestTool {
    /// A tool server publishing toolset `name` with `tools`, all taking
    /// [`text_schema`].
    pub async fn start(name: &str, tools: &[&str]) -> TestTool {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| json!({"name": t, "description": format!("{t} of {name}"), "inputSchema": text_schema()}))
            .collect();
        Self::with_manifest(json!({"name": name, "tools": tools})).await
    }

    /// A tool server publishing `manifest`; its `endpoint`, when absent, is
    /// filled in with this server's `/invoke`.
    pub async fn with_manifest(manifest: Value) -> TestTool {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serving(listener, manifest)
    }

    /// [`TestTool::start`] on `addr` (`host:port`): a tool server coming up
    /// where one was expected.
    pub async fn start_at(addr: &str, name: &str, tools: &[&str]) -> TestTool {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| json!({"name": t, "description": t, "inputSchema": text_schema()}))
            .collect();
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        Self::serving(listener, json!({"name": name, "tools": tools}))
    }

    fn serving(listener: tokio::net::TcpListener, mut manifest: Value) -> TestTool {
        let url = format!("http://{}", listener.local_addr().unwrap());
        if manifest.get("endpoint").is_none() {
            manifest["endpoint"] = json!(format!("{url}/invoke"));
        }
        let (invoked_tx, invoked_rx) = mpsc::unbounded_channel();
        let (notices_tx, notices_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            manifest: Mutex::new(manifest),
            acks: Mutex::new(VecDeque::new()),
            liveness: Mutex::new(Liveness::Alive(true)),
            invoked: invoked_tx,
            notices: notices_tx,
            all: Mutex::new(vec![]),
            release: tokio::sync::Notify::new(),
            manifest_fetches: Default::default(),
            manifest_status: Mutex::new(200),
            authorizations: Mutex::new(vec![]),
        });
        let app = Router::new()
            .route("/.well-known/rap-toolset", get(manifest_route))
            .route("/invoke", post(invoke))
            .route(
                "/cancel_tool_call",
                post(|s, h, b| notice("cancel_tool_call", s, h, b)),
            )
            .route(
                "/close_thread",
                post(|s, h, b| notice("close_thread", s, h, b)),
            )
            .route("/tool_call_status", post(status))
            .route("/choice", post(|s, h, b| notice("choice", s, h, b)))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        TestTool {
            url,
            shared,
            invoked: tokio::sync::Mutex::new(invoked_rx),
            notices: tokio::sync::Mutex::new(notices_rx),
            server,
        }
    }

    /// Answers the next invocations with `acks`, in order; then 200.
    pub fn plan(&self, acks: &[Ack]) {
        self.shared
            .acks
            .lock()
            .unwrap()
            .extend(acks.iter().copied());
    }

    pub fn set_liveness(&self, liveness: Liveness) {
        *self.shared.liveness.lock().unwrap() = liveness;
    }

    pub fn set_manifest(&self, manifest: Value) {
        *self.shared.manifest.lock().unwrap() = manifest;
    }

    /// The next invocation the tool received (whatever it answered).
    pub async fn next_invocation(&self) -> Invoked {
        tokio::time::timeout(ARRIVAL, self.await_invocation())
            .await
            .expect("no invocation arrived")
            .expect("tool stopped")
    }

    /// The next invocation however long it takes; `None` once the tool
    /// stopped. For answerers that run beside a test: a quiet spell (the
    /// scenarios before the first call, a NATS node's election) is no
    /// failure of theirs, and a deadline there killed the answerer, leaving
    /// every later call unanswered. The test's own waits bound them.
    pub async fn await_invocation(&self) -> Option<Invoked> {
        self.invoked.lock().await.recv().await
    }

    /// The next `/cancel_tool_call`, `/close_thread` or `/tool_call_status`
    /// request received.
    pub async fn next_notice(&self) -> (String, Value) {
        let mut rx = self.notices.lock().await;
        tokio::time::timeout(ARRIVAL, rx.recv())
            .await
            .expect("no notice arrived")
            .expect("tool stopped")
    }

    /// Lets an invocation held by [`Ack::Held`] answer 200 (the next one,
    /// if none is held yet).
    pub fn release(&self) {
        self.shared.release.notify_one();
    }

    /// Every invocation received so far.
    pub fn invocations(&self) -> Vec<Invocation> {
        self.shared.all.lock().unwrap().clone()
    }

    /// Answers discovery with `status` (the document only with 200).
    pub fn set_manifest_status(&self, status: u16) {
        *self.shared.manifest_status.lock().unwrap() = status;
    }

    /// How many times its discovery document was fetched.
    pub fn manifest_fetches(&self) -> usize {
        self.shared
            .manifest_fetches
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The route of each request received (`manifest`, `invoke`, a
    /// notice's name) and the `Authorization` header it came with.
    pub fn authorizations(&self) -> Vec<(String, Option<String>)> {
        self.shared.authorizations.lock().unwrap().clone()
    }

    /// Stops serving: later connections are refused.
    pub fn stop(&self) {
        self.server.abort();
    }
}

impl Drop for TestTool {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn manifest_route(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    s.heard("manifest", &headers);
    s.manifest_fetches
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let status = *s.manifest_status.lock().unwrap();
    if status != 200 {
        return StatusCode::from_u16(status).unwrap().into_response();
    }
    Json(s.manifest.lock().unwrap().clone()).into_response()
}

async fn invoke(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(invocation): Json<Invocation>,
) -> Response {
    s.heard("invoke", &headers);
    s.all.lock().unwrap().push(invocation.clone());
    let _ = s.invoked.send(Invoked {
        invocation,
        at: std::time::Instant::now(),
    });
    let ack = s.acks.lock().unwrap().pop_front().unwrap_or(Ack::Ok);
    match ack {
        Ack::Ok => StatusCode::OK.into_response(),
        Ack::Status(code) => StatusCode::from_u16(code).unwrap().into_response(),
        Ack::RetryAfter(code, secs) => {
            let mut headers = HeaderMap::new();
            headers.insert("retry-after", secs.to_string().parse().unwrap());
            (StatusCode::from_u16(code).unwrap(), headers).into_response()
        }
        Ack::Hang => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        Ack::Held => {
            s.release.notified().await;
            StatusCode::OK.into_response()
        }
    }
}

async fn notice(
    kind: &'static str,
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> StatusCode {
    s.heard(kind, &headers);
    let _ = s.notices.send((kind.to_owned(), body));
    StatusCode::OK
}

async fn status(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    s.heard("tool_call_status", &headers);
    let _ = s.notices.send(("tool_call_status".to_owned(), body));
    match *s.liveness.lock().unwrap() {
        Liveness::Alive(alive) => Json(json!({"alive": alive})).into_response(),
        Liveness::Status(code) => StatusCode::from_u16(code).unwrap().into_response(),
        Liveness::Garbage => (StatusCode::OK, "not json").into_response(),
    }
}
