//! `/ui`: the reviewer's dashboard, one page embedded in the binary (no
//! build step, no network besides Ferry). It polls the native API.

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("ui/index.html");

pub async fn page() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE)
}
