//! Deterministic identifiers and the logical clock.
//!
//! Invariant: ids never come from the OS. Every id is 16 hex digits: an
//! 8-digit prefix derived from the runtime seed and an 8-digit counter
//! shared by all id kinds, so recovery can restart the counter past every
//! id it has seen ([`IdGen::observe`]) and an id is never reused, not even
//! one of a cleaned-up orphan.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! hex_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(into = "String", try_from = "String")]
        pub struct $name(String);

        // Parsed ids are validated, so `counter` can slice safely.
        impl TryFrom<String> for $name {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                $name::from_hex(&s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl $name {
            /// Validate a 16-hex-digit id.
            pub fn from_hex(s: &str) -> Result<Self, String> {
                if s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
                    Ok($name(s.to_string()))
                } else {
                    Err(format!("{s:?} is not a 16-digit lowercase hex id"))
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The counter part (low 8 hex digits).
            pub fn counter(&self) -> u64 {
                self.0
                    .get(8..)
                    .and_then(|c| u64::from_str_radix(c, 16).ok())
                    .unwrap_or(0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

hex_id!(
    /// An agent (a node of the tree).
    AgentId
);
hex_id!(
    /// A session: also the name of its directory under `agents/`.
    SessionId
);
hex_id!(
    /// A message between agents.
    MessageId
);

/// The id generator: seed-derived prefix + shared counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdGen {
    prefix: u32,
    next: u64,
}

/// splitmix64: a fixed, well-known mixer so the prefix depends only on the seed.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a: a fixed, published hash (never the std hasher, whose output may
/// change between releases), for values that must be stable on disk.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl IdGen {
    pub fn new(seed: u64) -> Self {
        IdGen {
            prefix: (mix(seed) >> 32) as u32,
            next: 1,
        }
    }

    fn next_hex(&mut self) -> String {
        let n = self.next;
        self.next += 1;
        format!("{:08x}{:08x}", self.prefix, n & 0xFFFF_FFFF)
    }

    pub fn agent(&mut self) -> AgentId {
        AgentId(self.next_hex())
    }

    pub fn session(&mut self) -> SessionId {
        SessionId(self.next_hex())
    }

    pub fn message(&mut self) -> MessageId {
        MessageId(self.next_hex())
    }

    /// Make sure later ids are past `counter` (recovery).
    pub fn observe(&mut self, counter: u64) {
        self.next = self.next.max(counter + 1);
    }
}

/// The logical clock: ticks once per logged event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Clock {
    now: u64,
}

impl Clock {
    /// Advance and return the new time.
    pub fn tick(&mut self) -> u64 {
        self.now += 1;
        self.now
    }

    pub fn now(&self) -> u64 {
        self.now
    }

    /// Make sure later ticks are past `ts` (recovery).
    pub fn observe(&mut self, ts: u64) {
        self.now = self.now.max(ts);
    }
}
