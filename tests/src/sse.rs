//! A reader of Server-Sent Events streams (`text/event-stream`).

use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use serde_json::Value;

use crate::Api;

/// One Server-Sent Event.
#[derive(Debug)]
pub struct Sse {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Value,
}

/// Reads a `text/event-stream` body event by event.
pub struct SseReader {
    body: BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: Vec<u8>,
}

impl SseReader {
    /// Opens `path` (with its query) on `api`.
    pub async fn open(api: &Api, path: &str, last_event_id: Option<&str>) -> SseReader {
        let mut request = api.client.get(format!("{}{path}", api.base));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.expect("GET stream");
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        SseReader {
            body: response
                .bytes_stream()
                .map(|chunk| chunk.map(|b| b.to_vec()))
                .boxed(),
            buf: vec![],
        }
    }

    pub async fn next(&mut self) -> Sse {
        tokio::time::timeout(Duration::from_secs(20), self.read())
            .await
            .expect("no event on the stream")
    }

    /// Reads until the stream's body ends, which it must do cleanly (not
    /// break off) and without another event first.
    pub async fn expect_end(&mut self) {
        let end = async {
            while let Some(chunk) = self.body.next().await {
                self.take(chunk.unwrap_or_else(|e| panic!("the stream broke off: {e}")));
            }
        };
        tokio::time::timeout(Duration::from_secs(20), end)
            .await
            .expect("the stream did not end");
        let rest = String::from_utf8(std::mem::take(&mut self.buf)).unwrap();
        let events: Vec<_> = rest.split("\n\n").filter_map(parse_block).collect();
        assert!(events.is_empty(), "events before the end: {events:?}");
    }

    async fn read(&mut self) -> Sse {
        loop {
            while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                if let Some(event) = parse_block(&String::from_utf8(block).unwrap()) {
                    return event;
                }
            }
            let chunk = self
                .body
                .next()
                .await
                .expect("the stream ended")
                .expect("stream error");
            self.take(chunk);
        }
    }

    /// Buffers a chunk of the body, its line ends as `\n`.
    fn take(&mut self, chunk: Vec<u8>) {
        self.buf.extend(chunk.into_iter().filter(|b| *b != b'\r'));
    }
}

/// Parses one event block; `None` for a comment-only block (keep-alive).
fn parse_block(block: &str) -> Option<Sse> {
    let (mut id, mut event, mut data) = (None, None, Vec::new());
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = Some(value.to_owned()),
            "event" => event = Some(value.to_owned()),
            "data" => data.push(value),
            _ => {}
        }
    }
    if data.is_empty() {
        return None;
    }
    let data = serde_json::from_str(&data.join("\n")).expect("data is JSON");
    Some(Sse { id, event, data })
}
