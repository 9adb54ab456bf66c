//! Which sessions a boot can place in the agent tree (recovery step 5),
//! the one rule both the boot and the operator's `verify` follow.
//!
//! Invariant: a session is placed when it is a root or its parent was
//! placed before it; the placed ones come out in the order the boot
//! rebuilds them (passes over the rest in their given order, each placing
//! what it can, until a pass places nothing), so a parent always precedes
//! its children. The rest are cut off — their parent never resolves (its
//! directory is gone, or it is cut off itself) — and the boot terminates
//! each for good; `verify` lists exactly those as done at boot.

use std::collections::BTreeSet;

use crate::runtime::SessionId;

/// Split `sessions` into the placed, in rebuild order, and the cut off,
/// in their given order. `id` and `parent` read a session's own id and
/// its parent's.
pub(crate) fn place<T>(
    mut sessions: Vec<T>,
    id: impl Fn(&T) -> &SessionId,
    parent: impl Fn(&T) -> Option<&SessionId>,
) -> (Vec<T>, Vec<T>) {
    let mut placed_ids: BTreeSet<SessionId> = BTreeSet::new();
    let mut placed = Vec::with_capacity(sessions.len());
    // At most one pass per level of the tree.
    loop {
        let before = sessions.len();
        let mut rest = Vec::new();
        for s in sessions {
            if parent(&s).is_none_or(|p| placed_ids.contains(p)) {
                placed_ids.insert(id(&s).clone());
                placed.push(s);
            } else {
                rest.push(s);
            }
        }
        sessions = rest;
        if sessions.is_empty() || sessions.len() == before {
            return (placed, sessions);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Session = (SessionId, Option<SessionId>);

    /// A test id: `n` as the counter of a 16-digit hex id.
    fn sid(n: u64) -> SessionId {
        SessionId::from_hex(&format!("{n:016x}")).expect("a valid id")
    }

    fn counters(v: &[Session]) -> Vec<u64> {
        v.iter().map(|s| s.0.counter()).collect()
    }

    #[test]
    fn parents_come_first_and_orphans_are_cut_off_with_their_descendants() {
        // (id, parent): 3's parent 2 comes after it; 8's parent 9 is gone,
        // and 7 hangs under 8.
        let sessions: Vec<Session> = [
            (3, Some(2)),
            (7, Some(8)),
            (2, Some(1)),
            (8, Some(9)),
            (1, None),
            (4, Some(1)),
        ]
        .into_iter()
        .map(|(i, p)| (sid(i), p.map(sid)))
        .collect();
        let (placed, cut) = place(sessions, |s| &s.0, |s| s.1.as_ref());
        assert_eq!(
            counters(&placed),
            [1, 4, 2, 3],
            "pass 1 places 1 then 4; pass 2 places 2; pass 3 places 3"
        );
        assert_eq!(counters(&cut), [7, 8], "in their given order");
    }
}
