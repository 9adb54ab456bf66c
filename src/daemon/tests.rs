//! The daemon on real tokio (production's runtime): a short wall-clock run
//! on SimFs with millisecond latencies does real work and stays consistent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fs::{SimConfig, SimFs};
use crate::world::World;

use super::{Daemon, DaemonClock, DaemonConfig, DaemonEvent, DaemonObserver, OneTime};

#[derive(Debug, Default)]
struct Events(Mutex<Vec<DaemonEvent>>);

impl DaemonObserver for Events {
    fn record(&self, _now_ms: u64, event: DaemonEvent) {
        self.0.lock().unwrap().push(event);
    }
}

#[test]
fn daemon_runs_turns_messages_and_a_one_time_trigger_on_real_tokio() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let fs = SimFs::new(SimConfig::new(5));
    let mut config = DaemonConfig::new(5, 3);
    config.latency_ms = (1, 3);
    config.think_ms = (1, 5);
    config.poll_ms = 20;
    // Failures back off for seconds; this wall-clock run lasts 400 ms.
    config.provider_failure = 0.0;
    config.trigger_failure = 0.0;
    config.one_time.push(OneTime {
        id: "soon".into(),
        agent: 1,
        fire_at_ms: 30,
    });
    let events = Arc::new(Events::default());
    let world = World::without_dedup();
    rt.block_on(async {
        let daemon = Daemon::boot(
            Arc::new(fs.clone()),
            Arc::new(world.clone()),
            config,
            DaemonClock::starting_at(0),
            events.clone(),
        )
        .unwrap();
        let ran = tokio::time::timeout(Duration::from_millis(400), daemon.run()).await;
        assert!(ran.is_err(), "the daemon stopped on its own: {ran:?}");
    });
    drop(rt);
    let events = events.0.lock().unwrap().clone();
    let has = |f: fn(&DaemonEvent) -> bool| events.iter().any(f);
    assert!(has(|e| matches!(e, DaemonEvent::TurnCompleted { .. })));
    assert!(has(|e| matches!(e, DaemonEvent::MessageAcked { .. })));
    let fired = events
        .iter()
        .filter(|e| matches!(e, DaemonEvent::TriggerFired { key, .. } if key == "scheduled-once:soon"))
        .count();
    assert_eq!(fired, 1, "{events:?}");
    assert!(world.duplicates().is_empty());
}
