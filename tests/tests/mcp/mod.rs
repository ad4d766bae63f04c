//! The MCP server at `/mcp`: the official MCP Python SDK (auto and legacy
//! modes) and the official conformance suite against a real `ferry serve`,
//! plus raw JSON-RPC for what those clients never send (bad input, foreign
//! origins, tasks, the stateless envelope's checks).
//!
//! The clients are installed by `ops/scripts/setup-mcp.sh` (run by
//! `ops/scripts/test.sh`); these tests fail, never skip, without them.

mod conformance;
mod protocol;
mod sdk;
mod security;
mod tasks;
mod tools;

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
    /// Sent as `Authorization: Bearer …` with every request.
    bearer: Option<String>,
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
            bearer: None,
        }
    }

    fn with_bearer(ferry: &Ferry, token: &str) -> Self {
        Self {
            bearer: Some(token.to_owned()),
            ..Self::new(ferry)
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
        if let Some(token) = &self.bearer {
            request = request.bearer_auth(token);
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
