//! `POST /v1/callbacks/{token}`: the five RAP callback types.

use crate::identity::Identity;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::Json;
use ferry_proto::idempotency;
use ferry_proto::rap::Peek;
use serde_json::json;

use super::body::{read_body, too_large, BodyError};
use super::{unexpected, ApiError, AppState};
use crate::engine::requests::{self, Reply};
use crate::engine::Error;
use crate::store;
use crate::thread::Outcome;

/// 200 `{"status": "applied" | "duplicate" | "ignored"}` once durable.
/// 403 for a forged token or a body naming another call; 404 for an unknown
/// call; 410 for an event of a cancelled or ended subscription; 400 for a
/// malformed body or `Idempotency-Key`; 413 for a body over the size limit,
/// and when it was the call's `tool_result`, the call fails with an error
/// saying so (tools do not send a refused callback again; when that cannot
/// be recorded, the answer is the store's 5xx, which they do retry); 422
/// `idempotency_key_reused` for a key the call took with another body.
/// Other refusals record nothing.
///
/// An `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header) names
/// the callback: a repeat of a key its call remembers is answered
/// `duplicate` and records nothing (`thread::decide`).
pub async fn receive(
    State(app): State<AppState>,
    request: Request,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    // Read from the path by hand: `Path<String>` answers 400 to a segment
    // that is not UTF-8 once decoded, and such a token is no token Ferry
    // minted, so forged like any other.
    let segment = request.uri().path().rsplit('/').next().unwrap_or_default();
    let token = percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map(String::from)
        .unwrap_or_default();
    // A forged token is 403 whatever its body (issue 2). The body is
    // drained first (as an oversized one is, up to 16 times the limit, and
    // never parsed): answering while the sender still writes would reset
    // the connection under it, and it would see a broken pipe, not the 403.
    let limit = app.engine.config().max_body_bytes;
    if !app.engine.is_genuine(&token) {
        let _ = read_body(request, limit, false).await;
        app.engine.forged_callback();
        return Err(crate::engine::Error::Forged.into());
    }
    // RAP tools send `application/json` (rap-2); anything else is refused
    // unread, as the rest of the API refuses it (`media`).
    if let Some(declared) = super::media::not_json(request.method(), request.headers()) {
        let _ = read_body(request, limit, false).await;
        app.engine.unsupported_callback(declared.as_deref());
        return Err(super::media::unsupported(declared.as_deref()));
    }
    // A bad key is refused before the body is looked at (drained first,
    // for the same reason as a forged token's).
    let key = match idempotency_key(request.headers()) {
        Ok(key) => key,
        Err(e) => {
            let _ = read_body(request, limit, false).await;
            return Err(e.into());
        }
    };
    // A genuine token's oversized body is read through for its call.
    let body = match read_body(request, limit, true).await {
        Ok(body) => body,
        Err(BodyError::TooLarge { peek }) => {
            let peek = peek.unwrap_or_default();
            return Err(refuse_for_size(&app, &token, &peek, Some(limit), too_large()).await);
        }
        Err(e) => return Err(e.into()),
    };
    let request = requests::Request::Callback {
        token: token.clone(),
        body: body.to_vec(),
        idempotency_key: key,
    };
    // A callback's token is its authority, whoever sends it.
    match app.perform.perform(&Identity::anonymous(), request).await {
        Ok(Reply::Callback { outcome }) => Ok(Json(json!({"status": outcome})).into_response()),
        Ok(other) => Err(unexpected(other)),
        // A cluster node refuses what NATS could not carry.
        Err(e @ Error::Store(store::Error::TooLarge(_))) => {
            Err(refuse_for_size(&app, &token, &Peek::of(&body), None, e.into()).await)
        }
        Err(e) => Err(e.into()),
    }
}

/// The request's `Idempotency-Key`, quotes removed; `None` without one.
/// Refused (400 `invalid_callback`): more than one (the draft: "Clients
/// MUST NOT include more than one"), or a value that is not a key
/// (`idempotency::parse`: at most 256 bytes of printable ASCII, quoted as
/// an sf-string or bare).
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Error> {
    let mut values = headers.get_all(idempotency::HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Error::BadCallback(format!(
            "send one {} header, not several",
            idempotency::HEADER
        )));
    }
    idempotency::parse(value.as_bytes())
        .map(Some)
        .map_err(|e| Error::BadCallback(e.to_string()))
}

/// Refuses a callback for its size; if `peek` shows it was its call's
/// `tool_result` (and not malformed JSON: that would be a 400 changing
/// nothing had it fit), the call ends first with an error result saying
/// so.
async fn refuse_for_size(
    app: &AppState,
    token: &str,
    peek: &Peek,
    limit: Option<usize>,
    mut refused: ApiError,
) -> ApiError {
    app.engine.oversized_callback(peek);
    if !app.engine.is_refused_result(token, peek) {
        return refused;
    }
    let request = requests::Request::ResultRefused {
        token: token.to_owned(),
        limit: limit.map(|n| n as u64),
    };
    match app.perform(&Identity::anonymous(), request).await {
        Ok(Reply::Callback { outcome }) if outcome == Outcome::Applied.name() => {
            refused.body.error.message += "; the call failed with an error result saying so";
        }
        // Not recorded for want of the store (or NATS): a 5xx, which the
        // tool retries, rather than a 413 that would leave the call waiting.
        Err(e) if e.status.is_server_error() => return e,
        // The call had ended already.
        Ok(_) | Err(_) => {}
    }
    refused
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::body::Body;
    use ferry_proto::api::CallStatus;
    use tower::ServiceExt;

    use crate::engine::Config;
    use crate::store::Store;
    use crate::thread::Command;
    use ferry_engine::testing::{call, engine};
    use ferry_engine::token::Capabilities;
    use ferry_store_sled::SledStore;

    /// When the failure of a result refused for its size cannot be
    /// recorded, the tool gets a 5xx, which RAP tools retry (rap-3: "retry
    /// callbacks on 5xx, not on 4xx"), not the 413 that would leave the
    /// call waiting for a result that is never sent again.
    #[tokio::test]
    async fn a_result_refused_for_its_size_is_a_5xx_when_its_failure_cannot_be_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SledStore::open(dir.path()).unwrap());
        let engine = Arc::new(engine(store.clone()));
        let call = call("c1", "a");
        engine.execute("g", Command::Submit(call)).await.unwrap();
        let token = Capabilities::new(b"secret").mint("g", "c1");
        let result = serde_json::json!({
            "type": "tool_result", "group_id": "g", "id": "c1",
            "text": "x".repeat(Config::default().max_body_bytes + 1),
        });
        let post = || {
            axum::http::Request::post(format!("/v1/callbacks/{token}"))
                .header("content-type", "application/json")
                .body(Body::from(result.to_string()))
                .unwrap()
        };
        let router = super::super::router(engine, None, Default::default(), &[]);

        store.poison();
        let answer = router.clone().oneshot(post()).await.unwrap();
        assert!(answer.status().is_server_error(), "{}", answer.status());
        let call = store.call("g", "c1").await.unwrap().unwrap();
        assert_eq!(call.status, CallStatus::Queued, "nothing recorded");
        assert_eq!(store.events("g", 0, 100).await.unwrap().len(), 1);
    }
}
