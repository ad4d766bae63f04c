//! `ferry bench --secured`: a second `ferry serve`, locked down as a team
//! would run it, measured in the same rounds as the open one. Its calls
//! carry a named token bounded to the bench tool and one user, and every
//! call passes three rate limits (identity, user, tool) set too high to
//! refuse any: what is measured is what checking them costs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::ferry::Ferry;
use super::{TOOL, TOOLSET};
use crate::serve::{start, ServeOptions};
use ferry_engine::limits::{Limit, RateLimits};

/// Calls a second (and burst) each limit allows: far above what one
/// machine can submit.
const GENEROUS: &str = "1000000:1000000";

pub(super) struct Secured {
    pub(super) ferry: Ferry,
    stop: oneshot::Sender<()>,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
    _data: tempfile::TempDir,
}

impl Secured {
    pub(super) async fn start(tool: SocketAddr, open: &Ferry) -> anyhow::Result<Self> {
        let data = tempfile::Builder::new()
            .prefix("ferry-bench-secured-")
            .tempdir()?;
        let limit: Limit = GENEROUS.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
        let options = ServeOptions {
            listen: "127.0.0.1:0".parse()?,
            data: data.path().to_owned(),
            tool_servers: vec![format!("http://{tool}")],
            rate_limits: RateLimits {
                identity: Some(limit),
                user: Some(limit),
                tool: Some(limit),
            },
            ..ServeOptions::default()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let (running, server) = start(options, None, async {
            let _ = stopped.await;
        })
        .await?;
        let base = format!("http://{}", running.addr);
        let admin = make_token(
            &open.http,
            &base,
            None,
            json!({"name": "bench-admin", "scopes": ["admin"]}),
        )
        .await?;
        let agent = make_token(
            &open.http,
            &base,
            Some(&admin),
            json!({"name": "bench-agent", "scopes": ["submit", "read"],
                   "tools": [format!("{TOOLSET}.{TOOL}")], "users": ["bench-user"]}),
        )
        .await?;
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {agent}").parse()?,
        );
        let http = reqwest::Client::builder()
            .no_proxy()
            .default_headers(headers)
            .connect_timeout(super::CALL_TIMEOUT)
            .read_timeout(super::CALL_TIMEOUT)
            .build()?;
        let ferry = Ferry {
            http,
            bases: vec![base],
            run: uuid::Uuid::new_v4().simple().to_string()[..8].to_owned(),
            streams: Arc::default(),
            calls: Arc::default(),
            ..open.clone()
        };
        ferry.wait_registered().await?;
        Ok(Self {
            ferry,
            stop,
            server,
            _data: data,
        })
    }

    pub(super) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.server).await;
    }
}

/// `POST /v1/tokens` (as `admin`, or anonymously for the first): the secret.
async fn make_token(
    http: &reqwest::Client,
    base: &str,
    admin: Option<&str>,
    spec: Value,
) -> anyhow::Result<String> {
    let mut request = http
        .post(format!("{base}/v1/tokens"))
        .header("content-type", "application/json")
        .body(spec.to_string());
    if let Some(admin) = admin {
        request = request.bearer_auth(admin);
    }
    let made: Value = request.send().await?.error_for_status()?.json().await?;
    made["token"]
        .as_str()
        .map(str::to_owned)
        .context("POST /v1/tokens answered no token")
}
