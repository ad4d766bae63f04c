//! A small client for the native API, with percent-encoded path segments.

use std::time::Duration;

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::{json, Value};

#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub client: reqwest::Client,
}

/// Percent-encodes one path segment: any `group_id` or `id` works.
pub fn seg(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

async fn answer(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.expect("response body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

impl Api {
    pub fn new(base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            client: reqwest::Client::builder().no_proxy().build().unwrap(),
        }
    }

    /// A client that sends `Authorization: Bearer <token>` with every
    /// request (for a Ferry started with `--api-token`).
    pub fn with_token(base: &str, token: &str) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        let value = format!("Bearer {token}").parse().expect("a header value");
        headers.insert(reqwest::header::AUTHORIZATION, value);
        Self {
            base: base.trim_end_matches('/').to_owned(),
            client: reqwest::Client::builder()
                .no_proxy()
                .default_headers(headers)
                .build()
                .unwrap(),
        }
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        answer(
            self.client
                .get(format!("{}{path}", self.base))
                .send()
                .await
                .expect("GET"),
        )
        .await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        answer(
            self.client
                .delete(format!("{}{path}", self.base))
                .send()
                .await
                .expect("DELETE"),
        )
        .await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> (u16, Value) {
        answer(
            self.client
                .patch(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .expect("PATCH"),
        )
        .await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string().into_bytes()).await
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        self.post_with(path, body, &[]).await
    }

    /// POSTs `body` with `headers` besides its content type, each sent as
    /// given (a name twice is sent twice): a tool's callback with its
    /// `Idempotency-Key`, say.
    pub async fn post_with(
        &self,
        path: &str,
        body: Vec<u8>,
        headers: &[(&str, &[u8])],
    ) -> (u16, Value) {
        let url = if path.starts_with("http") {
            path.to_owned()
        } else {
            format!("{}{path}", self.base)
        };
        let mut request = self
            .client
            .post(url)
            .header("content-type", "application/json");
        for (name, value) in headers {
            let value = reqwest::header::HeaderValue::from_bytes(value).expect("a header value");
            request = request.header(*name, value);
        }
        let response = request.body(body).send().await.expect("POST");
        answer(response).await
    }

    /// Makes a named token (`POST /v1/tokens`, as this client's own
    /// credential, or anonymously for the first) and returns its secret.
    pub async fn make_token(&self, spec: Value) -> String {
        let (status, made) = self.post("/v1/tokens", &spec).await;
        assert_eq!(status, 201, "{spec} -> {made}");
        made["token"].as_str().expect("a token").to_owned()
    }

    pub async fn submit(&self, body: Value) -> (u16, Value) {
        self.post("/v1/calls", &body).await
    }

    pub async fn register(&self, url: &str) -> (u16, Value) {
        self.post("/v1/toolsets", &json!({"url": url})).await
    }

    pub async fn call(&self, group_id: &str, id: &str) -> (u16, Value) {
        self.get(&format!("/v1/threads/{}/calls/{}", seg(group_id), seg(id)))
            .await
    }

    pub async fn thread(&self, group_id: &str) -> (u16, Value) {
        self.get(&format!("/v1/threads/{}", seg(group_id))).await
    }

    /// Events after `after` (no waiting).
    pub async fn events(&self, group_id: &str, after: u64) -> Vec<Value> {
        let (status, body) = self
            .get(&format!(
                "/v1/threads/{}/events?after={after}&limit=1000",
                seg(group_id)
            ))
            .await;
        assert_eq!(status, 200, "{body}");
        body["events"].as_array().cloned().unwrap_or_default()
    }

    /// The value at `pointer` (a JSON pointer, `/payload/text` say) of
    /// each of the thread's events of type `kind`, in order.
    pub async fn fields(&self, group_id: &str, kind: &str, pointer: &str) -> Vec<Value> {
        self.events(group_id, 0)
            .await
            .iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e.pointer(pointer).cloned().unwrap_or(Value::Null))
            .collect()
    }

    /// The types of the thread's events, in order.
    pub async fn types(&self, group_id: &str) -> Vec<String> {
        self.events(group_id, 0)
            .await
            .iter()
            .map(|e| e["type"].as_str().expect("a type").to_owned())
            .collect()
    }

    /// Long-polls the thread until an event matching `pred` appears (after
    /// `after`), and returns it. Panics after 20 s.
    pub async fn wait_event(
        &self,
        group_id: &str,
        after: u64,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut cursor = after;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no matching event in {group_id:?}"
            );
            let (status, body) = self
                .get(&format!(
                    "/v1/threads/{}/events?after={cursor}&wait=5",
                    seg(group_id)
                ))
                .await;
            assert_eq!(status, 200, "{body}");
            for event in body["events"].as_array().unwrap() {
                if pred(event) {
                    return event.clone();
                }
            }
            cursor = body["next_after"].as_u64().unwrap();
        }
    }

    /// Waits for an event of `kind` for call `id`.
    pub async fn wait_for(&self, group_id: &str, id: &str, kind: &str) -> Value {
        self.wait_event(group_id, 0, |e| e["type"] == kind && e["id"] == id)
            .await
    }

    /// Events of one type for one call.
    pub async fn count(&self, group_id: &str, id: &str, kind: &str) -> usize {
        self.events(group_id, 0)
            .await
            .iter()
            .filter(|e| e["type"] == kind && e["id"] == id)
            .count()
    }
}
