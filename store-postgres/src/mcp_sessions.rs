//! [`PostgresMcpSessionStore`]: initialize-era MCP sessions in the queue's
//! database, so that every server of a cluster serves every session.
//!
//! One row of `mcp_sessions` per `MCP-Session-Id`: the agent (owner,
//! agent), the SHA-256 of the token that made it, the projects and scopes
//! that token granted (`granted`, for the revocation check), the
//! [`McpSession`] as JSON (`state`, at most
//! [`MAX_MCP_SESSION_STATE_BYTES`](graph_relay_core::mcp::MAX_MCP_SESSION_STATE_BYTES)), and the creation and last-use times
//! in milliseconds.
//!
//! - **Keyed by holder.** Every look-up, update and delete matches the id
//!   *and* (owner, agent) *and* the token hash, so another agent's or
//!   another token's id finds nothing, as an unknown one.
//! - **Bounds.** Creates take one transaction-scoped advisory lock, so the
//!   per-agent bound (the agent's least recently used sessions go first)
//!   and the global bound (an agent without sessions is refused, evicting
//!   no one) hold exactly across servers. Initializes are rare; the lock
//!   is held for three short statements.
//! - **Last use without a write per request.** A look-up is one statement
//!   that reads the row and moves `used_at` only when the stored value is
//!   older than [`McpSessionLimits::last_use_precision`] (a tenth of the
//!   idle timeout): a session in steady use costs about ten writes per idle
//!   timeout, not one per request. So `used_at` lags the true last use by
//!   at most that much: a session may expire up to a tenth of the idle
//!   timeout early, never late, and least-recently-used eviction is exact
//!   to that precision.
//! - **Expiry.** A row idle for the timeout is never served: the look-up
//!   that finds it deletes it, and [`McpSessionStore::sweep`] (the server
//!   runs it every ten seconds) deletes up to [`SWEEP_BATCH`] expired rows
//!   per call, claimed with `FOR UPDATE SKIP LOCKED` so servers sweeping
//!   at once never wait on each other. Creates also sweep one batch first.
//! - **Ending.** `DELETE /mcp` deletes the row: it is gone for every
//!   server. A revoked token's rows are deleted by the revocation watch of
//!   any server whose authenticator no longer accepts the token
//!   ([`McpSessionStore::end_holder`]); meanwhile every server refuses the
//!   token itself, so nothing is served from them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use graph_relay_core::ids::{AgentId, OwnerId, ProjectId};
use graph_relay_core::mcp::{
    Caller, McpSession, McpSessionCreateError, McpSessionFigures, McpSessionLimits,
    McpSessionOwner, McpSessionStore, McpSessionsFull,
};
use graph_relay_core::principal::Agent;
use graph_relay_core::store::StoreError;
use graph_relay_core::time::Timestamp;
use serde::{Deserialize, Serialize};

use crate::PostgresStore;
use crate::rows::{backend, millis};

/// Most expired rows one [`McpSessionStore::sweep`] (or create) deletes.
pub const SWEEP_BATCH: i64 = 1000;

/// Key of the advisory lock held while a session is created ("GRly" and 2).
const CREATE_LOCK: i64 = 0x4752_6c79_0000_0002;

/// The initialize-era session table on Postgres, in the schema of the
/// [`PostgresStore`] it was made from (same pool). See the module docs.
#[derive(Clone)]
pub struct PostgresMcpSessionStore {
    store: PostgresStore,
    /// Live sessions and their client bytes, as counted by the last sweep.
    figures: Arc<(AtomicUsize, AtomicUsize)>,
}

impl std::fmt::Debug for PostgresMcpSessionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresMcpSessionStore")
            .field("store", &self.store)
            .field("figures", &self.figures())
            .finish()
    }
}

/// What a token granted when the session was made, as stored in `granted`.
#[derive(Serialize, Deserialize)]
struct Granted {
    projects: BTreeSet<ProjectId>,
    scopes: BTreeSet<String>,
}

fn granted(owner: &McpSessionOwner) -> Result<String, StoreError> {
    serde_json::to_string(&Granted {
        projects: owner.caller.agent.projects.clone(),
        scopes: (*owner.caller.scopes).clone(),
    })
    .map_err(|e| StoreError::Backend(e.to_string()))
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("mcp_sessions: {what}"))
}

fn cutoff(now: Timestamp, limits: &McpSessionLimits) -> Result<i64, StoreError> {
    millis(now.minus(limits.idle_timeout))
}

impl PostgresMcpSessionStore {
    /// Sessions in `store`'s database and schema (its migrations made the table).
    pub fn new(store: &PostgresStore) -> Self {
        Self {
            store: store.clone(),
            figures: Arc::default(),
        }
    }

    /// Counts the live sessions into the figures.
    async fn count(&self, cutoff: i64) -> Result<(), StoreError> {
        let client = self.store.client().await?;
        self.store.sent(1);
        let row = client
            .query_one(
                "SELECT count(*), COALESCE(sum(client_bytes), 0)::BIGINT
                 FROM mcp_sessions WHERE used_at > $1",
                &[&cutoff],
            )
            .await
            .map_err(backend)?;
        let (n, bytes): (i64, i64) = (row.get(0), row.get(1));
        self.figures
            .0
            .store(usize::try_from(n).unwrap_or(0), Ordering::Relaxed);
        self.figures
            .1
            .store(usize::try_from(bytes).unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }
}

impl PostgresMcpSessionStore {
    /// Makes room in `tx` for a new session of `agent` (owner, agent):
    /// takes the creates' lock, sweeps one batch of expired sessions, and
    /// evicts as many of the agent's own least recently used sessions as
    /// both bounds of `limits` need, refusing when the agent has too few.
    /// Counts only the eviction; the caller counts the lock, the sweep and
    /// the count.
    async fn make_room(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        (o, a): (&str, &str),
        cutoff: i64,
        limits: &McpSessionLimits,
    ) -> Result<(), McpSessionCreateError> {
        let max_own = i64::try_from(limits.max_sessions_per_agent.max(1)).unwrap_or(i64::MAX);
        let max_total = i64::try_from(limits.max_sessions.max(1)).unwrap_or(i64::MAX);
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK])
            .await
            .map_err(backend)?;
        tx.execute(SWEEP, &[&cutoff, &SWEEP_BATCH])
            .await
            .map_err(backend)?;
        let counts = tx
            .query_one(
                "SELECT count(*) FILTER (WHERE owner = $1 AND agent = $2), count(*)
                 FROM mcp_sessions WHERE used_at > $3",
                &[&o, &a, &cutoff],
            )
            .await
            .map_err(backend)?;
        let (own, total): (i64, i64) = (counts.get(0), counts.get(1));
        // How many of the agent's own sessions must go for both bounds.
        let evict = (own - max_own + 1).max(total - max_total + 1).max(0);
        if evict > own {
            // Only ever the agent's own sessions; it has too few to make room.
            return Err(McpSessionsFull {
                limit: limits.max_sessions,
            }
            .into());
        }
        if evict > 0 {
            self.store.sent(1);
            tx.execute(
                "DELETE FROM mcp_sessions WHERE id IN (
                     SELECT id FROM mcp_sessions
                     WHERE owner = $1 AND agent = $2 AND used_at > $3
                     ORDER BY used_at, created_at, id LIMIT $4)",
                &[&o, &a, &cutoff, &evict],
            )
            .await
            .map_err(backend)?;
        }
        Ok(())
    }
}

impl PostgresStore {
    /// The initialize-era MCP session table in this store's database
    /// ([`PostgresMcpSessionStore`]), sharing its pool.
    pub fn mcp_session_store(&self) -> PostgresMcpSessionStore {
        PostgresMcpSessionStore::new(self)
    }
}

/// Deletes up to `$2` ([`SWEEP_BATCH`]) rows idle since `$1`.
const SWEEP: &str = "DELETE FROM mcp_sessions WHERE id IN (
        SELECT id FROM mcp_sessions WHERE used_at <= $1
        ORDER BY used_at LIMIT $2 FOR UPDATE SKIP LOCKED)";

#[async_trait]
impl McpSessionStore for PostgresMcpSessionStore {
    async fn create(
        &self,
        id: &str,
        owner: &McpSessionOwner,
        session: &McpSession,
        limits: &McpSessionLimits,
        now: Timestamp,
    ) -> Result<(), McpSessionCreateError> {
        let state = session.bounded_state()?;
        let granted = granted(owner)?;
        let client_bytes = i32::try_from(session.retained_bytes()).unwrap_or(i32::MAX);
        let (now_ms, cutoff) = (millis(now)?, cutoff(now, limits)?);
        let (o, a) = (owner.owner().as_str(), owner.agent().as_str());
        let mut client = self.store.client().await?;
        self.store.sent(1);
        let tx = client.transaction().await.map_err(backend)?;
        // The lock, the sweep, the count and the insert.
        self.store.sent(4);
        self.make_room(&tx, (o, a), cutoff, limits).await?;
        tx.execute(
            "INSERT INTO mcp_sessions
                 (id, owner, agent, token_sha256, granted, state, client_bytes, created_at, used_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
            &[
                &id,
                &o,
                &a,
                &owner.token_sha256,
                &granted,
                &state,
                &client_bytes,
                &now_ms,
            ],
        )
        .await
        .map_err(backend)?;
        self.store.sent(1);
        tx.commit().await.map_err(backend)?;
        Ok(())
    }

    async fn get(
        &self,
        id: &str,
        owner: &McpSessionOwner,
        limits: &McpSessionLimits,
        now: Timestamp,
    ) -> Result<Option<McpSession>, StoreError> {
        let now_ms = millis(now)?;
        let cutoff = cutoff(now, limits)?;
        let stale = millis(now.minus(limits.last_use_precision()))?;
        let client = self.store.client().await?;
        // One statement: read the row of this holder; move its last use
        // only when the stored one is stale; delete it when expired.
        let stmt = client
            .prepare_cached(
                "WITH hit AS (
                     SELECT id, state, used_at FROM mcp_sessions
                     WHERE id = $1 AND owner = $2 AND agent = $3
                       AND token_sha256 IS NOT DISTINCT FROM $4::TEXT),
                 touched AS (
                     UPDATE mcp_sessions AS s SET used_at = $5 FROM hit
                     WHERE s.id = hit.id AND hit.used_at > $6 AND hit.used_at <= $7
                     RETURNING s.id),
                 gone AS (
                     DELETE FROM mcp_sessions AS s USING hit
                     WHERE s.id = hit.id AND hit.used_at <= $6
                     RETURNING s.id)
                 SELECT state, used_at > $6 FROM hit",
            )
            .await
            .map_err(backend)?;
        self.store.sent(1);
        let row = client
            .query_opt(
                &stmt,
                &[
                    &id,
                    &owner.owner().as_str(),
                    &owner.agent().as_str(),
                    &owner.token_sha256,
                    &now_ms,
                    &cutoff,
                    &stale,
                ],
            )
            .await
            .map_err(backend)?;
        let Some(row) = row else {
            return Ok(None);
        };
        if !row.get::<_, bool>(1) {
            return Ok(None);
        }
        let state: String = row.get(0);
        McpSession::from_state(&state)
            .map(Some)
            .ok_or_else(|| corrupt(format!("the state of a session is not one: {state:.80}")))
    }

    async fn put(
        &self,
        id: &str,
        owner: &McpSessionOwner,
        session: &McpSession,
    ) -> Result<(), StoreError> {
        let Ok(state) = session.bounded_state() else {
            return Ok(());
        };
        let client_bytes = i32::try_from(session.retained_bytes()).unwrap_or(i32::MAX);
        let client = self.store.client().await?;
        let stmt = client
            .prepare_cached(
                "UPDATE mcp_sessions SET state = $5, client_bytes = $6
                 WHERE id = $1 AND owner = $2 AND agent = $3
                   AND token_sha256 IS NOT DISTINCT FROM $4::TEXT",
            )
            .await
            .map_err(backend)?;
        self.store.sent(1);
        client
            .execute(
                &stmt,
                &[
                    &id,
                    &owner.owner().as_str(),
                    &owner.agent().as_str(),
                    &owner.token_sha256,
                    &state,
                    &client_bytes,
                ],
            )
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn delete(&self, id: &str, owner: &McpSessionOwner) -> Result<bool, StoreError> {
        let client = self.store.client().await?;
        let stmt = client
            .prepare_cached(
                "DELETE FROM mcp_sessions
                 WHERE id = $1 AND owner = $2 AND agent = $3
                   AND token_sha256 IS NOT DISTINCT FROM $4::TEXT",
            )
            .await
            .map_err(backend)?;
        self.store.sent(1);
        let n = client
            .execute(
                &stmt,
                &[
                    &id,
                    &owner.owner().as_str(),
                    &owner.agent().as_str(),
                    &owner.token_sha256,
                ],
            )
            .await
            .map_err(backend)?;
        Ok(n > 0)
    }

    async fn holders(&self, limit: usize) -> Result<Vec<McpSessionOwner>, StoreError> {
        let client = self.store.client().await?;
        self.store.sent(1);
        let rows = client
            .query(
                "SELECT DISTINCT owner, agent, token_sha256, granted FROM mcp_sessions
                 WHERE token_sha256 IS NOT NULL LIMIT $1",
                &[&i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .await
            .map_err(backend)?;
        rows.iter()
            .map(|row| {
                let owner = OwnerId::parse(row.get(0)).map_err(corrupt)?;
                let agent = AgentId::parse(row.get(1)).map_err(corrupt)?;
                let granted: Granted =
                    serde_json::from_str(row.get(3)).map_err(|e| corrupt(e.to_string()))?;
                Ok(McpSessionOwner {
                    caller: Caller::new(Agent::new(agent, owner, granted.projects), granted.scopes),
                    token_sha256: row.get(2),
                })
            })
            .collect()
    }

    async fn end_holder(&self, holder: &McpSessionOwner) -> Result<usize, StoreError> {
        let granted = granted(holder)?;
        let client = self.store.client().await?;
        self.store.sent(1);
        let n = client
            .execute(
                "DELETE FROM mcp_sessions
                 WHERE owner = $1 AND agent = $2 AND token_sha256 = $3 AND granted = $4",
                &[
                    &holder.owner().as_str(),
                    &holder.agent().as_str(),
                    &holder.token_sha256,
                    &granted,
                ],
            )
            .await
            .map_err(backend)?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    async fn sweep(&self, limits: &McpSessionLimits, now: Timestamp) -> Result<usize, StoreError> {
        let cutoff = cutoff(now, limits)?;
        let client = self.store.client().await?;
        self.store.sent(1);
        let n = client
            .execute(SWEEP, &[&cutoff, &SWEEP_BATCH])
            .await
            .map_err(backend)?;
        drop(client);
        self.count(cutoff).await?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn figures(&self) -> McpSessionFigures {
        McpSessionFigures {
            sessions: self.figures.0.load(Ordering::Relaxed),
            bytes: self.figures.1.load(Ordering::Relaxed),
        }
    }
}
