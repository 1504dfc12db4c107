//! Who is calling: an agent (MCP client) or a device (relay).
//!
//! Transports authenticate a token and hand the core one of these. The core
//! trusts them as given; scopes are checked by the transport against the
//! tool catalog before the core is called.

use std::collections::BTreeSet;

use crate::ids::{AgentId, DeviceId, OwnerId, ProjectId};

/// An authenticated agent connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Agent {
    /// The principal the token belongs to; runs are filed under it.
    pub id: AgentId,
    /// The owner whose desktops and projects the agent may use.
    pub owner: OwnerId,
    /// The owner's projects this agent is connected to.
    pub projects: BTreeSet<ProjectId>,
}

impl Agent {
    /// An agent of `owner` connected to `projects`.
    pub fn new(id: AgentId, owner: OwnerId, projects: impl IntoIterator<Item = ProjectId>) -> Self {
        Self {
            id,
            owner,
            projects: projects.into_iter().collect(),
        }
    }

    /// True when the agent is connected to `project`.
    pub fn reaches(&self, project: &ProjectId) -> bool {
        self.projects.contains(project)
    }
}

/// An authenticated relay (one desktop).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Device {
    /// The desktop.
    pub id: DeviceId,
    /// Its owner: the device may sync and act only on this owner's projects.
    pub owner: OwnerId,
}

impl Device {
    /// A device of `owner`.
    pub fn new(id: DeviceId, owner: OwnerId) -> Self {
        Self { id, owner }
    }
}
