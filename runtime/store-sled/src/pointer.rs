//! What the `calls` tree holds for a call its thread moved on from: the
//! sequence number (key) of the commit that last carried it, always 9
//! bytes, MessagePack's `uint 64` (`0xcf` and the number, big-endian).

use ferry_store::Error;

pub fn of(seq: u64) -> [u8; 9] {
    let mut bytes = [0xcf; 9];
    bytes[1..].copy_from_slice(&seq.to_be_bytes());
    bytes
}

pub fn read(bytes: &[u8]) -> Result<u64, Error> {
    match bytes {
        [0xcf, seq @ ..] if seq.len() == 8 => {
            Ok(u64::from_be_bytes(seq.try_into().expect("8 bytes")))
        }
        _ => Err(Error::Corrupt(format!(
            "a call's pointer is {} bytes, not 9",
            bytes.len()
        ))),
    }
}
