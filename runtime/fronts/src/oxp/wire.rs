//! OXP 1.0's shapes (`oxp-1.0-openapi.json`): the call request's schema,
//! and the error answers (`ServerErrorResponse`, `ValidationErrorResponse`,
//! and 401).

use std::sync::OnceLock;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

/// What OXP answers carry as `$schema`.
pub const SCHEMA: &str = "urn:oxp:1.0";

/// The `$schema` values naming the one OXP version Ferry speaks.
pub fn supported_schema(schema: &str) -> bool {
    matches!(schema, "urn:oxp:1.0" | "urn:oxp:1.0.0")
}

/// `CallToolRequest` as the OpenAPI document defines it (the `ToolId`
/// pattern is checked separately, to answer with a precise message).
fn call_tool_request_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "call_id": {"type": "string"},
            "trace_id": {"type": "string"},
            "tool_id": {"type": "string"},
            "input": {"type": "object", "additionalProperties": true},
            "context": {
                "type": "object",
                "properties": {
                    "authorization": {"type": "array", "items": {
                        "type": "object",
                        "properties": {"id": {"type": "string"}, "token": {"type": "string"}},
                        "required": ["id", "token"],
                        "additionalProperties": true
                    }},
                    "secrets": {"type": "array", "items": {
                        "type": "object",
                        "properties": {"id": {"type": "string"}, "value": {"type": "string"}},
                        "required": ["id", "value"],
                        "additionalProperties": true
                    }},
                    "user_id": {"type": "string"}
                },
                "additionalProperties": true
            }
        },
        "required": ["tool_id"],
        "additionalProperties": false
    })
}

/// The compiled `CallToolRequest` schema, compiled once.
pub fn request_validator() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| {
        jsonschema::validator_for(&call_tool_request_schema()).expect("OXP schema compiles")
    })
}

/// An OXP error answer: its status and body.
#[derive(Debug)]
pub struct OxpError {
    pub status: StatusCode,
    pub body: Value,
}

impl OxpError {
    /// 400 `ServerErrorResponse`.
    pub fn server(message: impl Into<String>, developer_message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            body: json!({
                "$schema": SCHEMA,
                "message": message.into(),
                "developer_message": developer_message.into(),
            }),
        }
    }

    /// 422 `ValidationErrorResponse`, naming each bad parameter.
    pub fn validation(parameter_errors: Map<String, Value>) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            body: json!({
                "$schema": SCHEMA,
                "message": "Some input parameters are invalid",
                "parameter_errors": parameter_errors,
            }),
        }
    }

    /// 401, in the `ServerErrorResponse` shape (the spec gives 401 no body
    /// schema; one shape for every error is kinder to clients).
    pub fn unauthorized(developer_message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            body: json!({
                "$schema": SCHEMA,
                "message": "Authentication is required",
                "developer_message": developer_message.into(),
            }),
        }
    }
}

impl IntoResponse for OxpError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}
