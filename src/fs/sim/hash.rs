//! Stable hashes of the disk image and the trace, for "same seed, same run"
//! checks across processes and machines.
//!
//! Invariant: the hash depends only on the bytes fed in, in order — FNV-1a
//! 64 written out here (a dozen lines; std's hashers are seeded per process
//! and not stable across Rust versions, so they cannot be used).

use super::pages::Pages;
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
/// empty directory that vanished changes the hash), fed entry by entry in
/// path order ([`super::SimFs::visit_image`]). Paths are hashed as spelled
/// by [`super::key::Key`].
#[derive(Debug, Clone, Copy)]
pub(super) struct ImageHasher(Fnv1a);

impl Default for ImageHasher {
    fn default() -> Self {
        ImageHasher(Fnv1a::new())
    }
}

impl ImageHasher {
    /// One entry: a file's bytes, or `None` for a directory. (The same
    /// hash as a `field` of the file's bytes made contiguous.)
    pub(super) fn entry(&mut self, path: &std::path::Path, bytes: Option<&Pages>) {
        use std::os::unix::ffi::OsStrExt;
        self.0.field(path.as_os_str().as_bytes());
        match bytes {
            None => {
                self.0.bytes(b"d");
            }
            Some(pages) => {
                self.0.bytes(b"f").bytes(&(pages.len() as u64).to_le_bytes());
                pages.chunks().for_each(|chunk| {
                    self.0.bytes(chunk);
                });
            }
        }
    }

    pub(super) fn finish(&self) -> u64 {
        self.0.finish()
    }
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
