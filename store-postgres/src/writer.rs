//! The group-commit writer: the durable writes of many requests (inserts
//! of commands with their keys, compare-and-swap updates) committed
//! together, in one statement, with one WAL flush (see [`crate::batch`]
//! for how requests are gathered).
//!
//! A batch is one statement ([`WRITE`]): the rows travel as arrays, one per
//! column, and the statement answers with the position of every row that
//! took effect. It runs as one implicit transaction, so one commit, one
//! flush of the WAL, for all its writers; while it waits for the disk, the
//! next writes gather for the next batch.
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

use deadpool_postgres::Pool;
use graph_relay_core::store::StoreError;
use tokio::sync::oneshot;

use crate::batch::{BatchKind, Batcher, answer, same_error};
use crate::store::{StatementCounter, backend, describe, pool_error};

/// Most writes in one batch.
pub(crate) const MAX_BATCH: usize = 256;
/// Most batches running at once. Two: while one waits for the disk, the
/// next one can already be executing, and the server flushes both
/// together when they commit close enough.
pub(crate) const MAX_IN_FLIGHT: usize = 2;

/// The batch statement: `$1..$16` are the inserts' columns, `$17..$23`
/// the updates' (empty arrays for none). Returns `('i', n)` for the n-th
/// insert (from 1) that wrote its key and command and `('u', n)` for the
/// n-th update whose compare-and-swap took effect.
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
/// An update changes only what a transition can change (the status,
/// `finished_at`, the revision, the record and the lease); if two updates
/// in the batch name the same command and revision, one of them takes
/// effect and the other reports `false`, as if they had run one after the
/// other. An update never names a command inserted in the same batch: an
/// insert is answered only after its batch committed.
///
/// Each update finds its row by id and revision in a fenced `LATERAL`
/// subquery and updates it by its `ctid`: the plan is then an index
/// look-up and a TID fetch per update whatever the table's statistics
/// (see the reads' statements in `reader` for why that matters). If
/// another transaction changes the row after the look-up, the update
/// waits for it and then, as the row's newest version has another
/// `ctid`, leaves it alone: the revision moved, so the swap fails, as it
/// must.
///
/// Each array is read through a scalar subquery (`(SELECT $1::uuid[])`):
/// the planner then cannot see how long it is, so its plan does not depend
/// on the batch's size, and Postgres settles on one generic plan after the
/// first few executions instead of planning every batch again (measured:
/// planning took as long as executing a batch of six writes).
pub(crate) const WRITE: &str = "WITH i AS (
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
    ), u AS (
        UPDATE commands AS c SET
            status = u.status, finished_at = u.finished_at, revision = u.revision,
            record = u.record, lease_expires_at = u.lease_expires_at
        FROM (
            SELECT u.*, t.tid FROM unnest(
                (SELECT $17::uuid[]), (SELECT $18::int8[]), (SELECT $19::text[]),
                (SELECT $20::int8[]), (SELECT $21::int8[]), (SELECT $22::text[]),
                (SELECT $23::int8[]))
                WITH ORDINALITY AS u(id, previous, status, finished_at, revision, record,
                                     lease_expires_at, ord)
            CROSS JOIN LATERAL (
                SELECT ctid AS tid FROM commands WHERE id = u.id AND revision = u.previous
                OFFSET 0) AS t
        ) AS u
        WHERE c.ctid = u.tid
        RETURNING u.ord
    )
    SELECT 'i', i.ord FROM c JOIN i ON i.id = c.id
    UNION ALL
    SELECT 'u', ord FROM u";

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

/// One write and where its answer goes: `true` if it took effect.
pub(crate) enum Job {
    Insert(NewCommand, oneshot::Sender<Result<bool, StoreError>>),
    Update(CommandUpdate, oneshot::Sender<Result<bool, StoreError>>),
}

impl Job {
    fn answer(self, outcome: Result<bool, StoreError>) {
        let reply = match self {
            Job::Insert(_, reply) | Job::Update(_, reply) => reply,
        };
        // The caller may have stopped waiting; the write stands regardless.
        let _ = reply.send(outcome);
    }
}

/// The writes' [`BatchKind`]: the pool and the statement count.
pub(crate) struct Writes {
    pool: Pool,
    statements: StatementCounter,
}

impl BatchKind for Writes {
    type Job = Job;
    /// An insert's (owner, agent, key).
    type Exclusive = (String, String, String);
    const MAX_BATCH: usize = MAX_BATCH;
    const LANES: usize = MAX_IN_FLIGHT;

    fn exclusive(job: &Job) -> Option<Self::Exclusive> {
        match job {
            Job::Insert(c, _) => Some((c.owner.clone(), c.agent.clone(), c.key.clone())),
            Job::Update(..) => None,
        }
    }

    async fn run(&self, batch: Vec<Job>) {
        execute(&self.pool, &self.statements, batch).await;
    }
}

/// The group-commit writer, shared by a store and its clones.
pub(crate) struct Writer(Batcher<Writes>);

impl Writer {
    pub(crate) fn new(pool: Pool, statements: StatementCounter) -> Self {
        Self(Batcher::new(Writes { pool, statements }))
    }

    /// Inserts `command` with its key; `false` if a live key blocked it.
    pub(crate) async fn insert(&self, command: NewCommand) -> Result<bool, StoreError> {
        let (reply, outcome) = oneshot::channel();
        self.0.submit(Job::Insert(command, reply))?;
        answer(outcome).await
    }

    /// Applies `update` if the command's revision is `update.previous`.
    pub(crate) async fn update(&self, update: CommandUpdate) -> Result<bool, StoreError> {
        let (reply, outcome) = oneshot::channel();
        self.0.submit(Job::Update(update, reply))?;
        answer(outcome).await
    }
}

async fn execute(pool: &Pool, statements: &StatementCounter, batch: Vec<Job>) {
    match write(pool, statements, &batch).await {
        Ok(outcomes) => {
            for (job, took_effect) in batch.into_iter().zip(outcomes) {
                job.answer(Ok(took_effect));
            }
        }
        // The server refused the statement: it rolled back whole. Each
        // write runs again alone, so that only the one at fault fails.
        Err(Failure::Refused(_)) if batch.len() > 1 => {
            for job in batch {
                let outcome = write(pool, statements, std::slice::from_ref(&job))
                    .await
                    .map(|o| o.first().copied().unwrap_or(false))
                    .map_err(Failure::into_error);
                job.answer(outcome);
            }
        }
        Err(failure) => {
            let error = failure.into_error();
            for job in batch {
                job.answer(Err(same_error(&error)));
            }
        }
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

/// Runs `batch` as one statement; whether each job took effect, in order.
async fn write(
    pool: &Pool,
    statements: &StatementCounter,
    batch: &[Job],
) -> Result<Vec<bool>, Failure> {
    let columns = Columns::of(batch);
    let client = pool
        .get()
        .await
        .map_err(|e| Failure::Other(StoreError::Backend(pool_error(&e))))?;
    let stmt = client
        .prepare_cached(WRITE)
        .await
        .map_err(|e| classify(&e))?;
    statements.sent(1);
    let rows = client
        .query(&stmt, &columns.params())
        .await
        .map_err(|e| classify(&e))?;
    let mut outcomes = vec![false; batch.len()];
    for row in rows {
        let kind: &str = row.try_get(0).map_err(|e| Failure::Other(backend(e)))?;
        let ord: i64 = row.try_get(1).map_err(|e| Failure::Other(backend(e)))?;
        let index = usize::try_from(ord - 1)
            .ok()
            .and_then(|n| match kind {
                "i" => columns.inserts.get(n),
                _ => columns.updates.get(n),
            })
            .copied();
        match index.and_then(|i| outcomes.get_mut(i)) {
            Some(outcome) => *outcome = true,
            None => {
                return Err(Failure::Other(StoreError::Backend(format!(
                    "the batch write answered an unknown row ({kind}, {ord})"
                ))));
            }
        }
    }
    Ok(outcomes)
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

/// A batch as one array per column, and where each row came from.
#[derive(Default)]
struct Columns<'a> {
    /// The batch position of each insert, in the order of the arrays.
    inserts: Vec<usize>,
    /// The batch position of each update, likewise.
    updates: Vec<usize>,
    i_id: Vec<uuid::Uuid>,
    i_owner: Vec<&'a str>,
    i_agent: Vec<&'a str>,
    i_key: Vec<&'a str>,
    i_project: Vec<&'a str>,
    i_device: Vec<&'a str>,
    i_fingerprint: Vec<&'a str>,
    i_expires_at: Vec<i64>,
    i_now: Vec<i64>,
    i_idempotency_key: Vec<&'a str>,
    i_status: Vec<&'a str>,
    i_created_at: Vec<i64>,
    i_finished_at: Vec<Option<i64>>,
    i_revision: Vec<i64>,
    i_record: Vec<&'a str>,
    i_lease: Vec<Option<i64>>,
    u_id: Vec<uuid::Uuid>,
    u_previous: Vec<i64>,
    u_status: Vec<&'a str>,
    u_finished_at: Vec<Option<i64>>,
    u_revision: Vec<i64>,
    u_record: Vec<&'a str>,
    u_lease: Vec<Option<i64>>,
}

impl<'a> Columns<'a> {
    fn of(batch: &'a [Job]) -> Self {
        let mut c = Self::default();
        for (position, job) in batch.iter().enumerate() {
            match job {
                Job::Insert(n, _) => {
                    c.inserts.push(position);
                    c.i_id.push(n.id);
                    c.i_owner.push(&n.owner);
                    c.i_agent.push(&n.agent);
                    c.i_key.push(&n.key);
                    c.i_project.push(&n.project);
                    c.i_device.push(&n.device);
                    c.i_fingerprint.push(&n.fingerprint);
                    c.i_expires_at.push(n.expires_at);
                    c.i_now.push(n.now);
                    c.i_idempotency_key.push(&n.idempotency_key);
                    c.i_status.push(n.status);
                    c.i_created_at.push(n.created_at);
                    c.i_finished_at.push(n.finished_at);
                    c.i_revision.push(n.revision);
                    c.i_record.push(&n.record);
                    c.i_lease.push(n.lease_expires_at);
                }
                Job::Update(u, _) => {
                    c.updates.push(position);
                    c.u_id.push(u.id);
                    c.u_previous.push(u.previous);
                    c.u_status.push(u.status);
                    c.u_finished_at.push(u.finished_at);
                    c.u_revision.push(u.revision);
                    c.u_record.push(&u.record);
                    c.u_lease.push(u.lease_expires_at);
                }
            }
        }
        c
    }

    /// The statement's parameters, `$1` to `$23`.
    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 23] {
        [
            &self.i_id,
            &self.i_owner,
            &self.i_agent,
            &self.i_key,
            &self.i_project,
            &self.i_device,
            &self.i_fingerprint,
            &self.i_expires_at,
            &self.i_now,
            &self.i_idempotency_key,
            &self.i_status,
            &self.i_created_at,
            &self.i_finished_at,
            &self.i_revision,
            &self.i_record,
            &self.i_lease,
            &self.u_id,
            &self.u_previous,
            &self.u_status,
            &self.u_finished_at,
            &self.u_revision,
            &self.u_record,
            &self.u_lease,
        ]
    }
}

