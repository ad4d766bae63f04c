//! Inputs the issues list as bad, shared by the single-process and the
//! cluster tests: each must be refused with its status and error code, and
//! change nothing.

use serde_json::{json, Value};

/// A toolset `calc` with `add` (`a` and `b`, numbers, required) and
/// `anything` (an empty schema).
pub fn calc_manifest() -> Value {
    json!({"name": "calc", "tools": [
        {"name": "add", "description": "a + b",
         "inputSchema": {"type": "object",
                         "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                         "required": ["a", "b"]}},
        // A schema that constrains nothing: rap-1 still makes `arguments`
        // an object.
        {"name": "anything", "description": "takes anything", "inputSchema": {}}]})
}

/// A toolset `ops` with `deploy` (annotated destructive, so gated by
/// default) and `look`.
pub fn ops_manifest() -> Value {
    json!({"name": "ops", "tools": [
        {"name": "deploy", "description": "ship it", "inputSchema": {"type": "object"},
         "annotations": {"destructive": true}},
        {"name": "look", "description": "read only", "inputSchema": {"type": "object"}}
    ]})
}

/// Bad submissions for `POST /v1/calls`, as (what, body, status, error
/// code), against tool `op` of toolset `t` (see `TestTool::start`) and
/// [`calc_manifest`]; every one names thread `bad`.
pub fn bad_submissions() -> Vec<(&'static str, Vec<u8>, u16, &'static str)> {
    vec![
        ("malformed JSON", b"{\"operation\": \"op\",".to_vec(), 400, "invalid_json"),
        ("not an object", b"[1, 2]".to_vec(), 400, "invalid_request"),
        ("missing operation", json!({"arguments": {}, "group_id": "bad"}).to_string().into(), 400, "invalid_request"),
        ("missing group_id", json!({"operation": "op", "arguments": {}}).to_string().into(), 400, "invalid_request"),
        ("empty operation", json!({"operation": "", "arguments": {}, "group_id": "bad"}).to_string().into(), 400, "invalid_request"),
        // rap-1: `arguments` is required, even when empty.
        ("missing arguments", json!({"operation": "op", "group_id": "bad"}).to_string().into(), 400, "invalid_request"),
        ("the fields as an array", json!(["op", {}, "bad", null, null, null, null]).to_string().into(), 400, "invalid_request"),
        ("unknown tool", json!({"operation": "nope", "arguments": {}, "group_id": "bad"}).to_string().into(), 400, "unknown_tool"),
        ("unknown toolset", json!({"operation": "zzz.op", "arguments": {}, "group_id": "bad"}).to_string().into(), 400, "unknown_tool"),
        ("unknown version", json!({"operation": "t.op@9", "arguments": {}, "group_id": "bad"}).to_string().into(), 400, "unknown_tool"),
        ("wrong type", json!({"operation": "add", "arguments": {"a": 1, "b": "two"}, "group_id": "bad"}).to_string().into(), 422, "invalid_arguments"),
        ("missing required", json!({"operation": "add", "arguments": {"a": 1}, "group_id": "bad"}).to_string().into(), 422, "invalid_arguments"),
        ("arguments not an object", json!({"operation": "add", "arguments": 5, "group_id": "bad"}).to_string().into(), 422, "invalid_arguments"),
        ("arguments null under an empty schema", json!({"operation": "anything", "arguments": null, "group_id": "bad"}).to_string().into(), 422, "invalid_arguments"),
        ("arguments an array under an empty schema", json!({"operation": "anything", "arguments": [1], "group_id": "bad"}).to_string().into(), 422, "invalid_arguments"),
        ("empty group_id", json!({"operation": "op", "arguments": {}, "group_id": ""}).to_string().into(), 400, "invalid_request"),
        ("group_id over 512 bytes", json!({"operation": "op", "arguments": {}, "group_id": "g".repeat(10_000)}).to_string().into(), 400, "invalid_request"),
        ("empty id", json!({"operation": "op", "arguments": {}, "group_id": "bad", "id": ""}).to_string().into(), 400, "invalid_request"),
        ("id over 512 bytes", json!({"operation": "op", "arguments": {}, "group_id": "bad", "id": "i".repeat(513)}).to_string().into(), 400, "invalid_request"),
        ("group_id \"..\"", json!({"operation": "op", "arguments": {}, "group_id": ".."}).to_string().into(), 400, "invalid_request"),
        ("id \".\"", json!({"operation": "op", "arguments": {}, "group_id": "bad", "id": "."}).to_string().into(), 400, "invalid_request"),
        ("2 MiB body", json!({"operation": "op", "arguments": {"text": "x".repeat(2 << 20)}, "group_id": "bad"}).to_string().into(), 413, "payload_too_large"),
    ]
}
