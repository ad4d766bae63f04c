//! The integration-test harness: real `ferry` processes on loopback (killed
//! with SIGKILL and restarted on the same port and data), a programmable RAP
//! tool server, and a client for the native API.

pub mod api;
pub mod cluster;
pub mod ferry;
pub mod nats;
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
