//! Bearer JWTs as identities, beside the named tokens: HS256 with a
//! shared secret (`--jwt-secret`), RS256 or ES256 with the public keys of
//! a local JWKS file (`--jwt-jwks`). A token's claims give what a named
//! token's record gives: its name (`sub`), its scopes (`scope`, space-
//! separated as OAuth writes it, or an array) and its bounds
//! (`ferry_tools`, `ferry_group_prefix`, `ferry_users`); every claim name
//! can be changed. The identity is `jwt:<name>`, checked as a named
//! token's spec is: a token naming an unknown scope is refused whole.

use std::collections::BTreeSet;
use std::path::PathBuf;

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use serde_json::Value;

use crate::credential::TokenSpec;
use crate::identity::{Bounds, Identity};

/// The prefix of every JWT identity's name: no named token's name can
/// take it (`:` is not in their alphabet).
pub const IDENTITY_PREFIX: &str = "jwt:";

/// Which claims say what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimNames {
    pub name: String,
    pub scopes: String,
    pub tools: String,
    pub group_prefix: String,
    pub users: String,
}

impl Default for ClaimNames {
    fn default() -> Self {
        Self {
            name: "sub".into(),
            scopes: "scope".into(),
            tools: "ferry_tools".into(),
            group_prefix: "ferry_group_prefix".into(),
            users: "ferry_users".into(),
        }
    }
}

/// What Ferry was told about JWTs.
#[derive(Debug, Clone, Default)]
pub struct JwtConfig {
    pub hs256_secret: Option<String>,
    pub jwks_file: Option<PathBuf>,
    /// The `iss` every token must name, when set.
    pub issuer: Option<String>,
    /// The `aud` every token must name, when set; without it, a token
    /// naming an audience is refused (it was issued for someone else).
    pub audience: Option<String>,
    pub claims: ClaimNames,
}

/// Why the configuration cannot be used: Ferry does not start.
#[derive(Debug, thiserror::Error)]
pub enum JwtSetupError {
    #[error("--jwt-jwks {path}: {reason}")]
    Jwks { path: String, reason: String },
    #[error("--jwt-secret must be at least 32 bytes (HS256 keys shorter than its hash are weak)")]
    ShortSecret,
}

/// Why a presented JWT is refused (the 401's message: nothing secret).
#[derive(Debug, thiserror::Error)]
pub enum JwtRefused {
    #[error("the JWT's header is not one Ferry accepts: alg must be HS256, RS256 or ES256")]
    Header,
    #[error("the JWT is signed with {0:?}, for which this Ferry has no key")]
    NoKeyFor(Algorithm),
    #[error("the JWT names key {0:?}, which is not in the JWKS")]
    UnknownKey(String),
    #[error("the JWT names no key (kid) and the JWKS holds several for its alg")]
    WhichKey,
    #[error("the JWT is invalid: {0}")]
    Invalid(#[from] jsonwebtoken::errors::Error),
    #[error("the JWT's claim {claim:?} {problem}")]
    Claim { claim: String, problem: String },
}

/// Checks presented JWTs.
pub struct Jwt {
    secret: Option<DecodingKey>,
    /// The JWKS's signing keys: id, algorithm, key.
    keys: Vec<(Option<String>, Algorithm, DecodingKey)>,
    issuer: Option<String>,
    audience: Option<String>,
    claims: ClaimNames,
}

impl Jwt {
    /// The checker `config` describes; none when it names no key.
    pub fn new(config: &JwtConfig) -> Result<Option<Self>, JwtSetupError> {
        if config.hs256_secret.is_none() && config.jwks_file.is_none() {
            return Ok(None);
        }
        let secret = match &config.hs256_secret {
            Some(secret) if secret.len() < 32 => return Err(JwtSetupError::ShortSecret),
            Some(secret) => Some(DecodingKey::from_secret(secret.as_bytes())),
            None => None,
        };
        let keys = match &config.jwks_file {
            Some(path) => read_jwks(path)?,
            None => vec![],
        };
        Ok(Some(Self {
            secret,
            keys,
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            claims: config.claims.clone(),
        }))
    }

    /// Whether `token` is shaped as a JWT (three base64url parts), so that
    /// it is checked here rather than as a named token.
    pub fn looks_like_one(token: &str) -> bool {
        token.split('.').count() == 3 && token.starts_with("ey")
    }

    pub fn identify(&self, token: &str) -> Result<Identity, JwtRefused> {
        let header = decode_header(token).map_err(|_| JwtRefused::Header)?;
        let key = self.key_for(header.alg, header.kid.as_deref())?;
        let mut validation = Validation::new(header.alg);
        validation.set_required_spec_claims(&["exp"]);
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            validation.set_required_spec_claims(&["exp", "iss"]);
        }
        // Without an audience configured, the library refuses a token
        // that names one: it was issued for someone else.
        if let Some(audience) = &self.audience {
            validation.set_audience(&[audience]);
        }
        // A token not valid yet is refused as an expired one is (both
        // within the library's leeway of 60 s, for the issuer's clock).
        validation.validate_nbf = true;
        let claims = decode::<serde_json::Map<String, Value>>(token, key, &validation)?.claims;
        self.identity_of(&claims)
    }

    fn key_for(&self, alg: Algorithm, kid: Option<&str>) -> Result<&DecodingKey, JwtRefused> {
        if alg == Algorithm::HS256 {
            return self.secret.as_ref().ok_or(JwtRefused::NoKeyFor(alg));
        }
        if !matches!(alg, Algorithm::RS256 | Algorithm::ES256) {
            return Err(JwtRefused::Header);
        }
        let mut of_alg = self.keys.iter().filter(|(_, a, _)| *a == alg);
        match kid {
            Some(kid) => of_alg
                .find(|(id, _, _)| id.as_deref() == Some(kid))
                .map(|(_, _, key)| key)
                .ok_or_else(|| JwtRefused::UnknownKey(kid.chars().take(64).collect())),
            None => match (of_alg.next(), of_alg.next()) {
                (Some((_, _, key)), None) => Ok(key),
                (None, _) => Err(JwtRefused::NoKeyFor(alg)),
                (Some(_), Some(_)) => Err(JwtRefused::WhichKey),
            },
        }
    }

    /// The identity the claims describe, checked as a named token's spec.
    fn identity_of(&self, claims: &serde_json::Map<String, Value>) -> Result<Identity, JwtRefused> {
        let names = &self.claims;
        let refused = |claim: &str, problem: String| JwtRefused::Claim {
            claim: claim.to_owned(),
            problem,
        };
        let name = match claims.get(&names.name) {
            Some(Value::String(name)) => name.clone(),
            _ => return Err(refused(&names.name, "is missing or not a string".into())),
        };
        let scopes = strings(claims.get(&names.scopes), true)
            .ok_or_else(|| refused(&names.scopes, "is missing or not a list of scopes".into()))?;
        let set = |claim: &str| -> Result<Option<BTreeSet<String>>, JwtRefused> {
            match claims.get(claim) {
                None => Ok(None),
                Some(value) => strings(Some(value), false)
                    .map(|v| Some(v.into_iter().collect()))
                    .ok_or_else(|| refused(claim, "is not a list of strings".into())),
            }
        };
        let group_prefix = match claims.get(&names.group_prefix) {
            None => None,
            Some(Value::String(prefix)) => Some(prefix.clone()),
            Some(_) => return Err(refused(&names.group_prefix, "is not a string".into())),
        };
        let spec = TokenSpec {
            name,
            scopes,
            bounds: Bounds {
                tools: set(&names.tools)?,
                group_prefix,
                users: set(&names.users)?,
            },
        };
        let scopes = spec
            .check()
            .map_err(|e| refused(&names.name, format!("or another claim is refused: {e}")))?;
        Ok(Identity::bounded(
            format!("{IDENTITY_PREFIX}{}", spec.name),
            scopes,
            spec.bounds,
        ))
    }
}

/// A claim's strings: an array of them, or (`spaced`) one string of
/// space-separated words, as OAuth's `scope` is.
fn strings(value: Option<&Value>, spaced: bool) -> Option<Vec<String>> {
    match value? {
        Value::String(words) if spaced => {
            Some(words.split_whitespace().map(str::to_owned).collect())
        }
        Value::String(one) => Some(vec![one.clone()]),
        Value::Array(items) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    }
}

/// The signing keys of a JWKS file: EC P-256 (ES256) and RSA (RS256).
/// A key of another kind, or one marked for encryption, is refused, so
/// that the file says exactly what Ferry trusts.
fn read_jwks(
    path: &std::path::Path,
) -> Result<Vec<(Option<String>, Algorithm, DecodingKey)>, JwtSetupError> {
    let refused = |reason: String| JwtSetupError::Jwks {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| refused(e.to_string()))?;
    let set: JwkSet =
        serde_json::from_str(&text).map_err(|e| refused(format!("not a JWKS: {e}")))?;
    if set.keys.is_empty() {
        return Err(refused("it holds no keys".into()));
    }
    set.keys
        .iter()
        .map(|jwk| {
            let kid = jwk.common.key_id.clone();
            let which = kid.as_deref().unwrap_or("(no kid)").to_owned();
            let alg = match &jwk.algorithm {
                AlgorithmParameters::EllipticCurve(_) => Algorithm::ES256,
                AlgorithmParameters::RSA(_) => Algorithm::RS256,
                _ => {
                    return Err(refused(format!(
                        "key {which}: only EC P-256 and RSA keys are accepted"
                    )))
                }
            };
            let key =
                DecodingKey::from_jwk(jwk).map_err(|e| refused(format!("key {which}: {e}")))?;
            Ok((kid, alg, key))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Scope;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    const SECRET: &str = "a-test-secret-of-at-least-32-bytes!!";

    fn hs() -> Jwt {
        Jwt::new(&JwtConfig {
            hs256_secret: Some(SECRET.into()),
            ..JwtConfig::default()
        })
        .unwrap()
        .unwrap()
    }

    fn sign(claims: Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap()
    }

    fn in_an_hour() -> u64 {
        jsonwebtoken::get_current_timestamp() + 3600
    }

    #[test]
    fn claims_make_a_bounded_identity() {
        let token = sign(
            json!({"sub": "ci-bot", "scope": "submit read", "exp": in_an_hour(),
                                 "ferry_tools": ["ops.look"], "ferry_users": "u1"}),
        );
        assert!(Jwt::looks_like_one(&token));
        let who = hs().identify(&token).unwrap();
        assert_eq!(who.name(), "jwt:ci-bot");
        assert!(who.may(Scope::Submit) && who.may(Scope::Read) && !who.may(Scope::Admin));
        assert!(who.may_call("ops", "look") && !who.may_call("ops", "deploy"));
        assert_eq!(who.user_for(None).unwrap().as_deref(), Some("u1"));
    }

    #[test]
    fn bad_claims_are_refused_by_name() {
        for (claims, names) in [
            (json!({"scope": "read"}), "\"sub\""),
            (json!({"sub": "x"}), "\"scope\""),
            (json!({"sub": "x", "scope": "read fly"}), "fly"),
            (json!({"sub": "x", "scope": ""}), "at least one scope"),
            (
                json!({"sub": "x", "scope": "read", "ferry_tools": 3}),
                "ferry_tools",
            ),
            (json!({"sub": "x y", "scope": "read"}), "name"),
        ] {
            let mut claims = claims;
            claims["exp"] = json!(in_an_hour());
            let refused = hs()
                .identify(&sign(claims.clone()))
                .unwrap_err()
                .to_string();
            assert!(refused.contains(names), "{claims}: {refused}");
        }
    }

    #[test]
    fn a_weak_secret_or_a_bad_jwks_stops_start_up() {
        let weak = JwtConfig {
            hs256_secret: Some("short".into()),
            ..JwtConfig::default()
        };
        assert!(matches!(Jwt::new(&weak), Err(JwtSetupError::ShortSecret)));
        let dir = tempfile::tempdir().unwrap();
        for (text, says) in [
            ("not json", "not a JWKS"),
            (r#"{"keys": []}"#, "no keys"),
            (
                r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#,
                "only EC P-256 and RSA",
            ),
        ] {
            let path = dir.path().join("jwks.json");
            std::fs::write(&path, text).unwrap();
            let config = JwtConfig {
                jwks_file: Some(path.clone()),
                ..JwtConfig::default()
            };
            let error = Jwt::new(&config).err().expect("refused").to_string();
            assert!(
                error.contains("--jwt-jwks") && error.contains(says),
                "{error}"
            );
        }
        assert!(Jwt::new(&JwtConfig::default()).unwrap().is_none());
    }
}
