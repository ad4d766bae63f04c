//! The five callback messages a tool POSTs to its `callback_url`
//! (`rap-2`, `rap-3` "Callback message types").

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A callback, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Callback {
    ToolResult(ToolResult),
    SubscriptionEvent(SubscriptionEvent),
    #[serde(rename = "oauth")]
    OAuth(OAuth),
    UserChoice(UserChoice),
    ViewUpdate(ViewUpdate),
}

/// Why a callback body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CallbackError {
    #[error("malformed JSON: {0}")]
    MalformedJson(serde_json::Error),
    #[error("callback must be a JSON object with a string \"type\"")]
    MissingType,
    #[error("unknown callback type {0:?}; expected one of tool_result, subscription_event, oauth, user_choice, view_update")]
    UnknownType(String),
    #[error("invalid {kind} callback: {source}")]
    Invalid {
        kind: &'static str,
        source: serde_json::Error,
    },
}

/// A segment that names a type Ferry knows but did not parse as one: kept
/// as `Other`, it would be served under that type with the wrong shape.
fn malformed_known(segment: &DisplaySegment) -> bool {
    match segment {
        DisplaySegment::Known(_) => false,
        DisplaySegment::Other(value) => matches!(
            value.get("type").and_then(Value::as_str),
            Some("text" | "diff" | "image")
        ),
    }
}

/// `http://host…` or `https://host…`, with no whitespace.
fn is_http_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/') && !url.contains(char::is_whitespace))
}

impl Callback {
    pub const TYPES: [&'static str; 5] = [
        "tool_result",
        "subscription_event",
        "oauth",
        "user_choice",
        "view_update",
    ];

    /// Parses a callback body, naming what is wrong: bad JSON, an unknown
    /// `type`, or a missing or mistyped field of a known type.
    pub fn from_slice(body: &[u8]) -> Result<Self, CallbackError> {
        let value: Value = serde_json::from_slice(body).map_err(CallbackError::MalformedJson)?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .ok_or(CallbackError::MissingType)?;
        let kind = Self::TYPES
            .into_iter()
            .find(|k| *k == kind)
            .ok_or_else(|| CallbackError::UnknownType(kind.to_owned()))?;
        let invalid = |source| CallbackError::Invalid { kind, source };
        let callback: Callback = serde_json::from_value(value).map_err(invalid)?;
        callback.check().map_err(|msg| CallbackError::Invalid {
            kind,
            source: serde::de::Error::custom(msg),
        })?;
        Ok(callback)
    }

    /// Rules serde cannot express: a `tool_result` carries `text` or some
    /// `content`, and its display segments of a known type have that
    /// type's content; an `oauth` link and a `user_choice`'s
    /// `response_url` are http(s) URLs (a UI shows the one as a link, and
    /// an answer to any other could never be delivered); a `user_choice`
    /// has a choice and a valid default.
    fn check(&self) -> Result<(), &'static str> {
        match self {
            Callback::ToolResult(r)
                if r.text.is_none() && r.content.as_ref().is_none_or(Vec::is_empty) =>
            {
                Err("a tool_result needs `text`, or `content` with at least one item")
            }
            Callback::ToolResult(r) if r.display_as.iter().flatten().any(malformed_known) => Err(
                "a display segment of type text, diff or image needs that type's content: \
                 a string, {path, patch}, or {data, mediaType}",
            ),
            Callback::OAuth(o) if !is_http_url(&o.auth_url) => {
                Err("`auth_url` must be an http:// or https:// URL")
            }
            Callback::UserChoice(c) if c.choices.is_empty() => {
                Err("`choices` needs at least one entry")
            }
            Callback::UserChoice(c) if c.default >= c.choices.len() => {
                Err("`default` is not a valid index into `choices`")
            }
            Callback::UserChoice(c) if !is_http_url(&c.response_url) => {
                Err("`response_url` must be an http:// or https:// URL")
            }
            _ => Ok(()),
        }
    }

    /// The thread the callback is for.
    pub fn group_id(&self) -> &str {
        match self {
            Callback::ToolResult(m) => &m.group_id,
            Callback::SubscriptionEvent(m) => &m.group_id,
            Callback::OAuth(m) => &m.group_id,
            Callback::UserChoice(m) => &m.group_id,
            Callback::ViewUpdate(m) => &m.group_id,
        }
    }

    /// The call the callback names, where it names one (`view_update` does
    /// not; `subscription_event` names it as `tool_call_id`).
    pub fn call_id(&self) -> Option<&str> {
        match self {
            Callback::ToolResult(m) => Some(&m.id),
            Callback::SubscriptionEvent(m) => Some(&m.tool_call_id),
            Callback::OAuth(m) => Some(&m.id),
            Callback::UserChoice(m) => Some(&m.id),
            Callback::ViewUpdate(_) => None,
        }
    }

    /// The `type` tag, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Callback::ToolResult(_) => "tool_result",
            Callback::SubscriptionEvent(_) => "subscription_event",
            Callback::OAuth(_) => "oauth",
            Callback::UserChoice(_) => "user_choice",
            Callback::ViewUpdate(_) => "view_update",
        }
    }
}

/// The outcome of a call (`rap-2`). `content` wins over `text` when both are
/// present; errors are results whose text starts with `Error: `.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub group_id: String,
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<ContentItem>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_as: Option<Vec<DisplaySegment>>,
    #[serde(
        default,
        deserialize_with = "null_is_false",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub subscription: bool,
}

/// An optional flag given as `null` is absent, as the specs' own examples
/// write absent fields (`"call_id": null`): refusing it would be a 4xx, and
/// a tool does not send a refused callback again (rap-3).
fn null_is_false<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(deserializer)?.unwrap_or(false))
}

impl ToolResult {
    /// The text the model receives: the text items of `content` joined,
    /// or `text` when no content was sent (`rap-3`: "`content` wins when
    /// both are present"; an empty list counts as none).
    pub fn model_text(&self) -> String {
        match (&self.text, &self.content) {
            (_, Some(items)) if !items.is_empty() => {}
            (Some(text), _) => return text.clone(),
            (None, _) => {}
        }
        let items = self.content.iter().flatten();
        let texts: Vec<&str> = items
            .filter_map(|item| match item {
                ContentItem::Text { text } => Some(text.as_str()),
                ContentItem::Image { .. } => None,
            })
            .collect();
        texts.join("\n")
    }

    /// Whether the result reports an error, by the `Error: ` convention.
    pub fn is_error(&self) -> bool {
        self.model_text().starts_with("Error: ")
    }
}

/// One item of a `tool_result`'s `content`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentItem {
    Text {
        text: String,
    },
    Image {
        data: String,
        #[serde(rename = "mediaType")]
        media_type: String,
    },
}

/// A display segment for human-facing UIs. Segment types Ferry does not know
/// are kept as they came, since a richer client may render them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DisplaySegment {
    Known(KnownSegment),
    Other(Value),
}

/// The display segment types seen in the wild: `text`, `diff`, `image`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "content", rename_all = "snake_case")]
pub enum KnownSegment {
    Text(String),
    Diff(DiffContent),
    Image(ImageContent),
}

/// The content of a `diff` segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiffContent {
    pub path: String,
    pub patch: String,
}

/// The content of an `image` segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageContent {
    pub data: String,
    #[serde(rename = "mediaType")]
    pub media_type: String,
}

/// One event of a subscription; it names its call as `tool_call_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubscriptionEvent {
    pub group_id: String,
    pub tool_call_id: String,
    pub text: String,
    #[serde(default, deserialize_with = "null_is_false")]
    pub associative: bool,
    #[serde(default, rename = "final", deserialize_with = "null_is_false")]
    pub is_final: bool,
}

/// The user must authorize before the call can go on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OAuth {
    pub group_id: String,
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    pub auth_url: String,
}

/// The tool asks the user to pick one of `choices`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserChoice {
    pub group_id: String,
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    pub prompt: String,
    pub choices: Vec<String>,
    pub default: usize,
    pub response_url: String,
}

/// A live view for human UIs, never part of the model's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewUpdate {
    pub group_id: String,
    pub view_type: String,
    pub content: Value,
}
