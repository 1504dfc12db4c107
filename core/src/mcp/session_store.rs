//! Where initialize-era MCP sessions live: the [`McpSessionStore`] trait.
//!
//! "Session" means three things in graph-relay: a *Graph session* (a saved
//! Graph shared from a desktop, [`crate::session`]), the per-connection
//! [`McpSession`] state of an initialize-era client, and the table of those
//! states a transport keeps under their `MCP-Session-Id`. This module is
//! the third: the table, as a trait, so that several servers behind a load
//! balancer can share it (the Postgres store implements it; the HTTP
//! transport's in-memory table is the default).
//!
//! The contract every store keeps is on the trait.

use std::time::Duration;

use async_trait::async_trait;

use super::{Caller, MAX_INITIALIZE_FIELD_BYTES, McpSession};
use crate::ids::{AgentId, OwnerId};
use crate::store::StoreError;
use crate::time::Timestamp;

/// Default of [`McpSessionLimits::max_sessions`].
pub const DEFAULT_MAX_SESSIONS: usize = 10_000;
/// Default of [`McpSessionLimits::max_sessions_per_agent`].
pub const DEFAULT_MAX_SESSIONS_PER_AGENT: usize = 100;
/// Default of [`McpSessionLimits::idle_timeout`]: one hour.
pub const DEFAULT_SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Most bytes of one stored [`McpSession`] ([`McpSession::to_state`]):
/// its `clientInfo` (at most [`MAX_INITIALIZE_FIELD_BYTES`] of compact
/// JSON, which escaping as a JSON string at most doubles) and a few fields.
pub const MAX_MCP_SESSION_STATE_BYTES: usize = 2 * MAX_INITIALIZE_FIELD_BYTES + 256;

/// Bounds on live initialize-era sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpSessionLimits {
    /// Most live sessions in all (default 10,000). At the bound an agent
    /// without sessions is refused; no agent evicts another's.
    pub max_sessions: usize,
    /// Most live sessions of one agent (default 100); its least recently
    /// used one is evicted beyond.
    pub max_sessions_per_agent: usize,
    /// A session unused this long is forgotten (its client gets 404 and re-initializes).
    pub idle_timeout: Duration,
}

impl McpSessionLimits {
    /// How stale a stored last-use time may be: a tenth of the idle
    /// timeout (at least a millisecond). A store may skip writing the last
    /// use of a session whose recorded last use is more recent than this,
    /// so a session may expire up to this much earlier than `idle_timeout`
    /// after its true last use, never later.
    pub fn last_use_precision(&self) -> Duration {
        (self.idle_timeout / 10).max(Duration::from_millis(1))
    }
}

impl Default for McpSessionLimits {
    fn default() -> Self {
        Self {
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_sessions_per_agent: DEFAULT_MAX_SESSIONS_PER_AGENT,
            idle_timeout: DEFAULT_SESSION_IDLE_TIMEOUT,
        }
    }
}

/// Who may use a session: the agent as authenticated when the session was
/// made (its identity, projects and scopes, for the revocation check) and
/// the SHA-256 of its token. Look-ups compare the agent's (owner, name) and
/// the token hash, never the scopes: the request's own credentials decide
/// what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpSessionOwner {
    /// The agent and the scopes its token granted.
    pub caller: Caller,
    /// SHA-256 (hex) of the token; `None` for an anonymous caller.
    pub token_sha256: Option<String>,
}

impl McpSessionOwner {
    /// The agent's owner.
    pub fn owner(&self) -> &OwnerId {
        &self.caller.agent.owner
    }

    /// The agent's name.
    pub fn agent(&self) -> &AgentId {
        &self.caller.agent.id
    }

    /// True when `other` may use this owner's sessions: the same (owner,
    /// agent) and the same token.
    pub fn same_holder(&self, other: &McpSessionOwner) -> bool {
        self.owner() == other.owner()
            && self.agent() == other.agent()
            && self.token_sha256 == other.token_sha256
    }
}

/// The global bound is reached and the agent has no session to give up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the server holds its maximum of {limit} sessions; retry later or use protocol 2026-07-28, which needs none"
)]
pub struct McpSessionsFull {
    /// [`McpSessionLimits::max_sessions`].
    pub limit: usize,
}

/// Why [`McpSessionStore::create`] stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum McpSessionCreateError {
    /// The global bound is reached (answered 503, `-32004`).
    #[error(transparent)]
    Full(#[from] McpSessionsFull),
    /// The state is longer than [`MAX_MCP_SESSION_STATE_BYTES`].
    #[error("the session state is {bytes} bytes, more than the {limit} a session may keep")]
    TooLarge {
        /// Its length.
        bytes: usize,
        /// [`MAX_MCP_SESSION_STATE_BYTES`].
        limit: usize,
    },
    /// The backend failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a store holds, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct McpSessionFigures {
    /// Live sessions.
    pub sessions: usize,
    /// Bytes of client data they keep ([`McpSession::retained_bytes`]).
    pub bytes: usize,
}

/// The table of initialize-era sessions: `MCP-Session-Id` → [`McpSession`].
/// The contract every implementation keeps is below;
/// the conformance functions in `graph_relay_core::testkit::mcp_sessions`
/// (feature `testkit`) check it.
///
/// Ids are made by the caller (unguessable, e.g. 256 random bits as hex) and
/// are opaque to the store.
///
/// # Contract
/// - A session belongs to one agent, (owner, name), and to the token that
///   created it ([`McpSessionOwner`]). Every look-up is keyed by the id
///   *and* the agent *and* the token's hash: another agent's or another
///   token's id finds nothing, exactly like an unknown one.
/// - At most [`McpSessionLimits::max_sessions_per_agent`] per agent: a new
///   one beyond evicts that agent's least recently used session, never
///   another agent's.
/// - At most [`McpSessionLimits::max_sessions`] in all: at the bound an
///   agent with sessions of its own evicts its least recently used one, and
///   an agent without any is refused ([`McpSessionsFull`]), evicting no one.
/// - Bytes: a stored state is at most [`MAX_MCP_SESSION_STATE_BYTES`]
///   (larger ones are refused), so a store holds at most `max_sessions`
///   times that.
/// - A session unused for [`McpSessionLimits::idle_timeout`] is never
///   served again, and is deleted by [`McpSessionStore::sweep`] (a bounded
///   step) or by the look-up that finds it expired. Stores may record the
///   last use coarsely (see [`McpSessionStore::get`]).
/// - Time is an input: every method that needs it takes `now`.
#[async_trait]
pub trait McpSessionStore: Send + Sync {
    /// Stores a new session `id` of `owner`, evicting the agent's least
    /// recently used session when a bound requires it.
    async fn create(
        &self,
        id: &str,
        owner: &McpSessionOwner,
        session: &McpSession,
        limits: &McpSessionLimits,
        now: Timestamp,
    ) -> Result<(), McpSessionCreateError>;

    /// The session `id` of `owner`, and records its use at `now`. `None`
    /// for an unknown id, another agent's or another token's, and an
    /// expired one (which is deleted). The recorded last use may lag by up
    /// to [`McpSessionLimits::last_use_precision`] when the store spares
    /// itself a write.
    async fn get(
        &self,
        id: &str,
        owner: &McpSessionOwner,
        limits: &McpSessionLimits,
        now: Timestamp,
    ) -> Result<Option<McpSession>, StoreError>;

    /// Replaces the state of the session `id` of `owner`, if it still
    /// exists. A state longer than [`MAX_MCP_SESSION_STATE_BYTES`] is not
    /// kept (the session keeps its previous state).
    async fn put(
        &self,
        id: &str,
        owner: &McpSessionOwner,
        session: &McpSession,
    ) -> Result<(), StoreError>;

    /// Ends the session `id` of `owner`; false when there was none.
    async fn delete(&self, id: &str, owner: &McpSessionOwner) -> Result<bool, StoreError>;

    /// The distinct owners (agent as authenticated, token) that hold
    /// sessions made with a token, for the revocation check: at most
    /// `limit` of them.
    async fn holders(&self, limit: usize) -> Result<Vec<McpSessionOwner>, StoreError>;

    /// Ends every session held by exactly `holder` (the same agent, token
    /// and scopes); returns how many ended.
    async fn end_holder(&self, holder: &McpSessionOwner) -> Result<usize, StoreError>;

    /// Deletes sessions idle for `limits.idle_timeout` at `now`, at most a
    /// bounded batch per call; returns how many went.
    async fn sweep(&self, limits: &McpSessionLimits, now: Timestamp) -> Result<usize, StoreError>;

    /// What the store holds, as far as it knows without IO (a shared store
    /// reports what its last [`sweep`](Self::sweep) counted).
    fn figures(&self) -> McpSessionFigures;
}
