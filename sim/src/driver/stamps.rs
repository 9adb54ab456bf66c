//! The schema version each log line is stamped with, checked after every
//! boot on every durable log (`src/log/entry.rs` `Event::min_version`):
//! a line carries the oldest version whose readers understand it, so a
//! line an older build can read stays readable to it, and one it cannot
//! is refused by it as newer, never misread. The fuzzer runs one build;
//! the stamp is what an older one would go by, so it is checked here.
//!
//! V1: every complete line of an `events.jsonl` that parses is sealed
//! (this build seals every line it writes: a line without its checksum
//! is one no reader can check for rot), unless it is an older build's
//! line the rot strike planted ([`crate::rot::Damage::Older`]: never
//! restamped); and every sealed line carries, by what it holds:
//! - a `round.decided` with a hook's verdict in any call: the hook
//!   version (5: a version-4 reader would drop the verdict);
//! - any other `round.decided`, and a `turn.resume` that carries its
//!   prompt: the decision version (4);
//! - anything else: the checksum version (3: every sealed line needs it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use durable_agent::checksum::{self, Sealed};
use durable_agent::log::entry::{CHECKSUM_VERSION, DECISION_VERSION, HOOK_VERSION};
use durable_agent::log::{Event, LogEntry};

/// What V1 wants of `event`.
fn wanted(event: &Event) -> u32 {
    match event {
        Event::RoundDecided { calls, .. } if calls.iter().any(|c| c.hook.is_some()) => HOOK_VERSION,
        Event::RoundDecided { .. } | Event::TurnResume { prompt: Some(_), .. } => DECISION_VERSION,
        _ => CHECKSUM_VERSION,
    }
}

/// V1 over `logs` (every log file's bytes, by path); `planted` holds the
/// older build's lines the rot strike left (without their newline).
pub(super) fn stamp_violations(
    logs: &BTreeMap<PathBuf, Vec<u8>>,
    planted: &BTreeSet<Vec<u8>>,
) -> Vec<String> {
    let plain = format!("{{\"schema_version\":{CHECKSUM_VERSION},");
    let mut out = Vec::new();
    for (path, bytes) in logs {
        if path.file_name().and_then(|n| n.to_str()) != Some("events.jsonl") {
            continue;
        }
        let mut offset = 0usize;
        // Complete lines only: a torn tail is the boot's to cut.
        for line in bytes
            .split_inclusive(|b| *b == b'\n')
            .filter(|l| l.ends_with(b"\n"))
        {
            let at = offset;
            offset += line.len();
            let line = &line[..line.len() - 1];
            // An older build's line (unsealed) is never restamped; any
            // other unsealed line that reads as an entry is this build's
            // (one that does not read is damage, the readers' to refuse).
            if checksum::check(line) == Sealed::Unsealed {
                match LogEntry::parse(line) {
                    Ok(entry) if !planted.contains(line) => out.push(format!(
                        "V1: {} byte {at}: a line without its checksum, stamped schema_version {} (every line this build writes is sealed; only an older build's may lack it): {}",
                        path.display(),
                        entry.schema_version,
                        String::from_utf8_lossy(&line[..line.len().min(160)])
                    )),
                    _ => {}
                }
                continue;
            }
            // Only these two events may need more than the checksum
            // version: any other line stamped with it passes unparsed.
            let special = [&b"\"round.decided\""[..], b"\"turn.resume\""]
                .iter()
                .any(|name| line.windows(name.len()).any(|w| w == *name));
            if !special && line.starts_with(plain.as_bytes()) {
                continue;
            }
            let (found, want) = match LogEntry::parse(line) {
                Ok(entry) => (entry.schema_version, wanted(&entry.event)),
                // Damage is the readers' to refuse (R6), not V1's.
                Err(_) => continue,
            };
            if found != want {
                out.push(format!(
                    "V1: {} byte {at}: a line stamped schema_version {found}, but what it holds needs exactly {want} (the oldest version whose readers understand it): {}",
                    path.display(),
                    String::from_utf8_lossy(&line[..line.len().min(160)])
                ));
            }
        }
    }
    out
}
