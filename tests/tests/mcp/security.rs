//! The transport's checks: origins, hosts and bearer tokens.

use super::*;

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

const OPERATOR_TOKEN: &str = "operator-token-0123456789";
const AGENT_TOKEN: &str = "mcp-agent-token-0123456789";

/// A demo Ferry with two identities at `/mcp`: the operator (an
/// `--api-token`) and an agent (`--mcp-bearer-token`).
async fn with_operator_and_agent() -> Ferry {
    let options = FerryOptions::demo_with(&["--mcp-bearer-token", AGENT_TOKEN]);
    Ferry::start(options.api_token(OPERATOR_TOKEN)).await
}

/// A `tools/call` of the demo's gated `drop_table` with `meta` (2026-07-28
/// envelope), as the agent holding only the MCP bearer token.
async fn agent_drops(agent: &Raw, meta: Value) -> Value {
    let params = json!({"name": "drop_table", "arguments": {"table": "users"}, "_meta": meta});
    let answer = agent
        .stateless("tools/call", params, Some("drop_table"))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// The agent's `drop_table` as call `id` in its thread `g`, which must
/// wait for a reviewer: the operator finds it pending and rejects it,
/// which answers the agent.
async fn waits_for_a_reviewer(agent: &Raw, operator: &Api, g: &str, id: &str) {
    let call = agent_drops(agent, json!({"io.ferry/group_id": g, "io.ferry/id": id}));
    let review = async {
        ferry_tests::eventually(
            "the call to wait for a reviewer",
            Duration::from_secs(10),
            || async {
                let (_, call) = operator.call(g, id).await;
                (call["status"] == "pending_approval").then_some(())
            },
        )
        .await;
        let path = format!("/v1/approvals/{}/{}", seg(g), seg(id));
        let (status, body) = operator
            .post(
                &path,
                &json!({"optionId": "reject_once", "reviewer": "ana"}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    };
    let (answer, ()) = tokio::join!(call, review);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
}

/// A thread's grants were given to the identity that created it: an agent
/// holding only `--mcp-bearer-token` can neither run a gated call in an
/// operator's thread that holds `allow_always`, nor name that thread among
/// its `thread_ancestors` to inherit the grant. Each refusal leaves no
/// trace. (docs/api.md, "Identities".)
#[tokio::test]
async fn an_agent_cannot_borrow_another_identitys_grant() {
    let ferry = with_operator_and_agent().await;
    let operator = Api::with_token(&ferry.url, OPERATOR_TOKEN);
    // The operator's thread `ops` holds a standing grant for drop_table.
    let (status, body) = operator
        .submit(
            json!({"operation": "drop_table", "arguments": {"table": "logs"},
                       "group_id": "ops", "id": "first"}),
        )
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (202, Some("pending_approval")),
        "{body}"
    );
    let (status, body) = operator
        .post(
            "/v1/approvals/ops/first",
            &json!({"optionId": "allow_always", "reviewer": "ana"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, ops) = operator.thread("ops").await;
    assert_eq!(ops["grants"]["demo.drop_table"], "allow_always", "{ops}");
    // Settled, so that nothing more is recorded there of itself.
    operator.wait_for("ops", "first", "tool_result").await;
    let ops_events = operator.events("ops", 0).await.len();

    let agent = Raw::with_bearer(&ferry, AGENT_TOKEN);
    for meta in [
        json!({"io.ferry/group_id": "ops", "io.ferry/id": "borrowed"}),
        json!({"io.ferry/group_id": "agent-child", "io.ferry/thread_ancestors": ["ops"]}),
        json!({"io.ferry/group_id": "agent-child", "io.ferry/thread_ancestors": ["mine", "ops"]}),
    ] {
        let refused = agent_drops(&agent, meta.clone()).await;
        let result = &refused["result"];
        assert_eq!(result["isError"], true, "{meta}: {refused}");
        assert!(
            text_of(result).contains("belongs to another identity"),
            "{meta}: {refused}"
        );
    }
    assert_eq!(operator.events("ops", 0).await.len(), ops_events);
    assert_eq!(operator.thread("agent-child").await.0, 404);

    // In a thread of its own the same call waits for a reviewer.
    waits_for_a_reviewer(&agent, &operator, "agent-own", "d").await;
    let accepted = operator.wait_for("agent-own", "d", "call_accepted").await;
    assert_eq!(accepted["payload"]["identity"], "mcp", "{accepted}");

    // An ancestor named before it existed lends nothing once another
    // identity creates it and grants there.
    let named_early = json!({"name": "echo", "arguments": {"text": "hi"},
        "_meta": {"io.ferry/group_id": "agent-early", "io.ferry/thread_ancestors": ["later"]}});
    let answer = agent
        .stateless("tools/call", named_early, Some("echo"))
        .await;
    assert_eq!(answer.body["result"]["isError"], false, "{}", answer.body);
    let (status, _) = operator
        .submit(
            json!({"operation": "drop_table", "arguments": {"table": "t"},
                       "group_id": "later", "id": "g"}),
        )
        .await;
    assert_eq!(status, 202);
    let (status, _) = operator
        .post(
            "/v1/approvals/later/g",
            &json!({"optionId": "allow_always", "reviewer": "ana"}),
        )
        .await;
    assert_eq!(status, 200);
    waits_for_a_reviewer(&agent, &operator, "agent-early", "late").await;

    // An operator may act in any thread, the agent's too.
    let (status, body) = operator
        .submit(json!({"operation": "echo", "arguments": {"text": "x"},
                       "group_id": "agent-own", "id": "op"}))
        .await;
    assert_eq!(status, 202, "{body}");
}

/// A 2025 session serves only the identity that opened it: another
/// credential naming its id meets "Session not found" (404), as for an id
/// that never was, and cannot end it. Its calls' thread is not named
/// after its id, so reading threads shows no session id.
#[tokio::test]
async fn a_session_serves_only_the_credential_that_opened_it() {
    let ferry = with_operator_and_agent().await;
    let mut agent = Raw::with_bearer(&ferry, AGENT_TOKEN);
    agent.initialize("2025-11-25").await;
    let session = agent.session.clone().unwrap();
    let echo = json!({"name": "echo", "arguments": {"text": "hi"}});
    let answer = agent.rpc("tools/call", echo.clone()).await;
    assert_eq!(answer.body["result"]["isError"], false, "{}", answer.body);
    let thread = answer.body["result"]["_meta"]["io.ferry/group_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!thread.contains(&session), "{thread}");

    let mut other = Raw::with_bearer(&ferry, OPERATOR_TOKEN);
    other.session = Some(session.clone());
    for method in ["tools/list", "tools/call"] {
        let refused = other.rpc(method, echo.clone()).await;
        assert_eq!(
            (refused.status, refused.body["error"]["code"].as_i64()),
            (404, Some(-32001)),
            "{method}: {}",
            refused.body
        );
    }
    let ended = other
        .http
        .delete(&other.url)
        .bearer_auth(OPERATOR_TOKEN)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 404);

    let operator = Api::with_token(&ferry.url, OPERATOR_TOKEN);
    let (_, threads) = operator.get("/v1/threads").await;
    assert!(!threads.to_string().contains(&session), "{threads}");
    assert_eq!(
        operator.events(&thread, 0).await.len(),
        3,
        "one call, nothing more"
    );
    // The holder's session goes on.
    let answer = agent.rpc("tools/list", json!({})).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}
