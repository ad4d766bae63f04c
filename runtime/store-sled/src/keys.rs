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
/// scan walks a thread's commits in order.
pub fn commit(group_id: &str, seq: u64) -> Vec<u8> {
    let mut key = thread(group_id);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// The greatest commit key a thread can have, given its thread key: the
/// next thread's keys sort after it.
pub fn commit_after_all(thread: &[u8]) -> Vec<u8> {
    let mut key = thread.to_vec();
    key.extend_from_slice(&u64::MAX.to_be_bytes());
    key
}

/// The thread key a call or commit key starts with.
pub fn thread_of(key: &[u8]) -> Option<&[u8]> {
    let len = u32::from_be_bytes(key.get(..4)?.try_into().ok()?) as usize;
    key.get(..4 + len)
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
        assert!(!commit("a", 1).starts_with(&thread("a.")));
        assert!(commit("a", 1) < commit("a", 2));
        assert!(commit("a", 255) < commit("a", 256));
        assert!(commit("a", u64::MAX) <= commit_after_all(&thread("a")));
        assert_eq!(thread_of(&commit("a.b", 7)), Some(thread("a.b").as_slice()));
    }
}
