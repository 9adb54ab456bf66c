//! [`OutboxRoutes`]: one [`Outbox`] per irreversible tool, behind the one
//! outbox the activity ledger talks to. The ledger records the tool name as
//! the activity's `action`, so both the send and the recovery decision
//! (re-send with the key only where that tool's endpoint deduplicates) are
//! routed by it.
//!
//! Invariant: an action with no route is refused before anything is sent
//! ([`DeliveryError::Rejected`]: definitely not delivered), and reports no
//! dedup support, so an INTENT left for it is surfaced for confirmation.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::world::{DeliveryError, Outbox};

/// Irreversible tools by name.
#[derive(Debug, Clone, Default)]
pub struct OutboxRoutes {
    routes: BTreeMap<String, Arc<dyn Outbox>>,
}

impl OutboxRoutes {
    pub fn new(routes: BTreeMap<String, Arc<dyn Outbox>>) -> Self {
        OutboxRoutes { routes }
    }

    /// Whether `action` (a tool name) has a route.
    pub fn routes(&self, action: &str) -> bool {
        self.routes.contains_key(action)
    }
}

impl Outbox for OutboxRoutes {
    fn supports_dedup(&self, action: &str) -> bool {
        self.routes.get(action).is_some_and(|o| o.supports_dedup(action))
    }

    fn send(
        &self,
        idem_key: &str,
        action: &str,
        payload: &serde_json::Value,
    ) -> Result<String, DeliveryError> {
        match self.routes.get(action) {
            Some(outbox) => outbox.send(idem_key, action, payload),
            None => Err(DeliveryError::Rejected {
                idem_key: idem_key.to_string(),
                reason: format!("no irreversible tool named {action:?} is configured"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::World;

    #[test]
    fn routes_by_action_and_refuses_unknown_ones() {
        let email = World::with_dedup();
        let pay = World::without_dedup();
        let routes = OutboxRoutes::new(BTreeMap::from([
            ("email".to_string(), Arc::new(email.clone()) as Arc<dyn Outbox>),
            ("pay".to_string(), Arc::new(pay.clone()) as Arc<dyn Outbox>),
        ]));
        assert!(routes.supports_dedup("email"));
        assert!(!routes.supports_dedup("pay"));
        assert!(!routes.supports_dedup("nuke"));
        routes.send("k1", "email", &serde_json::json!({})).unwrap();
        routes.send("k2", "pay", &serde_json::json!({})).unwrap();
        assert_eq!((email.deliveries_len(), pay.deliveries_len()), (1, 1));
        let refused = routes.send("k3", "nuke", &serde_json::json!({})).unwrap_err();
        assert!(matches!(refused, DeliveryError::Rejected { .. }), "{refused:?}");
    }
}
