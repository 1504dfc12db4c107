//! The schema and its migrations, tracked in `schema_migrations`.
//!
//! Migrations run in one transaction under a transaction-scoped advisory
//! lock, so two servers starting at the same moment apply each migration
//! once: the second waits, then finds them recorded. A database whose
//! `schema_migrations` names a version this build does not know was written
//! by a newer build and is refused before anything is changed.

use deadpool_postgres::Client;

use crate::errors::ConnectError;

/// One numbered step of the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Its number, from 1, without gaps.
    pub version: i32,
    /// What it does, recorded next to the number.
    pub name: &'static str,
    /// The statements.
    pub sql: &'static str,
}

/// Every migration, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "commands, idempotency keys, shared sessions, devices",
        sql: r"
    CREATE TABLE commands (
        -- The insertion order: a sync hands out queued commands oldest
        -- first, ties (the same millisecond) in the order they were queued.
        seq             BIGINT  GENERATED ALWAYS AS IDENTITY,
        id              UUID    NOT NULL PRIMARY KEY,
        agent           TEXT    NOT NULL,
        owner           TEXT    NOT NULL,
        project         TEXT    NOT NULL,
        device          TEXT    NOT NULL,
        idempotency_key TEXT    NOT NULL,
        status          TEXT    NOT NULL
            CHECK (status IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
        created_at      BIGINT  NOT NULL,
        finished_at     BIGINT,
        revision        BIGINT  NOT NULL,
        -- The whole record as JSON; the columns above copy its fields for
        -- the indexes and are checked against it when read.
        record          TEXT    NOT NULL
    );
    CREATE INDEX commands_queued ON commands (owner, project, device, created_at, seq)
        WHERE status = 'queued';
    CREATE INDEX commands_finished ON commands (finished_at)
        WHERE finished_at IS NOT NULL;

    CREATE TABLE idempotency_keys (
        agent       TEXT    NOT NULL,
        key         TEXT    NOT NULL,
        command     UUID    NOT NULL,
        fingerprint TEXT    NOT NULL,
        expires_at  BIGINT  NOT NULL,
        PRIMARY KEY (agent, key)
    );
    CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

    CREATE TABLE shared_sessions (
        owner            TEXT   NOT NULL,
        project          TEXT   NOT NULL,
        graph_session_id TEXT   NOT NULL,
        device           TEXT   NOT NULL,
        synced_at        BIGINT NOT NULL,
        meta             TEXT   NOT NULL,
        PRIMARY KEY (owner, project, graph_session_id, device)
    );
    CREATE INDEX shared_sessions_device ON shared_sessions (owner, project, device);

    CREATE TABLE devices (
        owner        TEXT    NOT NULL,
        device       TEXT    NOT NULL,
        last_sync_at BIGINT,
        last_seen_at BIGINT  NOT NULL,
        long_poll    BOOLEAN NOT NULL,
        PRIMARY KEY (owner, device)
    );
    ",
    },
    Migration {
        version: 2,
        name: "identity is (owner, name): keys per (owner, agent, key); a device's projects",
        // Each existing key takes the owner of the command it points at; a
        // key whose command is gone is dropped (it could not be replayed).
        sql: r"
    ALTER TABLE idempotency_keys ADD COLUMN owner TEXT;
    UPDATE idempotency_keys AS k SET owner = c.owner FROM commands AS c WHERE c.id = k.command;
    DELETE FROM idempotency_keys WHERE owner IS NULL;
    ALTER TABLE idempotency_keys ALTER COLUMN owner SET NOT NULL;
    ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
    ALTER TABLE idempotency_keys ADD PRIMARY KEY (owner, agent, key);
    CREATE INDEX shared_sessions_by_device ON shared_sessions (owner, device, project);
    ",
    },
    Migration {
        version: 3,
        name: "leases on running commands",
        // A running command of an earlier build has no lease (NULL); the
        // server's sweep grants it one.
        sql: r"
    ALTER TABLE commands ADD COLUMN lease_expires_at BIGINT;
    CREATE INDEX commands_running ON commands (lease_expires_at) WHERE status = 'running';
    CREATE INDEX commands_running_by_device ON commands (owner, device) WHERE status = 'running';
    ",
    },
    Migration {
        version: 4,
        name: "initialize-era MCP sessions shared by every server",
        // One row per `MCP-Session-Id`. Look-ups match the id, the agent
        // (owner, agent) and the token's hash together; `granted` keeps
        // the projects and scopes the token had, for the revocation check.
        sql: r"
    CREATE TABLE mcp_sessions (
        id           TEXT    NOT NULL PRIMARY KEY,
        owner        TEXT    NOT NULL,
        agent        TEXT    NOT NULL,
        token_sha256 TEXT,
        granted      TEXT    NOT NULL,
        state        TEXT    NOT NULL,
        client_bytes INTEGER NOT NULL,
        created_at   BIGINT  NOT NULL,
        used_at      BIGINT  NOT NULL
    );
    CREATE INDEX mcp_sessions_by_agent ON mcp_sessions (owner, agent, used_at);
    CREATE INDEX mcp_sessions_by_use ON mcp_sessions (used_at);
    CREATE INDEX mcp_sessions_by_token ON mcp_sessions (token_sha256)
        WHERE token_sha256 IS NOT NULL;
    ",
    },
    Migration {
        version: 5,
        name: "a command's start, progress and lease renewals are HOT updates",
        // An update whose new row fits on the old row's page and changes no
        // indexed column (nor one that an index's predicate reads) is a HOT
        // update: no new index entry, and a WAL record of the changed bytes
        // only. The indexes of queued and of running commands read
        // `status` (and one of them keys `lease_expires_at`), so every
        // transition of a command wrote an entry in the primary key and in
        // two or three of them. They become one index of the open commands
        // (queued or running, so `finished_at IS NULL`), keyed by device:
        // a start, a progress report and a lease renewal change neither
        // column and are HOT; only the step to a terminal state (which
        // sets `finished_at`) writes entries, in the primary key and in
        // `commands_finished`. A device's queued and running commands are
        // its open ones filtered on their rows, and the lease sweep reads
        // every open command. A fillfactor of 50 leaves room on each page
        // for the new versions of the rows inserted there. Building the
        // index reads the table once, under the migration's lock.
        sql: r"
    ALTER TABLE commands SET (fillfactor = 50);
    DROP INDEX commands_queued;
    DROP INDEX commands_running;
    DROP INDEX commands_running_by_device;
    CREATE INDEX commands_open ON commands (owner, device, project, created_at, seq)
        WHERE finished_at IS NULL;
    ",
    },
    Migration {
        version: 6,
        name: "a command's record column holds its body; the head is in the columns",
        // The head of a record (identity, filing, key, status, times,
        // lease, revision) is in the row's columns already; `record` now
        // holds the rest (`CommandRecord::body_json`), with every field at
        // its default left out: about half the bytes that each insert and
        // each transition sends, writes to the WAL and keeps. Rows written
        // before hold the whole record and read the same (its head fields
        // give way to the columns'), so nothing is rewritten; the version
        // keeps an older build, which expects whole records, away.
        sql: r"
    COMMENT ON COLUMN commands.record IS
        'the record as JSON without the fields that have columns of their own (a row written before schema 6: the whole record)';
    ",
    },
];

/// The schema version this build writes: the last migration's number.
pub const SCHEMA_VERSION: i32 = 6;

/// Key of the advisory lock held while migrating ("GRly" and 1).
const MIGRATION_LOCK: i64 = 0x4752_6c79_0000_0001;

/// Creates `schema` if given and missing, then applies the migrations that
/// are not recorded yet. Returns the numbers applied now.
pub(crate) async fn migrate(
    client: &mut Client,
    schema: Option<&str>,
) -> Result<Vec<i32>, ConnectError> {
    let tx = client.transaction().await.map_err(ConnectError::migrate)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(ConnectError::migrate)?;
    if let Some(schema) = schema {
        // The name was checked to be a plain identifier; quoting keeps it exact.
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .await
            .map_err(ConnectError::migrate)?;
    }
    let current: Option<String> = tx
        .query_one("SELECT current_schema()", &[])
        .await
        .map_err(ConnectError::migrate)?
        .get(0);
    if current.is_none() {
        return Err(ConnectError::NoSchema);
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version    INTEGER     NOT NULL PRIMARY KEY,
            name       TEXT        NOT NULL,
            applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    )
    .await
    .map_err(ConnectError::migrate)?;
    let applied: Vec<i32> = tx
        .query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .map_err(ConnectError::migrate)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if let Some(&newest) = applied.last()
        && newest > SCHEMA_VERSION
    {
        return Err(ConnectError::NewerSchema {
            found: newest,
            supported: SCHEMA_VERSION,
        });
    }
    let mut now_applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        tx.batch_execute(m.sql)
            .await
            .map_err(ConnectError::migrate)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            &[&m.version, &m.name],
        )
        .await
        .map_err(ConnectError::migrate)?;
        now_applied.push(m.version);
    }
    tx.commit().await.map_err(ConnectError::migrate)?;
    Ok(now_applied)
}
