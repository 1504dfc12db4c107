//! The group-commit writer: the durable writes of many requests committed
//! together, with one WAL flush (see [`super`] for how requests are
//! gathered). Inserts of commands with their keys and compare-and-swap
//! updates are gathered together: the lifecycles in flight are at
//! different steps (one queued, another started, a third completed), and
//! one batch takes all of their writes, so they share one commit and one
//! flush instead of one per kind.
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

use deadpool_postgres::{Client, Pool};
use graph_relay_core::store::StoreError;
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;

use super::write_sql::{INSERT_ONE, UPDATE_ONE, UPDATES, WRITES};
use super::{BatchKind, Batcher, answer, same_error};
use crate::errors::{describe, pool_error};
use crate::rows::{StatementCounter, backend};

/// Most writes in one batch.
const MAX_BATCH: usize = 256;

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
    /// Written only if the session still resolves to this command's share.
    pub guard: Option<Box<ShareGuard>>,
}

/// What [`Store::insert_command_if_shared`] checks in the insert's own
/// statement: that the session `session` of the command's owner, looked
/// up in `projects` as [`Store::find_shared_session`] looks it up, is
/// shared by the command's project and device under `slug`.
///
/// [`Store::insert_command_if_shared`]: graph_relay_core::store::Store::insert_command_if_shared
/// [`Store::find_shared_session`]: graph_relay_core::store::Store::find_shared_session
#[derive(Debug)]
pub(crate) struct ShareGuard {
    pub session: String,
    /// The projects in the agent's order, as a JSON array of strings.
    pub projects: String,
    pub slug: String,
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

/// One write of a batch.
#[derive(Debug)]
pub(crate) enum Write {
    /// A command and its key.
    Insert(NewCommand),
    /// A compare-and-swap of a command.
    Update(CommandUpdate),
}

impl Write {
    /// What the write must have to itself in its batch: an insert's key
    /// (owner, agent, key).
    fn exclusive(&self) -> Option<(String, String, String)> {
        match self {
            Write::Insert(r) => Some((r.owner.clone(), r.agent.clone(), r.key.clone())),
            Write::Update(_) => None,
        }
    }
}

/// The rows of a batch as the arrays of [`WRITES`], one per column.
#[derive(Default)]
struct Columns<'a> {
    insert_pos: Vec<i64>,
    id: Vec<uuid::Uuid>,
    owner: Vec<&'a str>,
    agent: Vec<&'a str>,
    key: Vec<&'a str>,
    project: Vec<&'a str>,
    device: Vec<&'a str>,
    fingerprint: Vec<&'a str>,
    expires_at: Vec<i64>,
    now: Vec<i64>,
    idempotency_key: Vec<&'a str>,
    status: Vec<&'a str>,
    created_at: Vec<i64>,
    finished_at: Vec<Option<i64>>,
    revision: Vec<i64>,
    record: Vec<&'a str>,
    lease: Vec<Option<i64>>,
    guard_session: Vec<Option<&'a str>>,
    guard_projects: Vec<Option<&'a str>>,
    guard_slug: Vec<Option<&'a str>>,
    update_pos: Vec<i64>,
    update_id: Vec<uuid::Uuid>,
    previous: Vec<i64>,
    update_status: Vec<&'a str>,
    update_finished_at: Vec<Option<i64>>,
    update_revision: Vec<i64>,
    update_record: Vec<&'a str>,
    update_lease: Vec<Option<i64>>,
}

impl<'a> Columns<'a> {
    /// The columns of `rows`, each tagged with its position (from 1).
    fn new(rows: &[&'a Write]) -> Self {
        let mut c = Self::default();
        for (pos, row) in (1i64..).zip(rows) {
            match row {
                Write::Insert(r) => {
                    c.insert_pos.push(pos);
                    c.id.push(r.id);
                    c.owner.push(&r.owner);
                    c.agent.push(&r.agent);
                    c.key.push(&r.key);
                    c.project.push(&r.project);
                    c.device.push(&r.device);
                    c.fingerprint.push(&r.fingerprint);
                    c.expires_at.push(r.expires_at);
                    c.now.push(r.now);
                    c.idempotency_key.push(&r.idempotency_key);
                    c.status.push(r.status);
                    c.created_at.push(r.created_at);
                    c.finished_at.push(r.finished_at);
                    c.revision.push(r.revision);
                    c.record.push(&r.record);
                    c.lease.push(r.lease_expires_at);
                    let guard = r.guard.as_ref();
                    c.guard_session.push(guard.map(|g| g.session.as_str()));
                    c.guard_projects.push(guard.map(|g| g.projects.as_str()));
                    c.guard_slug.push(guard.map(|g| g.slug.as_str()));
                }
                Write::Update(r) => {
                    c.update_pos.push(pos);
                    c.update_id.push(r.id);
                    c.previous.push(r.previous);
                    c.update_status.push(r.status);
                    c.update_finished_at.push(r.finished_at);
                    c.update_revision.push(r.revision);
                    c.update_record.push(&r.record);
                    c.update_lease.push(r.lease_expires_at);
                }
            }
        }
        c
    }

    /// `$1..$8` of [`UPDATES`], which are also those of [`WRITES`]: the
    /// compare-and-swaps' columns.
    fn update_params(&self) -> [&(dyn ToSql + Sync); 8] {
        [
            &self.update_pos,
            &self.update_id,
            &self.previous,
            &self.update_status,
            &self.update_finished_at,
            &self.update_revision,
            &self.update_record,
            &self.update_lease,
        ]
    }

    /// `$1..$28` of [`WRITES`]: the compare-and-swaps' columns, then the
    /// inserts'.
    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        let inserts: [&(dyn ToSql + Sync); 20] = [
            &self.insert_pos,
            &self.id,
            &self.owner,
            &self.agent,
            &self.key,
            &self.project,
            &self.device,
            &self.fingerprint,
            &self.expires_at,
            &self.now,
            &self.idempotency_key,
            &self.status,
            &self.created_at,
            &self.finished_at,
            &self.revision,
            &self.record,
            &self.lease,
            &self.guard_session,
            &self.guard_projects,
            &self.guard_slug,
        ];
        self.update_params().into_iter().chain(inserts).collect()
    }
}

/// Runs `rows` as one statement and returns the position (from 1) of each
/// row that took effect, one per result row; a batch of one runs the
/// statement of its kind (see [`INSERT_ONE`]). Counts the statement in
/// `statements` once it is prepared, as it is sent.
async fn query(
    client: &Client,
    statements: &StatementCounter,
    rows: &[&Write],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    match rows {
        [Write::Insert(r)] => {
            let statement = client.prepare_cached(INSERT_ONE).await?;
            statements.sent(1);
            let guard = r.guard.as_ref();
            let (session, projects, slug) = (
                guard.map(|g| g.session.as_str()),
                guard.map(|g| g.projects.as_str()),
                guard.map(|g| g.slug.as_str()),
            );
            let params: [&(dyn ToSql + Sync); 19] = [
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
                &session,
                &projects,
                &slug,
            ];
            client.query(&statement, &params).await
        }
        [Write::Update(r)] => {
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
            client.query(&statement, &params).await
        }
        _ if rows.iter().all(|r| matches!(r, Write::Update(_))) => {
            let statement = client.prepare_cached(UPDATES).await?;
            statements.sent(1);
            let columns = Columns::new(rows);
            client.query(&statement, &columns.update_params()).await
        }
        _ => {
            let statement = client.prepare_cached(WRITES).await?;
            statements.sent(1);
            let columns = Columns::new(rows);
            client.query(&statement, &columns.params()).await
        }
    }
}

/// The writes' [`BatchKind`]: the pool and the statement count.
pub(crate) struct Writes {
    pool: Pool,
    statements: StatementCounter,
}

impl BatchKind for Writes {
    type Job = (Write, Reply);
    type Exclusive = (String, String, String);
    const MAX_BATCH: usize = MAX_BATCH;

    fn exclusive((row, _): &Self::Job) -> Option<Self::Exclusive> {
        row.exclusive()
    }

    async fn run(&self, batch: Vec<Self::Job>) {
        self.execute(batch).await;
    }
}

impl Writes {
    /// Runs `batch` as one statement and answers every writer.
    async fn execute(&self, batch: Vec<(Write, Reply)>) {
        let rows: Vec<&Write> = batch.iter().map(|(row, _)| row).collect();
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
    async fn write(&self, rows: &[&Write]) -> Result<Vec<bool>, Failure> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| Failure::Other(StoreError::Backend(pool_error(&e))))?;
        let answered = query(&client, &self.statements, rows)
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
pub(crate) struct Writer(Batcher<Writes>);

impl Writer {
    /// Inserts and updates on `pool`, with `lanes` lanes.
    pub(crate) fn new(pool: Pool, statements: StatementCounter, lanes: usize) -> Self {
        Self(Batcher::new(Writes { pool, statements }, lanes))
    }

    /// Inserts `command` with its key; `false` if a live key blocked it.
    pub(crate) async fn insert(&self, command: NewCommand) -> Result<bool, StoreError> {
        self.write(Write::Insert(command)).await
    }

    /// Applies `update` if the command's revision is `update.previous`.
    pub(crate) async fn update(&self, update: CommandUpdate) -> Result<bool, StoreError> {
        self.write(Write::Update(update)).await
    }

    async fn write(&self, write: Write) -> Result<bool, StoreError> {
        let (reply, outcome) = oneshot::channel();
        self.0.run((write, reply)).await;
        answer(outcome).await
    }
}
