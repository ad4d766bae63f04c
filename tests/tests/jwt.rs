//! Bearer JWTs as identities (`--jwt-secret`, `--jwt-jwks`): their claims
//! give a name, scopes and bounds as a named token's record does. Every
//! refused token is a 401 that says why and changes nothing.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use jsonwebtoken::{encode, get_current_timestamp, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use ferry_tests::{Api, Ferry, FerryOptions, TestTool};

const ROOT: &str = "jwt-root-token-0123456789";
const SECRET: &str = "the-jwt-secret-of-this-test-ferry!!";

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/jwt-keys.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A Ferry accepting HS256 JWTs signed with [`SECRET`] and the fixture's
/// ES256 and RS256 keys, with an `--api-token` to look with.
async fn ferry_with(tool: &TestTool, dir: &tempfile::TempDir) -> Ferry {
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, fixture()["jwks"].to_string()).unwrap();
    Ferry::start(FerryOptions {
        tool_servers: vec![tool.url.clone()],
        ..FerryOptions::default().api_token(ROOT).with_args(&[
            "--jwt-secret",
            SECRET,
            "--jwt-jwks",
            jwks.to_str().unwrap(),
        ])
    })
    .await
}

fn in_an_hour() -> u64 {
    get_current_timestamp() + 3600
}

fn hs256(claims: &Value, secret: &str) -> String {
    let key = EncodingKey::from_secret(secret.as_bytes());
    encode(&Header::new(Algorithm::HS256), claims, &key).unwrap()
}

/// Signed with the fixture's key for `alg` (ES256 or RS256), naming `kid`.
fn signed(alg: Algorithm, kid: &str, claims: &Value) -> String {
    let keys = fixture();
    let der = |name: &str| STANDARD.decode(keys[name].as_str().unwrap()).unwrap();
    let key = match alg {
        Algorithm::ES256 => EncodingKey::from_ec_der(&der("es256_pkcs8_der")),
        _ => EncodingKey::from_rsa_der(&der("rs256_pkcs1_der")),
    };
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_owned());
    encode(&header, claims, &key).unwrap()
}

fn tool() -> impl std::future::Future<Output = TestTool> {
    TestTool::with_manifest(json!({"name": "ops", "tools": [
        {"name": "look", "description": "read only", "inputSchema": {"type": "object"}}
    ]}))
}

#[tokio::test(flavor = "multi_thread")]
async fn jwts_signed_with_the_secret_or_a_jwks_key_are_bounded_identities() {
    let (tool, dir) = (tool().await, tempfile::tempdir().unwrap());
    let ferry = ferry_with(&tool, &dir).await;
    let agent = hs256(
        &json!({"sub": "ci", "scope": "submit read", "ferry_users": ["u1"],
                "ferry_tools": ["ops"], "exp": in_an_hour()}),
        SECRET,
    );
    let agent = Api::with_token(&ferry.url, &agent);
    let call = json!({"operation": "look", "arguments": {}, "group_id": "g", "id": "c1"});
    let (status, body) = agent.submit(call).await;
    assert_eq!(status, 202, "{body}");
    let invoked = tool.next_invocation().await.invocation;
    assert_eq!(invoked.identity.as_deref(), Some("jwt:ci"));
    assert_eq!(invoked.user_id.as_deref(), Some("u1"));
    assert!(invoked.user_verified);
    // Bounds hold as a named token's do.
    let other = json!({"operation": "look", "arguments": {}, "group_id": "g", "id": "c2",
                       "user_id": "u2"});
    assert_eq!(agent.submit(other).await.0, 403);
    assert_eq!(agent.get("/v1/tokens").await.0, 403);

    let admin = signed(
        Algorithm::ES256,
        "ec-1",
        &json!({"sub": "ops", "scope": ["admin", "read"], "exp": in_an_hour()}),
    );
    let (status, body) = Api::with_token(&ferry.url, &admin).get("/v1/tokens").await;
    assert_eq!(status, 200, "{body}");
    let reader = signed(
        Algorithm::RS256,
        "rsa-1",
        &json!({"sub": "auditor", "scope": "read", "exp": in_an_hour()}),
    );
    let reader = Api::with_token(&ferry.url, &reader);
    let (status, body) = reader.get("/v1/threads/g").await;
    assert_eq!(status, 200, "{body}");
    let call = json!({"operation": "look", "arguments": {}, "group_id": "r", "id": "c3"});
    assert_eq!(reader.submit(call).await.0, 403);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_jwts_are_refused_with_why_and_change_nothing() {
    let (tool, dir) = (tool().await, tempfile::tempdir().unwrap());
    let ferry = ferry_with(&tool, &dir).await;
    let now = get_current_timestamp();
    let claims = |extra: Value| {
        let mut claims = json!({"sub": "ci", "scope": "submit read", "exp": in_an_hour()});
        for (k, v) in extra.as_object().unwrap() {
            claims[k] = v.clone();
        }
        claims
    };
    let unsigned = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims(json!({})).to_string())
    );
    let long = format!("eyJ{}.e30.e30", "A".repeat(9000));
    for (token, says) in [
        (
            hs256(&claims(json!({"exp": now - 3600})), SECRET),
            "ExpiredSignature",
        ),
        (
            hs256(&claims(json!({"nbf": now + 3600})), SECRET),
            "ImmatureSignature",
        ),
        (
            hs256(&claims(json!({})), "another-secret-of-at-least-32-bytes"),
            "InvalidSignature",
        ),
        (
            signed(Algorithm::ES256, "ec-9", &claims(json!({}))),
            "not in the JWKS",
        ),
        (unsigned, "alg must be HS256, RS256 or ES256"),
        (
            hs256(&claims(json!({"scope": "submit fly"})), SECRET),
            "fly",
        ),
        (
            hs256(&claims(json!({"aud": "elsewhere"})), SECRET),
            "InvalidAudience",
        ),
        (hs256(&json!({"sub": "ci", "scope": "read"}), SECRET), "exp"),
        (long, "longer than 8192"),
    ] {
        let api = Api::with_token(&ferry.url, &token);
        let call = json!({"operation": "look", "arguments": {}, "group_id": "g", "id": "c1"});
        let (status, body) = api.submit(call).await;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (401, Some("unauthorized")),
            "{says}: {body}"
        );
        assert!(message.contains(says), "{says}: {message}");
    }
    let (_, threads) = Api::with_token(&ferry.url, ROOT).get("/v1/threads").await;
    assert_eq!(threads["threads"], json!([]), "{threads}");
    assert!(tool.invocations().is_empty());
}

#[test]
fn a_jwks_file_that_does_not_parse_stops_start_up_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, "{\"keys\": [{\"kty\": \"EC\"}]}").unwrap();
    let missing = dir.path().join("missing.json");
    for file in [&jwks, &missing] {
        let (status, stderr) =
            ferry_tests::ferry::refused_serve(&["--jwt-jwks", file.to_str().unwrap()]);
        assert!(!status.success());
        assert!(
            stderr.contains("--jwt-jwks") && stderr.contains(file.to_str().unwrap()),
            "{stderr}"
        );
    }
    let (status, stderr) = ferry_tests::ferry::refused_serve(&["--jwt-secret", "short"]);
    assert!(!status.success());
    assert!(stderr.contains("--jwt-secret"), "{stderr}");
}
