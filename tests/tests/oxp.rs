//! The OXP server under `/oxp`, driven by the official OXP Python client
//! (`pip install oxp`, run as `tests/py/oxp_client.py`) against a real
//! ferry: health, listing, calls and their results, tool errors, 422s and
//! 400s, `call_id` idempotency through the approval gate, JWT and API-key
//! auth, and malformed requests that change nothing.

use std::path::{Path, PathBuf};

use ferry_tests::api::seg;
use ferry_tests::{Ack, Ferry, FerryOptions, TestTool};
use serde_json::{json, Value};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

/// The venv's python; the tests fail (never skip) without it.
fn python() -> PathBuf {
    let python = workspace().join("target/py/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `bash ops/scripts/setup-oxp.sh` to install the official OXP client",
        python.display()
    );
    python
}

/// Runs the official client with `args` against `ferry`'s `/oxp`.
async fn client(ferry: &Ferry, args: &[&str]) -> Value {
    let out = tokio::process::Command::new(python())
        .arg(workspace().join("tests/py/oxp_client.py"))
        .arg("--base")
        .arg(format!("{}/oxp", ferry.url))
        .args(args)
        .output()
        .await
        .expect("running the OXP client");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "OXP client failed: {stderr}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("OXP client output is not JSON ({e}): {stderr}"))
}

async fn call(ferry: &Ferry, tool_id: &str, input: Value, extra: &[&str]) -> Value {
    let input = input.to_string();
    let mut args = vec!["call", "--tool-id", tool_id, "--input", &input];
    args.extend_from_slice(extra);
    client(ferry, &args).await
}

/// An OXP `ServerErrorResponse` (or 401) answer from the client's output.
fn server_error(out: &Value, status: u16) -> &Value {
    assert_eq!(out["ok"], false, "{out}");
    assert_eq!(out["status"], status, "{out}");
    let body = &out["body"];
    assert!(body["message"].is_string(), "{out}");
    body
}

#[tokio::test]
async fn the_official_client_lists_calls_and_reads_errors() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();

    assert_eq!(client(&ferry, &["health"]).await["ok"], true);

    let list = client(&ferry, &["list"]).await;
    let items = list["response"]["items"].as_array().expect("items").clone();
    let echo = items
        .iter()
        .find(|t| t["id"] == "demo.echo@1.0.0")
        .unwrap_or_else(|| panic!("no demo.echo@1.0.0 in {list}"));
    assert_eq!(echo["name"], "demo_echo");
    assert_eq!(echo["version"], "1.0.0");
    assert!(echo["description"].as_str().is_some_and(|d| !d.is_empty()));
    assert_eq!(echo["input_schema"]["properties"]["text"]["type"], "string");
    assert_eq!(items.len(), 9, "the demo's nine tools: {list}");

    // A successful call (`@1` means 1.0.0) is a Ferry call in the
    // anonymous OXP thread.
    let ok = call(
        &ferry,
        "demo.echo@1",
        json!({"text": "hello"}),
        &["--call-id", "c-ok"],
    )
    .await;
    let result = &ok["response"]["result"];
    assert_eq!(result["success"], true, "{ok}");
    assert_eq!(result["value"], "hello");
    assert_eq!(result["call_id"], "c-ok");
    assert!(result["duration"].is_number());
    let (status, view) = api.call("oxp-anonymous", "c-ok").await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["status"], "completed");
    assert_eq!(view["tool"], "demo.echo@1.0.0");
    // OXP's version parts are integers: `@01.0.0` is 1.0.0 too.
    let zeros = call(&ferry, "demo.echo@01.0.0", json!({"text": "z"}), &[]).await;
    assert_eq!(zeros["response"]["result"]["value"], "z", "{zeros}");

    // A tool error: 200 with success false.
    let failed = call(&ferry, "demo.fail", json!({"message": "boom"}), &[]).await;
    let result = &failed["response"]["result"];
    assert_eq!(result["success"], false, "{failed}");
    assert!(result["error"]["message"]
        .as_str()
        .unwrap()
        .contains("boom"));
    assert_eq!(result["error"]["can_retry"], false);
    assert!(result.get("value").is_none());

    // Invalid input: 422 naming the parameter; nothing recorded.
    let invalid = call(
        &ferry,
        "demo.echo",
        json!({"text": 5}),
        &["--call-id", "c-bad"],
    )
    .await;
    assert_eq!(invalid["status"], 422, "{invalid}");
    assert_eq!(invalid["error"], "UnprocessableEntityError");
    assert!(
        invalid["body"]["parameter_errors"]["text"].is_string(),
        "{invalid}"
    );
    assert_eq!(api.call("oxp-anonymous", "c-bad").await.0, 404);

    // Unknown version, unknown tool: 400 ServerErrorResponse.
    let version = call(&ferry, "demo.echo@2.0.0", json!({}), &[]).await;
    let body = server_error(&version, 400);
    assert!(
        body["developer_message"]
            .as_str()
            .unwrap()
            .contains("1.0.0"),
        "{body}"
    );
    assert_eq!(version["error"], "BadRequestError");
    server_error(&call(&ferry, "demo.nothing", json!({}), &[]).await, 400);

    // A supported `$schema` is accepted.
    let schema = call(
        &ferry,
        "demo.echo",
        json!({"text": "v"}),
        &["--schema", "urn:oxp:1.0"],
    )
    .await;
    assert_eq!(schema["response"]["result"]["value"], "v", "{schema}");
}

/// `POST /oxp/tools/call` straight over HTTP: the answer's `result`.
async fn oxp_call(base: &str, tool_id: &str, input: Value, call_id: &str) -> Value {
    let body = json!({"request": {"tool_id": tool_id, "input": input, "call_id": call_id}});
    let response = reqwest::Client::new()
        .post(format!("{base}/oxp/tools/call"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap();
    match status {
        200 => answer["result"].clone(),
        _ => json!({"status": status, "body": answer}),
    }
}

#[track_caller]
fn failed(result: &Value, can_retry: bool) {
    assert_eq!(result["success"], false, "{result}");
    assert_eq!(result["error"]["can_retry"], can_retry, "{result}");
}

/// OXP: "If can_retry is true, the client SHOULD retry the tool call." A
/// call Ferry could not get to its tool (HTTP 500 until the attempts ran
/// out) is answered `can_retry: true`, and the retry, with the same
/// request and `call_id`, runs it again: the tool is invoked afresh and
/// the answer is the rerun's, under the client's `call_id`. Before, the
/// retry read the stored failure again, `can_retry` and all. Retrying
/// once more reads the same answer without another invocation; another
/// input under the `call_id` is still a conflict; a refusal (4xx) is not
/// retried; and reruns end after five.
#[tokio::test]
async fn a_transient_failure_retried_with_the_same_call_id_runs_again() {
    let tool = TestTool::start("t", &["op"]).await;
    let mut options = FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::default()
    };
    options.args.extend(["--max-attempts".into(), "2".into()]);
    let ferry = Ferry::start(options).await;
    let input = json!({"text": "x"});

    tool.plan(&[Ack::Status(500), Ack::Status(500)]);
    let first = oxp_call(&ferry.url, "t.op", input.clone(), "c1").await;
    failed(&first, true);
    assert_eq!(first["call_id"], "c1");
    for _ in 0..2 {
        assert_eq!(tool.next_invocation().await.invocation.id, "c1");
    }

    let retry = tokio::spawn({
        let (url, input) = (ferry.url.clone(), input.clone());
        async move { oxp_call(&url, "t.op", input, "c1").await }
    });
    let rerun = tool.next_invocation().await.invocation;
    assert_ne!(rerun.id, "c1", "a new Ferry call");
    assert_eq!(rerun.call_id.as_deref(), Some("c1"), "{rerun:?}");
    assert_eq!(rerun.arguments, input);
    let posted = reqwest::Client::new()
        .post(&rerun.callback_url)
        .json(&json!({"type": "tool_result", "group_id": rerun.group_id, "id": rerun.id, "text": "done"}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 200);
    let answered = retry.await.unwrap();
    assert_eq!(answered["success"], true, "{answered}");
    assert_eq!(
        (&answered["value"], &answered["call_id"]),
        (&json!("done"), &json!("c1"))
    );

    let again = oxp_call(&ferry.url, "t.op", input.clone(), "c1").await;
    assert_eq!(again["value"], "done", "{again}");
    assert_eq!(tool.invocations().len(), 3, "no fourth invocation");
    let other = oxp_call(&ferry.url, "t.op", json!({"text": "y"}), "c1").await;
    assert_eq!(other["status"], 400, "{other}");
    // Rerun ids are Ferry's: a client taking one could block another
    // client's retries in a shared thread.
    let taken = oxp_call(&ferry.url, "t.op", input.clone(), &rerun.id).await;
    assert_eq!(taken["status"], 400, "{taken}");
    let taken = oxp_call(&ferry.url, "t.op", input.clone(), "oxp-rerun-x-2").await;
    assert_eq!(taken["status"], 400, "{taken}");

    // A refusal would end the same way: not retried.
    let submit = |call_id: &'static str| oxp_call(&ferry.url, "t.op", input.clone(), call_id);
    tool.plan(&[Ack::Status(400)]);
    failed(&submit("c2").await, false);
    failed(&submit("c2").await, false);
    assert_eq!(tool.invocations().len(), 4);

    // The first run and five reruns, then no more.
    tool.plan(&[Ack::Status(503); 12]);
    for _ in 0..5 {
        failed(&submit("c3").await, true);
    }
    failed(&submit("c3").await, false);
    failed(&submit("c3").await, false);
    assert_eq!(tool.invocations().len(), 4 + 12);
}

/// Calls `tool_id` with `call_id` and answers the invocation with `text`:
/// the OXP answer's `result`.
async fn answered_call(
    ferry: &Ferry,
    tool: &TestTool,
    tool_id: &str,
    call_id: &str,
    text: &str,
) -> Value {
    let call = tokio::spawn({
        let (url, tool_id, call_id) = (ferry.url.clone(), tool_id.to_owned(), call_id.to_owned());
        async move { oxp_call(&url, &tool_id, json!({"text": "x"}), &call_id).await }
    });
    let invoked = tool.next_invocation().await.invocation;
    let posted = reqwest::Client::new()
        .post(&invoked.callback_url)
        .json(&json!({"type": "tool_result", "group_id": invoked.group_id, "id": invoked.id, "text": text}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 200);
    call.await.unwrap()
}

/// OXP's retry flow ("retry with the same call_id") keeps working when
/// the toolsets change under it: a retry is answered by the call already
/// under its `call_id`, as a native retry is, after a newer version was
/// registered (the unversioned `tool_id` now resolves to it) and after the
/// call's own version was removed. Before, both retries were refused as
/// "a different call" or as an unknown version, and the result was out of
/// the client's reach.
#[tokio::test]
async fn a_retry_reaches_its_call_after_the_toolset_versions_change() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = Ferry::start(FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::default()
    })
    .await;
    let api = ferry.api();
    let done = answered_call(&ferry, &tool, "t.op", "c1", "one").await;
    assert_eq!(done["value"], "one", "{done}");

    let register = json!({"url": tool.url, "version": "2.0.0"});
    assert_eq!(api.post("/v1/toolsets", &register).await.0, 201);
    let again = oxp_call(&ferry.url, "t.op", json!({"text": "x"}), "c1").await;
    assert_eq!(again["value"], "one", "{again}");
    let pinned = oxp_call(&ferry.url, "t.op@1", json!({"text": "x"}), "c1").await;
    assert_eq!(pinned["value"], "one", "{pinned}");
    assert_eq!(tool.invocations().len(), 1, "no second invocation");

    let done = answered_call(&ferry, &tool, "t.op@2", "c2", "two").await;
    assert_eq!(done["value"], "two", "{done}");
    let (status, removed) = api.delete("/v1/toolsets/t?version=2").await;
    assert_eq!(status, 200, "{removed}");
    let again = oxp_call(&ferry.url, "t.op@2.0.0", json!({"text": "x"}), "c2").await;
    assert_eq!(again["value"], "two", "{again}");
    // Another version or another input under the call_id is still a
    // different call; a tool that is not served is still unknown.
    let conflict = "This call_id was already used for a different call";
    for (tool_id, input, message) in [
        ("t.op@1", json!({"text": "x"}), conflict),
        ("t.op@2", json!({"text": "y"}), conflict),
        (
            "t.other",
            json!({"text": "x"}),
            "Tool 't.other' was not found",
        ),
    ] {
        let refused = oxp_call(&ferry.url, tool_id, input, "c2").await;
        assert_eq!(refused["status"], 400, "{tool_id}: {refused}");
        assert_eq!(refused["body"]["message"], message, "{tool_id}: {refused}");
    }
    let unknown = oxp_call(&ferry.url, "t.op@2", json!({"text": "x"}), "c3").await;
    assert_eq!(unknown["status"], 400, "{unknown}");
    assert!(
        unknown.to_string().contains("has no version 2.0.0"),
        "{unknown}"
    );
    assert_eq!(tool.invocations().len(), 2, "no third invocation");
}

#[tokio::test]
async fn a_gated_call_waits_and_its_call_id_attaches_to_the_same_call() {
    let ferry = Ferry::start(FerryOptions::demo_with(&["--oxp-wait-secs", "1"])).await;
    let api = ferry.api();
    let args = ["--call-id", "drop-1", "--user-id", "ops"];
    let input = json!({"table": "users"});

    // The reviewer has not decided within the wait: retry later.
    let waiting = call(&ferry, "demo.drop_table", input.clone(), &args).await;
    let result = &waiting["response"]["result"];
    assert_eq!(result["success"], false, "{waiting}");
    assert_eq!(result["error"]["can_retry"], true);
    // Where a developer decides it: the real thread and call, not a
    // placeholder.
    let developer = result["error"]["developer_message"].as_str().unwrap();
    assert!(
        developer.contains("POST /v1/approvals/oxp-user-ops/drop-1"),
        "{developer}"
    );
    let (_, view) = api.call("oxp-user-ops", "drop-1").await;
    assert_eq!(view["status"], "pending_approval", "{view}");

    // The same call_id with another input is refused, changing nothing.
    let conflict = call(&ferry, "demo.drop_table", json!({"table": "other"}), &args).await;
    server_error(&conflict, 400);

    let (status, decided) = api
        .post(
            &format!("/v1/approvals/{}/{}", seg("oxp-user-ops"), seg("drop-1")),
            &json!({"optionId": "allow_once", "reviewer": "ana"}),
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    api.wait_for("oxp-user-ops", "drop-1", "tool_result").await;

    // The retry attaches to the same durable call: its result, no second
    // dispatch.
    let done = call(&ferry, "demo.drop_table", input, &args).await;
    let result = &done["response"]["result"];
    assert_eq!(result["success"], true, "{done}");
    assert!(result["value"].as_str().unwrap().contains("users"));
    assert_eq!(
        api.count("oxp-user-ops", "drop-1", "call_accepted").await,
        1
    );
    let (_, toolsets) = api.get("/v1/toolsets").await;
    let demo = toolsets["toolsets"][0]["url"]
        .as_str()
        .expect("the demo's url");
    let stats: Value = reqwest::get(format!("{demo}/stats"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["by_call"]["oxp-user-ops/drop-1"], 1, "{stats}");
}

const JWT_SECRET: &str = "oxp-test-shared-secret-0123456789";

#[tokio::test]
async fn auth_takes_a_short_lived_jwt_or_an_api_key() {
    let ferry = Ferry::start(FerryOptions::demo_with(&[
        "--oxp-jwt-secret",
        JWT_SECRET,
        "--oxp-jwt-audience",
        "ferry-oxp",
        "--oxp-api-key",
        "key-123",
    ]))
    .await;
    let jwt = |extra: &[&'static str]| {
        let mut args = vec!["--jwt-secret", JWT_SECRET];
        args.extend_from_slice(extra);
        args
    };
    let with = |mut args: Vec<&'static str>, command: &'static str| {
        args.push(command);
        args
    };

    // Health needs no credentials.
    assert_eq!(client(&ferry, &["health"]).await["ok"], true);
    // Missing or wrong credentials: 401.
    let refused = client(&ferry, &["list"]).await;
    server_error(&refused, 401);
    assert_eq!(refused["error"], "AuthenticationError");
    server_error(&client(&ferry, &["--api-key", "wrong", "list"]).await, 401);
    let wrong_secret = ["--jwt-secret", "another-secret-of-enough-length", "list"];
    server_error(&client(&ferry, &wrong_secret).await, 401);

    // Valid: a JWT without aud, with the right aud, with a fractional
    // `exp` (RFC 7519 §2: a NumericDate "can represent non-integer
    // values"), or the API key.
    for args in [
        jwt(&[]),
        jwt(&["--jwt-aud", "ferry-oxp"]),
        jwt(&["--jwt-fractional"]),
    ] {
        let out = client(&ferry, &with(args, "list")).await;
        assert_eq!(out["ok"], true, "{out}");
    }
    assert_eq!(
        client(&ferry, &["--api-key", "key-123", "list"]).await["ok"],
        true
    );

    // Expired, not yet valid, wrong audience, valid for too long: 401, and
    // nothing runs.
    for bad in [
        jwt(&["--jwt-exp-in", "-60"]),
        jwt(&["--jwt-nbf-in", "120"]),
        jwt(&["--jwt-aud", "someone-else"]),
        jwt(&["--jwt-exp-in", "3600"]),
        jwt(&["--jwt-exp-in", "-60", "--jwt-fractional"]),
        jwt(&["--jwt-exp-in", "3600", "--jwt-fractional"]),
    ] {
        let mut args = bad.clone();
        args.extend([
            "call",
            "--tool-id",
            "demo.echo",
            "--input",
            r#"{"text":"x"}"#,
        ]);
        let out = client(&ferry, &args).await;
        let body = server_error(&out, 401);
        assert!(body["developer_message"].is_string(), "{out}");
    }
    assert_eq!(ferry.api().thread("oxp-anonymous").await.0, 404);

    let mut args = jwt(&["--jwt-aud", "ferry-oxp"]);
    args.extend([
        "call",
        "--tool-id",
        "demo.echo",
        "--input",
        r#"{"text":"signed"}"#,
    ]);
    let out = client(&ferry, &args).await;
    assert_eq!(out["response"]["result"]["value"], "signed", "{out}");
}

#[tokio::test]
async fn malformed_requests_are_server_errors_that_change_nothing() {
    let ferry = Ferry::with_demo().await;
    let http = reqwest::Client::new();
    let url = format!("{}/oxp/tools/call", ferry.url);
    let cases = [
        // `request` with a property CallToolRequest does not define.
        json!({"request": {"tool_id": "demo.echo", "input": {}, "extra": 1}}).to_string(),
        // tool_id breaking the ToolId pattern.
        json!({"request": {"tool_id": "demo-echo", "input": {}}}).to_string(),
        json!({"request": {"tool_id": "demo.echo@1.2", "input": {}}}).to_string(),
        // An OXP version this server does not speak.
        json!({"$schema": "urn:oxp:9.9", "request": {"tool_id": "demo.echo"}}).to_string(),
        // No request; not JSON; wrong types.
        json!({"tool_id": "demo.echo"}).to_string(),
        "{not json".to_owned(),
        json!({"request": {"tool_id": "demo.echo", "input": "text"}}).to_string(),
        // Over the body limit (1 MiB by default).
        json!({"request": {"tool_id": "demo.echo", "input": {"text": "x".repeat(2 << 20)}}})
            .to_string(),
    ];
    for body in cases {
        let response = http
            .post(&url)
            .header("content-type", "application/json")
            // Auth is off: the header is ignored.
            .header("authorization", "Bearer whatever")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let short: String = body.chars().take(80).collect();
        assert_eq!(response.status(), 400, "{short}");
        let answer: Value = response.json().await.unwrap();
        assert!(answer["message"].is_string(), "{short}: {answer}");
        assert!(answer["developer_message"].is_string(), "{short}: {answer}");
    }
    // A good call from a web page on another site: a browser sends it
    // without asking first, so it is refused (no credentials configured).
    let good = json!({"request": {"tool_id": "demo.echo", "input": {"text": "hi"}}});
    let response = http
        .post(&url)
        .header("content-type", "text/plain")
        .header("origin", "http://evil.example")
        .body(good.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let answer: Value = response.json().await.unwrap();
    assert!(
        answer["developer_message"]
            .as_str()
            .unwrap()
            .contains("evil.example"),
        "{answer}"
    );
    let (status, threads) = ferry.api().get("/v1/threads").await;
    assert_eq!(status, 200);
    assert_eq!(threads["threads"], json!([]), "nothing was recorded");
}

#[tokio::test]
async fn names_oxp_cannot_write_are_mapped_and_never_merged() {
    use ferry_tests::TestTool;
    // `my-tools` maps to `my_tools_<hash>`, distinct from `my_tools`.
    let dashed = TestTool::start("my-tools", &["run-it"]).await;
    let plain = TestTool::start("my_tools", &["run_it"]).await;
    let ferry = Ferry::start(FerryOptions {
        tool_servers: vec![dashed.url.clone(), plain.url.clone()],
        args: vec!["--oxp-wait-secs".into(), "1".into()],
        ..FerryOptions::default()
    })
    .await;
    let list = client(&ferry, &["list"]).await;
    let ids: Vec<String> = list["response"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&"my_tools.run_it@1.0.0".to_owned()), "{ids:?}");
    let mapped = ids
        .iter()
        .find(|id| id.starts_with("my_tools_"))
        .unwrap_or_else(|| panic!("no mapped id in {ids:?}"))
        .clone();
    // Each id reaches its own toolset's tool.
    call(&ferry, &mapped, json!({"text": "a"}), &[]).await;
    assert_eq!(
        dashed.next_invocation().await.invocation.operation,
        "run-it"
    );
    call(&ferry, "my_tools.run_it", json!({"text": "b"}), &[]).await;
    assert_eq!(plain.next_invocation().await.invocation.operation, "run_it");
    assert!(dashed.invocations().len() == 1 && plain.invocations().len() == 1);
}

/// A thread's grants were given to the identity that created it. The OXP
/// thread of user `ops` was created by an operator, who granted
/// `allow_always` there: a holder of only the OXP API key who claims to be
/// `ops` (`context.user_id`) may not run its gated call, and a JWT's
/// holder calls for its `sub` only, whatever the body claims. Each
/// refusal records nothing.
#[tokio::test]
async fn an_oxp_caller_cannot_borrow_another_users_grant() {
    const OPERATOR_TOKEN: &str = "operator-token-0123456789";
    let ferry = Ferry::start(
        FerryOptions::demo_with(&[
            "--oxp-api-key",
            "key-123",
            "--oxp-jwt-secret",
            JWT_SECRET,
            "--oxp-wait-secs",
            "1",
        ])
        .api_token(OPERATOR_TOKEN),
    )
    .await;
    let operator = ferry_tests::Api::with_token(&ferry.url, OPERATOR_TOKEN);
    let (status, body) = operator
        .submit(
            json!({"operation": "drop_table", "arguments": {"table": "logs"},
                       "group_id": "oxp-user-ops", "id": "first"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = operator
        .post(
            "/v1/approvals/oxp-user-ops/first",
            &json!({"optionId": "allow_always", "reviewer": "ana"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Settled, so that nothing more is recorded there of itself.
    operator
        .wait_for("oxp-user-ops", "first", "tool_result")
        .await;
    let before = operator.events("oxp-user-ops", 0).await.len();

    let input = json!({"table": "users"});
    let key = [
        "--api-key",
        "key-123",
        "--call-id",
        "borrowed",
        "--user-id",
        "ops",
    ];
    let refused = call(&ferry, "demo.drop_table", input.clone(), &key).await;
    let body = server_error(&refused, 400);
    assert!(
        body["developer_message"]
            .as_str()
            .is_some_and(|m| m.contains("belongs to another identity")),
        "{refused}"
    );
    let claims_another = [
        "--jwt-secret",
        JWT_SECRET,
        "--jwt-sub",
        "ana",
        "--user-id",
        "ops",
        "--call-id",
        "claimed",
    ];
    let refused = call(&ferry, "demo.drop_table", input.clone(), &claims_another).await;
    let body = server_error(&refused, 400);
    assert!(
        body["developer_message"]
            .as_str()
            .is_some_and(|m| m.contains("not the user this token was issued to")),
        "{refused}"
    );
    assert_eq!(operator.events("oxp-user-ops", 0).await.len(), before);

    // The JWT's holder calls in its own user's thread, where nothing is
    // granted: the call waits for a reviewer.
    let own = [
        "--jwt-secret",
        JWT_SECRET,
        "--jwt-sub",
        "ana",
        "--call-id",
        "own",
    ];
    let waiting = call(&ferry, "demo.drop_table", input, &own).await;
    assert_eq!(waiting["response"]["result"]["success"], false, "{waiting}");
    let (_, view) = operator.call("oxp-user-ana", "own").await;
    assert_eq!(view["status"], "pending_approval", "{view}");
    let accepted = operator
        .wait_for("oxp-user-ana", "own", "call_accepted")
        .await;
    assert_eq!(accepted["payload"]["identity"], "oxp:ana", "{accepted}");
    assert_eq!(accepted["payload"]["user_id"], "ana", "{accepted}");
}

/// A token bounded to `demo.echo`: the official client's `GET /tools`
/// lists only it, and a call to another tool is an OXP 400 that records
/// nothing.
#[tokio::test]
async fn a_bounded_tokens_tool_list_shows_only_its_tools() {
    let ferry = Ferry::with_demo().await;
    let root = ferry
        .api()
        .make_token(json!({"name": "root", "scopes": ["admin", "read"]}))
        .await;
    let root_api = ferry_tests::Api::with_token(&ferry.url, &root);
    let agent = root_api
        .make_token(json!({"name": "agent", "scopes": ["submit", "read"], "tools": ["demo.echo"]}))
        .await;
    let list = client(&ferry, &["--bearer", &agent, "list"]).await;
    let ids: Vec<&str> = list["response"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(ids, ["demo.echo@1.0.0"], "{list}");
    let refused = call(
        &ferry,
        "demo.drop_table",
        json!({"table": "t"}),
        &["--bearer", &agent, "--call-id", "c-drop"],
    )
    .await;
    server_error(&refused, 400);
    let (_, threads) = root_api.get("/v1/threads").await;
    assert_eq!(
        threads["threads"],
        json!([]),
        "a refused call left a thread"
    );
    let ok = call(
        &ferry,
        "demo.echo",
        json!({"text": "hi"}),
        &["--bearer", &agent],
    )
    .await;
    assert_eq!(ok["response"]["result"]["success"], true, "{ok}");
}
