//! Argument checks the `ferry` commands share.

/// An http(s) URL with a host, as tools and Ferry must reach it; checked
/// at start, since a bad one would only show as callbacks that never come
/// (in `--public-url`), a toolset never registered, or (for an operator
/// command's `--url`) a request sent nowhere.
pub fn http_url(text: &str) -> Result<String, String> {
    match reqwest::Url::parse(text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
            Ok(text.to_owned())
        }
        _ => Err(format!(
            "{text:?} is not an http(s) URL with a host (e.g. http://127.0.0.1:8080)"
        )),
    }
}

/// A tool server's base URL: an http(s) URL with a host, and no query or
/// fragment (Ferry's own rule for registering toolsets, checked here so
/// that a bad `--tool-server` stops the start).
pub fn tool_server_url(text: &str) -> Result<String, String> {
    let checked = http_url(text)?;
    ferry_engine::toolsets::check_base_url(&checked)?;
    Ok(checked)
}
