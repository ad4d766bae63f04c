//! Long-running tools as MCP tasks backed by the durable call, also
//! across `kill -9`.

use super::*;

#[tokio::test]
async fn long_running_tools_run_as_tasks_backed_by_the_durable_call() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let mut raw = Raw::new(&ferry);
    raw.initialize("2025-11-25").await;
    let listed = raw.rpc("tools/list", json!({})).await.body["result"]["tools"].clone();
    let sleep = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "sleep")
        .unwrap()
        .clone();
    assert_eq!(sleep["execution"]["taskSupport"], "optional");
    let echo = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo");
    assert!(echo.unwrap().get("execution").is_none());

    let created = raw
        .rpc(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 0.5}, "task": {"ttl": 60000}}),
        )
        .await;
    let task = created.body["result"]["task"].clone();
    assert_eq!(task["status"], "working", "{}", created.body);
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let got = raw.rpc("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(got.body["result"]["taskId"], task_id.as_str());
    let listed = raw.rpc("tasks/list", json!({})).await;
    assert_eq!(
        listed.body["result"]["tasks"][0]["taskId"],
        task_id.as_str()
    );

    // A client that went away comes back (a new session) for the result.
    let mut again = Raw::new(&ferry);
    again.initialize("2025-11-25").await;
    let result = again.rpc("tasks/result", json!({"taskId": task_id})).await;
    let result = &result.body["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        task_id.as_str()
    );
    let done = again.rpc("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(done.body["result"]["status"], "completed");
    let (_, kinds) = events_of(&api, result).await;
    assert_eq!(kinds, ["call_accepted", "call_dispatched", "tool_result"]);

    // Cancelling a running task cancels the durable call.
    let long = raw
        .rpc(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 600}, "task": {}}),
        )
        .await;
    let long_id = long.body["result"]["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cancelled = raw.rpc("tasks/cancel", json!({"taskId": long_id})).await;
    assert_eq!(
        cancelled.body["result"]["status"], "cancelled",
        "{}",
        cancelled.body
    );
    let again = raw.rpc("tasks/cancel", json!({"taskId": long_id})).await;
    assert_eq!(again.body["error"]["code"], -32602);
    let unknown = raw.rpc("tasks/get", json!({"taskId": "bm9wZQ"})).await;
    assert_eq!(unknown.body["error"]["code"], -32602);
    // Only longRunning tools take a task.
    let refused = raw
        .rpc(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}, "task": {}}),
        )
        .await;
    // taskSupport "forbidden": Method not found.
    assert_eq!(refused.body["error"]["code"], -32601);
    // An unknown tool asked for as a task is an unknown tool.
    let unknown = raw
        .rpc(
            "tools/call",
            json!({"name": "nope", "arguments": {}, "task": {}}),
        )
        .await;
    assert_eq!(unknown.body["error"]["code"], -32602, "{}", unknown.body);
    // A longRunning tool named as `Toolset.tool` takes a task too.
    let qualified = raw
        .rpc(
            "tools/call",
            json!({"name": "demo.sleep", "arguments": {"seconds": 0.1}, "task": {}}),
        )
        .await;
    assert_eq!(
        qualified.body["result"]["task"]["status"], "working",
        "{}",
        qualified.body
    );

    // A `task` that is not an object (2025-11-25: `{ttl?}`) is refused,
    // and no call is made: the client meant a task.
    let before = raw.rpc("tasks/list", json!({})).await.body["result"]["tasks"]
        .as_array()
        .unwrap()
        .len();
    let session = raw.session.as_deref().unwrap();
    let session_thread = ferry_fronts::mcp::thread_of_session(session);
    let thread = format!("/v1/threads/{}/calls", seg(&session_thread));
    let (_, calls_before) = ferry.api().get(&thread).await;
    let malformed = raw
        .rpc(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 0.1}, "task": "yes"}),
        )
        .await;
    assert_eq!(
        malformed.body["error"]["code"], -32602,
        "{}",
        malformed.body
    );
    // The same calls as before (the earlier task's call may have moved on
    // meanwhile: compare ids, not states).
    let ids = |calls: &Value| -> Vec<Value> {
        calls["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].clone())
            .collect()
    };
    assert_eq!(ids(&ferry.api().get(&thread).await.1), ids(&calls_before));

    // tasks/list pages like tools/list; "Invalid cursors SHOULD result in
    // an error with code -32602 (Invalid params)."
    let garbage = raw.rpc("tasks/list", json!({"cursor": "garbage!!"})).await;
    assert_eq!(garbage.body["error"]["code"], -32602, "{}", garbage.body);
    let unknown = raw.rpc("tasks/list", json!({"cursor": "bm9wZQ"})).await;
    assert_eq!(unknown.body["error"]["code"], -32602, "{}", unknown.body);
    for _ in before..51 {
        let made = raw
            .rpc(
                "tools/call",
                json!({"name": "sleep", "arguments": {"seconds": 0}, "task": {}}),
            )
            .await;
        assert!(made.body["result"]["task"].is_object(), "{}", made.body);
    }
    let first = raw.rpc("tasks/list", json!({})).await.body["result"].clone();
    assert_eq!(first["tasks"].as_array().unwrap().len(), 50, "{first}");
    let cursor = first["nextCursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let second = raw.rpc("tasks/list", json!({"cursor": cursor})).await.body["result"].clone();
    let rest = second["tasks"].as_array().unwrap();
    assert_eq!(rest.len(), 1, "{second}");
    assert!(second.get("nextCursor").is_none(), "{second}");
    let seen: std::collections::HashSet<&str> = first["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest)
        .map(|t| t["taskId"].as_str().unwrap())
        .collect();
    assert_eq!(seen.len(), 51);
}

/// A task outlives the process that created it and the session that asked:
/// after `kill -9` and a restart, the tool's callback lands and a new
/// session reads the result.
#[tokio::test]
async fn a_task_survives_kill_9_and_a_new_session_reads_its_result() {
    let tool = TestTool::with_manifest(json!({"name": "slow", "tools": [
        {"name": "job", "description": "Takes its time.", "inputSchema": {"type": "object"},
         "annotations": {"longRunning": true}}
    ]}))
    .await;
    let mut ferry = Ferry::with_tool(&tool).await;
    let mut raw = Raw::new(&ferry);
    raw.initialize("2025-11-25").await;
    let created = raw
        .rpc(
            "tools/call",
            json!({"name": "job", "arguments": {}, "task": {}}),
        )
        .await;
    let task_id = created.body["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {}", created.body))
        .to_owned();
    let invoked = tool.next_invocation().await.invocation;

    ferry.restart().await;
    let stale = raw.rpc("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(stale.status, 404, "sessions do not survive a restart");
    raw.initialize("2025-11-25").await;
    let waiting = raw.rpc("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(
        waiting.body["result"]["status"], "working",
        "{}",
        waiting.body
    );

    let api = ferry.api();
    let callback = json!({"type": "tool_result", "group_id": invoked.group_id,
                          "id": invoked.id, "text": "done after the restart"});
    let (status, _) = api.post(&invoked.callback_url, &callback).await;
    assert_eq!(status, 200);
    let result = raw.rpc("tasks/result", json!({"taskId": task_id})).await;
    assert_eq!(
        text_of(&result.body["result"]),
        "done after the restart",
        "{}",
        result.body
    );
    let done = raw.rpc("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(done.body["result"]["status"], "completed");
}

/// A task is read by who submits calls (its own) or reads threads: a
/// reviewer's or an administrator's token reaches every thread, and reads
/// no task in any of them.
#[tokio::test]
async fn only_submitters_and_readers_follow_tasks() {
    let ferry = Ferry::with_demo().await;
    let admin = ferry
        .api()
        .make_token(json!({"name": "ops", "scopes": ["admin"]}))
        .await;
    let operator = ferry_tests::Api::with_token(&ferry.url, &admin);
    let agent = operator
        .make_token(json!({"name": "agent", "scopes": ["submit"]}))
        .await;
    let mut submitter = Raw::with_bearer(&ferry, &agent);
    submitter.initialize("2025-11-25").await;
    let created = submitter
        .rpc(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 600}, "task": {}}),
        )
        .await;
    let task_id = created.body["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", created.body))
        .to_owned();
    let got = submitter.rpc("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(got.body["result"]["status"], "working", "{}", got.body);
    for (name, scopes) in [
        ("ana", json!(["review"])),
        ("ops2", json!(["admin"])),
        ("rd", json!(["read"])),
    ] {
        let token = operator
            .make_token(json!({"name": name, "scopes": scopes}))
            .await;
        let mut other = Raw::with_bearer(&ferry, &token);
        other.initialize("2025-11-25").await;
        let got = other.rpc("tasks/get", json!({"taskId": task_id})).await;
        if name == "rd" {
            assert_eq!(
                got.body["result"]["taskId"],
                task_id.as_str(),
                "{}",
                got.body
            );
        } else {
            assert_eq!(got.body["error"]["code"], -32602, "{name}: {}", got.body);
            let result = other.rpc("tasks/result", json!({"taskId": task_id})).await;
            assert_eq!(
                result.body["error"]["code"], -32602,
                "{name}: {}",
                result.body
            );
        }
    }
    let cancelled = submitter
        .rpc("tasks/cancel", json!({"taskId": task_id}))
        .await;
    assert_eq!(
        cancelled.body["result"]["status"], "cancelled",
        "{}",
        cancelled.body
    );
}
