//! What SQLite's recovery reads of a write-ahead log: the header and the
//! frames up to the last valid commit frame.
//!
//! Invariant: [`committed_len`] is the length of the prefix of a WAL file
//! that SQLite's recovery (`walIndexRecover` in `wal.c`) can let a reader
//! see. Recovery checks the header (magic, version, header checksum), then
//! walks the frames in order while each has a non-zero page number, the
//! header's salts and the running checksum; the last frame that passes
//! and carries a database size (a commit frame) ends the log. Frames after
//! it — a transaction the crash cut short, torn or whole but uncommitted,
//! or stale frames of an earlier generation — are never read and are
//! overwritten by the next write. So two disks whose WALs differ only past
//! that prefix recover to the same database. A header SQLite would not
//! accept gives the whole file (no claim is made about it).
//!
//! Written out here (a WAL is a simple format, documented at
//! <https://www.sqlite.org/fileformat.html#the_write_ahead_log>) because
//! SQLite exposes no API for it.

/// WAL header and frame header sizes (bytes).
const HEADER: usize = 32;
const FRAME_HEADER: usize = 24;
/// The two magic numbers: the low bit says the checksum words are big-endian.
const MAGIC_LE: u32 = 0x377f_0682;
const MAGIC_BE: u32 = 0x377f_0683;
/// The only WAL format version.
const VERSION: u32 = 3_007_000;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// SQLite's WAL checksum over `data` (a multiple of 8 bytes), continuing
/// from `s`.
fn checksum(big_endian: bool, data: &[u8], mut s: (u32, u32)) -> (u32, u32) {
    for pair in data.chunks_exact(8) {
        let word = |w: &[u8]| {
            let w = [w[0], w[1], w[2], w[3]];
            if big_endian {
                u32::from_be_bytes(w)
            } else {
                u32::from_le_bytes(w)
            }
        };
        s.0 = s.0.wrapping_add(word(&pair[..4])).wrapping_add(s.1);
        s.1 = s.1.wrapping_add(word(&pair[4..])).wrapping_add(s.0);
    }
    s
}

/// The length of `wal`'s prefix that SQLite's recovery reads (see the
/// module doc): the header and every frame up to the last valid commit
/// frame, or the whole file when the header is not one SQLite accepts.
pub fn committed_len(wal: &[u8]) -> usize {
    prefix_len(wal, true)
}

/// A prefix of `wal` at least as long as [`committed_len`]'s, found
/// without the frame checksums (a page's checksum costs a pass over it):
/// a frame whose header looks valid is taken as SQLite would take it, so
/// a torn frame followed by a commit frame is kept in. What lies past
/// this prefix SQLite never reads either; what lies in it is compared byte
/// for byte. So a key built on it is sound (equal keys, equal databases),
/// only less often equal than one built on [`committed_len`].
pub fn committed_len_upper(wal: &[u8]) -> usize {
    prefix_len(wal, false)
}

fn prefix_len(wal: &[u8], verify: bool) -> usize {
    if wal.len() < HEADER {
        return wal.len();
    }
    let magic = be32(wal, 0);
    if (magic != MAGIC_LE && magic != MAGIC_BE) || be32(wal, 4) != VERSION {
        return wal.len();
    }
    let big_endian = magic == MAGIC_BE;
    let page_size = match be32(wal, 8) {
        1 => 65_536,
        n if (512..=32_768).contains(&n) && n.is_power_of_two() => n as usize,
        _ => return wal.len(),
    };
    let mut sum = checksum(big_endian, &wal[..24], (0, 0));
    if sum != (be32(wal, 24), be32(wal, 28)) {
        return wal.len();
    }
    let salts = &wal[16..24];
    let frame = FRAME_HEADER + page_size;
    let mut at = HEADER;
    let mut committed = HEADER;
    while at + frame <= wal.len() {
        let f = &wal[at..at + frame];
        if be32(f, 0) == 0 || &f[8..16] != salts {
            break;
        }
        if verify {
            sum = checksum(big_endian, &f[..8], sum);
            sum = checksum(big_endian, &f[FRAME_HEADER..], sum);
            if sum != (be32(f, 16), be32(f, 20)) {
                break;
            }
        }
        at += frame;
        if be32(f, 4) != 0 {
            committed = at;
        }
    }
    committed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WAL with `frames` of (page number, commit size) on 512-byte pages.
    fn wal(frames: &[(u32, u32)]) -> Vec<u8> {
        let mut w = Vec::new();
        for v in [MAGIC_LE, VERSION, 512, 0, 0xdead_beef, 0x0bad_cafe] {
            w.extend_from_slice(&v.to_be_bytes());
        }
        let mut sum = checksum(false, &w, (0, 0));
        w.extend_from_slice(&sum.0.to_be_bytes());
        w.extend_from_slice(&sum.1.to_be_bytes());
        for (i, &(pgno, commit)) in frames.iter().enumerate() {
            let mut f = Vec::new();
            f.extend_from_slice(&pgno.to_be_bytes());
            f.extend_from_slice(&commit.to_be_bytes());
            f.extend_from_slice(&w[16..24]);
            let page = vec![i as u8 + 1; 512];
            sum = checksum(false, &f[..8], sum);
            sum = checksum(false, &page, sum);
            f.extend_from_slice(&sum.0.to_be_bytes());
            f.extend_from_slice(&sum.1.to_be_bytes());
            f.extend_from_slice(&page);
            w.extend_from_slice(&f);
        }
        w
    }

    const FRAME: usize = FRAME_HEADER + 512;

    #[test]
    fn uncommitted_frames_are_not_read() {
        let w = wal(&[(1, 0), (2, 2), (3, 0), (4, 0)]);
        assert_eq!(committed_len(&w), HEADER + 2 * FRAME);
    }

    #[test]
    fn a_torn_or_damaged_frame_ends_the_log() {
        let mut w = wal(&[(1, 1), (2, 2), (3, 3)]);
        w.truncate(HEADER + 2 * FRAME + 100);
        assert_eq!(committed_len(&w), HEADER + 2 * FRAME);
        let mut w = wal(&[(1, 1), (2, 2), (3, 3)]);
        w[HEADER + FRAME + 30] ^= 1;
        assert_eq!(
            committed_len(&w),
            HEADER + FRAME,
            "a bad checksum ends the log before its frame"
        );
    }

    #[test]
    fn frames_of_another_generation_are_not_read() {
        let mut w = wal(&[(1, 1), (2, 2)]);
        w[HEADER + FRAME + 8] ^= 1;
        assert_eq!(committed_len(&w), HEADER + FRAME);
    }

    #[test]
    fn a_header_sqlite_refuses_keeps_the_whole_file() {
        let mut w = wal(&[(1, 1)]);
        w[25] ^= 1;
        assert_eq!(committed_len(&w), w.len());
        assert_eq!(committed_len(&w[..10]), 10);
    }

    #[test]
    fn the_unverified_prefix_is_never_shorter() {
        let mut w = wal(&[(1, 1), (2, 0), (3, 3), (4, 0)]);
        assert_eq!(committed_len_upper(&w), committed_len(&w));
        w[HEADER + FRAME + 30] ^= 1;
        assert_eq!(committed_len(&w), HEADER + FRAME);
        assert_eq!(committed_len_upper(&w), HEADER + 3 * FRAME);
    }

    #[test]
    fn no_commit_frame_leaves_the_header() {
        let w = wal(&[(1, 0), (2, 0)]);
        assert_eq!(committed_len(&w), HEADER);
    }
}
