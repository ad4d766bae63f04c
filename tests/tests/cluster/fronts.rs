//! The MCP, OXP and ACP fronts on runtime nodes: calls, sessions and
//! permission answers through any node, before any worker, and without NATS.

use std::sync::Arc;
use std::time::Duration;

use ferry_tests::{eventually, Ferry, FerryOptions, FerryWorker, Nats, TestTool};
use serde_json::{json, Value};

use super::{answer_everything, node_with, Cluster};

/// One JSON-RPC request to `{node}/mcp`: the answer's status, session
/// header and body.
async fn mcp(
    node: &str,
    session: Option<&str>,
    method: &str,
    params: Value,
) -> (u16, Option<String>, Value) {
    let mut request = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{node}/mcp"))
        .header("accept", "application/json")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
    if let Some(s) = session {
        request = request.header("mcp-session-id", s);
    }
    let response = request.send().await.expect("POST /mcp");
    let status = response.status().as_u16();
    let session = response
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    (
        status,
        session,
        response.json().await.unwrap_or(Value::Null),
    )
}

/// MCP and OXP on runtime nodes: a call made through either front on one
/// node runs through the cluster (journal, relay, a worker) and its result,
/// called back to the other node, is the front's answer; bad input gets
/// each protocol's error and records nothing.
#[tokio::test(flavor = "multi_thread")]
async fn mcp_and_oxp_calls_run_through_any_runtime_node() {
    let c = Cluster::start(1).await;
    let answering = answer_everything(c.tool.clone(), vec![c.b.url.clone()]);
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {},
                      "clientInfo": {"name": "cluster-test", "version": "1"}});
    let (status, session, body) = mcp(&c.a.url, None, "initialize", init).await;
    assert_eq!(status, 200, "{body}");
    let session = session.expect("a session id");

    let call = json!({"name": "op", "arguments": {}});
    let (status, _, body) = mcp(&c.a.url, Some(&session), "tools/call", call).await;
    assert_eq!(status, 200, "{body}");
    let result = &body["result"];
    assert_eq!(result["isError"], false, "{body}");
    let (g, id) = (
        result["_meta"]["io.ferry/group_id"].as_str().unwrap(),
        result["_meta"]["io.ferry/id"].as_str().unwrap(),
    );
    // The tool's answer (its text is the call's id), read on the other node.
    assert_eq!(result["content"][0]["text"], id, "{body}");
    assert_eq!(c.b.api().count(g, id, "tool_result").await, 1);

    let unknown = json!({"name": "nope", "arguments": {}});
    let (_, _, body) = mcp(&c.a.url, Some(&session), "tools/call", unknown).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
    let not_object = json!({"name": "op", "arguments": [1]});
    let (_, _, body) = mcp(&c.a.url, Some(&session), "tools/call", not_object).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");

    let oxp = |input: Value, call_id: &str| {
        let body = json!({"request": {"tool_id": "t.op", "input": input, "call_id": call_id,
                                      "context": {"user_id": "u1"}}});
        let url = format!("{}/oxp/tools/call", c.b.url);
        async move {
            let r = reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = oxp(json!({}), "oxp-1").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("error").is_none(), "{body}");
    let sent = c
        .tool
        .invocations()
        .into_iter()
        .find(|i| i.id == "oxp-1")
        .unwrap();
    assert_eq!(
        c.a.api()
            .count(&sent.group_id, "oxp-1", "tool_result")
            .await,
        1
    );
    // The same call_id with other input is refused by the worker, and the
    // refusal reaches the OXP client as the front's own error.
    let (status, body) = oxp(json!({"other": true}), "oxp-1").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["message"], "This call_id was already used for a different call",
        "{body}"
    );
    assert_eq!(
        c.a.api()
            .count(&sent.group_id, "oxp-1", "call_accepted")
            .await,
        1
    );
    answering.abort();
}

/// MCP 2025-11-25, "Session Management": "The server MAY terminate the
/// session at any time, after which it MUST respond to requests containing
/// that session ID with HTTP 404 Not Found." A session lives in JetStream
/// KV: opened on node A, it is served by node B (its calls go to the
/// session's thread); ended on B, it is ended on A too. While NATS is away
/// a session cannot be opened or read: 503 with `Retry-After`, a JSON-RPC
/// error, and the session is still there once NATS is back.
#[tokio::test(flavor = "multi_thread")]
async fn a_2025_mcp_session_opened_on_one_node_continues_on_another() {
    let mut c = Cluster::start(1).await;
    let answering = answer_everything(c.tool.clone(), vec![c.a.url.clone()]);
    let init = json!({"protocolVersion": "2025-11-25", "capabilities": {},
                      "clientInfo": {"name": "cluster-test", "version": "1"}});
    let (status, session, body) = mcp(&c.a.url, None, "initialize", init.clone()).await;
    assert_eq!(status, 200, "{body}");
    let session = session.expect("a session id");

    let (status, _, body) = mcp(&c.b.url, Some(&session), "tools/list", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "op"),
        "{body}"
    );
    let call = json!({"name": "op", "arguments": {}});
    let (status, _, body) = mcp(&c.b.url, Some(&session), "tools/call", call.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["isError"], false, "{body}");
    let thread = ferry_fronts::mcp::thread_of_session(&session);
    assert_eq!(
        body["result"]["_meta"]["io.ferry/group_id"],
        json!(thread),
        "{body}"
    );

    // Unknown ids, and ids no KV key can be, are 404 on every node.
    for bad in ["mcp-0123", "mcp-a.b", "mcp-*", "mcp->"] {
        let (status, _, body) = mcp(&c.b.url, Some(bad), "tools/list", json!({})).await;
        assert_eq!(
            (status, body["error"]["code"].as_i64()),
            (404, Some(-32001)),
            "{bad}: {body}"
        );
    }

    c.nats.kill9();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    for (headers, method) in [(None, "initialize"), (Some(&session), "tools/list")] {
        let mut request = client
            .post(format!("{}/mcp", c.a.url))
            .header("accept", "application/json")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": init}));
        if let Some(s) = headers {
            request = request.header("mcp-session-id", s);
        }
        let sent = request.send().await.unwrap();
        assert_eq!(sent.status().as_u16(), 503, "{method}");
        assert_eq!(sent.headers()["retry-after"], "1", "{method}");
        let body: Value = sent.json().await.unwrap();
        assert_eq!(body["error"]["code"], -32603, "{method}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("retry"),
            "{body}"
        );
    }
    c.nats.restart().await;
    eventually(
        "the session, read again",
        Duration::from_secs(30),
        || async {
            let (status, _, _) = mcp(&c.a.url, Some(&session), "tools/list", json!({})).await;
            (status == 200).then_some(())
        },
    )
    .await;

    let end = |node: String| {
        let (client, session) = (client.clone(), session.clone());
        async move {
            let sent = client
                .delete(format!("{node}/mcp"))
                .header("mcp-session-id", session)
                .send()
                .await
                .unwrap();
            sent.status().as_u16()
        }
    };
    assert_eq!(end(c.b.url.clone()).await, 204);
    let (status, _, body) = mcp(&c.a.url, Some(&session), "tools/call", call).await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (404, Some(-32001)),
        "{body}"
    );
    assert_eq!(end(c.a.url.clone()).await, 404, "ended already");
    // The session's thread stays readable: one call, one result.
    let events = c.a.api().events(&thread, 0).await;
    assert_eq!(
        events.iter().filter(|e| e["type"] == "tool_result").count(),
        1,
        "{events:?}"
    );
    answering.abort();
}

/// MCP and OXP calls made before any worker runs are accepted by the node
/// (decided and stored), and answered with the tool's result once a
/// worker starts and dispatches them.
#[tokio::test(flavor = "multi_thread")]
async fn mcp_and_oxp_calls_made_before_any_worker_runs_are_answered_once_one_does() {
    let nats = Nats::start().await;
    let tool = Arc::new(TestTool::start("t", &["op"]).await);
    let a = node_with(&nats, &tool, &[]).await;
    let answering = answer_everything(tool.clone(), vec![a.url.clone()]);
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {},
                      "clientInfo": {"name": "cluster-test", "version": "1"}});
    let (_, session, body) = mcp(&a.url, None, "initialize", init).await;
    let session = session.unwrap_or_else(|| panic!("no session: {body}"));

    let call = json!({"name": "op", "arguments": {}});
    let oxp = json!({"request": {"tool_id": "t.op", "input": {}, "call_id": "oxp-j"}});
    let oxp_call = async {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let r = client
            .post(format!("{}/oxp/tools/call", a.url))
            .json(&oxp)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    // The worker starts only after both calls were sent.
    let nats_url = nats.url();
    let ((status, _, mcp_body), (oxp_status, oxp_body), _worker) = tokio::join!(
        mcp(&a.url, Some(&session), "tools/call", call),
        oxp_call,
        FerryWorker::start(&nats_url, &a.url),
    );
    assert_eq!(status, 200, "{mcp_body}");
    assert_eq!(mcp_body["result"]["isError"], false, "{mcp_body}");
    let id = mcp_body["result"]["_meta"]["io.ferry/id"].as_str().unwrap();
    assert_eq!(mcp_body["result"]["content"][0]["text"], id, "{mcp_body}");
    assert_eq!(
        (oxp_status, &oxp_body["result"]["success"]),
        (200, &json!(true)),
        "{oxp_body}"
    );
    answering.abort();
}

/// NATS down: an OXP call is refused with OXP's own server error (400)
/// saying to retry, and nothing is recorded. Retried after NATS is back,
/// it answers the tool's result; the agent sees one outcome.
#[tokio::test(flavor = "multi_thread")]
async fn an_oxp_call_made_while_nats_is_down_answers_a_retry_once_it_is_back() {
    let mut nats = Nats::start().await;
    let tool = Arc::new(TestTool::start("t", &["op"]).await);
    let a = node_with(&nats, &tool, &["--oxp-wait-secs", "5"]).await;
    let _worker = FerryWorker::start(&nats.url(), &a.url).await;
    let answering = answer_everything(tool.clone(), vec![a.url.clone()]);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let oxp = || async {
        let body = json!({"request": {"tool_id": "t.op", "input": {}, "call_id": "oxp-down"}});
        let r = client
            .post(format!("{}/oxp/tools/call", a.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    nats.kill9();
    let (status, body) = oxp().await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["developer_message"]
            .as_str()
            .is_some_and(|m| m.contains("retry")),
        "{body}"
    );
    nats.restart().await;
    let done = eventually(
        "the retried call's result",
        Duration::from_secs(60),
        || async {
            let (_, body) = oxp().await;
            (body["result"]["success"] == true).then_some(body)
        },
    )
    .await;
    assert_eq!(done["result"]["value"], "oxp-down", "{done}");
    let api = a.api();
    assert_eq!(
        api.count("oxp-anonymous", "oxp-down", "tool_result").await,
        1
    );
    assert_eq!(
        api.count("oxp-anonymous", "oxp-down", "call_accepted")
            .await,
        1
    );
    answering.abort();
}

/// A tool server whose one tool, `op`, is destructive: gated.
async fn gated_tool() -> TestTool {
    TestTool::with_manifest(json!({"name": "t", "tools": [{
        "name": "op", "description": "destructive: gated",
        "inputSchema": ferry_tests::tool::text_schema(),
        "annotations": {"destructive": true},
    }]}))
    .await
}

/// An ACP permission answer is decided like a native one: with NATS down
/// it is refused (503, a JSON-RPC error) and changes nothing; the same
/// answer once NATS is back is applied, and the gated call runs.
#[tokio::test(flavor = "multi_thread")]
async fn an_acp_answer_refused_while_nats_is_down_is_applied_when_sent_again() {
    let mut nats = Nats::start().await;
    let tool = Arc::new(gated_tool().await);
    let a = node_with(&nats, &tool, &[]).await;
    let _worker = FerryWorker::start(&nats.url(), &a.url).await;
    let api = a.api();
    let (status, body) = api
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g-acp", "id": "c"}))
        .await;
    assert_eq!(status, 202, "{body}");
    api.wait_for("g-acp", "c", "approval_requested").await;

    nats.kill9();
    let answer = json!({"jsonrpc": "2.0", "id": "ferry-permission:c",
                        "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}});
    let (status, body) = api.post("/v1/threads/g-acp/acp", &answer).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["code"].is_i64(), "a JSON-RPC error: {body}");
    nats.restart().await;
    eventually("the answer taken", Duration::from_secs(60), || async {
        let (status, _) = api.post("/v1/threads/g-acp/acp", &answer).await;
        (status == 202).then_some(())
    })
    .await;
    let sent = tool.next_invocation().await.invocation;
    assert_eq!((sent.group_id.as_str(), sent.id.as_str()), ("g-acp", "c"));
    let decided = api.wait_for("g-acp", "c", "approval_decided").await;
    assert_eq!(decided["payload"]["reviewer"], "acp", "{decided}");
}

/// ACP through either node: the permission request of a call submitted on
/// node A reaches an ACP client following the thread on node B; its
/// answer, posted to B, is decided once and the call runs; the same answer
/// sent to A afterwards is 409, as on one process.
#[tokio::test(flavor = "multi_thread")]
async fn an_acp_permission_asked_through_one_node_is_answered_through_the_other() {
    let nats = Nats::start().await;
    let tool = Arc::new(gated_tool().await);
    let a = node_with(&nats, &tool, &[]).await;
    let b = Ferry::start(FerryOptions::runtime(&nats.url())).await;
    let _worker = FerryWorker::start(&nats.url(), &a.url).await;
    let answering = answer_everything(tool.clone(), vec![a.url.clone(), b.url.clone()]);
    let (api_a, api_b) = (a.api(), b.api());
    let mut stream =
        ferry_tests::sse::SseReader::open(&api_b, "/v1/threads/g-acp2/acp", None).await;
    let (status, body) = api_a
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g-acp2", "id": "c"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let asked = loop {
        let event = stream.next().await;
        if event.data["method"] == "session/request_permission" {
            break event.data;
        }
    };
    assert_eq!(asked["params"]["toolCall"]["toolCallId"], "c", "{asked}");
    let answer = json!({"jsonrpc": "2.0", "id": asked["id"],
                        "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}});
    let (status, body) = api_b.post("/v1/threads/g-acp2/acp", &answer).await;
    assert_eq!(status, 202, "{body}");
    let done = api_a.wait_for("g-acp2", "c", "tool_result").await;
    assert_eq!(done["payload"]["text"], "c", "{done}");
    let (status, body) = api_a.post("/v1/threads/g-acp2/acp", &answer).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(api_b.count("g-acp2", "c", "approval_decided").await, 1);
    assert_eq!(
        api_a.events("g-acp2", 0).await,
        api_b.events("g-acp2", 0).await
    );
    answering.abort();
}
