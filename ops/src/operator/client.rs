//! A client of a running Ferry's native API, for the operator commands:
//! every path segment percent-encoded (any `group_id` or `id` works), the
//! API's own error shape turned into a [`Failure`] with its exit code.

use std::time::Duration;

use ferry_proto::api::ErrorBody;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::{Method, StatusCode, Url};
use serde_json::Value;

use super::Connection;

/// What a path segment keeps as it is: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// How long a request may take beyond the long-poll it asks for. Ferry
/// answers everything else at once, but for a toolset registration, which
/// fetches the tool server's manifest first.
const ANSWER_TIME: Duration = Duration::from_secs(60);

/// The longest pause between two tries through an outage.
const OUTAGE_PAUSE: Duration = Duration::from_secs(5);

/// Why an operator command did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Ferry answered with an error: what it said, as it said it.
    #[error("{}", refused(*.status, .body))]
    Refused { status: StatusCode, body: ErrorBody },
    /// Ferry could not be reached, or its answer was cut off.
    #[error("{0}")]
    Unreachable(String),
    /// What answered does not answer as Ferry does.
    #[error("{0}")]
    NotFerry(String),
    /// The arguments cannot make a request (checked before sending one).
    #[error("{0}")]
    Usage(String),
    /// `calls submit --wait`: the call ended without a successful result
    /// (how it ended, and its result's text).
    #[error("{0}")]
    Unsuccessful(String),
}

impl Failure {
    /// The process's exit code (clap's usage errors exit 2 as well).
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Refused { .. } => 1,
            Self::Usage(_) => 2,
            Self::Unreachable(_) | Self::NotFerry(_) => 3,
            Self::Unsuccessful(_) => 4,
        }
    }

    /// Whether asking again later may succeed: Ferry was out of reach, or
    /// said that it (or what it stands on, NATS in a cluster) is.
    fn is_outage(&self) -> bool {
        match self {
            Self::Unreachable(_) => true,
            Self::Refused { status, .. } => matches!(
                *status,
                StatusCode::BAD_GATEWAY
                    | StatusCode::SERVICE_UNAVAILABLE
                    | StatusCode::GATEWAY_TIMEOUT
            ),
            _ => false,
        }
    }
}

/// `401 unauthorized: …`, then one line per refused argument.
fn refused(status: StatusCode, body: &ErrorBody) -> String {
    let mut text = format!(
        "{} {}: {}",
        status.as_u16(),
        body.error.code,
        body.error.message
    );
    for (name, message) in body.error.parameter_errors.iter().flatten() {
        let message = message
            .as_str()
            .map_or_else(|| message.to_string(), str::to_owned);
        text.push_str(&format!("\n  {name}: {message}"));
    }
    if status == StatusCode::UNAUTHORIZED {
        text.push_str("\n(this Ferry wants an API token: set FERRY_API_TOKEN)");
    }
    text
}

pub struct Client {
    http: reqwest::Client,
    /// The API's base URL, without a trailing `/`.
    base: String,
    token: Option<String>,
}

impl Client {
    pub fn new(connection: &Connection) -> Result<Self, Failure> {
        let http = reqwest::Client::builder()
            // Straight to Ferry, as every other Ferry client: a proxy from
            // the environment would also catch loopback addresses.
            .no_proxy()
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Failure::Unreachable(format!("building the HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: connection.url.trim_end_matches('/').to_owned(),
            token: connection.api_token.clone(),
        })
    }

    /// `GET`, answered at once.
    pub async fn get(&self, path: &[&str], query: &[(&str, String)]) -> Result<Value, Failure> {
        self.send(Method::GET, path, query, None, Duration::ZERO)
            .await
    }

    /// Sends one request; `path` is its segments under the base URL, and
    /// `wait` the long-poll it asks Ferry for, if any.
    pub async fn send(
        &self,
        method: Method,
        path: &[&str],
        query: &[(&str, String)],
        body: Option<&Value>,
        wait: Duration,
    ) -> Result<Value, Failure> {
        let url = self.url(path, query)?;
        let mut request = self
            .http
            .request(method.clone(), url.clone())
            .timeout(ANSWER_TIME + wait);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let unreadable = |e: reqwest::Error| {
            Failure::Unreachable(format!("{method} {}: {}", url.path(), chain(&e)))
        };
        let response = request.send().await.map_err(|e| {
            Failure::Unreachable(format!(
                "cannot reach Ferry at {}: {}",
                self.base,
                chain(&e)
            ))
        })?;
        let status = response.status();
        let text = response.text().await.map_err(unreadable)?;
        if status.is_success() {
            if text.is_empty() {
                return Ok(Value::Null);
            }
            return serde_json::from_str(&text).map_err(|e| {
                Failure::NotFerry(format!(
                    "{method} {}: {status} with a body that is not JSON ({e}); is {} a Ferry?",
                    url.path(),
                    self.base
                ))
            });
        }
        let body = serde_json::from_str::<ErrorBody>(&text).unwrap_or_else(|_| {
            // Not Ferry's error shape (a proxy, or not a Ferry at all).
            let mut said: String = text.chars().take(200).collect();
            if said.trim().is_empty() {
                said = status
                    .canonical_reason()
                    .unwrap_or("no reason given")
                    .into();
            }
            ErrorBody::new("http_error", said.trim())
        });
        Err(Failure::Refused { status, body })
    }

    /// [`Client::send`] for a command that waits anyway (`--follow`,
    /// `--wait`) on a Ferry it has reached before: an outage (Ferry
    /// restarting, a node that lost NATS) is waited out, said once on
    /// stderr, instead of ending the command. Asking again is safe: only
    /// reads are sent this way.
    pub async fn read_through_outages(
        &self,
        path: &[&str],
        query: &[(&str, String)],
        wait: Duration,
    ) -> Result<Value, Failure> {
        let mut pause = Duration::from_millis(250);
        let mut said = false;
        loop {
            match self.send(Method::GET, path, query, None, wait).await {
                Err(failure) if failure.is_outage() => {
                    if !said {
                        eprintln!("ferry: {failure}; trying again until it answers");
                        said = true;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(OUTAGE_PAUSE);
                }
                answered => {
                    if said && answered.is_ok() {
                        eprintln!("ferry: answering again");
                    }
                    return answered;
                }
            }
        }
    }

    fn url(&self, path: &[&str], query: &[(&str, String)]) -> Result<Url, Failure> {
        let mut text = self.base.clone();
        for segment in path {
            // A URL reads these (encoded or not) as a relative path, so they
            // could only reach another route; Ferry refuses them as names.
            if matches!(*segment, "" | "." | "..") {
                return Err(Failure::Usage(format!(
                    "{segment:?} cannot name a thread, a call or a toolset"
                )));
            }
            text.push('/');
            text.extend(utf8_percent_encode(segment, SEGMENT));
        }
        let mut url =
            Url::parse(&text).map_err(|e| Failure::Usage(format!("{text:?} is not a URL: {e}")))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
    }
}

/// An error with its causes, which is where reqwest says what went wrong
/// ("connection refused").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(base: &str) -> Client {
        Client::new(&Connection {
            url: base.into(),
            api_token: None,
        })
        .unwrap()
    }

    #[test]
    fn segments_are_encoded_whole() {
        let client = client("http://127.0.0.1:8080/prefix/");
        let url = client
            .url(
                &["v1", "threads", "a/b ü.*>?#%", "calls", "...", "%2e%2e"],
                &[],
            )
            .unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:8080/prefix/v1/threads/a%2Fb%20%C3%BC.%2A%3E%3F%23%25/calls/.../%252e%252e"
        );
        for name in ["", ".", ".."] {
            let refused = client.url(&["v1", "threads", name], &[]).unwrap_err();
            assert_eq!(refused.exit_code(), 2, "{name:?}");
        }
        let url = client
            .url(&["v1", "events"], &[("types", "a,b&c".into())])
            .unwrap();
        assert_eq!(url.query(), Some("types=a%2Cb%26c"));
    }

    #[test]
    fn a_refusal_reads_as_ferry_said_it() {
        let body: ErrorBody = serde_json::from_value(serde_json::json!({"error": {
            "code": "invalid_arguments", "message": "arguments do not match",
            "parameter_errors": {"b": "must be a number"}
        }}))
        .unwrap();
        let failure = Failure::Refused {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            body,
        };
        assert_eq!(
            failure.to_string(),
            "422 invalid_arguments: arguments do not match\n  b: must be a number"
        );
        assert_eq!(failure.exit_code(), 1);
    }
}
