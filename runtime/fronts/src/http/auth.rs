//! Bearer tokens for the native API: the `--api-token`s, whose holder is
//! the operator identity [`API_TOKEN_IDENTITY`] (every scope, every
//! thread), and the named tokens made through `/v1/tokens`, each its own
//! identity with its scopes and bounds. Without any, the API trusts
//! whoever reaches it; with one, every request but a tool's callback (its
//! URL is its own capability), the health check and the dashboard's page
//! (whose requests carry the token) must send `Authorization: Bearer
//! <token>`, or get 401 and change nothing. Several `--api-token`s may be
//! accepted at once, so that one can be rotated without a gap. `/mcp` and
//! OXP take the same tokens, beside their own, so that setting a token
//! never leaves another way in open.

use ferry_proto::ErrorCode;
use std::sync::Arc;

use super::ApiError;
use crate::digest::{same, sha256};
use crate::identity::{Identity, Scope};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Shortest token accepted, `=` padding not counted: guessing must not be
/// practical.
pub const MIN_TOKEN_CHARS: usize = 16;
/// Longest token accepted.
pub const MAX_TOKEN_CHARS: usize = 512;
/// Longest JWT accepted: an RS256 signature alone is 342 characters.
pub const MAX_JWT_CHARS: usize = 8192;

/// Why a configured token is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "an API token must be {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} characters of a bearer token \
     (letters, digits and -._~+/, then any = padding, which does not count towards the \
     {MIN_TOKEN_CHARS}); got {0}"
)]
pub struct BadToken(String);

/// The tokens the native API accepts: the `--api-token`s, kept as SHA-256
/// digests so that comparing them takes the same time whatever a guess
/// shares with them, and, once [`ApiTokens::with_named`] gives it the
/// engine, the named tokens made through `/v1/tokens`.
#[derive(Clone, Default)]
pub struct ApiTokens {
    digests: Arc<[[u8; 32]]>,
    named: Option<Arc<crate::engine::Engine>>,
    jwt: Option<Arc<super::jwt::Jwt>>,
}

impl ApiTokens {
    /// Checks each token's syntax (RFC 6750's `b64token`, as a client
    /// can send it in an `Authorization` header) and length.
    pub fn new<S: AsRef<str>>(tokens: &[S]) -> Result<Self, BadToken> {
        let digests = tokens
            .iter()
            .map(|t| {
                let t = t.as_ref();
                let unpadded = t.trim_end_matches('=').len();
                if is_b64token(t) && unpadded >= MIN_TOKEN_CHARS && t.len() <= MAX_TOKEN_CHARS {
                    Ok(sha256(t))
                } else {
                    Err(BadToken(describe(t)))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            digests: digests.into(),
            named: None,
            jwt: None,
        })
    }

    /// These tokens, and the named tokens `engine` keeps.
    pub fn with_named(mut self, engine: Arc<crate::engine::Engine>) -> Self {
        self.named = Some(engine);
        self
    }

    /// These tokens, and the JWTs `jwt` accepts.
    pub fn with_jwt(mut self, jwt: Option<super::jwt::Jwt>) -> Self {
        self.jwt = jwt.map(Arc::new);
        self
    }

    /// Whether the API asks for a token at all: once an `--api-token` or
    /// a JWT key is set, or a named token is live.
    pub fn required(&self) -> bool {
        !self.digests.is_empty()
            || self.jwt.is_some()
            || self.named.as_ref().is_some_and(|e| e.tokens_required())
    }

    /// Who presents `given`: the operator [`API_TOKEN_IDENTITY`] for an
    /// `--api-token`, a named token's identity, or no one.
    /// Whether the named tokens are not known yet (a cluster node that
    /// has not reached NATS): a credential that is no `--api-token` can
    /// then be neither accepted nor refused.
    pub fn unknown_yet(&self) -> bool {
        self.named.as_ref().is_some_and(|e| !e.tokens_loaded())
    }

    pub fn identify(&self, given: &str) -> Option<Identity> {
        if let Some(jwt) = self.jwt_for(given) {
            return jwt.identify(given).ok();
        }
        if given.len() > MAX_TOKEN_CHARS {
            return None;
        }
        if self.accepts(given) {
            return Some(Identity::operator(API_TOKEN_IDENTITY));
        }
        self.named
            .as_ref()
            .and_then(|engine| engine.identify(given))
    }

    /// Records a refused request in the audit log (at a bounded rate).
    fn audit_refusal(&self, who: &str, what: String) {
        if let Some(engine) = &self.named {
            engine.audit_refusal(who, what);
        }
    }

    /// The JWT checker, when `given` is a JWT of a sane length and JWTs are
    /// accepted.
    fn jwt_for(&self, given: &str) -> Option<&super::jwt::Jwt> {
        let jwt = self.jwt.as_deref()?;
        (given.len() <= MAX_JWT_CHARS && super::jwt::Jwt::looks_like_one(given)).then_some(jwt)
    }

    /// Why a presented JWT was refused, for the 401's message.
    fn jwt_refusal(&self, given: &str) -> Option<String> {
        self.jwt.as_ref()?;
        if given.len() > MAX_JWT_CHARS {
            return Some(format!(
                "the token is longer than {MAX_JWT_CHARS} characters"
            ));
        }
        self.jwt_for(given)?
            .identify(given)
            .err()
            .map(|e| e.to_string())
    }

    /// Whether `given` is one of the tokens. Every digest is compared in
    /// full, with no early exit.
    pub(crate) fn accepts(&self, given: &str) -> bool {
        let given = sha256(given);
        self.digests
            .iter()
            .fold(false, |found, digest| found | same(digest, &given))
    }
}

/// Says how many tokens there are, never what they are.
impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiTokens({} configured)", self.digests.len())
    }
}

/// RFC 6750: `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
fn is_b64token(token: &str) -> bool {
    let body = token.trim_end_matches('=');
    !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b))
}

/// What was wrong with a token, without repeating the token itself.
fn describe(token: &str) -> String {
    let unpadded = token.trim_end_matches('=');
    if token.is_empty() {
        "an empty one".into()
    } else if unpadded.is_empty() {
        "nothing but = padding".into()
    } else if is_b64token(token) {
        format!(
            "{} characters before the padding, {} in all",
            unpadded.len(),
            token.len()
        )
    } else {
        "characters a bearer token cannot hold".into()
    }
}

/// The identity of whoever holds one of the `--api-token`s: an operator,
/// who may act in every thread.
pub const API_TOKEN_IDENTITY: &str = "api-token";

/// Who asks, as [`authenticate`] found: what handlers act as.
pub struct Caller(pub Identity);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        match parts.extensions.get::<Identity>() {
            Some(identity) => Ok(Caller(identity.clone())),
            // A route outside `authenticate`'s layer: a bug, refused.
            None => Err(ApiError::new(
                ErrorCode::InternalError,
                "this route is not authenticated",
            )),
        }
    }
}

/// Finds who asks: with `--api-token`s, whoever sends one of them (the
/// operator identity [`API_TOKEN_IDENTITY`]), any other request being
/// refused (401, `unauthorized`); without, everyone, as
/// [`Identity::anonymous`].
pub async fn authenticate(
    State(tokens): State<ApiTokens>,
    mut request: Request,
    next: Next,
) -> Response {
    if !tokens.required() {
        request.extensions_mut().insert(Identity::anonymous());
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(super::bearer_token);
    // Both clones share their bytes: the text is made only for a refusal.
    let (method, uri) = (request.method().clone(), request.uri().clone());
    let what = move || format!("{method} {}", uri.path());
    if let Some(identity) = given.and_then(|t| tokens.identify(t)) {
        let name = identity.name().to_owned();
        request.extensions_mut().insert(identity);
        let response = next.run(request).await;
        // A scope it lacks, a thread outside its reach, a user or tool
        // outside its bounds.
        if response.status() == super::error::status_of(ErrorCode::Forbidden) {
            tokens.audit_refusal(&name, format!("{}: forbidden", what()));
        }
        return response;
    }
    if tokens.unknown_yet() {
        return ApiError::new(
            ErrorCode::Unavailable,
            "credentials cannot be checked until this node reaches its store",
        )
        .into_response();
    }
    // Counted, and logged at debug only: anyone can send these, and a
    // line each would let them flood the log.
    let reason = if given.is_some() { "wrong" } else { "missing" };
    metrics::counter!(crate::metrics::UNAUTHORIZED, "token" => reason).increment(1);
    let who = if given.is_some() {
        "(an unknown or revoked token)"
    } else {
        "(no token)"
    };
    tokens.audit_refusal(who, format!("{}: unauthorized", what()));
    tracing::debug!(path = %request.uri().path(), token = reason, "request refused: API token");
    let message = match given.and_then(|t| tokens.jwt_refusal(t)) {
        Some(why) => why,
        None => "this Ferry requires `Authorization: Bearer <API token>` (an --api-token value, \
                 a live token made with `ferry tokens create`, or a JWT it accepts)"
            .to_owned(),
    };
    let mut response = ApiError::new(ErrorCode::Unauthorized, message).into_response();
    // RFC 6750 §3.1: a token that was sent and refused is `invalid_token`.
    let challenge = if given.is_some() {
        "Bearer realm=\"ferry\", error=\"invalid_token\""
    } else {
        "Bearer realm=\"ferry\""
    };
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    response
}

/// Refuses `by` unless it holds one of `scopes`: 403 `forbidden`,
/// naming what was needed.
pub(crate) fn need(by: &Identity, scopes: &[Scope]) -> Result<(), ApiError> {
    if scopes.iter().any(|&scope| by.may(scope)) {
        return Ok(());
    }
    let names: Vec<&str> = scopes.iter().map(|s| s.name()).collect();
    Err(ApiError::new(
        ErrorCode::Forbidden,
        format!(
            "{} lacks the scope this needs ({})",
            by.name(),
            names.join(" or ")
        ),
    ))
}

/// Administration (toolsets, policies, tokens) needs `admin`.
pub async fn admin_only(Caller(by): Caller, request: Request, next: Next) -> Response {
    match need(&by, &[Scope::Admin]) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

/// Every request under `/v1/threads/{group_id}/` needs the thread within
/// the caller's reach; reading it needs `read`. What a request changes
/// needs its own scope too, which the engine checks.
pub async fn thread_access(
    State(app): State<super::AppState>,
    Caller(by): Caller,
    params: Result<super::path::Path<std::collections::HashMap<String, String>>, ApiError>,
    request: Request,
    next: Next,
) -> Response {
    let params = match params {
        Ok(super::path::Path(params)) => params,
        Err(refused) => return refused.into_response(),
    };
    if request.method() == axum::http::Method::GET {
        if let Err(refused) = need(&by, &[Scope::Read]) {
            return refused.into_response();
        }
    }
    if let Some(group_id) = params.get("group_id") {
        match app.engine.may_act_in(&by, group_id).await {
            Ok(true) => {}
            Ok(false) => return foreign_thread(&by, group_id).into_response(),
            Err(e) => return ApiError::from(e).into_response(),
        }
    }
    next.run(request).await
}

/// The refusal of a thread outside the caller's reach.
pub(crate) fn foreign_thread(by: &Identity, group_id: &str) -> ApiError {
    ApiError::new(
        ErrorCode::Forbidden,
        format!("{} may not act in thread {group_id:?}", by.name()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cret-token-0123456789";

    #[test]
    fn only_the_configured_tokens_are_accepted() {
        let tokens = ApiTokens::new(&[TOKEN, "another.token_of~ours+/=="]).unwrap();
        assert!(tokens.required());
        assert!(tokens.accepts(TOKEN));
        assert!(tokens.accepts("another.token_of~ours+/=="));
        for refused in [
            "",
            "s3cret-token-012345678",
            "S3CRET-TOKEN-0123456789",
            " s3cret",
        ] {
            assert!(!tokens.accepts(refused), "{refused:?}");
        }
        assert!(!ApiTokens::default().required());
    }

    #[test]
    fn unusable_tokens_are_refused_without_being_repeated() {
        let long = "a".repeat(MAX_TOKEN_CHARS + 1);
        let padded = format!("{}{}", "a".repeat(MIN_TOKEN_CHARS - 1), "=".repeat(8));
        for bad in [
            "",
            "short",
            "=================",
            "with space in it!!",
            "tab\tinside-a-token",
            &long,
            &padded,
        ] {
            let error = ApiTokens::new(&[bad])
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            if bad.len() > 3 {
                assert!(!error.to_string().contains(bad), "{error}");
            }
        }
        assert!(ApiTokens::new(&["a".repeat(MAX_TOKEN_CHARS)]).is_ok());
        assert!(ApiTokens::new::<&str>(&[]).is_ok());
        assert!(ApiTokens::new(&[""])
            .unwrap_err()
            .to_string()
            .ends_with("got an empty one"));
        let only_padding = ApiTokens::new(&["================"]).unwrap_err();
        assert!(only_padding.to_string().ends_with("nothing but = padding"));
        let padded = format!("{}=", "a".repeat(MIN_TOKEN_CHARS));
        assert!(ApiTokens::new(&[padded]).is_ok());
    }
}
