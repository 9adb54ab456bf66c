//! On-disk invariants the oracle checks after every recovery, read straight
//! from the disk (not from the runtime's memory):
//! - no session is ACTIVE;
//! - every `session.json` is a valid record; no `.tmp` file is left, and
//!   an `events.pending` left beside a log holds exactly its last line (the
//!   high-water mark recovery keeps; see [`crate::log::repair`]);
//! - every `events.jsonl` is a valid JSONL prefix: complete lines only,
//!   valid entries, contiguous `seq`;
//! - the tree is consistent: every live (non-terminated) session has
//!   `agent.created`, and its parent session is live (no orphan children,
//!   no dangling parent references).
//!
//! An oracle, not a step of the product: the harness (`cargo sim`'s view,
//! the fuzzer's projection) and the tests call it; no boot, command or
//! API does. So it is built only with the `fakes` feature, beside the
//! stand-ins, and mutation testing leaves it out (`.cargo/mutants.toml`).
//!
//! Invariant of this module: it only reads.

use std::collections::BTreeMap;
use std::path::Path;

use crate::fs::Fs;
use crate::log::{self, Event, EVENTS_FILE, PENDING_FILE};
use crate::runtime::SessionId;
use crate::store::session::{SessionRecord, SessionState, SESSION_FILE};

/// Check the on-disk invariants of the runtime rooted at `root` (call it
/// after recovery). Returns every violation found, each naming the file.
pub fn check_invariants(fs: &dyn Fs, root: &Path) -> Result<(), Vec<String>> {
    let mut bad = Vec::new();
    let agents_dir = root.join("agents");
    let names = match fs.list(&agents_dir, "invariants agents list") {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(vec![format!("{}: cannot list: {e}", agents_dir.display())]),
    };
    // session id -> (record state, live parent session if any)
    let mut live: BTreeMap<SessionId, Option<SessionId>> = BTreeMap::new();
    for name in names {
        if SessionId::from_hex(&name).is_err() {
            continue; // not ours (see ScannedSession::Foreign)
        }
        let dir = agents_dir.join(&name);
        let files = match fs.list(&dir, "invariants session dir list") {
            Ok(f) => f,
            Err(e) => {
                bad.push(format!("{}: cannot list: {e}", dir.display()));
                continue;
            }
        };
        for f in &files {
            if f.ends_with(".tmp") {
                bad.push(format!("{}: leftover {f} after recovery", dir.display()));
            }
        }
        if !files.iter().any(|f| f == SESSION_FILE) {
            if files.iter().any(|f| f == EVENTS_FILE) {
                bad.push(format!("{}: events.jsonl without session.json", dir.display()));
            }
            continue;
        }
        let path = dir.join(SESSION_FILE);
        let record: SessionRecord = match fs
            .read(&path, "invariants session.json read")
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(r) => r,
            Err(e) => {
                bad.push(format!("{}: invalid session record: {e}", path.display()));
                continue;
            }
        };
        if record.state == SessionState::Active {
            bad.push(format!("{}: session is ACTIVE after recovery", path.display()));
        }
        let parsed = match log::parse_log(fs, &dir, Some(&record.session_id)) {
            Ok(p) => p,
            Err(e) => {
                bad.push(format!("log is not a valid JSONL prefix: {e}"));
                continue;
            }
        };
        if parsed.partial_tail_bytes > 0 {
            bad.push(format!(
                "{}: partial trailing line of {} bytes at offset {} after recovery",
                dir.join(EVENTS_FILE).display(),
                parsed.partial_tail_bytes,
                parsed.valid_len
            ));
        }
        if files.iter().any(|f| f == PENDING_FILE) {
            let pending = dir.join(PENDING_FILE);
            let copy = fs
                .read(&pending, "invariants events.pending read")
                .unwrap_or_default();
            let log = fs
                .read(&dir.join(EVENTS_FILE), "invariants events.jsonl read")
                .unwrap_or_default();
            let valid = usize::try_from(parsed.valid_len)
                .unwrap_or(usize::MAX)
                .min(log.len());
            let body = &log[..valid];
            let last_start = body
                .strip_suffix(b"\n")
                .and_then(|b| b.iter().rposition(|&c| c == b'\n'))
                .map_or(0, |i| i + 1);
            if body.is_empty() || copy != body[last_start..] {
                bad.push(format!(
                    "{}: events.pending after recovery is not the log's last line (the high-water mark)",
                    dir.display()
                ));
            }
        }
        let terminated = parsed
            .entries
            .iter()
            .any(|e| matches!(e.event, Event::AgentTerminated { .. }));
        // A TERMINATED record is final even if its log was lost; the other
        // direction means recovery skipped fixing the record.
        if terminated && record.state != SessionState::Terminated {
            bad.push(format!(
                "{}: record state {:?} disagrees with the log (agent.terminated logged: {terminated})",
                path.display(),
                record.state
            ));
        }
        if record.state == SessionState::Terminated {
            continue;
        }
        let created = parsed.entries.iter().find_map(|e| match &e.event {
            Event::AgentCreated {
                parent_session_id, ..
            } => Some(parent_session_id.clone()),
            _ => None,
        });
        match created {
            Some(parent) => {
                live.insert(record.session_id.clone(), parent);
            }
            None => bad.push(format!(
                "{}: live session without agent.created (an uncleaned orphan)",
                path.display()
            )),
        }
    }
    for (session, parent) in &live {
        if let Some(p) = parent {
            if !live.contains_key(p) {
                bad.push(format!("session {session} is a child of {p}, which is not live"));
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad)
    }
}
