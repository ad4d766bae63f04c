//! The demo RAP tool server (toolset `demo`): its manifest, its nine tools
//! (echo, sleep, fail, flaky, ticks, authorize, diff, drop_table,
//! pick_region), the callbacks they send, and the rap-3 notification
//! endpoints — for tests, benches and demos.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ferry_proto::rap::{
    Annotations, Callback, CancelToolCall, CloseThread, DiffContent, DisplaySegment, Invocation,
    KnownSegment, Manifest, OAuth, SubscriptionEvent, ToolCallStatus, ToolCallStatusReply, ToolDef,
    ToolResult, UserChoice,
};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// Tries per callback POST; retried only on 5xx or a transport error.
const CALLBACK_ATTEMPTS: u32 = 5;
const TOOL_NAMES: [&str; 9] = [
    "echo",
    "sleep",
    "fail",
    "flaky",
    "ticks",
    "authorize",
    "diff",
    "drop_table",
    "pick_region",
];

/// The regions `pick_region` offers; the first is the default.
const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// The demo toolset server.
pub struct DemoTool;

impl DemoTool {
    /// Serves the demo toolset on `listener` until the future is dropped. The
    /// manifest's `endpoint` comes from each request's `Host` header, so it is
    /// whatever address Ferry used to reach the listener.
    pub async fn serve(listener: tokio::net::TcpListener) -> std::io::Result<()> {
        axum::serve(listener, router()).await
    }
}

/// The demo toolset as a router with its own fresh state, for in-process use.
pub fn router() -> Router {
    let http = reqwest::Client::builder()
        .no_proxy() // the callback URL is Ferry itself, reached directly
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_default();
    let shared = Arc::new(Shared {
        http,
        inner: Mutex::default(),
    });
    Router::new()
        .route("/.well-known/rap-toolset", get(manifest))
        .route("/invoke", post(invoke))
        .route("/cancel_tool_call", post(cancel_tool_call))
        .route("/close_thread", post(close_thread))
        .route("/tool_call_status", post(tool_call_status))
        .route("/authorize/{token}", get(authorize))
        .route("/choice/{token}", post(choice))
        .route("/stats", get(stats))
        .with_state(shared)
}

/// A call, as (group_id, id).
type Key = (String, String);

struct Shared {
    http: reqwest::Client,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Every POST to `/invoke`, malformed ones included.
    invocations: u64,
    /// Parsed invocations per `"{group_id}/{id}"`; also flaky's attempt count.
    by_call: BTreeMap<String, u64>,
    /// Calls accepted and not yet finished, cancelled, closed or superseded.
    live: HashMap<Key, Live>,
    next_gen: u64,
    /// Calls waiting on the user (`authorize`'s consent, `pick_region`'s
    /// answer), by the token in the URL the user is sent to.
    waiting_on_user: HashMap<String, oneshot::Sender<usize>>,
}

/// A live call. Dropping it (cancel, close_thread, a newer invocation of the
/// same call) drops `_cancel`, which wakes the task's `cancelled` receiver.
struct Live {
    generation: u64,
    _cancel: oneshot::Sender<()>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn host(headers: &HeaderMap) -> String {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    host.unwrap_or("127.0.0.1").to_owned()
}

fn tool(name: &str, description: &str, properties: Value, required: &[&str]) -> ToolDef {
    ToolDef {
        name: name.to_owned(),
        description: description.to_owned(),
        input_schema: json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        }),
        annotations: None,
        display_script: None,
    }
}

async fn manifest(headers: HeaderMap) -> Json<Manifest> {
    let text = |d: &str| json!({"type": "string", "description": d});
    let tools = vec![
        tool(
            "echo",
            "Answers with the given text.",
            json!({"text": text("text to echo")}),
            &["text"],
        ),
        ToolDef {
            // Long-running: MCP clients may run it as a task.
            annotations: Some(Annotations {
                long_running: Some(true),
                read_only: Some(true),
                idempotent: Some(true),
                ..Annotations::default()
            }),
            ..tool(
                "sleep",
                "Answers after the given number of seconds.",
                json!({"seconds": {"type": "number", "minimum": 0, "description": "how long to sleep"}}),
                &["seconds"],
            )
        },
        tool(
            "fail",
            "Answers with an error result.",
            json!({"message": text("the error message")}),
            &[],
        ),
        tool(
            "flaky",
            "Refuses the invocation with HTTP 500 `failures` times, then succeeds.",
            json!({"failures": {"type": "integer", "minimum": 0}, "text": text("the result text")}),
            &["failures"],
        ),
        tool(
            "ticks",
            "Starts a subscription sending `count` tick events, `interval_ms` apart.",
            json!({"count": {"type": "integer", "minimum": 1, "maximum": 1000},
                   "interval_ms": {"type": "integer", "minimum": 0, "default": 10}}),
            &["count"],
        ),
        tool(
            "authorize",
            "Asks the user to authorize (oauth callback), then answers.",
            json!({"text": text("text to answer with once authorized")}),
            &[],
        ),
        tool(
            "diff",
            "Pretends to edit a file and answers with a diff display.",
            json!({"path": text("the file to edit")}),
            &["path"],
        ),
        ToolDef {
            // Destructive: Ferry gates it behind approval by default.
            annotations: Some(Annotations {
                destructive: Some(true),
                ..Annotations::default()
            }),
            ..tool(
                "drop_table",
                "Pretends to drop a database table. Destructive: needs a reviewer's approval.",
                json!({"table": text("the table to drop")}),
                &["table"],
            )
        },
        tool(
            "pick_region",
            "Asks the user to pick a region (user_choice callback), then answers with it.",
            json!({}),
            &[],
        ),
    ];
    Json(Manifest {
        name: "demo".to_owned(),
        description: Some("Ferry's demo tools: every kind of RAP callback.".to_owned()),
        endpoint: format!("http://{}/invoke", host(&headers)),
        tools,
        needs_migration: None,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EchoArgs {
    text: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SleepArgs {
    seconds: f64,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailArgs {
    message: Option<String>,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FlakyArgs {
    failures: u64,
    text: Option<String>,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TicksArgs {
    count: u64,
    #[serde(default = "default_interval")]
    interval_ms: u64,
}
fn default_interval() -> u64 {
    10
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthorizeArgs {
    text: Option<String>,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiffArgs {
    path: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DropTableArgs {
    table: String,
}

/// A validated invocation.
enum Op {
    Echo(EchoArgs),
    Sleep(Duration, f64),
    Fail(FailArgs),
    Flaky(FlakyArgs),
    Ticks(TicksArgs),
    Authorize(AuthorizeArgs),
    Diff(DiffArgs),
    DropTable(DropTableArgs),
    PickRegion(NoArgs),
}

/// Checks the operation and its arguments; the error becomes an `Error: `
/// result (rap-1 "Tool Validation").
fn parse_op(inv: &Invocation) -> Result<Op, String> {
    fn args<T: DeserializeOwned>(inv: &Invocation) -> Result<T, String> {
        serde_json::from_value(inv.arguments.clone())
            .map_err(|e| format!("invalid arguments for {}: {e}", inv.operation))
    }
    Ok(match inv.operation.as_str() {
        "echo" => Op::Echo(args(inv)?),
        "sleep" => {
            let SleepArgs { seconds } = args(inv)?;
            match Duration::try_from_secs_f64(seconds) {
                Ok(d) => Op::Sleep(d, seconds),
                Err(_) => return Err(format!("invalid arguments for sleep: `seconds` must be a non-negative number of seconds, got {seconds}")),
            }
        }
        "fail" => Op::Fail(args(inv)?),
        "flaky" => Op::Flaky(args(inv)?),
        "ticks" => {
            let a: TicksArgs = args(inv)?;
            if !(1..=1000).contains(&a.count) {
                return Err(format!(
                    "invalid arguments for ticks: `count` must be between 1 and 1000, got {}",
                    a.count
                ));
            }
            Op::Ticks(a)
        }
        "authorize" => Op::Authorize(args(inv)?),
        "diff" => Op::Diff(args(inv)?),
        "drop_table" => Op::DropTable(args(inv)?),
        "pick_region" => Op::PickRegion(args(inv)?),
        other => {
            return Err(format!(
                "unknown operation {other:?}; the demo toolset has {}",
                TOOL_NAMES.join(", ")
            ))
        }
    })
}

async fn invoke(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    shared.lock().invocations += 1;
    let inv: Invocation = match serde_json::from_slice(&body) {
        Ok(inv) => inv,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("malformed invocation: {e}"),
            )
                .into_response()
        }
    };
    let op = parse_op(&inv);
    let key = (inv.group_id.clone(), inv.id.clone());
    let (cancel, cancelled) = oneshot::channel();
    let generation = {
        let mut inner = shared.lock();
        let attempts = inner
            .by_call
            .entry(format!("{}/{}", key.0, key.1))
            .or_default();
        *attempts += 1;
        if let Ok(Op::Flaky(a)) = &op {
            if *attempts <= a.failures {
                let msg = format!("flaky: planned failure {} of {}", attempts, a.failures);
                return (StatusCode::INTERNAL_SERVER_ERROR, msg).into_response();
            }
        }
        inner.next_gen += 1;
        let generation = inner.next_gen;
        // Replacing an older run of the same call cancels it.
        inner.live.insert(
            key,
            Live {
                generation,
                _cancel: cancel,
            },
        );
        generation
    };
    let call = Call {
        shared,
        inv,
        host: host(&headers),
        generation,
        cancelled,
    };
    tokio::spawn(call.run(op));
    StatusCode::OK.into_response()
}

/// One accepted invocation, worked on in its own task.
struct Call {
    shared: Arc<Shared>,
    inv: Invocation,
    host: String,
    generation: u64,
    cancelled: oneshot::Receiver<()>,
}

impl Call {
    async fn run(mut self, op: Result<Op, String>) {
        let op = match op {
            Ok(op) => op,
            Err(e) => return self.finish(format!("Error: {e}"), None).await,
        };
        match op {
            Op::Echo(a) => self.finish(a.text, None).await,
            Op::Sleep(duration, seconds) => {
                if self.pause(duration).await {
                    self.finish(format!("slept {seconds} seconds"), None).await;
                }
            }
            Op::Fail(a) => {
                let message = a
                    .message
                    .as_deref()
                    .unwrap_or("the demo tool was asked to fail");
                self.finish(format!("Error: {message}"), None).await;
            }
            Op::Flaky(a) => {
                let text = a
                    .text
                    .unwrap_or_else(|| format!("succeeded after {} failures", a.failures));
                self.finish(text, None).await;
            }
            Op::Ticks(a) => {
                self.ticks(a.count, Duration::from_millis(a.interval_ms))
                    .await
            }
            Op::Authorize(a) => self.authorize(a.text).await,
            Op::PickRegion(NoArgs {}) => self.pick_region().await,
            Op::DropTable(DropTableArgs { table }) => {
                self.finish(
                    format!("Dropped table {table} (not really: this is the demo)"),
                    None,
                )
                .await
            }
            Op::Diff(DiffArgs { path }) => {
                let patch = format!("--- {path}\n+++ {path}\n@@ -1,2 +1,3 @@\n fn main() {{\n+    println!(\"hello\");\n }}\n");
                let display = vec![
                    DisplaySegment::Known(KnownSegment::Diff(DiffContent {
                        path: path.clone(),
                        patch,
                    })),
                    DisplaySegment::Known(KnownSegment::Text(format!("edit {path} — 1 insertion"))),
                ];
                self.finish(format!("Replaced text in {path}"), Some(display))
                    .await;
            }
        }
    }

    async fn ticks(&mut self, count: u64, interval: Duration) {
        let started = self.result(format!("subscribed to {count} ticks"), None, true);
        self.send(&Callback::ToolResult(started)).await;
        for i in 1..=count {
            let last = i == count;
            if !self.pause(interval).await || (last && !self.complete()) {
                return;
            }
            let event = SubscriptionEvent {
                group_id: self.inv.group_id.clone(),
                tool_call_id: self.inv.id.clone(),
                text: format!("tick {i}"),
                associative: true,
                is_final: last,
            };
            self.send(&Callback::SubscriptionEvent(event)).await;
        }
    }

    /// A token for a URL the user answers at, and where the answer arrives.
    fn ask_user(&self) -> (String, oneshot::Receiver<usize>) {
        let token = uuid::Uuid::new_v4().to_string();
        let (answer, answered) = oneshot::channel();
        self.shared
            .lock()
            .waiting_on_user
            .insert(token.clone(), answer);
        (token, answered)
    }

    /// The user's answer; `None` if the call was cancelled first.
    async fn user_answer(
        &mut self,
        token: &str,
        answered: oneshot::Receiver<usize>,
    ) -> Option<usize> {
        let answer = tokio::select! {
            biased;
            _ = &mut self.cancelled => None,
            answer = answered => answer.ok(),
        };
        self.shared.lock().waiting_on_user.remove(token);
        answer
    }

    async fn authorize(&mut self, text: Option<String>) {
        let (token, answered) = self.ask_user();
        let oauth = OAuth {
            group_id: self.inv.group_id.clone(),
            id: self.inv.id.clone(),
            call_id: self.inv.call_id.clone(),
            auth_url: format!("http://{}/authorize/{token}", self.host),
        };
        self.send(&Callback::OAuth(oauth)).await;
        if self.user_answer(&token, answered).await.is_some() {
            let text = text.map_or_else(|| "authorized".to_owned(), |t| format!("authorized: {t}"));
            self.finish(text, None).await;
        }
    }

    /// Sends a `user_choice`, waits for the answer at its `response_url`,
    /// then answers with the region picked.
    async fn pick_region(&mut self) {
        let (token, answered) = self.ask_user();
        let prompt = UserChoice {
            group_id: self.inv.group_id.clone(),
            id: self.inv.id.clone(),
            call_id: self.inv.call_id.clone(),
            prompt: "Which region should this run in?".to_owned(),
            choices: REGIONS.iter().map(|r| (*r).to_owned()).collect(),
            default: 0,
            response_url: format!("http://{}/choice/{token}", self.host),
        };
        self.send(&Callback::UserChoice(prompt)).await;
        if let Some(index) = self.user_answer(&token, answered).await {
            self.finish(format!("region: {}", REGIONS[index]), None)
                .await;
        }
    }

    /// Waits `duration`; false if the call was cancelled meanwhile.
    async fn pause(&mut self, duration: Duration) -> bool {
        tokio::select! {
            biased;
            _ = &mut self.cancelled => false,
            _ = tokio::time::sleep(duration) => true,
        }
    }

    /// Marks the call finished, before its final callback is sent; false if
    /// it was cancelled, closed or superseded, in which case nothing is sent.
    fn complete(&self) -> bool {
        let key = (self.inv.group_id.clone(), self.inv.id.clone());
        let mut inner = self.shared.lock();
        match inner.live.get(&key) {
            Some(live) if live.generation == self.generation => inner.live.remove(&key).is_some(),
            _ => false,
        }
    }

    async fn finish(&self, text: String, display_as: Option<Vec<DisplaySegment>>) {
        if self.complete() {
            let result = self.result(text, display_as, false);
            self.send(&Callback::ToolResult(result)).await;
        }
    }

    fn result(
        &self,
        text: String,
        display_as: Option<Vec<DisplaySegment>>,
        subscription: bool,
    ) -> ToolResult {
        ToolResult {
            group_id: self.inv.group_id.clone(),
            id: self.inv.id.clone(),
            call_id: self.inv.call_id.clone(),
            text: Some(text),
            content: None,
            display_as,
            subscription,
        }
    }

    /// POSTs a callback, retrying with backoff on 5xx or a transport error,
    /// never on any other status. Each callback has an `Idempotency-Key` of
    /// its own (a new UUID, quoted as the draft's sf-string), the same on
    /// every retry of it, with the same body: if Ferry recorded it but its
    /// answer was lost, the retry is answered `duplicate` rather than
    /// recorded twice (a `subscription_event` has no id of its own).
    async fn send(&self, callback: &Callback) {
        let url = &self.inv.callback_url;
        let key = format!("\"{}\"", uuid::Uuid::new_v4());
        let body = Bytes::from(serde_json::to_vec(callback).expect("a callback serializes"));
        let mut backoff = Duration::from_millis(50);
        for attempt in 1..=CALLBACK_ATTEMPTS {
            let post = self
                .shared
                .http
                .post(url)
                .header(header::CONTENT_TYPE, "application/json")
                .header(ferry_proto::idempotency::HEADER, &key)
                .body(body.clone());
            match post.send().await {
                Ok(r) if r.status().is_success() => return,
                Ok(r) if !r.status().is_server_error() => {
                    tracing::warn!(%url, status = %r.status(), kind = callback.kind(), "callback refused; not retrying");
                    return;
                }
                Ok(r) => tracing::warn!(%url, status = %r.status(), attempt, "callback failed"),
                Err(e) => tracing::warn!(%url, error = %e, attempt, "callback failed"),
            }
            if attempt < CALLBACK_ATTEMPTS {
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
        }
        tracing::warn!(%url, kind = callback.kind(), "giving up on callback");
    }
}

async fn cancel_tool_call(
    State(shared): State<Arc<Shared>>,
    Json(req): Json<CancelToolCall>,
) -> StatusCode {
    shared
        .lock()
        .live
        .remove(&(req.thread_id, req.tool_call_id));
    StatusCode::OK
}

/// Closing a thread cancels its live calls.
async fn close_thread(
    State(shared): State<Arc<Shared>>,
    Json(req): Json<CloseThread>,
) -> StatusCode {
    shared
        .lock()
        .live
        .retain(|(group, _), _| *group != req.thread_id);
    StatusCode::OK
}

async fn tool_call_status(
    State(shared): State<Arc<Shared>>,
    Json(req): Json<ToolCallStatus>,
) -> Json<ToolCallStatusReply> {
    let alive = shared
        .lock()
        .live
        .contains_key(&(req.thread_id, req.tool_call_id));
    Json(ToolCallStatusReply { alive })
}

/// The answer to a `pick_region` prompt: `{"id": <call id>, "selected": i}`.
#[derive(Deserialize)]
struct ChoiceAnswer {
    selected: usize,
}

async fn choice(
    State(shared): State<Arc<Shared>>,
    Path(token): Path<String>,
    Json(answer): Json<ChoiceAnswer>,
) -> Response {
    if answer.selected >= REGIONS.len() {
        return (StatusCode::UNPROCESSABLE_ENTITY, "no such region\n").into_response();
    }
    match shared.lock().waiting_on_user.remove(&token) {
        Some(waiting) => {
            let _ = waiting.send(answer.selected);
            StatusCode::OK.into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            "unknown or already answered prompt\n",
        )
            .into_response(),
    }
}

async fn authorize(State(shared): State<Arc<Shared>>, Path(token): Path<String>) -> Response {
    match shared.lock().waiting_on_user.remove(&token) {
        Some(consent) => {
            let _ = consent.send(0);
            "authorized\n".into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            "unknown or already used authorization\n",
        )
            .into_response(),
    }
}

async fn stats(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let inner = shared.lock();
    Json(json!({"invocations": inner.invocations, "by_call": inner.by_call}))
}

#[cfg(test)]
mod tests;
