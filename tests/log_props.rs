//! Properties of log parsing and repair over arbitrary bytes: parsing never
//! panics, and a log cut at ANY byte offset (a torn tail) repairs to exactly
//! the entries whose lines were complete, cutting only the partial line.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use durable_agent::canary::Canaries;
use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};
use durable_agent::log::{self, repair::parse_bytes, Event, EventLog, EVENTS_FILE};
use durable_agent::runtime::{AgentId, MessageId, SessionId};
use proptest::prelude::*;

fn sid() -> SessionId {
    SessionId::from_hex("00000000000000aa").unwrap()
}

fn sample_log() -> (Vec<u8>, Vec<usize>) {
    let sim = SimFs::new(SimConfig::new(1));
    let dir = PathBuf::from("/s");
    sim.create_dir_all(&dir, "t").unwrap();
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let mut log = EventLog::create(fs, &dir, sid(), Canaries::none()).unwrap();
    let a = AgentId::from_hex("00000000000000ab").unwrap();
    let events = vec![
        Event::AgentCreated {
            agent_id: a.clone(),
            name: "n".into(),
            parent_session_id: None,
            instructions: "é ✓".into(),
        },
        Event::TurnStart {
            prompt: "p\n\"q\"".into(),
            work: None,
            reads: Vec::new(),
        },
        Event::TurnStart {
            prompt: "fired".into(),
            work: Some("trigger:nightly-report".into()),
            reads: Vec::new(),
        },
        Event::TurnComplete {
            response: "r".into(),
            delivered: Vec::new(),
        },
        Event::MessageEnqueued {
            message_id: MessageId::from_hex("00000000000000ac").unwrap(),
            sender: a.clone(),
            recipient: a,
            payload: "x".into(),
        },
    ];
    let mut ends = Vec::new();
    let mut len = 0;
    for (i, e) in events.into_iter().enumerate() {
        len += log.append(i as u64 + 1, e).unwrap().to_line().unwrap().len();
        ends.push(len);
    }
    (sim.read(&dir.join(EVENTS_FILE), "t").unwrap(), ends)
}

proptest! {
    #[test]
    fn parsing_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = parse_bytes(Path::new("/x/events.jsonl"), &bytes, Some(&sid()));
    }

    #[test]
    fn parsing_a_log_with_one_flipped_byte_never_panics(at in 0usize..2000, byte in any::<u8>()) {
        let (mut bytes, _) = sample_log();
        let at = at % bytes.len();
        bytes[at] = byte;
        let _ = parse_bytes(Path::new("/x/events.jsonl"), &bytes, Some(&sid()));
    }

    #[test]
    fn a_log_cut_at_any_offset_repairs_to_its_complete_lines(cut in 0usize..2000) {
        let (bytes, ends) = sample_log();
        let cut = cut % (bytes.len() + 1);
        let sim = SimFs::new(SimConfig::new(2));
        let dir = PathBuf::from("/s");
        sim.create_dir_all(&dir, "t").unwrap();
        let path = dir.join(EVENTS_FILE);
        sim.open(&path, OpenMode::Create, "t").unwrap();
        sim.write_at(&path, 0, &bytes[..cut], "t").unwrap();
        let (entries, report) = log::repair(&sim, &dir, &sid(), &Canaries::none()).unwrap();
        let complete = ends.iter().filter(|&&e| e <= cut).count();
        let valid = if complete == 0 { 0 } else { ends[complete - 1] };
        prop_assert_eq!(entries.len(), complete);
        prop_assert_eq!(report.truncated_bytes, (cut - valid) as u64);
        prop_assert_eq!(sim.read(&path, "t").unwrap(), bytes[..valid].to_vec());
    }
}
