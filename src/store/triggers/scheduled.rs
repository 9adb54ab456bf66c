//! The dedup keys of schedule buckets, `scheduled:{id}:{bucket}`, and what
//! they record: a schedule's newest bucket row is the only durable note
//! of the last bucket it emitted (the schedules file holds definitions,
//! not progress; a boot reads the marks back from this table).
//!
//! Invariant: the newest bucket row of each schedule (id and period,
//! [`Mark`]) outlives GC. A
//! schedule's period may be longer than the GC's TTL (a weekly schedule
//! under the default 24 h); collected while its bucket is still current,
//! the row's key would be free again and the next boot, reading no mark,
//! would emit and fire that bucket a second time.

use std::collections::BTreeMap;

use super::Trigger;

const PREFIX: &str = "scheduled:";

/// The dedup key of schedule `id`'s `bucket`.
pub fn bucket_key(id: &str, bucket: u64) -> String {
    format!("{PREFIX}{id}:{bucket}")
}

/// The schedule id and bucket a dedup key names, if it is a bucket's.
pub fn parse_bucket_key(key: &str) -> Option<(&str, u64)> {
    let rest = key.strip_prefix(PREFIX)?;
    let (id, bucket) = rest.rsplit_once(':')?;
    Some((id, bucket.parse().ok()?))
}

/// Which schedule a bucket row belongs to: its id and the period it was
/// emitted under (the payload's `period_ms`; rows from before that field
/// was written: `fire_at / bucket`, unknown for bucket 0). A schedule deleted and added
/// again under its id with another period is another schedule: its
/// buckets count in other units, so the old one's marks say nothing
/// about it (read as its own, a longer period would stay silent until its
/// bucket numbers passed the old ones').
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mark {
    pub id: String,
    pub period_ms: Option<u64>,
}

impl Mark {
    /// Whether this mark may be the schedule `id` of `period_ms`'s.
    pub fn is_of(&self, id: &str, period_ms: u64) -> bool {
        self.id == id && self.period_ms.is_none_or(|p| p == period_ms)
    }
}

/// Per schedule (id and period), its newest bucket among `triggers` and
/// that row's id.
pub fn newest_buckets(triggers: &[Trigger]) -> BTreeMap<Mark, (u64, String)> {
    let mut newest: BTreeMap<Mark, (u64, String)> = BTreeMap::new();
    for trigger in triggers {
        let Some((id, bucket)) = trigger.dedup_key.as_deref().and_then(parse_bucket_key) else {
            continue;
        };
        let mark = Mark {
            id: id.to_string(),
            period_ms: trigger
                .payload
                .get("period_ms")
                .and_then(serde_json::Value::as_u64)
                .or_else(|| trigger.fire_at_ms.checked_div(bucket)),
        };
        match newest.get(&mark) {
            Some((seen, _)) if *seen >= bucket => {}
            _ => {
                newest.insert(mark, (bucket, trigger.id.clone()));
            }
        }
    }
    newest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_key_parses_back_and_other_keys_do_not() {
        assert_eq!(parse_bucket_key(&bucket_key("a.b-c", 42)), Some(("a.b-c", 42)));
        assert_eq!(parse_bucket_key("remind-ada"), None);
        assert_eq!(parse_bucket_key("scheduled:x:notanumber"), None);
    }
}
