//! SHA-256 of text, for two uses. Short, stable names: the first bytes in
//! lower-case hex, where a name must be fixed-length or must not collide
//! with another's (OXP tool names, MCP call threads, OXP reruns, the
//! fingerprint of a keyed callback's body). Secret
//! comparison: credentials are compared as digests, in full, so the time
//! taken says nothing of where a guess first differs (API tokens, the MCP
//! bearer token, the OXP API key).

use sha2::{Digest, Sha256};

/// `text`'s SHA-256.
pub fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// Whether two digests are equal, comparing every byte (no early exit).
pub fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The first `bytes` bytes of `data`'s SHA-256 as `2 * bytes` hex digits.
pub fn sha256_hex(data: impl AsRef<[u8]>, bytes: usize) -> String {
    let digest = Sha256::digest(data.as_ref());
    digest[..bytes].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefix_of_the_digest_in_hex() {
        // SHA-256("abc") = ba7816bf…
        assert_eq!(super::sha256_hex("abc", 4), "ba7816bf");
    }

    #[test]
    fn digests_are_the_same_only_for_the_same_text() {
        use super::{same, sha256};
        assert!(same(&sha256("token"), &sha256("token")));
        assert!(!same(&sha256("token"), &sha256("tokens")));
        assert!(!same(&sha256(""), &sha256("token")));
    }
}
