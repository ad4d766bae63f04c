//! The Ferry caller: submits through Ferry's native API and reads each result
//! from its thread's event stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure};
use axum::body::Bytes;
use axum::http::StatusCode;
use ferry_proto::api::{Event, EventKind, SubmitCall};
use futures::StreamExt;
use serde_json::{json, Value};

use super::{CALL_TIMEOUT, TOOL, TOOLSET};

/// A Ferry caller: the native API, each caller on its own thread, reading
/// results the way an agent following its thread does: one SSE stream per
/// thread, opened before the first call and kept, asking for results only.
#[derive(Clone)]
pub(super) struct Ferry {
    pub(super) http: reqwest::Client,
    /// The runtime nodes (one for `serve`); caller `c` uses node
    /// `c % bases.len()`, as a load balancer would spread agents.
    pub(super) bases: Vec<String>,
    /// Keeps thread ids of separate runs apart.
    pub(super) run: String,
    /// Each caller's open stream, by `(level, caller)`.
    pub(super) streams: Arc<Mutex<HashMap<(usize, usize), StreamSlot>>>,
    /// Numbers call ids, unique across rounds.
    pub(super) calls: Arc<AtomicU64>,
    /// Other processes doing Ferry's work (a cluster's `nats-server`),
    /// whose CPU time counts with this process's.
    pub(super) processes: Vec<u32>,
    /// A cluster's `nats-server` `/varz`, whose message count is read.
    pub(super) nats_varz: Option<String>,
}

/// A caller's stream, opened on its first call.
type StreamSlot = Arc<tokio::sync::Mutex<Option<EventStream>>>;

/// The events of one thread, read from `GET /v1/threads/{g}/stream`.
pub(super) struct EventStream {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<Bytes>> + Send>>,
    buf: Vec<u8>,
}

impl EventStream {
    async fn open(http: &reqwest::Client, url: String) -> anyhow::Result<Self> {
        let response = http.get(url).send().await?.error_for_status()?;
        Ok(Self {
            body: Box::pin(response.bytes_stream()),
            buf: Vec::new(),
        })
    }

    /// The next event on the stream (keep-alive comments skipped).
    async fn next(&mut self) -> anyhow::Result<Event> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = std::str::from_utf8(&block)?;
                if let Some(data) = text.lines().find_map(|l| l.strip_prefix("data:")) {
                    return Ok(serde_json::from_str(data.trim_start())?);
                }
                continue;
            }
            match self.body.next().await {
                Some(chunk) => self.buf.extend_from_slice(&chunk?),
                None => bail!("the event stream ended"),
            }
        }
    }
}

impl Ferry {
    fn base(&self, caller: usize) -> &str {
        &self.bases[caller % self.bases.len()]
    }

    /// Waits (up to 20 s) until every node lists the bench tool: a toolset
    /// registered on one node reaches the others through the KV bucket.
    pub(super) async fn wait_registered(&self) -> anyhow::Result<()> {
        for base in &self.bases {
            let this = Ferry {
                bases: vec![base.clone()],
                ..self.clone()
            };
            let mut tries = 0;
            while let Err(e) = this.check_registered().await {
                tries += 1;
                if tries > 200 {
                    return Err(e);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Fails early, and clearly, if the bench toolset did not register.
    pub(super) async fn check_registered(&self) -> anyhow::Result<()> {
        let tools: Value = self
            .http
            .get(format!("{}/v1/tools", self.bases[0]))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let text = tools.to_string();
        ensure!(
            text.contains(&format!("{TOOLSET}.{TOOL}")),
            "the bench toolset is not registered with Ferry: {text}"
        );
        Ok(())
    }

    /// Submit, then read the thread's stream until the call's `tool_result`.
    pub(super) async fn call(self, level: usize, caller: usize, n: u64) -> anyhow::Result<()> {
        let group_id = format!("bench-{}-{level}x-{caller}", self.run);
        let slot = self
            .streams
            .lock()
            .expect("streams lock")
            .entry((level, caller))
            .or_default()
            .clone();
        let mut stream = slot.lock().await;
        if stream.is_none() {
            let url = format!(
                "{}/v1/threads/{group_id}/stream?types=tool_result",
                self.base(caller)
            );
            *stream = Some(EventStream::open(&self.http, url).await?);
        }
        let stream = stream.as_mut().expect("opened above");
        let id = format!("c{}", self.calls.fetch_add(1, Ordering::Relaxed));
        let submit = SubmitCall {
            operation: format!("{TOOLSET}.{TOOL}"),
            arguments: json!({"text": format!("hello {n}")}),
            group_id: group_id.clone(),
            id: Some(id.clone()),
            call_id: None,
            user_id: None,
            thread_ancestors: None,
        };
        let r = self
            .http
            .post(format!("{}/v1/calls", self.base(caller)))
            .json(&submit)
            .send()
            .await?;
        ensure!(
            r.status() == StatusCode::ACCEPTED,
            "submit answered {}: {}",
            r.status(),
            r.text().await.unwrap_or_default()
        );
        tokio::time::timeout(CALL_TIMEOUT, async {
            loop {
                let event = stream.next().await?;
                if let (Some(eid), EventKind::ToolResult { is_error, text, .. }) =
                    (&event.id, &event.kind)
                {
                    if *eid == id {
                        ensure!(!is_error, "the call failed: {text}");
                        return Ok(());
                    }
                }
            }
        })
        .await
        .map_err(|_| anyhow::anyhow!("no tool_result for {group_id}/{id} in {CALL_TIMEOUT:?}"))?
    }
}
