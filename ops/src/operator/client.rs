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
    #[error("{}", refused(*.status, .body, *.token_sent))]
    Refused {
        status: StatusCode,
        body: ErrorBody,
        /// Whether the request carried an API token (for the hint a 401
        /// gets).
        token_sent: bool,
    },
    /// Ferry could not be reached (or, behind a gateway, the gateway could
    /// not reach it), or its answer was cut off.
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

/// `401 unauthorized: …`, then one line per refused argument; what came
/// from elsewhere (argument names are the agent's) made printable.
fn refused(status: StatusCode, body: &ErrorBody, token_sent: bool) -> String {
    let mut text = format!(
        "{} {}: {}",
        status.as_u16(),
        printable(&body.error.code),
        printable(&body.error.message)
    );
    for (name, message) in body.error.parameter_errors.iter().flatten() {
        let message = message
            .as_str()
            .map_or_else(|| message.to_string(), str::to_owned);
        text.push_str(&format!("\n  {}: {}", printable(name), printable(&message)));
    }
    match status {
        StatusCode::UNAUTHORIZED if token_sent => {
            text.push_str("\n(Ferry refused the API token sent: check FERRY_API_TOKEN)")
        }
        StatusCode::UNAUTHORIZED => {
            text.push_str("\n(this Ferry wants an API token: set FERRY_API_TOKEN)")
        }
        StatusCode::NOT_FOUND if body.error.message == NO_SUCH_ENDPOINT => {
            text.push_str("\n(is --url Ferry's base URL, with no path of its own?)")
        }
        _ => {}
    }
    text
}

/// What Ferry says of a path that is none of its routes.
const NO_SUCH_ENDPOINT: &str = "no such endpoint";

/// `text` with control characters escaped (`\u{1b}`, `\n`), so that
/// what a server or an agent wrote can neither start a line of its own nor
/// drive the terminal.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if unprintable(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// What [`printable`] escapes: control characters, the line breaks
/// Unicode does not count as such, and the direction overrides that
/// reorder what a line shows.
pub fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
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
        if let Some(token) = &connection.api_token {
            // Said without the token, which may be most of a real one.
            if reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).is_err() {
                return Err(Failure::Usage(
                    "the API token (--api-token or FERRY_API_TOKEN) holds characters no \
                     HTTP header can carry"
                        .into(),
                ));
            }
        }
        Ok(Self {
            http,
            base: connection.url.trim_end_matches('/').to_owned(),
            token: connection.api_token.clone(),
        })
    }

    /// `GET`, answered at once.
    pub async fn get(&self, path: &[&str], query: &[(&str, String)]) -> Result<Value, Failure> {
        self.poll(path, query, Duration::ZERO).await
    }

    /// A `GET` that asks Ferry to long-poll for up to `wait`.
    pub async fn poll(
        &self,
        path: &[&str],
        query: &[(&str, String)],
        wait: Duration,
    ) -> Result<Value, Failure> {
        self.request(Method::GET, path, query, None, wait).await
    }

    /// Sends one request, answered at once; `path` is its segments under
    /// the base URL.
    pub async fn send(
        &self,
        method: Method,
        path: &[&str],
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        self.request(method, path, query, body, Duration::ZERO)
            .await
    }

    /// Sends one request; `wait` is the long-poll it asks Ferry for, if
    /// any.
    async fn request(
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
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(str::to_owned);
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
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => Err(Failure::Refused {
                status,
                body,
                token_sent: self.token.is_some(),
            }),
            Err(_) => Err(self.not_ferry(status, location.as_deref(), &text, url.path())),
        }
    }

    /// An error answer without Ferry's error shape: not Ferry (the wrong
    /// `--url`, a redirect), or a gateway in front of it that cannot reach
    /// it, which is an outage like Ferry not answering.
    fn not_ferry(
        &self,
        status: StatusCode,
        location: Option<&str>,
        text: &str,
        path: &str,
    ) -> Failure {
        let mut said: String = text.trim().chars().take(200).collect();
        if said.is_empty() {
            said = status
                .canonical_reason()
                .unwrap_or("no reason given")
                .into();
        }
        let said = printable(&said);
        if matches!(
            status,
            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
        ) {
            return Failure::Unreachable(format!(
                "{} answered {status} for {path} without Ferry's error ({said}): a gateway that \
                 cannot reach Ferry?",
                self.base
            ));
        }
        let redirect = location
            .map(|to| format!(", redirecting to {} (not followed)", printable(to)))
            .unwrap_or_default();
        Failure::NotFerry(format!(
            "{} answered {status} for {path}{redirect} without Ferry's error ({said}); is --url \
             Ferry's base URL?",
            self.base
        ))
    }

    /// [`Client::poll`] for a command that waits anyway (`--follow`,
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
            match self.poll(path, query, wait).await {
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
            token_sent: false,
        };
        assert_eq!(
            failure.to_string(),
            "422 invalid_arguments: arguments do not match\n  b: must be a number"
        );
        assert_eq!(failure.exit_code(), 1);
    }

    #[test]
    fn control_characters_are_shown_not_sent_to_the_terminal() {
        assert_eq!(printable("a\u{1b}[31mb\nc\td ü"), "a\\u{1b}[31mb\\nc\\td ü");
        assert_eq!(printable("a\u{2028}b\u{202e}c"), "a\\u{2028}b\\u{202e}c");
        let body: ErrorBody = serde_json::from_value(serde_json::json!({"error": {
            "code": "invalid_arguments", "message": "bad\nline",
            "parameter_errors": {"\u{1b}[1mz\nq": "must be\u{7} a number"}
        }}))
        .unwrap();
        let text = refused(StatusCode::UNPROCESSABLE_ENTITY, &body, false);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text}"
        );
    }

    #[test]
    fn a_token_no_header_can_carry_is_a_usage_error_that_does_not_repeat_it() {
        let refused = Client::new(&Connection {
            url: "http://127.0.0.1:1".into(),
            api_token: Some("secret-part\nrest".into()),
        })
        .err()
        .expect("refused");
        assert_eq!(refused.exit_code(), 2);
        assert!(!refused.to_string().contains("secret-part"), "{refused}");
    }
}
