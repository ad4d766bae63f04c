//! What a callback body too large to keep says: a `tool_result` over the
//! runtime's size limit is refused, and RAP tools do not retry a 4xx
//! (`rap-3`), so the runtime needs to know what it refused in order to end
//! the call instead of leaving it waiting forever.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// The top-level fields of a callback, as far as its body could be read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Peek {
    /// `type`.
    pub kind: Option<String>,
    /// `group_id`.
    pub group_id: Option<String>,
    /// `id` (a `subscription_event` names its call `tool_call_id`).
    pub id: Option<String>,
    /// One of those three was there but not a string: the body is no
    /// callback, whatever else it says.
    pub misshapen: bool,
    /// How the body's JSON ended, as far as it was read.
    pub ending: Ending,
}

/// How a peeked body's JSON ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Ending {
    /// One JSON object, with nothing but whitespace after it.
    Whole,
    /// The input stopped inside it: from [`Peek::from_reader`], a body its
    /// reader stopped reading before its end (Ferry reads an oversized
    /// body through only so far).
    Cut,
    /// Not JSON, or not only one object; or, read whole, cut short.
    #[default]
    Malformed,
}

impl Peek {
    /// Reads the top-level fields `type`, `group_id` and `id` from `body`,
    /// a JSON object, as far as it goes: other values are skipped without
    /// being kept, so a large one costs no memory. A field cut off, or one
    /// found only inside another value, is not reported; of a field given
    /// twice, the last counts (as when the body is parsed whole).
    pub fn of(body: &[u8]) -> Self {
        let mut found = Self::read(&mut serde_json::Deserializer::from_slice(body));
        // All of it was there: a body that stops inside its object is
        // malformed.
        if found.ending == Ending::Cut {
            found.ending = Ending::Malformed;
        }
        found
    }

    /// [`Peek::of`] for a body read as it arrives, from a blocking thread.
    pub fn from_reader(body: impl std::io::Read) -> Self {
        Self::read(&mut serde_json::Deserializer::from_reader(body))
    }

    fn read<'de, R: serde_json::de::Read<'de>>(de: &mut serde_json::Deserializer<R>) -> Self {
        let mut found = Peek::default();
        // The error is where the body ends (or the JSON goes wrong):
        // whatever was read before it stands.
        found.ending = match Fields(&mut found)
            .deserialize(&mut *de)
            .and_then(|()| de.end())
        {
            Ok(()) => Ending::Whole,
            Err(e) if e.is_eof() => Ending::Cut,
            Err(_) => Ending::Malformed,
        };
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
            match map.next_value::<Text>()? {
                Text(Some(text)) => *slot = Some(text),
                Text(None) => self.0.misshapen = true,
            }
        }
        Ok(())
    }
}

/// A field's value: its text, or `None` for any other JSON value, which
/// is skipped without being kept (an `id` of 16 MiB of numbers costs
/// nothing).
struct Text(Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Text;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
        Ok(Text(Some(v.to_owned())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Text, E> {
        Ok(Text(Some(v)))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Text, E> {
        Ok(Text(None))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Text, E> {
        Ok(Text(None))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Text, E> {
        Ok(Text(None))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Text, E> {
        Ok(Text(None))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Text, E> {
        Ok(Text(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Text, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Text(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Text, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Text(None))
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
                misshapen: false,
                ending: Ending::Whole,
            }
        );
    }

    #[test]
    fn fields_in_any_order_and_the_last_of_a_repeat_count() {
        let body = format!(
            r#"{{"group_id":"g","id":"c1","text":"{}","type":"tool_result"}}"#,
            "x".repeat(100_000)
        );
        let found = Peek::from_reader(body.as_bytes());
        assert_eq!(found.kind.as_deref(), Some("tool_result"));
        assert_eq!(
            (found.group_id.as_deref(), found.id.as_deref()),
            (Some("g"), Some("c1"))
        );
        let found = Peek::of(br#"{"type":"oauth","type":"tool_result","\u0069d":"c1"}"#);
        assert_eq!(found.kind.as_deref(), Some("tool_result"));
        assert_eq!(found.id.as_deref(), Some("c1"), "keys are unescaped");
    }

    #[test]
    fn a_field_of_another_type_marks_the_body_misshapen() {
        let found = Peek::of(br#"{"type":"tool_result","group_id":1,"id":"c1"}"#);
        assert!(found.misshapen);
        assert_eq!(found.group_id, None);
        assert_eq!(found.id.as_deref(), Some("c1"), "reading goes on past it");
        assert!(!Peek::of(br#"{"type":"tool_result","text":5}"#).misshapen);
        for value in [
            "null",
            "true",
            "-1",
            "2.5",
            "[[1], {\"a\": 2}]",
            "{\"b\": []}",
        ] {
            let body = format!(r#"{{"type":"tool_result","id":{value},"group_id":"g"}}"#);
            let found = Peek::of(body.as_bytes());
            assert!(found.misshapen && found.id.is_none(), "{value}");
            assert_eq!(
                found.group_id.as_deref(),
                Some("g"),
                "{value}: read on past it"
            );
        }
        // Given twice, once misshapen: no callback, whatever the other says.
        let found = Peek::of(br#"{"type":"tool_result","id":"c1","type":5}"#);
        assert!(found.misshapen);
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
        assert_eq!(found.ending, Ending::Malformed, "all there, cut short");
        let read_so_far = Peek::from_reader(&body.as_bytes()[..5_000]);
        assert_eq!(read_so_far.id.as_deref(), Some("c1"));
        assert_eq!(read_so_far.ending, Ending::Cut, "its reader stopped");
        assert_eq!(Peek::of(body.as_bytes()).ending, Ending::Whole);
        let spaced = format!("{body} \n");
        assert_eq!(Peek::from_reader(spaced.as_bytes()).ending, Ending::Whole);
    }

    #[test]
    fn a_body_with_anything_after_its_object_is_malformed() {
        let body = r#"{"type": "tool_result", "group_id": "g", "id": "c1", "text": "x"}"#;
        for tail in ["<<<not json", "{}", "1"] {
            let found = Peek::of(format!("{body}{tail}").as_bytes());
            assert_eq!(found.id.as_deref(), Some("c1"), "{tail}");
            assert_eq!(found.ending, Ending::Malformed, "{tail}");
            let read = Peek::from_reader(format!("{body}{tail}").as_bytes());
            assert_eq!(read.ending, Ending::Malformed, "{tail}");
        }
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
        let whole_but_nothing = Peek {
            ending: Ending::Whole,
            ..Peek::default()
        };
        assert_eq!(peek(&body), whole_but_nothing);
        let body = r#"{"content": [{"type": "text"}], "type": "subscription_event"}"#;
        let found = Peek::of(body.as_bytes());
        assert_eq!(found.kind.as_deref(), Some("subscription_event"));
    }

    #[test]
    fn garbage_gives_nothing() {
        for bytes in [&b""[..], b"not json", b"[1, 2]", b"\"tool_result\""] {
            assert_eq!(Peek::of(bytes), Peek::default(), "{bytes:?}");
        }
    }
}
