//! `tools/list` and `tools/call` beyond the SDK: pages, schemas, retries
//! from a new session, and cancellation.

use super::*;

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
