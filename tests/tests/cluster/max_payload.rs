//! NATS's `max_payload`: a result or a close whose commit NATS cannot carry
//! ends its call (or is split) instead of being refused for good.

use ferry_tests::Api;
use serde_json::{json, Value};

use super::{path_of, result, Cluster};

/// Text no compression shrinks: `n` pseudo-random letters and digits.
fn noise(n: usize, seed: u64) -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            LETTERS[(state >> 33) as usize % LETTERS.len()] as char
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_result_nats_could_not_carry_ends_its_call_and_holds_nothing_back() {
    let c = Cluster::start(1).await;
    let a = c.a.api();
    let url = path_of(&c.dispatched(&a, "g", "c1").await);
    // NATS's default max_payload is 1 MiB. A result given as content
    // becomes a commit holding its text four times (the event's and the
    // call's, each as text and as content), compressed: over 1 MiB for
    // 400 KB of text that does not compress. It could never be stored.
    let big = json!({"type": "tool_result", "group_id": "g", "id": "c1",
        "content": [{"type": "text", "text": noise(400_000, 3)}]});
    let (status, body) = a.post(&url, &big).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    // Tools do not retry a 4xx (rap-3): the call fails with an error
    // result in its place rather than waiting forever, and the tool is told.
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("with an error result saying so"),
        "{message}"
    );
    a.wait_for("g", "c1", "tool_result").await;
    let (_, call) = c.b.api().call("g", "c1").await;
    assert_eq!(call["status"], "failed", "{call}");
    assert_eq!(call["result"]["is_error"], true, "{call}");
    let told = json!({"thread_id": "g", "tool_call_id": "c1"});
    assert_eq!(
        c.tool.next_notice().await,
        ("cancel_tool_call".into(), told)
    );
    let said = call["result"]["text"].as_str().unwrap();
    assert!(
        said.starts_with("Error: the tool's result was larger"),
        "{said}"
    );
    // Nothing waits behind it: a result NATS can carry lands at once.
    let url = path_of(&c.dispatched(&a, "g", "c2").await);
    let fits = "y".repeat(200_000);
    let (status, body) = a.post(&url, &result("g", "c2", &fits)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("applied")),
        "{body}"
    );
    let (_, call) = c.b.api().call("g", "c2").await;
    assert_eq!(call["result"]["text"].as_str().map(str::len), Some(200_000));
    assert_eq!(a.count("g", "c1", "tool_result").await, 1);
}

/// A result whose commit NATS refuses only with the thread's views beside
/// it is refused like any result too large (not a 5xx, which tools retry
/// forever), and its call fails.
#[tokio::test(flavor = "multi_thread")]
async fn a_result_whose_commit_nats_refuses_fails_its_call() {
    let c = Cluster::start(1).await;
    let a = c.a.api();
    let url = path_of(&c.dispatched(&a, "g", "c1").await);
    let view = json!({"type": "view_update", "group_id": "g", "view_type": "big",
        "content": noise(100_000, 1)});
    let (status, body) = a.post(&url, &view).await;
    assert_eq!(status, 200, "{body}");
    // With 100 KB of views the commit is over NATS's 1 MiB.
    let big = json!({"type": "tool_result", "group_id": "g", "id": "c1",
        "content": [{"type": "text", "text": noise(240_000, 2)}]});
    let (status, body) = a.post(&url, &big).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (413, &json!("payload_too_large")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("with an error result saying so"),
        "{message}"
    );
    let (_, call) = c.b.api().call("g", "c1").await;
    assert_eq!(
        (&call["status"], &call["result"]["is_error"]),
        (&json!("failed"), &json!(true))
    );
    assert_eq!(a.count("g", "c1", "tool_result").await, 1);
}

/// Closing a thread cancels its open calls in one commit, which carries
/// each of them; when those are more than NATS takes in one message
/// (each well under the node's own limit), they are cancelled one commit
/// each and then the thread is closed, not refused 413 at every close
/// and left open for good.
#[tokio::test(flavor = "multi_thread")]
async fn a_thread_whose_open_calls_are_large_together_still_closes() {
    let c = Cluster::start(1).await;
    let a = c.a.api();
    for i in 0..6 {
        let id = format!("c{i}");
        // Text no compression shrinks, 200 KB of the 1 MiB max_payload.
        let big = noise(200_000, i);
        let (status, body) = a
            .submit(
                json!({"operation": "op", "arguments": {"text": big}, "group_id": "g", "id": id}),
            )
            .await;
        assert_eq!(status, 202, "{}", body["error"]);
        c.tool.next_invocation().await;
        a.wait_for("g", &id, "call_dispatched").await;
    }
    let thread = close(&a, "g").await;
    assert_eq!(thread["counts"], json!({"cancelled": 6}), "{thread}");
}

/// Closes thread `g` through `api`: closed when the answer comes. The
/// closed thread.
async fn close(api: &Api, g: &str) -> Value {
    let (status, body) = api
        .post(&format!("/v1/threads/{g}/close"), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, thread) = api.thread(g).await;
    assert_eq!(thread["closed"], true, "{thread}");
    thread
}
