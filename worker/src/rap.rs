//! RAP dispatch (`rap-3` Transport): an attempt is a POST of the
//! invocation to the tool's endpoint, and the tool's HTTP answer says how
//! it went.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use ferry_proto::Invocation;
use reqwest::{header::RETRY_AFTER, StatusCode, Url};

use crate::dispatch::{Attempt, ToolProtocol, MAX_RETRY_AFTER};
use crate::outbound::{Outbound, Refused};

/// Sends invocations to RAP tools.
pub struct Rap {
    outbound: Outbound,
    endpoints: Endpoints,
}

impl Rap {
    pub fn new(outbound: impl Into<Outbound>) -> Self {
        Self {
            outbound: outbound.into(),
            endpoints: Endpoints::default(),
        }
    }
}

#[async_trait]
impl ToolProtocol for Rap {
    async fn attempt(&self, endpoint: &str, invocation: &Invocation, timeout: Duration) -> Attempt {
        let client = self.outbound.client();
        let request = match self.endpoints.parsed(endpoint) {
            Some(url) if self.outbound.check(&url).is_err() => return Attempt::Closed,
            Some(url) => client.post(url),
            // reqwest's own error, handled like any failed send.
            None => client.post(endpoint),
        };
        let sent = request.timeout(timeout).json(invocation).send().await;
        match sent {
            Ok(response) => {
                let retry_after = response
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| retry_after(v, std::time::SystemTime::now()));
                classify(response.status(), retry_after)
            }
            Err(e) if Refused::caused(&e) => Attempt::Closed,
            Err(_) => Attempt::Transient {
                status: None,
                retry_after: None,
            },
        }
    }
}

/// Classifies a tool's HTTP answer to an invocation (`rap-3`
/// Transport): 200 acknowledges; 429 and 5xx are worth another try; any
/// other answer is final (never retry a 4xx).
pub fn classify(status: StatusCode, retry_after: Option<Duration>) -> Attempt {
    match status.as_u16() {
        200 => Attempt::Acknowledged,
        429 | 500..=599 => Attempt::Transient {
            status: Some(status.as_u16()),
            retry_after,
        },
        other => Attempt::Final { status: other },
    }
}

/// The wait a `Retry-After` value asks for (RFC 9110 10.2.3): delay
/// seconds, or an HTTP date (a date already past asks for none). Seconds
/// too many to count ask for the longest wait honoured; anything else is
/// no header at all.
fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(
            value
                .parse::<u64>()
                .map_or(MAX_RETRY_AFTER, Duration::from_secs),
        );
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Tool endpoints, each parsed once: a process sends to few of them, and
/// parsing the URL anew was about 1% of a fast call's CPU. Cleared when it
/// holds [`Endpoints::MAX`], so endpoints that come and go cannot grow it.
#[derive(Default)]
struct Endpoints(Mutex<HashMap<String, Url>>);

impl Endpoints {
    const MAX: usize = 1024;

    /// `endpoint` parsed, or `None` if it is not a URL.
    fn parsed(&self, endpoint: &str) -> Option<Url> {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(url) = known.get(endpoint) {
            return Some(url.clone());
        }
        let url = Url::parse(endpoint).ok()?;
        if known.len() >= Self::MAX {
            known.clear();
        }
        known.insert(endpoint.to_owned(), url.clone());
        Some(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_parsed_once_and_bounded() {
        let endpoints = Endpoints::default();
        let url = endpoints.parsed("http://127.0.0.1:9/invoke").unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:9/invoke");
        assert_eq!(endpoints.parsed("http://127.0.0.1:9/invoke"), Some(url));
        assert_eq!(endpoints.parsed("not a url"), None);
        for n in 0..Endpoints::MAX + 10 {
            endpoints.parsed(&format!("http://h{n}/invoke")).unwrap();
        }
        assert!(endpoints.0.lock().unwrap().len() <= Endpoints::MAX);
    }

    #[test]
    fn retry_after_takes_seconds_or_an_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let cases = [
            ("120", Some(Duration::from_secs(120))),
            (" 7 ", Some(Duration::from_secs(7))),
            ("0", Some(Duration::ZERO)),
            // More seconds than a u64 holds: the longest wait honoured.
            ("99999999999999999999999", Some(MAX_RETRY_AFTER)),
            // The RFC's own example date, 30 s after `now`.
            (
                "Wed, 21 Oct 2015 07:28:30 GMT",
                Some(Duration::from_secs(30)),
            ),
            // A date already past: retry at once.
            ("Wed, 21 Oct 2015 07:27:00 GMT", Some(Duration::ZERO)),
            ("-5", None),
            ("1.5", None),
            ("soon", None),
            ("", None),
        ];
        for (value, expected) in cases {
            assert_eq!(retry_after(value, now), expected, "{value:?}");
        }
    }

    #[test]
    fn classification_follows_the_transport_rules() {
        let s = |code| StatusCode::from_u16(code).unwrap();
        let cases = [
            (200, Attempt::Acknowledged),
            (
                500,
                Attempt::Transient {
                    status: Some(500),
                    retry_after: None,
                },
            ),
            (
                503,
                Attempt::Transient {
                    status: Some(503),
                    retry_after: None,
                },
            ),
            (
                429,
                Attempt::Transient {
                    status: Some(429),
                    retry_after: None,
                },
            ),
            (404, Attempt::Final { status: 404 }),
            (400, Attempt::Final { status: 400 }),
            (202, Attempt::Final { status: 202 }),
            (301, Attempt::Final { status: 301 }),
        ];
        for (code, expected) in cases {
            assert_eq!(classify(s(code), None), expected, "{code}");
        }
    }
}
