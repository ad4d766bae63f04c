//! Per-toolset concurrency limits (`max_concurrent_calls` in a toolset's
//! policy): calls over the limit are accepted and wait, in order, until a
//! running call of the toolset is answered; the tool server never has
//! more than the limit in hand.

use ferry_tests::{Ferry, FerryOptions, TestTool};
use serde_json::{json, Value};

fn result(g: &str, id: &str) -> Value {
    json!({"type": "tool_result", "group_id": g, "id": id, "text": "done"})
}

/// A Ferry with tool server `slow` registered under `limit`.
async fn limited(limit: u32) -> (TestTool, Ferry) {
    let tool = TestTool::start("slow", &["op"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let registration = json!({"url": tool.url, "max_concurrent_calls": limit});
    let (status, body) = ferry.api().post("/v1/toolsets", &registration).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["policy"]["max_concurrent_calls"], limit, "{body}");
    (tool, ferry)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_of_two_keeps_two_in_flight_and_dispatches_the_rest_in_order() {
    let (tool, ferry) = limited(2).await;
    let api = ferry.api();
    // Ten calls, each in its own thread: only the limit orders them.
    for i in 0..10 {
        let call = json!({"operation": "op", "arguments": {}, "group_id": format!("g{i}"),
                          "id": format!("c{i}")});
        let (status, body) = api.submit(call).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (202, Some("queued")),
            "{body}"
        );
    }
    let mut arrived = vec![];
    let mut answered = 0;
    while answered < 10 {
        let invoked = tool.next_invocation().await.invocation;
        arrived.push(invoked.id.clone());
        // The tool counts what it has in hand: never more than two.
        let in_hand = tool.invocations().len() - answered;
        assert!(in_hand <= 2, "{in_hand} in flight: {arrived:?}");
        if arrived.len() < 2 && answered == 0 {
            continue;
        }
        // Answer the oldest in hand; its room goes to the next waiting.
        let oldest = &tool.invocations()[answered];
        let (status, body) = api
            .post(&oldest.callback_url, &result(&oldest.group_id, &oldest.id))
            .await;
        assert_eq!(
            (status, body["status"].as_str()),
            (200, Some("applied")),
            "{body}"
        );
        answered += 1;
        if answered == 9 {
            // The last one in hand: answer it too.
            let last = &tool.invocations()[9];
            api.post(&last.callback_url, &result(&last.group_id, &last.id))
                .await;
            answered += 1;
        }
    }
    let want: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    assert_eq!(arrived, want, "dispatched in submission order");
    for i in 0..10 {
        let (_, call) = api.call(&format!("g{i}"), &format!("c{i}")).await;
        assert_eq!(call["status"], "completed", "{call}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_call_that_is_cancelled_gives_up_its_place() {
    let (tool, ferry) = limited(1).await;
    let api = ferry.api();
    for id in ["a", "b", "c"] {
        let call = json!({"operation": "op", "arguments": {}, "group_id": "g", "id": id});
        assert_eq!(api.submit(call).await.0, 202);
    }
    let first = tool.next_invocation().await.invocation;
    assert_eq!(first.id, "a");
    // `b` waits; cancelled, it is never sent, and `c` takes its place.
    let (status, body) = api.delete("/v1/threads/g/calls/b").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "cancelled", "{body}");
    api.post(&first.callback_url, &result("g", "a")).await;
    let next = tool.next_invocation().await.invocation;
    assert_eq!(next.id, "c");
    assert_eq!(tool.invocations().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_limits_are_refused_and_change_nothing() {
    let tool = TestTool::start("slow", &["op"]).await;
    let ferry = Ferry::start(FerryOptions::default()).await;
    let api = ferry.api();
    for bad in [json!(0), json!(10_001), json!(-1), json!("two"), json!(1.5)] {
        let (status, body) = api
            .post(
                "/v1/toolsets",
                &json!({"url": tool.url, "max_concurrent_calls": bad}),
            )
            .await;
        assert!(status == 400 || status == 422, "{bad}: {status} {body}");
        let (_, listed) = api.get("/v1/toolsets").await;
        assert_eq!(listed["toolsets"], json!([]), "{bad}: {listed}");
    }
    // Set and removed by PATCH, as every policy field is.
    assert_eq!(api.register(&tool.url).await.0, 201);
    let (status, body) = api
        .patch("/v1/toolsets/slow", &json!({"max_concurrent_calls": 3}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["versions"][0]["policy"]["max_concurrent_calls"], 3,
        "{body}"
    );
    let (status, body) = api
        .patch("/v1/toolsets/slow", &json!({"max_concurrent_calls": 0}))
        .await;
    assert!(status == 400 || status == 422, "{body}");
    let (_, shown) = api.get("/v1/toolsets/slow").await;
    assert_eq!(
        shown["versions"][0]["policy"]["max_concurrent_calls"], 3,
        "{shown}"
    );
    let (status, body) = api
        .patch("/v1/toolsets/slow", &json!({"max_concurrent_calls": null}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["versions"][0]["policy"]
            .get("max_concurrent_calls")
            .is_none(),
        "{body}"
    );
}
