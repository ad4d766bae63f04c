//! DNS-rebinding protection and the optional bearer token: the checks every
//! `/mcp` request passes before its body is read.

use crate::identity::Identity;
use axum::http::{header, HeaderMap};

use super::jsonrpc::{RpcError, INVALID_REQUEST};
use super::McpConfig;
use crate::digest::{same, sha256};
use crate::http::origin::is_loopback_host;

fn allowed_host(config: &McpConfig, host: &str) -> bool {
    crate::http::host::allowed(&config.allowed_hosts, host)
}

/// Browsers send `Origin` on cross-site requests: an origin on a loopback
/// host, or one listed, may talk to Ferry; any other is a page trying to
/// reach a local server through DNS rebinding. Unlike the native API's
/// rule (`http::origin`), a loopback origin on any port passes: browser
/// clients of MCP (the Inspector) are served from a port of their own, and
/// `/mcp` only submits calls, which still wait for a reviewer where gated.
fn allowed_origin(config: &McpConfig, origin: &str) -> bool {
    if config
        .allowed_origins
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(origin.trim_end_matches('/')))
    {
        return true;
    }
    let Ok(url) = url::Url::parse(origin) else {
        return false;
    };
    url.host().is_some_and(|host| is_loopback_host(&host))
}

/// The identity of whoever holds `--mcp-bearer-token`: an agent, which may
/// act only in the threads it creates.
pub const MCP_TOKEN_IDENTITY: &str = "mcp";

/// Refuses a request from a foreign `Host` or `Origin` (403), or without
/// the configured bearer token (401); else who asks.
pub fn check(config: &McpConfig, headers: &HeaderMap) -> Result<Identity, RpcError> {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    match text(header::HOST) {
        Some(host) if allowed_host(config, host) => {}
        Some(host) => {
            return Err(RpcError::transport(
                403,
                INVALID_REQUEST,
                format!("Forbidden: Host {host:?} is not allowed (DNS-rebinding protection)"),
            ))
        }
        None => {
            return Err(RpcError::transport(
                400,
                INVALID_REQUEST,
                "Bad Request: no Host header",
            ))
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !allowed_origin(config, origin) {
            return Err(RpcError::transport(
                403,
                INVALID_REQUEST,
                format!("Forbidden: Origin {origin:?} is not allowed (DNS-rebinding protection)"),
            ));
        }
    }
    let given = text(header::AUTHORIZATION)
        .and_then(crate::http::bearer_token)
        .unwrap_or("");
    // `--mcp-bearer-token` is the agent's; the native API's tokens are
    // the operator's here too. With neither configured, `/mcp` is open.
    let own = config.bearer_token.as_deref();
    let identity = if own.is_some_and(|token| same(&sha256(given), &sha256(token))) {
        Some(Identity::agent(MCP_TOKEN_IDENTITY))
    } else if let Some(identity) = config.api_tokens.identify(given) {
        Some(identity)
    } else if own.is_none() && !config.api_tokens.required() {
        Some(Identity::anonymous())
    } else {
        None
    };
    identity.ok_or_else(|| {
        RpcError::transport(
            401,
            INVALID_REQUEST,
            "Unauthorized: a valid bearer token is required",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(host: &str, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        if let Some(o) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(o).unwrap());
        }
        h
    }

    #[test]
    fn loopback_passes_and_foreign_hosts_and_origins_do_not() {
        let config = McpConfig::default();
        assert!(check(&config, &headers("127.0.0.1:8080", None)).is_ok());
        assert!(check(
            &config,
            &headers("[::1]:8080", Some("http://localhost:6274"))
        )
        .is_ok());
        let host = check(&config, &headers("evil.example.com", None)).unwrap_err();
        assert_eq!(host.http_status, 403);
        let origin = check(
            &config,
            &headers("localhost", Some("http://evil.example.com")),
        );
        assert_eq!(origin.unwrap_err().http_status, 403);
        let listed = McpConfig {
            allowed_hosts: vec!["ferry.internal".into()],
            allowed_origins: vec!["https://app.example.com".into()],
            ..McpConfig::default()
        };
        assert!(check(
            &listed,
            &headers("ferry.internal:443", Some("https://app.example.com"))
        )
        .is_ok());
        // Any case of `localhost`, any spelling of a loopback address.
        for host in ["LocalHost:8080", "LOCALHOST", "127.0.0.2", "[0:0::1]:80"] {
            assert!(check(&config, &headers(host, None)).is_ok(), "{host}");
        }
        for origin in [
            "http://LOCALHOST:3000",
            "http://127.1.2.3",
            "http://[0::1]:80",
        ] {
            let h = headers("localhost", Some(origin));
            assert!(check(&config, &h).is_ok(), "{origin}");
        }
        // Near misses stay foreign.
        for host in [
            "localhost.evil.com",
            "128.0.0.1",
            "[::2]",
            "localhost.",
            // What follows the host must be a port.
            "localhost:evil.com",
            "127.0.0.1:80.evil.com",
            "[::1].evil.com",
            "[::1]evil.com",
            "localhost:80:81",
        ] {
            let refused = check(&config, &headers(host, None)).unwrap_err();
            assert_eq!(refused.http_status, 403, "{host}");
        }
        // An IPv6 literal without its closing bracket: refused, no panic.
        for odd in ["[", "[::1", "[::1:8080"] {
            let refused = check(&config, &headers(odd, None)).unwrap_err();
            assert_eq!(refused.http_status, 403, "{odd}");
        }
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let config = McpConfig {
            bearer_token: Some("s3cret".into()),
            ..McpConfig::default()
        };
        for value in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret"] {
            let mut h = headers("localhost", None);
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            assert!(check(&config, &h).is_ok(), "{value}");
        }
        for value in ["Bearer wrong", "Basic s3cret", "s3cret", "Bearers3cret"] {
            let mut h = headers("localhost", None);
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            assert_eq!(check(&config, &h).unwrap_err().http_status, 401, "{value}");
        }
    }

    #[test]
    fn the_bearer_token_is_required_when_configured() {
        let config = McpConfig {
            bearer_token: Some("s3cret".into()),
            ..McpConfig::default()
        };
        let mut h = headers("localhost", None);
        assert_eq!(check(&config, &h).unwrap_err().http_status, 401);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer wrong!"),
        );
        assert_eq!(check(&config, &h).unwrap_err().http_status, 401);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret"),
        );
        assert!(check(&config, &h).is_ok());
    }

    /// `/mcp` takes the native API's tokens (the operator's), beside its
    /// own token when it has one (the agent's).
    #[test]
    fn the_api_tokens_guard_mcp_unless_it_has_its_own() {
        let api_token = "agents-token-0123456789";
        let api_tokens = crate::http::auth::ApiTokens::new(&[api_token]).unwrap();
        let with = |authorization: Option<&str>| {
            let mut h = headers("localhost", None);
            if let Some(value) = authorization {
                h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            }
            h
        };
        let config = McpConfig {
            api_tokens: api_tokens.clone(),
            ..McpConfig::default()
        };
        let api_bearer = format!("Bearer {api_token}");
        assert_eq!(check(&config, &with(None)).unwrap_err().http_status, 401);
        assert_eq!(
            check(&config, &with(Some("Bearer wrong!")))
                .unwrap_err()
                .http_status,
            401
        );
        assert!(check(&config, &with(Some(&api_bearer))).is_ok());
        let own = McpConfig {
            bearer_token: Some("s3cret".into()),
            api_tokens,
            ..McpConfig::default()
        };
        let operator = check(&own, &with(Some(&api_bearer))).unwrap();
        assert_eq!(operator.reach(), &crate::identity::Reach::Everywhere);
        let agent = check(&own, &with(Some("Bearer s3cret"))).unwrap();
        assert_eq!(agent.name(), MCP_TOKEN_IDENTITY);
        assert_eq!(agent.reach(), &crate::identity::Reach::OwnThreads);
        assert_eq!(check(&own, &with(None)).unwrap_err().http_status, 401);
        assert!(check(&McpConfig::default(), &with(None)).is_ok());
    }
}
