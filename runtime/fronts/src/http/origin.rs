//! Cross-site request refusal for the native API. A browser sends `Origin`
//! with every cross-site request, and a "simple" one (a form, or `fetch`
//! with `text/plain`) is sent without asking first: any page a reviewer
//! opens could otherwise approve a gated call on a Ferry at `localhost`,
//! grant `allow_always`, answer a choice or cancel calls. Clients that are
//! not browsers send no `Origin`, and the dashboard's requests are
//! same-origin, so a request changing anything is refused (403) only when
//! it names an origin other than Ferry's own, its public URL's, or a
//! loopback one (as `/mcp` allows).

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ferry_proto::ErrorCode;

use super::ApiError;

/// Whether a URL's host is this machine: `localhost` (in any case) or a
/// loopback address. The native API, OXP and `/mcp` share this one rule.
pub(crate) fn is_loopback_host<S: AsRef<str>>(host: &url::Host<S>) -> bool {
    match host {
        url::Host::Domain(d) => d.as_ref().eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// Where this Ferry may be reached from a browser besides loopback: its
/// public URL's origin.
#[derive(Clone)]
pub struct Origins {
    public: Option<String>,
}

impl Origins {
    pub fn new(public_url: &str) -> Self {
        let public = url::Url::parse(public_url)
            .ok()
            .map(|u| u.origin().ascii_serialization());
        Self { public }
    }

    /// Whether a request from `origin` may change anything, arriving with
    /// `Host: host`.
    fn allows(&self, origin: &str, host: Option<&str>) -> bool {
        let Ok(url) = url::Url::parse(origin) else {
            // `null` (a sandboxed frame, a file) or garbage.
            return false;
        };
        let serialized = url.origin().ascii_serialization();
        if self.public.as_deref() == Some(serialized.as_str()) {
            return true;
        }
        let (loopback, address) = match url.host() {
            Some(host) => (
                is_loopback_host(&host),
                !matches!(host, url::Host::Domain(_)),
            ),
            None => (false, false),
        };
        // Same origin: the page was served by this address and port. Only
        // for an address: a page can point its own domain name at Ferry
        // (DNS rebinding), and its requests then name that domain in both
        // `Host` and `Origin`; a domain is this Ferry's only as its public
        // URL's, above.
        let authority = serialized.split_once("://").map(|(_, a)| a);
        let same =
            address && host.is_some_and(|h| authority.is_some_and(|a| a.eq_ignore_ascii_case(h)));
        loopback || same
    }
}

/// The other site's origin a request that would change something comes
/// from, if it does (for fronts that answer in their own error shape).
pub(crate) fn cross_site<'h>(
    origins: &Origins,
    method: &Method,
    headers: &'h HeaderMap,
) -> Option<&'h str> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let origin = headers.get(header::ORIGIN)?.to_str().unwrap_or("");
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    (!origins.allows(origin, host)).then_some(origin)
}

/// Refuses a cross-site request that would change something.
pub async fn refuse_cross_site(
    State(origins): State<Origins>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(origin) = cross_site(&origins, request.method(), request.headers()) {
        tracing::warn!(origin, path = %request.uri().path(), "cross-site request refused");
        return ApiError::new(
            ErrorCode::Forbidden,
            format!("a request from the web page at {origin:?} may not change anything here"),
        )
        .into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_ferry_and_loopback_origins_may_change_things() {
        let origins = Origins::new("https://ferry.example.com/");
        let host = Some("10.0.0.5:8080");
        for allowed in [
            "https://ferry.example.com",
            "http://10.0.0.5:8080",
            "http://localhost:3000",
            "http://127.0.0.1:8080",
            "http://[::1]:8080",
        ] {
            assert!(origins.allows(allowed, host), "{allowed}");
        }
        // A page that pointed its own name at Ferry (DNS rebinding) sends
        // that name in `Host` too.
        assert!(!origins.allows("http://rebound.example:8080", Some("rebound.example:8080")));
        for refused in [
            "http://evil.example",
            "https://ferry.example.com.evil.example",
            "http://10.0.0.5:8081",
            "null",
            "",
        ] {
            assert!(!origins.allows(refused, host), "{refused}");
        }
    }
}
