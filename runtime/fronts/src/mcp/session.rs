//! Protocol revisions and how a request picks one: a session opened by the
//! `initialize` handshake (2025 revisions, `Mcp-Session-Id`), or the
//! stateless 2026-07-28 envelope carried by each request's `_meta`.

use crate::identity::Identity;
use axum::http::HeaderMap;
use serde_json::{json, Map, Value};

use super::jsonrpc::{
    RpcError, HEADER_MISMATCH, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, SESSION_NOT_FOUND,
    UNSUPPORTED_PROTOCOL_VERSION,
};
use super::sessions::Sessions;

/// The revisions reachable through `initialize`, newest first.
pub const HANDSHAKE_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
/// The one revision whose sessions take JSON-RPC batches.
pub const BATCH_VERSION: &str = "2025-03-26";
/// The stateless revision: no handshake, no session.
pub const MODERN_VERSION: &str = "2026-07-28";

pub const PROTOCOL_VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";
pub const CLIENT_CAPABILITIES_META: &str = "io.modelcontextprotocol/clientCapabilities";

pub const SESSION_HEADER: &str = "mcp-session-id";
pub const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";
const METHOD_HEADER: &str = "mcp-method";
const NAME_HEADER: &str = "mcp-name";

/// Every revision Ferry speaks, the stateless one first.
pub fn supported_versions() -> Vec<&'static str> {
    std::iter::once(MODERN_VERSION)
        .chain(HANDSHAKE_VERSIONS)
        .collect()
}

/// The version answered to an `initialize` asking for `requested`: the same
/// when Ferry speaks it, else the newest handshake revision (the client
/// then decides whether it can go on).
pub fn negotiate(requested: Option<&str>) -> &'static str {
    HANDSHAKE_VERSIONS
        .into_iter()
        .find(|v| Some(*v) == requested)
        .unwrap_or(HANDSHAKE_VERSIONS[0])
}

/// How one request is served.
#[derive(Debug, Clone)]
pub struct Context {
    /// The revision the request runs under.
    pub version: String,
    /// The session, for the 2025 revisions; `None` when stateless.
    pub session: Option<String>,
    /// Who asks (`security::check`).
    pub identity: Identity,
}

impl Context {
    pub fn stateless(&self) -> bool {
        self.session.is_none()
    }

    /// The thread of the session's calls that name none: a digest of its
    /// id, so that listing threads or reading a task id shows no session
    /// id (which would let its reader speak in the session).
    pub fn session_thread(&self) -> Option<String> {
        self.session.as_deref().map(thread_of_session)
    }

    /// Tasks (`execution.taskSupport`, `tasks/*`) are a 2025-11-25 feature;
    /// 2026-07-28 moved them out of the core protocol.
    pub fn tasks(&self) -> bool {
        self.version == HANDSHAKE_VERSIONS[0]
    }
}

/// The thread of session `id` ([`Context::session_thread`]).
pub fn thread_of_session(id: &str) -> String {
    format!("mcp-session-{}", crate::digest::sha256_hex(id, 16))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The session a request names, if it names one.
pub async fn in_session(
    sessions: &dyn Sessions,
    headers: &HeaderMap,
    identity: &Identity,
) -> Option<Result<Context, RpcError>> {
    let id = header(headers, SESSION_HEADER)?;
    let version = match sessions.get(id).await {
        // A session serves the identity that opened it; to any other it
        // is as unknown as one that never was.
        Ok(Some(session)) if session.holder == identity.name() => session.version,
        Ok(_) => {
            return Some(Err(RpcError::transport(
                404,
                SESSION_NOT_FOUND,
                "Session not found: initialize again",
            )))
        }
        Err(e) => return Some(Err(unavailable(&e))),
    };
    if let Some(asked) = header(headers, PROTOCOL_VERSION_HEADER) {
        if !HANDSHAKE_VERSIONS.contains(&asked) {
            return Some(Err(RpcError::transport(
                400,
                INVALID_REQUEST,
                format!("Bad Request: unsupported MCP-Protocol-Version {asked:?}"),
            )));
        }
    }
    Some(Ok(Context {
        version,
        session: Some(id.to_owned()),
        identity: identity.clone(),
    }))
}

/// The answer while sessions cannot be read or written (a cluster node
/// without NATS): 503, and the same request may be sent again.
pub fn unavailable(e: &super::sessions::Unavailable) -> RpcError {
    RpcError::transport(
        503,
        INTERNAL_ERROR,
        format!("{e}; nothing changed, retry the same request"),
    )
}

/// Whether a session-less request speaks the stateless revision: it carries
/// the `_meta` envelope, the version header, or is `server/discover`.
pub fn looks_modern(method: &str, params: &Map<String, Value>, headers: &HeaderMap) -> bool {
    method == "server/discover"
        || header(headers, PROTOCOL_VERSION_HEADER).is_some()
        || params
            .get("_meta")
            .and_then(Value::as_object)
            .is_some_and(|m| m.contains_key(PROTOCOL_VERSION_META))
}

/// Checks a stateless request's envelope, in the order the 2026-07-28
/// revision gives: `_meta` keys, then the routing headers (which must agree
/// with the body), then the version itself.
pub fn stateless(
    method: &str,
    params: &Map<String, Value>,
    headers: &HeaderMap,
    identity: &Identity,
) -> Result<Context, RpcError> {
    let bad_envelope = |m: String| RpcError::transport(400, INVALID_PARAMS, m);
    let meta = params
        .get("_meta")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            bad_envelope(format!(
                "params._meta must be an object carrying {PROTOCOL_VERSION_META:?} and {CLIENT_CAPABILITIES_META:?}"
            ))
        })?;
    let missing: Vec<&str> = [PROTOCOL_VERSION_META, CLIENT_CAPABILITIES_META]
        .into_iter()
        .filter(|k| !meta.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        return Err(bad_envelope(format!(
            "params._meta is missing the required key(s): {}",
            missing.join(", ")
        )));
    }
    let version = &meta[PROTOCOL_VERSION_META];
    let mismatch = |what: &str| {
        RpcError::transport(
            400,
            HEADER_MISMATCH,
            format!("the {what} header does not match the request body"),
        )
    };
    if header(headers, PROTOCOL_VERSION_HEADER)
        .map(|h| json!(h))
        .as_ref()
        != Some(version)
    {
        return Err(mismatch("MCP-Protocol-Version"));
    }
    if header(headers, METHOD_HEADER) != Some(method) {
        return Err(mismatch("Mcp-Method"));
    }
    if method == "tools/call" {
        if let Some(name) = params.get("name").and_then(Value::as_str) {
            if header(headers, NAME_HEADER)
                .and_then(decode_header_value)
                .as_deref()
                != Some(name)
            {
                return Err(mismatch("Mcp-Name"));
            }
        }
    }
    match version.as_str() {
        Some(MODERN_VERSION) => Ok(Context {
            version: MODERN_VERSION.to_owned(),
            session: None,
            identity: identity.clone(),
        }),
        Some(other) => Err(RpcError::transport(
            400,
            UNSUPPORTED_PROTOCOL_VERSION,
            "Unsupported protocol version",
        )
        // The handshake revisions are listed too: a client that shares
        // none of the stateless ones falls back to `initialize`.
        .with_data(json!({"supported": supported_versions(), "requested": other}))),
        None => Err(bad_envelope(
            "the protocol version in params._meta must be a string".into(),
        )),
    }
}

/// Header values that would not survive HTTP travel verbatim are sent as
/// `=?base64?…?=`; `None` for a malformed one, so it never matches.
fn decode_header_value(value: &str) -> Option<String> {
    use base64::Engine as _;
    let Some(inner) = value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    else {
        return Some(value.to_owned());
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(inner)
        .ok()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn initialize_negotiates_down_to_known_revisions() {
        assert_eq!(negotiate(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate(Some("2025-03-26")), "2025-03-26");
        assert_eq!(negotiate(Some("2024-11-05")), "2025-11-25");
        assert_eq!(negotiate(Some("2026-07-28")), "2025-11-25");
        assert_eq!(negotiate(None), "2025-11-25");
    }

    fn modern(method: &str, name: Option<&str>) -> (Map<String, Value>, HeaderMap) {
        let mut params = json!({"_meta": {
            PROTOCOL_VERSION_META: MODERN_VERSION, CLIENT_CAPABILITIES_META: {}
        }});
        if let Some(n) = name {
            params["name"] = json!(n);
        }
        let mut h = HeaderMap::new();
        h.insert(
            PROTOCOL_VERSION_HEADER,
            HeaderValue::from_static(MODERN_VERSION),
        );
        h.insert(METHOD_HEADER, HeaderValue::from_str(method).unwrap());
        if let Some(n) = name {
            h.insert(NAME_HEADER, HeaderValue::from_str(n).unwrap());
        }
        (params.as_object().unwrap().clone(), h)
    }

    #[test]
    fn the_stateless_envelope_is_checked_rung_by_rung() {
        let (params, headers) = modern("tools/call", Some("echo"));
        assert!(
            stateless("tools/call", &params, &headers, &Identity::anonymous())
                .unwrap()
                .stateless()
        );

        let (_, headers) = modern("tools/call", Some("echo"));
        let code = |p: &Map<String, Value>, h: &HeaderMap| {
            stateless("tools/call", p, h, &Identity::anonymous())
                .unwrap_err()
                .code
        };
        assert_eq!(code(&Map::new(), &headers), INVALID_PARAMS);

        let (params, mut wrong_name) = modern("tools/call", Some("echo"));
        wrong_name.insert(NAME_HEADER, HeaderValue::from_static("fail"));
        assert_eq!(code(&params, &wrong_name), HEADER_MISMATCH);

        let (mut params, headers) = modern("tools/call", Some("echo"));
        params["_meta"][PROTOCOL_VERSION_META] = json!("2030-01-01");
        assert_eq!(code(&params, &headers), HEADER_MISMATCH);
        let mut h = headers.clone();
        h.insert(
            PROTOCOL_VERSION_HEADER,
            HeaderValue::from_static("2030-01-01"),
        );
        let e = stateless("tools/call", &params, &h, &Identity::anonymous()).unwrap_err();
        assert_eq!(e.code, UNSUPPORTED_PROTOCOL_VERSION);
        assert_eq!(e.data.unwrap()["supported"][0], json!(MODERN_VERSION));
    }

    #[test]
    fn base64_wrapped_names_decode() {
        assert_eq!(
            decode_header_value("=?base64?w6ljaG8=?="),
            Some("écho".into())
        );
        assert_eq!(decode_header_value("echo"), Some("echo".into()));
        assert_eq!(decode_header_value("=?base64?%%?="), None);
    }
}
