//! Registering the `--tool-server`s named at start. Ferry may well start
//! before its tool servers (one compose file, one deploy), so a server that
//! cannot be reached yet is tried again in the background until it answers;
//! a document that is not a valid toolset will not fix itself, and is
//! refused once.

use std::sync::Arc;
use std::time::Duration;

use backoff::backoff::Backoff;
use backoff::ExponentialBackoffBuilder;
use ferry_engine::engine::{Engine, Error};
use ferry_engine::identity::Identity;
use tracing::{info, warn};

/// The first retry of an unreachable tool server comes after about this.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Retries back off to one a minute, and go on for as long as Ferry runs.
const LAST_RETRY: Duration = Duration::from_secs(60);

/// Registers each of `urls`, in order; those unreachable for now are left
/// to a background task each.
pub async fn register(engine: &Arc<Engine>, urls: &[String]) {
    for url in urls {
        if !settled(engine, url).await {
            tokio::spawn(retry(engine.clone(), url.clone()));
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
        if settled(&engine, &url).await {
            return;
        }
    }
}

/// Tries to register `url` once: `false` when its server cannot be
/// reached yet (worth another try), `true` when registered or refused.
async fn settled(engine: &Engine, url: &str) -> bool {
    match engine
        .register_toolset(&Identity::ferry(), url, None, None)
        .await
    {
        Ok(t) => {
            info!(toolset = ?t.name, url = t.url, tools = t.tools.len(), "toolset registered");
            true
        }
        Err(Error::ToolsetUnreachable(reason)) => {
            let url = ferry_engine::toolsets::redacted(url);
            warn!(url, error = %reason, "tool server unreachable; trying again in the background");
            false
        }
        Err(e) => {
            let url = ferry_engine::toolsets::redacted(url);
            warn!(url, error = %e, "could not register tool server; not trying again");
            true
        }
    }
}
