//! The transport's checks: origins, hosts and bearer tokens.

use super::*;

/// A 2025-11-25 `initialize` request's body: the first thing a client
/// sends, so the one the transport's checks see.
fn initialize_request() -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}})
    .to_string()
    .into_bytes()
}

#[tokio::test]
async fn foreign_origins_and_hosts_get_403_and_the_bearer_token_is_required() {
    let ferry = Ferry::with_demo().await;
    let raw = Raw::new(&ferry);
    let init = initialize_request();
    let evil = raw
        .send(init.clone(), &[("origin", "http://evil.example.com")])
        .await;
    assert_eq!(evil.status, 403, "{}", evil.body);
    assert_eq!(evil.body["error"]["code"], -32600);
    let rebound = raw
        .send(init.clone(), &[("host", "evil.example.com")])
        .await;
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    let local = raw
        .send(init.clone(), &[("origin", "http://localhost:6274")])
        .await;
    assert_eq!(local.status, 200, "{}", local.body);

    let mut options = FerryOptions {
        demo: true,
        ..FerryOptions::default()
    };
    options.args.extend([
        "--mcp-bearer-token".to_owned(),
        "t0ken".to_owned(),
        "--mcp-allowed-origin".to_owned(),
        "https://app.example.com".to_owned(),
    ]);
    let guarded = Ferry::start(options).await;
    let raw = Raw::new(&guarded);
    let missing = raw.send(init.clone(), &[]).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.headers["www-authenticate"], "Bearer");
    let wrong = raw
        .send(init.clone(), &[("authorization", "Bearer nope")])
        .await;
    assert_eq!(wrong.status, 401);
    let right = raw
        .send(
            init,
            &[
                ("authorization", "Bearer t0ken"),
                ("origin", "https://app.example.com"),
            ],
        )
        .await;
    assert_eq!(right.status, 200, "{}", right.body);
}

/// docs/api.md, API tokens: without a token of its own, `/mcp` asks for one
/// of the native API's `--api-token`s, so that setting them leaves no
/// way around them (such as running a tool through `/mcp` without any).
#[tokio::test]
async fn without_its_own_token_mcp_asks_for_an_api_token() {
    let options = FerryOptions {
        demo: true,
        ..FerryOptions::default()
    };
    let guarded = Ferry::start(options.api_token("agents-token-0123456789")).await;
    let raw = Raw::new(&guarded);
    let init = initialize_request();
    let missing = raw.send(init.clone(), &[]).await;
    assert_eq!(missing.status, 401);
    let wrong = raw
        .send(init.clone(), &[("authorization", "Bearer t0ken")])
        .await;
    assert_eq!(wrong.status, 401);
    let right = raw
        .send(init, &[("authorization", "Bearer agents-token-0123456789")])
        .await;
    assert_eq!(right.status, 200, "{}", right.body);
}

/// docs/mcp.md, security: a `Host` or `Origin` of the public URL is
/// Ferry's own, not a rebinding; another site's origin still gets 403.
#[tokio::test]
async fn the_public_urls_host_and_origin_are_accepted() {
    let mut options = FerryOptions::default();
    options.args.extend([
        "--public-url".to_owned(),
        "https://ferry.example.com:8443".to_owned(),
    ]);
    let ferry = Ferry::start(options).await;
    let raw = Raw::new(&ferry);
    let init = initialize_request();
    let own = raw
        .send(
            init.clone(),
            &[
                ("host", "ferry.example.com:8443"),
                ("origin", "https://ferry.example.com:8443"),
            ],
        )
        .await;
    assert_eq!(own.status, 200, "{}", own.body);
    for origin in [
        "https://ferry.example.com",
        "http://ferry.example.com:8443",
        "https://evil.example.com:8443",
    ] {
        let foreign = raw
            .send(
                init.clone(),
                &[("host", "ferry.example.com:8443"), ("origin", origin)],
            )
            .await;
        assert_eq!(foreign.status, 403, "{origin}: {}", foreign.body);
    }
}
