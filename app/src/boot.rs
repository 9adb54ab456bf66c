//! Booting the system from a [`Config`]: the product's one wiring of the
//! system crate's [`System::boot`] with real dependencies — [`RealFs`],
//! the OpenAI-compatible provider (interruptible, see [`crate::interrupt`]),
//! the configured tools (irreversible ones routed by name through the
//! activity ledger) and the host clock.
//!
//! Invariant: every command that touches a root (`run`, `serve`, and
//! `status`/`emit`/`confirm` when no daemon holds it) boots through
//! [`boot`], so each one runs the whole recovery under the root lock before
//! it reads or writes anything, and nothing here persists a byte itself.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use durable_agent::fs::RealFs;
use durable_agent::runtime::Hooks;
use durable_agent::system::{
    BootReport, Deps, LogicalClock, OutboxRoutes, System, SystemConfig, SystemError,
};

use crate::config::Config;
use crate::interrupt::{InterruptibleProvider, Stop};
use crate::lifecycle::{Lifecycle, ObservedOutbox, ObservedTools};
use crate::observe::{CallObserver, NoopObserver};
use crate::openai::{OpenAiError, OpenAiProvider};
use crate::otel::{Otel, OtelError};
use crate::progress::Progress;
use crate::telemetry::{Telemetry, TelemetryError};
use crate::tools::ToolSet;

/// Seed of the runtime's id prefix and SQLite's PRNG. Fixed: ids stay in
/// one family across boots of a root (recovery restarts the counter past
/// every id seen), and nothing in production needs them unpredictable.
pub const SYSTEM_SEED: u64 = 0xda_0013;

/// The host's clock as the stores' logical clock: the wall clock read once
/// at start (trigger times must mean the same thing across restarts), then
/// advanced by a monotonic clock so it never runs backwards within a
/// process even if the wall clock is stepped.
#[derive(Debug, Clone, Copy)]
pub struct HostClock {
    origin: Instant,
    origin_ms: u64,
}

impl HostClock {
    /// Read the wall clock now (the one wall-clock read, at the edge).
    pub fn start() -> HostClock {
        let origin_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        HostClock {
            origin: Instant::now(),
            origin_ms,
        }
    }
}

impl LogicalClock for HostClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.origin_ms.saturating_add(elapsed)
    }
}

/// The variable a `--features canaries` build reads to switch one canary
/// on (a test build only; see [`real_fs`]).
pub const CANARY_ENV: &str = "DURABLE_AGENT_CANARY";

/// The known bugs a test build was asked for: none, unless built with the
/// `canaries` feature and [`CANARY_ENV`] names one. Said loudly on stderr
/// (the soak checks the line) — a canary build must never pass quietly
/// for a production one.
#[cfg(feature = "canaries")]
pub fn canaries() -> Result<durable_agent::canary::Canaries, BootError> {
    use durable_agent::canary::{Canaries, Canary};
    let Ok(name) = std::env::var(CANARY_ENV) else {
        return Ok(Canaries::none());
    };
    let canary: Canary = serde_json::from_value(serde_json::Value::String(name.clone()))
        .map_err(|_| BootError::Canary(name.clone()))?;
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!("canary on: {name} (a test build re-introducing a known bug; never use it for real work)");
    });
    Ok(Canaries::only(canary))
}

/// The production build has no canaries to switch on.
#[cfg(not(feature = "canaries"))]
pub fn canaries() -> Result<durable_agent::canary::Canaries, BootError> {
    Ok(durable_agent::canary::Canaries::none())
}

/// The filesystem every command persists through: [`RealFs`] (with the
/// test build's canaries, if any).
pub fn real_fs() -> Result<RealFs, BootError> {
    #[cfg(feature = "canaries")]
    return Ok(RealFs::with_canaries(canaries()?));
    #[cfg(not(feature = "canaries"))]
    Ok(RealFs::new())
}

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("{CANARY_ENV}={0:?} names no canary (snake_case, e.g. real_fs_sync_noop)")]
    Canary(String),
    #[error("provider: {0}")]
    Provider(#[from] OpenAiError),
    #[error("telemetry: {0}")]
    Telemetry(#[from] TelemetryError),
    #[error("telemetry.otlp: {0}")]
    Otel(#[from] OtelError),
    #[error("{0}")]
    System(#[from] SystemError),
}

impl BootError {
    /// Another process (a `serve` daemon, a `run`) holds the root.
    pub fn is_locked(&self) -> bool {
        matches!(self, BootError::System(SystemError::Locked { .. }))
    }
}

/// Boot the system on `config.runtime.root`. Provider calls give up at the
/// next safe point once `stop` is requested. The [`Lifecycle`] exports the
/// telemetry events of what the caller then does with the system (its
/// tools and outbox are already wired into it).
pub fn boot(config: &Config, stop: &Stop) -> Result<(System, BootReport, Lifecycle), BootError> {
    boot_with(config, stop, ApiKey::Required)
}

/// Whether a boot needs the provider's API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKey {
    /// `run`, `serve`: turns will call the provider.
    Required,
    /// The admin commands (`status`, `emit`, `confirm`, `retry`,
    /// `release`): they run no turn, so an unset key is no reason to
    /// refuse them (a provider call would fail as unauthorized).
    Optional,
}

/// [`boot`], saying whether the provider's key must be set.
pub fn boot_with(
    config: &Config,
    stop: &Stop,
    key: ApiKey,
) -> Result<(System, BootReport, Lifecycle), BootError> {
    boot_watched(config, stop, key, None)
}

/// [`boot_with`], `progress` (`run`'s live progress) watching the runtime's
/// hook events after the configured hooks and the provider's attempts
/// after telemetry.
pub fn boot_watched(
    config: &Config,
    stop: &Stop,
    key: ApiKey,
    progress: Option<&Arc<Progress>>,
) -> Result<(System, BootReport, Lifecycle), BootError> {
    let exporter = Telemetry::open(&config.telemetry)?.map(Arc::new);
    let otel = match &config.telemetry.otlp {
        Some(otlp) => Some(Otel::start(otlp, &config.provider.model, stop)?),
        None => None,
    };
    let lifecycle = Lifecycle::new(exporter.clone(), otel.clone());
    // Telemetry's events, then the tracer's spans, then the progress line.
    let observer: Arc<dyn CallObserver> = match &exporter {
        Some(_) => Arc::new(lifecycle.clone()),
        None => Arc::new(NoopObserver),
    };
    let observer = match &otel {
        Some(o) => o.observer(observer),
        None => observer,
    };
    let observer = match progress {
        Some(p) => p.observer(observer),
        None => observer,
    };
    let provider = match (OpenAiProvider::from_config(config), key) {
        (Ok(provider), _) => provider,
        (Err(OpenAiError::MissingApiKey { var }), ApiKey::Optional) => {
            tracing::debug!(var, "no provider key: an admin command runs no turn");
            OpenAiProvider::with_key(config, None)
        }
        (Err(e), _) => return Err(e.into()),
    }
    .with_observer(observer);
    let tools = ToolSet::from_config(&config.tools, Some(config.api.listen));
    let mut system_config = SystemConfig::new(config.runtime.root.clone(), SYSTEM_SEED);
    system_config.slots = config.runtime.slots;
    system_config.max_tool_rounds = config.runtime.max_tool_rounds;
    system_config.context_budget = config.context.budget();
    system_config.orchestration = config.orchestration_policy();
    system_config.canaries = canaries()?;
    let hooks: Arc<dyn Hooks> = Arc::new(crate::hooks::ConfigHooks::from_config(&config.hooks));
    let hooks = match &otel {
        Some(o) => o.hooks(hooks),
        None => hooks,
    };
    system_config.hooks = match progress {
        Some(p) => p.hooks(hooks),
        None => hooks,
    };
    system_config.tool_retries = Arc::new(crate::hooks::ConfigRetries::from_config(
        config,
        Arc::new(crate::retry::ThreadSleeper),
    ));
    let deps = Deps {
        provider: Arc::new(InterruptibleProvider::new(Arc::new(provider), stop.clone())),
        tools: Arc::new(ObservedTools {
            inner: tools.executor,
            lifecycle: lifecycle.clone(),
        }),
        outbox: Arc::new(ObservedOutbox {
            inner: Arc::new(OutboxRoutes::new(tools.outboxes)),
            lifecycle: lifecycle.clone(),
        }),
        clock: Arc::new(HostClock::start()),
    };
    let (system, report) = System::boot(Arc::new(real_fs()?), system_config, deps)?;
    tracing::info!(
        root = %config.runtime.root.display(),
        intents_settled = report.stores.activities.len(),
        leases_reclaimed = report.stores.reclaimed_triggers.len(),
        "booted"
    );
    Ok((system, report, lifecycle))
}
