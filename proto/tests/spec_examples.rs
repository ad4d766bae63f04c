//! Every JSON example of the RAP documents in `shared/specs/`, parsed into
//! Ferry's types and written back unchanged.

use ferry_proto::rap::{Callback, CallbackError, Invocation, Manifest};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::{json, Value};

/// Parses `example`, serializes it again, and checks nothing was lost or
/// invented (a `null` and an absent optional field are the same on the wire).
fn check<T: Serialize + DeserializeOwned>(example: Value) -> T {
    let parsed: T = serde_json::from_value(example.clone()).expect("example parses");
    let written = serde_json::to_value(&parsed).unwrap();
    assert_eq!(strip_nulls(written), strip_nulls(example));
    let packed = rmp_serde::to_vec_named(&parsed).unwrap();
    let unpacked: T = rmp_serde::from_slice(&packed).expect("msgpack round trip");
    assert_eq!(
        serde_json::to_value(&unpacked).unwrap(),
        serde_json::to_value(&parsed).unwrap()
    );
    parsed
}

fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

fn callback(example: Value) -> Callback {
    let parsed = check::<Callback>(example.clone());
    let strict = Callback::from_slice(example.to_string().as_bytes()).expect("from_slice");
    assert_eq!(parsed, strict);
    parsed
}

// rap-1 "Request"
#[test]
fn invocation_example() {
    let inv: Invocation = check(json!({
        "operation": "subscribe_github_events",
        "arguments": {"owner": "acme", "repo": "api", "event_type": "pull_request"},
        "id": "call_abc123",
        "call_id": null,
        "callback_url": "https://agent.example.com/callback",
        "group_id": "thread_xyz",
        "thread_ancestors": ["thread_root", "thread_parent"],
        "user_id": "user_42"
    }));
    assert_eq!(inv.thread_ancestors.unwrap().len(), 2);
}

// rap-2 "Request"
#[test]
fn tool_result_with_text_display() {
    let cb = callback(json!({
        "type": "tool_result",
        "group_id": "thread_xyz",
        "id": "call_abc123",
        "call_id": null,
        "text": "Deployment completed successfully. Instance i-0abc123 is running.",
        "display_as": [{"type": "text", "content": "Deployed instance i-0abc123"}]
    }));
    assert_eq!(cb.kind(), "tool_result");
    assert_eq!(cb.call_id(), Some("call_abc123"));
}

// rap-2 "Structured Results"
#[test]
fn tool_result_structured() {
    callback(json!({
        "type": "tool_result",
        "group_id": "thread_xyz",
        "id": "call_abc123",
        "text": "{\"instances\": [{\"id\": \"i-0abc123\", \"state\": \"running\"}], \"count\": 1}"
    }));
}

// rap-2 "Segment Type: diff" and "A diff display with text fallback"
#[test]
fn tool_result_diff_with_text_fallback() {
    let Callback::ToolResult(r) = callback(json!({
        "type": "tool_result",
        "group_id": "thread_xyz",
        "id": "call_abc123",
        "text": "Replaced text in src/main.rs",
        "display_as": [
            {"type": "diff", "content": {"path": "src/main.rs",
             "patch": "--- src/main.rs\n+++ src/main.rs\n@@ -1,3 +1,4 @@\n fn main() {\n+ println!(\"hello\");\n }"}},
            {"type": "text", "content": "edit_file src/main.rs — 1 insertion"}
        ]
    })) else {
        panic!("not a tool_result")
    };
    use ferry_proto::rap::{DisplaySegment, KnownSegment};
    let segments = r.display_as.unwrap();
    assert!(
        matches!(&segments[0], DisplaySegment::Known(KnownSegment::Diff(d)) if d.path == "src/main.rs")
    );
    assert!(matches!(
        &segments[1],
        DisplaySegment::Known(KnownSegment::Text(_))
    ));
}

// rap-2 "Error Handling": "Error: " prefix marks an error result.
#[test]
fn tool_result_error() {
    let Callback::ToolResult(r) = callback(json!({
        "type": "tool_result",
        "group_id": "thread_xyz",
        "id": "call_abc123",
        "text": "Error: API rate limit exceeded. Retry after 60 seconds."
    })) else {
        panic!("not a tool_result")
    };
    assert!(r.is_error());
}

// rap-3: `content` items text/image; `content` wins when both are present.
#[test]
fn tool_result_with_content_items_and_image_segment() {
    let Callback::ToolResult(r) = callback(json!({
        "type": "tool_result",
        "group_id": "g",
        "id": "c",
        "content": [
            {"type": "text", "text": "a chart"},
            {"type": "image", "data": "aGVsbG8=", "mediaType": "image/png"}
        ],
        "display_as": [{"type": "image", "content": {"data": "aGVsbG8=", "mediaType": "image/png"}}],
        "subscription": true
    })) else {
        panic!("not a tool_result")
    };
    assert_eq!(r.model_text(), "a chart");
    assert!(r.subscription);
}

// rap-3: "`content` wins when both are present" — for the model's text
// and for the `Error: ` convention alike.
#[test]
fn content_wins_over_text_when_both_are_present() {
    let both = |text: &str, item: &str| {
        let Callback::ToolResult(r) = callback(json!({
            "type": "tool_result", "group_id": "g", "id": "c", "text": text,
            "content": [{"type": "text", "text": item}]
        })) else {
            panic!("not a tool_result")
        };
        r
    };
    let r = both("Done", "Error: the disk is full");
    assert_eq!(r.model_text(), "Error: the disk is full");
    assert!(r.is_error());
    let r = both("Error: stale", "fine");
    assert_eq!(r.model_text(), "fine");
    assert!(!r.is_error());
    // An empty list is no content: the text stands.
    let Callback::ToolResult(r) = callback(json!({
        "type": "tool_result", "group_id": "g", "id": "c", "text": "t", "content": []
    })) else {
        panic!("not a tool_result")
    };
    assert_eq!(r.model_text(), "t");
}

#[test]
fn unknown_display_segments_are_kept() {
    callback(json!({
        "type": "tool_result", "group_id": "g", "id": "c", "text": "t",
        "display_as": [{"type": "chart", "content": {"series": [1, 2]}}]
    }));
}

// rap-3 "Callback message types"
#[test]
fn subscription_event_oauth_user_choice_view_update() {
    let cb = callback(json!({
        "type": "subscription_event", "group_id": "g", "tool_call_id": "c",
        "text": "PR #1 opened", "associative": true, "final": false
    }));
    assert_eq!(cb.call_id(), Some("c"));
    callback(
        json!({"type": "oauth", "group_id": "g", "id": "c", "auth_url": "https://auth.example.com/x"}),
    );
    callback(json!({
        "type": "user_choice", "group_id": "g", "id": "c", "prompt": "Which branch?",
        "choices": ["main", "dev"], "default": 0, "response_url": "https://tool.example.com/choice"
    }));
    let cb = callback(
        json!({"type": "view_update", "group_id": "g", "view_type": "diff", "content": {"any": ["json"]}}),
    );
    assert_eq!(cb.call_id(), None);
}

#[test]
fn subscription_event_flags_default_to_false() {
    let Callback::SubscriptionEvent(e) = Callback::from_slice(
        br#"{"type":"subscription_event","group_id":"g","tool_call_id":"c","text":"x"}"#,
    )
    .unwrap() else {
        panic!("not a subscription_event")
    };
    assert!(!e.associative && !e.is_final);
}

/// rap-2: `subscription` "Defaults to false"; rap-3: "`associative`
/// (default false), `final` (default false)". Tools that write an unset
/// optional field as `null`, as the specs' examples write `call_id`, get
/// the default, not a 400 that they would never retry. Another type is
/// still refused.
#[test]
fn optional_flags_given_as_null_take_their_defaults() {
    let Callback::SubscriptionEvent(e) = Callback::from_slice(
        br#"{"type":"subscription_event","group_id":"g","tool_call_id":"c","text":"x","associative":null,"final":null}"#,
    )
    .unwrap() else {
        panic!("not a subscription_event")
    };
    assert!(!e.associative && !e.is_final);
    let Callback::ToolResult(r) = Callback::from_slice(
        br#"{"type":"tool_result","group_id":"g","id":"c","call_id":null,"text":"t","subscription":null}"#,
    )
    .unwrap() else {
        panic!("not a tool_result")
    };
    assert!(!r.subscription);
    for body in [
        &br#"{"type":"tool_result","group_id":"g","id":"c","text":"t","subscription":"yes"}"#[..],
        br#"{"type":"subscription_event","group_id":"g","tool_call_id":"c","text":"x","final":1}"#,
    ] {
        let err = Callback::from_slice(body).unwrap_err();
        assert!(err.to_string().contains("expected a boolean"), "{err}");
    }
}

#[test]
fn bad_callbacks_are_named() {
    let cases: [(&[u8], &str); 13] = [
        (b"{not json", "malformed JSON"),
        (b"[]", "string \"type\""),
        (br#"{"type":"tool_resultz","group_id":"g","id":"c","text":"t"}"#, "unknown callback type \"tool_resultz\""),
        (br#"{"type":"tool_result","group_id":"g","text":"t"}"#, "missing field `id`"),
        (br#"{"type":"tool_result","group_id":"g","id":"c"}"#, "needs `text`, or `content`"),
        (br#"{"type":"tool_result","group_id":"g","id":"c","content":[]}"#, "at least one item"),
        (br#"{"type":"tool_result","group_id":"g","id":"c","text":"t","display_as":[{"type":"diff","content":"not an object"}]}"#, "{path, patch}"),
        (br#"{"type":"tool_result","group_id":"g","id":"c","text":"t","display_as":[{"type":"text"}]}"#, "display segment"),
        (br#"{"type":"tool_result","group_id":"g","id":"c","text":"t","display_as":[{"type":"image","content":{"data":"x"}}]}"#, "display segment"),
        (br#"{"type":"oauth","group_id":"g","id":"c","auth_url":"javascript:alert(1)"}"#, "`auth_url` must be"),
        (br#"{"type":"oauth","group_id":"g","id":"c","auth_url":""}"#, "`auth_url` must be"),
        (br#"{"type":"user_choice","group_id":"g","id":"c","prompt":"p","choices":[],"default":0,"response_url":"u"}"#, "at least one"),
        (br#"{"type":"user_choice","group_id":"g","id":"c","prompt":"p","choices":["a"],"default":1,"response_url":"u"}"#, "valid index"),
    ];
    for (body, expected) in cases {
        let err = Callback::from_slice(body).unwrap_err();
        assert!(
            err.to_string().contains(expected),
            "{err} should mention {expected}"
        );
    }
    // A segment type Ferry does not know is kept as it came.
    let chart = br#"{"type":"tool_result","group_id":"g","id":"c","text":"t","display_as":[{"type":"chart","content":[1,2]}]}"#;
    assert!(Callback::from_slice(chart).is_ok());
    assert!(matches!(
        Callback::from_slice(br#"{"type":"nope"}"#),
        Err(CallbackError::UnknownType(t)) if t == "nope"
    ));
}

// rap-3 "Toolsets and discovery": manifest fields, annotations with x- keys.
#[test]
fn manifest_round_trip() {
    let m: Manifest = check(json!({
        "name": "github",
        "description": "GitHub tools",
        "endpoint": "https://tools.example.com/invoke",
        "needsMigration": false,
        "tools": [{
            "name": "subscribe_github_events",
            "description": "Watch a repository",
            "inputSchema": {"type": "object", "properties": {"owner": {"type": "string"}}, "required": ["owner"]},
            "annotations": {"requiresAuth": "github", "readOnly": true, "destructive": false,
                            "idempotent": true, "longRunning": true, "x-team": "infra"},
            "displayScript": "\"watching \" + args.owner"
        }]
    }));
    let ann = m.tools[0].annotations.as_ref().unwrap();
    assert_eq!(ann.extra["x-team"], "infra");
}

// rap-3 notifications
#[test]
fn notification_bodies() {
    use ferry_proto::rap::{CancelToolCall, CloseThread, ToolCallStatus, ToolCallStatusReply};
    check::<CancelToolCall>(json!({"thread_id": "t", "tool_call_id": "c"}));
    check::<CloseThread>(json!({"thread_id": "t"}));
    check::<ToolCallStatus>(json!({"thread_id": "t", "tool_call_id": "c"}));
    check::<ToolCallStatusReply>(json!({"alive": false}));
}
