//! The group-commit writer: the durable writes of many requests committed
//! together, with one WAL flush (see [`super`] for how requests are
//! gathered). Two kinds of writes, each gathered on its own: inserts of
//! commands with their keys ([`INSERTS`]) and compare-and-swap updates
//! ([`UPDATES`]). Batches of both kinds run at once on their own
//! connections, and the server flushes the WAL for commits that arrive
//! together only once.
//!
//! A batch is one statement: the rows travel as arrays, one per column,
//! and the statement answers with the position of every row that took
//! effect. It runs as one implicit transaction, so one commit, one flush
//! of the WAL, for all its writers; while it waits for the disk, the next
//! writes gather for the next batch.
//!
//! What each writer is told is its own outcome:
//! * An insert whose key is live, or an update whose revision moved, took
//!   no effect: its row is simply missing from the answer, and only that
//!   writer hears `false`. The rest of the batch commits.
//! * Two inserts under one key in one statement would make Postgres refuse
//!   the statement, so a batch takes one insert per key and leaves the
//!   others for the next batch, where they find the first one's key (as
//!   they would have one after the other).
//! * A statement the server refused (a constraint, a deadlock) rolled back
//!   whole, so nothing of it happened: each of its writes then runs again
//!   alone, and only the one at fault fails.
//! * Anything else (no connection, a connection lost while committing)
//!   leaves the outcome unknown: every writer of the batch gets a
//!   [`StoreError::Backend`], which a caller may retry (an insert under its
//!   idempotency key, an update by its revision).
//!
//! An answer is sent only once the statement returned, so a write that
//! returned is committed, and with the database's `synchronous_commit`
//! (these writes never turn it off).

use std::future::Future;
use std::hash::Hash;
use std::marker::PhantomData;

use deadpool_postgres::{Client, Pool};
use graph_relay_core::store::StoreError;
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;

use super::{BatchKind, Batcher, answer, same_error};
use crate::errors::{describe, pool_error};
use crate::rows::{StatementCounter, backend};

/// Most writes in one batch.
const MAX_BATCH: usize = 256;

/// The inserts' statement: `$1..$16` are the columns. Returns the position
/// (from 1) of each insert that wrote its key and command.
///
/// An insert writes its key unless a live key (`expires_at` after the
/// insert's own `now`) exists, replacing an expired one, and writes its
/// command only if it wrote the key: one statement, so both or neither.
/// Concurrent inserts of one key from another batch or another server
/// serialise on the key's index entry: the later one waits for the earlier
/// to commit and then sees a live key. Keys are written in the order of
/// their text, so two batches that share keys wait for each other in one
/// order and never deadlock.
///
/// Each array is read through a scalar subquery (`(SELECT $1::uuid[])`):
/// the planner then cannot see how long it is, so its plan does not depend
/// on the batch's size, and Postgres settles on one generic plan after the
/// first few executions instead of planning every batch again (measured:
/// planning took as long as executing a batch of six writes).
pub(crate) const INSERTS: &str = "WITH i AS (
        SELECT * FROM unnest(
            (SELECT $1::uuid[]), (SELECT $2::text[]), (SELECT $3::text[]), (SELECT $4::text[]),
            (SELECT $5::text[]), (SELECT $6::text[]), (SELECT $7::text[]), (SELECT $8::int8[]),
            (SELECT $9::int8[]), (SELECT $10::text[]), (SELECT $11::text[]), (SELECT $12::int8[]),
            (SELECT $13::int8[]), (SELECT $14::int8[]), (SELECT $15::text[]), (SELECT $16::int8[]))
            WITH ORDINALITY AS i(id, owner, agent, key, project, device, fingerprint,
                                 expires_at, now, idempotency_key, status, created_at,
                                 finished_at, revision, record, lease_expires_at, ord)
    ), k AS (
        INSERT INTO idempotency_keys AS k (owner, agent, key, command, fingerprint, expires_at)
        SELECT owner, agent, key, id, fingerprint, expires_at FROM i ORDER BY owner, agent, key
        ON CONFLICT (owner, agent, key) DO UPDATE SET
            command = EXCLUDED.command,
            fingerprint = EXCLUDED.fingerprint,
            expires_at = EXCLUDED.expires_at
        WHERE k.expires_at <= (SELECT i.now FROM i
                               WHERE i.owner = EXCLUDED.owner AND i.agent = EXCLUDED.agent
                                 AND i.key = EXCLUDED.key)
        RETURNING owner, agent, key
    ), c AS (
        INSERT INTO commands (id, agent, owner, project, device, idempotency_key, status,
                              created_at, finished_at, revision, record, lease_expires_at)
        SELECT i.id, i.agent, i.owner, i.project, i.device, i.idempotency_key, i.status,
               i.created_at, i.finished_at, i.revision, i.record, i.lease_expires_at
        FROM i JOIN k ON k.owner = i.owner AND k.agent = i.agent AND k.key = i.key
        ORDER BY i.ord
        RETURNING id
    )
    SELECT i.ord FROM c JOIN i ON i.id = c.id";

/// The updates' statement: `$1..$7` are the columns. Returns the position
/// (from 1) of each update whose compare-and-swap took effect.
///
/// An update changes only what a transition can change (the status,
/// `finished_at`, the revision, the record and the lease). If two updates
/// in the batch name the same command and revision, one of them takes
/// effect and the other reports `false`, as if they had run one after the
/// other.
///
/// Each update finds its row by id and revision in a fenced `LATERAL`
/// subquery and updates it by its `ctid`: the plan is then an index
/// look-up and a TID fetch per update whatever the table's statistics
/// (see the statements of `reads` for why that matters). If
/// another transaction changes the row after the look-up, the update
/// waits for it and then, as the row's newest version has another
/// `ctid`, leaves it alone: the revision moved, so the swap fails, as it
/// must. The arrays are read through scalar subqueries, as for [`INSERTS`].
pub(crate) const UPDATES: &str = "UPDATE commands AS c SET
        status = u.status, finished_at = u.finished_at, revision = u.revision,
        record = u.record, lease_expires_at = u.lease_expires_at
    FROM (
        SELECT u.*, t.tid FROM unnest(
            (SELECT $1::uuid[]), (SELECT $2::int8[]), (SELECT $3::text[]), (SELECT $4::int8[]),
            (SELECT $5::int8[]), (SELECT $6::text[]), (SELECT $7::int8[]))
            WITH ORDINALITY AS u(id, previous, status, finished_at, revision, record,
                                 lease_expires_at, ord)
        CROSS JOIN LATERAL (
            SELECT ctid AS tid FROM commands WHERE id = u.id AND revision = u.previous
            OFFSET 0) AS t
    ) AS u
    WHERE c.ctid = u.tid
    RETURNING u.ord";

/// [`INSERTS`] for one row: `$1..$16` are its columns, as scalars.
const INSERT_ONE: &str = "WITH k AS (
        INSERT INTO idempotency_keys AS k (owner, agent, key, command, fingerprint, expires_at)
        VALUES ($2, $3, $4, $1, $7, $8)
        ON CONFLICT (owner, agent, key) DO UPDATE SET
            command = EXCLUDED.command,
            fingerprint = EXCLUDED.fingerprint,
            expires_at = EXCLUDED.expires_at
        WHERE k.expires_at <= $9
        RETURNING 1
    ), c AS (
        INSERT INTO commands (id, agent, owner, project, device, idempotency_key, status,
                              created_at, finished_at, revision, record, lease_expires_at)
        SELECT $1, $3, $2, $5, $6, $10, $11, $12, $13, $14, $15, $16 FROM k
        RETURNING 1
    )
    SELECT 1::int8 FROM c";

/// [`UPDATES`] for one row: `$1..$7` are its columns, as scalars.
const UPDATE_ONE: &str = "UPDATE commands SET
        status = $3, finished_at = $4, revision = $5, record = $6, lease_expires_at = $7
    WHERE id = $1 AND revision = $2
    RETURNING 1::int8";

/// A command and its key to insert (see [`Store::insert_command`]).
///
/// [`Store::insert_command`]: graph_relay_core::store::Store::insert_command
#[derive(Debug)]
pub(crate) struct NewCommand {
    pub id: uuid::Uuid,
    pub owner: String,
    pub agent: String,
    /// The key's text (the key's own row).
    pub key: String,
    pub project: String,
    pub device: String,
    pub fingerprint: String,
    pub expires_at: i64,
    /// The insert's `now`: a key with `expires_at <= now` has expired.
    pub now: i64,
    /// The command's `idempotency_key` column.
    pub idempotency_key: String,
    pub status: &'static str,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    pub revision: i64,
    pub record: String,
    pub lease_expires_at: Option<i64>,
}

/// A compare-and-swap of a command (see [`Store::update_command`]).
///
/// [`Store::update_command`]: graph_relay_core::store::Store::update_command
#[derive(Debug)]
pub(crate) struct CommandUpdate {
    pub id: uuid::Uuid,
    /// The revision the stored command must have.
    pub previous: i64,
    pub status: &'static str,
    pub finished_at: Option<i64>,
    pub revision: i64,
    pub record: String,
    pub lease_expires_at: Option<i64>,
}

type Reply = oneshot::Sender<Result<bool, StoreError>>;

/// One kind of batched write: its statements and how its rows travel.
pub(crate) trait WriteKind: Send + Sync + 'static {
    /// What one writer asks for.
    type Row: Send + Sync + 'static;
    /// What no two rows of one batch may share.
    type Exclusive: Hash + Eq;

    /// What `row` must have to itself in its batch, if anything.
    fn exclusive(row: &Self::Row) -> Option<Self::Exclusive>;

    /// Runs `rows` as one statement and returns the position (from 1) of
    /// each row that took effect, one per result row.
    ///
    /// A batch of one runs the kind's single-row statement: the batch
    /// statement's arrays, subqueries and joins cost the server about
    /// twice a plain statement's time when there is only one row to write
    /// (measured), and a lone write is the common case of a quiet server.
    /// Counts the statement in `statements` once it is prepared, as it is
    /// sent.
    fn query(
        client: &Client,
        statements: &StatementCounter,
        rows: &[&Self::Row],
    ) -> impl Future<Output = Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>> + Send;
}

/// The inserts of commands with their keys.
pub(crate) struct Inserts;

impl WriteKind for Inserts {
    type Row = NewCommand;
    /// The key's (owner, agent, key).
    type Exclusive = (String, String, String);

    fn exclusive(row: &NewCommand) -> Option<Self::Exclusive> {
        Some((row.owner.clone(), row.agent.clone(), row.key.clone()))
    }

    async fn query(
        client: &Client,
        statements: &StatementCounter,
        rows: &[&NewCommand],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        if let [r] = rows {
            let statement = client.prepare_cached(INSERT_ONE).await?;
            statements.sent(1);
            let params: [&(dyn ToSql + Sync); 16] = [
                &r.id,
                &r.owner,
                &r.agent,
                &r.key,
                &r.project,
                &r.device,
                &r.fingerprint,
                &r.expires_at,
                &r.now,
                &r.idempotency_key,
                &r.status,
                &r.created_at,
                &r.finished_at,
                &r.revision,
                &r.record,
                &r.lease_expires_at,
            ];
            return client.query(&statement, &params).await;
        }
        let statement = client.prepare_cached(INSERTS).await?;
        statements.sent(1);
        let id: Vec<uuid::Uuid> = rows.iter().map(|r| r.id).collect();
        let owner: Vec<&str> = rows.iter().map(|r| r.owner.as_str()).collect();
        let agent: Vec<&str> = rows.iter().map(|r| r.agent.as_str()).collect();
        let key: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        let project: Vec<&str> = rows.iter().map(|r| r.project.as_str()).collect();
        let device: Vec<&str> = rows.iter().map(|r| r.device.as_str()).collect();
        let fingerprint: Vec<&str> = rows.iter().map(|r| r.fingerprint.as_str()).collect();
        let expires_at: Vec<i64> = rows.iter().map(|r| r.expires_at).collect();
        let now: Vec<i64> = rows.iter().map(|r| r.now).collect();
        let idempotency_key: Vec<&str> = rows.iter().map(|r| r.idempotency_key.as_str()).collect();
        let status: Vec<&str> = rows.iter().map(|r| r.status).collect();
        let created_at: Vec<i64> = rows.iter().map(|r| r.created_at).collect();
        let finished_at: Vec<Option<i64>> = rows.iter().map(|r| r.finished_at).collect();
        let revision: Vec<i64> = rows.iter().map(|r| r.revision).collect();
        let record: Vec<&str> = rows.iter().map(|r| r.record.as_str()).collect();
        let lease: Vec<Option<i64>> = rows.iter().map(|r| r.lease_expires_at).collect();
        let params: [&(dyn ToSql + Sync); 16] = [
            &id,
            &owner,
            &agent,
            &key,
            &project,
            &device,
            &fingerprint,
            &expires_at,
            &now,
            &idempotency_key,
            &status,
            &created_at,
            &finished_at,
            &revision,
            &record,
            &lease,
        ];
        client.query(&statement, &params).await
    }
}

/// The compare-and-swap updates of commands.
pub(crate) struct Updates;

impl WriteKind for Updates {
    type Row = CommandUpdate;
    type Exclusive = ();

    fn exclusive(_: &CommandUpdate) -> Option<()> {
        None
    }

    async fn query(
        client: &Client,
        statements: &StatementCounter,
        rows: &[&CommandUpdate],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        if let [r] = rows {
            let statement = client.prepare_cached(UPDATE_ONE).await?;
            statements.sent(1);
            let params: [&(dyn ToSql + Sync); 7] = [
                &r.id,
                &r.previous,
                &r.status,
                &r.finished_at,
                &r.revision,
                &r.record,
                &r.lease_expires_at,
            ];
            return client.query(&statement, &params).await;
        }
        let statement = client.prepare_cached(UPDATES).await?;
        statements.sent(1);
        let id: Vec<uuid::Uuid> = rows.iter().map(|r| r.id).collect();
        let previous: Vec<i64> = rows.iter().map(|r| r.previous).collect();
        let status: Vec<&str> = rows.iter().map(|r| r.status).collect();
        let finished_at: Vec<Option<i64>> = rows.iter().map(|r| r.finished_at).collect();
        let revision: Vec<i64> = rows.iter().map(|r| r.revision).collect();
        let record: Vec<&str> = rows.iter().map(|r| r.record.as_str()).collect();
        let lease: Vec<Option<i64>> = rows.iter().map(|r| r.lease_expires_at).collect();
        let params: [&(dyn ToSql + Sync); 7] = [
            &id,
            &previous,
            &status,
            &finished_at,
            &revision,
            &record,
            &lease,
        ];
        client.query(&statement, &params).await
    }
}

/// The [`BatchKind`] of a [`WriteKind`]: the pool and the statement count.
pub(crate) struct Writes<W> {
    pool: Pool,
    statements: StatementCounter,
    kind: PhantomData<fn() -> W>,
}

impl<W: WriteKind> BatchKind for Writes<W> {
    type Job = (W::Row, Reply);
    type Exclusive = W::Exclusive;
    const MAX_BATCH: usize = MAX_BATCH;

    fn exclusive((row, _): &Self::Job) -> Option<W::Exclusive> {
        W::exclusive(row)
    }

    async fn run(&self, batch: Vec<Self::Job>) {
        self.execute(batch).await;
    }
}

impl<W: WriteKind> Writes<W> {
    /// Runs `batch` as one statement and answers every writer.
    async fn execute(&self, batch: Vec<(W::Row, Reply)>) {
        let rows: Vec<&W::Row> = batch.iter().map(|(row, _)| row).collect();
        match self.write(&rows).await {
            Ok(outcomes) => {
                for ((_, reply), took_effect) in batch.into_iter().zip(outcomes) {
                    // The caller may have stopped waiting; the write stands.
                    let _ = reply.send(Ok(took_effect));
                }
            }
            // The server refused the statement: it rolled back whole. Each
            // write runs again alone, so that only the one at fault fails.
            Err(Failure::Refused(_)) if batch.len() > 1 => {
                for (row, reply) in batch {
                    let outcome = self
                        .write(&[&row])
                        .await
                        .map(|o| o.first().copied().unwrap_or(false))
                        .map_err(Failure::into_error);
                    let _ = reply.send(outcome);
                }
            }
            Err(failure) => {
                let error = failure.into_error();
                for (_, reply) in batch {
                    let _ = reply.send(Err(same_error(&error)));
                }
            }
        }
    }

    /// Runs `rows` as one statement; whether each took effect, in order.
    async fn write(&self, rows: &[&W::Row]) -> Result<Vec<bool>, Failure> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| Failure::Other(StoreError::Backend(pool_error(&e))))?;
        let answered = W::query(&client, &self.statements, rows)
            .await
            .map_err(|e| classify(&e))?;
        let mut outcomes = vec![false; rows.len()];
        for row in answered {
            let position: i64 = row.try_get(0).map_err(|e| Failure::Other(backend(e)))?;
            let outcome = usize::try_from(position - 1)
                .ok()
                .and_then(|i| outcomes.get_mut(i));
            match outcome {
                Some(outcome) => *outcome = true,
                None => {
                    return Err(Failure::Other(StoreError::Backend(format!(
                        "a batched write answered an unknown row ({position})"
                    ))));
                }
            }
        }
        Ok(outcomes)
    }
}

/// Why a batch statement did not answer.
enum Failure {
    /// The server refused it (so it rolled back).
    Refused(StoreError),
    /// Anything else: not sent, or the outcome is unknown.
    Other(StoreError),
}

impl Failure {
    fn into_error(self) -> StoreError {
        match self {
            Failure::Refused(e) | Failure::Other(e) => e,
        }
    }
}

/// A statement the server answered with an `ERROR` was rolled back (it ran
/// in a transaction of its own); after anything else, a `FATAL` error or a
/// lost connection, whether it committed is unknown.
fn classify(e: &tokio_postgres::Error) -> Failure {
    let error = StoreError::Backend(describe(e));
    match e.as_db_error().and_then(|db| db.parsed_severity()) {
        Some(tokio_postgres::error::Severity::Error) => Failure::Refused(error),
        _ => Failure::Other(error),
    }
}

/// The group-commit writer, shared by a store and its clones.
pub(crate) struct Writer {
    inserts: Batcher<Writes<Inserts>>,
    updates: Batcher<Writes<Updates>>,
}

impl Writer {
    /// Inserts and updates on `pool`, each with `lanes` lanes.
    pub(crate) fn new(pool: Pool, statements: StatementCounter, lanes: usize) -> Self {
        Self {
            inserts: Batcher::new(
                Writes {
                    pool: pool.clone(),
                    statements: statements.clone(),
                    kind: PhantomData,
                },
                lanes,
            ),
            updates: Batcher::new(
                Writes {
                    pool,
                    statements,
                    kind: PhantomData,
                },
                lanes,
            ),
        }
    }

    /// Inserts `command` with its key; `false` if a live key blocked it.
    pub(crate) async fn insert(&self, command: NewCommand) -> Result<bool, StoreError> {
        let (reply, outcome) = oneshot::channel();
        self.inserts.run((command, reply)).await?;
        answer(outcome).await
    }

    /// Applies `update` if the command's revision is `update.previous`.
    pub(crate) async fn update(&self, update: CommandUpdate) -> Result<bool, StoreError> {
        let (reply, outcome) = oneshot::channel();
        self.updates.run((update, reply)).await?;
        answer(outcome).await
    }
}
