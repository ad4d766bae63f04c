//! How both stores encode what they keep (commits, call copies, toolsets):
//! MessagePack with field names, so optional and added fields decode as
//! they would from JSON. Values written by earlier versions are JSON, and
//! still read: a MessagePack map never starts with `{`.

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::Error;

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(value).expect("stored values always serialize")
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    let decoded = if bytes.first() == Some(&b'{') {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    } else {
        rmp_serde::from_slice(bytes).map_err(|e| e.to_string())
    };
    decoded.map_err(Error::Corrupt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::log::tests::call;
    use crate::thread::CallRecord;

    #[test]
    fn reads_what_it_writes_and_the_json_of_earlier_versions() {
        let record = call("a");
        let packed = encode(&record);
        assert_ne!(packed.first(), Some(&b'{'));
        assert_eq!(decode::<CallRecord>(&packed).unwrap(), record);
        let json = serde_json::to_vec(&record).unwrap();
        assert_eq!(decode::<CallRecord>(&json).unwrap(), record);
        assert!(packed.len() < json.len());
    }

    #[test]
    fn garbage_is_corrupt_not_a_panic() {
        for bytes in [&b"{not json"[..], &[0xc1, 0x00][..], &[][..]] {
            assert!(matches!(
                decode::<CallRecord>(bytes),
                Err(Error::Corrupt(_))
            ));
        }
    }
}
