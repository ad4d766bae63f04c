//! docs/api.md, browsers and hosts: the native API answers only requests
//! that name this Ferry in `Host` (DNS rebinding), takes changes only from
//! Ferry's own origin (another port of loopback is another site), and
//! reads bodies only declared `application/json`. Each refusal changes
//! nothing; tools' callbacks and the health check answer any `Host`.

use ferry_tests::api::Api;
use ferry_tests::{Ferry, FerryOptions, TestTool};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn call(id: &str) -> Value {
    json!({"operation": "echo", "arguments": {}, "group_id": "g", "id": id})
}

/// A request to `ferry` with `headers` (a `host` among them is sent as
/// `Host`) and, for a POST, `body` as given.
async fn send(
    ferry: &Ferry,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> (u16, Value) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = client.request(method, format!("{}{path}", ferry.url));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn post_call(ferry: &Ferry, id: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let body = Some(call(id).to_string());
    send(ferry, reqwest::Method::POST, "/v1/calls", headers, body).await
}

/// Nothing was recorded in thread `g`, and nothing reached the tool.
async fn nothing_happened(api: &Api, tool: &TestTool) {
    let (status, body) = api.thread("g").await;
    assert_eq!(status, 404, "a refused request made the thread: {body}");
    assert!(tool.invocations().is_empty(), "a refused call was sent");
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_host_is_refused_and_changes_nothing() {
    let tool = TestTool::start("t", &["echo"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let rebound = format!("rebound.example:{}", ferry.port);
    let host = ("host", rebound.as_str());
    let get = reqwest::Method::GET;
    let (status, body) = send(&ferry, get.clone(), "/v1/threads", &[host], None).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden", "{body}");
    assert!(!body.to_string().contains("\"threads\""), "{body}");
    // Nor the dashboard's page, nor any other read or write.
    let (status, _) = send(&ferry, get.clone(), "/ui", &[host], None).await;
    assert_eq!(status, 403);
    let (status, body) = post_call(&ferry, "c", &[host, JSON]).await;
    assert_eq!(status, 403, "{body}");
    let api = ferry.api();
    nothing_happened(&api, &tool).await;
    // A request naming no `Host` at all (HTTP/1.0) is malformed.
    let answer = raw(&ferry, "GET /v1/threads HTTP/1.0\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.0 400"), "{answer}");
    assert!(answer.contains("invalid_request"), "{answer}");

    // What load balancers and tools on other hosts reach: the health check
    // and the callback URL, whatever name they reach Ferry by.
    let (status, _) = send(&ferry, get, "/healthz", &[host], None).await;
    assert_eq!(status, 200);
    let (status, body) = api.submit(call("c")).await;
    assert_eq!(status, 202, "{body}");
    let url = tool.next_invocation().await.invocation.callback_url;
    let path = url.strip_prefix(&ferry.url).expect("a callback on Ferry");
    let result = json!({"type": "tool_result", "group_id": "g", "id": "c", "text": "done"});
    let post = reqwest::Method::POST;
    let (status, body) = send(&ferry, post, path, &[host, JSON], Some(result.to_string())).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(api.call("g", "c").await.1["status"], "completed");
}

/// Sends `request` as it is and reads the answer to its end.
async fn raw(ferry: &Ferry, request: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", ferry.port))
        .await
        .unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread")]
async fn the_public_urls_host_and_the_listed_hosts_are_ferrys_own() {
    let tool = TestTool::start("t", &["echo"]).await;
    let options = FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::default()
    };
    let ferry = Ferry::start(options.with_args(&[
        "--public-url",
        "https://ferry.example.com:8443",
        "--mcp-allowed-host",
        "ferry.internal",
    ]))
    .await;
    let public = ("host", "ferry.example.com:8443");
    let get = reqwest::Method::GET;
    let (status, body) = send(&ferry, get.clone(), "/v1/threads", &[public], None).await;
    assert_eq!(status, 200, "{body}");
    // Its page posts from the public origin, through a proxy in front.
    let from_public = [public, ("origin", "https://ferry.example.com:8443"), JSON];
    let (status, body) = post_call(&ferry, "c", &from_public).await;
    assert_eq!(status, 202, "{body}");
    let listed = ("host", "ferry.internal:8080");
    let (status, body) = send(&ferry, get.clone(), "/v1/threads/g", &[listed], None).await;
    assert_eq!(status, 200, "{body}");
    // The public name on another port is not the public URL.
    let other_port = ("host", "ferry.example.com:9999");
    let (status, _) = send(&ferry, get, "/v1/threads", &[other_port], None).await;
    assert_eq!(status, 403);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_on_another_loopback_port_changes_nothing() {
    let tool = TestTool::start("t", &["echo"]).await;
    let log = tempfile::NamedTempFile::new().unwrap();
    let options = FerryOptions {
        tool_servers: vec![tool.url.clone()],
        log: Some(log.path().to_owned()),
        ..FerryOptions::default()
    };
    let ferry = Ferry::start(options).await;
    let api = ferry.api();
    let other_port = format!("http://127.0.0.1:{}", ferry.port + 1);
    for origin in ["http://localhost:5173", other_port.as_str(), "null"] {
        let (status, body) = post_call(&ferry, "c", &[("origin", origin), JSON]).await;
        assert_eq!(status, 403, "{origin}: {body}");
        assert_eq!(body["error"]["code"], "forbidden", "{body}");
    }
    nothing_happened(&api, &tool).await;
    // A flood of them is logged a few lines at a time.
    for _ in 0..20 {
        let (status, _) =
            post_call(&ferry, "c", &[("origin", "http://localhost:5173"), JSON]).await;
        assert_eq!(status, 403);
    }
    let logged = std::fs::read_to_string(log.path()).unwrap();
    let lines = logged.matches("cross-site request refused").count();
    assert!((1..=5).contains(&lines), "{lines} lines:\n{logged}");

    // The page Ferry serves itself, by address or by name, may.
    let (status, body) = post_call(&ferry, "c", &[("origin", &ferry.url), JSON]).await;
    assert_eq!(status, 202, "{body}");
    tool.next_invocation().await;
    let by_name = Api::new(&format!("http://localhost:{}", ferry.port));
    let response = by_name
        .client
        .post(format!("{}/v1/calls", by_name.base))
        .header("origin", format!("http://localhost:{}", ferry.port))
        .json(&call("d"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    assert_eq!(tool.next_invocation().await.invocation.id, "d");
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_not_declared_json_are_refused_and_change_nothing() {
    let tool = TestTool::start("t", &["echo"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let headers: Vec<_> = content_type
            .map(|t| ("content-type", t))
            .into_iter()
            .collect();
        let (status, body) = post_call(&ferry, "c", &headers).await;
        assert_eq!(status, 415, "{content_type:?}: {body}");
        assert_eq!(body["error"]["code"], "unsupported_media_type", "{body}");
    }
    nothing_happened(&api, &tool).await;
    let (status, body) = post_call(
        &ferry,
        "c",
        &[("content-type", "application/json; charset=utf-8")],
    )
    .await;
    assert_eq!(status, 202, "{body}");

    // A tool's callback is JSON too (rap-2), and a refused one records
    // nothing: the call still waits for its result.
    let url = tool.next_invocation().await.invocation.callback_url;
    let result = json!({"type": "tool_result", "group_id": "g", "id": "c", "text": "done"});
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let refused = client
        .post(&url)
        .header("content-type", "text/plain")
        .body(result.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 415);
    assert_eq!(api.call("g", "c").await.1["status"], "dispatched");
    let (status, body) = api.post(&url, &result).await;
    assert_eq!(status, 200, "{body}");

    // Without a body there is nothing to declare: a cancel, a close.
    let (status, body) = api.submit(call("d")).await;
    assert_eq!(status, 202, "{body}");
    tool.next_invocation().await;
    let (status, body) = api.delete("/v1/threads/g/calls/d").await;
    assert!(status < 300, "{status}: {body}");
    let post = reqwest::Method::POST;
    let (status, body) = send(&ferry, post, "/v1/threads/g/close", &[], None).await;
    assert!(status < 300, "{status}: {body}");
}

/// OXP answers the same `Host` check in its own error shape: a page on a
/// name rebound to this machine can neither list the tools nor call one.
#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_host_is_refused_on_oxp_in_its_own_shape() {
    let tool = TestTool::start("t", &["echo"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let rebound = format!("rebound.example:{}", ferry.port);
    let host = ("host", rebound.as_str());
    let (status, body) = send(&ferry, reqwest::Method::GET, "/oxp/tools", &[host], None).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].is_string() && body["$schema"].is_string(),
        "{body}"
    );
    assert!(!body.to_string().contains("echo"), "{body}");
    let oxp_call = json!({"request": {"tool_id": "t.echo", "input": {}, "call_id": "c"}});
    let (status, body) = send(
        &ferry,
        reqwest::Method::POST,
        "/oxp/tools/call",
        &[host, JSON],
        Some(oxp_call.to_string()),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(tool.invocations().is_empty(), "a refused call was sent");
    let (_, threads) = ferry.api().get("/v1/threads").await;
    assert_eq!(threads["threads"], json!([]), "{threads}");
    // Its own name still lists the tools.
    let own = format!("127.0.0.1:{}", ferry.port);
    let (status, body) = send(
        &ferry,
        reqwest::Method::GET,
        "/oxp/tools",
        &[("host", &own)],
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
}
