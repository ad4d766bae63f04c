//! Key layout of the sled trees. A `group_id` is arbitrary text, so keys
//! length-prefix it: no thread's keys can be a prefix of another's.

/// `len(group_id) as u32 BE ++ group_id`.
pub fn thread(group_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(4 + group_id.len() + 16);
    key.extend_from_slice(&(group_id.len() as u32).to_be_bytes());
    key.extend_from_slice(group_id.as_bytes());
    key
}

/// The thread key followed by the call id.
pub fn call(group_id: &str, id: &str) -> Vec<u8> {
    let mut key = thread(group_id);
    key.extend_from_slice(id.as_bytes());
    key
}

/// The thread key followed by the big-endian sequence number, so a range
/// scan walks a thread's events in order.
pub fn event(group_id: &str, seq: u64) -> Vec<u8> {
    let mut key = thread(group_id);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// Splits a call key back into `(group_id, id)`.
pub fn split_call(key: &[u8]) -> Option<(String, String)> {
    let len = u32::from_be_bytes(key.get(..4)?.try_into().ok()?) as usize;
    let group = std::str::from_utf8(key.get(4..4 + len)?).ok()?;
    let id = std::str::from_utf8(key.get(4 + len..)?).ok()?;
    Some((group.to_owned(), id.to_owned()))
}

/// `name \0 version`.
pub fn toolset(name: &str, version: &semver::Version) -> Vec<u8> {
    format!("{name}\0{version}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_keys_never_prefix_each_other() {
        // "a" + "b…" must not collide with "ab" + "…".
        assert!(!call("ab", "c").starts_with(&thread("a")));
        assert!(!event("a", 1).starts_with(&thread("a.")));
        assert!(event("a", 1) < event("a", 2));
        assert!(event("a", 255) < event("a", 256));
    }

    #[test]
    fn call_keys_split_back() {
        for (g, id) in [("a.b", "c"), ("", "x"), ("*>", "ü /"), ("g", "")] {
            assert_eq!(split_call(&call(g, id)), Some((g.into(), id.into())));
        }
    }
}
