//! The orchestrator: agents, the agent tree, inboxes, turns, the `Provider`
//! trait and tools.
