//! The ACP stream at `/v1/threads/{g}/acp`: a gated call's whole life as
//! `session/update` notifications and a `session/request_permission`
//! request, every message validated against the official ACP JSON Schema
//! (npm `@agentclientprotocol/sdk`, `schema/v1/schema.json`) with Python's
//! `jsonschema`; the client's POSTed response deciding the approval or
//! cancelling the call; resuming with `Last-Event-ID`; and bad responses
//! answered as JSON-RPC errors that change nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_tests::{Ack, Ferry, TestTool};
use futures::future::join_all;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

fn installed(relative: &str) -> PathBuf {
    let path = workspace().join(relative);
    assert!(
        path.exists(),
        "{} is missing: run `bash ops/scripts/setup-oxp.sh`",
        path.display()
    );
    path
}

/// Validates `messages` against the official schema; returns the errors.
async fn schema_errors(messages: &[Value]) -> Vec<Value> {
    let schema =
        installed("target/acp/node_modules/@agentclientprotocol/sdk/schema/v1/schema.json");
    let mut child = tokio::process::Command::new(installed("target/py/bin/python"))
        .arg(workspace().join("tests/py/acp_validate.py"))
        .arg(schema)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running the validator");
    let mut input = String::new();
    for m in messages {
        input.push_str(&m.to_string());
        input.push('\n');
    }
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success(), "validator failed");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["checked"], messages.len(), "{report}");
    report["errors"].as_array().unwrap().clone()
}

/// An open ACP stream: SSE frames parsed into `(id, message)`.
struct Acp {
    response: reqwest::Response,
    buffer: String,
}

impl Acp {
    async fn open(ferry: &Ferry, group_id: &str, last_event_id: Option<u64>) -> Acp {
        let mut request =
            reqwest::Client::new().get(format!("{}/v1/threads/{group_id}/acp", ferry.url));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        Acp {
            response,
            buffer: String::new(),
        }
    }

    /// The next message and its SSE id; panics after 20 s.
    async fn next(&mut self) -> (u64, Value) {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let frame: String = self.buffer.drain(..end + 2).collect();
                let mut id = None;
                let mut data = String::new();
                for line in frame.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = v.parse().ok();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if data.is_empty() {
                    continue; // keep-alive comment
                }
                return (id.expect("an SSE id"), serde_json::from_str(&data).unwrap());
            }
            let chunk = tokio::time::timeout(Duration::from_secs(20), self.response.chunk())
                .await
                .expect("no ACP message within 20 s")
                .unwrap()
                .expect("stream ended");
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Messages up to and including the first that `done` accepts.
    async fn until(&mut self, done: impl Fn(&Value) -> bool) -> Vec<(u64, Value)> {
        let mut seen = vec![];
        loop {
            let (id, message) = self.next().await;
            let stop = done(&message);
            seen.push((id, message));
            if stop {
                return seen;
            }
        }
    }
}

fn update(m: &Value) -> &Value {
    &m["params"]["update"]
}

fn is_final_update(call: &'static str) -> impl Fn(&Value) -> bool {
    move |m| {
        let u = update(m);
        u["toolCallId"] == call && (u["status"] == "completed" || u["status"] == "failed")
    }
}

async fn submit(ferry: &Ferry, group_id: &str, id: &str, operation: &str, arguments: Value) {
    let (status, reply) = ferry
        .api()
        .submit(
            json!({"operation": operation, "arguments": arguments, "group_id": group_id, "id": id}),
        )
        .await;
    assert_eq!(status, 202, "{reply}");
}

/// Submits a `drop_table` call (gated) and waits until it asks for approval.
async fn ask(ferry: &Ferry, group_id: &str, id: &str) {
    submit(ferry, group_id, id, "drop_table", json!({"table": "t"})).await;
    ferry
        .api()
        .wait_for(group_id, id, "approval_requested")
        .await;
}

async fn respond(ferry: &Ferry, group_id: &str, body: &str) -> (u16, Option<Value>) {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/threads/{group_id}/acp", ferry.url))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).ok())
}

fn selected(request_id: &Value, option: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": request_id,
           "result": {"outcome": {"outcome": "selected", "optionId": option}}})
}

#[tokio::test]
async fn a_gated_calls_whole_life_validates_and_is_approved_over_acp() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    let mut acp = Acp::open(&ferry, "g-acp", None).await;
    submit(
        &ferry,
        "g-acp",
        "drop-1",
        "drop_table",
        json!({"table": "users"}),
    )
    .await;

    let asked = acp
        .until(|m| m["method"] == "session/request_permission")
        .await;
    let (_, created) = &asked[0];
    assert_eq!(created["method"], "session/update");
    assert_eq!(created["params"]["sessionId"], "g-acp");
    let u = update(created);
    assert_eq!(u["sessionUpdate"], "tool_call");
    assert_eq!(u["toolCallId"], "drop-1");
    assert_eq!(u["status"], "pending");
    assert_eq!(u["kind"], "delete");
    assert_eq!(u["rawInput"], json!({"table": "users"}));
    assert!(u["title"].as_str().is_some_and(|t| !t.is_empty()));
    let (_, request) = asked.last().unwrap();
    assert_eq!(request["params"]["toolCall"]["toolCallId"], "drop-1");
    let kinds: Vec<&Value> = request["params"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| &o["kind"])
        .collect();
    assert_eq!(
        kinds,
        ["allow_once", "allow_always", "reject_once", "reject_always"]
    );

    // The client answers; Ferry decides as the dashboard would.
    let answer = selected(&request["id"], "allow_once");
    let (status, body) = respond(&ferry, "g-acp", &answer.to_string()).await;
    assert_eq!(status, 202, "{body:?}");
    let rest = acp.until(is_final_update("drop-1")).await;
    let (_, last) = rest.last().unwrap();
    assert_eq!(update(last)["status"], "completed", "{last}");
    let text = &update(last)["content"][0]["content"]["text"];
    assert!(text.as_str().unwrap().contains("users"), "{last}");
    assert!(update(last)["rawOutput"].is_object());
    let (_, call) = api.call("g-acp", "drop-1").await;
    assert_eq!(call["approval"]["reviewer"], "acp", "{call}");
    assert_eq!(call["approval"]["option_id"], "allow_once");

    // SSE ids are the thread's event seqs, strictly increasing.
    let ids: Vec<u64> = asked.iter().chain(&rest).map(|(id, _)| *id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");

    // A diff result: the patch as text.
    submit(
        &ferry,
        "g-acp",
        "diff-1",
        "diff",
        json!({"path": "src/main.rs"}),
    )
    .await;
    let diff = acp.until(is_final_update("diff-1")).await;
    let (_, done) = diff.last().unwrap();
    let blocks = update(done)["content"].as_array().unwrap().clone();
    assert!(
        blocks.iter().any(|b| b["content"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("+++ src/main.rs"))),
        "{done}"
    );

    let mut everything: Vec<Value> = asked
        .into_iter()
        .chain(rest)
        .chain(diff)
        .map(|(_, m)| m)
        .collect();
    everything.push(answer);
    let errors = schema_errors(&everything).await;
    assert!(errors.is_empty(), "{errors:#?}");
    // The validator does reject what the schema forbids.
    let broken = json!({"jsonrpc": "2.0", "method": "session/update",
        "params": {"sessionId": "g", "update": {"sessionUpdate": "tool_call", "toolCallId": "x", "status": "waiting"}}});
    assert_eq!(schema_errors(&[broken]).await.len(), 1);
}

#[tokio::test]
async fn a_cancelled_outcome_cancels_the_call() {
    let ferry = Ferry::with_demo().await;
    let mut acp = Acp::open(&ferry, "g-cancel", None).await;
    submit(
        &ferry,
        "g-cancel",
        "drop-2",
        "drop_table",
        json!({"table": "t"}),
    )
    .await;
    let asked = acp
        .until(|m| m["method"] == "session/request_permission")
        .await;
    let request_id = &asked.last().unwrap().1["id"];
    let cancelled = json!({"jsonrpc": "2.0", "id": request_id, "result": {"outcome": {"outcome": "cancelled"}}});
    let (status, body) = respond(&ferry, "g-cancel", &cancelled.to_string()).await;
    assert_eq!(status, 202, "{body:?}");
    let rest = acp.until(is_final_update("drop-2")).await;
    assert_eq!(update(&rest.last().unwrap().1)["status"], "failed");
    let (_, call) = ferry.api().call("g-cancel", "drop-2").await;
    assert_eq!(call["status"], "cancelled", "{call}");

    let mut all: Vec<Value> = asked.into_iter().chain(rest).map(|(_, m)| m).collect();
    all.push(cancelled.clone());
    let errors = schema_errors(&all).await;
    assert!(errors.is_empty(), "{errors:#?}");

    // Answering again: a JSON-RPC error, nothing changes.
    let before = ferry.api().thread("g-cancel").await.1["last_seq"].clone();
    let (status, body) = respond(&ferry, "g-cancel", &cancelled.to_string()).await;
    assert_eq!(status, 409);
    assert!(body.unwrap()["error"]["code"].is_i64());
    assert_eq!(ferry.api().thread("g-cancel").await.1["last_seq"], before);
}

/// A permission Ferry asked for and that was decided since (by a reviewer,
/// or by the client's other answer) is answered 409 like the native API,
/// not "unknown request"; a `selected` and a `cancelled` sent at once
/// yield one outcome, the other answer refused (never both taken).
#[tokio::test]
async fn a_decided_permission_answered_again_is_409_and_races_take_one_outcome() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    ask(&ferry, "g-twice", "d1").await;
    let decide = json!({"optionId": "allow_once", "reviewer": "ana"});
    assert_eq!(api.post("/v1/approvals/g-twice/d1", &decide).await.0, 200);
    let id = json!("ferry-permission:d1");
    let cancelled =
        json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": {"outcome": "cancelled"}}});
    for body in [
        selected(&id, "reject_once").to_string(),
        cancelled.to_string(),
    ] {
        let (status, answer) = respond(&ferry, "g-twice", &body).await;
        assert_eq!(status, 409, "{body}: {answer:?}");
    }

    let calls: Vec<String> = (0..12).map(|i| format!("r{i}")).collect();
    for id in &calls {
        ask(&ferry, "g-race", id).await;
    }
    let answers = calls.iter().map(|id| {
        let id = json!(format!("ferry-permission:{id}"));
        let allow = selected(&id, "allow_once").to_string();
        let cancel =
            json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": {"outcome": "cancelled"}}})
                .to_string();
        let ferry = &ferry;
        async move {
            let (a, c) = tokio::join!(
                respond(ferry, "g-race", &allow),
                respond(ferry, "g-race", &cancel)
            );
            (a.0, c.0)
        }
    });
    for ((allowed, cancelled), id) in join_all(answers).await.into_iter().zip(&calls) {
        let mut statuses = [allowed, cancelled];
        statuses.sort();
        assert_eq!(statuses, [202, 409], "{id}");
        let decided = api.count("g-race", id, "approval_decided").await;
        let gone = api.count("g-race", id, "call_cancelled").await;
        assert_eq!(decided + gone, 1, "{id}: one outcome");
    }
}

#[tokio::test]
async fn the_stream_resumes_after_last_event_id() {
    let ferry = Ferry::with_demo().await;
    let mut acp = Acp::open(&ferry, "g-resume", None).await;
    submit(&ferry, "g-resume", "e1", "echo", json!({"text": "one"})).await;
    let first = acp.until(is_final_update("e1")).await;
    let resume_from = first[0].0;
    let mut resumed = Acp::open(&ferry, "g-resume", Some(resume_from)).await;
    let again = resumed.until(is_final_update("e1")).await;
    let expected: Vec<_> = first[1..].to_vec();
    assert_eq!(
        again, expected,
        "exactly the messages after id {resume_from}"
    );
}

/// A client that reads the thread from the start (a new window, a client
/// without `Last-Event-ID`) is asked only about calls that still wait: a
/// permission that was decided since would only be refused if answered.
#[tokio::test]
async fn a_replay_asks_only_about_calls_still_waiting_for_permission() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    ask(&ferry, "g-replay", "d1").await;
    let decide = json!({"optionId": "allow_once", "reviewer": "ana"});
    assert_eq!(api.post("/v1/approvals/g-replay/d1", &decide).await.0, 200);
    api.wait_for("g-replay", "d1", "tool_result").await;
    ask(&ferry, "g-replay", "d2").await;
    submit(&ferry, "g-replay", "e1", "echo", json!({"text": "last"})).await;

    let mut replay = Acp::open(&ferry, "g-replay", None).await;
    let all = replay.until(is_final_update("e1")).await;
    let asked: Vec<&Value> = all
        .iter()
        .filter(|(_, m)| m["method"] == "session/request_permission")
        .map(|(_, m)| &m["id"])
        .collect();
    assert_eq!(asked, [&json!("ferry-permission:d2")], "{all:#?}");
    // The decided call is still shown, from its creation to its result.
    let d1: Vec<&Value> = all
        .iter()
        .map(|(_, m)| update(m))
        .filter(|u| u["toolCallId"] == "d1")
        .collect();
    assert_eq!(d1.first().unwrap()["sessionUpdate"], "tool_call");
    assert_eq!(d1.last().unwrap()["status"], "completed", "{d1:#?}");

    // The request still asked is answered as on a live stream.
    let answer = selected(&json!("ferry-permission:d2"), "reject_once").to_string();
    assert_eq!(respond(&ferry, "g-replay", &answer).await.0, 202);
    let rest = replay.until(is_final_update("d2")).await;
    assert_eq!(update(&rest.last().unwrap().1)["status"], "failed");
}

#[tokio::test]
async fn bad_responses_are_json_rpc_errors_that_change_nothing() {
    let ferry = Ferry::with_demo().await;
    let api = ferry.api();
    ask(&ferry, "g-bad", "drop-3").await;
    let last_seq = || async { api.thread("g-bad").await.1["last_seq"].clone() };
    let before = last_seq().await;

    let unknown = selected(&json!("ferry-permission:nobody"), "allow_once").to_string();
    let foreign = selected(&json!(17), "allow_once").to_string();
    let wrong_option = selected(&json!("ferry-permission:drop-3"), "maybe").to_string();
    let no_outcome =
        json!({"jsonrpc": "2.0", "id": "ferry-permission:drop-3", "result": {}}).to_string();
    let a_request =
        json!({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {}}).to_string();
    // A client's notification (no id): not served here, and said so.
    let a_notification = json!({"jsonrpc": "2.0", "method": "session/cancel",
                                "params": {"sessionId": "g-bad"}})
    .to_string();
    let mut both = selected(&json!("ferry-permission:drop-3"), "allow_once");
    both["error"] = json!({"code": 1, "message": "could not ask"});
    let both = both.to_string();
    // JSON-RPC 2.0: an id is a string, a number or null, and a response
    // has exactly one of result and error.
    let object_id = json!({"jsonrpc": "2.0", "id": {"x": 1}, "result": {}}).to_string();
    let neither = json!({"jsonrpc": "2.0", "id": "ferry-permission:drop-3"}).to_string();
    let cases: [(&str, u16, i64); 10] = [
        (&both, 400, -32600),
        (&object_id, 400, -32600),
        (&neither, 400, -32600),
        (&unknown, 404, -32602),
        (&foreign, 404, -32602),
        (&wrong_option, 422, -32602),
        (&no_outcome, 400, -32602),
        (&a_request, 400, -32601),
        (&a_notification, 400, -32601),
        ("{oops", 400, -32700),
    ];
    for (body, status, code) in cases {
        let (got, answer) = respond(&ferry, "g-bad", body).await;
        assert_eq!(got, status, "{body}: {answer:?}");
        let answer = answer.expect("a JSON-RPC error body");
        assert_eq!(answer["jsonrpc"], "2.0");
        assert_eq!(answer["error"]["code"], code, "{body}: {answer}");
        assert!(answer["error"]["message"].is_string());
        if body == object_id {
            assert_eq!(answer["id"], Value::Null, "{answer}");
        }
    }
    assert_eq!(last_seq().await, before);
    let (_, call) = api.call("g-bad", "drop-3").await;
    assert_eq!(call["status"], "pending_approval");
    // A path that is not UTF-8: the API's JSON error, not axum's text.
    let (status, body) = api.get("/v1/threads/%FF/acp").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    let (status, body) = api.post("/v1/threads/%FF/acp", &json!({})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
}

#[tokio::test]
async fn an_oxp_call_to_a_gated_tool_waits_for_the_acp_clients_approval() {
    let ferry = Ferry::with_demo().await;
    // OXP calls of user `ana` run in thread `oxp-user-ana`.
    let mut acp = Acp::open(&ferry, "oxp-user-ana", None).await;
    let oxp_call = tokio::process::Command::new(installed("target/py/bin/python"))
        .arg(workspace().join("tests/py/oxp_client.py"))
        .args(["--base", &format!("{}/oxp", ferry.url), "call"])
        .args([
            "--tool-id",
            "demo.drop_table",
            "--input",
            r#"{"table": "orders"}"#,
        ])
        .args(["--call-id", "oxp-drop", "--user-id", "ana"])
        .output();
    let oxp_call = tokio::spawn(oxp_call);

    let asked = acp
        .until(|m| m["method"] == "session/request_permission")
        .await;
    let request = &asked.last().unwrap().1;
    assert_eq!(request["params"]["toolCall"]["toolCallId"], "oxp-drop");
    assert!(
        !oxp_call.is_finished(),
        "the OXP call waits for the reviewer"
    );
    let (status, body) = respond(
        &ferry,
        "oxp-user-ana",
        &selected(&request["id"], "allow_once").to_string(),
    )
    .await;
    assert_eq!(status, 202, "{body:?}");

    let out = oxp_call.await.unwrap().expect("running the OXP client");
    let out: Value = serde_json::from_slice(&out.stdout).expect("the client's JSON");
    let result = &out["response"]["result"];
    assert_eq!(result["success"], true, "{out}");
    assert!(
        result["value"].as_str().unwrap().contains("orders"),
        "{out}"
    );
    acp.until(is_final_update("oxp-drop")).await;
}

/// A tool that calls back before it answers a retried attempt: the late
/// acknowledgement (`call_dispatched` after `tool_result`) sends no ACP
/// message, so a finished call never shows `in_progress` again.
#[tokio::test]
async fn a_late_acknowledgement_does_not_reopen_a_finished_call() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::Status(500), Ack::Held]);
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    submit(&ferry, "g-late", "c", "op", json!({})).await;
    tool.next_invocation().await;
    let url = tool.next_invocation().await.invocation.callback_url;
    let result = json!({"type": "tool_result", "group_id": "g-late", "id": "c", "text": "done"});
    let (status, body) = api.post(&url, &result).await;
    assert_eq!(status, 200, "{body}");
    tool.release();
    let late = api.wait_for("g-late", "c", "call_dispatched").await;
    assert_eq!(
        late["payload"],
        json!({"attempts": 2, "after_result": true})
    );

    // A later call in the thread: every message about `c` comes before it.
    submit(&ferry, "g-late", "d", "op", json!({})).await;
    let mut acp = Acp::open(&ferry, "g-late", None).await;
    let seen = acp.until(|m| update(m)["toolCallId"] == "d").await;
    let of_c: Vec<&Value> = seen
        .iter()
        .map(|(_, m)| update(m))
        .filter(|u| u["toolCallId"] == "c")
        .collect();
    assert_eq!(of_c.last().unwrap()["status"], "completed", "{of_c:?}");
    assert!(
        of_c.iter().all(|u| u["status"] != "in_progress"),
        "{of_c:?}"
    );
}

/// A subscription's events are updates of a running call: each carries
/// `in_progress`, also one that came before the tool's 200 (no
/// `call_dispatched` is recorded then to say so), and the final one
/// `completed` (ACP: "in_progress — The tool call is currently running").
#[tokio::test]
async fn a_subscriptions_events_show_the_call_in_progress() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::Held]);
    let ferry = Ferry::with_tool(&tool).await;
    let api = ferry.api();
    submit(&ferry, "g-sub", "c", "op", json!({})).await;
    let url = tool.next_invocation().await.invocation.callback_url;
    let early = json!({"type": "subscription_event", "group_id": "g-sub", "tool_call_id": "c", "text": "early"});
    assert_eq!(api.post(&url, &early).await.0, 200);
    tool.release();
    let opened = json!({"type": "tool_result", "group_id": "g-sub", "id": "c", "text": "watching", "subscription": true});
    assert_eq!(api.post(&url, &opened).await.0, 200);
    for (text, last) in [("tick", false), ("done", true)] {
        let event = json!({"type": "subscription_event", "group_id": "g-sub", "tool_call_id": "c", "text": text, "final": last});
        assert_eq!(api.post(&url, &event).await.0, 200);
    }

    let mut acp = Acp::open(&ferry, "g-sub", None).await;
    let seen = acp.until(is_final_update("c")).await;
    let texts: Vec<(&str, &str)> = seen
        .iter()
        .map(|(_, m)| update(m))
        .filter_map(|u| {
            let text = u["content"][0]["content"]["text"].as_str()?;
            Some((text, u["status"].as_str().unwrap_or("none")))
        })
        .collect();
    assert_eq!(
        texts,
        [
            ("early", "in_progress"),
            ("watching", "in_progress"),
            ("tick", "in_progress"),
            ("done", "completed"),
        ]
    );
    let messages: Vec<Value> = seen.into_iter().map(|(_, m)| m).collect();
    assert_eq!(schema_errors(&messages).await, Vec::<Value>::new());
}
