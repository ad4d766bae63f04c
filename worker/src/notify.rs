//! Runtime-to-tool-server notifications (`rap-3`): `/cancel_tool_call` and
//! `/close_thread` are best effort and single shot; `/tool_call_status` is
//! asked on recovery; a user's answer to a `user_choice` is POSTed to its
//! `response_url` (`deliver_choice`; the caller retries what may succeed
//! later).

use std::time::Duration;

use ferry_proto::rap::{CancelToolCall, CloseThread, ToolCallStatus, ToolCallStatusReply};
use futures::future::join_all;
use serde::Serialize;
use tracing::{debug, warn};

use crate::outbound::{Outbound, Refused};

/// Host and path of `url` only: a base URL may carry Basic auth.
fn shown(url: &str) -> String {
    reqwest::Url::parse(url)
        .map(|u| format!("{}{}", u.host_str().unwrap_or_default(), u.path()))
        .unwrap_or_default()
}

/// What a tool server says of a call Ferry still waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallLiveness {
    Alive,
    /// `alive: false`, a 4xx, or a 2xx whose whole body is not the reply:
    /// prune the call.
    Lost,
    /// A transport error (a body cut short included) or 5xx: keep waiting,
    /// never prune on unknown.
    Unknown,
}

/// How one delivery of a user's choice went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChoiceDelivery {
    Accepted,
    /// A 4xx: the tool will not take it, however often sent.
    Refused(u16),
    /// A transport error or another status: worth sending again.
    Failed,
}

#[derive(Clone)]
pub struct Notifier {
    outbound: Outbound,
    timeout: Duration,
}

impl Notifier {
    pub fn new(outbound: impl Into<Outbound>) -> Self {
        Self {
            outbound: outbound.into(),
            timeout: Duration::from_secs(5),
        }
    }

    /// A POST of `body` to `url`, unless `url` is in a network Ferry may
    /// not reach (an IP literal here, a name in the client's resolver):
    /// `None` then, or when the request failed.
    async fn send<T: Serialize>(&self, url: &str, body: &T) -> Option<reqwest::Response> {
        let sent = match self.outbound.check_str(url) {
            Ok(()) => {
                (self.outbound.client().post(url))
                    .timeout(self.timeout)
                    .json(body)
                    .send()
                    .await
            }
            Err(refused) => {
                warn!(url = %shown(url), "not sent: {refused}");
                return None;
            }
        };
        match sent {
            Ok(response) => Some(response),
            Err(e) if Refused::caused(&e) => {
                warn!(url = %shown(url), "not sent: {Refused}");
                None
            }
            Err(e) => {
                debug!(url = %shown(url), error = %e.without_url(), "request failed");
                None
            }
        }
    }

    async fn post<T: Serialize>(&self, url: String, body: &T) {
        let sent = self.send(&url, body).await;
        debug!(url = %shown(&url), ok = sent.is_some(), "notified tool server");
    }

    /// Sends `/cancel_tool_call` to `server` (the call's own), once. The
    /// caller does not wait on it: spawn the returned future.
    pub fn cancel_tool_call(
        &self,
        server: String,
        thread_id: &str,
        tool_call_id: &str,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let this = self.clone();
        let body = CancelToolCall {
            thread_id: thread_id.to_owned(),
            tool_call_id: tool_call_id.to_owned(),
        };
        async move { this.post(format!("{server}/cancel_tool_call"), &body).await }
    }

    /// Sends `/close_thread` to `servers` (those that had calls in the
    /// thread) at once, once each.
    pub fn close_thread(
        &self,
        servers: Vec<String>,
        thread_id: &str,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let this = self.clone();
        let body = CloseThread {
            thread_id: thread_id.to_owned(),
        };
        async move {
            join_all(
                servers
                    .into_iter()
                    .map(|s| this.post(format!("{s}/close_thread"), &body)),
            )
            .await;
        }
    }

    /// POSTs a user's answer, `{"id": <call id>, "selected": <index>}` (the
    /// body `rap-3` defines), to the tool's `response_url`, once: the caller
    /// retries a [`ChoiceDelivery::Failed`].
    pub async fn deliver_choice(
        &self,
        response_url: &str,
        id: &str,
        index: usize,
    ) -> ChoiceDelivery {
        let body = serde_json::json!({"id": id, "selected": index});
        // A response_url in a closed network stays owed, as if its tool
        // were down, until the operator opens it.
        match self.send(response_url, &body).await {
            Some(r) if r.status().is_success() => ChoiceDelivery::Accepted,
            // 429 asks to try later, like a 5xx.
            Some(r) if r.status().is_client_error() && r.status() != 429 => {
                ChoiceDelivery::Refused(r.status().as_u16())
            }
            Some(r) => {
                debug!(status = %r.status(), "the tool could not take the choice yet");
                ChoiceDelivery::Failed
            }
            None => ChoiceDelivery::Failed,
        }
    }

    /// Asks the server that got a call whether it still processes it.
    pub async fn tool_call_status(
        &self,
        server: &str,
        thread_id: &str,
        tool_call_id: &str,
    ) -> CallLiveness {
        let body = ToolCallStatus {
            thread_id: thread_id.to_owned(),
            tool_call_id: tool_call_id.to_owned(),
        };
        let url = format!("{server}/tool_call_status");
        let Some(response) = self.send(&url, &body).await else {
            return CallLiveness::Unknown;
        };
        // rap-3 prunes on a 4xx only; anything else that is not a 2xx (a
        // 5xx, a redirect this client does not follow) says nothing about
        // the call, and Ferry never prunes on unknown.
        let status = response.status();
        if status.is_client_error() {
            return CallLiveness::Lost;
        }
        if !status.is_success() {
            return CallLiveness::Unknown;
        }
        // A body cut short (reset, timeout) is a transport error: keep
        // waiting. Only a body that arrived whole and is not the reply
        // prunes the call.
        let Ok(body) = response.bytes().await else {
            return CallLiveness::Unknown;
        };
        match serde_json::from_slice::<ToolCallStatusReply>(&body) {
            Ok(ToolCallStatusReply { alive: true }) => CallLiveness::Alive,
            Ok(ToolCallStatusReply { alive: false }) | Err(_) => CallLiveness::Lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A tool server on loopback that answers every connection with
    /// `response`, byte for byte, then closes it. It reads the whole
    /// request first and drains the socket after: closing with unread bytes
    /// would reset the connection, and the client could lose the answer.
    async fn answering(response: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !whole(&request) {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.shutdown().await;
                    while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        });
        format!("http://{addr}")
    }

    /// Whether `request` holds its headers and as many body bytes as its
    /// `content-length` says.
    fn whole(request: &[u8]) -> bool {
        let text = String::from_utf8_lossy(request);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            return false;
        };
        let length = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        body.len() >= length
    }

    async fn liveness(response: &'static str) -> CallLiveness {
        let server = answering(response).await;
        Notifier::new(reqwest::Client::new())
            .tool_call_status(&server, "g", "c1")
            .await
    }

    #[tokio::test]
    async fn a_body_cut_short_keeps_the_call_waiting() {
        // rap-3: "a transport error or 5xx keeps it waiting". The headers
        // promise 100 bytes; the connection closes after one.
        let cut =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{";
        assert_eq!(liveness(cut).await, CallLiveness::Unknown);
    }

    #[tokio::test]
    async fn a_whole_body_decides_by_what_it_says() {
        let reply = |body: &'static str| -> &'static str {
            Box::leak(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .into_boxed_str(),
            )
        };
        assert_eq!(
            liveness(reply(r#"{"alive":true}"#)).await,
            CallLiveness::Alive
        );
        assert_eq!(
            liveness(reply(r#"{"alive":false}"#)).await,
            CallLiveness::Lost
        );
        assert_eq!(liveness(reply("not json")).await, CallLiveness::Lost);
    }

    #[tokio::test]
    async fn only_a_4xx_status_prunes() {
        let status = |line: &'static str| -> &'static str {
            Box::leak(
                format!("HTTP/1.1 {line}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .into_boxed_str(),
            )
        };
        assert_eq!(liveness(status("404 Not Found")).await, CallLiveness::Lost);
        assert_eq!(liveness(status("410 Gone")).await, CallLiveness::Lost);
        for unknown in [
            "503 Service Unavailable",
            "307 Temporary Redirect",
            "302 Found",
        ] {
            assert_eq!(
                liveness(status(unknown)).await,
                CallLiveness::Unknown,
                "{unknown}"
            );
        }
    }
}
