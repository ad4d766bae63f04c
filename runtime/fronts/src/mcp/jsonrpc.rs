//! JSON-RPC 2.0 framing for `/mcp`: one message per POST, or for a
//! 2025-03-26 session a batch of them (batches were removed from MCP in
//! 2025-06-18), its error codes, and answers.

use serde_json::{json, Map, Value};

pub use ferry_proto::jsonrpc::{
    INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR,
};
/// The `Mcp-Session-Id` names no live session (the SDKs' convention).
pub const SESSION_NOT_FOUND: i64 = -32001;
/// A server error (JSON-RPC's implementation-defined range): Ferry is
/// stopping, and a call it was waiting on for the client goes on.
pub const SERVER_STOPPING: i64 = -32000;
/// 2026-07-28: the routing headers disagree with the body.
pub const HEADER_MISMATCH: i64 = -32020;
/// 2026-07-28: the request's protocol version is not served here.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// A JSON-RPC error object, with the HTTP status it is sent under.
#[derive(Debug, Clone)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
    pub http_status: u16,
}

impl RpcError {
    /// An error in answer to a well-formed request: HTTP 200.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
            http_status: 200,
        }
    }

    /// An error of the transport layer (unparseable, session, headers).
    pub fn transport(http_status: u16, code: i64, message: impl Into<String>) -> Self {
        Self {
            http_status,
            ..Self::new(code, message)
        }
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, message)
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    pub fn to_value(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        error
    }
}

/// One incoming message, classified.
#[derive(Debug)]
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Map<String, Value>,
    },
    Notification {
        method: String,
        params: Map<String, Value>,
    },
    /// A client's answer to a server request; Ferry sends none, so it is
    /// acknowledged and dropped.
    Response,
}

impl Incoming {
    /// Parses one POST body. Errors carry the request id where it was
    /// readable, so the client can match them.
    pub fn parse(body: &[u8]) -> Result<Incoming, (Value, RpcError)> {
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            (
                Value::Null,
                RpcError::transport(400, PARSE_ERROR, format!("Parse error: {e}")),
            )
        })?;
        Self::from_value(value)
    }

    /// Classifies one message (a whole body, or one member of a batch).
    pub fn from_value(value: Value) -> Result<Incoming, (Value, RpcError)> {
        let bad = |id: Value, why: &str| {
            Err((
                id,
                RpcError::transport(400, INVALID_REQUEST, format!("Invalid Request: {why}")),
            ))
        };
        let mut object = match value {
            Value::Object(o) => o,
            Value::Array(_) => {
                return bad(
                    Value::Null,
                    "JSON-RPC batches are supported only in a 2025-03-26 session (they were removed in MCP 2025-06-18); send one message per POST",
                )
            }
            _ => return bad(Value::Null, "a JSON-RPC message must be an object"),
        };
        let id = object.remove("id");
        // MCP: "Requests MUST include a string or integer ID", answered
        // with "the same ID": an integer beyond 64 bits would come back
        // changed (serde_json reads it as a float), so it is refused too.
        let valid_id = match &id {
            Some(Value::String(_)) => true,
            Some(Value::Number(n)) => n.is_i64() || n.is_u64(),
            _ => false,
        };
        let shown_id = if valid_id {
            id.clone().unwrap_or(Value::Null)
        } else {
            Value::Null
        };
        if object.get("jsonrpc") != Some(&json!("2.0")) {
            return bad(shown_id, "\"jsonrpc\" must be \"2.0\"");
        }
        let params = match object.remove("params") {
            None => Map::new(),
            Some(Value::Object(p)) => p,
            Some(_) => return bad(shown_id, "\"params\" must be an object"),
        };
        match (object.remove("method"), id) {
            (Some(Value::String(method)), None) => Ok(Incoming::Notification { method, params }),
            (Some(Value::String(method)), Some(id)) if valid_id => {
                Ok(Incoming::Request { id, method, params })
            }
            (Some(Value::String(_)), Some(_)) => bad(
                Value::Null,
                "\"id\" must be a string or an integer (of at most 64 bits)",
            ),
            (Some(_), _) => bad(shown_id, "\"method\" must be a string"),
            // "Either a result or an error MUST be set. A response MUST NOT
            // set both."
            (None, Some(_)) if object.contains_key("result") && object.contains_key("error") => {
                bad(shown_id, "a response has \"result\" or \"error\", not both")
            }
            (None, Some(_)) if object.contains_key("result") || object.contains_key("error") => {
                Ok(Incoming::Response)
            }
            (None, _) => bad(shown_id, "\"method\" is missing"),
        }
    }
}

pub fn response(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

pub fn error_response(id: &Value, error: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error.to_value()})
}

pub fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str) -> i64 {
        Incoming::parse(body.as_bytes()).unwrap_err().1.code
    }

    #[test]
    fn malformed_messages_get_their_json_rpc_codes() {
        assert_eq!(code("{not json"), PARSE_ERROR);
        assert_eq!(
            code(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#),
            INVALID_REQUEST
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1}"#), INVALID_REQUEST);
        // "Requests MUST include a string or integer ID" (echoed as sent).
        for id in ["1.5", "1e3", "18446744073709551616", "-9223372036854775809"] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            assert_eq!(code(&body), INVALID_REQUEST, "{id}");
        }
        // "A response MUST NOT set both."
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}"#),
            INVALID_REQUEST
        );
    }

    #[test]
    fn integer_ids_of_64_bits_are_taken_as_sent() {
        for id in ["18446744073709551615", "-9223372036854775808", "0"] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            let Ok(Incoming::Request { id: got, .. }) = Incoming::parse(body.as_bytes()) else {
                panic!("{id} refused");
            };
            assert_eq!(got.to_string(), id);
        }
    }

    #[test]
    fn requests_notifications_and_responses_are_told_apart() {
        let r = Incoming::parse(br#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#).unwrap();
        assert!(matches!(r, Incoming::Request { ref method, .. } if method == "ping"));
        let n = Incoming::parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert!(matches!(n, Ok(Incoming::Notification { .. })));
        let a = Incoming::parse(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#);
        assert!(matches!(a, Ok(Incoming::Response)));
    }
}
