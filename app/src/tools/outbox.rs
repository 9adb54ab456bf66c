//! [`HttpOutbox`]: the system crate's `Outbox` for one irreversible HTTP
//! tool. The activity ledger commits INTENT, then calls `send` with the
//! call's idempotency key.
//!
//! Invariant: `Rejected` is returned only when the effect certainly did
//! not happen (a 4xx answer other than 409, or no connection was ever made:
//! refused, name not resolved); every other failure — a 5xx,
//! a timeout, a reset, a 2xx whose body was lost — is `Unknown`, because
//! calling it `Rejected` would let the ledger forget an effect that may
//! have happened (and a later retry would then do it twice).

use durable_agent::world::{DeliveryError, Outbox};
use serde_json::Value;

use super::endpoint::{Endpoint, Failed};
use crate::config::HttpToolConfig;
use crate::http::{excerpt, TransportFailure};

#[derive(Debug)]
pub struct HttpOutbox {
    endpoint: Endpoint,
    dedup: bool,
}

impl HttpOutbox {
    /// For one `kind = "http"` tool (normally an irreversible one), with
    /// no daemon address to fence off.
    pub fn new(tool: &HttpToolConfig) -> Self {
        Self::fenced(tool, None)
    }

    /// The same, never reaching `daemon` (the API's address).
    pub fn fenced(tool: &HttpToolConfig, daemon: Option<std::net::SocketAddr>) -> Self {
        HttpOutbox {
            endpoint: Endpoint::new(tool, daemon),
            dedup: tool.dedup,
        }
    }
}

impl Outbox for HttpOutbox {
    fn supports_dedup(&self, _action: &str) -> bool {
        self.dedup
    }

    fn send(&self, idem_key: &str, action: &str, payload: &Value) -> Result<String, DeliveryError> {
        if action != self.endpoint.name {
            // The ledger names the action after the tool; a mismatch is a
            // routing slip worth seeing, not a reason to refuse.
            tracing::warn!(tool = %self.endpoint.name, action, "outbox action differs from its tool name");
        }
        let unknown = || DeliveryError::Unknown {
            idem_key: idem_key.to_string(),
        };
        // Not delivered, and worth trying again (not reached, 429): at an
        // endpoint that deduplicates by key, re-sending under the same key
        // is safe, so the ledger keeps its INTENT and `[retries]` (or the
        // next boot) sends again (found by a review: both were final
        // failures, and max_retries never applied). Elsewhere it stays a
        // refusal: calling it unknown would ask a human for nothing.
        let transient = |reason: String| match self.dedup {
            true => {
                tracing::warn!(tool = %self.endpoint.name, idem_key, reason, "not delivered; sent again under its key");
                unknown()
            }
            false => DeliveryError::Rejected {
                idem_key: idem_key.to_string(),
                reason,
            },
        };
        let reply = match self.endpoint.call(idem_key, payload) {
            Ok(reply) => reply,
            Err(Failed { failure, sent: true }) => {
                tracing::warn!(tool = %self.endpoint.name, idem_key, url = self.endpoint.url(), %failure, "delivery outcome unknown");
                return Err(unknown());
            }
            Err(Failed { failure, sent: false })
                if matches!(
                    failure,
                    TransportFailure::Connection(_) | TransportFailure::Timeout
                ) =>
            {
                return Err(transient(failure.to_string()));
            }
            Err(Failed { failure, sent: false }) => {
                return Err(DeliveryError::Rejected {
                    idem_key: idem_key.to_string(),
                    reason: failure.to_string(),
                });
            }
        };
        match reply.status {
            200..=299 => {
                let provider_ref = provider_ref(&reply.body)
                    .unwrap_or_else(|| format!("HTTP {} {}", reply.status, reply.reason));
                tracing::info!(tool = %self.endpoint.name, idem_key, provider_ref, "delivered");
                Ok(provider_ref)
            }
            // 409: the Idempotency-Key draft's "a request with this key is
            // still being processed" — the first attempt may yet land.
            409 => {
                tracing::warn!(tool = %self.endpoint.name, idem_key, "409: original request still in flight; outcome unknown");
                Err(unknown())
            }
            429 => Err(transient(format!("HTTP 429: {}", excerpt(&reply.body, 200)))),
            400..=499 => Err(DeliveryError::Rejected {
                idem_key: idem_key.to_string(),
                reason: format!("HTTP {}: {}", reply.status, excerpt(&reply.body, 200)),
            }),
            // 5xx (the server may have acted before failing), and 1xx/3xx
            // that a no-redirect client should never see.
            status => {
                tracing::warn!(tool = %self.endpoint.name, idem_key, status, body = %excerpt(&reply.body, 200), "delivery outcome unknown");
                Err(unknown())
            }
        }
    }
}

/// The `id` field of a JSON object body (string or number).
fn provider_ref(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    match value.get("id")? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ref_is_the_body_id() {
        assert_eq!(provider_ref(r#"{"id":"msg_1"}"#), Some("msg_1".into()));
        assert_eq!(provider_ref(r#"{"id":42}"#), Some("42".into()));
        assert_eq!(provider_ref(r#"{"id":""}"#), None);
        assert_eq!(provider_ref("ok"), None);
    }
}
