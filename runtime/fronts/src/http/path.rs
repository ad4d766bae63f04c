//! Path parameters whose refusals use the API's error shape (axum's own
//! answer a malformed `%FF` with plain text).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use ferry_proto::ErrorCode;
use serde::de::DeserializeOwned;

use super::ApiError;

pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(|rejection| ApiError::new(ErrorCode::InvalidRequest, rejection.body_text()))
    }
}
