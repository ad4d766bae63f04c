//! How both stores encode what they keep (commits, call pointers and
//! copies, toolsets): MessagePack with field names, so optional and added
//! fields decode as they would from JSON, LZ4-compressed when that makes a
//! value of some size smaller.
//!
//! Why compress: sled rewrites a whole leaf (up to 16 values) when it
//! consolidates or splits one, so every byte of a commit is written and
//! copied many times over; field names and timestamps repeat within a
//! commit and LZ4 removes about half of it for a few hundred nanoseconds.
//!
//! The first byte tells the encodings apart: `0xc1` (a byte MessagePack
//! never uses) starts a compressed value; anything else is MessagePack.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::Error;

/// Starts a compressed value: its uncompressed length (u32, little-endian)
/// and the LZ4 block follow.
const COMPRESSED: u8 = 0xc1;

/// Values shorter than this are kept as they are: too little to gain.
const COMPRESS_FROM: usize = 128;

/// What encoding starts with room for: a usual command's commit (600–900
/// bytes packed) fits.
const PACKED_CAPACITY: usize = 1024;

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Sized for a usual commit: growing from rmp_serde's 128 bytes took
    // three reallocations and copies per commit.
    let mut packed = Vec::with_capacity(PACKED_CAPACITY);
    value
        .serialize(&mut rmp_serde::Serializer::new(&mut packed).with_struct_map())
        .expect("stored values always serialize");
    if packed.len() < COMPRESS_FROM {
        return packed;
    }
    // Marker, length, block, compressed straight into place.
    let mut compressed = vec![0; 5 + lz4_flex::block::get_maximum_output_size(packed.len())];
    compressed[0] = COMPRESSED;
    compressed[1..5].copy_from_slice(&(packed.len() as u32).to_le_bytes());
    let block = lz4_flex::block::compress_into(&packed, &mut compressed[5..])
        .expect("sized for the worst case");
    compressed.truncate(5 + block);
    if compressed.len() < packed.len() {
        compressed
    } else {
        packed
    }
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    let decoded = match bytes.first() {
        Some(&COMPRESSED) => {
            let packed = decompress(&bytes[1..])?;
            rmp_serde::from_slice(&packed).map_err(|e| e.to_string())
        }
        _ => rmp_serde::from_slice(bytes).map_err(|e| e.to_string()),
    };
    decoded.map_err(Error::Corrupt)
}

/// The MessagePack inside a compressed value. The length it claims is
/// checked against what LZ4 can expand to (255 bytes per byte) before any
/// allocation, so a damaged value is an error, not a huge allocation.
fn decompress(stored: &[u8]) -> Result<Vec<u8>, Error> {
    let corrupt = |why: String| Error::Corrupt(format!("compressed value: {why}"));
    let (len, block) = stored
        .split_first_chunk::<4>()
        .ok_or_else(|| corrupt("no length".into()))?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > block.len().saturating_mul(255) {
        return Err(corrupt(format!("{len} bytes claimed from {}", block.len())));
    }
    lz4_flex::decompress(block, len).map_err(|e| corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::call;
    use ferry_core::thread::CallRecord;

    #[test]
    fn reads_what_it_writes_and_refuses_json() {
        let record = call("a");
        let packed = encode(&record);
        assert_eq!(decode::<CallRecord>(&packed).unwrap(), record);
        let json = serde_json::to_vec(&record).unwrap();
        assert!(packed.len() < json.len());
        assert!(matches!(
            decode::<CallRecord>(&json),
            Err(Error::Corrupt(_))
        ));
    }

    /// Times are kept as the RFC 3339 strings stored values have always
    /// held: a record reads back values written as plain strings, and
    /// writes them again the same.
    #[test]
    fn times_are_stored_as_strings() {
        let mut record = call("a");
        record.approval_deadline = Some("2099-01-01T00:00:00Z".parse().unwrap());
        let stored: serde_json::Value = decode(&encode(&record)).unwrap();
        assert_eq!(stored["created_at"], "1970-01-01T00:00:00.000Z");
        assert_eq!(stored["approval_deadline"], "2099-01-01T00:00:00Z");
        let mut written = stored;
        written["created_at"] = "2026-11-29T00:00:00.123Z".into();
        written["updated_at"] = "2026-11-29T00:00:01Z".into();
        let read: CallRecord = decode(&encode(&written)).unwrap();
        assert_eq!(read.created_at.as_millis(), 1_795_910_400_123);
        assert_eq!(read.updated_at.as_millis(), 1_795_910_401_000);
        let again: serde_json::Value = decode(&encode(&read)).unwrap();
        assert_eq!(again["created_at"], "2026-11-29T00:00:00.123Z");
        assert_eq!(again["updated_at"], "2026-11-29T00:00:01.000Z");
        assert_eq!(again["approval_deadline"], "2099-01-01T00:00:00Z");
    }

    #[test]
    fn large_values_are_compressed_small_ones_are_not() {
        let small = 7u64;
        assert_eq!(encode(&small), rmp_serde::to_vec_named(&small).unwrap());
        let mut record = call("a");
        record.submission.arguments = serde_json::json!({"text": "hello ".repeat(40)});
        let packed = rmp_serde::to_vec_named(&record).unwrap();
        let stored = encode(&record);
        assert_eq!(stored.first(), Some(&COMPRESSED));
        assert!(
            stored.len() < packed.len() / 2,
            "{} of {}",
            stored.len(),
            packed.len()
        );
        assert_eq!(decode::<CallRecord>(&stored).unwrap(), record);
        // A large value that does not compress is kept packed, and read.
        assert_eq!(decode::<CallRecord>(&packed).unwrap(), record);
    }

    #[test]
    fn garbage_is_corrupt_not_a_panic() {
        // A compressed value cut short, or claiming more than it holds.
        let mut truncated = encode(&serde_json::json!({"text": "x".repeat(400)}));
        truncated.truncate(truncated.len() / 2);
        let lying = [COMPRESSED, 0xff, 0xff, 0xff, 0x7f, 0x10, 0x41];
        for bytes in [
            &b"{not json"[..],
            &[0xc1, 0x00][..],
            &[][..],
            &truncated[..],
            &lying[..],
        ] {
            assert!(matches!(
                decode::<CallRecord>(bytes),
                Err(Error::Corrupt(_))
            ));
        }
    }
}
