//! A thread's events as ACP messages: each event becomes at most one
//! JSON-RPC message, so the SSE id of a message is its event's seq and a
//! stream resumes exactly like the events stream.

use ferry_proto::api::{Event, EventKind, PermissionKind};
use ferry_proto::rap::{Annotations, ContentItem, DisplaySegment, KnownSegment};
use serde_json::{json, Value};

use super::kind::{kind, title};

/// The JSON-RPC id of the permission request for call `id`; the client's
/// response names it, and it names the call back.
pub const PERMISSION_PREFIX: &str = "ferry-permission:";

pub fn permission_request_id(call_id: &str) -> String {
    format!("{PERMISSION_PREFIX}{call_id}")
}

/// The ACP message for `event`, if it has one. `annotations` looks up a
/// qualified tool's annotations (for the ToolKind).
pub fn message(event: &Event, annotations: &dyn Fn(&str) -> Option<Annotations>) -> Option<Value> {
    let id = event.id.as_deref()?;
    let session = &event.group_id;
    let update = |update: Value| {
        Some(json!({
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": session, "update": update},
        }))
    };
    let status = |status: &str| json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": status});
    let with_text = |mut u: Value, text: String| {
        u["content"] = json!([text_block(&text)]);
        u
    };
    match &event.kind {
        EventKind::CallAccepted {
            tool, arguments, ..
        } => {
            let mut call = tool_call(id, tool, arguments, annotations(tool).as_ref());
            call["sessionUpdate"] = json!("tool_call");
            update(call)
        }
        EventKind::ApprovalRequested {
            tool, arguments, ..
        } => Some(json!({
            "jsonrpc": "2.0",
            "id": permission_request_id(id),
            "method": "session/request_permission",
            "params": {
                "sessionId": session,
                "toolCall": tool_call(id, tool, arguments, annotations(tool).as_ref()),
                "options": PermissionKind::ALL.iter().map(|k| k.option()).collect::<Vec<_>>(),
            },
        })),
        // A late acknowledgement must not turn a finished call back to
        // `in_progress`.
        EventKind::CallDispatched {
            after_result: true, ..
        } => None,
        EventKind::CallDispatched { .. } => update(status("in_progress")),
        // Still `pending`: the tool has not taken the call yet.
        EventKind::DispatchRetrying {
            attempts, reason, ..
        } => update(with_text(
            status("pending"),
            format!("Attempt {attempts} failed ({reason}); retrying."),
        )),
        EventKind::ToolResult {
            text,
            content,
            display_as,
            is_error,
            subscription,
            origin,
            ..
        } => {
            let state = match (is_error, subscription) {
                (true, _) => "failed",
                (false, true) => "in_progress",
                (false, false) => "completed",
            };
            let mut u = status(state);
            u["content"] = json!(result_content(
                text,
                content.as_deref(),
                display_as.as_deref()
            ));
            u["rawOutput"] = json!({
                "text": text, "content": content, "display_as": display_as,
                "is_error": is_error, "subscription": subscription, "origin": origin,
            });
            update(u)
        }
        // A call whose tool sends events is running, even when an event
        // came before the tool's 200 (then no `call_dispatched` said so).
        EventKind::SubscriptionEvent { text, is_final, .. } => update(with_text(
            status(if *is_final {
                "completed"
            } else {
                "in_progress"
            }),
            text.clone(),
        )),
        EventKind::SubscriptionCancelled { .. } => update(status("completed")),
        EventKind::OAuth { auth_url } => update(with_text(
            status("in_progress"),
            format!("Authorization needed: open {auth_url}"),
        )),
        EventKind::UserChoice {
            prompt, choices, ..
        } => {
            let listed: Vec<String> = choices
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{}. {c}", i + 1))
                .collect();
            update(with_text(
                status("in_progress"),
                format!("{prompt}\n{}", listed.join("\n")),
            ))
        }
        EventKind::CallCancelled {} => update(with_text(
            status("failed"),
            "The call was cancelled.".into(),
        )),
        _ => None,
    }
}

/// A `ToolCall` (without `sessionUpdate`): also the `toolCall` of a
/// permission request.
fn tool_call(id: &str, tool: &str, arguments: &Value, ann: Option<&Annotations>) -> Value {
    json!({
        "toolCallId": id,
        "title": title(tool),
        "name": tool,
        "kind": kind(tool, ann),
        "status": "pending",
        "rawInput": arguments,
    })
}

fn text_block(text: &str) -> Value {
    json!({"type": "content", "content": {"type": "text", "text": text}})
}

fn image_block(data: &str, media_type: &str) -> Value {
    json!({"type": "content", "content": {"type": "image", "data": data, "mimeType": media_type}})
}

/// The result as blocks, then its display segments that add something:
/// images, and diffs as the text of the patch. The result is its content
/// items (text and images, in order) when it has any — `content` wins over
/// `text` (rap-3), and `text` is then only their text items joined — and
/// otherwise its text.
fn result_content(
    text: &str,
    content: Option<&[ContentItem]>,
    display_as: Option<&[DisplaySegment]>,
) -> Vec<Value> {
    let mut blocks: Vec<Value> = match content {
        Some(items) if !items.is_empty() => items
            .iter()
            .map(|item| match item {
                ContentItem::Text { text } => text_block(text),
                ContentItem::Image { data, media_type } => image_block(data, media_type),
            })
            .collect(),
        _ => vec![text_block(text)],
    };
    for segment in display_as.unwrap_or_default() {
        match segment {
            DisplaySegment::Known(KnownSegment::Diff(diff)) => blocks.push(text_block(&format!(
                "```diff\n{}\n```",
                diff.patch.trim_end()
            ))),
            DisplaySegment::Known(KnownSegment::Image(image)) => {
                blocks.push(image_block(&image.data, &image.media_type))
            }
            _ => {}
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(blocks: &[Value]) -> Vec<&str> {
        blocks
            .iter()
            .map(|b| {
                b["content"]["text"]
                    .as_str()
                    .or(b["content"]["type"].as_str())
                    .unwrap()
            })
            .collect()
    }

    fn text_item(text: &str) -> ContentItem {
        ContentItem::Text { text: text.into() }
    }

    #[test]
    fn a_result_with_content_shows_each_item_once_and_in_order() {
        // rap-3: "`content` wins when both are present"; the stored text is
        // the text items joined, so showing it too would repeat them.
        let image = ContentItem::Image {
            data: "aGk=".into(),
            media_type: "image/png".into(),
        };
        let items = [text_item("first"), image, text_item("second")];
        let blocks = result_content("first\nsecond", Some(&items), None);
        assert_eq!(texts(&blocks), ["first", "image", "second"]);
        assert_eq!(blocks[1]["content"]["mimeType"], "image/png");
    }

    #[test]
    fn a_result_without_content_is_its_text() {
        assert_eq!(texts(&result_content("done", None, None)), ["done"]);
        assert_eq!(texts(&result_content("done", Some(&[]), None)), ["done"]);
    }
}
