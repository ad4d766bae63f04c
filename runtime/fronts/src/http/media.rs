//! Request bodies are JSON, and say so. A browser sends a `text/plain` or
//! form body to another site without asking first, but asks the site
//! (a CORS preflight, which Ferry never grants) before sending
//! `application/json`: refusing every other type (415) keeps the native
//! API out of a page's reach even where `Origin` is not sent. A request
//! with no body and no `Content-Type` (a `DELETE`, a bare `POST …/close`)
//! has nothing to declare.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ferry_proto::ErrorCode;

use super::body::read_bytes;
use super::ApiError;

/// Whether a `Content-Type` value is `application/json`, with or without
/// parameters (`; charset=utf-8`), in any case.
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("");
    essence.trim().eq_ignore_ascii_case("application/json")
}

/// Whether the request carries a body: a non-zero `Content-Length`, or a
/// `Transfer-Encoding` (chunked, of a length not told).
fn has_body(headers: &HeaderMap) -> bool {
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().parse::<u64>().map_or(true, |n| n > 0));
    length.unwrap_or(false) || headers.contains_key(header::TRANSFER_ENCODING)
}

/// The `Content-Type` a request that changes something declares, when it
/// must declare JSON and does not: `Some(None)` for none at all.
pub(crate) fn not_json(method: &Method, headers: &HeaderMap) -> Option<Option<String>> {
    if !matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) {
        return None;
    }
    let declared = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    match &declared {
        Some(value) if is_json(value) => None,
        None if !has_body(headers) => None,
        _ => Some(declared),
    }
}

/// The 415 answer to a body that is not declared JSON.
pub(crate) fn unsupported(declared: Option<&str>) -> ApiError {
    let what = match declared {
        Some(value) => format!("Content-Type {value:?}"),
        None => "no Content-Type".to_owned(),
    };
    ApiError::new(
        ErrorCode::UnsupportedMediaType,
        format!("request bodies are JSON: send Content-Type: application/json, not {what}"),
    )
}

/// Refuses (415) a request that changes something with a body not
/// declared `application/json`; its body is drained first (up to the
/// body limit), so that the sender reads the answer rather than a reset
/// connection. Tools' callbacks check this themselves, after their token.
pub async fn require_json(State(limit): State<usize>, request: Request, next: Next) -> Response {
    if request.uri().path().starts_with("/v1/callbacks/") {
        return next.run(request).await;
    }
    let Some(declared) = not_json(request.method(), request.headers()) else {
        return next.run(request).await;
    };
    let _ = read_bytes(request, limit).await;
    unsupported(declared.as_deref()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        h
    }

    #[test]
    fn a_body_that_changes_something_must_be_declared_json() {
        let (ct, cl) = (header::CONTENT_TYPE, header::CONTENT_LENGTH);
        let post = Method::POST;
        for accepted in [
            headers(&[(ct.clone(), "application/json"), (cl.clone(), "2")]),
            headers(&[
                (ct.clone(), "Application/JSON; charset=utf-8"),
                (cl.clone(), "2"),
            ]),
            // Nothing to declare.
            headers(&[]),
            headers(&[(cl.clone(), "0")]),
        ] {
            assert_eq!(not_json(&post, &accepted), None, "{accepted:?}");
        }
        for refused in [
            headers(&[(ct.clone(), "text/plain"), (cl.clone(), "2")]),
            headers(&[
                (ct.clone(), "application/x-www-form-urlencoded"),
                (cl.clone(), "0"),
            ]),
            headers(&[(ct.clone(), "multipart/form-data; boundary=x")]),
            headers(&[(ct.clone(), "application/jsonx")]),
            headers(&[(ct.clone(), "text/plain; x=application/json")]),
            headers(&[(cl.clone(), "2")]),
            headers(&[(header::TRANSFER_ENCODING, "chunked")]),
        ] {
            assert!(not_json(&post, &refused).is_some(), "{refused:?}");
        }
        let text = headers(&[(ct.clone(), "text/plain"), (cl.clone(), "2")]);
        assert!(not_json(&Method::DELETE, &text).is_some());
        assert!(not_json(&Method::PATCH, &text).is_some());
        assert_eq!(not_json(&Method::GET, &text), None);
    }
}
