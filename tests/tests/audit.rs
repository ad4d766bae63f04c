//! The audit log (`GET /v1/audit`, `ferry audit tail`): rap-1 asks that
//! "Runtimes SHOULD maintain audit logs of tool invocations, including
//! operation, timestamp, and outcome"; Ferry records who submitted each
//! call, who decided each approval, every toolset and token change and
//! refused credentials, durably, once per action.

use std::collections::HashMap;
use std::time::Duration;

use ferry_tests::api::seg;
use ferry_tests::ferry::cli;
use ferry_tests::{eventually, Api, Ferry, FerryOptions, TestTool};
use serde_json::{json, Value};

const ROOT: &str = "audit-root-token-0123456789";

/// A tool server with `deploy` (destructive: gated) and `look`.
async fn tool() -> TestTool {
    TestTool::with_manifest(ferry_tests::cases::ops_manifest()).await
}

async fn ferry_with(tool: &TestTool) -> Ferry {
    Ferry::start(FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::default().api_token(ROOT)
    })
    .await
}

fn result(g: &str, id: &str, text: &str) -> Value {
    json!({"type": "tool_result", "group_id": g, "id": id, "text": text})
}

/// Every entry of the log, read page by page as `ferry audit tail` does.
async fn entries(api: &Api, query: &str) -> Vec<Value> {
    let (mut since, mut all) = (0u64, vec![]);
    loop {
        let path = format!("/v1/audit?since={since}&limit=50{query}");
        let (status, page) = api.get(&path).await;
        assert_eq!(status, 200, "{page}");
        let records = page["records"].as_array().expect("records").clone();
        since = page["next"].as_u64().expect("next");
        if records.is_empty() {
            return all;
        }
        all.extend(records);
    }
}

/// The entries of one kind, as `(identity, subject or id, outcome)`.
fn of_kind(all: &[Value], kind: &str) -> Vec<(String, String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    all.iter()
        .filter(|e| e["kind"] == kind)
        .map(|e| {
            let what = if e["subject"].is_string() {
                &e["subject"]
            } else {
                &e["id"]
            };
            (text(&e["identity"]), text(what), text(&e["outcome"]))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_log_says_who_submitted_decided_and_changed_what() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let root = Api::with_token(&ferry.url, ROOT);
    let agent = Api::with_token(
        &ferry.url,
        &root
            .make_token(json!({"name": "agent-7", "scopes": ["submit", "read"]}))
            .await,
    );
    let reviewer = Api::with_token(
        &ferry.url,
        &root
            .make_token(json!({"name": "ana", "scopes": ["review", "read"]}))
            .await,
    );

    // A call that completes, sent twice as an agent that lost the answer.
    let call = json!({"operation": "look", "arguments": {}, "group_id": "g", "id": "c1",
                      "user_id": "u1"});
    assert_eq!(agent.submit(call.clone()).await.0, 202);
    assert_eq!(agent.submit(call).await.0, 200);
    let url = tool.next_invocation().await.invocation.callback_url;
    agent.wait_for("g", "c1", "call_dispatched").await;
    for _ in 0..2 {
        let (status, _) = agent.post(&url, &result("g", "c1", "seen")).await;
        assert_eq!(status, 200);
    }
    // A gated call a reviewer rejects, and one they approve.
    for id in ["c2", "c3"] {
        let gated = json!({"operation": "deploy", "arguments": {}, "group_id": "g", "id": id});
        assert_eq!(agent.submit(gated).await.1["status"], "pending_approval");
    }
    for (id, option) in [("c2", "reject_once"), ("c3", "allow_once")] {
        let path = format!("/v1/approvals/g/{}", seg(id));
        let decision = json!({"optionId": option, "reason": "checked", "reviewer": "bob"});
        let (status, body) = reviewer.post(&path, &decision).await;
        assert_eq!(status, 200, "{body}");
    }
    tool.next_invocation().await;
    // Administration: a policy change and a toolset removed.
    let (status, body) = root
        .patch("/v1/toolsets/ops", &json!({"approval": "auto"}))
        .await;
    assert_eq!(status, 200, "{body}");
    // Refused: an unknown token, and an agent reading the audit log.
    let stranger = Api::with_token(&ferry.url, "not-a-token-of-this-ferry");
    assert_eq!(stranger.get("/v1/threads").await.0, 401);
    let (status, body) = agent.get("/v1/audit").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{body}"
    );

    let all = eventually("the refusals recorded", Duration::from_secs(10), || async {
        let all = entries(&root, "").await;
        (of_kind(&all, "auth_refused").len() == 2).then_some(all)
    })
    .await;
    let kinds: Vec<&str> = all.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    let seqs: Vec<u64> = all.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let created = of_kind(&all, "token_created");
    assert_eq!(created.len(), 2, "{kinds:?}");
    assert!(
        created.iter().all(|(who, _, _)| who == "api-token"),
        "{created:?}"
    );
    assert!(created[0].1.ends_with(" agent-7"), "{created:?}");
    // Each call once, however often its submission or result was sent.
    let submitted = of_kind(&all, "call_submitted");
    let ids: Vec<&str> = submitted.iter().map(|(_, id, _)| id.as_str()).collect();
    assert_eq!(ids, ["c1", "c2", "c3"], "{kinds:?}");
    assert!(submitted.iter().all(|(who, _, _)| who == "agent-7"));
    let first = all.iter().find(|e| e["kind"] == "call_submitted").unwrap();
    assert_eq!(first["operation"], "look");
    assert_eq!(first["tool"], "ops.look@1.0.0");
    assert_eq!(first["user_id"], "u1");
    assert_eq!(first["group_id"], "g");
    // The reviewer is the token's name; what they typed is no identity.
    let decided = of_kind(&all, "approval_decided");
    assert_eq!(
        decided,
        [
            ("ana".into(), "c2".into(), "reject_once".into()),
            ("ana".into(), "c3".into(), "allow_once".into())
        ]
    );
    let reason = all
        .iter()
        .find(|e| e["kind"] == "approval_decided")
        .unwrap();
    assert!(
        reason["detail"].as_str().unwrap().contains("checked"),
        "{reason}"
    );
    let settled = of_kind(&all, "call_settled");
    assert_eq!(
        settled,
        [
            ("tool".into(), "c1".into(), "completed".into()),
            ("ana".into(), "c2".into(), "rejected".into())
        ]
    );
    let policy = of_kind(&all, "policy_changed");
    assert_eq!(
        policy,
        [("api-token".into(), "ops@1.0.0".into(), String::new())]
    );
    // Recorded in the background, in either order.
    let mut refused: Vec<(String, String, String)> = all
        .iter()
        .filter(|e| e["kind"] == "auth_refused")
        .map(|e| {
            let field = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
            (field("identity"), field("detail"), field("outcome"))
        })
        .collect();
    refused.sort();
    assert_eq!(
        refused,
        [
            (
                "(an unknown or revoked token)".into(),
                "GET /v1/threads: unauthorized".into(),
                String::new()
            ),
            (
                "agent-7".into(),
                "GET /v1/audit: forbidden".into(),
                String::new()
            ),
        ]
    );
    // Entries reached only this process and the log: no secret in them.
    assert!(
        !serde_json::to_string(&all).unwrap().contains("ferry_"),
        "a secret"
    );

    // `kind` and `since`: a filter and a cursor.
    let tokens = entries(&root, "&kind=token_created,token_revoked").await;
    assert_eq!(tokens.len(), 2);
    let middle = all[all.len() / 2]["seq"].as_u64().unwrap();
    let (_, after) = root.get(&format!("/v1/audit?since={middle}")).await;
    let after = after["records"].as_array().unwrap();
    assert_eq!(
        after.len(),
        all.iter()
            .filter(|e| e["seq"].as_u64() > Some(middle))
            .count()
    );
    let at = all.last().unwrap()["at"].as_str().unwrap();
    let (status, from) = root.get(&format!("/v1/audit?since={at}")).await;
    assert_eq!(status, 200, "{from}");
    assert!(!from["records"].as_array().unwrap().is_empty(), "{from}");

    // `ferry audit tail` prints the same entries, one per line.
    let out = cli(&ferry.url, &["audit", "tail", "--kind", "call_submitted"])
        .env("FERRY_API_TOKEN", ROOT)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0]["id"], "c1");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_audit_queries_are_refused_by_name() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let root = Api::with_token(&ferry.url, ROOT);
    for (query, names) in [
        ("since=yesterday", "since"),
        ("kind=everything", "unknown audit kind"),
        ("limit=0", "limit"),
        ("limit=5000", "limit"),
        ("after=1", "unknown parameter"),
    ] {
        let (status, body) = root.get(&format!("/v1/audit?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{query}: {message}");
    }
    let out = cli(&ferry.url, &["audit", "tail", "--kind", "nope"])
        .env("FERRY_API_TOKEN", ROOT)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown audit kind"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Refusals are anyone's to send: a flood of them is recorded at a bounded
/// rate (20 in 10 s), not one write each.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_refused_tokens_is_recorded_at_a_bounded_rate() {
    let tool = tool().await;
    let ferry = ferry_with(&tool).await;
    let root = Api::with_token(&ferry.url, ROOT);
    let stranger = Api::with_token(&ferry.url, "not-a-token-of-this-ferry");
    for _ in 0..60 {
        assert_eq!(stranger.get("/v1/threads").await.0, 401);
    }
    let refused = eventually(
        "twenty refusals recorded",
        Duration::from_secs(10),
        || async {
            let all = entries(&root, "&kind=auth_refused").await;
            (all.len() >= 20).then_some(all)
        },
    )
    .await;
    assert_eq!(refused.len(), 20, "{refused:?}");
}

/// Every action Ferry acknowledged before a kill -9 is in the log after
/// it, once; so is every action a client retried after it.
#[tokio::test(flavor = "multi_thread")]
async fn after_kill_9_the_log_holds_each_acknowledged_action_once() {
    let tool = tool().await;
    let mut ferry = ferry_with(&tool).await;
    let submit = |i: usize| {
        json!({"operation": "look", "arguments": {}, "group_id": format!("g{}", i % 4),
               "id": format!("c{i}")})
    };
    // Sent as agents do, which see a cut connection rather than a panic.
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut sent = tokio::task::JoinSet::new();
    for i in 0..40 {
        let request = client
            .post(format!("{}/v1/calls", ferry.url))
            .bearer_auth(ROOT)
            .header("content-type", "application/json")
            .body(submit(i).to_string());
        sent.spawn(async move {
            let status = request.send().await.map(|r| r.status().as_u16());
            (i, status.unwrap_or(0))
        });
    }
    // Cut off while the submissions are in flight.
    tool.next_invocation().await;
    ferry.kill9();
    let mut acknowledged = vec![];
    while let Some(done) = sent.join_next().await {
        let (i, status) = done.unwrap();
        if status == 202 || status == 200 {
            acknowledged.push(format!("c{i}"));
        }
    }
    assert!(
        !acknowledged.is_empty(),
        "nothing was acknowledged before the kill"
    );
    ferry.restart().await;
    let root = Api::with_token(&ferry.url, ROOT);
    let logged = entries(&root, "&kind=call_submitted").await;
    let mut times: HashMap<String, usize> = HashMap::new();
    for entry in &logged {
        *times
            .entry(entry["id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    for id in &acknowledged {
        assert_eq!(times.get(id), Some(&1), "{id} acknowledged: {times:?}");
    }
    assert!(times.values().all(|&n| n == 1), "{times:?}");
    // The agents retry what they did not hear back about: every call is
    // then in the log once.
    for i in 0..40 {
        let (status, body) = root.submit(submit(i)).await;
        assert!(status == 200 || status == 202, "{body}");
    }
    let logged = entries(&root, "&kind=call_submitted").await;
    let mut ids: Vec<&str> = logged.iter().map(|e| e["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    let mut want: Vec<String> = (0..40).map(|i| format!("c{i}")).collect();
    want.sort_unstable();
    assert_eq!(ids, want);
}

/// `--audit-log FILE`: each entry also as a line of JSON, for a log
/// shipper, in a file only its owner reads.
#[tokio::test(flavor = "multi_thread")]
async fn entries_are_also_written_as_json_lines_to_the_audit_log_file() {
    use std::os::unix::fs::PermissionsExt;
    let tool = tool().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let ferry = Ferry::start(FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::default()
            .api_token(ROOT)
            .with_args(&["--audit-log", path.to_str().unwrap()])
    })
    .await;
    let root = Api::with_token(&ferry.url, ROOT);
    let call = json!({"operation": "look", "arguments": {}, "group_id": "g", "id": "c1"});
    assert_eq!(root.submit(call).await.0, 202);
    let lines = eventually("the submission's line", Duration::from_secs(10), || async {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a line of JSON"))
            .collect();
        lines
            .iter()
            .any(|l| l["kind"] == "call_submitted")
            .then_some(lines)
    })
    .await;
    let submitted = lines
        .iter()
        .find(|l| l["kind"] == "call_submitted")
        .unwrap();
    assert_eq!(
        (&submitted["id"], &submitted["identity"]),
        (&json!("c1"), &json!("api-token"))
    );
    // The same entry as the log's, by its key.
    let logged = entries(&root, "&kind=call_submitted").await;
    assert_eq!(logged[0]["key"], submitted["key"]);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
}

#[test]
fn an_audit_log_that_cannot_be_opened_stops_start_up_by_name() {
    let (status, stderr) =
        ferry_tests::ferry::refused_serve(&["--audit-log", "/nonexistent/dir/audit.jsonl"]);
    assert!(!status.success());
    assert!(stderr.contains("--audit-log"), "{stderr}");
}
