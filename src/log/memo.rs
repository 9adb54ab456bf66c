//! The lines this thread parsed lately and the entries they gave: a line is
//! parsed once, however many times it is read.
//!
//! Why: one boot reads every log three times (the pre-flight damage scan,
//! repair, the invariant check after it), and the harness boots thousands
//! of crash images whose logs share most of their lines; parsing was ~14%
//! of a ci fuzz. An entry is a pure function of its line's bytes, so
//! handing back a copy of the entry an equal line gave is the same answer.
//!
//! Invariants: a line is looked up by its exact bytes (the hash only picks
//! the bucket; equality compares every byte), and only lines that parsed
//! are kept, so an invalid line is parsed (and reported) every time. The
//! memo holds at most [`MEMO_LINES`] lines per thread; when full it is
//! emptied, never grown.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::entry::{LogEntry, ParseLineError};

/// Lines kept per thread (a few MB at most: a line and its entry each are
/// a few hundred bytes). A ci search case writes fewer than a thousand.
const MEMO_LINES: usize = 4096;

/// CRC-32 of the line (SIMD, already a dependency for the seals), spread
/// over 64 bits: the table uses the top bits too.
#[derive(Default)]
struct LineHasher(crc32fast::Hasher);

impl Hasher for LineHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        u64::from(self.0.clone().finalize()).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

type Memo = HashMap<Box<[u8]>, LogEntry, BuildHasherDefault<LineHasher>>;

thread_local! {
    static PARSED: RefCell<Memo> = RefCell::new(Memo::default());
}

/// The entry `line` parses to: remembered if this thread parsed an equal
/// line lately, else `fresh(line)` (remembered when it parses).
pub(super) fn parsed(
    line: &[u8],
    fresh: impl FnOnce(&[u8]) -> Result<LogEntry, ParseLineError>,
) -> Result<LogEntry, ParseLineError> {
    if let Some(entry) = PARSED.with_borrow(|memo| memo.get(line).cloned()) {
        return Ok(entry);
    }
    let entry = fresh(line)?;
    PARSED.with_borrow_mut(|memo| {
        if memo.len() >= MEMO_LINES {
            memo.clear();
        }
        memo.insert(line.into(), entry.clone());
    });
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::{parsed, MEMO_LINES, PARSED};
    use crate::log::entry::{LogEntry, ParseLineError};

    #[test]
    fn an_equal_line_gets_the_entry_its_first_parse_gave_and_a_bad_one_is_parsed_again() {
        let line =
            br#"{"session_id":"00000000000000aa","seq":0,"event":"turn.complete","data":{"response":"r"}}"#;
        let first = parsed(line, LogEntry::parse_unverified).expect("a valid line");
        let mut called = false;
        // An equal line in another buffer.
        let copy = line.to_vec();
        let again = parsed(&copy, |l| {
            called = true;
            LogEntry::parse_unverified(l)
        })
        .expect("remembered");
        assert!(!called, "an equal line is not parsed again");
        assert_eq!(again, first);

        let bad = b"{not json";
        for _ in 0..2 {
            let mut calls = 0;
            let result = parsed(bad, |l| {
                calls += 1;
                LogEntry::parse_unverified(l)
            });
            assert!(matches!(result, Err(ParseLineError::Invalid(_))));
            assert_eq!(calls, 1, "an invalid line is parsed every time");
        }
    }

    #[test]
    fn the_memo_never_holds_more_than_its_limit() {
        for seq in 0..MEMO_LINES + 10 {
            let line = format!(
                r#"{{"session_id":"00000000000000aa","seq":{seq},"event":"turn.complete","data":{{"response":"r"}}}}"#
            );
            let entry = parsed(line.as_bytes(), LogEntry::parse_unverified).expect("valid");
            assert_eq!(entry.seq, seq as u64);
        }
        assert!(PARSED.with_borrow(|memo| memo.len()) <= MEMO_LINES);
    }
}
