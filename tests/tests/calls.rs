//! Submitting calls (`POST /v1/calls`): the happy path, idempotent
//! resubmission, and every bad input of the issue, each answered in the
//! API's error shape and leaving no trace.

use std::time::Duration;

use ferry_tests::api::seg;
use ferry_tests::{Ferry, FerryOptions, TestTool};
use serde_json::{json, Value};

async fn ferry_with(tool: &TestTool) -> Ferry {
    Ferry::with_tool(tool).await
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error body: {body}"))
}

/// Asserts the thread was never created: no metadata, no events.
async fn untouched(ferry: &Ferry, group_id: &str) {
    let api = ferry.api();
    let (status, body) = api.thread(group_id).await;
    assert_eq!(status, 404, "thread {group_id:?} exists: {body}");
    assert!(api.events(group_id, 0).await.is_empty());
}

#[tokio::test]
async fn a_call_reaches_the_tool_and_its_result_the_agent() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let (status, reply) = api
        .submit(
            json!({"operation": "echo", "arguments": {"text": "hi"}, "group_id": "g", "id": "c1",
                        "call_id": "prov-1", "user_id": "u", "thread_ancestors": ["root"]}),
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(
        reply,
        json!({"group_id": "g", "id": "c1", "status": "queued", "seq": 1})
    );
    let result = api.wait_for("g", "c1", "tool_result").await;
    assert_eq!(result["payload"]["text"], "hi");
    let (_, call) = api.call("g", "c1").await;
    assert_eq!(call["status"], "completed");
    assert_eq!(call["call_id"], "prov-1");
    assert_eq!(call["attempts"], 1);
    assert_eq!(call["result"]["text"], "hi");
    assert_eq!(call["tool"], "demo.echo@1.0.0");
}

#[tokio::test]
async fn ferry_generates_an_id_when_none_is_given() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = ferry_with(&tool).await;
    let (status, reply) = ferry
        .api()
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g"}))
        .await;
    assert_eq!(status, 202);
    let id = reply["id"].as_str().unwrap();
    assert!(!id.is_empty());
    let sent = tool.next_invocation().await.invocation;
    assert_eq!(sent.id, id);
    assert_eq!(sent.group_id, "g");
    assert!(sent
        .callback_url
        .starts_with(&format!("{}/v1/callbacks/", ferry.url)));
}

#[tokio::test]
async fn the_invocation_carries_the_rap_fields() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = ferry_with(&tool).await;
    let (status, _) = ferry
        .api()
        .submit(json!({"operation": "t.op@1", "arguments": {"text": "x"}, "group_id": "g", "id": "c",
                        "call_id": "cid", "user_id": "user_42", "thread_ancestors": ["root", "parent"]}))
        .await;
    assert_eq!(status, 202);
    let sent = tool.next_invocation().await.invocation;
    // rap-1: operation is the tool's own name; call_id echoed; ancestors root first.
    assert_eq!(sent.operation, "op");
    assert_eq!(sent.arguments, json!({"text": "x"}));
    assert_eq!(sent.call_id.as_deref(), Some("cid"));
    assert_eq!(sent.user_id.as_deref(), Some("user_42"));
    assert_eq!(
        sent.thread_ancestors,
        Some(vec!["root".to_owned(), "parent".to_owned()])
    );
}

/// rap-1: "When the current thread has ancestor threads, the runtime
/// SHOULD include thread_ancestors". The thread records them from its
/// first call that names any; later calls that do not name them (or name
/// others) are sent with the thread's.
#[tokio::test]
async fn later_calls_carry_the_ancestors_the_thread_recorded() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    let call = |id: &str| json!({"operation": "op", "arguments": {}, "group_id": "g", "id": id});
    let mut first = call("first");
    first["thread_ancestors"] = json!(["root", "parent"]);
    let mut other = call("other");
    other["thread_ancestors"] = json!(["elsewhere"]);
    for body in [first, call("plain"), other] {
        assert_eq!(api.submit(body).await.0, 202);
    }
    let expected = Some(vec!["root".to_owned(), "parent".to_owned()]);
    for id in ["first", "plain", "other"] {
        let sent = tool.next_invocation().await.invocation;
        assert_eq!((sent.id.as_str(), &sent.thread_ancestors), (id, &expected));
    }
    // A root thread's calls still name none (RAP omits the field there).
    assert_eq!(
        api.submit(json!({"operation": "op", "arguments": {}, "group_id": "root", "id": "r"}))
            .await
            .0,
        202
    );
    assert_eq!(
        tool.next_invocation().await.invocation.thread_ancestors,
        None
    );
}

#[tokio::test]
async fn the_same_call_twice_dispatches_once_and_a_different_body_conflicts() {
    let tool = TestTool::start("t", &["op"]).await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    let call = json!({"operation": "op", "arguments": {"text": "a"}, "group_id": "g", "id": "c"});
    assert_eq!(api.submit(call.clone()).await.0, 202);
    tool.next_invocation().await;
    let (status, reply) = api.submit(call.clone()).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["seq"], 1);
    let mut changed = call.clone();
    changed["arguments"]["text"] = json!("b");
    let (status, body) = api.submit(changed).await;
    assert_eq!(status, 409);
    assert_eq!(error_code(&body), "conflict");
    // One acceptance, one dispatch: resubmission dispatched nothing new.
    assert_eq!(api.count("g", "c", "call_accepted").await, 1);
    let (_, view) = api.call("g", "c").await;
    assert_eq!(view["arguments"], json!({"text": "a"}));
    api.wait_for("g", "c", "call_dispatched").await;
    assert_eq!(tool.invocations().len(), 1);
}

#[tokio::test]
async fn bad_submissions_are_refused_clearly_and_change_nothing() {
    let tool = TestTool::start("t", &["op"]).await;
    let typed = TestTool::with_manifest(ferry_tests::cases::calc_manifest()).await;
    let ferry = Ferry::start(FerryOptions {
        tool_servers: vec![tool.url.clone(), typed.url.clone()],
        ..FerryOptions::default()
    })
    .await;
    let api = ferry.api();
    for (what, body, status, code) in ferry_tests::cases::bad_submissions() {
        let (got, reply) = api.post_raw("/v1/calls", body).await;
        assert_eq!(got, status, "{what}: {reply}");
        assert_eq!(error_code(&reply), code, "{what}");
        assert!(
            reply["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}"
        );
    }
    // The exact shape of the issue's example.
    let (_, reply) = api
        .submit(json!({"operation": "add", "arguments": {"a": 1, "b": "x"}, "group_id": "bad"}))
        .await;
    assert_eq!(
        reply["error"]["parameter_errors"],
        json!({"b": "must be a number"})
    );
    let (_, reply) = api
        .submit(json!({"operation": "add", "arguments": {"a": 1}, "group_id": "bad"}))
        .await;
    assert_eq!(
        reply["error"]["parameter_errors"],
        json!({"b": "is required"})
    );
    untouched(&ferry, "bad").await;
    // An empty group_id cannot name a thread, so reads refuse it too.
    let (status, body) = api.get("/v1/threads//events").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    assert!(tool.invocations().is_empty() && typed.invocations().is_empty());
    // The limit is 512 bytes: exactly 512 is fine.
    let (status, _) = api
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g".repeat(512)}))
        .await;
    assert_eq!(status, 202);
}

#[tokio::test]
async fn an_ambiguous_bare_name_is_refused_naming_the_toolsets() {
    let a = TestTool::start("alpha", &["search"]).await;
    let b = TestTool::start("beta", &["search"]).await;
    let ferry = Ferry::start(FerryOptions {
        tool_servers: vec![a.url.clone(), b.url.clone()],
        ..FerryOptions::default()
    })
    .await;
    let api = ferry.api();
    let (status, body) = api
        .submit(json!({"operation": "search", "arguments": {}, "group_id": "g"}))
        .await;
    assert_eq!(status, 400);
    assert_eq!(error_code(&body), "ambiguous_tool");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("alpha") && message.contains("beta"),
        "{message}"
    );
    untouched(&ferry, "g").await;
    let (status, _) = api
        .submit(json!({"operation": "beta.search", "arguments": {}, "group_id": "g"}))
        .await;
    assert_eq!(status, 202);
    assert_eq!(b.next_invocation().await.invocation.operation, "search");
    assert!(a.invocations().is_empty());
}

#[tokio::test]
async fn unusual_group_ids_work_and_never_see_each_others_events() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let groups = [
        "*",
        ">",
        "a.b",
        "a",
        "a.*.>",
        "$JS.API.>",
        "with spaces",
        "ünïcödé 线程",
        "a/b",
        "a%2Fb",
        "...",
        "%",
        ".a",
    ];
    for (i, g) in groups.iter().enumerate() {
        let (status, reply) = api
            .submit(json!({"operation": "echo", "arguments": {"text": format!("for {g}")}, "group_id": g, "id": format!("c{i}")}))
            .await;
        assert_eq!(status, 202, "{g}: {reply}");
        assert_eq!(reply["group_id"], *g);
    }
    for (i, g) in groups.iter().enumerate() {
        let id = format!("c{i}");
        let result = api.wait_for(g, &id, "tool_result").await;
        assert_eq!(result["payload"]["text"], format!("for {g}"));
        let events = api.events(g, 0).await;
        assert!(
            events
                .iter()
                .all(|e| e["group_id"] == *g && e["id"] == id.as_str()),
            "{g}: {events:?}"
        );
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds.first(), Some(&"call_accepted"), "{g}");
        assert_eq!(
            kinds.iter().filter(|k| **k == "tool_result").count(),
            1,
            "{g}: {kinds:?}"
        );
        let (status, call) = api.call(g, &id).await;
        assert_eq!(
            (status, call["status"].as_str()),
            (200, Some("completed")),
            "{g}"
        );
        let (status, thread) = api.get(&format!("/v1/threads/{}", seg(g))).await;
        assert_eq!(status, 200);
        assert_eq!(thread["group_id"], *g);
    }
}

/// Issue 2: "Every accepted call is logged (tracing) for audit with
/// operation, group_id, id, user_id, timestamp and later its outcome." Ids
/// are any text, so the log must quote them: an id with a line break must
/// not start a line of its own (a forged audit record), and a NUL must not
/// reach the log.
#[tokio::test]
async fn ids_cannot_forge_lines_in_the_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ferry.log");
    let ferry = Ferry::start(FerryOptions {
        demo: true,
        log: Some(log.clone()),
        ..FerryOptions::default()
    })
    .await;
    let api = ferry.api();
    let forged = "\nFORGED INFO call accepted operation=drop_table user_id=admin\u{0}";
    let group_id = format!("g{forged}");
    let id = format!("c{forged}");
    let (status, reply) = api
        .submit(json!({"operation": "echo", "arguments": {"text": "hi"},
                       "group_id": group_id, "id": id, "user_id": "u"}))
        .await;
    assert_eq!(status, 202, "{reply}");
    api.wait_for(&group_id, &id, "tool_result").await;

    let text = ferry_tests::eventually(
        "the call's outcome in the log",
        Duration::from_secs(10),
        || {
            let log = log.clone();
            async move {
                let text = String::from_utf8_lossy(&std::fs::read(&log).ok()?).into_owned();
                text.contains("call finished").then_some(text)
            }
        },
    )
    .await;
    assert!(text.contains("call accepted"), "{text}");
    let forged_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("FORGED")).collect();
    assert!(forged_lines.is_empty(), "{forged_lines:#?}");
    assert!(!text.contains('\u{0}'), "a NUL reached the log");
}
