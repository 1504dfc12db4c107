//! Initialize-era sessions in this process: [`MemoryMcpSessionStore`], the
//! default [`McpSessionStore`] (`MCP-Session-Id` → the connection's MCP
//! state). For several servers behind a load balancer, give the
//! [`Server`](crate::Server) a shared store instead
//! ([`ServerBuilder::mcp_session_store`](crate::ServerBuilder::mcp_session_store),
//! e.g. the Postgres store's): a session kept here is known to this process
//! only.
//!
//! A session belongs to one agent, identified by (owner, agent name), and to
//! the token that created it: a request with another agent's id, or with
//! another token of the same agent, finds nothing (404). Bounds (the
//! trait's contract, [`graph_relay_core::mcp::McpSessionStore`]):
//!
//! - at most [`McpSessionLimits::max_sessions_per_agent`] per agent; a new one
//!   beyond evicts that agent's least recently used session, never another
//!   agent's;
//! - at most [`McpSessionLimits::max_sessions`] in all, a backstop: when it is
//!   reached, an agent with sessions of its own evicts its oldest, and an
//!   agent without any is refused (503, `-32004`) rather than evicting
//!   someone else's;
//! - each session keeps at most `MAX_INITIALIZE_FIELD_BYTES` of client data
//!   (the core refuses larger `initialize`s);
//! - an idle session is forgotten after [`McpSessionLimits::idle_timeout`], and
//!   the sessions of a revoked token end as soon as the authenticator says so.
//!
//! The last use is recorded exactly, on every look-up (it costs nothing here).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use graph_relay_core::ids::{AgentId, OwnerId};
use graph_relay_core::mcp::{
    McpSession, McpSessionCreateError, McpSessionFigures, McpSessionLimits, McpSessionOwner,
    McpSessionStore, McpSessionsFull,
};
use graph_relay_core::store::StoreError;
use graph_relay_core::time::Timestamp;

/// An agent's identity: owner and name. A name alone is never an identity.
pub(crate) type AgentKey = (OwnerId, AgentId);

fn agent_key(owner: &McpSessionOwner) -> AgentKey {
    (owner.owner().clone(), owner.agent().clone())
}

struct Entry {
    owner: McpSessionOwner,
    mcp: McpSession,
    used: Timestamp,
    /// Order of last use, to tell uses within one millisecond apart.
    used_seq: u64,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Entry>,
    by_agent: HashMap<AgentKey, Vec<String>>,
    bytes: usize,
    swept: Option<Timestamp>,
    uses: u64,
}

impl Table {
    fn remove(&mut self, id: &str) -> Option<Entry> {
        let entry = self.by_id.remove(id)?;
        self.bytes -= entry.mcp.retained_bytes();
        let key = agent_key(&entry.owner);
        if let Some(ids) = self.by_agent.get_mut(&key) {
            ids.retain(|i| i != id);
            if ids.is_empty() {
                self.by_agent.remove(&key);
            }
        }
        Some(entry)
    }

    /// The least recently used session of `agent`.
    fn oldest_of(&self, agent: &AgentKey) -> Option<String> {
        self.by_agent
            .get(agent)?
            .iter()
            .filter_map(|id| {
                let e = self.by_id.get(id)?;
                Some((id, (e.used, e.used_seq)))
            })
            .min_by_key(|(_, used)| *used)
            .map(|(id, _)| id.clone())
    }

    fn sweep_expired(&mut self, now: Timestamp, idle: Duration) -> usize {
        let expired: Vec<String> = self
            .by_id
            .iter()
            .filter(|(_, e)| now.since(e.used) >= idle)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.remove(id);
        }
        self.swept = Some(now);
        expired.len()
    }
}

/// The in-memory [`McpSessionStore`] of one process (the default).
#[derive(Default)]
pub struct MemoryMcpSessionStore {
    table: Mutex<Table>,
}

impl std::fmt::Debug for MemoryMcpSessionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryMcpSessionStore")
            .field("figures", &self.figures())
            .finish()
    }
}

/// How often expired sessions are looked for when nothing forces it.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

fn poisoned() -> StoreError {
    StoreError::Backend("the session table's lock is poisoned".into())
}

impl MemoryMcpSessionStore {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl McpSessionStore for MemoryMcpSessionStore {
    async fn create(
        &self,
        id: &str,
        owner: &McpSessionOwner,
        session: &McpSession,
        limits: &McpSessionLimits,
        now: Timestamp,
    ) -> Result<(), McpSessionCreateError> {
        session.bounded_state()?;
        let mut table = self.table.lock().map_err(|_| poisoned())?;
        let max_total = limits.max_sessions.max(1);
        let max_own = limits.max_sessions_per_agent.max(1);
        if table.by_id.len() >= max_total || table.swept.is_none_or(|t| now.since(t) >= SWEEP_EVERY)
        {
            table.sweep_expired(now, limits.idle_timeout);
        }
        let key = agent_key(owner);
        let own = table.by_agent.get(&key).map_or(0, Vec::len);
        if own >= max_own || table.by_id.len() >= max_total {
            // Only ever the agent's own least recently used session.
            match table.oldest_of(&key) {
                Some(oldest) => {
                    table.remove(&oldest);
                }
                None => {
                    return Err(McpSessionsFull {
                        limit: limits.max_sessions,
                    }
                    .into());
                }
            }
        }
        table.remove(id);
        table.uses += 1;
        let used_seq = table.uses;
        table.bytes += session.retained_bytes();
        table.by_agent.entry(key).or_default().push(id.to_owned());
        table.by_id.insert(
            id.to_owned(),
            Entry {
                owner: owner.clone(),
                mcp: session.clone(),
                used: now,
                used_seq,
            },
        );
        Ok(())
    }

    async fn get(
        &self,
        id: &str,
        owner: &McpSessionOwner,
        limits: &McpSessionLimits,
        now: Timestamp,
    ) -> Result<Option<McpSession>, StoreError> {
        let mut table = self.table.lock().map_err(|_| poisoned())?;
        let table = &mut *table;
        table.uses += 1;
        match table.by_id.get_mut(id) {
            Some(e) if e.owner.same_holder(owner) && now.since(e.used) < limits.idle_timeout => {
                e.used = e.used.max(now);
                e.used_seq = table.uses;
                Ok(Some(e.mcp.clone()))
            }
            Some(e) if e.owner.same_holder(owner) => {
                table.remove(id);
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    async fn put(
        &self,
        id: &str,
        owner: &McpSessionOwner,
        session: &McpSession,
    ) -> Result<(), StoreError> {
        if session.bounded_state().is_err() {
            return Ok(());
        }
        let mut table = self.table.lock().map_err(|_| poisoned())?;
        let table = &mut *table;
        if let Some(e) = table.by_id.get_mut(id)
            && e.owner.same_holder(owner)
        {
            table.bytes = table.bytes - e.mcp.retained_bytes() + session.retained_bytes();
            e.mcp = session.clone();
        }
        Ok(())
    }

    async fn delete(&self, id: &str, owner: &McpSessionOwner) -> Result<bool, StoreError> {
        let mut table = self.table.lock().map_err(|_| poisoned())?;
        if table
            .by_id
            .get(id)
            .is_some_and(|e| e.owner.same_holder(owner))
        {
            table.remove(id);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    async fn holders(&self, limit: usize) -> Result<Vec<McpSessionOwner>, StoreError> {
        let table = self.table.lock().map_err(|_| poisoned())?;
        let mut holders: Vec<McpSessionOwner> = Vec::new();
        for e in table.by_id.values() {
            if holders.len() >= limit {
                break;
            }
            if e.owner.token_sha256.is_some() && !holders.contains(&e.owner) {
                holders.push(e.owner.clone());
            }
        }
        Ok(holders)
    }

    async fn end_holder(&self, holder: &McpSessionOwner) -> Result<usize, StoreError> {
        let mut table = self.table.lock().map_err(|_| poisoned())?;
        let ids: Vec<String> = table
            .by_agent
            .get(&agent_key(holder))
            .map(|ids| {
                ids.iter()
                    .filter(|id| table.by_id.get(*id).is_some_and(|e| &e.owner == holder))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for id in &ids {
            table.remove(id);
        }
        Ok(ids.len())
    }

    async fn sweep(&self, limits: &McpSessionLimits, now: Timestamp) -> Result<usize, StoreError> {
        let mut table = self.table.lock().map_err(|_| poisoned())?;
        Ok(table.sweep_expired(now, limits.idle_timeout))
    }

    fn figures(&self) -> McpSessionFigures {
        self.table
            .lock()
            .map(|t| McpSessionFigures {
                sessions: t.by_id.len(),
                bytes: t.bytes,
            })
            .unwrap_or_default()
    }
}
