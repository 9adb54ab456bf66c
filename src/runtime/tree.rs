//! The in-memory agent tree.
//!
//! Invariant: every node's parent is in the tree and lists it as a child;
//! removal of a node with children is refused (callers terminate leaves
//! first), so the tree never has orphans or dangling parent links.

use std::collections::{BTreeMap, BTreeSet};

use super::ids::AgentId;

/// One agent in the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentNode {
    pub name: String,
    pub parent: Option<AgentId>,
    pub children: BTreeSet<AgentId>,
}

/// A tree operation broke the invariant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("agent {0} is already in the tree")]
    Duplicate(AgentId),
    #[error("agent {0} is not in the tree")]
    Unknown(AgentId),
    #[error("agent {agent} has {count} live children: terminate them first")]
    HasChildren { agent: AgentId, count: usize },
}

/// Parent/child links of the live agents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentTree {
    nodes: BTreeMap<AgentId, AgentNode>,
}

impl AgentTree {
    /// Add a node under `parent` (which must exist) or as a root.
    pub fn add(&mut self, id: AgentId, name: String, parent: Option<AgentId>) -> Result<(), TreeError> {
        if self.nodes.contains_key(&id) {
            return Err(TreeError::Duplicate(id));
        }
        if let Some(p) = &parent {
            let node = self
                .nodes
                .get_mut(p)
                .ok_or_else(|| TreeError::Unknown(p.clone()))?;
            node.children.insert(id.clone());
        }
        let node = AgentNode {
            name,
            parent,
            children: BTreeSet::new(),
        };
        self.nodes.insert(id, node);
        Ok(())
    }

    /// Remove a leaf.
    pub fn remove(&mut self, id: &AgentId) -> Result<AgentNode, TreeError> {
        let node = self.nodes.get(id).ok_or_else(|| TreeError::Unknown(id.clone()))?;
        if !node.children.is_empty() {
            return Err(TreeError::HasChildren {
                agent: id.clone(),
                count: node.children.len(),
            });
        }
        let node = self
            .nodes
            .remove(id)
            .ok_or_else(|| TreeError::Unknown(id.clone()))?;
        if let Some(p) = &node.parent {
            if let Some(parent) = self.nodes.get_mut(p) {
                parent.children.remove(id);
            }
        }
        Ok(node)
    }

    pub fn get(&self, id: &AgentId) -> Option<&AgentNode> {
        self.nodes.get(id)
    }

    pub fn contains(&self, id: &AgentId) -> bool {
        self.nodes.contains_key(id)
    }

    /// All nodes, by id.
    pub fn nodes(&self) -> &BTreeMap<AgentId, AgentNode> {
        &self.nodes
    }

    /// Check the invariant; returns a description of each violation.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (id, node) in &self.nodes {
            if let Some(p) = &node.parent {
                match self.nodes.get(p) {
                    None => out.push(format!("agent {id} has dangling parent {p}")),
                    Some(pn) if !pn.children.contains(id) => {
                        out.push(format!("agent {id} is missing from its parent {p}'s children"))
                    }
                    Some(_) => {}
                }
            }
            for c in &node.children {
                match self.nodes.get(c) {
                    None => out.push(format!("agent {id} lists missing child {c}")),
                    Some(cn) if cn.parent.as_ref() != Some(id) => {
                        out.push(format!("child {c} of {id} names another parent"))
                    }
                    Some(_) => {}
                }
            }
        }
        out
    }
}
