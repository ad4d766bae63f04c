//! Fetching a toolset's manifest from `{base}/.well-known/rap-toolset`.

use std::time::Duration;

use ferry_dispatch::{Outbound, Refused};
use ferry_proto::rap::Manifest;
use tracing::debug;

use crate::toolsets::{
    check_base_url, read_manifest, redacted, DiscoveryError, MAX_MANIFEST_BYTES,
};

/// Normalises a base URL and fetches its manifest.
pub async fn fetch_manifest(
    outbound: &Outbound,
    base: &str,
) -> Result<(String, Manifest), DiscoveryError> {
    let base = check_base_url(base).map_err(DiscoveryError::BadUrl)?;
    let url = format!("{base}/.well-known/rap-toolset");
    let shown = redacted(&url);
    let closed = || DiscoveryError::Closed { url: shown.clone() };
    let failed = |e: reqwest::Error| {
        if Refused::caused(&e) {
            return closed();
        }
        let reason = generic(&e).into();
        debug!(url = %shown, error = %e.without_url(), "discovery failed");
        DiscoveryError::Unreachable {
            url: shown.clone(),
            reason,
        }
    };
    outbound.check_str(&url).map_err(|_| closed())?;
    let mut response = (outbound.client().get(&url))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(failed)?;
    if !response.status().is_success() {
        return Err(DiscoveryError::Unreachable {
            url: shown.clone(),
            reason: format!("HTTP status {}", response.status().as_u16()),
        });
    }
    let too_large = || DiscoveryError::Invalid {
        url: shown.clone(),
        reason: format!("larger than {MAX_MANIFEST_BYTES} bytes"),
    };
    // Refused as soon as it says or shows it is too large: read whole
    // first, a document of gigabytes would be held in memory (or a server
    // still sending would run into the timeout, reported as unreachable).
    if response
        .content_length()
        .is_some_and(|n| n > MAX_MANIFEST_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        if body.len() + chunk.len() > MAX_MANIFEST_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok((base.clone(), read_manifest(&base, &shown, &body)?))
}

/// What a failed fetch is shown as: its kind, none of its detail (that
/// goes to the debug log).
fn generic(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection refused"
    } else if e.is_body() || e.is_decode() {
        "the answer broke off"
    } else {
        "the request failed"
    }
}
