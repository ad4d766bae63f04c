//! Standard Webhooks signatures: what a push consumer sends with each
//! delivery, so that its receiver verifies it with an off-the-shelf
//! library. The signed content is `{webhook-id}.{webhook-timestamp}.{body}`,
//! signed with HMAC-SHA256 under the secret's bytes, and sent as
//! `webhook-signature: v1,<base64>`.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// What a Standard Webhooks secret starts with; base64 of its bytes follows.
pub const SECRET_PREFIX: &str = "whsec_";
/// Bounds of a secret's bytes.
pub const MIN_SECRET_BYTES: usize = 24;
pub const MAX_SECRET_BYTES: usize = 64;

/// The bytes of a `whsec_…` secret, or why it is not one.
pub fn secret_key(secret: &str) -> Result<Vec<u8>, String> {
    let encoded = secret
        .strip_prefix(SECRET_PREFIX)
        .ok_or_else(|| format!("push.secret must start with {SECRET_PREFIX:?}, then base64"))?;
    let key = STANDARD
        .decode(encoded)
        .map_err(|_| "push.secret is not base64 after its prefix".to_owned())?;
    if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&key.len()) {
        return Err(format!(
            "push.secret must hold {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes (it holds {})",
            key.len()
        ));
    }
    Ok(key)
}

/// The `webhook-signature` header of `body` sent as message `id` at
/// `timestamp` (seconds since the epoch).
pub fn signature(key: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The `webhook-id` of one event delivered by one consumer: the same for
/// every attempt, so a receiver drops a repeat by it.
pub fn message_id(consumer: &str, group_id: &str, seq: u64) -> String {
    let digest = crate::digest::sha256_hex(format!("{consumer}\0{group_id}\0{seq}"), 24);
    format!("msg_{digest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks reference libraries' tests.
    #[test]
    fn signs_as_the_reference_libraries_do() {
        let key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let signed = signature(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signed, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn bad_secrets_say_what_is_wrong() {
        assert!(secret_key("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap_err()
            .contains("whsec_"));
        assert!(secret_key("whsec_!!!").unwrap_err().contains("base64"));
        assert!(secret_key("whsec_c2hvcnQ=")
            .unwrap_err()
            .contains("24 to 64"));
    }

    #[test]
    fn a_message_id_names_one_event_of_one_consumer() {
        let id = message_id("c", "g", 1);
        assert_eq!(id, message_id("c", "g", 1));
        assert_ne!(id, message_id("c", "g", 2));
        assert_ne!(id, message_id("d", "g", 1));
        assert!(id.starts_with("msg_"));
    }
}
