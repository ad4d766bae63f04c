//! `GET /v1/audit?since=&kind=&limit=`: the audit log, `admin` only.
//! `since` is a place in the log (the `next` of the last answer: entries
//! after it) or an RFC 3339 time (entries at or after it); `kind` one
//! kind or several, comma-separated.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::Json;
use ferry_proto::audit::{AuditKind, AuditQuery};
use ferry_proto::{ErrorCode, Timestamp};
use serde_json::{json, Value};

use super::auth::Caller;
use super::{ApiError, AppState};

/// Entries in one answer unless `limit` asks for fewer.
pub const DEFAULT_LIMIT: usize = 100;
/// The most entries one answer holds.
pub const MAX_LIMIT: usize = 1000;

pub async fn list(
    State(app): State<AppState>,
    Caller(by): Caller,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let query = read_query(&params).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e))?;
    let records = app.engine.audit_log(&by, &query).await?;
    let next = records.last().map_or(query.after, |r| r.seq);
    Ok(Json(json!({"records": records, "next": next})))
}

fn read_query(params: &HashMap<String, String>) -> Result<AuditQuery, String> {
    let mut query = AuditQuery {
        limit: DEFAULT_LIMIT,
        ..AuditQuery::default()
    };
    for (name, value) in params {
        match name.as_str() {
            "since" => match value.parse::<u64>() {
                Ok(after) => query.after = after,
                Err(_) => {
                    let at = value.parse::<Timestamp>().map_err(|_| {
                        format!(
                            "since={value:?} is neither a place in the log (a number) nor an RFC 3339 time"
                        )
                    })?;
                    query.from = Some(at);
                }
            },
            "kind" => {
                for kind in value.split(',') {
                    query
                        .kinds
                        .push(kind.parse::<AuditKind>().map_err(|e| e.to_string())?);
                }
            }
            "limit" => {
                query.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| format!("limit must be 1 to {MAX_LIMIT}, not {value:?}"))?;
            }
            other => {
                return Err(format!(
                    "unknown parameter {other:?} (since, kind and limit are known)"
                ))
            }
        }
    }
    Ok(query)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Result<AuditQuery, String> {
        let params = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        read_query(&params)
    }

    #[test]
    fn since_is_a_place_or_a_time() {
        assert_eq!(read(&[("since", "12")]).unwrap().after, 12);
        let from = read(&[("since", "2026-12-07T10:00:00Z")]).unwrap().from;
        assert_eq!(from, Some("2026-12-07T10:00:00Z".parse().unwrap()));
        assert_eq!(read(&[]).unwrap().limit, DEFAULT_LIMIT);
        let kinds = read(&[("kind", "token_created,auth_refused")])
            .unwrap()
            .kinds;
        assert_eq!(kinds, [AuditKind::TokenCreated, AuditKind::AuthRefused]);
    }

    #[test]
    fn bad_parameters_are_refused_by_name() {
        for (pairs, names) in [
            (vec![("since", "yesterday")], "since"),
            (vec![("since", "-1")], "since"),
            (vec![("kind", "call")], "call_submitted"),
            (vec![("kind", "")], "unknown audit kind"),
            (vec![("limit", "0")], "limit"),
            (vec![("limit", "1001")], "limit"),
            (vec![("limit", "ten")], "limit"),
            (vec![("after", "3")], "after"),
        ] {
            let refused = read(&pairs).unwrap_err();
            assert!(refused.contains(names), "{pairs:?}: {refused}");
        }
    }
}
