//! The statements of the group-commit writer ([`super::writes`]): one for
//! a batch of any mix of inserts and compare-and-swaps, and one for each
//! kind of write alone.

/// The compare-and-swaps of a batch, `$1..$8` their columns as arrays (the
/// position, then the command, its previous revision and what a swap
/// writes): the whole of [`UPDATES`] and the `swapped` step of [`WRITES`],
/// one text for both.
macro_rules! swaps {
    () => {
        "UPDATE commands AS c SET
        status = u.status, finished_at = u.finished_at, revision = u.revision,
        record = u.record, lease_expires_at = u.lease_expires_at
    FROM (
        SELECT u.*, t.tid FROM unnest(
            (SELECT $1::int8[]), (SELECT $2::uuid[]), (SELECT $3::int8[]),
            (SELECT $4::text[]), (SELECT $5::int8[]), (SELECT $6::int8[]),
            (SELECT $7::text[]), (SELECT $8::int8[]))
            AS u(pos, id, previous, status, finished_at, revision, record, lease_expires_at)
        CROSS JOIN LATERAL (
            SELECT ctid AS tid FROM commands WHERE id = u.id AND revision = u.previous
            OFFSET 0) AS t
    ) AS u
    WHERE c.ctid = u.tid
    RETURNING u.pos"
    };
}

/// A batch of writes: `$1..$8` are the compare-and-swaps' columns (those of
/// [`UPDATES`]), `$9..$28` the inserts', each column an array. The first
/// column of each kind is the write's position in the batch (from 1); the
/// statement returns the position of every write that took effect.
///
/// Inserts and swaps share the statement so that they share its commit:
/// the writes of lifecycles at different steps (one being queued, another
/// started, a third completed) wait for one flush of the WAL together
/// instead of one flush per kind. The two kinds never touch one row: an
/// insert writes a new command, and a swap of that command can only follow
/// the insert's answer, so it is in a later batch.
///
/// An insert writes its key unless a live key (`expires_at` after the
/// insert's own `now`) exists, replacing an expired one, and writes its
/// command only if it wrote the key: one statement, so both or neither.
/// Concurrent inserts of one key from another batch or another server
/// serialise on the key's index entry: the later one waits for the earlier
/// to commit and then sees a live key. Keys are written in the order of
/// their text, so two batches that share keys wait for each other in one
/// order and never deadlock. A batch holds at most one insert per key
/// (two in one statement would make Postgres refuse it).
///
/// An insert with a share guard (`$26..$28`: the session, the agent's
/// projects as a JSON array of strings, the slug) writes neither key nor
/// command unless the session still resolves to the command's project and
/// device under that slug: its first share in the agent's projects, in
/// their order, then by smallest device (as the look-up of `reads` finds
/// it), with the slug in its metadata. Nothing is locked: a sync that
/// changes the share and commits while the insert runs is the same race
/// as a look-up followed by an insert. An insert without one (`NULL`s)
/// writes whatever the shares.
///
/// A swap changes only what a transition can change (the status,
/// `finished_at`, the revision, the record and the lease). It finds its row
/// by id and revision in a fenced `LATERAL` subquery and updates it by its
/// `ctid`: the plan is then an index look-up and a TID fetch per swap
/// whatever the table's statistics (see the statements of `reads` for why
/// that matters). If another transaction changes the row after the
/// look-up, the swap waits for it and then, as the row's newest version
/// has another `ctid`, leaves it alone: the revision moved, so the swap
/// fails, as it must. If two swaps of the batch name the same command and
/// revision, one of them takes effect and the other reports `false`, as if
/// they had run one after the other.
///
/// Each array is read through a scalar subquery (`(SELECT $1::int8[])`):
/// the planner then cannot see how long it is, so its plan does not depend
/// on the batch's size, and Postgres settles on one generic plan after the
/// first few executions instead of planning every batch again (measured:
/// planning took as long as executing a batch of six writes).
pub(crate) const WRITES: &str = concat!(
    "WITH i AS (
        SELECT * FROM unnest(
            (SELECT $9::int8[]), (SELECT $10::uuid[]), (SELECT $11::text[]), (SELECT $12::text[]),
            (SELECT $13::text[]), (SELECT $14::text[]), (SELECT $15::text[]), (SELECT $16::text[]),
            (SELECT $17::int8[]), (SELECT $18::int8[]), (SELECT $19::text[]), (SELECT $20::text[]),
            (SELECT $21::int8[]), (SELECT $22::int8[]), (SELECT $23::int8[]), (SELECT $24::text[]),
            (SELECT $25::int8[]), (SELECT $26::text[]), (SELECT $27::text[]),
            (SELECT $28::text[]))
            AS i(pos, id, owner, agent, key, project, device, fingerprint, expires_at, now,
                 idempotency_key, status, created_at, finished_at, revision, record,
                 lease_expires_at, guard_session, guard_projects, guard_slug)
    ), g AS (
        SELECT * FROM i
        WHERE i.guard_session IS NULL OR (SELECT s.project = i.project AND s.device = i.device
                AND s.meta::jsonb ->> 'slug' = i.guard_slug
            FROM jsonb_array_elements_text(i.guard_projects::jsonb)
                WITH ORDINALITY AS p(project, position)
            JOIN shared_sessions AS s ON s.owner = i.owner AND s.project = p.project
                AND s.graph_session_id = i.guard_session
            ORDER BY p.position, s.device LIMIT 1)
    ), k AS (
        INSERT INTO idempotency_keys AS k (owner, agent, key, command, fingerprint, expires_at)
        SELECT owner, agent, key, id, fingerprint, expires_at FROM g ORDER BY owner, agent, key
        ON CONFLICT (owner, agent, key) DO UPDATE SET
            command = EXCLUDED.command,
            fingerprint = EXCLUDED.fingerprint,
            expires_at = EXCLUDED.expires_at
        WHERE k.expires_at <= (SELECT i.now FROM i
                               WHERE i.owner = EXCLUDED.owner AND i.agent = EXCLUDED.agent
                                 AND i.key = EXCLUDED.key)
        RETURNING owner, agent, key
    ), inserted AS (
        INSERT INTO commands (id, agent, owner, project, device, idempotency_key, status,
                              created_at, finished_at, revision, record, lease_expires_at)
        SELECT i.id, i.agent, i.owner, i.project, i.device, i.idempotency_key, i.status,
               i.created_at, i.finished_at, i.revision, i.record, i.lease_expires_at
        FROM g AS i JOIN k ON k.owner = i.owner AND k.agent = i.agent AND k.key = i.key
        ORDER BY i.pos
        RETURNING id
    ), swapped AS (
        ",
    swaps!(),
    "
    )
    SELECT i.pos FROM inserted JOIN i ON i.id = inserted.id
    UNION ALL
    SELECT pos FROM swapped"
);

/// An insert alone: `$1..$19` are its columns, as scalars (those of
/// [`WRITES`] without the position). A batch of one write runs the
/// statement of its kind: the batch statement's arrays, subqueries and
/// joins cost the server about twice a plain statement's time when there
/// is only one row to write (measured), and a lone write is the common
/// case of a quiet server.
pub(crate) const INSERT_ONE: &str = "WITH g AS (
        SELECT WHERE $17::text IS NULL OR (SELECT s.project = $5 AND s.device = $6
                AND s.meta::jsonb ->> 'slug' = $19::text
            FROM jsonb_array_elements_text($18::text::jsonb) WITH ORDINALITY AS p(project, position)
            JOIN shared_sessions AS s ON s.owner = $2 AND s.project = p.project
                AND s.graph_session_id = $17
            ORDER BY p.position, s.device LIMIT 1)
    ), k AS (
        INSERT INTO idempotency_keys AS k (owner, agent, key, command, fingerprint, expires_at)
        SELECT $2, $3, $4, $1, $7, $8 FROM g
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

/// A compare-and-swap alone: `$1..$7` are its columns, as scalars.
pub(crate) const UPDATE_ONE: &str = "UPDATE commands SET
        status = $3, finished_at = $4, revision = $5, record = $6, lease_expires_at = $7
    WHERE id = $1 AND revision = $2
    RETURNING 1::int8";

/// Compare-and-swaps alone, as arrays: the swaps of [`WRITES`] without its
/// inserts, so a batch of only starts and results runs a plan of its own
/// size.
pub(crate) const UPDATES: &str = swaps!();
