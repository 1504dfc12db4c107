//! Initialize-era sessions: `MCP-Session-Id` → the connection's MCP state.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use graph_relay_core::ids::AgentId;
use graph_relay_core::mcp::McpSession;

/// Bounds on live sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLimits {
    /// Most live sessions; the least recently used one is dropped beyond.
    pub max_sessions: usize,
    /// A session unused this long is forgotten (its client gets 404 and re-initializes).
    pub idle_timeout: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            max_sessions: 10_000,
            idle_timeout: Duration::from_secs(3600),
        }
    }
}

struct Entry {
    agent: AgentId,
    mcp: McpSession,
    used: Instant,
}

/// What looking up a session found.
pub(crate) enum Lookup {
    /// The session's state, copied out.
    Found(McpSession),
    /// Unknown, expired or another agent's.
    NotFound,
}

pub(crate) struct Sessions {
    limits: SessionLimits,
    map: Mutex<HashMap<String, Entry>>,
}

impl Sessions {
    pub(crate) fn new(limits: SessionLimits) -> Self {
        Self {
            limits,
            map: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Stores a new session for `agent`; returns its id.
    pub(crate) fn create(&self, agent: &AgentId, mcp: McpSession) -> String {
        let id = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let Ok(mut map) = self.map.lock() else {
            return id;
        };
        let now = Instant::now();
        map.retain(|_, e| now.duration_since(e.used) < self.limits.idle_timeout);
        if map.len() >= self.limits.max_sessions.max(1)
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            id.clone(),
            Entry {
                agent: agent.clone(),
                mcp,
                used: now,
            },
        );
        id
    }

    pub(crate) fn get(&self, id: &str, agent: &AgentId) -> Lookup {
        let Ok(mut map) = self.map.lock() else {
            return Lookup::NotFound;
        };
        match map.get_mut(id) {
            Some(e) if &e.agent == agent && e.used.elapsed() < self.limits.idle_timeout => {
                e.used = Instant::now();
                Lookup::Found(e.mcp.clone())
            }
            Some(e) if &e.agent == agent => {
                map.remove(id);
                Lookup::NotFound
            }
            _ => Lookup::NotFound,
        }
    }

    pub(crate) fn put(&self, id: &str, mcp: McpSession) {
        if let Ok(mut map) = self.map.lock()
            && let Some(e) = map.get_mut(id)
        {
            e.mcp = mcp;
        }
    }

    /// Ends a session of `agent`; false when there was none.
    pub(crate) fn remove(&self, id: &str, agent: &AgentId) -> bool {
        let Ok(mut map) = self.map.lock() else {
            return false;
        };
        if map.get(id).is_some_and(|e| &e.agent == agent) {
            map.remove(id);
            true
        } else {
            false
        }
    }
}
