//! Initialize-era sessions: `MCP-Session-Id` → the connection's MCP state.
//!
//! A session belongs to one agent, identified by (owner, agent name), and to
//! the token that created it: a request with another agent's id, or with
//! another token of the same agent, finds nothing (404). Bounds:
//!
//! - at most [`SessionLimits::max_sessions_per_agent`] per agent; a new one
//!   beyond evicts that agent's least recently used session, never another
//!   agent's;
//! - at most [`SessionLimits::max_sessions`] in all, a backstop: when it is
//!   reached, an agent with sessions of its own evicts its oldest, and an
//!   agent without any is refused (503, `-32004`) rather than evicting
//!   someone else's;
//! - each session keeps at most `MAX_INITIALIZE_FIELD_BYTES` of client data
//!   (the core refuses larger `initialize`s);
//! - an idle session is forgotten after [`SessionLimits::idle_timeout`], and
//!   the sessions of a revoked token end as soon as the authenticator says so.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use graph_relay_core::ids::{AgentId, OwnerId};
use graph_relay_core::mcp::McpSession;

use crate::auth::{Authenticator, Principal};

/// Default of [`SessionLimits::max_sessions`].
pub const DEFAULT_MAX_SESSIONS: usize = 10_000;
/// Default of [`SessionLimits::max_sessions_per_agent`].
pub const DEFAULT_MAX_SESSIONS_PER_AGENT: usize = 100;
/// Default of [`SessionLimits::idle_timeout`]: one hour.
pub const DEFAULT_SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Bounds on live initialize-era sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLimits {
    /// Most live sessions in all (default 10,000). At the bound an agent
    /// without sessions is refused; no agent evicts another's.
    pub max_sessions: usize,
    /// Most live sessions of one agent (default 100); its least recently
    /// used one is evicted beyond.
    pub max_sessions_per_agent: usize,
    /// A session unused this long is forgotten (its client gets 404 and re-initializes).
    pub idle_timeout: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_sessions_per_agent: DEFAULT_MAX_SESSIONS_PER_AGENT,
            idle_timeout: DEFAULT_SESSION_IDLE_TIMEOUT,
        }
    }
}

/// An agent's identity: owner and name. A name alone is never an identity.
pub(crate) type AgentKey = (OwnerId, AgentId);

/// Who may use a session: the agent and the token that created it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionOwner {
    pub(crate) agent: AgentKey,
    pub(crate) token_sha256: Option<String>,
}

struct Entry {
    owner: SessionOwner,
    /// The principal as authenticated, for the revocation check.
    principal: Principal,
    mcp: McpSession,
    used: Instant,
}

/// What looking up a session found.
pub(crate) enum Lookup {
    /// The session's state, copied out.
    Found(McpSession),
    /// Unknown, expired, another agent's or another token's.
    NotFound,
}

/// The global bound is reached and the agent has no session to give up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the server holds its maximum of {limit} sessions; retry later or use protocol 2026-07-28, which needs none"
)]
pub(crate) struct SessionsFull {
    pub(crate) limit: usize,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Entry>,
    by_agent: HashMap<AgentKey, Vec<String>>,
    bytes: usize,
    swept: Option<Instant>,
}

impl Table {
    fn remove(&mut self, id: &str) -> Option<Entry> {
        let entry = self.by_id.remove(id)?;
        self.bytes -= entry.mcp.retained_bytes();
        if let Some(ids) = self.by_agent.get_mut(&entry.owner.agent) {
            ids.retain(|i| i != id);
            if ids.is_empty() {
                self.by_agent.remove(&entry.owner.agent);
            }
        }
        Some(entry)
    }

    /// The least recently used session of `agent`.
    fn oldest_of(&self, agent: &AgentKey) -> Option<String> {
        self.by_agent
            .get(agent)?
            .iter()
            .filter_map(|id| Some((id, self.by_id.get(id)?.used)))
            .min_by_key(|(_, used)| *used)
            .map(|(id, _)| id.clone())
    }

    fn sweep_expired(&mut self, now: Instant, idle: Duration) {
        let expired: Vec<String> = self
            .by_id
            .iter()
            .filter(|(_, e)| now.duration_since(e.used) >= idle)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.remove(&id);
        }
        self.swept = Some(now);
    }
}

pub(crate) struct Sessions {
    limits: SessionLimits,
    table: Mutex<Table>,
}

/// How often expired sessions are looked for when nothing forces it.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

impl Sessions {
    pub(crate) fn new(limits: SessionLimits) -> Self {
        Self {
            limits,
            table: Mutex::new(Table::default()),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.table.lock().map(|t| t.by_id.len()).unwrap_or(0)
    }

    pub(crate) fn retained_bytes(&self) -> usize {
        self.table.lock().map(|t| t.bytes).unwrap_or(0)
    }

    /// Stores a new session for `owner`; returns its id.
    pub(crate) fn create(
        &self,
        owner: SessionOwner,
        principal: Principal,
        mcp: McpSession,
    ) -> Result<String, SessionsFull> {
        let id = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let full = SessionsFull {
            limit: self.limits.max_sessions,
        };
        let Ok(mut table) = self.table.lock() else {
            return Err(full);
        };
        let now = Instant::now();
        let max_total = self.limits.max_sessions.max(1);
        let max_own = self.limits.max_sessions_per_agent.max(1);
        if table.by_id.len() >= max_total
            || table
                .swept
                .is_none_or(|t| now.duration_since(t) >= SWEEP_EVERY)
        {
            table.sweep_expired(now, self.limits.idle_timeout);
        }
        let own = table.by_agent.get(&owner.agent).map_or(0, Vec::len);
        if own >= max_own || table.by_id.len() >= max_total {
            // Only ever the agent's own least recently used session.
            match table.oldest_of(&owner.agent) {
                Some(oldest) => {
                    table.remove(&oldest);
                }
                None => return Err(full),
            }
        }
        table.bytes += mcp.retained_bytes();
        table
            .by_agent
            .entry(owner.agent.clone())
            .or_default()
            .push(id.clone());
        table.by_id.insert(
            id.clone(),
            Entry {
                owner,
                principal,
                mcp,
                used: now,
            },
        );
        Ok(id)
    }

    pub(crate) fn get(&self, id: &str, owner: &SessionOwner) -> Lookup {
        let Ok(mut table) = self.table.lock() else {
            return Lookup::NotFound;
        };
        match table.by_id.get_mut(id) {
            Some(e) if &e.owner == owner && e.used.elapsed() < self.limits.idle_timeout => {
                e.used = Instant::now();
                Lookup::Found(e.mcp.clone())
            }
            Some(e) if &e.owner == owner => {
                table.remove(id);
                Lookup::NotFound
            }
            _ => Lookup::NotFound,
        }
    }

    pub(crate) fn put(&self, id: &str, owner: &SessionOwner, mcp: McpSession) {
        let Ok(mut table) = self.table.lock() else {
            return;
        };
        let table = &mut *table;
        if let Some(e) = table.by_id.get_mut(id)
            && &e.owner == owner
        {
            table.bytes = table.bytes - e.mcp.retained_bytes() + mcp.retained_bytes();
            e.mcp = mcp;
        }
    }

    /// Ends a session of `owner`; false when there was none.
    pub(crate) fn remove(&self, id: &str, owner: &SessionOwner) -> bool {
        let Ok(mut table) = self.table.lock() else {
            return false;
        };
        if table.by_id.get(id).is_some_and(|e| &e.owner == owner) {
            table.remove(id);
            true
        } else {
            false
        }
    }

    /// Ends every session whose token `auth` no longer accepts as the same
    /// principal; returns how many ended.
    pub(crate) async fn end_revoked(&self, auth: &dyn Authenticator) -> usize {
        let held: Vec<(String, String, Principal)> = match self.table.lock() {
            Ok(table) => table
                .by_id
                .iter()
                .filter_map(|(id, e)| {
                    let hash = e.owner.token_sha256.clone()?;
                    Some((id.clone(), hash, e.principal.clone()))
                })
                .collect(),
            Err(_) => return 0,
        };
        let mut revoked = Vec::new();
        for (id, hash, principal) in held {
            if !auth.still_valid(&hash, &principal).await {
                revoked.push(id);
            }
        }
        let Ok(mut table) = self.table.lock() else {
            return 0;
        };
        revoked
            .iter()
            .filter(|id| table.remove(id).is_some())
            .count()
    }
}
