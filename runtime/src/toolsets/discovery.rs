//! Fetching a manifest from `{base}/.well-known/rap-toolset`, the only way
//! RAP toolsets are loaded.

use std::time::Duration;

use ferry_proto::rap::Manifest;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{0:?} is not an http(s) URL")]
    BadUrl(String),
    #[error("could not fetch {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("the discovery document at {url} is not a valid toolset manifest: {reason}")]
    Invalid { url: String, reason: String },
}

/// The largest discovery document Ferry reads.
const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// Normalises a base URL (no trailing slash) and fetches its manifest.
pub async fn fetch_manifest(
    client: &reqwest::Client,
    base: &str,
) -> Result<(String, Manifest), DiscoveryError> {
    let parsed = url::Url::parse(base).map_err(|_| DiscoveryError::BadUrl(base.to_owned()))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(DiscoveryError::BadUrl(base.to_owned()));
    }
    let base = base.trim_end_matches('/').to_owned();
    let url = format!("{base}/.well-known/rap-toolset");
    let unreachable = |reason: String| DiscoveryError::Unreachable {
        url: url.clone(),
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
        url: url.clone(),
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
    let manifest = serde_json::from_slice(&body).map_err(|e| DiscoveryError::Invalid {
        url: url.clone(),
        reason: e.to_string(),
    })?;
    Ok((base, manifest))
}
