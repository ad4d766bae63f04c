//! Kill -9 and restart: nothing acknowledged is lost, dispatched calls keep
//! their callback tokens, queued calls are dispatched again, and recovery
//! asks tool servers (`/tool_call_status`) about what Ferry still waits on.

use ferry_tests::{Ack, Api, Ferry, FerryOptions, Liveness, TestTool};
use futures::future::join_all;
use serde_json::{json, Value};

async fn ferry_with(tools: &[&TestTool]) -> Ferry {
    Ferry::start(FerryOptions {
        tool_servers: tools.iter().map(|t| t.url.clone()).collect(),
        ..FerryOptions::default()
    })
    .await
}

fn result(g: &str, id: &str, text: &str) -> Value {
    json!({"type": "tool_result", "group_id": g, "id": id, "text": text})
}

/// Waits for the `/tool_call_status` question about `id`.
async fn asked_about(tool: &TestTool, id: &str) {
    loop {
        let (kind, body) = tool.next_notice().await;
        if kind == "tool_call_status" && body["tool_call_id"] == id {
            return;
        }
    }
}

#[tokio::test]
async fn a_result_sent_after_kill_9_and_restart_lands_once() {
    let tool = TestTool::start("t", &["op"]).await;
    let mut ferry = ferry_with(&[&tool]).await;
    let api = ferry.api();
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    let url = tool.next_invocation().await.invocation.callback_url;
    api.wait_for("g", "c", "call_dispatched").await;
    let before = api.events("g", 0).await;

    ferry.restart().await;
    asked_about(&tool, "c").await;
    let api: Api = ferry.api();
    assert_eq!(
        api.events("g", 0).await,
        before,
        "the log changed across the restart"
    );
    // The token handed out before the crash is still honoured.
    let (status, body) = api.post(&url, &result("g", "c", "done")).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("applied")),
        "{body}"
    );
    assert_eq!(
        api.post(&url, &result("g", "c", "done")).await.1["status"],
        "duplicate"
    );
    let events = api.events("g", 0).await;
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    assert_eq!(api.count("g", "c", "tool_result").await, 1);
    assert_eq!(api.count("g", "c", "call_accepted").await, 1);
    assert_eq!(
        tool.invocations().len(),
        1,
        "a dispatched call was dispatched again"
    );
}

#[tokio::test]
async fn a_call_still_queued_at_kill_9_is_dispatched_after_restart() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::Hang]);
    let mut ferry = ferry_with(&[&tool]).await;
    let (status, _) = ferry
        .api()
        .submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    assert_eq!(status, 202);
    // The first attempt is in flight (the tool holds it unanswered).
    tool.next_invocation().await;
    ferry.restart().await;
    let again = tool.next_invocation().await.invocation;
    assert_eq!((again.group_id.as_str(), again.id.as_str()), ("g", "c"));
    let api = ferry.api();
    api.wait_for("g", "c", "call_dispatched").await;
    // At-least-once to the tool, exactly once to the agent.
    api.post(&again.callback_url, &result("g", "c", "ok")).await;
    api.post(&again.callback_url, &result("g", "c", "ok")).await;
    assert_eq!(api.count("g", "c", "tool_result").await, 1);
    assert_eq!(api.count("g", "c", "call_accepted").await, 1);
}

/// Issue 2: "Messages of one thread are processed one at a time, in
/// order" — also after a restart, whatever the calls' ids.
#[tokio::test]
async fn queued_calls_go_out_after_kill_9_in_the_order_they_were_accepted() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::Hang]);
    let mut ferry = ferry_with(&[&tool]).await;
    let order = ["zz-first", "mm-second", "aa-third"];
    for id in order {
        let call = json!({"operation": "op", "arguments": {}, "group_id": "r", "id": id});
        assert_eq!(ferry.api().submit(call).await.0, 202);
    }
    // The first is in flight (held unanswered); the others wait behind it.
    assert_eq!(tool.next_invocation().await.invocation.id, "zz-first");
    ferry.restart().await;
    let mut sent = vec![];
    while sent.len() < order.len() {
        sent.push(tool.next_invocation().await.invocation.id);
    }
    assert_eq!(sent, order);
}

#[tokio::test]
async fn every_acknowledged_call_survives_kill_9() {
    let tool = TestTool::start("t", &["op"]).await;
    let mut ferry = ferry_with(&[&tool]).await;
    let api = ferry.api();
    let submits = (0..60).map(|i| {
        let api = api.clone();
        async move {
            let g = format!("g{}", i % 6);
            let (status, _) = api.submit(json!({"operation": "op", "arguments": {"text": format!("{i}")}, "group_id": g, "id": format!("c{i}")})).await;
            (g, format!("c{i}"), status)
        }
    });
    let acked: Vec<_> = join_all(submits)
        .await
        .into_iter()
        .filter(|(_, _, s)| *s == 202)
        .collect();
    assert_eq!(acked.len(), 60);
    ferry.kill9();
    ferry.restart().await;
    let api = ferry.api();
    for (g, id, _) in &acked {
        let (status, call) = api.call(g, id).await;
        assert_eq!(status, 200, "acknowledged call {g}/{id} lost");
        assert!(
            ["queued", "dispatched"].contains(&call["status"].as_str().unwrap()),
            "{call}"
        );
        assert_eq!(api.count(g, id, "call_accepted").await, 1);
    }
    // Every acknowledged call reaches the tool (again, if need be).
    ferry_tests::eventually(
        "every call dispatched",
        std::time::Duration::from_secs(30),
        || {
            let api = api.clone();
            let acked = acked.clone();
            async move {
                for (g, id, _) in &acked {
                    if api.call(g, id).await.1["status"] != "dispatched" {
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
}

#[tokio::test]
async fn recovery_prunes_calls_the_tool_server_lost_and_keeps_the_unknown() {
    let lost = TestTool::start("lost", &["op_lost"]).await;
    let unsure = TestTool::start("unsure", &["op_unsure"]).await;
    let mut ferry = ferry_with(&[&lost, &unsure]).await;
    let api = ferry.api();
    api.submit(json!({"operation": "op_lost", "arguments": {}, "group_id": "g", "id": "call"}))
        .await;
    api.submit(json!({"operation": "op_lost", "arguments": {}, "group_id": "g", "id": "sub"}))
        .await;
    api.submit(json!({"operation": "op_unsure", "arguments": {}, "group_id": "g", "id": "kept"}))
        .await;
    lost.next_invocation().await;
    let sub_url = lost.next_invocation().await.invocation.callback_url;
    let kept_url = unsure.next_invocation().await.invocation.callback_url;
    api.post(&sub_url, &json!({"type": "tool_result", "group_id": "g", "id": "sub", "text": "on", "subscription": true}))
        .await;
    for id in ["call", "kept"] {
        api.wait_for("g", id, "call_dispatched").await;
    }
    lost.set_liveness(Liveness::Alive(false));
    unsure.set_liveness(Liveness::Status(503));

    ferry.restart().await;
    let api = ferry.api();
    let failure = api.wait_for("g", "call", "tool_result").await;
    assert_eq!(
        failure["payload"]["text"],
        "Error: the tool server is no longer processing this call"
    );
    assert_eq!(failure["payload"]["origin"], "ferry");
    let end = api
        .wait_event("g", 0, |e| {
            e["id"] == "sub" && e["type"] == "subscription_event"
        })
        .await;
    assert_eq!(end["payload"]["final"], true);
    assert!(end["payload"]["text"]
        .as_str()
        .unwrap()
        .starts_with("Error: "));
    assert_eq!(api.thread("g").await.1["active_subscriptions"], json!([]));
    // A 5xx means unknown: never prune on unknown. The call still takes its
    // real result.
    asked_about(&unsure, "kept").await;
    let (status, body) = api.post(&kept_url, &result("g", "kept", "finally")).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("applied")));
}

#[tokio::test]
async fn a_4xx_or_unreadable_status_answer_prunes_the_call() {
    for liveness in [Liveness::Status(404), Liveness::Garbage] {
        let tool = TestTool::start("t", &["op"]).await;
        let mut ferry = ferry_with(&[&tool]).await;
        let api = ferry.api();
        api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
            .await;
        api.wait_for("g", "c", "call_dispatched").await;
        tool.set_liveness(liveness);
        ferry.restart().await;
        let failure = ferry.api().wait_for("g", "c", "tool_result").await;
        assert_eq!(failure["payload"]["is_error"], true, "{liveness:?}");
        assert_eq!(ferry.api().call("g", "c").await.1["status"], "failed");
    }
}

/// A `subscription_event` that came before the tool's 200 was recorded
/// proves the tool has the call: after a kill -9 the call is not left
/// queued with nothing to send (it would stay stuck so forever), it is
/// asked about like any dispatched call, and pruned when the tool lost it.
#[tokio::test]
async fn a_call_whose_event_came_before_its_ack_is_asked_about_after_kill_9() {
    let tool = TestTool::start("t", &["op"]).await;
    tool.plan(&[Ack::Held]);
    let mut ferry = ferry_with(&[&tool]).await;
    let api = ferry.api();
    api.submit(json!({"operation": "op", "arguments": {}, "group_id": "g", "id": "c"}))
        .await;
    let url = tool.next_invocation().await.invocation.callback_url;
    let event = json!({"type": "subscription_event", "group_id": "g", "tool_call_id": "c", "text": "first"});
    let (status, body) = api.post(&url, &event).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(api.call("g", "c").await.1["status"], "dispatched");
    ferry.kill9();
    tool.set_liveness(Liveness::Alive(false));
    ferry.restart().await;
    asked_about(&tool, "c").await;
    let api = ferry.api();
    let failure = api.wait_for("g", "c", "tool_result").await;
    assert_eq!(
        failure["payload"]["text"],
        "Error: the tool server is no longer processing this call"
    );
    assert_eq!(api.call("g", "c").await.1["status"], "failed");
    assert_eq!(tool.invocations().len(), 1, "not dispatched again");
}

/// `ferry serve --demo` keeps its demo tool on the same port across a
/// restart, so a call the demo tool held when Ferry was killed is asked
/// about on recovery and fails as RAP says, instead of waiting forever on
/// a port nobody listens on.
#[tokio::test]
async fn a_demo_call_in_hand_at_kill_9_is_reported_lost_after_restart() {
    let mut ferry = Ferry::with_demo().await;
    let demo_url = ferry.demo_url.clone().expect("the demo tool's address");
    let api = ferry.api();
    let (status, _) = api
        .submit(json!({"operation": "sleep", "arguments": {"seconds": 600}, "group_id": "g", "id": "nap"}))
        .await;
    assert_eq!(status, 202);
    api.wait_for("g", "nap", "call_dispatched").await;

    ferry.restart().await;
    assert_eq!(ferry.demo_url.as_deref(), Some(demo_url.as_str()));
    let failure = ferry.api().wait_for("g", "nap", "tool_result").await;
    assert_eq!(
        failure["payload"]["text"],
        "Error: the tool server is no longer processing this call"
    );
    assert_eq!(failure["payload"]["origin"], "ferry");
}
