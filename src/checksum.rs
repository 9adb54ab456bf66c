//! Checksums of the lines durable-agent persists as JSON (event log
//! entries, session records), so that bits flipped at rest are detected
//! instead of read as data.
//!
//! Invariant: a *sealed* line is a JSON object whose last member is
//! `"crc":"<8 lowercase hex digits>"`, and that CRC-32 (IEEE, computed by
//! `crc32fast`, a well-kept and SIMD-accelerated implementation rather
//! than a hand-written table) covers exactly the object as it was before
//! sealing: the line with `,"crc":"…"` removed. So the line stays plain
//! JSON (valid JSONL), and a verifier needs no JSON parser to check it.
//! CRC-32 detects every error burst of up to 32 bits, so any one flipped
//! bit anywhere in a sealed line — in the data, the key, the digits or
//! the braces — is a mismatch (or leaves the line unsealed, which a
//! reader of a sealed format refuses).

/// What follows the sealed object's content: `,"crc":"` + 8 hex + `"}`.
const KEY: &[u8] = b",\"crc\":\"";
/// Bytes the seal adds to the object's closing brace.
pub const SEAL_BYTES: usize = KEY.len() + 8 + 1;

/// What [`check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealed {
    /// The line ends with a checksum and it matches.
    Verified,
    /// The line carries no checksum (an older format, or damage in the
    /// seal itself: the reader decides by the line's version).
    Unsealed,
    /// The line ends with a checksum that does not match its bytes.
    Mismatch { stored: u32, computed: u32 },
}

/// Seal a serialized JSON object (`{…}`, at least one member).
pub fn seal(object: &str) -> String {
    debug_assert!(object.starts_with('{') && object.ends_with('}') && object.len() > 2);
    let body = &object[..object.len() - 1];
    let crc = crc_of(body.as_bytes());
    let mut out = String::with_capacity(object.len() + SEAL_BYTES);
    out.push_str(body);
    out.push_str(",\"crc\":\"");
    out.push_str(&format!("{crc:08x}"));
    out.push_str("\"}");
    out
}

/// Check one line (without its newline).
pub fn check(line: &[u8]) -> Sealed {
    let Some(seal_at) = line.len().checked_sub(KEY.len() + 8 + 2) else {
        return Sealed::Unsealed;
    };
    let (body, seal) = line.split_at(seal_at);
    if !seal.starts_with(KEY) || !seal.ends_with(b"\"}") {
        return Sealed::Unsealed;
    }
    let hex = &seal[KEY.len()..KEY.len() + 8];
    let computed = crc_of(body);
    // Unreadable digits are a mismatch too: the seal is there, damaged.
    let stored = std::str::from_utf8(hex)
        .ok()
        .filter(|h| {
            h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        .and_then(|h| u32::from_str_radix(h, 16).ok());
    match stored {
        Some(stored) if stored == computed => Sealed::Verified,
        Some(stored) => Sealed::Mismatch { stored, computed },
        None => Sealed::Mismatch {
            stored: !computed,
            computed,
        },
    }
}

/// The CRC of an object's content: its bytes without the closing brace,
/// then the brace (so it is the CRC of the unsealed object).
fn crc_of(body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(body);
    h.update(b"}");
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_line_verifies_and_stays_json() {
        let line = seal(r#"{"a":1,"b":"x"}"#);
        assert_eq!(check(line.as_bytes()), Sealed::Verified);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["a"], 1);
        assert_eq!(v["crc"].as_str().unwrap().len(), 8);
        assert_eq!(line.len(), r#"{"a":1,"b":"x"}"#.len() + SEAL_BYTES);
    }

    #[test]
    fn every_single_bit_flip_of_a_sealed_line_is_caught() {
        let line = seal(r#"{"schema_version":3,"seq":12,"data":{"payload":"hello"}}"#).into_bytes();
        for at in 0..line.len() {
            for bit in 0..8 {
                let mut bad = line.clone();
                bad[at] ^= 1 << bit;
                assert_ne!(check(&bad), Sealed::Verified, "flip of bit {bit} at byte {at}");
            }
        }
    }

    #[test]
    fn an_unsealed_line_is_reported_unsealed() {
        assert_eq!(check(br#"{"a":1}"#), Sealed::Unsealed);
        assert_eq!(check(b""), Sealed::Unsealed);
    }
}
