//! [`Key`]: the form in which the image stores every path, so that lookups,
//! ordering, `parent` and `starts_with` are byte-slice operations instead of
//! `Path` component parsing.
//!
//! Invariant: a key is a `Path`'s component sequence (Unix), encoded so that
//! two keys are equal iff their paths are equal, and byte order of keys is
//! exactly `Path`'s `Ord` (component-wise). The iteration order of every
//! `BTreeMap<Key, _>` — hence `list` results, [`super::SimFs::image_hash`]
//! and the order of power-loss draws — is therefore the order a
//! `BTreeMap<PathBuf, _>` of the same paths had.
//!
//! Encoding:
//! - the empty path `""` (no components) is the empty key;
//! - an absolute path is [`ABS`] followed by, for each component after the
//!   root, a `0x00` separator and the component's payload (so `/` is
//!   `[ABS]` and `/a/b` is `[ABS, 0, b'a', 0, b'b']`);
//! - a relative path is [`REL`] followed by the same `0x00`-separated
//!   payloads.
//!
//! A normal component's payload is its bytes (never empty, never NUL, never
//! `/`), prefixed by `[2, 2]` if its first byte is 1 or 2; `.` (only ever
//! first) is `[1]` and `..` is `[2, 1]`. This keeps `.` < `..` < every
//! name, as `Component`'s order has it, and no payload is a prefix of a
//! different one unless the paths' order agrees. Since payloads hold no
//! `0x00`, a key's parent is its bytes before the last `0x00`, and `k`
//! lies under `dir` iff `dir` is a byte prefix of `k` followed by the end
//! or a `0x00`. Absolute keys start with `ABS` < `REL`, so every absolute
//! path sorts before every relative one, and `""` before both.
//!
//! The usual argument — absolute, no `//`, no `.` or `..` component, no
//! trailing `/`, no name starting with byte 1 or 2 — is encoded by
//! prefixing `ABS` and mapping each `/` to `0x00`; anything else goes
//! through `Path::components`.

use std::fmt;
use std::path::{Component, Path, PathBuf};

/// First byte of an absolute path's key.
const ABS: u8 = 1;
/// First byte of a relative path's key.
const REL: u8 = 2;
const SEP: u8 = 0;
/// Payload of a `.` component.
const CUR_DIR: &[u8] = &[1];
/// Payload of a `..` component.
const PARENT_DIR: &[u8] = &[2, 1];
/// Prefix of a name whose first byte is 1 or 2.
const ESCAPE: &[u8] = &[2, 2];

/// A path stored in the image (see the module doc for the encoding).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Key(Box<[u8]>);

/// A borrowed [`Key`] (a parent, an ancestor): same encoding, same order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct KeyRef<'a>(&'a [u8]);

/// Whether a name must be escaped (its first byte collides with `.`/`..`).
fn needs_escape(name: &[u8]) -> bool {
    matches!(name.first(), Some(1 | 2))
}

impl Key {
    /// The key of `path` (equal for every spelling of the same components).
    pub(super) fn new(path: &Path) -> Key {
        let key = encode_plain(path.as_os_str().as_encoded_bytes()).unwrap_or_else(|| encode(path));
        Key(key.into_boxed_slice())
    }

    /// `/`.
    pub(super) fn root() -> Key {
        Key(Box::new([ABS]))
    }

    pub(super) fn as_ref(&self) -> KeyRef<'_> {
        KeyRef(&self.0)
    }

    pub(super) fn to_path_buf(&self) -> PathBuf {
        self.as_ref().to_path_buf()
    }
}

/// Any path, through `Path::components`.
fn encode(path: &Path) -> Vec<u8> {
    let mut key = Vec::with_capacity(path.as_os_str().len() + 4);
    for c in path.components() {
        let (escape, payload) = match c {
            Component::RootDir => {
                key.push(ABS);
                continue;
            }
            // Windows only; the crate is Unix-only (see `RealFs`).
            Component::Prefix(_) => continue,
            Component::CurDir => (false, CUR_DIR),
            Component::ParentDir => (false, PARENT_DIR),
            Component::Normal(name) => {
                let name = name.as_encoded_bytes();
                (needs_escape(name), name)
            }
        };
        if key.is_empty() {
            key.push(REL);
        }
        key.push(SEP);
        if escape {
            key.extend_from_slice(ESCAPE);
        }
        key.extend_from_slice(payload);
    }
    key
}

/// An argument of an [`Fs`](crate::fs::Fs) call: the path as the caller gave
/// it (error messages name it so) and its key (for lookups).
pub(super) struct Arg<'a> {
    pub path: &'a Path,
    pub key: Key,
}

impl<'a> Arg<'a> {
    pub(super) fn new(path: &'a Path) -> Self {
        Arg {
            path,
            key: Key::new(path),
        }
    }
}

/// The usual absolute path: `ABS`, then each `/` becomes `0x00`. `None` if
/// `bytes` is not absolute or has an empty, `.` or `..` component or a name
/// that needs escaping.
fn encode_plain(bytes: &[u8]) -> Option<Vec<u8>> {
    let rest = bytes.strip_prefix(b"/")?;
    let mut key = Vec::with_capacity(bytes.len() + 1);
    key.push(ABS);
    if rest.is_empty() {
        return Some(key);
    }
    for name in rest.split(|b| *b == b'/') {
        if name.is_empty() || name == b"." || name == b".." || needs_escape(name) {
            return None;
        }
        key.push(SEP);
        key.extend_from_slice(name);
    }
    Some(key)
}

impl std::borrow::Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

impl<'a> KeyRef<'a> {
    /// The encoded bytes: what a `BTreeMap<Key, _>` is looked up with.
    pub(super) fn bytes(self) -> &'a [u8] {
        self.0
    }

    pub(super) fn to_key(self) -> Key {
        Key(self.0.into())
    }

    /// `/` or `""`, the paths the image treats as the root directory.
    pub(super) fn is_root(self) -> bool {
        matches!(self.0, [] | [ABS])
    }

    /// As `Path::parent`: `None` for `/` and `""`; `""` for a one-component
    /// relative path.
    pub(super) fn parent(self) -> Option<KeyRef<'a>> {
        let cut = self.0.iter().rposition(|b| *b == SEP)?;
        match &self.0[..cut] {
            [REL] => Some(KeyRef(&[])),
            parent => Some(KeyRef(parent)),
        }
    }

    /// As `Path::starts_with`: `base` is a component prefix of `self`.
    pub(super) fn starts_with(self, base: KeyRef<'_>) -> bool {
        match self.0.strip_prefix(base.0) {
            None => false,
            Some(rest) => base.0.is_empty() || rest.first().is_none_or(|b| *b == SEP),
        }
    }

    /// The last component's payload, if there is one.
    fn last(self) -> Option<&'a [u8]> {
        let cut = self.0.iter().rposition(|b| *b == SEP)?;
        Some(&self.0[cut + 1..])
    }

    /// As `Path::file_name`: the last component if it is a name (not `.`,
    /// `..` or the root).
    pub(super) fn file_name(self) -> Option<&'a [u8]> {
        match self.last()? {
            CUR_DIR | PARENT_DIR => None,
            payload => Some(payload.strip_prefix(ESCAPE).unwrap_or(payload)),
        }
    }

    /// The path spelled from its components (normalized: single `/`
    /// between them, no trailing `/`, no `.` after the start).
    pub(super) fn to_path_buf(self) -> PathBuf {
        use std::os::unix::ffi::OsStringExt;
        let mut out = Vec::with_capacity(self.0.len());
        self.spell_into(&mut out);
        PathBuf::from(std::ffi::OsString::from_vec(out))
    }

    /// Append the bytes of [`KeyRef::to_path_buf`] to `out`.
    pub(super) fn spell_into(self, out: &mut Vec<u8>) {
        let Some((first, rest)) = self.0.split_first() else {
            return;
        };
        if *first == ABS && rest.is_empty() {
            out.push(b'/');
        }
        for (i, payload) in rest.split(|b| *b == SEP).skip(1).enumerate() {
            if *first == ABS || i > 0 {
                out.push(b'/');
            }
            match payload {
                CUR_DIR => out.push(b'.'),
                PARENT_DIR => out.extend_from_slice(b".."),
                name => out.extend_from_slice(name.strip_prefix(ESCAPE).unwrap_or(name)),
            }
        }
    }
}

impl fmt::Display for Key {
    /// As `Path::display` of [`Key::to_path_buf`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.to_path_buf().display().fmt(f)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}

impl fmt::Debug for KeyRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", self.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use proptest::prelude::*;

    use super::*;

    fn key(s: &str) -> Key {
        Key::new(Path::new(s))
    }

    /// Everything `Path` can tell about a path, read off its key.
    fn check_agrees(p: &Path) {
        let k = Key::new(p);
        let r = k.as_ref();
        assert_eq!(
            r.parent().map(KeyRef::to_key),
            p.parent().map(Key::new),
            "parent of {p:?}"
        );
        assert_eq!(
            r.file_name(),
            p.file_name().map(|n| n.as_encoded_bytes()),
            "file name of {p:?}"
        );
        assert_eq!(k.to_path_buf(), p, "round trip of {p:?}");
        assert_eq!(Key::new(&k.to_path_buf()), k, "re-encoding of {p:?}");
        let normalized: PathBuf = p.components().collect();
        assert_eq!(
            k.to_path_buf().as_os_str(),
            normalized.as_os_str(),
            "spelling of {p:?}"
        );
        assert_eq!(r.is_root(), p.as_os_str().is_empty() || p == Path::new("/"));
    }

    fn check_pair(a: &Path, b: &Path) {
        let (ka, kb) = (Key::new(a), Key::new(b));
        assert_eq!(ka.cmp(&kb), a.cmp(b), "order of {a:?} and {b:?}");
        assert_eq!(ka == kb, a == b, "equality of {a:?} and {b:?}");
        assert_eq!(
            ka.as_ref().starts_with(kb.as_ref()),
            a.starts_with(b),
            "{a:?} starts with {b:?}"
        );
        assert_eq!(
            kb.as_ref().starts_with(ka.as_ref()),
            b.starts_with(a),
            "{b:?} starts with {a:?}"
        );
    }

    const SAMPLES: &[&str] = &[
        "",
        "/",
        "//",
        "/.",
        ".",
        "..",
        "./a",
        "a",
        "a/b",
        "a/..",
        "../a",
        "/a",
        "/a/",
        "/a//b",
        "/a/./b",
        "/a/b/",
        "/a/b/.",
        "/a/b",
        "/a/..",
        "/a/../b",
        "/ab",
        "/a-b",
        "/a.b",
        "/a/b/c",
        "/\u{1}",
        "/\u{2}",
        "/\u{1}x",
        "/\u{2}\u{1}",
        "/\u{3}",
        "/a/\u{2}",
        "/a/\u{1}/b",
        "\u{1}",
        "\u{2}/..",
        "/.a",
        "/..a",
        "/a.",
        "/...",
        "/é",
        "/a/b/c/d/e",
    ];

    #[test]
    fn samples_agree_with_path() {
        for a in SAMPLES {
            let p = Path::new(a);
            if let Some(fast) = encode_plain(p.as_os_str().as_encoded_bytes()) {
                assert_eq!(fast, encode(p), "fast path of {a:?}");
            }
            check_agrees(Path::new(a));
            for b in SAMPLES {
                check_pair(Path::new(a), Path::new(b));
            }
        }
    }

    #[test]
    fn spellings_of_one_path_share_a_key() {
        for s in ["/a//b", "/a/./b", "/a/b/", "//a/b", "/a/b/.", "/a///b//"] {
            assert_eq!(key(s), key("/a/b"), "{s}");
        }
        assert_eq!(key("//"), key("/"));
        assert_eq!(key("/."), Key::root());
        assert_eq!(key("a/./b/"), key("a/b"));
        assert_ne!(key("a/b"), key("/a/b"));
        assert_ne!(key(""), key("/"));
        assert_ne!(key("/a/.."), key("/"));
    }

    #[test]
    fn the_usual_path_maps_slash_to_zero() {
        assert_eq!(*key("/").0, [ABS]);
        assert_eq!(*key("/d/a.b").0, [ABS, 0, b'd', 0, b'a', b'.', b'b']);
        assert!(key("").0.is_empty());
        assert_eq!(*key("d").0, [REL, 0, b'd']);
        for plain in ["/", "/d", "/d/a.b", "/.d/..e/...", "/\u{3}"] {
            assert!(encode_plain(plain.as_bytes()).is_some(), "{plain}");
        }
        for other in [
            "",
            "d",
            "//",
            "/a//b",
            "/a/./b",
            "/a/b/",
            "/a/..",
            "/\u{1}",
            "/a/\u{2}b",
        ] {
            assert!(encode_plain(other.as_bytes()).is_none(), "{other}");
        }
    }

    #[test]
    fn parent_starts_with_and_file_name() {
        let k = key("/d/s/c");
        assert_eq!(k.as_ref().parent(), Some(key("/d/s").as_ref()));
        assert_eq!(k.as_ref().file_name(), Some(&b"c"[..]));
        assert!(k.as_ref().starts_with(key("/d").as_ref()));
        assert!(k.as_ref().starts_with(Key::root().as_ref()));
        assert!(!key("/ds").as_ref().starts_with(key("/d").as_ref()));
        assert_eq!(key("/d").as_ref().parent(), Some(Key::root().as_ref()));
        assert_eq!(Key::root().as_ref().parent(), None);
        assert_eq!(Key::root().as_ref().file_name(), None);
        assert_eq!(key("d").as_ref().parent(), Some(key("").as_ref()));
        assert_eq!(key("/a/..").as_ref().file_name(), None);
        assert_eq!(key("/\u{1}").as_ref().file_name(), Some(&b"\x01"[..]));
        assert_eq!(Key::root().to_path_buf(), Path::new("/"));
        assert_eq!(key("/a//b/").to_string(), "/a/b");
    }

    /// One path component, weighted towards the ones that encode
    /// specially or sort near each other.
    fn component() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(b"a".to_vec()),
            Just(b"ab".to_vec()),
            Just(b"a-b".to_vec()),
            Just(b".".to_vec()),
            Just(b"..".to_vec()),
            Just(b"".to_vec()),
            Just(vec![1]),
            Just(vec![2, 1]),
            Just(vec![2, 2]),
            prop::collection::vec(1u8..=255, 1..4),
            prop::collection::vec(
                prop::sample::select(vec![1u8, 2, 3, b'.', b'a', b'b', 0xff]),
                1..4
            ),
        ]
    }

    fn path() -> impl Strategy<Value = PathBuf> {
        use std::os::unix::ffi::OsStringExt;
        (
            any::<bool>(),
            prop::collection::vec(component(), 0..5),
            any::<bool>(),
        )
            .prop_map(|(absolute, comps, trailing)| {
                let mut bytes = if absolute { b"/".to_vec() } else { Vec::new() };
                bytes.extend(comps.join(&b'/'));
                if trailing {
                    bytes.push(b'/');
                }
                PathBuf::from(std::ffi::OsString::from_vec(bytes))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn keys_agree_with_paths(a in path(), b in path()) {
            if let Some(fast) = encode_plain(a.as_os_str().as_encoded_bytes()) {
                prop_assert_eq!(fast, encode(&a));
            }
            check_agrees(&a);
            check_agrees(&b);
            check_pair(&a, &b);
            let (ka, kb) = (Key::new(&a), Key::new(&b));
            prop_assert_eq!(ka.as_ref().parent() == Some(kb.as_ref()), a.parent() == Some(b.as_path()));
            if ka.cmp(&kb) == Ordering::Equal {
                prop_assert_eq!(ka.to_path_buf(), kb.to_path_buf());
            }
        }
    }
}
