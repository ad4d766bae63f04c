//! OXP credentials, when `ferry serve` is given any: an HS256 JWT as
//! `Authorization: Bearer …` (`exp` required and at most 15 minutes ahead;
//! `aud`, when the token has one, must be the configured audience), or an
//! `OXP-API-Key` header. Either suffices. With neither configured, the
//! native API's `--api-token`s are asked for as `Authorization: Bearer`;
//! with none of those either, OXP is open and `Authorization` is ignored.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use jsonwebtoken::{decode, Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::identity::Identity;

/// The longest a token may still be valid for: a leaked token must expire soon.
pub const MAX_TOKEN_LIFETIME_SECS: u64 = 15 * 60;

/// What `ferry serve` was told about OXP credentials.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// HS256 secret shared with the token issuer.
    pub jwt_secret: Option<String>,
    /// The `aud` tokens must name when they carry one.
    pub jwt_audience: Option<String>,
    /// A static key accepted in `OXP-API-Key`.
    pub api_key: Option<String>,
    /// The native API's tokens, asked for when neither of the above is set.
    pub api_tokens: crate::http::auth::ApiTokens,
}

/// Why credentials were refused (logged, and given as `developer_message`).
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("no credentials: send Authorization: Bearer <JWT> or OXP-API-Key")]
    Missing,
    #[error("the OXP-API-Key is wrong")]
    WrongKey,
    #[error("the bearer token is invalid: {0}")]
    Token(#[from] jsonwebtoken::errors::Error),
    #[error("the bearer token expires more than {MAX_TOKEN_LIFETIME_SECS} s from now")]
    TooLong,
    #[error("no credentials: send Authorization: Bearer <one of this Ferry's API tokens>")]
    MissingApiToken,
    #[error("the bearer token is not one of this Ferry's API tokens")]
    WrongApiToken,
}

/// The time claims, read to the fraction: `jsonwebtoken` rounds them to
/// whole seconds, and ignores an `nbf` it cannot read.
#[derive(Deserialize)]
struct Claims {
    /// A NumericDate, which RFC 7519 (§2) lets be fractional.
    exp: f64,
    #[serde(default)]
    nbf: Option<f64>,
    /// The user the token was issued to, whom its calls are made for.
    #[serde(default)]
    sub: Option<String>,
}

/// The identity of whoever holds the `OXP-API-Key`, or a JWT naming no
/// `sub`: an agent, which may act only in the threads it creates.
pub const OXP_KEY_IDENTITY: &str = "oxp";

/// Who asks, as the credentials say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    pub identity: Identity,
    /// The user a JWT's `sub` names: the only one its calls may be for.
    pub user_id: Option<String>,
}

impl Authenticated {
    fn as_identity(identity: Identity) -> Self {
        Self {
            identity,
            user_id: None,
        }
    }
}

/// Checks requests against the configured credentials.
pub struct Auth {
    jwt: Option<(DecodingKey, Validation)>,
    api_key: Option<[u8; 32]>,
    api_tokens: crate::http::auth::ApiTokens,
}

impl Auth {
    pub fn new(config: &AuthConfig) -> Self {
        let jwt = config.jwt_secret.as_ref().map(|secret| {
            let mut validation = Validation::new(Algorithm::HS256);
            validation.set_required_spec_claims(&["exp"]);
            // `exp` and `nbf` (RFC 7519 §4.1.4, §4.1.5) are checked in
            // `check`, to the fraction of a second: the library rounds
            // them to whole seconds.
            validation.validate_exp = false;
            validation.validate_nbf = false;
            // With no audience configured, a token naming one is refused:
            // it was issued for someone else.
            if let Some(aud) = &config.jwt_audience {
                validation.set_audience(&[aud]);
            }
            (DecodingKey::from_secret(secret.as_bytes()), validation)
        });
        Self {
            jwt,
            api_key: config.api_key.as_deref().map(crate::digest::sha256),
            api_tokens: config.api_tokens.clone(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.has_own_credentials() || self.api_tokens.required()
    }

    fn has_own_credentials(&self) -> bool {
        self.jwt.is_some() || self.api_key.is_some()
    }

    /// Who asks, when auth is off or the request carries valid credentials:
    /// everyone is [`Identity::anonymous`] without credentials configured,
    /// an `--api-token` holder the operator, an `OXP-API-Key` holder the
    /// agent [`OXP_KEY_IDENTITY`], and a JWT's holder the agent `oxp:<sub>`
    /// acting for user `sub` (or, naming none, as the key's holder).
    pub fn check(&self, headers: &HeaderMap) -> Result<Authenticated, AuthError> {
        if !self.enabled() {
            return Ok(Authenticated::as_identity(Identity::anonymous()));
        }
        let key = headers.get("oxp-api-key").and_then(|v| v.to_str().ok());
        let bearer = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::http::bearer_token);
        // The native API's tokens (`--api-token`s and named ones) are
        // accepted here too, as the identities they are there.
        if let Some(identity) = bearer.and_then(|token| self.api_tokens.identify(token)) {
            return Ok(Authenticated::as_identity(identity));
        }
        if !self.has_own_credentials() {
            return match bearer {
                Some(_) => Err(AuthError::WrongApiToken),
                None => Err(AuthError::MissingApiToken),
            };
        }
        let mut refused = AuthError::Missing;
        if let (Some(expected), Some(given)) = (&self.api_key, key) {
            // Comparing digests keeps the comparison's time independent of
            // where the given key first differs.
            if crate::digest::same(&crate::digest::sha256(given), expected) {
                return Ok(Authenticated::as_identity(Identity::agent(
                    OXP_KEY_IDENTITY,
                )));
            }
            refused = AuthError::WrongKey;
        }
        if let (Some((key, validation)), Some(token)) = (&self.jwt, bearer) {
            let claims = decode::<Claims>(token, key, validation)?.claims;
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            // `jsonwebtoken` rounds a fractional `exp` and compares whole
            // seconds; RFC 7519 §4.1.4: the time "MUST be before" it.
            if claims.nbf.is_some_and(|nbf| nbf > now) {
                let early = jsonwebtoken::errors::ErrorKind::ImmatureSignature;
                return Err(AuthError::Token(early.into()));
            }
            if claims.exp <= now {
                let expired = jsonwebtoken::errors::ErrorKind::ExpiredSignature;
                return Err(AuthError::Token(expired.into()));
            }
            if claims.exp > now + MAX_TOKEN_LIFETIME_SECS as f64 {
                return Err(AuthError::TooLong);
            }
            return Ok(match claims.sub {
                Some(sub) => Authenticated {
                    identity: Identity::agent(format!("{OXP_KEY_IDENTITY}:{sub}"))
                        .acting_for(sub.clone()),
                    user_id: Some(sub),
                },
                None => Authenticated::as_identity(Identity::agent(OXP_KEY_IDENTITY)),
            });
        }
        Err(refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};

    const SECRET: &str = "a-secret-long-enough-for-hs256-tests";

    fn bearer(exp: f64) -> HeaderMap {
        signed(serde_json::json!({"sub": "t", "exp": exp}))
    }

    fn signed(claims: serde_json::Value) -> HeaderMap {
        let token = encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        headers
    }

    #[test]
    fn a_fractional_exp_is_read_to_the_fraction() {
        let auth = Auth::new(&AuthConfig {
            jwt_secret: Some(SECRET.into()),
            ..AuthConfig::default()
        });
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(auth.check(&bearer(now + 60.5)).is_ok());
        // Expired by less than a second: whole seconds would let it pass.
        assert!(matches!(
            auth.check(&bearer(now - 0.3)),
            Err(AuthError::Token(_))
        ));
        assert!(matches!(
            auth.check(&bearer(now + MAX_TOKEN_LIFETIME_SECS as f64 + 0.7)),
            Err(AuthError::TooLong)
        ));
        // `nbf` too: not yet valid by less than a second, or unreadable.
        let exp = now + 60.0;
        assert!(auth
            .check(&signed(serde_json::json!({"exp": exp, "nbf": now - 1.0})))
            .is_ok());
        for nbf in [serde_json::json!(now + 0.4), serde_json::json!("x")] {
            let token = signed(serde_json::json!({"exp": exp, "nbf": nbf}));
            assert!(
                matches!(auth.check(&token), Err(AuthError::Token(_))),
                "{nbf}"
            );
        }
    }

    /// Without OXP credentials of its own, OXP asks for the native API's
    /// tokens (when there are any); with its own, only those count.
    #[test]
    fn the_api_tokens_guard_oxp_and_are_accepted_beside_its_own_credentials() {
        let api_token = "agents-token-0123456789";
        let api_tokens = crate::http::auth::ApiTokens::new(&[api_token]).unwrap();
        let with = |authorization: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(value) = authorization {
                h.insert(axum::http::header::AUTHORIZATION, value.parse().unwrap());
            }
            h
        };
        let api_bearer = format!("Bearer {api_token}");
        let guarded = Auth::new(&AuthConfig {
            api_tokens: api_tokens.clone(),
            ..AuthConfig::default()
        });
        assert!(matches!(
            guarded.check(&with(None)),
            Err(AuthError::MissingApiToken)
        ));
        assert!(matches!(
            guarded.check(&with(Some("Bearer agents-token-01234567890"))),
            Err(AuthError::WrongApiToken)
        ));
        assert!(guarded.check(&with(Some(&api_bearer))).is_ok());
        let own = Auth::new(&AuthConfig {
            api_key: Some("oxp-key".into()),
            api_tokens,
            ..AuthConfig::default()
        });
        // The native API's tokens are accepted beside OXP's own.
        assert!(own.check(&with(Some(&api_bearer))).is_ok());
        assert!(own
            .check(&with(Some("Bearer agents-token-01234567890")))
            .is_err());
        let mut keyed = with(None);
        keyed.insert("oxp-api-key", "oxp-key".parse().unwrap());
        assert!(own.check(&keyed).is_ok());
        assert!(Auth::new(&AuthConfig::default()).check(&with(None)).is_ok());
    }
}
