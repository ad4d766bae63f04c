//! Callback capabilities: a token naming one call, authenticated with an
//! HMAC under the node's secret, so any node can refuse a forged callback
//! without a lookup (invariant 5).
//!
//! Token = `base64url(len(group_id) u32 BE ++ group_id ++ id) "." base64url(mac)`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of the MAC kept in the token: 128 bits is unguessable.
const MAC_LEN: usize = 16;

#[derive(Clone)]
pub struct Capabilities {
    key: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("forged or malformed callback token")]
pub struct Forged;

impl Capabilities {
    pub fn new(secret: &[u8]) -> Self {
        Self {
            key: secret.to_vec(),
        }
    }

    fn mac(&self, payload: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length works");
        mac.update(payload);
        mac
    }

    /// What processes of one cluster compare to learn they share a secret,
    /// without showing it: an HMAC of a fixed text under the secret, hex.
    pub fn fingerprint(&self) -> String {
        let tag = self
            .mac(b"ferry cluster secret fingerprint")
            .finalize()
            .into_bytes();
        tag.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The token for call `id` of thread `group_id`.
    pub fn mint(&self, group_id: &str, id: &str) -> String {
        let mut payload = (group_id.len() as u32).to_be_bytes().to_vec();
        payload.extend_from_slice(group_id.as_bytes());
        payload.extend_from_slice(id.as_bytes());
        let tag = self.mac(&payload).finalize().into_bytes();
        format!("{}.{}", B64.encode(&payload), B64.encode(&tag[..MAC_LEN]))
    }

    /// The `(group_id, id)` a token names, if this node's secret made it.
    pub fn open(&self, token: &str) -> Result<(String, String), Forged> {
        let (payload, tag) = token.split_once('.').ok_or(Forged)?;
        let payload = B64.decode(payload).map_err(|_| Forged)?;
        let tag = B64.decode(tag).map_err(|_| Forged)?;
        if tag.len() != MAC_LEN {
            return Err(Forged);
        }
        self.mac(&payload)
            .verify_truncated_left(&tag)
            .map_err(|_| Forged)?;
        let len = u32::from_be_bytes(
            payload
                .get(..4)
                .ok_or(Forged)?
                .try_into()
                .map_err(|_| Forged)?,
        );
        let rest = &payload[4..];
        let len = usize::try_from(len).map_err(|_| Forged)?;
        let group = std::str::from_utf8(rest.get(..len).ok_or(Forged)?).map_err(|_| Forged)?;
        let id = std::str::from_utf8(&rest[len..]).map_err(|_| Forged)?;
        Ok((group.to_owned(), id.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_call_and_resist_forgery() {
        let caps = Capabilities::new(b"secret");
        for (g, id) in [("g", "c"), ("a.*.>", "ü /%"), ("", "")] {
            let token = caps.mint(g, id);
            assert_eq!(caps.open(&token), Ok((g.into(), id.into())));
        }
        let token = caps.mint("g", "c");
        let other = Capabilities::new(b"other");
        assert_eq!(other.open(&token), Err(Forged));
        let (payload, tag) = token.split_once('.').unwrap();
        let swapped = format!("{}.{tag}", B64.encode(b"\0\0\0\x01gX"));
        assert_eq!(caps.open(&swapped), Err(Forged));
        assert_eq!(caps.open(&format!("{payload}.")), Err(Forged));
        assert_eq!(caps.open("garbage"), Err(Forged));
        assert_eq!(caps.open(&format!("{payload}.{}", &tag[..4])), Err(Forged));
    }

    #[test]
    fn a_fingerprint_tells_secrets_apart_and_shows_none() {
        let a = Capabilities::new(b"0123456789abcdef");
        assert_eq!(
            a.fingerprint(),
            Capabilities::new(b"0123456789abcdef").fingerprint()
        );
        assert_ne!(
            a.fingerprint(),
            Capabilities::new(b"0123456789abcdeF").fingerprint()
        );
        assert_eq!(a.fingerprint().len(), 64);
        assert!(
            !a.fingerprint().contains("30313233"),
            "the secret's bytes do not show"
        );
    }
}
