//! A schedule deleted and added again (same id and period) is a new
//! schedule: it fires at once, due when it was added, with no "missed N
//! earlier period(s) ... while the daemon was down" note (app/README.md,
//! Recurring schedules). Found by a review: the re-added schedule read the
//! deleted one's bucket rows back (GC keeps the newest) and counted every
//! bucket since the deletion as missed, with the daemon up throughout.

mod common;

use std::process::Child;
use std::time::Duration;

use common::*;
use durable_agent_cli::mock_llm::MockLlm;
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::json;

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_schedule_added_again_is_not_told_it_missed_periods_while_the_daemon_was_down() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mock = MockLlm::echo(loopback())?;
    let sink = WebhookSink::start(loopback(), true)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        true,
        free_addr()?,
    )?;
    let (child, url) = start_serve(&config)?;
    let _serve = Serve(child);
    let api = client(&url)?;

    api.call("POST", "/agents", Some(&json!({"name": "mailer"})))?;
    let schedule = json!({"id": "tick", "agent": "mailer", "prompt": "tick", "period_ms": 500});
    api.call("POST", "/schedules", Some(&schedule))?;
    wait_for("the first bucket to fire", || !mock.request_bodies().is_empty())?;
    api.call("DELETE", "/schedules/tick", None)?;
    // Several periods pass with no schedule (the daemon is up throughout).
    std::thread::sleep(Duration::from_millis(2_200));
    let before = mock.request_bodies().len();
    let again = api.call("POST", "/schedules", Some(&schedule))?;
    assert_eq!(again["created"], true, "{again}");
    wait_for("the re-added schedule to fire", || {
        mock.request_bodies().len() > before
    })?;
    let asked: Vec<String> = mock.request_bodies()[before..]
        .iter()
        .map(|b| b.to_string())
        .collect();
    let overdue = asked.iter().find(|b| b.contains("overdue"));
    assert!(
        overdue.is_none(),
        "the daemon never went down, yet the re-added schedule's prompt says: {}",
        overdue
            .and_then(|b| b.find("[overdue").map(|i| &b[i..(i + 170).min(b.len())]))
            .unwrap_or_default()
    );
    Ok(())
}
