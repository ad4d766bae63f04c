//! Short, stable names derived from text: the first bytes of its SHA-256,
//! in lower-case hex. Used where a name must be fixed-length or must not
//! collide with another's (OXP tool names, MCP call threads, OXP reruns).

use sha2::{Digest, Sha256};

/// The first `bytes` bytes of `text`'s SHA-256 as `2 * bytes` hex digits.
pub fn sha256_hex(text: &str, bytes: usize) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest[..bytes].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefix_of_the_digest_in_hex() {
        // SHA-256("abc") = ba7816bf…
        assert_eq!(super::sha256_hex("abc", 4), "ba7816bf");
    }
}
