//! The approval gate: gated calls wait durably for a reviewer; decisions,
//! standing grants (inherited through `thread_ancestors`), the durable
//! timeout, and bad decisions that change nothing.

use ferry_tests::api::seg;
use ferry_tests::{Api, Ferry, FerryOptions, TestTool};
use futures::future::join_all;
use serde_json::{json, Value};

/// A tool server with `deploy` (annotated destructive) and `look`.
async fn tool() -> TestTool {
    TestTool::with_manifest(ferry_tests::cases::ops_manifest()).await
}

async fn ferry_with(tool: &TestTool) -> Ferry {
    Ferry::with_tool(tool).await
}

async fn submit(api: &Api, g: &str, id: &str, op: &str, ancestors: Option<Vec<&str>>) -> Value {
    let mut body =
        json!({"operation": op, "arguments": {"x": 1}, "group_id": g, "id": id, "user_id": "u1"});
    if let Some(a) = ancestors {
        body["thread_ancestors"] = json!(a);
    }
    let (status, reply) = api.submit(body).await;
    assert_eq!(status, 202, "{reply}");
    reply
}

async fn decide(api: &Api, g: &str, id: &str, option: &str) -> (u16, Value) {
    api.post(
        &format!("/v1/approvals/{}/{}", seg(g), seg(id)),
        &json!({"optionId": option, "reviewer": "ana", "reason": "checked"}),
    )
    .await
}

async fn pending(api: &Api) -> Vec<Value> {
    let (status, body) = api.get("/v1/approvals?status=pending").await;
    assert_eq!(status, 200, "{body}");
    body["approvals"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_destructive_tool_waits_for_a_reviewer_then_runs() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    let reply = submit(&api, "g", "c", "deploy", None).await;
    assert_eq!(reply["status"], "pending_approval");
    let requested = api.wait_for("g", "c", "approval_requested").await;
    let p = &requested["payload"];
    assert_eq!(
        (p["tool"].as_str(), p["user_id"].as_str()),
        (Some("ops.deploy@1.0.0"), Some("u1"))
    );
    assert_eq!(p["arguments"], json!({"x": 1}));
    let kinds: Vec<&str> = p["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["allow_once", "allow_always", "reject_once", "reject_always"]
    );
    assert!(p["options"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["optionId"] == o["kind"] && o["name"].is_string()));
    let listed = pending(&api).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0]["group_id"].as_str(), listed[0]["id"].as_str()),
        (Some("g"), Some("c"))
    );
    // The ungated tool in the same toolset is not held.
    submit(&api, "g", "l", "look", None).await;
    assert_eq!(tool.next_invocation().await.invocation.id, "l");
    assert!(
        tool.invocations().iter().all(|i| i.id != "c"),
        "dispatched before approval"
    );

    let (status, call) = decide(&api, "g", "c", "allow_once").await;
    assert_eq!(status, 200, "{call}");
    assert_eq!(call["approval"]["reviewer"], "ana");
    assert_eq!(tool.next_invocation().await.invocation.id, "c");
    let decided = api.wait_for("g", "c", "approval_decided").await;
    assert_eq!(decided["payload"]["optionId"], "allow_once");
    assert_eq!(decided["payload"]["reason"], "checked");
    assert!(pending(&api).await.is_empty());
    assert_eq!(api.thread("g").await.1["grants"], json!({}));
}

/// A call shows its approval deadline while a reviewer is asked, and not
/// once it was cancelled (a cancelled call must show no deadline).
#[tokio::test]
async fn a_deadline_is_shown_only_while_a_reviewer_is_asked() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    submit(&api, "g", "c", "deploy", None).await;
    let (_, call) = api.call("g", "c").await;
    assert!(call["approval_deadline"].is_string(), "{call}");
    assert_eq!(api.delete("/v1/threads/g/calls/c").await.0, 200);
    let (_, call) = api.call("g", "c").await;
    assert_eq!(call["status"], "cancelled", "{call}");
    assert!(call.get("approval_deadline").is_none(), "{call}");
}

#[tokio::test]
async fn a_rejected_call_ends_at_once_with_an_error_result() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    submit(&api, "g", "c", "deploy", None).await;
    let (status, call) = decide(&api, "g", "c", "reject_once").await;
    assert_eq!((status, call["status"].as_str()), (200, Some("rejected")));
    let result = api.wait_for("g", "c", "tool_result").await;
    assert_eq!(result["payload"]["is_error"], true);
    let text = result["payload"]["text"].as_str().unwrap();
    assert!(
        text.starts_with("Error: ") && text.contains("rejected by a reviewer"),
        "{text}"
    );
    assert!(tool.invocations().is_empty());
}

#[tokio::test]
async fn bad_decisions_are_refused_and_change_nothing() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    submit(&api, "g", "c", "deploy", None).await;
    submit(&api, "g", "l", "look", None).await;
    api.wait_for("g", "l", "call_dispatched").await;
    let before = api.events("g", 0).await.len();
    let cases = [
        (
            "unknown optionId",
            "/v1/approvals/g/c",
            json!({"optionId": "maybe", "reviewer": "ana"}),
            422,
            "invalid_option",
        ),
        (
            "missing optionId",
            "/v1/approvals/g/c",
            json!({"reviewer": "ana"}),
            400,
            "invalid_request",
        ),
        (
            "unknown field",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "vote": 1}),
            400,
            "invalid_request",
        ),
        (
            "reserved reviewer",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": "timeout"}),
            400,
            "invalid_request",
        ),
        (
            "a reviewer that reads as the timeout",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": " Timeout\n"}),
            400,
            "invalid_request",
        ),
        (
            "a reviewer that reads as a grant",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": "Grant:g1"}),
            400,
            "invalid_request",
        ),
        (
            "the ACP front's reviewer",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_always", "reviewer": "ACP "}),
            400,
            "invalid_request",
        ),
        (
            "a reviewer with a control character",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": "ana\u{1b}[31m"}),
            400,
            "invalid_request",
        ),
        (
            "a reviewer hiding a reserved name behind a zero-width space",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": "\u{200b}acp"}),
            400,
            "invalid_request",
        ),
        (
            "a reviewer with a word joiner inside \"timeout\"",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": "time\u{2060}out"}),
            400,
            "invalid_request",
        ),
        (
            "a reviewer behind a byte-order mark",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": "\u{feff}timeout"}),
            400,
            "invalid_request",
        ),
        (
            "a reviewer with a right-to-left override",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": "\u{202e}grant:x"}),
            400,
            "invalid_request",
        ),
        (
            "a reviewer with a soft hyphen",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": "\u{ad}acp"}),
            400,
            "invalid_request",
        ),
        (
            "the ACP front's reviewer in fullwidth letters",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": "ａｃｐ"}),
            400,
            "invalid_request",
        ),
        (
            "a grant's reviewer in fullwidth letters",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": "ｇｒａｎｔ:x"}),
            400,
            "invalid_request",
        ),
        (
            "a reviewer over 256 bytes",
            "/v1/approvals/g/c",
            json!({"optionId": "allow_once", "reviewer": "a".repeat(257)}),
            400,
            "invalid_request",
        ),
        (
            "a reason over 4 KiB",
            "/v1/approvals/g/c",
            json!({"optionId": "reject_once", "reviewer": "ana", "reason": "r".repeat(4097)}),
            400,
            "invalid_request",
        ),
        (
            "not pending",
            "/v1/approvals/g/l",
            json!({"optionId": "allow_once", "reviewer": "ana"}),
            409,
            "not_pending_approval",
        ),
        (
            "unknown call",
            "/v1/approvals/g/ghost",
            json!({"optionId": "allow_once", "reviewer": "ana"}),
            404,
            "unknown_call",
        ),
        (
            "unknown thread",
            "/v1/approvals/nowhere/c",
            json!({"optionId": "allow_once", "reviewer": "ana"}),
            404,
            "unknown_call",
        ),
    ];
    for (what, path, body, status, code) in cases {
        let (got, reply) = api.post(path, &body).await;
        assert_eq!(
            (got, reply["error"]["code"].as_str()),
            (status, Some(code)),
            "{what}: {reply}"
        );
    }
    let (got, _) = api.post_raw("/v1/approvals/g/c", b"{oops".to_vec()).await;
    assert_eq!(got, 400);
    assert_eq!(
        api.events("g", 0).await.len(),
        before,
        "a refused decision recorded something"
    );
    assert_eq!(api.call("g", "c").await.1["status"], "pending_approval");
    assert_eq!(api.thread("nowhere").await.0, 404);
    let (status, _) = api.get("/v1/approvals?status=decided").await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn concurrent_decisions_yield_one_outcome() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    submit(&api, "g", "c", "deploy", None).await;
    let options = ["allow_once", "reject_once"];
    let answers = join_all((0..10).map(|i| decide(&api, "g", "c", options[i % 2]))).await;
    let ok = answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(ok, 1, "{answers:?}");
    assert!(answers
        .iter()
        .all(|(s, b)| *s == 200 || (*s == 409 && b["error"]["code"] == "not_pending_approval")));
    assert_eq!(api.count("g", "c", "approval_decided").await, 1);
}

#[tokio::test]
async fn standing_grants_apply_to_the_thread_and_its_descendants_only() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    submit(&api, "root", "c1", "deploy", None).await;
    decide(&api, "root", "c1", "allow_always").await;
    assert_eq!(
        api.thread("root").await.1["grants"],
        json!({"ops.deploy": "allow_always"})
    );
    // Same thread: no question asked.
    let reply = submit(&api, "root", "c2", "deploy", None).await;
    assert_ne!(reply["status"], "pending_approval");
    let decided = api.wait_for("root", "c2", "approval_decided").await;
    assert_eq!(decided["payload"]["reviewer"], "grant:root");
    // A child naming root among its ancestors inherits it.
    let reply = submit(&api, "child", "c3", "deploy", Some(vec!["root"])).await;
    assert_ne!(reply["status"], "pending_approval");
    // A sibling without that ancestry, and ancestors that do not exist, ask.
    assert_eq!(
        submit(&api, "sibling", "c4", "deploy", None).await["status"],
        "pending_approval"
    );
    assert_eq!(
        submit(&api, "orphan", "c5", "deploy", Some(vec!["nope", "gone"])).await["status"],
        "pending_approval"
    );
    let dispatched: Vec<String> = {
        let mut ids = vec![];
        for _ in 0..3 {
            ids.push(tool.next_invocation().await.invocation.id);
        }
        ids.sort();
        ids
    };
    assert_eq!(dispatched, ["c1", "c2", "c3"]);
    // Revoking brings the question back.
    let (status, _) = api.delete("/v1/threads/root/grants/ops.deploy").await;
    assert_eq!(status, 200);
    assert_eq!(
        submit(&api, "root", "c6", "deploy", None).await["status"],
        "pending_approval"
    );
    let (status, body) = api.delete("/v1/threads/root/grants/ops.deploy").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("no_grant"))
    );
    // reject_always ends later calls at once.
    decide(&api, "root", "c6", "reject_always").await;
    assert_eq!(
        submit(&api, "root", "c7", "deploy", None).await["status"],
        "rejected"
    );
}

/// Grants follow the ancestors the thread shows (`GET /v1/threads/{g}`),
/// which its first call naming any sets: a later call naming other
/// ancestors does not borrow their grants, and one naming none keeps the
/// thread's.
#[tokio::test]
async fn grants_follow_the_ancestors_the_thread_shows() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    submit(&api, "granted", "g1", "deploy", None).await;
    decide(&api, "granted", "g1", "allow_always").await;

    // A thread whose first call named another ancestor.
    submit(&api, "other-child", "o1", "look", Some(vec!["elsewhere"])).await;
    assert_eq!(
        api.thread("other-child").await.1["ancestors"],
        json!(["elsewhere"])
    );
    let borrowed = submit(&api, "other-child", "o2", "deploy", Some(vec!["granted"])).await;
    assert_eq!(borrowed["status"], "pending_approval", "{borrowed}");
    assert_eq!(
        api.thread("other-child").await.1["ancestors"],
        json!(["elsewhere"])
    );

    // A thread that is the granted thread's child keeps its grant for a
    // call that names no ancestors.
    submit(&api, "child", "c1", "look", Some(vec!["granted"])).await;
    let inherited = submit(&api, "child", "c2", "deploy", None).await;
    assert_ne!(inherited["status"], "pending_approval", "{inherited}");
    let decided = api.wait_for("child", "c2", "approval_decided").await;
    assert_eq!(decided["payload"]["reviewer"], "grant:granted");
}

/// RAP omits `thread_ancestors` "when the current thread is the root": an
/// empty list and none are the same call, so a retry with the other is
/// answered by the call (200), not refused as a conflict.
#[tokio::test]
async fn an_empty_ancestor_list_is_the_same_call_as_none() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    let body = json!({"operation": "look", "arguments": {}, "group_id": "g", "id": "a"});
    let (status, _) = api.submit(body.clone()).await;
    assert_eq!(status, 202);
    let mut empty = body.clone();
    empty["thread_ancestors"] = json!([]);
    let (status, reply) = api.submit(empty).await;
    assert_eq!(status, 200, "{reply}");

    let mut first = json!({"operation": "look", "arguments": {}, "group_id": "g", "id": "b"});
    first["thread_ancestors"] = json!([]);
    let (status, _) = api.submit(first).await;
    assert_eq!(status, 202);
    let (status, reply) = api
        .submit(json!({"operation": "look", "arguments": {}, "group_id": "g", "id": "b"}))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(api.thread("g").await.1["ancestors"], Value::Null);
}

#[tokio::test]
async fn policy_is_set_at_registration_and_patched_without_refetching() {
    let tool = tool().await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    let (status, body) = api
        .post("/v1/toolsets", &json!({"url": tool.url, "approval": "required", "tools": {"deploy": {"approval": "auto"}}}))
        .await;
    assert_eq!(status, 201, "{body}");
    let modes: Vec<(&str, &str)> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["approval"].as_str().unwrap()))
        .collect();
    assert_eq!(modes, [("deploy", "auto"), ("look", "required")]);
    assert_ne!(
        submit(&api, "g", "a", "deploy", None).await["status"],
        "pending_approval"
    );
    assert_eq!(
        submit(&api, "g", "b", "look", None).await["status"],
        "pending_approval"
    );
    let (status, body) = api
        .client
        .patch(format!("{}/v1/toolsets/ops", api.base))
        .json(&json!({"approval": "auto", "tools": {"deploy": {"approval": "required"}}}))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map(|s| (s, ()))
        .unwrap();
    assert_eq!(status, 200, "{body:?}");
    assert_eq!(
        submit(&api, "g", "c", "deploy", None).await["status"],
        "pending_approval"
    );
    assert_ne!(
        submit(&api, "g", "d", "look", None).await["status"],
        "pending_approval"
    );
    // Bad policies are refused and change nothing.
    for bad in [
        json!({"tools": {"nope": {"approval": "auto"}}}),
        json!({"approval": "sometimes"}),
        json!({"approval_timeout_secs": 0}),
        json!({"approval_timeout_secs": u64::MAX}),
        json!({"url": "x"}),
    ] {
        let response = api
            .client
            .patch(format!("{}/v1/toolsets/ops", api.base))
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert!(
            [400, 422].contains(&response.status().as_u16()),
            "{bad}: {}",
            response.status()
        );
    }
    let response = api
        .client
        .patch(format!("{}/v1/toolsets/nope", api.base))
        .json(&json!({"approval": "auto"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(
        submit(&api, "g", "e", "deploy", None).await["status"],
        "pending_approval"
    );
    let (status, body) = patch(&api, "/v1/toolsets/ops?version=9.9.9", json!({})).await;
    assert_eq!(status, 404);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("9.9.9"),
        "{body}"
    );

    // A merge patch: `null` puts a field back to its default. First the
    // opposite of the default (look gated, deploy not), then nulls.
    let opposite = json!({"approval": "required", "approval_timeout_secs": 60,
                          "tools": {"deploy": {"approval": "auto"}}});
    assert_eq!(patch(&api, "/v1/toolsets/ops", opposite).await.0, 200);
    assert_eq!(
        submit(&api, "g", "f", "look", None).await["status"],
        "pending_approval"
    );
    let defaults = json!({"approval": null, "approval_timeout_secs": null,
                          "tools": {"deploy": null, "look": null}});
    let (status, body) = patch(&api, "/v1/toolsets/ops", defaults).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["versions"][0]["policy"], json!({}), "{body}");
    assert_eq!(
        api.get("/v1/toolsets/ops").await.1["latest"]["policy"],
        json!({})
    );
    // The default again: only the destructive tool waits.
    assert_eq!(
        submit(&api, "g", "h", "deploy", None).await["status"],
        "pending_approval"
    );
    assert_ne!(
        submit(&api, "g", "i", "look", None).await["status"],
        "pending_approval"
    );
}

/// `PATCH path` with `body`: the status and the JSON answer.
async fn patch(api: &Api, path: &str, body: Value) -> (u16, Value) {
    let response = api
        .client
        .patch(format!("{}{path}", api.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn an_unanswered_approval_times_out_once_even_across_a_restart() {
    let tool = tool().await;
    let mut ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    let (status, _) = api
        .post(
            "/v1/toolsets",
            &json!({"url": tool.url, "approval_timeout_secs": 2}),
        )
        .await;
    assert_eq!(status, 201);
    submit(&api, "g", "c", "deploy", None).await;
    api.wait_for("g", "c", "approval_requested").await;
    // Crash during the wait: the deadline is durable and re-armed.
    ferry.restart().await;
    let api = ferry.api();
    let decided = api.wait_for("g", "c", "approval_decided").await;
    assert_eq!(decided["payload"]["reviewer"], "timeout");
    assert_eq!(decided["payload"]["optionId"], "reject_once");
    let result = api.wait_for("g", "c", "tool_result").await;
    assert!(result["payload"]["text"]
        .as_str()
        .unwrap()
        .contains("no reviewer approved it in time"));
    let (status, body) = decide(&api, "g", "c", "allow_once").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_pending_approval"))
    );
    assert_eq!(api.count("g", "c", "approval_decided").await, 1);
    assert!(tool.invocations().is_empty());
}

/// A policy a reviewer set stands: a restart re-registers `--tool-server`
/// toolsets, and a registration without a policy keeps the stored one.
#[tokio::test]
async fn a_restart_or_a_plain_registration_keeps_the_policy_a_reviewer_set() {
    let tool = tool().await;
    let mut ferry = ferry_with(&tool).await;
    let api = ferry.api();
    assert_ne!(
        submit(&api, "g", "a", "look", None).await["status"],
        "pending_approval"
    );
    let response = api
        .client
        .patch(format!("{}/v1/toolsets/ops", api.base))
        .json(&json!({"approval": "required"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    ferry.restart().await;
    let api = ferry.api();
    let (status, body) = api.get("/v1/toolsets/ops").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["latest"]["policy"]["approval"], "required", "{body}");
    assert_eq!(
        submit(&api, "g", "b", "look", None).await["status"],
        "pending_approval"
    );
    let (status, body) = api.post("/v1/toolsets", &json!({"url": tool.url})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        submit(&api, "g", "c", "look", None).await["status"],
        "pending_approval"
    );
    // A registration that names a policy sets it.
    let (status, body) = api
        .post(
            "/v1/toolsets",
            &json!({"url": tool.url, "approval": "auto"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_ne!(
        submit(&api, "g", "d", "deploy", None).await["status"],
        "pending_approval"
    );
}

/// A policy one version of a toolset cannot take changes no version.
#[tokio::test]
async fn a_patch_one_version_refuses_changes_no_version() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    tool.set_manifest(
        json!({"name": "ops", "endpoint": format!("{}/invoke", tool.url), "tools": [
            {"name": "deploy", "description": "ship it", "inputSchema": {"type": "object"}}
        ]}),
    );
    let (status, body) = api
        .post(
            "/v1/toolsets",
            &json!({"url": tool.url, "version": "2.0.0"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // `look` exists in 1.0.0 only.
    let response = api
        .client
        .patch(format!("{}/v1/toolsets/ops", api.base))
        .json(&json!({"approval": "required", "tools": {"look": {"approval": "auto"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    let (_, body) = api.get("/v1/toolsets/ops").await;
    for version in body["versions"].as_array().unwrap() {
        assert_eq!(version["policy"], json!({}), "{version}");
    }
}

/// A per-tool policy outlives its tool: when the server drops the tool,
/// refreshing and registering again still work (not both refused 422
/// for good, which would leave new tools never picked up), and when
/// the tool comes back, its policy governs it again rather than leave it
/// ungated. Setting a policy for a tool the toolset lacks is still refused.
#[tokio::test]
async fn a_per_tool_policy_outlives_its_tool_without_blocking_a_refresh() {
    let tool = TestTool::with_manifest(json!({"name": "ops", "tools": [
        {"name": "look", "description": "read only", "inputSchema": {"type": "object"}},
        {"name": "wipe", "description": "careful", "inputSchema": {"type": "object"}}
    ]}))
    .await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    let gated = json!({"url": tool.url, "tools": {"wipe": {"approval": "required"}}});
    let (status, body) = api.post("/v1/toolsets", &gated).await;
    assert_eq!(status, 201, "{body}");
    let without_wipe = json!({"name": "ops", "endpoint": format!("{}/invoke", tool.url), "tools": [
        {"name": "look", "description": "read only", "inputSchema": {"type": "object"}},
        {"name": "fresh", "description": "new", "inputSchema": {"type": "object"}}
    ]});
    tool.set_manifest(without_wipe);
    let (status, body) = api.post("/v1/toolsets/ops/refresh", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api.register(&tool.url).await;
    assert_eq!(status, 201, "{body}");
    assert_ne!(
        submit(&api, "g", "a", "fresh", None).await["status"],
        "pending_approval"
    );
    // Set now, a policy must name a tool the toolset has.
    let (status, body) = api
        .post(
            "/v1/toolsets",
            &json!({"url": tool.url, "tools": {"wipe": {"approval": "auto"}}}),
        )
        .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (422, &json!("invalid_toolset")),
        "{body}"
    );
    let patched = api
        .client
        .patch(format!("{}/v1/toolsets/ops", api.base))
        .json(&json!({"tools": {"wipe": {"approval": "auto"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 422);
    // Back on the server, `wipe` is gated again by the entry kept.
    let with_wipe = json!({"name": "ops", "endpoint": format!("{}/invoke", tool.url), "tools": [
        {"name": "look", "description": "read only", "inputSchema": {"type": "object"}},
        {"name": "wipe", "description": "careful", "inputSchema": {"type": "object"}}
    ]});
    tool.set_manifest(with_wipe);
    let (status, body) = api.post("/v1/toolsets/ops/refresh", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        submit(&api, "g", "b", "wipe", None).await["status"],
        "pending_approval"
    );
}

/// A web page on another site cannot approve a gated call (a browser sends
/// a `text/plain` POST without asking first), nor change anything else;
/// otherwise it could approve a destructive call and make an `allow_always`
/// grant. Clients that send no `Origin`, and the dashboard's own
/// same-origin requests, go through.
#[tokio::test]
async fn a_cross_site_request_changes_nothing() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let api = ferry.api();
    assert_eq!(
        submit(&api, "g", "c", "deploy", None).await["status"],
        "pending_approval"
    );
    let before = api.events("g", 0).await;
    let post = |path: &str, origin: &str, body: &'static str| {
        reqwest::Client::new()
            .post(format!("{}{path}", ferry.url))
            .header("content-type", "text/plain")
            .header("origin", origin)
            .body(body)
            .send()
    };
    let approve = r#"{"optionId": "allow_always", "reviewer": "mallory"}"#;
    let call = r#"{"operation": "look", "arguments": {}, "group_id": "g", "id": "x"}"#;
    for (path, body) in [
        ("/v1/approvals/g/c", approve),
        ("/v1/calls", call),
        ("/v1/threads/g/close", "{}"),
    ] {
        for origin in ["http://evil.example", "null"] {
            let response = post(path, origin, body).await.unwrap();
            assert_eq!(response.status(), 403, "{path} from {origin}");
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["error"]["code"], "forbidden", "{body}");
        }
    }
    assert_eq!(
        api.events("g", 0).await,
        before,
        "a cross-site request changed the thread"
    );
    // A page that pointed its own name at Ferry (DNS rebinding) sends that
    // name as `Host` too: it is not Ferry's, so it is still another site.
    let port = reqwest::Url::parse(&ferry.url).unwrap().port().unwrap();
    let rebound = format!("rebound.example:{port}");
    let response = reqwest::Client::new()
        .post(format!("{}/v1/approvals/g/c", ferry.url))
        .header("host", &rebound)
        .header("origin", format!("http://{rebound}"))
        .header("content-type", "text/plain")
        .body(approve)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403, "a rebound page");
    assert_eq!(api.call("g", "c").await.1["status"], "pending_approval");
    // Reads are not refused (a browser does not let another site's page
    // read the answers).
    let read = reqwest::Client::new()
        .get(format!("{}/v1/threads/g", ferry.url))
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);
    // The dashboard's own origin may decide (in JSON, as the dashboard
    // sends it: `hardening.rs` for other types).
    let response = reqwest::Client::new()
        .post(format!("{}/v1/approvals/g/c", ferry.url))
        .header("content-type", "application/json")
        .header("origin", &ferry.url)
        .body(approve)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_ne!(api.call("g", "c").await.1["status"], "pending_approval");
}
