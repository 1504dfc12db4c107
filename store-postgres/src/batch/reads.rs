//! The batched reads: the look-ups every Graph run makes (a command by id,
//! a device's queued commands, a shared session by id), gathered from
//! concurrent requests (see [`super`]) and answered with one
//! statement per kind of look-up, the kinds of one batch pipelined on one
//! connection.
//!
//! Each statement takes its look-ups as arrays, one per column, joins them
//! with the tables, and tags every row with the position of the look-up it
//! answers. A look-up sees what was committed when its statement started,
//! as a look-up of its own would have; reads never wait for a write.
//! Should a statement fail, every look-up of that statement gets the error
//! (nothing was changed, so a caller may simply ask again).

use deadpool_postgres::Pool;
use graph_relay_core::command::CommandRecord;
use graph_relay_core::session::SharedSession;
use graph_relay_core::store::StoreError;
use tokio::sync::oneshot;
use tokio_postgres::Row;

use super::{BatchKind, Batcher, answer, same_error};
use crate::errors::pool_error;
use crate::rows::{
    StatementCounter, backend, command_columns, corrupt, decode_command, decode_session,
};

/// Most look-ups in one batch.
const MAX_BATCH: usize = 256;

/// A command by id, of an owner, and of an agent or a device when given.
///
/// Every statement here looks each of its look-ups up in a `LATERAL`
/// subquery fenced with `OFFSET 0` (or a `LIMIT`), so that the plan is an
/// index look-up per look-up whatever the table's statistics say: joined
/// plainly, the plan Postgres makes for a connection while the table is
/// small (a hash join over a sequential scan) would be kept as the table
/// grows (measured: a third of the server's time went to such scans).
const COMMANDS: &str = concat!(
    "SELECT ",
    command_columns!("c."),
    ", l.ord
    FROM unnest((SELECT $1::uuid[]), (SELECT $2::text[]), (SELECT $3::text[]), (SELECT $4::text[]))
        WITH ORDINALITY AS l(id, owner, agent, device, ord)
    CROSS JOIN LATERAL (
        SELECT * FROM commands AS c
        WHERE c.id = l.id AND c.owner = l.owner
          AND (l.agent IS NULL OR c.agent = l.agent)
          AND (l.device IS NULL OR c.device = l.device)
        OFFSET 0) AS c"
);

/// A device's queued commands in a project, oldest first (by `created_at`,
/// then insertion order), at most `limit` of them.
const QUEUED: &str = concat!(
    "SELECT ",
    command_columns!("c."),
    ", l.ord
    FROM unnest((SELECT $1::text[]), (SELECT $2::text[]), (SELECT $3::text[]), (SELECT $4::int8[]))
        WITH ORDINALITY AS l(owner, project, device, size, ord)
    CROSS JOIN LATERAL (
        SELECT * FROM commands
        WHERE owner = l.owner AND project = l.project AND device = l.device
          AND finished_at IS NULL AND status = 'queued'
        ORDER BY created_at, seq LIMIT l.size) AS c
    ORDER BY l.ord, c.created_at, c.seq"
);

/// A shared session by id: the first of the look-up's projects, in its
/// order, that has it; within a project, the smallest device. Each
/// look-up's projects come as rows `(look-up, owner, project, position, id)`.
const SESSIONS: &str =
    "SELECT DISTINCT ON (p.lookup) s.project, s.device, s.synced_at, s.meta, p.lookup
    FROM unnest((SELECT $1::int8[]), (SELECT $2::text[]), (SELECT $3::text[]), (SELECT $4::int8[]),
                (SELECT $5::text[])) AS p(lookup, owner, project, position, id)
    CROSS JOIN LATERAL (
        SELECT * FROM shared_sessions AS s
        WHERE s.owner = p.owner AND s.project = p.project AND s.graph_session_id = p.id
        OFFSET 0) AS s
    ORDER BY p.lookup, p.position, s.device";

/// [`COMMANDS`] for one look-up, `$1..$4` as scalars. A batch of one look-up
/// of any kind runs the single statement: with one row to find, the batch
/// statement's arrays and joins cost the server about half again as much
/// (measured), and a lone look-up is the common case of a quiet server.
const COMMAND_ONE: &str = concat!(
    "SELECT ",
    command_columns!(""),
    ", 1::int8
    FROM commands
    WHERE id = $1 AND owner = $2
      AND ($3::text IS NULL OR agent = $3) AND ($4::text IS NULL OR device = $4)"
);

/// [`QUEUED`] for one look-up, `$1..$4` as scalars.
const QUEUED_ONE: &str = concat!(
    "SELECT ",
    command_columns!(""),
    ", 1::int8
    FROM commands
    WHERE owner = $1 AND project = $2 AND device = $3
      AND finished_at IS NULL AND status = 'queued'
    ORDER BY created_at, seq LIMIT $4"
);

/// [`SESSIONS`] for one look-up: the owner, its projects in order, the id.
const SESSION_ONE: &str = "SELECT s.project, s.device, s.synced_at, s.meta, 1::int8
    FROM unnest($2::text[]) WITH ORDINALITY AS p(project, position)
    JOIN shared_sessions AS s
      ON s.owner = $1 AND s.project = p.project AND s.graph_session_id = $3
    ORDER BY p.position, s.device LIMIT 1";

/// A command by id (see [`COMMANDS`]).
#[derive(Debug)]
pub(crate) struct CommandLookup {
    pub id: uuid::Uuid,
    pub owner: String,
    pub agent: Option<String>,
    pub device: Option<String>,
}

/// A device's queued commands (see [`QUEUED`]).
#[derive(Debug)]
pub(crate) struct QueuedLookup {
    pub owner: String,
    pub project: String,
    pub device: String,
    pub limit: i64,
}

/// A shared session by id (see [`SESSIONS`]); `projects` is not empty.
#[derive(Debug)]
pub(crate) struct SessionLookup {
    pub owner: String,
    pub projects: Vec<String>,
    pub id: String,
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// One look-up and where its answer goes.
pub(crate) enum Lookup {
    Command(CommandLookup, Reply<Option<CommandRecord>>),
    Queued(QueuedLookup, Reply<Vec<CommandRecord>>),
    Session(SessionLookup, Reply<Option<SharedSession>>),
}

/// The reads' [`BatchKind`].
pub(crate) struct Reads {
    pool: Pool,
    statements: StatementCounter,
}

impl BatchKind for Reads {
    type Job = Lookup;
    type Exclusive = ();
    const MAX_BATCH: usize = MAX_BATCH;

    fn exclusive(_: &Lookup) -> Option<()> {
        None
    }

    async fn run(&self, batch: Vec<Lookup>) {
        self.read(batch).await;
    }
}

impl Reads {
    /// Runs one statement per kind of look-up in `batch`, pipelined on one
    /// connection, and answers every look-up.
    async fn read(&self, batch: Vec<Lookup>) {
        let mut commands = Vec::new();
        let mut queued = Vec::new();
        let mut sessions = Vec::new();
        for lookup in batch {
            match lookup {
                Lookup::Command(l, reply) => commands.push((l, reply)),
                Lookup::Queued(l, reply) => queued.push((l, reply)),
                Lookup::Session(l, reply) => sessions.push((l, reply)),
            }
        }
        let client = match self.pool.get().await {
            Ok(client) => client,
            Err(e) => {
                let error = StoreError::Backend(pool_error(&e));
                fail(commands, &error);
                fail(queued, &error);
                fail(sessions, &error);
                return;
            }
        };
        let client = &client;
        let statements = &self.statements;
        futures::join!(
            async move {
                if !commands.is_empty() {
                    let rows = commands_rows(client, statements, &commands).await;
                    answer_each(commands, rows, |rows| match rows.first() {
                        Some(row) => decode_command(row).map(Some),
                        None => Ok(None),
                    });
                }
            },
            async move {
                if !queued.is_empty() {
                    let rows = queued_rows(client, statements, &queued).await;
                    answer_each(queued, rows, |rows| {
                        rows.iter().map(decode_command).collect()
                    });
                }
            },
            async move {
                if !sessions.is_empty() {
                    let rows = sessions_rows(client, statements, &sessions).await;
                    answer_each(sessions, rows, |rows| match rows.first() {
                        Some(row) => decode_session(row).map(Some),
                        None => Ok(None),
                    });
                }
            },
        );
    }
}

/// The batched reads, shared by a store and its clones.
pub(crate) struct Reader(Batcher<Reads>);

impl Reader {
    /// Look-ups on `pool`, with `lanes` lanes.
    pub(crate) fn new(pool: Pool, statements: StatementCounter, lanes: usize) -> Self {
        Self(Batcher::new(Reads { pool, statements }, lanes))
    }

    /// The command `lookup` names, if any.
    pub(crate) async fn command(
        &self,
        lookup: CommandLookup,
    ) -> Result<Option<CommandRecord>, StoreError> {
        let (reply, outcome) = oneshot::channel();
        self.0.run(Lookup::Command(lookup, reply)).await;
        answer(outcome).await
    }

    /// The queued commands `lookup` names.
    pub(crate) async fn queued(
        &self,
        lookup: QueuedLookup,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        let (reply, outcome) = oneshot::channel();
        self.0.run(Lookup::Queued(lookup, reply)).await;
        answer(outcome).await
    }

    /// The shared session `lookup` names, if any.
    pub(crate) async fn session(
        &self,
        lookup: SessionLookup,
    ) -> Result<Option<SharedSession>, StoreError> {
        let (reply, outcome) = oneshot::channel();
        self.0.run(Lookup::Session(lookup, reply)).await;
        answer(outcome).await
    }
}

async fn commands_rows(
    client: &deadpool_postgres::Client,
    statements: &StatementCounter,
    lookups: &[(CommandLookup, Reply<Option<CommandRecord>>)],
) -> Result<Vec<Row>, StoreError> {
    if let [(l, _)] = lookups {
        let stmt = client.prepare_cached(COMMAND_ONE).await.map_err(backend)?;
        statements.sent(1);
        return client
            .query(&stmt, &[&l.id, &l.owner, &l.agent, &l.device])
            .await
            .map_err(backend);
    }
    let ids: Vec<uuid::Uuid> = lookups.iter().map(|(l, _)| l.id).collect();
    let owners: Vec<&str> = lookups.iter().map(|(l, _)| l.owner.as_str()).collect();
    let agents: Vec<Option<&str>> = lookups.iter().map(|(l, _)| l.agent.as_deref()).collect();
    let devices: Vec<Option<&str>> = lookups.iter().map(|(l, _)| l.device.as_deref()).collect();
    let stmt = client.prepare_cached(COMMANDS).await.map_err(backend)?;
    statements.sent(1);
    client
        .query(&stmt, &[&ids, &owners, &agents, &devices])
        .await
        .map_err(backend)
}

async fn queued_rows(
    client: &deadpool_postgres::Client,
    statements: &StatementCounter,
    lookups: &[(QueuedLookup, Reply<Vec<CommandRecord>>)],
) -> Result<Vec<Row>, StoreError> {
    if let [(l, _)] = lookups {
        let stmt = client.prepare_cached(QUEUED_ONE).await.map_err(backend)?;
        statements.sent(1);
        return client
            .query(&stmt, &[&l.owner, &l.project, &l.device, &l.limit])
            .await
            .map_err(backend);
    }
    let owners: Vec<&str> = lookups.iter().map(|(l, _)| l.owner.as_str()).collect();
    let projects: Vec<&str> = lookups.iter().map(|(l, _)| l.project.as_str()).collect();
    let devices: Vec<&str> = lookups.iter().map(|(l, _)| l.device.as_str()).collect();
    let limits: Vec<i64> = lookups.iter().map(|(l, _)| l.limit).collect();
    let stmt = client.prepare_cached(QUEUED).await.map_err(backend)?;
    statements.sent(1);
    client
        .query(&stmt, &[&owners, &projects, &devices, &limits])
        .await
        .map_err(backend)
}

async fn sessions_rows(
    client: &deadpool_postgres::Client,
    statements: &StatementCounter,
    lookups: &[(SessionLookup, Reply<Option<SharedSession>>)],
) -> Result<Vec<Row>, StoreError> {
    if let [(l, _)] = lookups {
        let stmt = client.prepare_cached(SESSION_ONE).await.map_err(backend)?;
        statements.sent(1);
        return client
            .query(&stmt, &[&l.owner, &l.projects, &l.id])
            .await
            .map_err(backend);
    }
    let mut positions: Vec<i64> = Vec::new();
    let mut owners: Vec<&str> = Vec::new();
    let mut projects: Vec<&str> = Vec::new();
    let mut orders: Vec<i64> = Vec::new();
    let mut ids: Vec<&str> = Vec::new();
    for (n, (l, _)) in (1i64..).zip(lookups) {
        for (order, project) in (1i64..).zip(&l.projects) {
            positions.push(n);
            owners.push(&l.owner);
            projects.push(project);
            orders.push(order);
            ids.push(&l.id);
        }
    }
    let stmt = client.prepare_cached(SESSIONS).await.map_err(backend)?;
    statements.sent(1);
    client
        .query(&stmt, &[&positions, &owners, &projects, &orders, &ids])
        .await
        .map_err(backend)
}

/// Answers each look-up with `decode` of its rows (the rows whose last
/// column is its position, from 1), or all of them with the error.
fn answer_each<L, T>(
    lookups: Vec<(L, Reply<T>)>,
    rows: Result<Vec<Row>, StoreError>,
    decode: impl Fn(&[Row]) -> Result<T, StoreError>,
) {
    let rows = match rows {
        Ok(rows) => rows,
        Err(error) => return fail(lookups, &error),
    };
    let mut per_lookup: Vec<Vec<Row>> = lookups.iter().map(|_| Vec::new()).collect();
    let mut stray = None;
    for row in rows {
        let position = row
            .try_get::<_, i64>(row.len() - 1)
            .map_err(corrupt)
            .and_then(|n| {
                usize::try_from(n - 1)
                    .ok()
                    .filter(|&i| i < per_lookup.len())
                    .ok_or_else(|| {
                        StoreError::Backend(format!("a batched read answered look-up {n}"))
                    })
            });
        match position {
            Ok(i) => per_lookup[i].push(row),
            Err(e) => stray = Some(e),
        }
    }
    if let Some(error) = stray {
        return fail(lookups, &error);
    }
    for ((_, reply), rows) in lookups.into_iter().zip(per_lookup) {
        // The caller may have stopped waiting.
        let _ = reply.send(decode(&rows));
    }
}

/// Answers every look-up with `error`.
fn fail<L, T>(lookups: Vec<(L, Reply<T>)>, error: &StoreError) {
    for (_, reply) in lookups {
        let _ = reply.send(Err(same_error(error)));
    }
}
