//! What the native API accepts from browsers: requests that name this
//! Ferry in `Host` (DNS-rebinding protection, `host`), and changes only
//! from Ferry's own pages. A browser sends `Origin` with every request
//! that changes something, and a "simple" one (a form, or `fetch` with
//! `text/plain`) is sent without asking first: any page a reviewer opens,
//! including one served on another port of the same machine, could
//! otherwise approve a gated call, grant `allow_always`, answer a choice
//! or cancel calls. Clients that are not browsers send no `Origin`, and
//! the dashboard's requests are same-origin, so a request changing
//! anything is refused (403) only when it names an origin other than the
//! one it was sent to (the `Host` it names, when that is Ferry's) or the
//! public URL's.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ferry_engine::log_rate::LogRate;
use ferry_proto::ErrorCode;

use super::ApiError;

/// Requests refused for their `Host` or `Origin`, logged a few a minute:
/// any page a browser opens can send them.
static REFUSED: LogRate = LogRate::new(Duration::from_secs(60), 5);

/// Logs a request refused as another site's, at a bounded rate.
pub(crate) fn warn_refused(what: &'static str, value: &str, path: &str) {
    if let Some(suppressed) = REFUSED.admit() {
        tracing::warn!(what, value, path, suppressed, "cross-site request refused");
    }
}

/// Whether a URL's host is this machine: `localhost` (in any case) or a
/// loopback address. The native API, OXP and `/mcp` share this one rule.
pub(crate) fn is_loopback_host<S: AsRef<str>>(host: &url::Host<S>) -> bool {
    match host {
        url::Host::Domain(d) => d.as_ref().eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// The names this Ferry answers to, and the origin of its public URL.
#[derive(Clone)]
pub struct Origins {
    /// The public URL's origin.
    public: Option<String>,
    /// `Host` values besides loopback ones: the public URL's authority and
    /// those configured (`--mcp-allowed-host`).
    hosts: Vec<String>,
}

impl Origins {
    pub fn new(public_url: &str, extra_hosts: &[String]) -> Self {
        let url = url::Url::parse(public_url).ok();
        let public = url
            .as_ref()
            .map(|u| u.origin())
            .filter(url::Origin::is_tuple)
            .map(|o| o.ascii_serialization());
        let authority = url.as_ref().and_then(|u| {
            let host = u.host_str()?;
            Some(match u.port() {
                Some(port) => format!("{host}:{port}"),
                None => host.to_owned(),
            })
        });
        let hosts = authority.into_iter().chain(extra_hosts.iter().cloned());
        Self {
            public,
            hosts: hosts.collect(),
        }
    }

    /// Whether `host` (a `Host` header's value) names this Ferry.
    pub(crate) fn own_host(&self, host: &str) -> bool {
        super::host::allowed(&self.hosts, host)
    }

    /// Whether a request from `origin` may change anything, arriving with
    /// `Host: host`: the public URL's origin, or the one the request was
    /// sent to. That is `Host`'s own (same name and port, over HTTP, or
    /// HTTPS for a proxy in front), and only when `Host` is Ferry's: a page
    /// that points its own name at Ferry (DNS rebinding) names it in both.
    fn allows(&self, origin: &str, host: Option<&str>) -> bool {
        let Some(origin) = serialized(origin) else {
            // `null` (a sandboxed frame, a file) or garbage.
            return false;
        };
        if self.public.as_deref() == Some(origin.as_str()) {
            return true;
        }
        host.filter(|h| self.own_host(h)).is_some_and(|host| {
            ["http", "https"]
                .iter()
                .any(|scheme| serialized(&format!("{scheme}://{host}")).as_ref() == Some(&origin))
        })
    }
}

/// An origin as browsers serialize it (lowercase name, no default port),
/// or `None` for one that has no host.
fn serialized(origin: &str) -> Option<String> {
    let origin = url::Url::parse(origin).ok()?.origin();
    origin.is_tuple().then(|| origin.ascii_serialization())
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
        warn_refused("origin", origin, request.uri().path());
        return ApiError::new(
            ErrorCode::Forbidden,
            format!("a request from the web page at {origin:?} may not change anything here"),
        )
        .into_response();
    }
    next.run(request).await
}

/// Routes any `Host` may reach: tools' callbacks (the URL is the tool's
/// credential, which no page knows), and the health check and metrics,
/// which load balancers and scrapers ask of a node's own address and which
/// tell nothing of any thread.
fn answers_any_host(path: &str) -> bool {
    path == "/healthz" || path == "/metrics" || path.starts_with("/v1/callbacks/")
}

/// The authority a request names: its `Host`, or the URI's (HTTP/2's
/// `:authority`). `Err` for a `Host` that is not text.
fn authority(request: &Request) -> Option<Result<&str, ()>> {
    match request.headers().get(header::HOST) {
        Some(host) => Some(host.to_str().map_err(|_| ())),
        None => request.uri().authority().map(|a| Ok(a.as_str())),
    }
}

/// Refuses a request whose `Host` is not this Ferry's (403), or that has
/// none (400), before it reaches any route but [`answers_any_host`]'s.
pub async fn refuse_foreign_host(
    State(origins): State<Origins>,
    request: Request,
    next: Next,
) -> Response {
    match foreign_host(&origins, &request) {
        Some(refusal) => refusal.into_response(),
        None => next.run(request).await,
    }
}

/// Why `request` is refused for its `Host` (403 for a foreign one, 400
/// for none), if it is: the check of [`refuse_foreign_host`], for fronts
/// that answer in a shape of their own.
pub(crate) fn foreign_host(origins: &Origins, request: &Request) -> Option<ApiError> {
    let path = request.uri().path();
    if answers_any_host(path) {
        return None;
    }
    match authority(request) {
        Some(Ok(host)) if origins.own_host(host) => None,
        Some(found) => {
            let host = found.unwrap_or("(not text)");
            warn_refused("host", host, path);
            Some(ApiError::new(
                ErrorCode::Forbidden,
                format!("Host {host:?} is not this server's name (DNS-rebinding protection)"),
            ))
        }
        None => Some(ApiError::new(
            ErrorCode::InvalidRequest,
            "the request names no Host",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_origin_a_request_was_sent_to_or_the_public_one_may_change_things() {
        let origins = Origins::new("https://ferry.example.com/", &["10.0.0.5".into()]);
        for (origin, host) in [
            ("https://ferry.example.com", "10.0.0.5:8080"),
            ("http://10.0.0.5:8080", "10.0.0.5:8080"),
            ("http://127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://LOCALHOST:8080", "localhost:8080"),
            ("http://[::1]:8080", "[0:0::1]:8080"),
            ("http://localhost", "localhost:80"),
            // Behind a proxy that terminates TLS.
            ("https://10.0.0.5", "10.0.0.5:443"),
        ] {
            assert!(origins.allows(origin, Some(host)), "{origin} to {host}");
        }
        for (origin, host) in [
            // Another port of this machine is another site.
            ("http://localhost:5173", "127.0.0.1:8080"),
            ("http://localhost:5173", "localhost:8080"),
            ("http://127.0.0.1:8081", "127.0.0.1:8080"),
            ("http://10.0.0.5:8081", "10.0.0.5:8080"),
            // A page that pointed its own name at Ferry (DNS rebinding)
            // sends that name in `Host` too.
            ("http://rebound.example:8080", "rebound.example:8080"),
            ("http://evil.example", "127.0.0.1:8080"),
            ("https://ferry.example.com.evil.example", "127.0.0.1:8080"),
            ("http://localhost:8080/path", "localhost:8080/path"),
            ("null", "127.0.0.1:8080"),
            ("", "127.0.0.1:8080"),
        ] {
            assert!(!origins.allows(origin, Some(host)), "{origin} to {host}");
        }
        assert!(!origins.allows("http://127.0.0.1:8080", None));
    }

    #[test]
    fn the_public_urls_host_and_the_listed_ones_are_ferrys_own() {
        let origins = Origins::new("https://Ferry.Example.com:8443", &["ferry.internal".into()]);
        for host in [
            "ferry.example.com:8443",
            "ferry.internal",
            "ferry.internal:8080",
            "localhost:1",
            "[::1]",
        ] {
            assert!(origins.own_host(host), "{host}");
        }
        for host in [
            "ferry.example.com",
            "ferry.example.com:443",
            "evil.example",
            "localhost:x",
        ] {
            assert!(!origins.own_host(host), "{host}");
        }
    }
}
