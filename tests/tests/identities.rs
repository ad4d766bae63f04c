//! Named API tokens: scopes that allow exactly their operations, bounds on
//! tools, users and threads, made and revoked through `/v1/tokens` and
//! `ferry tokens`, stored as digests. Every refusal changes nothing.

use ferry_tests::api::seg;
use ferry_tests::{Api, Ferry, TestTool};
use reqwest::Method;
use serde_json::{json, Value};

/// A tool server with `deploy` (destructive: gated) and `look`.
async fn tool() -> TestTool {
    TestTool::with_manifest(ferry_tests::cases::ops_manifest()).await
}

/// One request with `token` (none: no `Authorization`) and, for a body,
/// `Content-Type: application/json`.
async fn send(
    ferry: &Ferry,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = client.request(method, format!("{}{path}", ferry.url));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    // A stream allowed to open never ends: its status is the answer.
    let streams = response
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if streams {
        return (status, Value::Null);
    }
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Makes a token through `admin` (none: anonymously, as the first one is).
async fn make(ferry: &Ferry, admin: Option<&str>, spec: Value) -> String {
    match admin {
        Some(admin) => Api::with_token(&ferry.url, admin),
        None => ferry.api(),
    }
    .make_token(spec)
    .await
}

/// Threads and tokens as the operator token sees them: what a refused
/// request must not have changed.
/// Of each thread: whether it is closed, its calls, its grants and its
/// pending approvals (not what dispatch changes on its own).
async fn footprint(ferry: &Ferry, root: &str) -> (Vec<Value>, Value, Value) {
    let (_, threads) = send(ferry, Some(root), Method::GET, "/v1/threads", None).await;
    let mut threads: Vec<Value> = threads["threads"]
        .as_array()
        .expect("a thread list")
        .iter()
        .map(|t| {
            json!([
                t["group_id"],
                t["closed"],
                t["calls"],
                t["grants"],
                t["counts"]["pending_approval"]
            ])
        })
        .collect();
    threads.sort_by_key(|t| t[0].as_str().unwrap_or_default().to_owned());
    let tokens = send(ferry, Some(root), Method::GET, "/v1/tokens", None).await;
    let toolsets = send(ferry, Some(root), Method::GET, "/v1/toolsets", None).await;
    (threads, tokens.1, toolsets.1)
}

/// A Ferry with the gated tool, an all-scopes `root` token made first
/// (anonymously), and a pending approval in thread `shared`.
async fn locked_ferry(tool: &TestTool) -> (Ferry, String) {
    let ferry = Ferry::with_tool(tool).await;
    let root = make(
        &ferry,
        None,
        json!({"name": "root", "scopes": ["submit", "read", "review", "admin"]}),
    )
    .await;
    let call = json!({"operation": "deploy", "arguments": {}, "group_id": "shared", "id": "gated"});
    let (status, reply) = send(&ferry, Some(&root), Method::POST, "/v1/calls", Some(&call)).await;
    assert_eq!(
        (status, reply["status"].as_str()),
        (202, Some("pending_approval")),
        "{reply}"
    );
    (ferry, root)
}

#[tokio::test(flavor = "multi_thread")]
async fn each_scope_allows_exactly_its_operations_and_refusals_leave_no_trace() {
    let tool = tool().await;
    let (ferry, root) = locked_ferry(&tool).await;
    let mut tokens = vec![];
    for scope in ["submit", "read", "review", "admin"] {
        let token = make(
            &ferry,
            Some(&root),
            json!({"name": scope, "scopes": [scope]}),
        )
        .await;
        tokens.push((scope, token));
    }
    // The submitter's own thread, for the operations that need one.
    let submitter = tokens[0].1.clone();
    let own = json!({"operation": "look", "arguments": {}, "group_id": "mine", "id": "m1"});
    let (status, _) = send(
        &ferry,
        Some(&submitter),
        Method::POST,
        "/v1/calls",
        Some(&own),
    )
    .await;
    assert_eq!(status, 202);
    tool.next_invocation().await;
    let before = footprint(&ferry, &root).await;

    let new_call = |g: &str| json!({"operation": "look", "arguments": {}, "group_id": g});
    let reject = json!({"optionId": "reject_once", "reviewer": "ana", "reason": "matrix"});
    let toolset = json!({"url": "http://127.0.0.1:9/"});
    let token_spec = json!({"name": "made", "scopes": ["read"]});
    // (method, path, body, the scopes allowed). An allowed request may
    // still fail for its own reasons (404, 409, 422): only 401 and 403
    // say the credential was refused. Refused requests come first, so
    // that nothing an allowed one changes is seen as a refusal's trace.
    let rows: Vec<(Method, String, Option<Value>, &[&str])> = vec![
        (Method::GET, "/v1/tools".into(), None, &["submit", "read"]),
        (
            Method::POST,
            "/v1/calls".into(),
            Some(new_call("fresh")),
            &["submit"],
        ),
        (Method::GET, "/v1/threads".into(), None, &["read"]),
        (Method::GET, "/v1/threads/shared".into(), None, &["read"]),
        (
            Method::GET,
            "/v1/threads/shared/calls".into(),
            None,
            &["read"],
        ),
        (
            Method::GET,
            "/v1/threads/shared/events".into(),
            None,
            &["read"],
        ),
        (
            Method::GET,
            "/v1/threads/shared/calls/gated".into(),
            None,
            &["read"],
        ),
        (
            Method::GET,
            "/v1/approvals".into(),
            None,
            &["read", "review"],
        ),
        // A submitter's acts on what it started: answering a choice,
        // ending a subscription, cancelling a call, closing the thread
        // (in this order: each but the last needs the thread open, and
        // the first two the call still running).
        (
            Method::POST,
            "/v1/threads/mine/calls/m1/choice".into(),
            Some(json!({"index": 0})),
            &["submit"],
        ),
        (
            Method::DELETE,
            "/v1/threads/mine/subscriptions/none".into(),
            None,
            &["submit"],
        ),
        (
            Method::DELETE,
            "/v1/threads/mine/calls/m1".into(),
            None,
            &["submit"],
        ),
        (
            Method::POST,
            "/v1/threads/mine/close".into(),
            Some(json!({})),
            &["submit"],
        ),
        (
            Method::DELETE,
            "/v1/threads/shared/grants/ops.deploy".into(),
            None,
            &["review"],
        ),
        (
            Method::POST,
            "/v1/toolsets".into(),
            Some(toolset),
            &["admin"],
        ),
        (Method::GET, "/v1/toolsets".into(), None, &["admin"]),
        (Method::GET, "/v1/toolsets/ops".into(), None, &["admin"]),
        (Method::GET, "/v1/tokens".into(), None, &["admin"]),
        (
            Method::POST,
            "/v1/tokens".into(),
            Some(token_spec),
            &["admin"],
        ),
        (
            Method::DELETE,
            "/v1/tokens/tok_unknown".into(),
            None,
            &["admin"],
        ),
        (Method::GET, "/v1/audit".into(), None, &["admin"]),
        (
            Method::PATCH,
            "/v1/toolsets/nope".into(),
            Some(json!({"policy": {}})),
            &["admin"],
        ),
        (Method::DELETE, "/v1/toolsets/nope".into(), None, &["admin"]),
        (
            Method::POST,
            "/v1/toolsets/nope/refresh".into(),
            None,
            &["admin"],
        ),
        // Every caller may learn who it is, whatever its scopes.
        (
            Method::GET,
            "/v1/whoami".into(),
            None,
            &["submit", "read", "review", "admin"],
        ),
        (Method::GET, "/metrics".into(), None, &["read"]),
        // The thread's streams, native and ACP: reading, so `read`.
        (
            Method::GET,
            "/v1/threads/shared/stream".into(),
            None,
            &["read"],
        ),
        (
            Method::GET,
            "/v1/threads/shared/acp".into(),
            None,
            &["read"],
        ),
        // What the dashboard polls, with its own queries.
        (
            Method::GET,
            "/v1/approvals?status=pending".into(),
            None,
            &["read", "review"],
        ),
        (Method::GET, "/v1/threads?limit=50".into(), None, &["read"]),
        (
            Method::GET,
            "/v1/threads/shared/events?after=0&limit=1000".into(),
            None,
            &["read"],
        ),
        (
            Method::POST,
            "/v1/approvals/shared/gated".into(),
            Some(reject),
            &["review"],
        ),
        // Consumers: made, replayed and deleted by `admin`; read, pulled
        // and acknowledged with `read` (in this order when allowed).
        (
            Method::POST,
            "/v1/consumers".into(),
            Some(json!({"name": "m", "filter": {"types": ["tool_result"]}})),
            &["admin"],
        ),
        (Method::GET, "/v1/consumers".into(), None, &["read"]),
        (Method::GET, "/v1/consumers/m".into(), None, &["read"]),
        (
            Method::GET,
            "/v1/consumers/m/next?wait=0".into(),
            None,
            &["read"],
        ),
        (
            Method::POST,
            "/v1/consumers/m/ack".into(),
            Some(json!({"acks": [{"group_id": "shared", "seq": 1}]})),
            &["read"],
        ),
        (
            Method::POST,
            "/v1/consumers/m/replay".into(),
            Some(json!({"from": {"seq": 1}})),
            &["admin"],
        ),
        (Method::DELETE, "/v1/consumers/m".into(), None, &["admin"]),
    ];
    // Every refusal first, then a look at what they changed: nothing.
    for (method, path, body, allowed) in &rows {
        for (scope, token) in &tokens {
            if allowed.contains(scope) {
                continue;
            }
            let (status, answer) =
                send(&ferry, Some(token), method.clone(), path, body.as_ref()).await;
            assert_eq!(status, 403, "{scope} {method} {path}: {answer}");
            assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
        }
        let (status, _) = send(&ferry, None, method.clone(), path, body.as_ref()).await;
        assert_eq!(status, 401, "no token: {method} {path}");
    }
    assert_eq!(
        footprint(&ferry, &root).await,
        before,
        "a refused request changed something"
    );
    for (method, path, body, allowed) in &rows {
        for (scope, token) in tokens.iter().filter(|(s, _)| allowed.contains(s)) {
            let (status, answer) =
                send(&ferry, Some(token), method.clone(), path, body.as_ref()).await;
            assert!(
                ![401, 403].contains(&status),
                "{scope} refused {method} {path}: {status} {answer}"
            );
        }
    }
    // The reviewer's decision names the identity that made it.
    let (_, call) = send(
        &ferry,
        Some(&root),
        Method::GET,
        "/v1/threads/shared/calls/gated",
        None,
    )
    .await;
    assert_eq!(call["status"], "rejected", "{call}");
    assert_eq!(call["approval"]["reviewer"], "review", "{call}");
    // What it typed is only a comment.
    assert_eq!(
        call["approval"]["reason"], "(typed reviewer: ana) matrix",
        "{call}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_bounded_to_a_user_and_tools_cannot_go_beyond_them_and_the_tool_sees_who() {
    let tool = tool().await;
    let (ferry, root) = locked_ferry(&tool).await;
    let agent = make(
        &ferry,
        Some(&root),
        json!({"name": "agent-7", "scopes": ["submit", "read"], "tools": ["ops.look"], "users": ["u1"]}),
    )
    .await;
    let before = footprint(&ferry, &root).await;
    let call = |op: &str, user: Option<&str>| {
        let mut call = json!({"operation": op, "arguments": {}, "group_id": "a7", "id": format!("{op}-{user:?}")});
        if let Some(user) = user {
            call["user_id"] = json!(user);
        }
        call
    };
    for refused in [
        call("look", Some("u2")),
        call("deploy", Some("u1")),
        call("ops.deploy", None),
    ] {
        let (status, answer) = send(
            &ferry,
            Some(&agent),
            Method::POST,
            "/v1/calls",
            Some(&refused),
        )
        .await;
        assert_eq!(status, 403, "{refused} -> {answer}");
        assert_eq!(answer["error"]["code"], "forbidden");
    }
    assert_eq!(
        footprint(&ferry, &root).await,
        before,
        "a refused call left a trace"
    );
    // Its tool list shows only what it may call.
    let (_, listed) = send(&ferry, Some(&agent), Method::GET, "/v1/tools", None).await;
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["qualified"].as_str())
        .collect();
    assert_eq!(names, ["cancel_subscription", "ops.look@1.0.0"], "{listed}");

    // With no user_id, the call acts for the token's one user; the tool
    // is told who submitted it.
    let (status, answer) = send(
        &ferry,
        Some(&agent),
        Method::POST,
        "/v1/calls",
        Some(&call("look", None)),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let invoked = tool.next_invocation().await.invocation;
    assert_eq!(invoked.user_id.as_deref(), Some("u1"));
    assert_eq!(invoked.identity.as_deref(), Some("agent-7"));
    // ... and that the credential vouches for the user.
    assert!(invoked.user_verified, "{invoked:?}");
    // A token bound to no user only claims one: the tool is told so, and
    // whose claim it is.
    let mut claimed = call("look", Some("u9"));
    claimed["group_id"] = json!("root-thread");
    let (status, answer) = send(
        &ferry,
        Some(&root),
        Method::POST,
        "/v1/calls",
        Some(&claimed),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let invoked = tool.next_invocation().await.invocation;
    assert_eq!(invoked.user_id.as_deref(), Some("u9"));
    assert_eq!(invoked.identity.as_deref(), Some("root"));
    assert!(!invoked.user_verified, "{invoked:?}");
    let wire = serde_json::to_value(&invoked).unwrap();
    assert!(wire.get("user_verified").is_none(), "{wire}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prefix_makes_a_tenant_whose_tokens_share_its_threads_and_no_others() {
    let tool = tool().await;
    let (ferry, root) = locked_ferry(&tool).await;
    let tenant =
        |name: &str| json!({"name": name, "scopes": ["submit", "read"], "group_prefix": "team-a/"});
    let first = make(&ferry, Some(&root), tenant("a-1")).await;
    let second = make(&ferry, Some(&root), tenant("a-2")).await;
    let look =
        |g: &str, id: &str| json!({"operation": "look", "arguments": {}, "group_id": g, "id": id});
    let (status, _) = send(
        &ferry,
        Some(&first),
        Method::POST,
        "/v1/calls",
        Some(&look("team-a/t", "1")),
    )
    .await;
    assert_eq!(status, 202);
    // Another token of the tenant carries the thread on.
    let (status, _) = send(
        &ferry,
        Some(&second),
        Method::POST,
        "/v1/calls",
        Some(&look("team-a/t", "2")),
    )
    .await;
    assert_eq!(status, 202);
    let before = footprint(&ferry, &root).await;
    for (method, path, body) in [
        (Method::POST, "/v1/calls", Some(look("team-b/t", "3"))),
        (Method::POST, "/v1/calls", Some(look("shared", "4"))),
        (Method::GET, "/v1/threads/shared/events", None),
        (Method::POST, "/v1/threads/shared/close", Some(json!({}))),
    ] {
        let (status, answer) =
            send(&ferry, Some(&first), method.clone(), path, body.as_ref()).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
    }
    let mut ancestor = look("team-a/child", "5");
    ancestor["thread_ancestors"] = json!(["shared"]);
    let (status, _) = send(
        &ferry,
        Some(&first),
        Method::POST,
        "/v1/calls",
        Some(&ancestor),
    )
    .await;
    assert_eq!(status, 403, "an ancestor outside the prefix was accepted");
    assert_eq!(footprint(&ferry, &root).await, before);
    let (_, listed) = send(&ferry, Some(&second), Method::GET, "/v1/threads", None).await;
    let groups: Vec<&str> = listed["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["group_id"].as_str())
        .collect();
    assert_eq!(groups, ["team-a/t"], "{listed}");
    let (_, pending) = send(&ferry, Some(&second), Method::GET, "/v1/approvals", None).await;
    assert_eq!(
        pending["approvals"],
        json!([]),
        "another tenant's approval was listed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_token_is_refused_at_once_and_after_a_kill_9_and_no_secret_is_stored() {
    let tool = tool().await;
    let (mut ferry, root) = locked_ferry(&tool).await;
    let reader = make(
        &ferry,
        Some(&root),
        json!({"name": "reader", "scopes": ["read"]}),
    )
    .await;
    let (_, listed) = send(&ferry, Some(&root), Method::GET, "/v1/tokens", None).await;
    let id = listed["tokens"][1]["id"].as_str().unwrap().to_owned();
    assert!(
        !listed.to_string().contains(&reader),
        "a listing shows a secret"
    );
    assert_eq!(
        send(&ferry, Some(&reader), Method::GET, "/v1/threads", None)
            .await
            .0,
        200
    );
    let (status, revoked) = send(
        &ferry,
        Some(&root),
        Method::DELETE,
        &format!("/v1/tokens/{}", seg(&id)),
        None,
    )
    .await;
    assert_eq!(
        (status, revoked["live"].as_bool()),
        (200, Some(false)),
        "{revoked}"
    );
    assert_eq!(revoked["revoked_by"], "root");
    assert_eq!(
        send(&ferry, Some(&reader), Method::GET, "/v1/threads", None)
            .await
            .0,
        401
    );
    // Revoking again changes nothing.
    let (status, again) = send(
        &ferry,
        Some(&root),
        Method::DELETE,
        &format!("/v1/tokens/{}", seg(&id)),
        None,
    )
    .await;
    assert_eq!(
        (status, &again["revoked_at"]),
        (200, &revoked["revoked_at"])
    );

    ferry.kill9();
    ferry.restart().await;
    assert_eq!(
        send(&ferry, Some(&reader), Method::GET, "/v1/threads", None)
            .await
            .0,
        401
    );
    assert_eq!(
        send(&ferry, Some(&root), Method::GET, "/v1/threads", None)
            .await
            .0,
        200
    );
    assert_eq!(
        send(&ferry, None, Method::GET, "/v1/threads", None).await.0,
        401
    );
    // The store holds digests: neither secret is anywhere in it.
    for file in walk(ferry.data.path()) {
        let bytes = std::fs::read(&file).unwrap_or_default();
        for secret in [&root, &reader] {
            let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!found, "{} holds a token's secret", file.display());
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_token_requests_are_refused_by_name_and_change_nothing() {
    let tool = tool().await;
    let ferry = Ferry::with_tool(&tool).await;
    // While no token exists, the first must be an admin's.
    let (status, answer) = send(
        &ferry,
        None,
        Method::POST,
        "/v1/tokens",
        Some(&json!({"name": "agent", "scopes": ["submit"]})),
    )
    .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{answer}"
    );
    assert_eq!(
        send(&ferry, None, Method::GET, "/v1/threads", None).await.0,
        200,
        "still open"
    );
    let root = make(
        &ferry,
        None,
        json!({"name": "root", "scopes": ["admin", "read"]}),
    )
    .await;
    let before = footprint(&ferry, &root).await;
    let long_name = "n".repeat(129);
    for (spec, says) in [
        (
            json!({"name": "x", "scopes": ["root"]}),
            "unknown scope \"root\"",
        ),
        (json!({"name": "x", "scopes": []}), "at least one scope"),
        (json!({"name": "x"}), "scopes"),
        (json!({"name": "", "scopes": ["read"]}), "name must be"),
        (
            json!({"name": long_name, "scopes": ["read"]}),
            "name must be",
        ),
        (
            json!({"name": "two words", "scopes": ["read"]}),
            "name must be",
        ),
        (
            json!({"name": "api-token", "scopes": ["read"]}),
            "Ferry's own identities",
        ),
        (
            json!({"name": "mcp", "scopes": ["read"]}),
            "Ferry's own identities",
        ),
        (
            json!({"name": "x", "scopes": ["read"], "users": []}),
            "users must name",
        ),
        (
            json!({"name": "x", "scopes": ["read"], "tools": ["a.b.c"]}),
            "tools entry",
        ),
        (
            json!({"name": "x", "scopes": ["read"], "group_prefix": ""}),
            "group_prefix",
        ),
        (
            json!({"name": "x", "scopes": ["read"], "admin": true}),
            "unknown field",
        ),
        (
            json!({"name": "x", "scopes": "read"}),
            "expected a sequence",
        ),
    ] {
        let (status, answer) =
            send(&ferry, Some(&root), Method::POST, "/v1/tokens", Some(&spec)).await;
        assert!([400, 422].contains(&status), "{spec} -> {status} {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{spec}: {message}");
    }
    let (status, _) = send(
        &ferry,
        Some(&root),
        Method::DELETE,
        "/v1/tokens/tok_nope",
        None,
    )
    .await;
    assert_eq!(status, 404);
    // The last admin token cannot be revoked while another is live.
    let other = make(
        &ferry,
        Some(&root),
        json!({"name": "reader", "scopes": ["read"]}),
    )
    .await;
    let (_, listed) = send(&ferry, Some(&root), Method::GET, "/v1/tokens", None).await;
    let root_id = listed["tokens"][0]["id"].as_str().unwrap().to_owned();
    let (status, answer) = send(
        &ferry,
        Some(&root),
        Method::DELETE,
        &format!("/v1/tokens/{root_id}"),
        None,
    )
    .await;
    assert_eq!(status, 409, "{answer}");
    // Presented tokens that are no one's: 401, whatever their shape.
    let over_long = format!("ferry_{}", "a".repeat(600));
    let tampered = format!("{}x", &other[..other.len() - 1]);
    for presented in [
        over_long.as_str(),
        tampered.as_str(),
        "ferry_",
        "not-a-ferry-token-at-all",
    ] {
        let (status, _) = send(&ferry, Some(presented), Method::GET, "/v1/threads", None).await;
        assert_eq!(status, 401, "{presented:.20}");
    }
    let (_, listed_after) = send(&ferry, Some(&root), Method::GET, "/v1/tokens", None).await;
    assert_eq!(listed_after["tokens"].as_array().map(Vec::len), Some(2));
    assert_eq!(footprint(&ferry, &root).await.0, before.0);
}

/// `GET /v1/whoami` names the caller, its scopes and its bounds, for a
/// token of any scope: a client learns what its credential may do before
/// it tries. Anonymous while no credential is configured; 401 without a
/// token once one is.
#[tokio::test(flavor = "multi_thread")]
async fn whoami_names_the_caller_its_scopes_and_bounds() {
    let ferry = Ferry::start(ferry_tests::FerryOptions::default()).await;
    let (status, anonymous) = ferry.api().get("/v1/whoami").await;
    assert_eq!(status, 200, "{anonymous}");
    assert_eq!(
        anonymous,
        json!({"identity": "anonymous", "scopes": ["submit", "read", "review", "admin"], "bounds": {}})
    );
    let root = make(&ferry, None, json!({"name": "root", "scopes": ["admin"]})).await;
    let reader = make(
        &ferry,
        Some(&root),
        json!({"name": "reader-1", "scopes": ["read"], "group_prefix": "team-a/"}),
    )
    .await;
    let (status, me) = Api::with_token(&ferry.url, &reader).get("/v1/whoami").await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(
        me,
        json!({"identity": "reader-1", "scopes": ["read"], "bounds": {"group_prefix": "team-a/"}})
    );
    let (status, refused) = ferry.api().get("/v1/whoami").await;
    assert_eq!(status, 401, "{refused}");
    assert_eq!(refused["error"]["code"], "unauthorized");
    let (status, _) = Api::with_token(&ferry.url, "not-a-token-of-this-ferry")
        .get("/v1/whoami")
        .await;
    assert_eq!(status, 401);
}

/// One stateless (2026-07-28) MCP request with `token`: no session to
/// open first, so each scope's token asks on its own.
async fn mcp(ferry: &Ferry, token: Option<&str>, method: &str, params: Value) -> (u16, Value) {
    let mut params = params;
    params["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    params["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = client
        .post(format!("{}/mcp", ferry.url))
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = params["name"].as_str() {
        request = request.header("mcp-name", name);
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.body(body.to_string()).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Answers the next invocation the tool hears with `text`, as the tool
/// would through its callback.
async fn answer_next(ferry: &Ferry, tool: &TestTool, text: &str) {
    let invoked = tool.next_invocation().await.invocation;
    let result = json!({"type": "tool_result", "group_id": invoked.group_id,
                        "id": invoked.id, "text": text});
    let (status, answer) = ferry.api().post(&invoked.callback_url, &result).await;
    assert_eq!(status, 200, "{answer}");
}

/// The same scopes through the other fronts: MCP and OXP submit only with
/// `submit`, ACP's permission answers decide only with `review` and
/// withdraw only with `submit`, each refusing in its own shape; none
/// answers without a token, and no refusal changes anything. The
/// dashboard's page holds no data and is served to anyone; what it polls
/// is the native API, in the matrix above.
#[tokio::test(flavor = "multi_thread")]
async fn each_front_allows_exactly_its_scopes_operations_and_refusals_leave_no_trace() {
    let tool = tool().await;
    let (ferry, root) = locked_ferry(&tool).await;
    let mut tokens = vec![];
    for scope in ["submit", "read", "review", "admin"] {
        let token = make(
            &ferry,
            Some(&root),
            json!({"name": scope, "scopes": [scope]}),
        )
        .await;
        tokens.push((scope, token));
    }
    let submitter = tokens[0].1.clone();
    // A permission request in the submitter's own thread, to withdraw.
    let own =
        json!({"operation": "deploy", "arguments": {}, "group_id": "mine", "id": "own-gated"});
    let (status, reply) = send(
        &ferry,
        Some(&submitter),
        Method::POST,
        "/v1/calls",
        Some(&own),
    )
    .await;
    assert_eq!(
        (status, reply["status"].as_str()),
        (202, Some("pending_approval")),
        "{reply}"
    );
    let before = footprint(&ferry, &root).await;

    let call_params = |id: &str| {
        json!({"name": "ops.look", "arguments": {},
               "_meta": {"io.ferry/group_id": format!("mcp-{id}"), "io.ferry/id": id}})
    };
    let oxp_call =
        |id: &str| json!({"request": {"tool_id": "ops.look", "input": {}, "call_id": id}});
    let select = json!({"jsonrpc": "2.0", "id": "ferry-permission:gated",
                        "result": {"outcome": {"outcome": "selected", "optionId": "reject_once"}}});
    let withdraw = json!({"jsonrpc": "2.0", "id": "ferry-permission:own-gated",
                          "result": {"outcome": {"outcome": "cancelled"}}});
    for (scope, token) in &tokens {
        // Listing tools is never refused on MCP and OXP, but as the native
        // `/v1/tools` (`submit` or `read`), only those scopes see tools:
        // a reviewer or an administrator may call none.
        let sees = ["submit", "read"].contains(scope);
        let (status, listed) = mcp(&ferry, Some(token), "tools/list", json!({})).await;
        assert_eq!(status, 200, "{scope}: {listed}");
        let tools = listed["result"]["tools"].as_array().expect("a list");
        assert_eq!(!tools.is_empty(), sees, "{scope}: {listed}");
        let (status, listed) = send(&ferry, Some(token), Method::GET, "/oxp/tools", None).await;
        assert_eq!(status, 200, "{scope}: {listed}");
        let items = listed["items"].as_array().expect("a list");
        assert_eq!(!items.is_empty(), sees, "{scope}: {listed}");
        if *scope == "submit" {
            continue;
        }
        // A refused MCP call is a tool error the model can read.
        let (status, refused) = mcp(
            &ferry,
            Some(token),
            "tools/call",
            call_params(&format!("{scope}-1")),
        )
        .await;
        assert_eq!(status, 200, "{scope}: {refused}");
        let result = &refused["result"];
        assert_eq!(result["isError"], true, "{scope}: {refused}");
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains("scope this needs"), "{scope}: {text}");
        // OXP's refusal is its `ServerErrorResponse`.
        let (status, refused) = send(
            &ferry,
            Some(token),
            Method::POST,
            "/oxp/tools/call",
            Some(&oxp_call(&format!("oxp-{scope}"))),
        )
        .await;
        assert_eq!(status, 400, "{scope}: {refused}");
        assert_eq!(
            refused["message"], "This credential may not make this call",
            "{scope}: {refused}"
        );
        // ACP: withdrawing is the submitter's, in its own thread.
        let (status, refused) = send(
            &ferry,
            Some(token),
            Method::POST,
            "/v1/threads/mine/acp",
            Some(&withdraw),
        )
        .await;
        assert_eq!(status, 403, "{scope}: {refused}");
        assert_eq!(refused["id"], "ferry-permission:own-gated", "{refused}");
        assert!(refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("scope this needs")));
        // Who can neither decide nor withdraw learns nothing of which
        // calls Ferry asked about: a call it never asked about is refused
        // the same way.
        if ["read", "admin"].contains(scope) {
            let never = json!({"jsonrpc": "2.0", "id": "ferry-permission:never-asked",
                               "result": {"outcome": {"outcome": "cancelled"}}});
            let (status, refused) = send(
                &ferry,
                Some(token),
                Method::POST,
                "/v1/threads/shared/acp",
                Some(&never),
            )
            .await;
            assert_eq!(status, 403, "{scope}: {refused}");
        }
    }
    // ACP: deciding is the reviewer's. The submitter is refused at the
    // thread (not its own) in the native shape, before any JSON-RPC.
    for (scope, token) in tokens.iter().filter(|(s, _)| *s != "review") {
        let (status, refused) = send(
            &ferry,
            Some(token),
            Method::POST,
            "/v1/threads/shared/acp",
            Some(&select),
        )
        .await;
        assert_eq!(status, 403, "{scope}: {refused}");
        match *scope {
            "submit" => assert_eq!(refused["error"]["code"], "forbidden", "{refused}"),
            _ => assert_eq!(refused["jsonrpc"], "2.0", "{scope}: {refused}"),
        }
    }
    // Without a token, each front answers 401 in its own shape.
    let (status, refused) = mcp(&ferry, None, "tools/list", json!({})).await;
    assert_eq!(status, 401, "{refused}");
    assert!(
        refused["error"]["code"].is_i64(),
        "a JSON-RPC error: {refused}"
    );
    let (status, refused) = mcp(&ferry, None, "tools/call", call_params("anonymous")).await;
    assert_eq!(status, 401, "{refused}");
    for (method, path, body) in [
        (Method::GET, "/oxp/tools", None),
        (
            Method::POST,
            "/oxp/tools/call",
            Some(oxp_call("oxp-anonymous")),
        ),
    ] {
        let (status, refused) = send(&ferry, None, method, path, body.as_ref()).await;
        assert_eq!(status, 401, "{path}: {refused}");
        assert_eq!(refused["message"], "Authentication is required");
    }
    for (path, body) in [
        ("/v1/threads/shared/acp", &select),
        ("/v1/threads/mine/acp", &withdraw),
    ] {
        let (status, _) = send(&ferry, None, Method::POST, path, Some(body)).await;
        assert_eq!(status, 401, "{path}");
    }
    assert_eq!(
        footprint(&ferry, &root).await,
        before,
        "a refused request changed something"
    );

    // The dashboard's page: served without a token, as it holds no data.
    let (status, page) = send(&ferry, None, Method::GET, "/ui", None).await;
    assert_eq!(status, 200);
    assert!(page.as_str().is_some_and(|p| p.contains("<html")), "{page}");

    // What each scope is allowed: the submitter's calls run and answer.
    let (called, ()) = tokio::join!(
        mcp(&ferry, Some(&submitter), "tools/call", call_params("s-1")),
        answer_next(&ferry, &tool, "from mcp")
    );
    assert_eq!(called.0, 200, "{}", called.1);
    assert_ne!(called.1["result"]["isError"], true, "{}", called.1);
    let oxp_submitted = oxp_call("oxp-submit");
    let ((status, called), ()) = tokio::join!(
        send(
            &ferry,
            Some(&submitter),
            Method::POST,
            "/oxp/tools/call",
            Some(&oxp_submitted)
        ),
        answer_next(&ferry, &tool, "from oxp")
    );
    assert_eq!(status, 200, "{called}");
    assert_eq!(called["result"]["success"], true, "{called}");
    let (status, answer) = send(
        &ferry,
        Some(&submitter),
        Method::POST,
        "/v1/threads/mine/acp",
        Some(&withdraw),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let reviewer = &tokens[2].1;
    let (status, answer) = send(
        &ferry,
        Some(reviewer),
        Method::POST,
        "/v1/threads/shared/acp",
        Some(&select),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let (_, call) = send(
        &ferry,
        Some(&root),
        Method::GET,
        "/v1/threads/shared/calls/gated",
        None,
    )
    .await;
    assert_eq!(call["status"], "rejected", "{call}");
}
