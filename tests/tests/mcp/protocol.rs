//! Raw JSON-RPC: bad input, session revisions, the stateless envelope,
//! and the 2025-03-26 batches.

use super::*;

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
