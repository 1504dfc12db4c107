//! [`PostgresStore`]: the queue's [`Store`] on PostgreSQL.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use graph_relay_core::command::CommandRecord;
use graph_relay_core::ids::{
    AgentId, CommandId, DeviceId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId,
};
use graph_relay_core::session::{SessionMeta, SharedSession};
use graph_relay_core::signals::Signals;
use graph_relay_core::store::{
    DeviceContact, DeviceRecord, DeviceTouch, GuardedInsert, IdempotencyRecord, InsertOutcome,
    PruneReport, PruneRequest, Store, StoreError, shared_as_built,
};
use graph_relay_core::time::Timestamp;
use tokio_postgres::NoTls;

use crate::batch::reads::{CommandLookup, QueuedLookup, Reader, SessionLookup};
use crate::batch::writes::{CommandUpdate, NewCommand, ShareGuard, Writer};
use crate::errors::{ConnectError, DropSchemaError, describe, pool_error};
use crate::rows::{
    StatementCounter, backend, command_columns, corrupt, decode_command, decode_session, millis,
    timestamp,
};
use crate::schema;
use crate::signal_bridge::SignalBridge;

/// How to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    /// The Postgres schema holding the tables: created if missing and put
    /// first on the `search_path` of every connection (the pool's and the
    /// wake-up listener's). `None` uses the connection's own `search_path`.
    /// A plain lowercase identifier: `[a-z_][a-z0-9_]*`, at most 63 bytes.
    pub schema: Option<String>,
    /// Most connections in the pool (16). The durable writes (see the crate
    /// docs) run one batch at a time, the look-ups at most two statements
    /// at once, one with a pool of fewer than 8.
    pub pool_size: usize,
    /// Longest wait for a new connection (5 s).
    pub connect_timeout: Duration,
    /// `application_name` of the connections, shown in `pg_stat_activity`.
    pub application_name: String,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            schema: None,
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            application_name: "graph-relay".into(),
        }
    }
}

/// A durable [`Store`] in one Postgres schema, over a connection pool. See
/// the crate docs for the design. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    config: tokio_postgres::Config,
    schema: Option<String>,
    /// SQL statements sent by the [`Store`] methods (see
    /// [`PostgresStore::statements_executed`]); shared by the clones.
    statements: StatementCounter,
    /// The group-commit writer of inserts and compare-and-swaps, gathered
    /// together; shared by the clones.
    writer: Arc<Writer>,
    /// The batched look-ups of commands and shared sessions; shared by the
    /// clones.
    reader: Arc<Reader>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the config: it may hold a password.
        f.debug_struct("PostgresStore")
            .field("schema", &self.schema)
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user@host:port/db?…` or the key=value
    /// form) without TLS, creates the schema if asked, and migrates it.
    /// Must be called inside a Tokio runtime, which then drives the pool's
    /// connections.
    pub async fn connect(url: &str, options: &PostgresOptions) -> Result<Self, ConnectError> {
        let config =
            tokio_postgres::Config::from_str(url).map_err(|e| ConnectError::Url(describe(&e)))?;
        Self::connect_config(config, options).await
    }

    /// As [`connect`](Self::connect), from a parsed configuration.
    pub async fn connect_config(
        mut config: tokio_postgres::Config,
        options: &PostgresOptions,
    ) -> Result<Self, ConnectError> {
        if let Some(schema) = &options.schema {
            if !is_identifier(schema) {
                return Err(ConnectError::InvalidSchema(schema.clone()));
            }
            let search_path = format!("-c search_path={schema}");
            let merged = match config.get_options() {
                Some(existing) if !existing.trim().is_empty() => {
                    format!("{existing} {search_path}")
                }
                _ => search_path,
            };
            config.options(&merged);
        }
        config.application_name(&options.application_name);
        config.connect_timeout(options.connect_timeout);
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .build()
            .map_err(|e| ConnectError::Connect(e.to_string()))?;
        Self::from_pool(pool, config, options.schema.clone()).await
    }

    /// Wraps a pool built elsewhere (e.g. with TLS): migrates `schema` (or
    /// the connections' `search_path` when `None`). `config` is what the
    /// wake-up listener connects with; it must reach the same database.
    pub async fn from_pool(
        pool: Pool,
        config: tokio_postgres::Config,
        schema: Option<String>,
    ) -> Result<Self, ConnectError> {
        if let Some(s) = &schema
            && !is_identifier(s)
        {
            return Err(ConnectError::InvalidSchema(s.clone()));
        }
        let mut client = pool
            .get()
            .await
            .map_err(|e| ConnectError::Connect(pool_error(&e)))?;
        let applied = schema::migrate(&mut client, schema.as_deref()).await?;
        if !applied.is_empty() {
            tracing::info!(?applied, schema = ?schema, "postgres store: migrations applied");
        }
        let statements = StatementCounter::default();
        let lanes = crate::batch::lanes(pool.status().max_size);
        Ok(Self {
            writer: Arc::new(Writer::new(
                pool.clone(),
                statements.clone(),
                crate::batch::WRITE_LANES,
            )),
            reader: Arc::new(Reader::new(pool.clone(), statements.clone(), lanes)),
            pool,
            config,
            schema,
            statements,
        })
    }

    /// The schema given at connection, if any.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// SQL statements this store (and its clones) sent since it connected:
    /// every query and execute of its [`Store`] methods and of
    /// [`command_count`](Self::command_count), each counted once when it is
    /// sent (whether or not it succeeds), with a transaction's `BEGIN` and
    /// `COMMIT` counted as one statement each. Requests gathered into one
    /// batch (see the crate docs) share its statement: a batch counts once,
    /// however many requests it answers, and a batch the server refused
    /// counts once more for each request run again alone. Not counted: the
    /// migrations run by [`connect`](Self::connect), the one-off preparation
    /// of a statement on a pooled connection (each connection prepares each
    /// statement once and caches it), queries run on [`pool`](Self::pool)
    /// by others, and the wake-up listener's own connection (see
    /// [`SignalStats`](crate::SignalStats)). A relaxed atomic counter: cheap
    /// enough to leave on, meant for tests, benchmarks and metrics.
    pub fn statements_executed(&self) -> u64 {
        self.statements.get()
    }

    /// Counts `n` statements about to be sent.
    pub(crate) fn sent(&self, n: u64) {
        self.statements.sent(n);
    }

    /// The pool (for metrics, or for running admin queries in the same schema).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Cross-instance wake-ups for `signals` on this store's database,
    /// without TLS. See [`SignalBridge`].
    pub fn signal_bridge(&self, signals: Arc<Signals>) -> SignalBridge<NoTls> {
        SignalBridge::new(self.config.clone(), NoTls, signals)
    }

    /// Number of commands stored, in every state.
    pub async fn command_count(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        self.sent(1);
        let row = client
            .query_one("SELECT count(*) FROM commands", &[])
            .await
            .map_err(backend)?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }

    /// Drops `schema` with everything in it (`DROP SCHEMA … CASCADE`), e.g.
    /// a test's throw-away schema. Missing is fine.
    pub async fn drop_schema(url: &str, schema: &str) -> Result<(), DropSchemaError> {
        if !is_identifier(schema) {
            return Err(DropSchemaError::InvalidSchema(schema.to_owned()));
        }
        let config = tokio_postgres::Config::from_str(url)
            .map_err(|e| DropSchemaError::Url(describe(&e)))?;
        let (client, connection) = config
            .connect(NoTls)
            .await
            .map_err(|e| DropSchemaError::Postgres(describe(&e)))?;
        let driver = tokio::spawn(connection);
        let outcome = client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await
            .map_err(|e| DropSchemaError::Postgres(describe(&e)));
        drop(client);
        let _ = driver.await;
        outcome
    }

    /// `sql` prepared on `client` (cached per connection) and counted as
    /// one statement sent ([`Self::sent`]): the step before every single
    /// statement this store runs.
    pub(crate) async fn statement(
        &self,
        client: &deadpool_postgres::Object,
        sql: &str,
    ) -> Result<tokio_postgres::Statement, StoreError> {
        let stmt = client.prepare_cached(sql).await.map_err(backend)?;
        self.sent(1);
        Ok(stmt)
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Backend(pool_error(&e)))
    }

    /// Every command `sql` selects with `params`, in its order.
    async fn commands(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<CommandRecord>, StoreError> {
        let client = self.client().await?;
        let stmt = self.statement(&client, sql).await?;
        let rows = client.query(&stmt, params).await.map_err(backend)?;
        rows.iter().map(decode_command).collect()
    }

    /// Inserts `command` with `key` ([`Store::insert_command`]); with
    /// `guard`, only while the session resolves to the command's share
    /// among those projects ([`Store::insert_command_if_shared`]).
    async fn insert(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        guard: Option<&[ProjectId]>,
        now: Timestamp,
    ) -> Result<GuardedInsert, StoreError> {
        let now = millis(now)?;
        // Committed by the writer together with the other writes waiting
        // (see the `writes` module): key and command in one statement, so
        // both or neither. A live key, or a share that changed, makes it
        // write nothing.
        //
        // A live key that blocked the insert may expire or be pruned before
        // it is read back; then the insert is simply tried again. A live
        // key is the answer whatever the share: a retry is answered from
        // its key either way. Without one, a guarded insert that wrote
        // nothing is judged by a fresh look-up of the share.
        for _ in 0..3 {
            if self.insert_once(command, key, guard, now).await? {
                return Ok(GuardedInsert::Checked(InsertOutcome::Inserted));
            }
            if let Some(existing) = self.live_key(&key.owner, &key.agent, &key.key, now).await? {
                return Ok(GuardedInsert::Checked(InsertOutcome::KeyTaken(existing)));
            }
            if let Some(projects) = guard {
                let shared = self
                    .find_shared_session(&command.owner, projects, &command.graph_session_id)
                    .await?;
                if !shared.is_some_and(|shared| shared_as_built(&shared, command)) {
                    return Ok(GuardedInsert::SessionChanged);
                }
            }
        }
        Err(StoreError::Backend(
            "an idempotency key kept changing while inserting a command".into(),
        ))
    }

    /// One try of an insert (`now` in ms): whether the writer's statement
    /// wrote it. A refusal is judged by the caller; tests call this to see
    /// the statement's own verdict, which the judging's retry would hide.
    pub(crate) async fn insert_once(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        guard: Option<&[ProjectId]>,
        now: i64,
    ) -> Result<bool, StoreError> {
        self.writer
            .insert(new_command(command, key, guard, now)?)
            .await
    }

    /// The live key for (owner, agent, key) at `now`, if any.
    async fn live_key(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        key: &IdempotencyKey,
        now: i64,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let client = self.client().await?;
        let stmt = self
            .statement(
                &client,
                "SELECT command, fingerprint, expires_at FROM idempotency_keys
                 WHERE owner = $1 AND agent = $2 AND key = $3 AND expires_at > $4",
            )
            .await?;
        let Some(row) = client
            .query_opt(
                &stmt,
                &[&owner.as_str(), &agent.as_str(), &key.as_str(), &now],
            )
            .await
            .map_err(backend)?
        else {
            return Ok(None);
        };
        Ok(Some(IdempotencyRecord {
            owner: owner.clone(),
            agent: agent.clone(),
            key: key.clone(),
            command: CommandId::from_uuid(row.try_get(0).map_err(corrupt)?),
            fingerprint: row.try_get(1).map_err(corrupt)?,
            expires_at: timestamp(row.try_get(2).map_err(corrupt)?)?,
        }))
    }
}

/// A sync as [`SYNC_IF_UNCHANGED`] records it.
struct SyncRow<'a> {
    owner: &'a OwnerId,
    project: &'a ProjectId,
    device: &'a DeviceId,
    sessions: &'a [SessionMeta],
    long_poll: bool,
    /// Its time (ms).
    stamp: i64,
}

/// Compares a sync's sessions (`$4` ids, `$5` metadata) with the stored
/// rows of (owner `$1`, project `$2`, device `$3`) and, when they are the
/// same, moves their stamps to `$6`; records the device's contact (as
/// `touch_device` does, long-polling `$7`) either way; answers whether
/// they were the same. Comparing with the stored rows, not with what this
/// process wrote last, catches a change written meanwhile through another
/// server. Its commit does not wait for the WAL flush
/// (`synchronous_commit` off for this transaction only; see "Syncs and
/// contacts commit without waiting for the disk" in the crate docs).
const SYNC_IF_UNCHANGED: &str = "WITH given AS (
        SELECT s.id, s.meta FROM unnest($4::text[], $5::text[]) AS s(id, meta)
    ), stored AS (
        SELECT graph_session_id AS id, meta FROM shared_sessions
        WHERE owner = $1 AND project = $2 AND device = $3
    ), verdict AS (
        SELECT NOT EXISTS (SELECT id, meta FROM given EXCEPT SELECT id, meta FROM stored)
           AND NOT EXISTS (SELECT id, meta FROM stored EXCEPT SELECT id, meta FROM given)
           AS unchanged
    ), stamped AS (
        UPDATE shared_sessions SET synced_at = $6
        WHERE owner = $1 AND project = $2 AND device = $3 AND synced_at < $6
          AND (SELECT unchanged FROM verdict)
        RETURNING 1
    ), touched AS (
        INSERT INTO devices AS d (owner, device, last_sync_at, last_seen_at, long_poll)
        VALUES ($1, $3, $6, $6, $7)
        ON CONFLICT (owner, device) DO UPDATE SET
           last_seen_at = GREATEST(d.last_seen_at, EXCLUDED.last_seen_at),
           last_sync_at = GREATEST(d.last_sync_at, EXCLUDED.last_sync_at),
           long_poll = EXCLUDED.long_poll
        RETURNING 1
    )
    SELECT unchanged, set_config('synchronous_commit', 'off', true) FROM verdict";

impl PostgresStore {
    /// Runs [`SYNC_IF_UNCHANGED`] for `sync`: whether its sessions were
    /// those stored (and so are recorded now).
    async fn record_unchanged_sync(&self, sync: &SyncRow<'_>) -> Result<bool, StoreError> {
        let ids: Vec<&str> = sync
            .sessions
            .iter()
            .map(|s| s.graph_session_id.as_str())
            .collect();
        let metas = encode_metas(sync.sessions)?;
        let client = self.client().await?;
        let stmt = self.statement(&client, SYNC_IF_UNCHANGED).await?;
        let row = client
            .query_one(
                &stmt,
                &[
                    &sync.owner.as_str(),
                    &sync.project.as_str(),
                    &sync.device.as_str(),
                    &ids,
                    &metas,
                    &sync.stamp,
                    &sync.long_poll,
                ],
            )
            .await
            .map_err(backend)?;
        row.try_get::<_, bool>(0).map_err(corrupt)
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn idempotency(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.live_key(owner, agent, key, millis(now)?).await
    }

    async fn insert_command(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        now: Timestamp,
    ) -> Result<InsertOutcome, StoreError> {
        self.insert(command, key, None, now).await?.unguarded()
    }

    async fn insert_command_if_shared(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        projects: &[ProjectId],
        now: Timestamp,
    ) -> Result<GuardedInsert, StoreError> {
        // The look-up is in the insert's statement (see `write_sql`): one
        // round trip and one commit for both.
        self.insert(command, key, Some(projects), now).await
    }

    async fn command_for_agent(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.reader
            .command(CommandLookup {
                id: *id.as_uuid(),
                owner: owner.as_str().to_owned(),
                agent: Some(agent.as_str().to_owned()),
                device: None,
            })
            .await
    }

    async fn command_for_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.reader
            .command(CommandLookup {
                id: *id.as_uuid(),
                owner: owner.as_str().to_owned(),
                agent: None,
                device: Some(device.as_str().to_owned()),
            })
            .await
    }

    async fn command_for_owner(
        &self,
        owner: &OwnerId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        self.reader
            .command(CommandLookup {
                id: *id.as_uuid(),
                owner: owner.as_str().to_owned(),
                agent: None,
                device: None,
            })
            .await
    }

    async fn running_commands(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.commands(
            concat!(
                "SELECT ",
                command_columns!(""),
                " FROM commands
                 WHERE owner = $1 AND device = $2 AND finished_at IS NULL AND status = 'running'
                 LIMIT $3"
            ),
            &[&owner.as_str(), &device.as_str(), &sql_limit(limit)],
        )
        .await
    }

    async fn lapsed_commands(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        self.commands(
            concat!(
                "SELECT ",
                command_columns!(""),
                " FROM commands
                 WHERE finished_at IS NULL AND status = 'running'
                   AND (lease_expires_at IS NULL OR lease_expires_at <= $1)
                 ORDER BY lease_expires_at NULLS FIRST LIMIT $2"
            ),
            &[&millis(now)?, &sql_limit(limit)],
        )
        .await
    }

    async fn update_command(&self, next: &CommandRecord) -> Result<bool, StoreError> {
        let Some(previous) = next.revision.checked_sub(1) else {
            return Ok(false);
        };
        let previous = revision(previous)?;
        let row = CommandRow::encode(next)?;
        // The compare-and-swap: a conditional update on the revision,
        // committed by the writer together with the other writes waiting.
        self.writer
            .update(CommandUpdate {
                id: *next.id.as_uuid(),
                previous,
                status: row.status,
                finished_at: row.finished_at,
                revision: row.revision,
                record: row.record,
                lease_expires_at: row.lease_expires_at,
            })
            .await
    }

    async fn queued_commands(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        // A read, not a claim: the claim is `start`, a compare-and-swap. No
        // row locks here, so a held sync re-checking on one server never
        // hides a command from a sync arriving at another.
        self.reader
            .queued(QueuedLookup {
                owner: owner.as_str().to_owned(),
                project: project.as_str().to_owned(),
                device: device.as_str().to_owned(),
                limit: sql_limit(limit),
            })
            .await
    }

    async fn replace_shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        sessions: &[SessionMeta],
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let now = millis(now)?;
        let ids: Vec<&str> = sessions
            .iter()
            .map(|s| s.graph_session_id.as_str())
            .collect();
        let metas = encode_metas(sessions)?;
        let lock_key = format!("{owner}/{project}/{device}");
        let client = self.client().await?;
        let delete = client
            .prepare_cached(
                "DELETE FROM shared_sessions WHERE owner = $1 AND project = $2 AND device = $3",
            )
            .await
            .map_err(backend)?;
        let insert = client
            .prepare_cached(
                "INSERT INTO shared_sessions (owner, project, graph_session_id, device, synced_at, meta)
                 SELECT $1, $2, s.id, $3, $4, s.meta FROM unnest($5::text[], $6::text[]) AS s(id, meta)",
            )
            .await
            .map_err(backend)?;
        let lock = client
            .prepare_cached(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0)),
                        set_config('synchronous_commit', 'off', true)",
            )
            .await
            .map_err(backend)?;
        // Two syncs of one device and project at once take turns, so the
        // second's delete sees the first's rows (no duplicate-key failure).
        // The commit does not wait for the WAL flush (see the crate docs).
        // The whole transaction is pipelined, one round trip: BEGIN, the
        // three statements and COMMIT are sent together and run in order.
        // If one of them fails, the ones after it fail too and COMMIT rolls
        // back; nothing is left open on the connection, even when this
        // future is dropped half-way (everything was sent at its first poll).
        let (o, p, d) = (owner.as_str(), project.as_str(), device.as_str());
        let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&lock_key];
        let delete_params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&o, &p, &d];
        let insert_params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
            [&o, &p, &d, &now, &ids, &metas];
        self.sent(5);
        futures::try_join!(
            client.batch_execute("BEGIN"),
            client.execute(&lock, &lock_params),
            client.execute(&delete, &delete_params),
            client.execute(&insert, &insert_params),
            client.batch_execute("COMMIT"),
        )
        .map_err(backend)?;
        Ok(())
    }

    async fn record_sync(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        sessions: &[SessionMeta],
        long_poll: bool,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        // One statement, one round trip and one commit for a sync that
        // repeats what is stored (a long-poll re-sync); only when the
        // sessions differ does the locked replacement follow.
        let sync = SyncRow {
            owner,
            project,
            device,
            sessions,
            long_poll,
            stamp: millis(now)?,
        };
        if self.record_unchanged_sync(&sync).await? {
            return Ok(());
        }
        self.replace_shared_sessions(owner, project, device, sessions, now)
            .await
    }

    async fn shared_projects(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<ProjectId>, StoreError> {
        let client = self.client().await?;
        let stmt = self
            .statement(
                &client,
                "SELECT DISTINCT project FROM shared_sessions
                 WHERE owner = $1 AND device = $2
                 ORDER BY project LIMIT $3",
            )
            .await?;
        let rows = client
            .query(
                &stmt,
                &[&owner.as_str(), &device.as_str(), &sql_limit(limit)],
            )
            .await
            .map_err(backend)?;
        rows.iter()
            .map(|row| {
                let project: &str = row.try_get(0).map_err(corrupt)?;
                ProjectId::parse(project)
                    .map_err(|e| StoreError::Corrupt(format!("shared_sessions.project: {e}")))
            })
            .collect()
    }

    async fn shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        limit: usize,
    ) -> Result<Vec<SharedSession>, StoreError> {
        let client = self.client().await?;
        let stmt = self
            .statement(
                &client,
                "SELECT project, device, synced_at, meta FROM shared_sessions
                 WHERE owner = $1 AND project = $2
                 ORDER BY graph_session_id, device LIMIT $3",
            )
            .await?;
        let rows = client
            .query(
                &stmt,
                &[&owner.as_str(), &project.as_str(), &sql_limit(limit)],
            )
            .await
            .map_err(backend)?;
        rows.iter().map(decode_session).collect()
    }

    async fn find_shared_session(
        &self,
        owner: &OwnerId,
        projects: &[ProjectId],
        id: &GraphSessionId,
    ) -> Result<Option<SharedSession>, StoreError> {
        if projects.is_empty() {
            return Ok(None);
        }
        // The first project in the given order that has it; then the
        // smallest device.
        self.reader
            .session(SessionLookup {
                owner: owner.as_str().to_owned(),
                projects: projects.iter().map(|p| p.as_str().to_owned()).collect(),
                id: id.as_str().to_owned(),
            })
            .await
    }

    async fn touch_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        contact: DeviceContact,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let now = millis(now)?;
        let (synced_at, long_poll) = match contact {
            DeviceContact::Sync { long_poll } => (Some(now), long_poll),
            DeviceContact::Other => (None, false),
        };
        let client = self.client().await?;
        // GREATEST ignores NULL: times only move forward, even when two
        // servers record contacts out of order. A contact is liveness, as
        // a sync's is: its commit does not wait for the WAL flush (see
        // "Syncs and contacts commit without waiting for the disk" in the
        // crate docs), so the start, control or result it comes before
        // waits for one flush, its own, not two in a row.
        let stmt = self
            .statement(
                &client,
                "WITH touched AS (
                    INSERT INTO devices AS d (owner, device, last_sync_at, last_seen_at, long_poll)
                    VALUES ($1, $2, $3, $4, $5)
                    ON CONFLICT (owner, device) DO UPDATE SET
                       last_seen_at = GREATEST(d.last_seen_at, EXCLUDED.last_seen_at),
                       last_sync_at = GREATEST(d.last_sync_at, EXCLUDED.last_sync_at),
                       long_poll = CASE WHEN EXCLUDED.last_sync_at IS NULL THEN d.long_poll
                                        ELSE EXCLUDED.long_poll END
                    RETURNING 1
                 )
                 SELECT set_config('synchronous_commit', 'off', true)",
            )
            .await?;
        client
            .execute(
                &stmt,
                &[
                    &owner.as_str(),
                    &device.as_str(),
                    &synced_at,
                    &now,
                    &long_poll,
                ],
            )
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn touch_devices(&self, contacts: &[DeviceTouch]) -> Result<(), StoreError> {
        if contacts.is_empty() {
            return Ok(());
        }
        let owners: Vec<&str> = contacts.iter().map(|c| c.owner.as_str()).collect();
        let devices: Vec<&str> = contacts.iter().map(|c| c.device.as_str()).collect();
        let seen = contacts
            .iter()
            .map(|c| millis(c.at))
            .collect::<Result<Vec<i64>, StoreError>>()?;
        let client = self.client().await?;
        // All of them in one statement, committed without waiting for the
        // WAL flush as a single contact is. The rows are upserted in
        // (owner, device) order, the order the queue sorts them in, so two
        // servers' batches never wait on each other in turn.
        let stmt = self
            .statement(
                &client,
                "WITH touched AS (
                    INSERT INTO devices AS d (owner, device, last_sync_at, last_seen_at, long_poll)
                    SELECT owner, device, NULL, seen, false
                    FROM unnest($1::text[], $2::text[], $3::bigint[]) AS t (owner, device, seen)
                    ORDER BY owner, device
                    ON CONFLICT (owner, device) DO UPDATE SET
                       last_seen_at = GREATEST(d.last_seen_at, EXCLUDED.last_seen_at)
                    RETURNING 1
                 )
                 SELECT set_config('synchronous_commit', 'off', true)",
            )
            .await?;
        client
            .execute(&stmt, &[&owners, &devices, &seen])
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
    ) -> Result<Option<DeviceRecord>, StoreError> {
        let client = self.client().await?;
        let stmt = self
            .statement(
                &client,
                "SELECT last_sync_at, last_seen_at, long_poll FROM devices
                 WHERE owner = $1 AND device = $2",
            )
            .await?;
        let Some(row) = client
            .query_opt(&stmt, &[&owner.as_str(), &device.as_str()])
            .await
            .map_err(backend)?
        else {
            return Ok(None);
        };
        let last_sync_at: Option<i64> = row.try_get(0).map_err(corrupt)?;
        Ok(Some(DeviceRecord {
            device: device.clone(),
            owner: owner.clone(),
            last_sync_at: last_sync_at.map(timestamp).transpose()?,
            last_seen_at: timestamp(row.try_get(1).map_err(corrupt)?)?,
            long_poll: row.try_get(2).map_err(corrupt)?,
        }))
    }

    async fn prune(&self, request: PruneRequest) -> Result<PruneReport, StoreError> {
        let now = millis(request.now)?;
        let batch = sql_limit(request.batch);
        let client = self.client().await?;
        // Each batch is claimed with FOR UPDATE SKIP LOCKED: servers pruning
        // at once delete different rows and never wait for each other.
        let keys_stmt = self
            .statement(
                &client,
                "WITH doomed AS (
                    SELECT owner, agent, key FROM idempotency_keys
                    WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2
                    FOR UPDATE SKIP LOCKED)
                 DELETE FROM idempotency_keys AS k USING doomed AS d
                 WHERE k.owner = d.owner AND k.agent = d.agent AND k.key = d.key",
            )
            .await?;
        let keys = client
            .execute(&keys_stmt, &[&now, &batch])
            .await
            .map_err(backend)?;
        let commands = match request.terminal_before {
            None => 0,
            Some(cutoff) => {
                let cutoff = millis(cutoff)?;
                // A live key pointing at a command keeps it: a replay must
                // still find it. (No new key can come to point at an old
                // command: keys are only written together with a new one.)
                let stmt = self
                    .statement(
                        &client,
                        "WITH doomed AS (
                            SELECT c.id FROM commands AS c
                            WHERE c.finished_at IS NOT NULL AND c.finished_at <= $1
                              AND c.status IN ('completed', 'failed', 'cancelled')
                              AND NOT EXISTS (
                                SELECT 1 FROM idempotency_keys AS k
                                WHERE k.owner = c.owner AND k.agent = c.agent
                                  AND k.key = c.idempotency_key
                                  AND k.command = c.id AND k.expires_at > $2)
                            ORDER BY c.finished_at LIMIT $3
                            FOR UPDATE SKIP LOCKED)
                         DELETE FROM commands WHERE id IN (SELECT id FROM doomed)",
                    )
                    .await?;
                client
                    .execute(&stmt, &[&cutoff, &now, &batch])
                    .await
                    .map_err(backend)?
            }
        };
        Ok(PruneReport {
            keys: usize::try_from(keys).unwrap_or(usize::MAX),
            commands: usize::try_from(commands).unwrap_or(usize::MAX),
        })
    }
}

/// The column values of one command.
struct CommandRow {
    agent: String,
    owner: String,
    project: String,
    device: String,
    idempotency_key: String,
    status: &'static str,
    created_at: i64,
    finished_at: Option<i64>,
    lease_expires_at: Option<i64>,
    revision: i64,
    record: String,
}

impl CommandRow {
    fn encode(c: &CommandRecord) -> Result<Self, StoreError> {
        Ok(Self {
            agent: c.agent.as_str().to_owned(),
            owner: c.owner.as_str().to_owned(),
            project: c.project.as_str().to_owned(),
            device: c.device.as_str().to_owned(),
            idempotency_key: c.idempotency_key.as_str().to_owned(),
            status: c.status.as_str(),
            created_at: millis(c.created_at)?,
            finished_at: c.finished_at.map(millis).transpose()?,
            lease_expires_at: c.lease_expires_at.map(millis).transpose()?,
            revision: revision(c.revision)?,
            // The body only: the head is in the columns above (schema 6).
            record: c
                .body_json()
                .map_err(|e| StoreError::Backend(format!("encoding command {}: {e}", c.id)))?,
        })
    }
}

/// `command` and `key` as the writer inserts them, at `now` (ms).
fn new_command(
    command: &CommandRecord,
    key: &IdempotencyRecord,
    guard: Option<&[ProjectId]>,
    now: i64,
) -> Result<NewCommand, StoreError> {
    let row = CommandRow::encode(command)?;
    let guard = guard
        .map(|projects| {
            let projects: Vec<&str> = projects.iter().map(ProjectId::as_str).collect();
            serde_json::to_string(&projects).map(|projects| {
                Box::new(ShareGuard {
                    session: command.graph_session_id.as_str().to_owned(),
                    projects,
                    slug: command.slug.to_string(),
                })
            })
        })
        .transpose()
        .map_err(|e| StoreError::Backend(format!("encoding a share guard: {e}")))?;
    Ok(NewCommand {
        id: *command.id.as_uuid(),
        owner: row.owner,
        agent: row.agent,
        key: key.key.as_str().to_owned(),
        project: row.project,
        device: row.device,
        fingerprint: key.fingerprint.clone(),
        expires_at: millis(key.expires_at)?,
        now,
        idempotency_key: row.idempotency_key,
        status: row.status,
        created_at: row.created_at,
        finished_at: row.finished_at,
        revision: row.revision,
        record: row.record,
        lease_expires_at: row.lease_expires_at,
        guard,
    })
}

/// The stored form of each session's metadata (compared as text with the
/// stored rows by [`Store::record_sync`], so always encoded here).
fn encode_metas(sessions: &[SessionMeta]) -> Result<Vec<String>, StoreError> {
    sessions
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StoreError::Backend(format!("encoding session metadata: {e}")))
}

/// `[a-z_][a-z0-9_]*`, 1 to 63 bytes: safe to splice into SQL in quotes.
pub(crate) fn is_identifier(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn revision(r: u64) -> Result<i64, StoreError> {
    i64::try_from(r).map_err(|_| StoreError::Backend(format!("revision {r} is too large")))
}

fn sql_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::is_identifier;

    #[test]
    fn schema_names_are_plain_identifiers() {
        for ok in ["graph_relay", "_x", "graph_relay_test_0123abcd"] {
            assert!(is_identifier(ok), "{ok}");
        }
        for bad in ["", "1abc", "Graph", "a-b", "a\"b", "a b", &"x".repeat(64)] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }
}
