//! Toolsets (`/v1/toolsets`, `/v1/tools`): registering a RAP tool server by
//! its discovery document, calling its tools by bare, qualified and versioned
//! names, clashes, versions side by side, refresh, delete, refusals of bad
//! documents and bad requests, and durability across a SIGKILL restart.

use std::time::Duration;

use ferry_tests::api::seg;
use ferry_tests::tool::text_schema;
use ferry_tests::{Api, Ferry, FerryOptions, TestTool};
use serde_json::{json, Value};

/// Asserts an answer is the API's error shape with `status` and `code`, and
/// returns its message.
fn refused(answer: &(u16, Value), status: u16, code: &str) -> String {
    let (got, body) = answer;
    assert_eq!(*got, status, "expected {status} {code}, got {got}: {body}");
    assert_eq!(body["error"]["code"], code, "wrong error code: {body}");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("error without a message: {body}"));
    assert!(!message.is_empty(), "empty error message: {body}");
    message.to_owned()
}

/// Submits `operation` with `arguments` as call `id` of thread `group_id`.
async fn call(
    api: &Api,
    group_id: &str,
    id: &str,
    operation: &str,
    arguments: Value,
) -> (u16, Value) {
    api.submit(
        json!({"operation": operation, "arguments": arguments, "group_id": group_id, "id": id}),
    )
    .await
}

/// A manifest for `tool`'s server: toolset `name` with `tools`, each taking
/// the text schema.
fn manifest(tool: &TestTool, name: &str, tools: &[&str]) -> Value {
    let tools: Vec<Value> = tools
        .iter()
        .map(|t| json!({"name": t, "description": format!("{t} of {name}"), "inputSchema": text_schema()}))
        .collect();
    json!({"name": name, "endpoint": format!("{}/invoke", tool.url), "tools": tools})
}

fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|v| {
            v.as_str()
                .map_or_else(|| v["name"].as_str().unwrap().to_owned(), str::to_owned)
        })
        .collect()
}

/// Asserts no toolset is registered and no tool is callable but the built-in.
async fn nothing_registered(api: &Api) {
    let (status, body) = api.get("/v1/toolsets").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["toolsets"],
        json!([]),
        "a toolset was registered: {body}"
    );
    let (status, body) = api.get("/v1/tools").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(names(&body["tools"]), ["cancel_subscription"], "{body}");
}

/// Asserts the thread was never created.
async fn no_thread(api: &Api, group_id: &str) {
    let answer = api.thread(group_id).await;
    refused(&answer, 404, "not_found");
    assert!(api.events(group_id, 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registered_tool_is_listed_and_callable_by_every_name() {
    let tool = TestTool::start("Calc", &["add", "mul"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    nothing_registered(&api).await;

    // rap-3: "the runtime fetches `GET {base}/.well-known/rap-toolset`".
    let (status, reg) = api.register(&tool.url).await;
    assert_eq!(status, 201, "{reg}");
    assert_eq!(reg["name"], "Calc");
    assert_eq!(reg["version"], "1.0.0");
    assert_eq!(reg["url"], tool.url);
    assert_eq!(reg["endpoint"], format!("{}/invoke", tool.url));
    assert_eq!(names(&reg["tools"]), ["add", "mul"]);
    assert_eq!(reg["tools"][0]["qualified"], "Calc.add@1.0.0");
    assert_eq!(reg["tools"][0]["inputSchema"], text_schema());
    assert_eq!(reg["available"], json!(["add", "mul"]));
    assert_eq!(reg["unavailable"], json!([]));

    let (status, list) = api.get("/v1/toolsets").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(names(&list["toolsets"]), ["Calc"]);
    assert_eq!(list["toolsets"][0]["version"], "1.0.0");

    let (status, one) = api.get("/v1/toolsets/Calc").await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["name"], "Calc");
    assert_eq!(one["latest"]["version"], "1.0.0");
    assert_eq!(one["versions"].as_array().unwrap().len(), 1);
    assert_eq!(names(&one["latest"]["tools"]), ["add", "mul"]);

    let (status, tools) = api.get("/v1/tools").await;
    assert_eq!(status, 200, "{tools}");
    assert_eq!(
        names(&tools["tools"]),
        ["cancel_subscription", "add", "mul"]
    );
    let builtin = &tools["tools"][0];
    assert_eq!(builtin["builtin"], true);
    let add = &tools["tools"][1];
    assert_eq!(add["qualified"], "Calc.add@1.0.0");
    assert_eq!(add["toolset"], "Calc");
    assert_eq!(add["bare_name_callable"], true);
    assert_eq!(add["inputSchema"], text_schema());

    for (i, operation) in ["add", "Calc.add", "Calc.add@1", "Calc.add@1.0.0"]
        .iter()
        .enumerate()
    {
        let id = format!("c{i}");
        let (status, reply) = call(&api, "g", &id, operation, json!({"text": operation})).await;
        assert_eq!(status, 202, "{operation}: {reply}");
        let sent = tool.next_invocation().await.invocation;
        assert_eq!(sent.id, id, "{operation}");
        // rap-1: on the wire `operation` is the tool's own name.
        assert_eq!(
            sent.operation, "add",
            "{operation} went out as {:?}",
            sent.operation
        );
        assert_eq!(sent.arguments, json!({"text": operation}));
        let (status, view) = api.call("g", &id).await;
        assert_eq!(status, 200, "{view}");
        assert_eq!(
            view["operation"], *operation,
            "the call keeps the name the agent used"
        );
        assert_eq!(view["tool"], "Calc.add@1.0.0");
    }
    assert_eq!(tool.invocations().len(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_servers_given_on_the_command_line_are_registered_at_start() {
    let tool = TestTool::start("Boot", &["hello"]).await;
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    // Registered before Ferry announced its address: no waiting needed.
    let (status, one) = api.get("/v1/toolsets/Boot").await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["latest"]["url"], tool.url);
    assert_eq!(names(&one["latest"]["tools"]), ["hello"]);
    let (status, reply) = call(&api, "g", "c1", "hello", json!({})).await;
    assert_eq!(status, 202, "{reply}");
    let sent = tool.next_invocation().await.invocation;
    assert_eq!((sent.operation.as_str(), sent.id.as_str()), ("hello", "c1"));
}

/// A tool server that comes up after Ferry (connection refused at start)
/// is registered once it answers, without a restart, and its tools work.
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_server_down_at_start_is_registered_once_it_comes_up() {
    let addr = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().to_string()
    };
    let ferry = Ferry::start(FerryOptions {
        tool_servers: vec![format!("http://{addr}")],
        ..FerryOptions::default()
    })
    .await;
    let api = ferry.api();
    refused(&api.get("/v1/toolsets/Late").await, 404, "not_found");
    refused(
        &call(&api, "g", "c0", "hello", json!({})).await,
        400,
        "unknown_tool",
    );

    let tool = TestTool::start_at(&addr, "Late", &["hello"]).await;
    registered(&api, "Late").await;
    let (status, reply) = call(&api, "g", "c1", "hello", json!({})).await;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(tool.next_invocation().await.invocation.id, "c1");
}

/// Waits (up to 20 s) until toolset `name` is registered.
async fn registered(api: &Api, name: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = api.get(&format!("/v1/toolsets/{name}")).await;
        if status == 200 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} not registered within 20 s: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An invalid discovery document at start is refused once and not fetched
/// again (it will not fix itself); a server answering 503 meanwhile (up,
/// not ready) is asked again and registered once it serves its toolset.
#[tokio::test(flavor = "multi_thread")]
async fn at_start_an_invalid_toolset_is_not_retried_and_an_unready_server_is() {
    let invalid = TestTool::with_manifest(
        json!({"name": "Bad", "tools": [{"name": "x", "description": "no schema"}]}),
    )
    .await;
    let unready = TestTool::start("Ready", &["hello"]).await;
    unready.set_manifest_status(503);
    let ferry = Ferry::start(FerryOptions {
        tool_servers: vec![invalid.url.clone(), unready.url.clone()],
        ..FerryOptions::default()
    })
    .await;
    let api = ferry.api();
    // Retries start about a second apart (0.5–1.5 s, jittered) and grow by
    // half each time: three retries of the unready server take at least
    // 0.5 + 0.75 + 1.125 s, past the latest a first retry of the invalid
    // document could have come.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while unready.manifest_fetches() < 4 {
        assert!(tokio::time::Instant::now() < deadline, "not asked again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    refused(&api.get("/v1/toolsets/Ready").await, 404, "not_found");
    assert_eq!(
        invalid.manifest_fetches(),
        1,
        "an invalid document was fetched again"
    );
    unready.set_manifest_status(200);
    registered(&api, "Ready").await;
    refused(&api.get("/v1/toolsets/Bad").await, 404, "not_found");
}

/// Serves `manifest` (toolset `Bad`, which also lists a valid tool `ok`),
/// and asserts registering it is refused 422 `invalid_toolset` and leaves
/// nothing registered. Returns the error message.
async fn invalid_document_registers_nothing(manifest: Value) -> String {
    let tool = TestTool::with_manifest(manifest).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    let answer = api.register(&tool.url).await;
    let message = refused(&answer, 422, "invalid_toolset");
    // rap-3: "Validation is all-or-nothing: an invalid toolset makes none
    // of its tools available."
    refused(&api.get("/v1/toolsets/Bad").await, 404, "not_found");
    nothing_registered(&api).await;
    for operation in ["ok", "Bad.ok", "Bad.ok@1"] {
        let answer = call(&api, "g", "c1", operation, json!({})).await;
        refused(&answer, 400, "unknown_tool");
    }
    no_thread(&api, "g").await;
    assert!(tool.invocations().is_empty());
    message
}

fn ok_tool() -> Value {
    json!({"name": "ok", "description": "a valid tool", "inputSchema": text_schema()})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_without_an_input_schema_invalidates_the_toolset() {
    // rap-3: "Each tool: `name` ..., `description`, `inputSchema` (a JSON
    // Schema object ...)".
    let message = invalid_document_registers_nothing(json!({
        "name": "Bad",
        "tools": [ok_tool(), {"name": "schemaless", "description": "no inputSchema"}]
    }))
    .await;
    assert!(message.contains("inputSchema"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_tool_name_invalidates_the_toolset() {
    // rap-3: tool `name` is "1–128 chars; letters, digits, `_`, `-`".
    let message = invalid_document_registers_nothing(json!({
        "name": "Bad",
        "tools": [ok_tool(), {"name": "bad name!", "description": "d", "inputSchema": text_schema()}]
    }))
    .await;
    assert!(message.contains("bad name!"), "{message}");
}

/// A toolset named `.` or `..` could never be read, refreshed or deleted:
/// URL normalisation removes such a path segment, even percent-encoded
/// (once registered, every request to it would get 404).
#[tokio::test(flavor = "multi_thread")]
async fn a_toolset_name_no_url_can_address_is_refused() {
    for name in [".", ".."] {
        let tool = TestTool::with_manifest(json!({"name": name, "tools": [ok_tool()]})).await;
        let ferry = Ferry::start(FerryOptions::default()).await;
        let api = ferry.api();
        let message = refused(&api.register(&tool.url).await, 422, "invalid_toolset");
        assert!(message.contains("cannot be addressed"), "{name}: {message}");
        nothing_registered(&api).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_tool_list_is_refused() {
    // rap-3: "`tools` (≥1)".
    let tool = TestTool::with_manifest(json!({"name": "Bad", "tools": []})).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    refused(&api.register(&tool.url).await, 422, "invalid_toolset");
    refused(&api.get("/v1/toolsets/Bad").await, 404, "not_found");
    nothing_registered(&api).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_non_object_input_schema_invalidates_the_toolset() {
    // rap-3: "`inputSchema` (a JSON Schema object ...)".
    let message = invalid_document_registers_nothing(json!({
        "name": "Bad",
        "tools": [ok_tool(), {"name": "stringly", "description": "d", "inputSchema": "object"}]
    }))
    .await;
    assert!(message.contains("stringly"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_schema_whose_type_is_not_object_invalidates_the_toolset() {
    // rap-1: `arguments` is an object, so a tool whose schema admits no
    // object could never be called.
    for schema in [
        json!({"type": "string"}),
        json!({"type": ["array", "null"]}),
    ] {
        let message = invalid_document_registers_nothing(json!({
            "name": "Bad",
            "tools": [ok_tool(), {"name": "scalar", "description": "d", "inputSchema": schema}]
        }))
        .await;
        assert!(
            message.contains("scalar") && message.contains("object"),
            "{message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endpoint_that_is_not_a_url_invalidates_the_toolset() {
    // rap-3: "`endpoint` (required, a valid URL; invocations go there)".
    let message = invalid_document_registers_nothing(json!({
        "name": "Bad",
        "endpoint": "not a url",
        "tools": [ok_tool()]
    }))
    .await;
    assert!(message.contains("endpoint"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_annotation_outside_rap_and_its_x_namespace_invalidates_the_toolset() {
    // rap-3: "Annotations: `requiresAuth` (string), `readOnly`,
    // `destructive` ..., `idempotent`, `longRunning` (all booleans); custom
    // keys namespaced `x-…`."
    let message = invalid_document_registers_nothing(json!({
        "name": "Bad",
        "tools": [ok_tool(), {
            "name": "odd", "description": "d", "inputSchema": text_schema(),
            "annotations": {"readOnly": true, "x-team": "search", "read_only": true}
        }]
    }))
    .await;
    assert!(
        message.contains("odd")
            && message.contains("\"read_only\"")
            && !message.contains("\"x-team\""),
        "{message}"
    );

    // Standard and `x-` keys alone are fine, and kept.
    let tool = TestTool::with_manifest(json!({
        "name": "Fine",
        "tools": [{
            "name": "ok", "description": "d", "inputSchema": text_schema(),
            "annotations": {"readOnly": true, "x-team": "search"}
        }]
    }))
    .await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    let (status, reg) = api.register(&tool.url).await;
    assert_eq!(status, 201, "{reg}");
    assert_eq!(reg["tools"][0]["annotations"]["x-team"], "search", "{reg}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clashing_tool_name_is_callable_only_when_qualified() {
    let alpha = TestTool::start("Alpha", &["search", "alpha_only"]).await;
    let beta = TestTool::start("Beta", &["search"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();

    let (status, first) = api.register(&alpha.url).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["available"], json!(["search", "alpha_only"]));

    // rap-3: "Tool names MUST be unique across loaded toolsets; on a clash
    // the runtime reports an error and makes neither tool available."
    let (status, second) = api.register(&beta.url).await;
    assert_eq!(status, 201, "{second}");
    assert_eq!(second["available"], json!([]), "{second}");
    let unavailable = second["unavailable"].as_array().unwrap();
    assert_eq!(unavailable.len(), 1, "{second}");
    assert_eq!(unavailable[0]["tool"], "search");
    let reason = unavailable[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("Alpha") && reason.contains("Beta"),
        "{reason}"
    );

    // Alpha's view now reports the clash too; its other tool is unaffected.
    let (_, alpha_view) = api.get("/v1/toolsets/Alpha").await;
    assert_eq!(
        alpha_view["latest"]["available"],
        json!(["alpha_only"]),
        "{alpha_view}"
    );
    assert_eq!(alpha_view["latest"]["unavailable"][0]["tool"], "search");
    let (_, tools) = api.get("/v1/tools").await;
    for tool in tools["tools"].as_array().unwrap() {
        if tool["name"] == "search" {
            assert_eq!(tool["bare_name_callable"], false, "{tool}");
        }
    }

    let answer = call(&api, "g", "c1", "search", json!({})).await;
    let message = refused(&answer, 400, "ambiguous_tool");
    assert!(
        message.contains("Alpha") && message.contains("Beta"),
        "{message}"
    );
    refused(&api.call("g", "c1").await, 404, "not_found");
    no_thread(&api, "g").await;

    let (status, reply) = call(&api, "g", "c2", "Alpha.search", json!({})).await;
    assert_eq!(status, 202, "{reply}");
    let sent = alpha.next_invocation().await.invocation;
    assert_eq!(
        (sent.operation.as_str(), sent.id.as_str()),
        ("search", "c2")
    );
    let (status, reply) = call(&api, "g", "c3", "Beta.search@1", json!({})).await;
    assert_eq!(status, 202, "{reply}");
    let sent = beta.next_invocation().await.invocation;
    assert_eq!(
        (sent.operation.as_str(), sent.id.as_str()),
        ("search", "c3")
    );
    let (status, reply) = call(&api, "g", "c4", "alpha_only", json!({})).await;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(alpha.next_invocation().await.invocation.id, "c4");
    // The refused bare call never reached either tool.
    assert!(alpha.invocations().iter().all(|i| i.id != "c1"));
    assert!(beta.invocations().iter().all(|i| i.id != "c1"));
}

#[tokio::test(flavor = "multi_thread")]
async fn versions_of_a_toolset_live_side_by_side() {
    let tool = TestTool::start("Svc", &["old"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    let (status, v1) = api
        .post(
            "/v1/toolsets",
            &json!({"url": tool.url, "version": "1.0.0"}),
        )
        .await;
    assert_eq!(status, 201, "{v1}");
    assert_eq!(v1["version"], "1.0.0");

    // Version 2 adds `new` and makes `old` require `text`.
    let mut v2_manifest = manifest(&tool, "Svc", &["old", "new"]);
    v2_manifest["tools"][0]["inputSchema"]["required"] = json!(["text"]);
    tool.set_manifest(v2_manifest);
    let (status, v2) = api
        .post(
            "/v1/toolsets",
            &json!({"url": tool.url, "version": "2.0.0"}),
        )
        .await;
    assert_eq!(status, 201, "{v2}");
    assert_eq!(v2["version"], "2.0.0");
    assert_eq!(names(&v2["tools"]), ["old", "new"]);
    assert_eq!(v2["tools"][1]["qualified"], "Svc.new@2.0.0");
    assert_eq!(v2["available"], json!(["old", "new"]));

    let (status, both) = api.get("/v1/toolsets/Svc").await;
    assert_eq!(status, 200, "{both}");
    let versions: Vec<&str> = both["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["1.0.0", "2.0.0"]);
    assert_eq!(both["latest"]["version"], "2.0.0");
    assert_eq!(
        names(&both["versions"][0]["tools"]),
        ["old"],
        "1.0.0 keeps its tools"
    );

    // `@1` is 1.0.0's tool set: its `old` does not require `text`.
    let (status, reply) = call(&api, "g", "v1", "Svc.old@1", json!({})).await;
    assert_eq!(status, 202, "{reply}");
    let sent = tool.next_invocation().await.invocation;
    assert_eq!((sent.operation.as_str(), sent.id.as_str()), ("old", "v1"));
    assert_eq!(api.call("g", "v1").await.1["tool"], "Svc.old@1.0.0");

    // Bare and unversioned names go to the latest, 2.0.0.
    let answer = call(&api, "g", "bare-bad", "old", json!({})).await;
    refused(&answer, 422, "invalid_arguments");
    for (id, operation) in [
        ("bare", "old"),
        ("unversioned", "Svc.old"),
        ("v2", "Svc.old@2"),
    ] {
        let (status, reply) = call(&api, "g", id, operation, json!({"text": "x"})).await;
        assert_eq!(status, 202, "{operation}: {reply}");
        let sent = tool.next_invocation().await.invocation;
        assert_eq!((sent.operation.as_str(), sent.id.as_str()), ("old", id));
        assert_eq!(
            api.call("g", id).await.1["tool"],
            "Svc.old@2.0.0",
            "{operation}"
        );
    }
    let (status, reply) = call(&api, "g", "new", "new", json!({})).await;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(tool.next_invocation().await.invocation.operation, "new");
    assert_eq!(api.call("g", "new").await.1["tool"], "Svc.new@2.0.0");

    // 1.0.0 never had `new`.
    let answer = call(&api, "g", "new-v1", "Svc.new@1", json!({})).await;
    refused(&answer, 400, "unknown_tool");
    refused(&api.call("g", "new-v1").await, 404, "not_found");
    refused(&api.call("g", "bare-bad").await, 404, "not_found");
    let ids: Vec<String> = tool.invocations().into_iter().map(|i| i.id).collect();
    assert_eq!(ids, ["v1", "bare", "unversioned", "v2", "new"]);
}

/// A pre-release registered beside a release is tried by name
/// (`@2.0.0-beta.1`), and does not take the calls that name no version;
/// alone, it is the latest there is.
#[tokio::test(flavor = "multi_thread")]
async fn a_pre_release_is_not_the_latest_while_a_release_is_registered() {
    let tool = TestTool::start("Svc", &["op"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    let register = |version: &'static str| {
        let api = api.clone();
        let url = tool.url.clone();
        async move {
            let (status, body) = api
                .post("/v1/toolsets", &json!({"url": url, "version": version}))
                .await;
            assert_eq!(status, 201, "{body}");
            body
        }
    };
    let beta = register("2.0.0-beta.1").await;
    assert_eq!(beta["available"], json!(["op"]), "alone, it is the latest");
    let (_, shown) = api.get("/v1/toolsets/Svc").await;
    assert_eq!(shown["latest"]["version"], "2.0.0-beta.1");

    let release = register("1.4.0").await;
    assert_eq!(release["available"], json!(["op"]));
    let (_, shown) = api.get("/v1/toolsets/Svc").await;
    assert_eq!(shown["latest"]["version"], "1.4.0");
    assert_eq!(shown["versions"][1]["unavailable"][0]["tool"], "op");
    for (id, operation, pinned) in [
        ("bare", "op", "Svc.op@1.4.0"),
        ("unversioned", "Svc.op", "Svc.op@1.4.0"),
        ("beta", "Svc.op@2.0.0-beta.1", "Svc.op@2.0.0-beta.1"),
    ] {
        let (status, reply) = call(&api, "g", id, operation, json!({})).await;
        assert_eq!(status, 202, "{operation}: {reply}");
        assert_eq!(api.call("g", id).await.1["tool"], pinned, "{operation}");
    }
    // The tool list says which version a bare name reaches.
    let (status, tools) = api.get("/v1/tools").await;
    assert_eq!(status, 200);
    let bare: Vec<_> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["toolset"] == "Svc")
        .map(|t| {
            (
                t["version"].as_str().unwrap(),
                t["bare_name_callable"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(bare, [("1.4.0", true), ("2.0.0-beta.1", false)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn refresh_picks_up_a_changed_manifest() {
    let tool = TestTool::start("Live", &["one"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    assert_eq!(api.register(&tool.url).await.0, 201);
    refused(
        &call(&api, "g", "c1", "two", json!({})).await,
        400,
        "unknown_tool",
    );

    tool.set_manifest(manifest(&tool, "Live", &["one", "two"]));
    // Nothing changes until the refresh.
    refused(
        &call(&api, "g", "c1", "two", json!({})).await,
        400,
        "unknown_tool",
    );
    let (status, refreshed) = api.post("/v1/toolsets/Live/refresh", &json!({})).await;
    assert_eq!(status, 200, "{refreshed}");
    assert_eq!(refreshed["version"], "1.0.0");
    assert_eq!(names(&refreshed["tools"]), ["one", "two"]);
    assert_eq!(refreshed["available"], json!(["one", "two"]));
    let (_, one) = api.get("/v1/toolsets/Live").await;
    assert_eq!(
        one["versions"].as_array().unwrap().len(),
        1,
        "refresh replaces, not adds: {one}"
    );

    let (status, reply) = call(&api, "g", "c2", "two", json!({"text": "hi"})).await;
    assert_eq!(status, 202, "{reply}");
    let sent = tool.next_invocation().await.invocation;
    assert_eq!((sent.operation.as_str(), sent.id.as_str()), ("two", "c2"));

    // A refresh that finds an invalid document, or no server, changes
    // nothing: the registered tools stay callable.
    let mut broken = manifest(&tool, "Live", &["one", "two", "three"]);
    broken["tools"][2] = json!({"name": "three", "description": "no inputSchema"});
    tool.set_manifest(broken);
    let answer = api.post("/v1/toolsets/Live/refresh", &json!({})).await;
    refused(&answer, 422, "invalid_toolset");
    tool.stop();
    // A keep-alive connection may outlive the stop for a moment; poll until
    // the server is really gone (each refresh in between is refused too).
    let answer = ferry_tests::eventually(
        "the tool server to stop",
        Duration::from_secs(10),
        || async {
            let answer = api.post("/v1/toolsets/Live/refresh", &json!({})).await;
            (answer.0 != 422).then_some(answer)
        },
    )
    .await;
    refused(&answer, 502, "toolset_unreachable");
    let (status, one) = api.get("/v1/toolsets/Live").await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(names(&one["latest"]["tools"]), ["one", "two"]);
    refused(
        &call(&api, "g", "c3", "three", json!({})).await,
        400,
        "unknown_tool",
    );

    let answer = api.post("/v1/toolsets/Nope/refresh", &json!({})).await;
    refused(&answer, 404, "not_found");
    refused(&api.get("/v1/toolsets/Nope").await, 404, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_toolset_is_gone() {
    let tool = TestTool::start("Gone", &["op"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    assert_eq!(api.register(&tool.url).await.0, 201);
    let (status, reply) = call(&api, "g", "before", "op", json!({})).await;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(tool.next_invocation().await.invocation.id, "before");

    let (status, removed) = api.delete("/v1/toolsets/Gone").await;
    assert_eq!(status, 200, "{removed}");
    assert_eq!(removed, json!({"name": "Gone", "removed_versions": 1}));
    refused(&api.get("/v1/toolsets/Gone").await, 404, "not_found");
    nothing_registered(&api).await;
    for (id, operation) in [("a", "op"), ("b", "Gone.op"), ("c", "Gone.op@1")] {
        refused(
            &call(&api, "g", id, operation, json!({})).await,
            400,
            "unknown_tool",
        );
        refused(&api.call("g", id).await, 404, "not_found");
    }
    let events = api.events("g", 0).await;
    assert!(events.iter().all(|e| e["id"] == "before"), "{events:?}");

    refused(&api.delete("/v1/toolsets/Gone").await, 404, "not_found");
    refused(&api.delete("/v1/toolsets/Never").await, 404, "not_found");
    assert_eq!(tool.invocations().len(), 1);
}

/// Invariant 2 ("a retried submission with the same `(group_id, id)`
/// returns the existing call") holds after the call's tool stopped
/// resolving or its schema stopped matching: its bare name now clashes, or
/// its toolset was deleted. A different body is still 409 (issue 2), and a
/// new id is refused as before. Before, each retry here was a 400 or 422.
#[tokio::test(flavor = "multi_thread")]
async fn a_retry_is_answered_by_its_call_after_the_toolsets_changed() {
    let tool = TestTool::start("Kept", &["op"]).await;
    let rival = TestTool::start("Rival", &["op"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    assert_eq!(api.register(&tool.url).await.0, 201);
    let hi = json!({"text": "hi"});
    let mut accepted = vec![];
    for (id, operation) in [("bare", "op"), ("qualified", "Kept.op")] {
        let (status, reply) = call(&api, "g", id, operation, hi.clone()).await;
        assert_eq!(status, 202, "{reply}");
        assert_eq!(tool.next_invocation().await.invocation.id, id);
        accepted.push(reply);
    }
    // Retries of both calls, each as first submitted and with another body.
    let retried = |id: &'static str, operation: &'static str, seq: &Value| {
        let (api, hi, seq) = (&api, hi.clone(), seq.clone());
        async move {
            let (status, again) = call(api, "g", id, operation, hi).await;
            assert_eq!(status, 200, "{id}: {again}");
            assert_eq!((&again["id"], &again["seq"]), (&json!(id), &seq));
            let other = call(api, "g", id, operation, json!({"text": 5})).await;
            refused(&other, 409, "conflict");
        }
    };

    assert_eq!(api.register(&rival.url).await.0, 201);
    refused(
        &call(&api, "g", "new1", "op", hi.clone()).await,
        400,
        "ambiguous_tool",
    );
    retried("bare", "op", &accepted[0]["seq"]).await;

    assert_eq!(api.delete("/v1/toolsets/Kept").await.0, 200);
    refused(
        &call(&api, "g", "new2", "Kept.op", hi.clone()).await,
        400,
        "unknown_tool",
    );
    retried("qualified", "Kept.op", &accepted[1]["seq"]).await;
    // A body the remaining tool's schema refuses, for a call already here:
    // 409 for the other body, not 422.
    let (status, _) = call(&api, "g", "rival", "Rival.op", hi.clone()).await;
    assert_eq!(status, 202);
    let other = call(&api, "g", "rival", "Rival.op", json!({"text": 5})).await;
    refused(&other, 409, "conflict");
    let invalid = call(&api, "g", "new3", "Rival.op", json!({"text": 5})).await;
    refused(&invalid, 422, "invalid_arguments");

    // Nothing recorded for the refusals and the retries: one acceptance
    // per call, and no event of another call.
    let events = api.events("g", 0).await;
    for id in ["bare", "qualified", "rival"] {
        assert_eq!(api.count("g", id, "call_accepted").await, 1, "{id}");
    }
    let ids = ["bare", "qualified", "rival"].map(|id| json!(id));
    assert!(events.iter().all(|e| ids.contains(&e["id"])), "{events:?}");
    assert_eq!(tool.invocations().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_tool_server_is_a_bad_gateway() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    let answer = api.register(&format!("http://127.0.0.1:{port}")).await;
    refused(&answer, 502, "toolset_unreachable");
    nothing_registered(&api).await;
}

/// A user name and password in a tool server's URL reach it as Basic auth,
/// and are shown to nobody: the API and its errors give them as `***`.
#[tokio::test(flavor = "multi_thread")]
async fn credentials_in_a_server_url_are_kept_and_never_shown() {
    let tool = TestTool::start("Fine", &["op"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    let with_password = tool.url.replacen("http://", "http://agent:hunter2@", 1);
    let (status, reg) = api.register(&with_password).await;
    assert_eq!(status, 201, "{reg}");
    let shown = tool.url.replacen("http://", "http://***@", 1);
    assert_eq!(reg["url"], shown.trim_end_matches('/'), "{reg}");
    for path in ["/v1/toolsets", "/v1/toolsets/Fine"] {
        let (_, listed) = api.get(path).await;
        assert!(!listed.to_string().contains("hunter2"), "{listed}");
    }
    let (status, refreshed) = api.post("/v1/toolsets/Fine/refresh", &json!({})).await;
    assert_eq!(status, 200, "{refreshed}");
    assert!(!refreshed.to_string().contains("hunter2"), "{refreshed}");
}

/// The credentials of a tool server's URL go with everything sent to it
/// (the invocation, `/cancel_tool_call`, `/close_thread`) and appear in
/// nothing a reader of the thread sees: its events, its stream, the
/// dashboard's reads, the ACP stream, `ferry replay`, nor the log.
#[tokio::test(flavor = "multi_thread")]
async fn credentials_reach_the_tool_and_no_reader_of_the_thread() {
    let tool = TestTool::start("Fine", &["op"]).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ferry.log");
    let ferry = Ferry::start(FerryOptions {
        log: Some(log.clone()),
        ..FerryOptions::default()
    })
    .await;
    let api = ferry.api();
    let with_password = tool.url.replacen("http://", "http://agent:hunter2@", 1);
    let (status, reg) = api.register(&with_password).await;
    assert_eq!(status, 201, "{reg}");

    let (status, reply) = call(&api, "g", "c1", "op", json!({"text": "hi"})).await;
    assert_eq!(status, 202, "{reply}");
    let invoked = tool.next_invocation().await.invocation;
    let body = json!({"type": "tool_result", "group_id": "g", "id": "c1", "text": "done"});
    let (status, answer) = api.post(&invoked.callback_url, &body).await;
    assert_eq!(status, 200, "{answer}");
    let (status, reply) = call(&api, "g", "c2", "op", json!({"text": "again"})).await;
    assert_eq!(status, 202, "{reply}");
    tool.next_invocation().await;
    api.wait_for("g", "c2", "call_dispatched").await;
    let (status, cancelled) = api.delete("/v1/threads/g/calls/c2").await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(tool.next_notice().await.0, "cancel_tool_call");
    let (status, closed) = api.post("/v1/threads/g/close", &json!({})).await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(tool.next_notice().await.0, "close_thread");

    use base64::Engine as _;
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("agent:hunter2")
    );
    for route in ["manifest", "invoke", "cancel_tool_call", "close_thread"] {
        let heard: Vec<_> = (tool.authorizations().into_iter())
            .filter(|(r, _)| r == route)
            .collect();
        assert!(!heard.is_empty(), "no {route} request");
        for (_, authorization) in heard {
            assert_eq!(authorization.as_deref(), Some(basic.as_str()), "{route}");
        }
    }

    let events = api.events("g", 0).await;
    assert!(
        events.iter().any(|e| e["type"] == "thread_closed"),
        "{events:?}"
    );
    let accepted = &events[0];
    assert_eq!(
        accepted["payload"]["target"]["base_url"],
        tool.url.as_str(),
        "{accepted}"
    );
    let mut seen = vec![Value::Array(events.clone())];
    for path in [
        "/v1/threads?limit=50",
        "/v1/threads/g",
        "/v1/threads/g/calls",
        "/v1/threads/g/calls/c1",
        "/v1/approvals?status=pending",
    ] {
        let (status, read) = api.get(path).await;
        assert_eq!(status, 200, "{path}: {read}");
        seen.push(read);
    }
    let mut stream = ferry_tests::sse::SseReader::open(&api, "/v1/threads/g/stream", None).await;
    for _ in &events {
        seen.push(stream.next().await.data);
    }
    for seen in seen {
        assert!(!seen.to_string().contains("hunter2"), "{seen}");
    }
    let acp = api.client.get(format!("{}/v1/threads/g/acp", api.base));
    let mut acp = acp.send().await.unwrap();
    assert_eq!(acp.status(), 200);
    let mut frames = String::new();
    while let Ok(Ok(Some(chunk))) =
        tokio::time::timeout(Duration::from_millis(500), acp.chunk()).await
    {
        frames.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(frames.contains("data:"), "{frames}");
    assert!(!frames.contains("hunter2"), "{frames}");
    let replay = ferry_tests::ferry::cli(&ferry.url, &["replay", "g"])
        .output()
        .await
        .unwrap();
    assert!(replay.status.success(), "{replay:?}");
    let replayed = String::from_utf8_lossy(&replay.stdout);
    assert!(replayed.contains("tool_result"), "{replayed}");
    assert!(!replayed.contains("hunter2"), "{replayed}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("call accepted"), "{logged}");
    assert!(!logged.contains("hunter2"), "{logged}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_registration_requests_are_refused_and_change_nothing() {
    let tool = TestTool::start("Fine", &["op"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();

    refused(&api.register("not a url").await, 400, "invalid_request");
    refused(
        &api.register("ftp://127.0.0.1/").await,
        400,
        "invalid_request",
    );
    // rap-3: Ferry fetches `GET {base}/.well-known/rap-toolset`; a query or
    // a fragment would swallow that path, so the server's URL is refused
    // rather than fetched wrongly (it used to end in a misleading 502).
    for suffix in ["?x=1", "#top"] {
        let message = refused(
            &api.register(&format!("{}{suffix}", tool.url)).await,
            400,
            "invalid_request",
        );
        assert!(message.contains("query or a fragment"), "{message}");
    }
    // Credentials in a server's URL reach it as Basic auth, but are
    // shown to nobody, not even in a refusal.
    let with_password = format!(
        "{}?x=1",
        tool.url.replacen("http://", "http://agent:hunter2@", 1)
    );
    let message = refused(&api.register(&with_password).await, 400, "invalid_request");
    assert!(!message.contains("hunter2"), "{message}");
    let unreachable = "http://agent:hunter2@127.0.0.1:9/";
    let message = refused(&api.register(unreachable).await, 502, "toolset_unreachable");
    assert!(
        message.contains("***@127.0.0.1:9") && !message.contains("hunter2"),
        "{message}"
    );
    // How the fetch failed, in words of its own, not the client's.
    assert!(message.ends_with(": connection refused"), "{message}");
    let answer = api.post_raw("/v1/toolsets", br#"{"url": "#.to_vec()).await;
    refused(&answer, 400, "invalid_json");
    // The URL is fine: only the unknown field is wrong.
    let answer = api
        .post("/v1/toolsets", &json!({"url": tool.url, "colour": "red"}))
        .await;
    refused(&answer, 400, "invalid_request");
    refused(
        &api.post("/v1/toolsets", &json!({})).await,
        400,
        "invalid_request",
    );
    refused(
        &api.post("/v1/toolsets", &json!({"url": 7})).await,
        400,
        "invalid_request",
    );
    let answer = api
        .post("/v1/toolsets", &json!({"url": tool.url, "version": "one"}))
        .await;
    refused(&answer, 400, "invalid_request");
    // Semver: build metadata "MUST be ignored when determining version
    // precedence", so `1.0.0+b` would be `1.0.0` registered twice.
    let answer = api
        .post(
            "/v1/toolsets",
            &json!({"url": tool.url, "version": "1.0.0+build.5"}),
        )
        .await;
    let message = refused(&answer, 400, "invalid_request");
    assert!(message.contains("register it as 1.0.0"), "{message}");
    nothing_registered(&api).await;
    refused(&api.get("/v1/toolsets/Fine").await, 404, "not_found");

    // The same server registers once the request is well formed.
    let (status, reg) = api.register(&tool.url).await;
    assert_eq!(status, 201, "{reg}");
    assert_eq!(reg["name"], "Fine");
    // `?version=` reads as an operation's `@version` does: `1` is 1.0.0.
    let (status, one) = api.get("/v1/toolsets/Fine?version=1").await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["versions"].as_array().map(Vec::len), Some(1), "{one}");
    refused(
        &api.get("/v1/toolsets/Fine?version=2").await,
        404,
        "not_found",
    );
    refused(
        &api.get("/v1/toolsets/Fine?version=x").await,
        400,
        "invalid_request",
    );
    refused(
        &api.delete("/v1/toolsets/Fine?version=one").await,
        400,
        "invalid_request",
    );
    let (status, removed) = api.delete("/v1/toolsets/Fine?version=1").await;
    assert_eq!(status, 200, "{removed}");
    assert_eq!(removed["removed_versions"], 1, "{removed}");
    refused(&api.get("/v1/toolsets/Fine").await, 404, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn toolsets_survive_a_restart() {
    let kept = TestTool::start("Kept", &["keep"]).await;
    let dropped = TestTool::start("Dropped", &["drop"]).await;
    let mut ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    assert_eq!(api.register(&kept.url).await.0, 201);
    let (status, v2) = api
        .post(
            "/v1/toolsets",
            &json!({"url": kept.url, "version": "2.0.0"}),
        )
        .await;
    assert_eq!(status, 201, "{v2}");
    assert_eq!(api.register(&dropped.url).await.0, 201);
    assert_eq!(api.delete("/v1/toolsets/Dropped").await.0, 200);

    ferry.restart().await;
    let api = ferry.api();

    let (status, one) = api.get("/v1/toolsets/Kept").await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["versions"].as_array().unwrap().len(), 2, "{one}");
    refused(
        &api.get(&format!("/v1/toolsets/{}", seg("Dropped"))).await,
        404,
        "not_found",
    );
    refused(
        &call(&api, "g", "d", "drop", json!({})).await,
        400,
        "unknown_tool",
    );

    for (id, operation) in [("c1", "keep"), ("c2", "Kept.keep@1")] {
        let (status, reply) = call(&api, "g", id, operation, json!({"text": "after"})).await;
        assert_eq!(status, 202, "{operation}: {reply}");
        let sent = kept.next_invocation().await.invocation;
        assert_eq!((sent.operation.as_str(), sent.id.as_str()), ("keep", id));
    }
    assert_eq!(api.call("g", "c1").await.1["tool"], "Kept.keep@2.0.0");
    assert_eq!(api.call("g", "c2").await.1["tool"], "Kept.keep@1.0.0");
    assert!(dropped.invocations().is_empty());
}

/// A server on loopback that answers every request with `head` and then
/// `body_bytes` of spaces in 64 KiB chunks (chunked unless `head` gives a
/// length), and then holds the connection open without finishing.
async fn endless_document(head: &'static str, body_bytes: usize, chunked: bool) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = vec![0u8; 8192];
                let _ = socket.read(&mut request).await;
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b' '; 64 << 10];
                let mut sent = 0;
                while sent < body_bytes {
                    let mut frame = Vec::new();
                    if chunked {
                        frame.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    }
                    frame.extend_from_slice(&chunk);
                    if chunked {
                        frame.extend_from_slice(b"\r\n");
                    }
                    if socket.write_all(&frame).await.is_err() {
                        return;
                    }
                    sent += chunk.len();
                }
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
        }
    });
    url
}

/// The discovery document is bounded (4 MiB): one past the bound is
/// refused 422 as soon as its declared length or its bytes show it, not
/// read whole first (that way a 256 MiB document raised Ferry's memory by
/// 514 MiB, and a server still sending 8 MiB ran into the fetch timeout
/// and was reported unreachable, 502).
#[tokio::test(flavor = "multi_thread")]
async fn a_discovery_document_past_the_bound_is_refused_as_it_arrives() {
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    let chunked = endless_document(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
        8 << 20,
        true,
    )
    .await;
    let declared = endless_document(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 8388608\r\n\r\n",
        0,
        false,
    )
    .await;
    for url in [chunked, declared] {
        let message = refused(&api.register(&url).await, 422, "invalid_toolset");
        assert!(message.contains("larger than 4194304 bytes"), "{message}");
    }
    nothing_registered(&api).await;
}

/// A manifest's `endpoint` on another origin than the base URL it was
/// fetched from would send Ferry's invocations (arguments, callback URLs)
/// to a host the operator never named: refused, nothing registered.
#[tokio::test(flavor = "multi_thread")]
async fn an_endpoint_on_another_origin_is_refused() {
    for endpoint in [
        "http://169.254.169.254/latest/meta-data",
        "http://127.0.0.1:1/invoke",
        "https://127.0.0.1/invoke",
    ] {
        let message = invalid_document_registers_nothing(json!({
            "name": "Bad", "endpoint": endpoint, "tools": [ok_tool()]
        }))
        .await;
        assert!(
            message.contains("is not on the tool server's origin"),
            "{endpoint}: {message}"
        );
    }
}

/// A port that answers something other than a RAP manifest is refused
/// without its answer being given back: registering a toolset must not
/// read what internal services say.
#[tokio::test(flavor = "multi_thread")]
async fn what_a_non_manifest_document_says_is_not_echoed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/.well-known/rap-toolset",
        axum::routing::get(|| async { r#"{"internal": "db-password-hunter2"}"# }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    let message = refused(&api.register(&url).await, 422, "invalid_toolset");
    assert!(
        message.contains("is not a RAP toolset manifest"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
    nothing_registered(&api).await;
}
