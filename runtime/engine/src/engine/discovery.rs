//! Fetching a toolset's manifest from `{base}/.well-known/rap-toolset`.

use std::time::Duration;

use ferry_proto::rap::Manifest;

use crate::toolsets::{
    check_base_url, read_manifest, redacted, DiscoveryError, MAX_MANIFEST_BYTES,
};

/// Normalises a base URL and fetches its manifest.
pub async fn fetch_manifest(
    client: &reqwest::Client,
    base: &str,
) -> Result<(String, Manifest), DiscoveryError> {
    let base = check_base_url(base).map_err(DiscoveryError::BadUrl)?;
    let url = format!("{base}/.well-known/rap-toolset");
    let shown = redacted(&url);
    let unreachable = |reason: String| DiscoveryError::Unreachable {
        url: shown.clone(),
        reason,
    };
    let mut response = client
        .get(&url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| unreachable(e.without_url().to_string()))?;
    if !response.status().is_success() {
        return Err(unreachable(format!("HTTP {}", response.status())));
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
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| unreachable(e.without_url().to_string()))?
    {
        if body.len() + chunk.len() > MAX_MANIFEST_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok((base.clone(), read_manifest(&base, &shown, &body)?))
}
