//! The `Idempotency-Key` request header (IETF draft
//! `draft-ietf-httpapi-idempotency-key-header`) as Ferry takes it on a
//! tool's callback, and the key as the callback's event records it.
//!
//! RAP gives a `subscription_event` no id, so a tool that sends one again
//! (its answer lost) cannot otherwise be told from one that sends a second
//! event with the same text. A tool that names each callback with a key
//! of its own, kept across its retries, gets the repeat answered
//! `duplicate`.

use serde::{Deserialize, Serialize};

/// The header's name.
pub const HEADER: &str = "Idempotency-Key";

/// The longest key Ferry takes, in bytes (its quotes and escapes not
/// counted): a key is kept in its call's record, which every commit
/// touching the call carries.
pub const MAX_KEY_BYTES: usize = 256;

/// What a keyed callback's event records: the key, and the fingerprint of
/// the body it came with, so that the same key with another body can be
/// told from a retry (the draft's "idempotency fingerprint").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyKey {
    pub key: String,
    /// The first 8 bytes of the SHA-256 of the body, as received, in
    /// lower-case hex.
    pub fingerprint: String,
}

/// Why a header value is not a key Ferry takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{HEADER}: {0}")]
pub struct BadKey(String);

/// Reads an `Idempotency-Key` header value into its key.
///
/// The draft makes the value a Structured Field String (RFC 8941,
/// section 3.3.3): printable ASCII between double quotes, where `\"` and
/// `\\` are the only escapes, as in `"8e03978e-40d5-43e8-bc93-6894a57f9324"`.
/// The quotes are not part of the key. A bare value of visible ASCII
/// (no quotes, no spaces), which many clients send, is taken as it is.
/// Spaces and tabs around the value are dropped (HTTP's optional
/// whitespace); a key must then pass [`check`].
pub fn parse(value: &[u8]) -> Result<String, BadKey> {
    let value = trim_ows(value);
    let key = match value {
        [b'"', inner @ .., b'"'] => unquote(inner)?,
        [b'"', ..] => {
            return Err(BadKey(
                "a quoted key must end with a double quote".to_owned(),
            ))
        }
        bare => {
            if let Some(&byte) = bare.iter().find(|b| !b.is_ascii_graphic()) {
                return Err(BadKey(format!(
                    "a key without quotes is visible ASCII only; it holds {}",
                    describe(byte)
                )));
            }
            String::from_utf8(bare.to_vec()).expect("ASCII")
        }
    };
    check(&key)?;
    Ok(key)
}

/// Whether `key` is one Ferry takes: 1 to [`MAX_KEY_BYTES`] bytes of
/// printable ASCII (no control characters, nothing beyond ASCII).
pub fn check(key: &str) -> Result<(), BadKey> {
    if key.is_empty() {
        return Err(BadKey("the key is empty".to_owned()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(BadKey(format!(
            "the key is {} bytes long; at most {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    if let Some(&byte) = key.as_bytes().iter().find(|b| !printable(**b)) {
        return Err(BadKey(format!(
            "a key is printable ASCII only; it holds {}",
            describe(byte)
        )));
    }
    Ok(())
}

/// The inside of an sf-string, unescaped.
fn unquote(inner: &[u8]) -> Result<String, BadKey> {
    let mut key = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&byte) = bytes.next() {
        match byte {
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => key.push(escaped),
                _ => {
                    return Err(BadKey(
                        "in a quoted key, a backslash escapes only \" or \\".to_owned(),
                    ))
                }
            },
            b'"' => {
                return Err(BadKey(
                    "a double quote inside a quoted key must be escaped (\\\")".to_owned(),
                ))
            }
            byte if printable(byte) => key.push(byte),
            byte => {
                return Err(BadKey(format!(
                    "a key is printable ASCII only; it holds {}",
                    describe(byte)
                )))
            }
        }
    }
    Ok(String::from_utf8(key).expect("ASCII"))
}

/// Printable ASCII, space included: what an sf-string holds.
fn printable(byte: u8) -> bool {
    (0x20..=0x7e).contains(&byte)
}

fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

fn describe(byte: u8) -> String {
    match byte {
        b' ' => "a space".to_owned(),
        0x00..=0x1f | 0x7f => format!("the control character 0x{byte:02x}"),
        _ => format!("the byte 0x{byte:02x}, which is not ASCII"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_key_loses_its_quotes_and_a_bare_one_is_kept() {
        let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
        assert_eq!(parse(format!("\"{uuid}\"").as_bytes()).unwrap(), uuid);
        assert_eq!(parse(uuid.as_bytes()).unwrap(), uuid);
        assert_eq!(parse(b"  call-7/3\t").unwrap(), "call-7/3");
        assert_eq!(parse(br#""a \"b\" \\c""#).unwrap(), r#"a "b" \c"#);
        assert_eq!(parse(b"\" spaced \"").unwrap(), " spaced ");
    }

    #[test]
    fn keys_that_are_not_printable_ascii_or_too_long_are_refused() {
        let longest = "k".repeat(MAX_KEY_BYTES);
        assert_eq!(parse(longest.as_bytes()).unwrap(), longest);
        assert_eq!(parse(format!("\"{longest}\"").as_bytes()).unwrap(), longest);
        let too_long = format!("{longest}k");
        let refused: [&[u8]; 12] = [
            b"",
            b"\"\"",
            b"   ",
            b"\"",
            b"\"abc",
            b"a b",
            b"a\x01b",
            b"\"a\x7fb\"",
            b"\"a\"b\"",
            b"\"a\\nb\"",
            "café".as_bytes(),
            too_long.as_bytes(),
        ];
        for value in refused {
            let e = parse(value).unwrap_err();
            assert!(e.to_string().starts_with("Idempotency-Key: "), "{e}");
        }
        assert!(check(&too_long)
            .unwrap_err()
            .to_string()
            .contains("at most 256"));
        assert!(check("a\nb").unwrap_err().to_string().contains("0x0a"));
    }
}
