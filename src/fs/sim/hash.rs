//! Stable hashes of the disk image and the trace, for "same seed, same run"
//! checks across processes and machines.
//!
//! Invariant: the hash depends only on the bytes fed in, in order — FNV-1a
//! 64 written out here (a dozen lines; std's hashers are seeded per process
//! and not stable across Rust versions, so they cannot be used).

use std::collections::BTreeMap;

use super::key::Key;
use super::state::{Ino, Node};
use super::types::TraceEntry;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// FNV-1a, 64-bit.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fnv1a(u64);

impl Fnv1a {
    pub(super) fn new() -> Self {
        Fnv1a(FNV_OFFSET)
    }

    pub(super) fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
        self
    }

    /// Length-prefixed, so ("ab","c") and ("a","bc") differ.
    pub(super) fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.bytes(&(bytes.len() as u64).to_le_bytes()).bytes(bytes)
    }

    pub(super) fn finish(&self) -> u64 {
        self.0
    }
}

/// Hash of a namespace with file contents (directories included, so an
/// empty directory that vanished changes the hash). Paths are hashed as
/// spelled by [`Key`]; a file whose inode `bytes` does not know hashes as
/// empty.
pub(super) fn image_hash<'a>(ns: &BTreeMap<Key, Node>, bytes: impl Fn(Ino) -> Option<&'a [u8]>) -> u64 {
    let mut h = Fnv1a::new();
    let mut spelled = Vec::new();
    for (path, node) in ns {
        spelled.clear();
        path.as_ref().spell_into(&mut spelled);
        h.field(&spelled);
        match node {
            Node::Dir => h.bytes(b"d"),
            Node::File(ino) => h.bytes(b"f").field(bytes(*ino).unwrap_or_default()),
        };
    }
    h.finish()
}

pub(super) fn trace_hash(trace: &[TraceEntry]) -> u64 {
    let mut h = Fnv1a::new();
    for e in trace {
        h.bytes(&e.point.to_le_bytes())
            .bytes(&[e.op.code(), e.outcome.code()])
            .field(e.path.as_bytes())
            .field(e.label.as_bytes());
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::Fnv1a;

    #[test]
    fn fnv1a_matches_published_vectors() {
        assert_eq!(Fnv1a::new().finish(), 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv1a::new().bytes(b"a").finish(), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(Fnv1a::new().bytes(b"foobar").finish(), 0x8594_4171_f739_67e8);
    }
}
