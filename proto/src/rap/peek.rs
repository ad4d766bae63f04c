//! What the start of a callback body says, when the whole body cannot be
//! read: a `tool_result` over the runtime's size limit is refused, and RAP
//! tools do not retry a 4xx (`rap-3`), so the runtime needs to know what it
//! refused in order to end the call instead of leaving it waiting forever.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The top-level fields of a callback found before its body was cut off.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Peek {
    /// `type`.
    pub kind: Option<String>,
    /// `group_id`.
    pub group_id: Option<String>,
    /// `id` (a `subscription_event` names its call `tool_call_id`).
    pub id: Option<String>,
}

impl Peek {
    /// Reads the top-level string fields `type`, `group_id` and `id` from
    /// `prefix`, the first bytes of a JSON object, as far as it goes. Other
    /// values are skipped without being kept, so a large one costs no
    /// memory; a field cut off, or one found only inside another value,
    /// is not reported.
    pub fn of(prefix: &[u8]) -> Self {
        let mut found = Peek::default();
        let mut de = serde_json::Deserializer::from_slice(prefix);
        // The error is where the prefix ends (or the JSON goes wrong):
        // whatever was read before it stands.
        let _ = Fields(&mut found).deserialize(&mut de);
        found
    }
}

/// Fills a [`Peek`] field by field, so what was read survives an error.
struct Fields<'a>(&'a mut Peek);

impl<'de> DeserializeSeed<'de> for Fields<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Fields<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a callback object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let slot = match key.as_ref() {
                "type" => &mut self.0.kind,
                "group_id" => &mut self.0.group_id,
                "id" => &mut self.0.id,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            // A field of another type is left unreported, like a cut one.
            if let Ok(text) = map.next_value::<String>() {
                *slot = Some(text);
            } else {
                return Ok(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn peek(value: &serde_json::Value) -> Peek {
        Peek::of(value.to_string().as_bytes())
    }

    #[test]
    fn a_whole_body_gives_its_fields() {
        let body = json!({"type": "tool_result", "group_id": "g", "id": "c1", "text": "x"});
        assert_eq!(
            peek(&body),
            Peek {
                kind: Some("tool_result".into()),
                group_id: Some("g".into()),
                id: Some("c1".into()),
            }
        );
    }

    #[test]
    fn a_body_cut_after_its_fields_still_gives_them() {
        let body = format!(
            r#"{{"type": "tool_result", "group_id": "g", "id": "c1", "text": "{}"}}"#,
            "x".repeat(10_000)
        );
        let found = Peek::of(&body.as_bytes()[..5_000]);
        assert_eq!(found.kind.as_deref(), Some("tool_result"));
        assert_eq!(found.group_id.as_deref(), Some("g"));
        assert_eq!(found.id.as_deref(), Some("c1"));
    }

    #[test]
    fn a_field_past_the_cut_or_cut_itself_is_not_reported() {
        let body = r#"{"text": "xxxxxxxxxxxxxxxx", "type": "tool_result"}"#;
        assert_eq!(Peek::of(&body.as_bytes()[..20]), Peek::default());
        let body = r#"{"type": "tool_result", "group_id": "g"}"#;
        let found = Peek::of(&body.as_bytes()[..18]);
        assert_eq!(found.kind, None, "a cut string is not a value");
    }

    #[test]
    fn only_top_level_fields_count() {
        let body = json!({"content": [{"type": "tool_result", "id": "x"}]});
        assert_eq!(peek(&body), Peek::default());
        let body = r#"{"content": [{"type": "text"}], "type": "subscription_event"}"#;
        let found = Peek::of(body.as_bytes());
        assert_eq!(found.kind.as_deref(), Some("subscription_event"));
    }

    #[test]
    fn garbage_gives_nothing() {
        for bytes in [
            &b""[..],
            b"not json",
            b"[1, 2]",
            b"\"tool_result\"",
            b"{\"type\": 5}",
        ] {
            assert_eq!(Peek::of(bytes), Peek::default(), "{bytes:?}");
        }
    }
}
