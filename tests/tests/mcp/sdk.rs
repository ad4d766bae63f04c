//! The official MCP Python SDK against a real `ferry serve`: listing and
//! calling tools in both modes, and gated calls a reviewer decides.

use super::*;

async fn the_sdk_lists_and_calls_tools(mode: &str, version: &str) {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let out = sdk_client(&ferry.url, mode, "basic", &[], |_| {}).await;
    assert_eq!(out["protocol_version"], version);
    assert_eq!(out["server"]["name"], "ferry");

    let tools = out["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "tools/list is ordered by name");
    for expected in ["cancel_subscription", "drop_table", "echo", "fail", "sleep"] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    assert!(tools
        .iter()
        .all(|t| t["description"].as_str().is_some_and(|d| !d.is_empty())
            && t["inputSchema"]["type"] == "object"));
    let tool = |n: &str| tools.iter().find(|t| t["name"] == n).unwrap().clone();
    assert_eq!(tool("drop_table")["annotations"]["destructiveHint"], true);
    assert_eq!(tool("sleep")["annotations"]["readOnlyHint"], true);
    assert_eq!(tool("sleep")["annotations"]["idempotentHint"], true);

    let echo = &out["echo"];
    assert_eq!(
        (text_of(echo), echo["isError"].as_bool()),
        ("hello from mcp", Some(false))
    );
    let (echo_thread, kinds) = events_of(&api, echo).await;
    // (`call_dispatched` may be absent: the tool's callback can beat the
    // acknowledgement of its invocation.)
    assert_eq!(kinds.first().map(String::as_str), Some("call_accepted"));
    assert_eq!(kinds.last().map(String::as_str), Some("tool_result"));
    assert_eq!(kinds.iter().filter(|k| *k == "tool_result").count(), 1);

    let fail = &out["fail"];
    assert_eq!(fail["isError"], true, "{fail}");
    assert!(text_of(fail).starts_with("Error: "), "{fail}");
    let (fail_thread, _) = events_of(&api, fail).await;

    let invalid = &out["invalid"];
    assert_eq!(invalid["isError"], true, "{invalid}");
    let said = text_of(invalid);
    assert!(said.contains("text") && said.contains("txt"), "{said}");
    assert_eq!(out["unknown"]["code"], -32602);

    if version == MODERN {
        // Stateless: each call without `_meta` thread gets its own thread.
        assert_ne!(echo_thread, fail_thread);
    } else {
        // Both calls ran in the session's thread.
        assert_eq!(echo_thread, fail_thread);
        assert!(echo_thread.starts_with("mcp-"), "{echo_thread}");
    }
    // The invalid call and the unknown tool recorded nothing.
    let threads = if version == MODERN { 2 } else { 1 };
    assert_eq!(thread_count(&api).await, threads);
}

#[tokio::test]
async fn the_python_sdk_in_auto_mode_speaks_the_stateless_revision() {
    the_sdk_lists_and_calls_tools("auto", MODERN).await;
}

#[tokio::test]
async fn the_python_sdk_in_legacy_mode_initializes_a_session() {
    the_sdk_lists_and_calls_tools("legacy", "2025-11-25").await;
}

/// An auto-mode client whose only stateless revision Ferry does not speak
/// probes `server/discover`, is told Ferry's revisions (-32022), and falls
/// back to `initialize`.
#[tokio::test]
async fn an_auto_client_falls_back_to_initialize_when_the_probe_fails() {
    the_sdk_lists_and_calls_tools("future", "2025-11-25").await;
}

/// The SDK calls `drop_table` (gated) in a thread it names; once its
/// progress says it waits for a reviewer, the reviewer decides.
async fn gated(mode: &str, option: &str) -> (Value, Api, Ferry) {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let reviewer = api.clone();
    let decided = tokio::sync::Mutex::new(None);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let option = option.to_owned();
    let decide = async {
        // The first progress notification: the call waits for approval.
        let waiting: Value = rx.recv().await.expect("a progress line");
        let (status, body) = reviewer.get("/v1/approvals?status=pending").await;
        assert_eq!(status, 200);
        let pending = body["approvals"].as_array().unwrap().clone();
        assert_eq!(pending.len(), 1, "{body}");
        let (g, id) = (
            pending[0]["group_id"].as_str().unwrap().to_owned(),
            pending[0]["id"].as_str().unwrap().to_owned(),
        );
        let (status, _) = reviewer
            .post(
                &format!("/v1/approvals/{}/{}", seg(&g), seg(&id)),
                &json!({"optionId": option, "reviewer": "ana"}),
            )
            .await;
        assert_eq!(status, 200);
        *decided.lock().await = Some(waiting);
    };
    let client = sdk_client(&ferry.url, mode, "gated", &["review-thread"], |line| {
        let _ = tx.send(line);
    });
    let (out, ()) = tokio::join!(client, decide);
    let waiting = decided.lock().await.take().unwrap();
    assert!(
        waiting["waiting"]
            .as_str()
            .is_some_and(|m| m.contains("reviewer")),
        "{waiting}"
    );
    (out, api, ferry)
}

#[tokio::test]
async fn a_gated_call_reports_progress_while_it_waits_then_runs_once_approved() {
    let (out, api, _ferry) = gated("auto", "allow_once").await;
    let result = &out["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["_meta"]["io.ferry/group_id"], "review-thread");
    assert!(!out["progress"].as_array().unwrap().is_empty());
    let (_, kinds) = events_of(&api, result).await;
    assert_eq!(
        kinds[..3],
        ["call_accepted", "approval_requested", "approval_decided"]
    );
    assert_eq!(kinds.last().map(String::as_str), Some("tool_result"));
    let id = result["_meta"]["io.ferry/id"].as_str().unwrap();
    let (_, call) = api.call("review-thread", id).await;
    assert_eq!(call["user_id"], "mcp-user", "{call}");
}

#[tokio::test]
async fn a_rejected_gated_call_answers_is_error_saying_so() {
    let (out, _api, _ferry) = gated("legacy", "reject_once").await;
    let result = &out["result"];
    assert_eq!(result["isError"], true, "{result}");
    assert!(text_of(result).contains("rejected"), "{result}");
}

/// A token bounded to `demo.echo`: the SDK's `tools/list` shows only it
/// (and the built-in), and a call to another tool is refused without a
/// trace.
#[tokio::test]
async fn a_bounded_tokens_tools_list_shows_only_its_tools() {
    let ferry = Ferry::with_demo().await;
    let root = ferry
        .api()
        .make_token(json!({"name": "root", "scopes": ["admin", "read"]}))
        .await;
    let agent = Api::with_token(&ferry.url, &root)
        .make_token(json!({"name": "agent", "scopes": ["submit", "read"], "tools": ["demo.echo"]}))
        .await;
    let out = sdk_client(&ferry.url, "legacy", "list", &["--bearer", &agent], |_| {}).await;
    let names: Vec<&str> = out["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["cancel_subscription", "echo"], "{out}");
    let refused = &out["drop_table"];
    assert!(
        refused["isError"] == true || refused["code"].is_number(),
        "{refused}"
    );
    assert_eq!(thread_count(&Api::with_token(&ferry.url, &root)).await, 0);
}
