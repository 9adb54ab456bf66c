//! The simulated external world: where irreversible side effects land (an
//! outbox that records every delivery). It lives outside the `Fs` seam, so it
//! survives every crash — exactly like a sent email — which is what lets the
//! oracle count duplicates.
