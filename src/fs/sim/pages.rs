//! A file's bytes as shared, copy-on-write pages: what lets a crash image
//! (one per I/O point in capture mode) and the run it was taken from share
//! a file, so that the next write copies the pages it touches, not the
//! whole file (a SQLite WAL after a fork was copied whole at every frame).
//!
//! Invariants: `pages.len() == len.div_ceil(PAGE_BYTES)`; the bytes of the
//! last page past `len` are zero, so growing a file (a write past its end,
//! a truncate up) never has to zero-fill inside a page it keeps; `memo`
//! (the contiguous copy, the digests), once filled, is of exactly these
//! bytes, and every change replaces it.
//! Pages are a storage detail: every operation here means exactly what it
//! means on a `Vec<u8>` (`apply` of a [`super::inode::DataOp`] on either
//! gives the same bytes; `tests` check it op by op).

use std::sync::{Arc, OnceLock};

use super::inode::PAGE_BYTES;

/// [`PAGE_BYTES`] as a length (4096 fits every `usize`).
const PAGE: usize = PAGE_BYTES as usize;

type Page = [u8; PAGE];

/// A file's contents. Cheap to clone: clones share every page until one
/// of them writes it.
#[derive(Clone, Default)]
pub(super) struct Pages {
    len: usize,
    pages: Vec<Arc<Page>>,
    /// The bytes in one piece, made on the first [`Pages::contiguous`]
    /// and shared by every clone of these bytes (clones made before the
    /// first call too): a checker that hashes every crash image's disk
    /// copies a file once per version, not once per image it appears in.
    /// And the digests [`Pages::digest`] computed of this version.
    memo: Arc<Memo>,
}

/// What is remembered of one version of a file's bytes: made on first
/// use, shared by every clone of the version.
#[derive(Default)]
struct Memo {
    flat: OnceLock<Arc<[u8]>>,
    digests: [OnceLock<u64>; DIGEST_SLOTS],
}

/// How many kinds of digest a version remembers ([`Pages::digest`]).
const DIGEST_SLOTS: usize = 2;

impl Memo {
    fn is_empty(&self) -> bool {
        self.flat.get().is_none() && self.digests.iter().all(|d| d.get().is_none())
    }
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages")
            .field("len", &self.len)
            .field("pages", &self.pages.len())
            .finish()
    }
}

impl PartialEq for Pages {
    fn eq(&self, other: &Self) -> bool {
        // Equal lengths give equal page counts, and the tails past `len`
        // are zero on both sides, so whole pages compare.
        self.len == other.len
            && self
                .pages
                .iter()
                .zip(&other.pages)
                .all(|(a, b)| Arc::ptr_eq(a, b) || a[..] == b[..])
    }
}

impl Eq for Pages {}

impl From<&[u8]> for Pages {
    fn from(bytes: &[u8]) -> Self {
        let mut pages = Pages::default();
        pages.write(0, bytes);
        pages
    }
}

impl Pages {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The bytes as one slice: the page itself for a file of at most one
    /// page, else the shared contiguous copy (made once per version).
    pub(super) fn contiguous(&self) -> &[u8] {
        match self.pages.as_slice() {
            [] => &[],
            [only] => &only[..self.len],
            _ => self.memo.flat.get_or_init(|| self.to_arc()),
        }
    }

    /// The bytes, in order, one slice per page (the last one cut at `len`).
    pub(super) fn chunks(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let len = self.len;
        self.pages.iter().enumerate().map(move |(i, page)| {
            let end = (len - i * PAGE).min(PAGE);
            &page[..end]
        })
    }

    /// Digest `slot` of these bytes: `digest` of [`Pages::contiguous`],
    /// computed on the first call for this version and shared by its
    /// clones. The caller keeps the contract that gives this its meaning:
    /// each slot always holds one function's digest (the harness's
    /// verdict cache is the one user: a file's hash, and a SQLite WAL's
    /// hash of its committed prefix).
    pub(super) fn digest(&self, slot: usize, digest: impl FnOnce(&[u8]) -> u64) -> u64 {
        match self.memo.digests.get(slot) {
            Some(memo) => *memo.get_or_init(|| digest(self.contiguous())),
            None => digest(self.contiguous()),
        }
    }

    /// A copy of the bytes, contiguous.
    pub(super) fn to_vec(&self) -> Vec<u8> {
        if let Some(flat) = self.memo.flat.get() {
            return flat.to_vec();
        }
        let mut out = Vec::with_capacity(self.len);
        self.chunks().for_each(|c| out.extend_from_slice(c));
        out
    }

    /// A copy of the bytes in one shared allocation (one pass: not a
    /// `Vec` first and then an `Arc` of it).
    fn to_arc(&self) -> Arc<[u8]> {
        let mut flat = Arc::<[u8]>::new_uninit_slice(self.len);
        let Some(slots) = Arc::get_mut(&mut flat) else {
            // A fresh Arc has no other owner; should that change, the
            // two-pass copy gives the same bytes.
            return Arc::from(self.to_vec());
        };
        let mut at = 0;
        for chunk in self.chunks() {
            let dest = &mut slots[at..at + chunk.len()];
            // SAFETY: `dest` is `chunk.len()` slots of this fresh, unshared
            // allocation (bounds checked by the slice index), and `chunk`
            // cannot overlap it.
            unsafe {
                std::ptr::copy_nonoverlapping(chunk.as_ptr(), dest.as_mut_ptr().cast::<u8>(), chunk.len())
            };
            at += chunk.len();
        }
        assert_eq!(at, self.len, "the pages hold exactly len bytes");
        // SAFETY: the chunks cover `len` bytes in order (asserted), so
        // every slot of the `len`-long slice was written above.
        unsafe { flat.assume_init() }
    }

    /// Copy the bytes from `offset` into `buf`, as many as there are
    /// (`buf.len()` at most); returns how many.
    pub(super) fn read_at(&self, offset: usize, buf: &mut [u8]) -> usize {
        let start = offset.min(self.len);
        let n = buf.len().min(self.len - start);
        let mut done = 0;
        while done < n {
            let at = start + done;
            let (page, within) = (at / PAGE, at % PAGE);
            let take = (PAGE - within).min(n - done);
            buf[done..done + take].copy_from_slice(&self.pages[page][within..within + take]);
            done += take;
        }
        n
    }

    /// Page `i`, to write: copied first if another image shares it.
    fn page_mut(&mut self, i: usize) -> &mut Page {
        Arc::make_mut(&mut self.pages[i])
    }

    /// The bytes are about to change: the contiguous copy, if any, is of
    /// the old ones (and stays with the clones that still hold them).
    fn changed(&mut self) {
        if !self.memo.is_empty() || Arc::strong_count(&self.memo) > 1 {
            self.memo = Arc::default();
        }
    }

    /// Grow to `new_len` (not less than `len`): the new bytes are zero,
    /// which the zero tail of the last page and fresh pages already are.
    fn grow(&mut self, new_len: usize) {
        debug_assert!(new_len >= self.len);
        self.pages
            .resize_with(new_len.div_ceil(PAGE), || Arc::new([0; PAGE]));
        self.len = new_len;
    }

    /// `Vec<u8>` semantics: overwrite what overlaps, append the rest; a
    /// write starting past the end zero-fills the hole first (even an
    /// empty one, as `resize` would).
    pub(super) fn write(&mut self, offset: usize, data: &[u8]) {
        self.changed();
        let end = offset + data.len();
        let mut done = 0;
        // Pages already there: overwrite (copying a shared one first).
        let kept = self.pages.len() * PAGE;
        while done < data.len() && offset + done < kept {
            let at = offset + done;
            let (page, within) = (at / PAGE, at % PAGE);
            let take = (PAGE - within).min(data.len() - done);
            self.page_mut(page)[within..within + take].copy_from_slice(&data[done..done + take]);
            done += take;
        }
        // Past them: zero pages up to the write's first new page, then
        // pages made from the data (zero before and after it), each
        // written once.
        self.pages
            .resize_with(offset.max(kept) / PAGE, || Arc::new([0; PAGE]));
        while done < data.len() {
            let at = offset + done;
            let within = at % PAGE;
            debug_assert_eq!(at / PAGE, self.pages.len());
            let take = (PAGE - within).min(data.len() - done);
            self.pages.push(page_of(within, &data[done..done + take]));
            done += take;
        }
        if end > self.len {
            self.grow(end);
        }
    }

    /// `Vec::resize(new_len, 0)`.
    pub(super) fn truncate(&mut self, new_len: usize) {
        if new_len == self.len {
            return;
        }
        self.changed();
        if new_len > self.len {
            self.grow(new_len);
            return;
        }
        self.pages.truncate(new_len.div_ceil(PAGE));
        self.len = new_len;
        // Keep the last page's tail zero (a later growth reads it).
        let within = new_len % PAGE;
        if within != 0 {
            let last = self.pages.len() - 1;
            self.page_mut(last)[within..].fill(0);
        }
    }

    /// XOR byte `at` (which must be below `len`) with `mask`.
    pub(super) fn xor(&mut self, at: usize, mask: u8) {
        debug_assert!(at < self.len);
        self.changed();
        self.page_mut(at / PAGE)[at % PAGE] ^= mask;
    }
}

/// A new page holding `data` from byte `at`, zero elsewhere. Built in
/// place: zeroing a whole page and then copying the data over it costs a
/// second pass over every byte a file grows by.
fn page_of(at: usize, data: &[u8]) -> Arc<Page> {
    assert!(
        at + data.len() <= PAGE,
        "page_of: {} bytes at {at} overflow a page",
        data.len()
    );
    let mut page = Arc::<Page>::new_uninit();
    let Some(slot) = Arc::get_mut(&mut page) else {
        // A fresh Arc has no other owner; should that ever change, the
        // zeroed page is the same page, only slower.
        let mut zeroed = [0; PAGE];
        zeroed[at..at + data.len()].copy_from_slice(data);
        return Arc::new(zeroed);
    };
    let bytes = slot.as_mut_ptr().cast::<u8>();
    // SAFETY: `bytes` points at the page's PAGE bytes, which this Arc
    // alone owns (`get_mut`). The three writes cover `[0, at)`,
    // `[at, at + data.len())` and `[at + data.len(), PAGE)` — every byte
    // once, in bounds by the assertion — so the page is initialised when
    // `assume_init` runs; `data` cannot overlap a fresh allocation.
    unsafe {
        std::ptr::write_bytes(bytes, 0, at);
        std::ptr::copy_nonoverlapping(data.as_ptr(), bytes.add(at), data.len());
        std::ptr::write_bytes(bytes.add(at + data.len()), 0, PAGE - at - data.len());
        page.assume_init()
    }
}

#[cfg(test)]
mod tests {
    use super::{Pages, PAGE};

    /// A deterministic mix of writes (inside, straddling pages, appending,
    /// past the end), truncates down and up, on `Pages` and on a `Vec`:
    /// always the same bytes, and the invariants hold after each op.
    #[test]
    fn pages_behave_like_a_vec_under_writes_and_truncates() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut pages, mut vec) = (Pages::default(), Vec::<u8>::new());
        let mut shared = Vec::new();
        for round in 0..2_000u64 {
            // Keep old versions alive, so some writes hit shared pages.
            if round % 7 == 0 {
                shared.push((pages.clone(), vec.clone()));
            }
            if next(10) == 0 {
                let len = next(5 * PAGE as u64) as usize;
                pages.truncate(len);
                vec.resize(len, 0);
            } else {
                let offset = next(vec.len() as u64 + 2 * PAGE as u64 + 1) as usize;
                let len = next(3 * PAGE as u64) as usize;
                let data: Vec<u8> = (0..len).map(|i| (i as u64 + round) as u8 | 1).collect();
                pages.write(offset, &data);
                if offset > vec.len() {
                    vec.resize(offset, 0);
                }
                let overlap = (vec.len() - offset).min(data.len());
                vec[offset..offset + overlap].copy_from_slice(&data[..overlap]);
                vec.extend_from_slice(&data[overlap..]);
            }
            assert_eq!(pages.len(), vec.len());
            assert_eq!(pages.pages.len(), vec.len().div_ceil(PAGE));
            assert_eq!(pages.to_vec(), vec, "round {round}");
            // Sometimes make the contiguous copy: it must follow every
            // later change here and never leak into the kept versions.
            if next(3) == 0 {
                assert_eq!(pages.contiguous(), &vec[..], "round {round}");
            }
            if let Some(last) = pages.pages.last() {
                assert!(last[pages.len - (pages.pages.len() - 1) * PAGE..]
                    .iter()
                    .all(|b| *b == 0));
            }
            let at = next(vec.len() as u64 + 10) as usize;
            let mut buf = vec![0xee; next(PAGE as u64 * 2) as usize];
            let n = pages.read_at(at, &mut buf);
            let start = at.min(vec.len());
            let want = &vec[start..vec.len().min(start + buf.len())];
            assert_eq!(&buf[..n], want);
        }
        // The versions kept earlier were never changed by later writes.
        for (p, v) in shared {
            assert_eq!(p.to_vec(), v);
            assert_eq!(p.contiguous(), &v[..]);
            assert_eq!(p, Pages::from(&v[..]));
        }
    }

    #[test]
    fn clones_share_one_contiguous_copy_until_one_of_them_changes() {
        let a = Pages::from(&vec![3u8; 3 * PAGE][..]);
        let mut b = a.clone();
        let c = b.clone();
        let flat = a.contiguous().as_ptr();
        assert_eq!(c.contiguous().as_ptr(), flat, "made once, shared by clones");
        b.write(5, b"new");
        assert_ne!(b.contiguous().as_ptr(), flat);
        assert_eq!(&b.contiguous()[5..8], b"new");
        assert_eq!(&c.contiguous()[5..8], &[3, 3, 3], "the old bytes keep theirs");
        b.truncate(b.len());
        assert_eq!(&b.contiguous()[5..8], b"new", "a no-op truncate changes nothing");
    }

    #[test]
    fn a_digest_is_computed_once_per_version_and_never_outlives_a_change() {
        let sum = |b: &[u8]| b.iter().map(|&x| u64::from(x)).sum::<u64>() + b.len() as u64;
        let calls = std::cell::Cell::new(0);
        let counted = |b: &[u8]| {
            calls.set(calls.get() + 1);
            sum(b)
        };
        for len in [10, 3 * PAGE] {
            calls.set(0);
            let a = Pages::from(&vec![1u8; len][..]);
            let mut b = a.clone();
            assert_eq!(a.digest(0, counted), sum(&vec![1u8; len]));
            assert_eq!(b.digest(0, counted), a.digest(0, counted), "shared by clones");
            assert_eq!(calls.get(), 1, "computed once for the version");
            assert_eq!(a.digest(1, |_| 99), 99, "each slot is its own digest");
            b.write(2, &[5]);
            assert_eq!(
                b.digest(0, counted),
                sum(&vec![1u8; len]) + 4,
                "a change is a new version"
            );
            assert_eq!(
                a.digest(0, counted),
                sum(&vec![1u8; len]),
                "the old version keeps its own"
            );
            let mut c = b.clone();
            c.truncate(3);
            assert_eq!(c.digest(0, counted), 1 + 1 + 5 + 3);
            assert_eq!(a.digest(7, |_| 42), 42, "a slot out of range computes afresh");
        }
    }

    #[test]
    fn a_clone_shares_pages_until_written_and_then_copies_one() {
        let mut a = Pages::from(&vec![7u8; 4 * PAGE][..]);
        let b = a.clone();
        a.write(PAGE + 1, b"x");
        let shared = a
            .pages
            .iter()
            .zip(&b.pages)
            .filter(|(p, q)| std::sync::Arc::ptr_eq(p, q))
            .count();
        assert_eq!(shared, 3, "only the written page was copied");
        assert_eq!(b.to_vec(), vec![7u8; 4 * PAGE]);
        a.xor(PAGE + 1, b'x' ^ 7);
        assert_eq!(a, b);
    }
}
