//! Registering the `--tool-server`s named at start. Ferry may well start
//! before its tool servers (one compose file, one deploy), so a server that
//! cannot be reached yet is tried again in the background until it answers;
//! a document that is not a valid toolset will not fix itself, and is
//! refused once.

use std::sync::Arc;
use std::time::Duration;

use backoff::backoff::Backoff;
use backoff::ExponentialBackoffBuilder;
use ferry_runtime::engine::{Engine, Error};
use tracing::{info, warn};

/// The first retry of an unreachable tool server comes after about this.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Retries back off to one a minute, and go on for as long as Ferry runs.
const LAST_RETRY: Duration = Duration::from_secs(60);

/// Registers each of `urls`, in order; those unreachable for now are left
/// to a background task each.
pub async fn register(engine: &Arc<Engine>, urls: &[String]) {
    for url in urls {
        match engine.register_toolset(url, None, None).await {
            Ok(t) => {
                info!(toolset = %t.name, url, tools = t.tools.len(), "toolset registered at start")
            }
            Err(Error::ToolsetUnreachable(reason)) => {
                warn!(url, error = %reason, "tool server unreachable at start; trying again in the background");
                tokio::spawn(retry(engine.clone(), url.clone()));
            }
            Err(e) => warn!(url, error = %e, "could not register tool server at start"),
        }
    }
}

/// Registers `url` once it can be reached, backing off between attempts.
async fn retry(engine: Arc<Engine>, url: String) {
    let mut waits = ExponentialBackoffBuilder::new()
        .with_initial_interval(FIRST_RETRY)
        .with_max_interval(LAST_RETRY)
        .with_max_elapsed_time(None)
        .build();
    loop {
        tokio::time::sleep(waits.next_backoff().unwrap_or(LAST_RETRY)).await;
        match engine.register_toolset(&url, None, None).await {
            Ok(t) => {
                info!(toolset = %t.name, url, tools = t.tools.len(), "toolset registered once its server answered");
                return;
            }
            Err(Error::ToolsetUnreachable(reason)) => {
                warn!(url, error = %reason, "tool server still unreachable; trying again")
            }
            Err(e) => {
                warn!(url, error = %e, "could not register tool server; not trying again");
                return;
            }
        }
    }
}
