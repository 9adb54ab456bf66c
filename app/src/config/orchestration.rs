//! `[orchestration]`: which agents may call the orchestration tools
//! (`[[tools]] kind = "spawn_agent" | "send_message" | "list_agents"`, which
//! the runtime performs itself: `durable_agent::runtime::orchestration`),
//! the spawning limits, and whether `serve` wakes an agent that has a
//! pending message.
//!
//! ```toml
//! [[tools]]
//! kind = "spawn_agent"
//! [[tools]]
//! kind = "send_message"
//!
//! [orchestration]
//! max_depth = 2                       # a root is depth 0 (default 2)
//! max_children = 8                    # per agent (default 8)
//! max_agents = 64                     # in the whole tree (default 64)
//! default_tools = ["send_message"]    # agents not listed below (default: every configured one)
//! agents = { boss = ["spawn_agent", "send_message"] }
//! wake = true                         # serve wakes recipients (default true; with no
//!                                     # [orchestration] section: on if send_message is a tool)
//! ```
//!
//! Invariant: a validated section names only orchestration tools that
//! `[[tools]]` configures, and every limit is within its bound; each
//! error names its key (`orchestration.max_depth`,
//! `orchestration.agents.boss`).

use std::collections::{BTreeMap, BTreeSet};

use durable_agent::runtime::{Orchestration, OrchestrationTool};
use serde::Deserialize;

use super::ToolConfig;

/// Bounds of the limits: a runaway model must not fork the machine.
pub const MAX_DEPTH_LIMIT: u32 = 16;
pub const MAX_CHILDREN_LIMIT: u32 = 256;
pub const MAX_AGENTS_LIMIT: u32 = 4096;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrchestrationConfig {
    #[serde(default = "defaults::max_depth")]
    pub max_depth: u32,
    #[serde(default = "defaults::max_children")]
    pub max_children: u32,
    #[serde(default = "defaults::max_agents")]
    pub max_agents: u32,
    /// The orchestration tools an agent not named in `agents` may call;
    /// absent: every configured one.
    #[serde(default)]
    pub default_tools: Option<Vec<String>>,
    /// The orchestration tools each named agent may call.
    #[serde(default)]
    pub agents: BTreeMap<String, Vec<String>>,
    /// `serve` wakes an agent that has a pending message (a trigger per
    /// message, keyed by its id).
    #[serde(default = "defaults::wake")]
    pub wake: bool,
}

impl Default for OrchestrationConfig {
    fn default() -> Self {
        OrchestrationConfig {
            max_depth: defaults::max_depth(),
            max_children: defaults::max_children(),
            max_agents: defaults::max_agents(),
            default_tools: None,
            agents: BTreeMap::new(),
            wake: defaults::wake(),
        }
    }
}

mod defaults {
    pub fn max_depth() -> u32 {
        2
    }
    pub fn max_children() -> u32 {
        8
    }
    pub fn max_agents() -> u32 {
        64
    }
    pub fn wake() -> bool {
        true
    }
}

/// The orchestration tools `[[tools]]` configures.
pub fn configured(tools: &[ToolConfig]) -> BTreeSet<OrchestrationTool> {
    tools.iter().filter_map(ToolConfig::orchestration).collect()
}

fn tool_set(
    names: &[String],
    enabled: &BTreeSet<OrchestrationTool>,
    key: &str,
) -> Result<BTreeSet<OrchestrationTool>, (String, String)> {
    names
        .iter()
        .map(|name| match OrchestrationTool::from_name(name) {
            Some(tool) if enabled.contains(&tool) => Ok(tool),
            Some(_) => Err((
                key.to_string(),
                format!("{name:?} is not configured: add [[tools]] kind = \"{name}\""),
            )),
            None => Err((
                key.to_string(),
                format!("{name:?} is not an orchestration tool (spawn_agent, send_message, list_agents)"),
            )),
        })
        .collect()
}

pub(super) fn validate_orchestration(
    section: Option<&OrchestrationConfig>,
    tools: &[ToolConfig],
) -> Result<(), (String, String)> {
    let Some(o) = section else { return Ok(()) };
    let bound = |key: &str, value: u32, min: u32, max: u32| {
        if (min..=max).contains(&value) {
            Ok(())
        } else {
            Err((
                format!("orchestration.{key}"),
                format!("{value} is outside {min}..={max}"),
            ))
        }
    };
    bound("max_depth", o.max_depth, 1, MAX_DEPTH_LIMIT)?;
    bound("max_children", o.max_children, 1, MAX_CHILDREN_LIMIT)?;
    bound("max_agents", o.max_agents, 2, MAX_AGENTS_LIMIT)?;
    let enabled = configured(tools);
    if let Some(names) = &o.default_tools {
        tool_set(names, &enabled, "orchestration.default_tools")?;
    }
    for (agent, names) in &o.agents {
        tool_set(names, &enabled, &format!("orchestration.agents.{agent}"))?;
    }
    Ok(())
}

/// The runtime's policy: `None` when no orchestration tool is configured.
pub fn policy(section: Option<&OrchestrationConfig>, tools: &[ToolConfig]) -> Option<Orchestration> {
    let enabled = configured(tools);
    if enabled.is_empty() {
        return None;
    }
    let defaults = OrchestrationConfig::default();
    let o = section.unwrap_or(&defaults);
    // Validated: every name is an enabled orchestration tool.
    let set = |names: &[String]| tool_set(names, &enabled, "").unwrap_or_default();
    Some(Orchestration {
        default_grant: o.default_tools.as_deref().map_or_else(|| enabled.clone(), set),
        grants: o
            .agents
            .iter()
            .map(|(a, names)| (a.clone(), set(names)))
            .collect(),
        enabled,
        max_depth: o.max_depth,
        max_children: o.max_children,
        max_agents: o.max_agents,
    })
}

/// Whether `serve` wakes agents with pending messages: as the section
/// says, else whenever the model can send messages.
pub fn wakes(section: Option<&OrchestrationConfig>, tools: &[ToolConfig]) -> bool {
    match section {
        Some(o) => o.wake,
        None => configured(tools).contains(&OrchestrationTool::SendMessage),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{Config, ConfigError};
    use super::*;

    fn parse(extra: &str) -> Result<Config, ConfigError> {
        let text = format!(
            "[provider]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n\n[[tools]]\nkind = \"spawn_agent\"\n[[tools]]\nkind = \"send_message\"\n\n{extra}"
        );
        Config::parse(Path::new("/etc/agent.toml"), &text)
    }

    fn invalid_key(extra: &str) -> String {
        match parse(extra) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected an invalid key, got {other:?}"),
        }
    }

    #[test]
    fn limits_out_of_bounds_are_refused_naming_the_key() {
        assert_eq!(
            invalid_key("[orchestration]\nmax_depth = 0\n"),
            "orchestration.max_depth"
        );
        assert_eq!(
            invalid_key("[orchestration]\nmax_children = 100000\n"),
            "orchestration.max_children"
        );
        assert_eq!(
            invalid_key("[orchestration]\nmax_agents = 1\n"),
            "orchestration.max_agents"
        );
    }

    #[test]
    fn grants_may_name_only_configured_orchestration_tools() {
        assert_eq!(
            invalid_key("[orchestration]\nagents = { boss = [\"list_agents\"] }\n"),
            "orchestration.agents.boss"
        );
        assert_eq!(
            invalid_key("[orchestration]\ndefault_tools = [\"read_file\"]\n"),
            "orchestration.default_tools"
        );
    }

    #[test]
    fn the_policy_grants_what_the_section_says_and_every_configured_tool_by_default() {
        let config = parse("[orchestration]\nmax_depth = 3\ndefault_tools = [\"send_message\"]\nagents = { boss = [\"spawn_agent\", \"send_message\"] }\n")
            .expect("valid");
        let policy = config.orchestration_policy().expect("enabled");
        assert_eq!(policy.max_depth, 3);
        assert!(policy.granted("boss", OrchestrationTool::SpawnAgent));
        assert!(!policy.granted("worker", OrchestrationTool::SpawnAgent));
        assert!(policy.granted("worker", OrchestrationTool::SendMessage));
        assert!(config.wakes_agents());
        let bare = parse("").expect("valid");
        let policy = bare.orchestration_policy().expect("enabled by the tools alone");
        assert_eq!(policy.default_grant.len(), 2);
        assert_eq!(policy.max_depth, 2);
    }
}
