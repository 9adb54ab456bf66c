//! Reading and repairing one session's log after a crash.
//!
//! Invariant: after [`repair`] returns `Ok`, `events.jsonl` holds only
//! complete, valid entries with contiguous `seq` from 0, fsynced, and
//! `events.pending` beside a non-empty log holds a copy of an entry it
//! has (the high-water mark below). Only a torn append, never acknowledged, is
//! ever cut: the bytes after the last newline, or a damaged last line
//! whose whole entry `events.pending` still holds (a power cut persisted
//! the append's pages out of order), which is then replayed from it. Any
//! other bad complete line is a [`LogError::Corrupt`] naming file and
//! offset, never silently dropped.
//!
//! The writer keeps `events.pending` durable and never unlinks it (see
//! [`super::EventLog`]), so after a clean stop it holds the last logged
//! entry: the usual case here is a tail dedup. Repair keeps it too (and
//! rewrites it from the log's last line when it was torn or absent), so
//! beside every non-empty log it is a high-water mark: the `seq` of an
//! acknowledged entry. A log that ends before that `seq` lost acknowledged
//! entries — damage outside the crash model (an emptied or shortened
//! file), never a torn append — and is refused ([`inspect`] says so
//! without changing anything; [`repair`] refuses before it changes
//! anything).

use std::io;
use std::path::Path;

use crate::canary::{Canaries, Canary};
use crate::fs::Fs;
use crate::runtime::ids::SessionId;

use super::entry::ParseLineError;
use super::{LogEntry, LogError, EVENTS_FILE, PENDING_FILE, SCHEMA_VERSION};

/// A parsed `events.jsonl`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedLog {
    pub entries: Vec<LogEntry>,
    /// Bytes of complete lines (the offset a partial tail starts at).
    pub valid_len: u64,
    /// Length of the partial trailing line (0 if the file ends in a newline).
    pub partial_tail_bytes: u64,
}

/// What [`repair`] did to one log.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LogRepair {
    /// Byte offset the log was truncated at, if a partial line was cut.
    pub truncated_at: Option<u64>,
    /// How many bytes were cut.
    pub truncated_bytes: u64,
    /// A complete pending entry was appended (its `seq` was not yet logged).
    pub pending_replayed: bool,
    /// A pending entry already in the log was removed (tail dedup).
    pub pending_deduped: bool,
    /// A torn (incomplete or invalid) pending file was removed.
    pub pending_torn: bool,
}

fn parse_error(path: &Path, line: u64, offset: u64, e: ParseLineError) -> LogError {
    match e {
        ParseLineError::Newer { found } => LogError::NewerSchema {
            path: path.to_path_buf(),
            line,
            offset,
            found,
            supported: SCHEMA_VERSION,
        },
        ParseLineError::Invalid(reason) => LogError::Corrupt {
            path: path.to_path_buf(),
            line,
            offset,
            reason,
        },
    }
}

/// Parse log bytes. Complete lines must all be valid entries of
/// `session_id` (if given) with contiguous `seq`; trailing bytes without a
/// newline are reported as a partial tail, not parsed.
pub fn parse_bytes(path: &Path, bytes: &[u8], session_id: Option<&SessionId>) -> Result<ParsedLog, LogError> {
    parse_bytes_with(path, bytes, session_id, &Canaries::none())
}

/// One line: checksum verified (the `NoChecksumVerify` canary skips it).
fn parse_line(line: &[u8], canaries: &Canaries) -> Result<LogEntry, ParseLineError> {
    if canaries.has(Canary::NoChecksumVerify) {
        LogEntry::parse_unverified(line)
    } else {
        LogEntry::parse(line)
    }
}

/// [`parse_bytes`] as the runtime reads, with its canaries.
fn parse_bytes_with(
    path: &Path,
    bytes: &[u8],
    session_id: Option<&SessionId>,
    canaries: &Canaries,
) -> Result<ParsedLog, LogError> {
    let mut out = ParsedLog::default();
    let mut offset = 0usize;
    let mut line_no = 0u64;
    while offset < bytes.len() {
        let Some(nl) = bytes[offset..].iter().position(|&b| b == b'\n') else {
            out.partial_tail_bytes = (bytes.len() - offset) as u64;
            break;
        };
        line_no += 1;
        let line = &bytes[offset..offset + nl];
        let at = offset as u64;
        let entry = parse_line(line, canaries).map_err(|e| parse_error(path, line_no, at, e))?;
        let corrupt = |reason: String| LogError::Corrupt {
            path: path.to_path_buf(),
            line: line_no,
            offset: at,
            reason,
        };
        if let Some(expected) = session_id {
            if &entry.session_id != expected {
                return Err(corrupt(format!(
                    "session_id {} in the log of session {expected}",
                    entry.session_id
                )));
            }
        }
        let want = out.entries.len() as u64;
        if entry.seq != want {
            return Err(corrupt(format!("seq {} where {want} was expected", entry.seq)));
        }
        out.entries.push(entry);
        offset += nl + 1;
        out.valid_len = offset as u64;
    }
    Ok(out)
}

/// Read and parse `events.jsonl` in `dir` without changing it. A missing
/// file is an empty log.
pub fn parse_log(fs: &dyn Fs, dir: &Path, session_id: Option<&SessionId>) -> Result<ParsedLog, LogError> {
    parse_log_with(fs, dir, session_id, &Canaries::none())
}

fn parse_log_with(
    fs: &dyn Fs,
    dir: &Path,
    session_id: Option<&SessionId>,
    canaries: &Canaries,
) -> Result<ParsedLog, LogError> {
    let path = dir.join(EVENTS_FILE);
    match fs.read(&path, "events.jsonl read") {
        Ok(bytes) => parse_bytes_with(&path, &bytes, session_id, canaries),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(ParsedLog::default()),
        Err(e) => Err(LogError::io(&path, "read", e)),
    }
}

/// The entry a pending file holds: one complete, valid line, else `None`
/// (a torn or invalid pending file: its append never started).
fn pending_entry(bytes: &[u8]) -> Option<LogEntry> {
    match bytes.strip_suffix(b"\n") {
        Some(line) if !line.contains(&b'\n') => LogEntry::parse(line).ok(),
        _ => None,
    }
}

/// What [`inspect`] found in one session's log, without changing it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogInspection {
    /// The entries [`repair`] would keep (a partial tail cut, a pending
    /// entry with the next `seq` replayed).
    pub entries: Vec<LogEntry>,
    /// `events.jsonl` exists.
    pub log_exists: bool,
    /// The `seq` of the valid entry of this session `events.pending`
    /// holds, if any: an acknowledged entry (or the append in flight).
    pub pending_seq: Option<u64>,
    /// Bytes of complete lines in the log.
    pub valid_len: u64,
}

impl LogInspection {
    /// `(expected, found)` entries when the log lost acknowledged ones:
    /// `events.pending` holds `seq` s, so entries 0..s were acknowledged
    /// before it was written, but the log (or what repair keeps of it)
    /// has fewer.
    pub fn lost_entries(&self) -> Option<(u64, u64)> {
        lost_entries(self.pending_seq, self.entries.len() as u64, self.log_exists)
    }
}

/// The one rule for lost entries ([`LogInspection::lost_entries`], which
/// the boot's preflight asks, and [`repair`]'s own check): `(expected,
/// found)` when `events.pending` holds this session's entry `pending_seq`
/// (so entries `0..=pending_seq` were acknowledged, or the last is the
/// append in flight) and the log, of `found` entries, ends before it —
/// or is gone while the mark names its next entry. A `found` that
/// counts the pending entry replayed (`inspect`'s) answers as one that
/// does not (`repair`'s, before it replays): the replay is exactly the
/// `seq == found` with the log there that is not a loss.
fn lost_entries(pending_seq: Option<u64>, found: u64, log_exists: bool) -> Option<(u64, u64)> {
    match pending_seq {
        Some(seq) if seq > found || (seq == found && !log_exists) => Some((seq + 1, found)),
        _ => None,
    }
}

/// Read `dir`'s log and pending copy and say what [`repair`] would keep,
/// changing nothing. A damaged line is an error as in [`repair`] (the
/// damaged last line [`repair`] replaces from `events.pending` too: read
/// only callers report it, [`repair`] fixes it).
pub fn inspect(fs: &dyn Fs, dir: &Path, session_id: &SessionId) -> Result<LogInspection, LogError> {
    let path = dir.join(EVENTS_FILE);
    // The mark before the log: a reader beside a live writer (`verify`)
    // then never sees a mark ahead of the log it read (the writer fsyncs
    // `events.pending` for seq s only after entry s-1 is in the log).
    let pending = read_pending(fs, dir)?.and_then(|bytes| pending_entry(&bytes));
    let log_exists = fs
        .exists(&path, "events.jsonl exists (inspect)")
        .map_err(|e| LogError::io(&path, "exists", e))?;
    let parsed = parse_log(fs, dir, Some(session_id))?;
    let pending = pending.filter(|e| &e.session_id == session_id);
    let mut out = LogInspection {
        entries: parsed.entries,
        log_exists,
        pending_seq: pending.as_ref().map(|e| e.seq),
        valid_len: parsed.valid_len,
    };
    if let Some(e) = pending {
        if e.seq == out.entries.len() as u64 && log_exists {
            out.entries.push(e);
        }
    }
    Ok(out)
}

/// `events.pending`'s bytes, if the file exists.
fn read_pending(fs: &dyn Fs, dir: &Path) -> Result<Option<Vec<u8>>, LogError> {
    let pending = dir.join(PENDING_FILE);
    let has = fs
        .exists(&pending, "events.pending exists (recovery)")
        .map_err(|e| LogError::io(&pending, "exists", e))?;
    if !has {
        return Ok(None);
    }
    fs.read(&pending, "events.pending read (recovery)")
        .map(Some)
        .map_err(|e| LogError::io(&pending, "read", e))
}

/// The error for a log that lost acknowledged entries (see
/// [`LogInspection::lost_entries`]): at the offset where the missing
/// entries should begin.
pub fn lost_entries_error(dir: &Path, expected: u64, found: u64, valid_len: u64) -> LogError {
    LogError::Corrupt {
        path: dir.join(EVENTS_FILE),
        line: found + 1,
        offset: valid_len,
        reason: format!(
            "the log ends after {found} entries, but {expected} were acknowledged ({} holds seq {}): \
             acknowledged entries were lost (the file was emptied, shortened or replaced; restore it \
             from a backup, or move the session aside with `durable-agent repair --quarantine`: \
             docs/OPERATING.md)",
            PENDING_FILE,
            expected - 1
        ),
    }
}

/// Whether the complete line at `offset` of the log at `path` is the
/// damaged copy of the append in flight: it is the file's last line, and
/// `events.pending` holds a complete, valid entry of this session with the
/// next `seq` and exactly the line's length. Either that append was in
/// flight (a power cut may persist its pages in any order: a hole of zeros
/// before a durable newline) or it was the last acknowledged one and its
/// line rotted since; both ways the pending copy is the very entry the
/// line was written from, so the line is cut and the copy replayed —
/// nothing damaged is read as data, nothing acknowledged is lost. Returns the log before
/// the line, or `None` when the line is anything else (then it is
/// corruption, reported as such).
fn damaged_pending_append(
    fs: &dyn Fs,
    path: &Path,
    pending: &Path,
    session_id: &SessionId,
    offset: u64,
    canaries: &Canaries,
) -> Result<Option<ParsedLog>, LogError> {
    let has_pending = fs
        .exists(pending, "events.pending exists (recovery)")
        .map_err(|e| LogError::io(pending, "exists", e))?;
    if !has_pending {
        return Ok(None);
    }
    let bytes = fs
        .read(path, "events.jsonl read (damaged line)")
        .map_err(|e| LogError::io(path, "read", e))?;
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    let Some(rest) = bytes.get(start..) else {
        return Ok(None);
    };
    let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    if rest[nl + 1..].contains(&b'\n') {
        return Ok(None); // not the last line
    }
    let copy = fs
        .read(pending, "events.pending read (damaged line)")
        .map_err(|e| LogError::io(pending, "read", e))?;
    if copy.len() != nl + 1 {
        return Ok(None);
    }
    let prefix = parse_bytes_with(path, &bytes[..start], Some(session_id), canaries)?;
    Ok(pending_entry(&copy)
        .filter(|e| &e.session_id == session_id && e.seq == prefix.entries.len() as u64)
        .map(|_| prefix))
}

/// Whether the damaged complete line at `offset` of `dir`'s log is one
/// [`repair`] replaces from `events.pending` (the crash model: see
/// `damaged_pending_append`), read only. `verify` uses it to tell that
/// line from corruption.
pub fn pending_replaces_line(
    fs: &dyn Fs,
    dir: &Path,
    session_id: &SessionId,
    offset: u64,
) -> Result<bool, LogError> {
    let path = dir.join(EVENTS_FILE);
    let pending = dir.join(PENDING_FILE);
    Ok(damaged_pending_append(fs, &path, &pending, session_id, offset, &Canaries::none())?.is_some())
}

/// Repair the log in `dir`: cut a partial trailing line, replay or clean a
/// pending entry. Returns the entries and what was done.
pub fn repair(
    fs: &dyn Fs,
    dir: &Path,
    session_id: &SessionId,
    canaries: &Canaries,
) -> Result<(Vec<LogEntry>, LogRepair), LogError> {
    let path = dir.join(EVENTS_FILE);
    let pending = dir.join(PENDING_FILE);
    let mut report = LogRepair::default();
    let exists = fs
        .exists(&path, "events.jsonl exists (recovery)")
        .map_err(|e| LogError::io(&path, "exists", e))?;
    let mut parsed = match parse_log_with(fs, dir, Some(session_id), canaries) {
        Ok(parsed) => parsed,
        Err(e) => {
            // The one damaged line recovery may cut: the append in flight,
            // whose whole entry `events.pending` still holds.
            let prefix = match &e {
                LogError::Corrupt { offset, .. } => {
                    damaged_pending_append(fs, &path, &pending, session_id, *offset, canaries)?
                }
                _ => None,
            };
            let Some(prefix) = prefix else { return Err(e) };
            let offset = prefix.valid_len;
            let len = fs
                .len(&path, "events.jsonl size (recovery)")
                .map_err(|e| LogError::io(&path, "size", e))?;
            fs.truncate(&path, offset, "events.jsonl truncate damaged append")
                .map_err(|e| LogError::io(&path, "truncate", e))?;
            tracing::warn!(path = %path.display(), offset, "cut a damaged last line that events.pending holds whole (an unacknowledged append)");
            report.truncated_at = Some(offset);
            report.truncated_bytes = len.saturating_sub(offset);
            prefix
        }
    };
    // Before anything changes: a log that ends before the acknowledged
    // `seq` events.pending holds lost entries (see the module doc).
    let pending_bytes = read_pending(fs, dir)?;
    let pending_seq = pending_bytes
        .as_deref()
        .and_then(pending_entry)
        .filter(|e| &e.session_id == session_id)
        .map(|e| e.seq);
    if let Some((expected, found)) = lost_entries(pending_seq, parsed.entries.len() as u64, exists) {
        return Err(lost_entries_error(dir, expected, found, parsed.valid_len));
    }
    if parsed.partial_tail_bytes > 0 && !canaries.has(Canary::NoPartialLineRepair) {
        fs.truncate(&path, parsed.valid_len, "events.jsonl truncate partial line")
            .map_err(|e| LogError::io(&path, "truncate", e))?;
        tracing::warn!(path = %path.display(), offset = parsed.valid_len,
            bytes = parsed.partial_tail_bytes, "truncated a partial trailing line");
        report.truncated_at = Some(parsed.valid_len);
        report.truncated_bytes = parsed.partial_tail_bytes;
    }
    let mut mark_kept = false;
    if let Some(bytes) = pending_bytes {
        // The pending file was fsynced before the log append began, so an
        // incomplete or invalid one means that append never started.
        let entry = pending_entry(&bytes);
        let next = parsed.entries.len() as u64;
        match entry {
            Some(e) if &e.session_id == session_id && e.seq == next && exists => {
                fs.append(&path, &bytes, "events.jsonl append (pending replay)")
                    .map_err(|e| LogError::io(&path, "append", e))?;
                fs.sync(&path, "events.jsonl fsync (pending replay)")
                    .map_err(|e| LogError::io(&path, "fsync", e))?;
                parsed.entries.push(e);
                parsed.valid_len += bytes.len() as u64;
                report.pending_replayed = true;
            }
            Some(e) if &e.session_id == session_id && e.seq < next => {
                report.pending_deduped = true;
                // The copy of the last entry stays as the high-water mark
                // (module doc): the writer fsynced it before that append.
                // An older one, or a replayed one (its own fsync may never
                // have happened), is rewritten below.
                mark_kept = e.seq + 1 == next;
            }
            _ => report.pending_torn = true,
        }
        if canaries.has(Canary::NoPartialLineRepair) {
            // The canary left a partial line; re-parse so a merged garbage
            // line surfaces here exactly as it would on the next open.
            parsed = parse_log_with(fs, dir, Some(session_id), canaries)?;
        }
    }
    if exists {
        if !mark_kept {
            write_mark(fs, dir, &parsed)?;
        }
        persist(fs, dir, &parsed)?;
    }
    Ok((parsed.entries, report))
}

/// Put the log's last entry in `events.pending` (fsynced; [`persist`]'s
/// directory fsync covers its entry), so the high-water mark survives a
/// torn or missing copy. An empty log has nothing to mark: the file goes.
fn write_mark(fs: &dyn Fs, dir: &Path, parsed: &ParsedLog) -> Result<(), LogError> {
    let pending = dir.join(PENDING_FILE);
    let Some(last) = parsed.entries.last() else {
        let has = fs
            .exists(&pending, "events.pending exists (recovery mark)")
            .map_err(|e| LogError::io(&pending, "exists", e))?;
        if has {
            fs.remove(&pending, "events.pending unlink (recovery)")
                .map_err(|e| LogError::io(&pending, "unlink", e))?;
        }
        return Ok(());
    };
    let line = last.to_line().map_err(|source| LogError::Serialize {
        path: pending.clone(),
        event: last.event.name().to_string(),
        source,
    })?;
    fs.open(
        &pending,
        crate::fs::OpenMode::Truncate,
        "events.pending create (recovery mark)",
    )
    .map_err(|e| LogError::io(&pending, "create", e))?;
    fs.write_at(
        &pending,
        0,
        line.as_bytes(),
        "events.pending write (recovery mark)",
    )
    .map_err(|e| LogError::io(&pending, "write", e))?;
    fs.sync(&pending, "events.pending fsync (recovery mark)")
        .map_err(|e| LogError::io(&pending, "fsync", e))?;
    Ok(())
}

/// Make durable everything recovery read and will rely on. The log may
/// hold entries that were only in the page cache (a process crash before
/// their fsync): recovery treats them as done, so they must not vanish in
/// a later power loss. And after a failed fsync the last entry's bytes are
/// of unknown durability even though they are visible ("fsyncgate": a
/// retried fsync does not make them durable), so that line is rewritten
/// in place before the fsync. Only the last line can be affected: every
/// append is fsynced before the next, and a failed fsync stops the runtime.
/// The directory fsync covers `events.jsonl`'s and `session.json`'s entries.
fn persist(fs: &dyn Fs, dir: &Path, parsed: &ParsedLog) -> Result<(), LogError> {
    let path = dir.join(EVENTS_FILE);
    if let Some(last) = parsed.entries.last() {
        let line = last.to_line().map_err(|source| LogError::Serialize {
            path: path.clone(),
            event: last.event.name().to_string(),
            source,
        })?;
        // Rewrite the exact bytes on disk when they round-trip; a line in
        // another (older) encoding is left as it is.
        if let Some(at) = parsed.valid_len.checked_sub(line.len() as u64) {
            let mut on_disk = vec![0; line.len()];
            let n = crate::fs::read_full_at(
                fs,
                &path,
                at,
                &mut on_disk,
                "events.jsonl read last line (recovery)",
            )
            .map_err(|e| LogError::io(&path, "read", e))?;
            if n == line.len() && on_disk == line.as_bytes() {
                fs.write_at(
                    &path,
                    at,
                    line.as_bytes(),
                    "events.jsonl rewrite last line (recovery)",
                )
                .map_err(|e| LogError::io(&path, "rewrite", e))?;
            }
        }
    }
    fs.sync(&path, "events.jsonl fsync (recovery)")
        .map_err(|e| LogError::io(&path, "fsync", e))?;
    fs.sync_dir(dir, "session dir fsync (recovery)")
        .map_err(|e| LogError::io(dir, "dir fsync", e))?;
    Ok(())
}
