//! The integration-test harness: real `ferry` processes on loopback (killed
//! with SIGKILL and restarted on the same port and data), a programmable RAP
//! tool server, and a client for the native API.

pub mod api;
pub mod browser;
pub mod cases;
pub mod cluster;
pub mod ferry;
pub mod nats;
pub mod proxy;
pub mod sse;
pub mod tool;

pub use api::Api;
pub use cluster::FerryWorker;
pub use ferry::{Ferry, FerryOptions};
pub use nats::{Nats, NatsCluster};
pub use tool::{Ack, Invoked, Liveness, TestTool};

/// The secret test processes run with, so tests can mint callback tokens
/// (for an unknown call, say) the way Ferry does.
pub const TEST_SECRET: &str = "ferry-integration-test-secret";

/// Polls `check` until it returns `Some`, or panics after `timeout`: for
/// states with no event to await (a process's port, a counter).
pub async fn eventually<T, F, Fut>(what: &str, timeout: std::time::Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Three calls to `stuck` (toolset `stuck`, tool `wait`, answering 429 with
/// a long `Retry-After`, and no more than two attempts allowed in flight)
/// wait out their retry, while a call to `healthy` (tool `go`) is
/// dispatched at once. Shared by the single-node and cluster tests.
pub async fn calls_waiting_to_retry_leave_room(api: &Api, stuck: &TestTool) {
    use serde_json::json;
    for i in 0..3 {
        let (status, body) = api
            .submit(json!({"operation": "wait", "arguments": {}, "group_id": format!("s{i}"), "id": "c"}))
            .await;
        assert_eq!(status, 202, "{body}");
    }
    for _ in 0..3 {
        stuck.next_invocation().await;
    }
    let (status, body) = api
        .submit(json!({"operation": "go", "arguments": {}, "group_id": "h", "id": "c"}))
        .await;
    assert_eq!(status, 202, "{body}");
    // `wait_for` gives up after 20 s; the stuck calls wait 120 s.
    let dispatched = api.wait_for("h", "c", "call_dispatched").await;
    assert_eq!(dispatched["payload"]["attempts"], 1);
    for i in 0..3 {
        let (_, call) = api.call(&format!("s{i}"), "c").await;
        assert_eq!(call["status"], "queued", "the stuck calls still wait");
    }
    assert_eq!(stuck.invocations().len(), 3);
}
