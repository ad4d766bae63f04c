//! `/ui`: the reviewer's dashboard, one page embedded in the binary (no
//! build step, no network besides Ferry). It polls the native API.

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("ui/index.html");

/// The page may not be framed by another site: a framed dashboard's
/// buttons post from Ferry's own origin, so the cross-site refusal would
/// not stop a click tricked onto "Always allow" (clickjacking).
pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CONTENT_SECURITY_POLICY, "frame-ancestors 'none'"),
        ],
        PAGE,
    )
}
