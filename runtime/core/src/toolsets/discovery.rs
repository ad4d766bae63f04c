//! The pure half of discovery (`{base}/.well-known/rap-toolset`, the only
//! way RAP toolsets are loaded): base URLs, how they are shown, and the
//! manifest a fetched document holds. The fetch is the engine's.

use ferry_proto::rap::Manifest;

use super::validate::check_published;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{0}")]
    BadUrl(String),
    /// What `reason` says is generic (refused, timed out, a status): the
    /// one who names a tool server must not learn what a port inside the
    /// network answered, nor time a scan of them by its words.
    #[error("could not fetch {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("could not fetch {url}: it is in a network Ferry may not reach")]
    Closed { url: String },
    #[error("the discovery document at {url} is not a valid toolset manifest: {reason}")]
    Invalid { url: String, reason: String },
}

/// The largest discovery document Ferry reads.
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// Checks a tool server's base URL and gives it normalised (as the URL
/// parser writes it, no trailing slash): http(s) with a host, and nothing
/// that `{base}/.well-known/rap-toolset` could not be built on (a query or
/// a fragment would swallow the path). A user name and password are kept
/// (sent as Basic auth) but never shown: see [`redacted`].
pub fn check_base_url(base: &str) -> Result<String, String> {
    let parsed = match url::Url::parse(base) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host_str().is_some() => url,
        // Not echoed when it may hold a password; `url` cannot say.
        _ if base.contains('@') => return Err("the tool server URL is not an http(s) URL".into()),
        _ => return Err(format!("{base:?} is not an http(s) URL")),
    };
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!(
            "{:?} has a query or a fragment: a tool server's base URL is the part before /.well-known/rap-toolset",
            redacted(base)
        ));
    }
    Ok(parsed.as_str().trim_end_matches('/').to_owned())
}

/// `url` as Ferry shows it (the API, errors, logs): a user name and
/// password in it, which reach the tool server as Basic auth, become `***`.
pub fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
            let _ = parsed.set_username("***");
            let _ = parsed.set_password(None);
            unslashed(url, parsed.to_string())
        }
        _ => url.to_owned(),
    }
}

/// `url` without its user name and password: what Ferry records of a tool
/// server in a thread's log, which every reader of the thread sees (events,
/// streams, the dashboard, the protocol fronts). The credentials stay with
/// the toolset; [`with_credentials_of`] puts them back on what is sent.
pub fn without_credentials(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            unslashed(url, parsed.to_string())
        }
        _ => url.to_owned(),
    }
}

/// `url` with the user name and password of `from` (reqwest sends them as
/// Basic auth and keeps them out of its errors); `url` as it is when
/// `from` has none.
pub fn with_credentials_of(url: &str, from: &str) -> String {
    let Ok(from) = url::Url::parse(from) else {
        return url.to_owned();
    };
    if from.username().is_empty() && from.password().is_none() {
        return url.to_owned();
    }
    let Ok(mut parsed) = url::Url::parse(url) else {
        return url.to_owned();
    };
    if parsed.set_username(from.username()).is_err()
        || parsed.set_password(from.password()).is_err()
    {
        return url.to_owned();
    }
    unslashed(url, parsed.to_string())
}

/// `rewritten` (the parser's writing of `given`) without the `/` the parser
/// writes for an empty path: a base URL has none.
fn unslashed(given: &str, rewritten: String) -> String {
    match rewritten.strip_suffix('/') {
        Some(base) if !given.ends_with('/') => base.to_owned(),
        _ => rewritten,
    }
}

/// What a document that is no RAP manifest is refused with. The parser's
/// words are given back only when they quote nothing of it: whoever
/// may register a toolset could read what any port inside the network
/// answers by naming it as a tool server.
pub const NOT_A_MANIFEST: &str = "it is not a RAP toolset manifest (a JSON object with \
     name, endpoint and tools: what GET /.well-known/rap-toolset of a RAP tool server answers)";

/// The manifest a discovery document fetched from `base` holds, checked as
/// published (`rap-3`), with its `endpoint` on the base's origin;
/// `shown` is the document's URL as errors may show it.
pub fn read_manifest(base: &str, shown: &str, body: &[u8]) -> Result<Manifest, DiscoveryError> {
    let invalid = |reason: String| DiscoveryError::Invalid {
        url: shown.to_owned(),
        reason,
    };
    let manifest: Manifest = serde_json::from_slice(body).map_err(|e| {
        // The parser's word on the document's shape ("missing field
        // `inputSchema`") helps a tool's author; one that quotes a value
        // would hand back what the document holds.
        let said = e.to_string();
        let reason = match e.classify() {
            serde_json::error::Category::Data if !said.contains('"') => {
                format!("{NOT_A_MANIFEST}: {said}")
            }
            _ => NOT_A_MANIFEST.to_owned(),
        };
        invalid(reason)
    })?;
    check_published(&manifest).map_err(|problems| invalid(problems.join("; ")))?;
    check_endpoint(base, &manifest.endpoint).map_err(invalid)?;
    Ok(manifest)
}

/// A manifest's `endpoint` must be on its base URL's origin (scheme, host
/// and port): a tool server may not send Ferry's invocations, arguments
/// and callback URLs to another host, or Ferry to an address the base URL
/// did not name.
pub fn check_endpoint(base: &str, endpoint: &str) -> Result<(), String> {
    let origin = |url: &str| url::Url::parse(url).ok().map(|u| u.origin());
    match (origin(base), origin(endpoint)) {
        (Some(base_origin), Some(endpoint_origin)) if base_origin == endpoint_origin => Ok(()),
        _ => Err(format!(
            "endpoint {:?} is not on the tool server's origin {:?}",
            redacted(endpoint),
            origin(base).map_or_else(|| redacted(base), |o| o.ascii_serialization())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{
        check_base_url, check_endpoint, read_manifest, redacted, with_credentials_of,
        without_credentials, NOT_A_MANIFEST,
    };

    #[test]
    fn a_base_url_is_http_with_a_host_and_nothing_after_its_path() {
        for (given, base) in [
            ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
            ("https://tools.example/", "https://tools.example"),
            ("http://h/prefix/path/", "http://h/prefix/path"),
            ("HTTP://H/", "http://h"),
            (" http://h/ ", "http://h"),
            ("http://[::1]:9/", "http://[::1]:9"),
            ("http://user:pw@h/", "http://user:pw@h"),
        ] {
            assert_eq!(check_base_url(given).as_deref(), Ok(base), "{given:?}");
        }
        for (bad, says) in [
            ("not a url", "is not an http(s) URL"),
            ("ftp://127.0.0.1/", "is not an http(s) URL"),
            ("http://h/base?x=1", "has a query or a fragment"),
            ("http://h/base#top", "has a query or a fragment"),
            ("http://h/base?", "has a query or a fragment"),
        ] {
            let problem = check_base_url(bad).unwrap_err();
            assert!(problem.contains(says), "{bad}: {problem}");
        }
        // A password is not echoed, in a URL that does not parse or one
        // refused for its query.
        for bad in ["http://user:secret@[::1/", "http://user:secret@h/?x"] {
            let problem = check_base_url(bad).unwrap_err();
            assert!(!problem.contains("secret"), "{problem}");
        }
    }

    #[test]
    fn an_endpoint_must_be_on_its_base_urls_origin() {
        for (base, endpoint) in [
            ("http://h:9", "http://h:9/invoke"),
            ("http://user:pw@h:9/base", "http://h:9/other/invoke"),
            ("https://h", "https://h:443/rap"),
        ] {
            assert_eq!(check_endpoint(base, endpoint), Ok(()), "{base} {endpoint}");
        }
        for (base, endpoint) in [
            ("http://h:9", "http://h:10/invoke"),
            ("http://h:9", "https://h:9/invoke"),
            ("http://h:9", "http://169.254.169.254/latest"),
            ("http://h:9", "http://user:secret@other/invoke"),
            ("http://h:9", "not a url"),
        ] {
            let problem = check_endpoint(base, endpoint).unwrap_err();
            assert!(
                problem.contains("is not on the tool server's origin"),
                "{problem}"
            );
            assert!(!problem.contains("secret"), "{problem}");
        }
    }

    /// A document that is no manifest is refused without a word of it.
    #[test]
    fn what_a_non_manifest_says_is_not_given_back() {
        for body in [
            &b"SSH-2.0-OpenSSH_9.6 internal-build-secret"[..],
            br#"{"redis_password": "internal-secret"}"#,
            br#"["internal-secret"]"#,
        ] {
            let refused = read_manifest("http://h", "http://h/.well-known/rap-toolset", body)
                .unwrap_err()
                .to_string();
            assert!(refused.contains(NOT_A_MANIFEST), "{refused}");
            assert!(!refused.contains("secret"), "{refused}");
        }
    }

    #[test]
    fn credentials_come_off_and_go_back_on() {
        let base = "http://agent:hunter2@h:9";
        assert_eq!(without_credentials(base), "http://h:9");
        assert_eq!(without_credentials("http://h:9/p/"), "http://h:9/p/");
        assert_eq!(
            with_credentials_of("http://h:9/invoke", base),
            "http://agent:hunter2@h:9/invoke"
        );
        assert_eq!(with_credentials_of("http://h:9", base), base);
        assert_eq!(
            with_credentials_of("http://h:9", "http://h:9"),
            "http://h:9"
        );
        assert_eq!(with_credentials_of("http://h:9", "not a url"), "http://h:9");
    }

    #[test]
    fn credentials_are_shown_as_stars() {
        assert_eq!(redacted("http://user:pw@h:1/p"), "http://***@h:1/p");
        assert_eq!(redacted("http://token@h/"), "http://***@h/");
        assert_eq!(redacted("http://:pw@h/"), "http://***@h/");
        assert_eq!(redacted("http://user:pw@h:1"), "http://***@h:1");
        assert_eq!(redacted("http://h/p"), "http://h/p");
        assert_eq!(redacted("not a url"), "not a url");
    }
}
