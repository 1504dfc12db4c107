//! How a command and a shared session are written to and read from their
//! rows, and how the row's errors become the store's.

use std::sync::Arc;

use graph_relay_core::command::{CommandRecord, CommandStatus, RecordHead};
use graph_relay_core::ids::{AgentId, CommandId, DeviceId, IdempotencyKey, OwnerId, ProjectId};
use graph_relay_core::session::SharedSession;
use graph_relay_core::store::StoreError;
use graph_relay_core::time::Timestamp;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, Row, params};

use crate::cache::{Entry, MetaCache, RecordCache};
use crate::database::{DbError, Statements};

/// A command as its row stores it: the record's head in columns, its body
/// as JSON in `record` (see [`CommandRecord::write_body_json`]). The record
/// and its body are shared with the cache, which learns them once the
/// write committed.
pub(super) struct CommandRow {
    pub(super) id: String,
    pub(super) created_at: i64,
    pub(super) finished_at: Option<i64>,
    pub(super) lease_expires_at: Option<i64>,
    pub(super) revision: i64,
    pub(super) entry: Arc<Entry>,
}

impl CommandRow {
    pub(super) fn encode(c: CommandRecord) -> Result<Self, DbError> {
        Ok(Self {
            id: id_text(&c.id),
            created_at: encode_millis(c.created_at)?,
            finished_at: c.finished_at.map(encode_millis).transpose()?,
            lease_expires_at: c.lease_expires_at.map(encode_millis).transpose()?,
            revision: i64::try_from(c.revision)
                .map_err(|_| DbError::Encode(format!("revision {} is too large", c.revision)))?,
            entry: Arc::new(Entry {
                json: c.body_json().map_err(|e| DbError::Encode(e.to_string()))?,
                record: c,
            }),
        })
    }

    /// Inserts the row, holding `key` (the request's fingerprint and when
    /// the key expires) if given. False if nothing was written: the id
    /// exists, or a key row holds the same (key, agent, owner) — live or
    /// expired, the caller decides.
    pub(super) fn insert(
        &self,
        conn: &Connection,
        statements: &Statements,
        key: Option<(&str, i64)>,
    ) -> Result<bool, DbError> {
        let c = &self.entry.record;
        statements.add(1);
        let inserted = conn
            .prepare_cached(
                "INSERT INTO commands
                    (id, agent, owner, project, device, idempotency_key, status, created_at,
                     finished_at, revision, record, lease_expires_at, key_fingerprint,
                     key_expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
                 ON CONFLICT DO NOTHING",
            )?
            .execute(params![
                self.id,
                c.agent.as_str(),
                c.owner.as_str(),
                c.project.as_str(),
                c.device.as_str(),
                c.idempotency_key.as_str(),
                c.status.as_str(),
                self.created_at,
                self.finished_at,
                self.revision,
                self.entry.json,
                self.lease_expires_at,
                key.map(|(fingerprint, _)| fingerprint),
                key.map(|(_, expires_at)| expires_at),
            ])?;
        Ok(inserted == 1)
    }

    /// The error of an insert that found its id taken.
    pub(super) fn id_taken(&self) -> DbError {
        DbError::Sqlite(format!("command {} already exists", self.id))
    }
}

/// The record of one row selected with [`select_commands!`]: its head from
/// the columns, its body from the `record` column (the body alone, or the
/// whole record as rows written before the split hold it).
///
/// The record is taken from `cache` if the cached one was stored with
/// exactly this body and this head; otherwise it is decoded (and
/// remembered).
pub(super) fn decode_row(row: &Row<'_>, cache: &RecordCache) -> Result<CommandRecord, DbError> {
    // The text of a column, as bytes: compared as they are (equal to a
    // string means valid UTF-8), validated only where they are parsed.
    let text = |i: usize, column: &str| match row.get_ref(i)? {
        ValueRef::Text(bytes) => Ok(bytes),
        other => Err(DbError::Corrupt(format!(
            "commands.{column}: {} instead of text",
            other.data_type()
        ))),
    };
    let utf8 = |bytes, column: &str| {
        std::str::from_utf8(bytes).map_err(|e| DbError::Corrupt(format!("commands.{column}: {e}")))
    };
    let time = |i: usize| row.get::<_, Option<i64>>(i)?.map(timestamp).transpose();
    let id_column = utf8(text(0, "id")?, "id")?;
    let id = parse(CommandId::parse(id_column), "commands.id")?;
    let json = text(5, "record")?;
    let revision = row.get::<_, i64>(4)?;
    let status = text(3, "status")?;
    let finished_at = time(10)?;
    let lease_expires_at = time(11)?;
    if let Some(entry) = cache.get(&id, json) {
        // The mutable head must match too; the rest of the head never
        // changes once the row is written.
        let r = &entry.record;
        if i64::try_from(r.revision).ok() == Some(revision)
            && r.status.as_str().as_bytes() == status
            && r.finished_at == finished_at
            && r.lease_expires_at == lease_expires_at
        {
            return Ok(r.clone());
        }
    }
    let head = RecordHead {
        id,
        agent: parsed_column(row, 1, "agent", AgentId::parse)?,
        owner: parsed_column(row, 6, "owner", OwnerId::parse)?,
        project: parsed_column(row, 7, "project", ProjectId::parse)?,
        device: parsed_column(row, 2, "device", DeviceId::parse)?,
        idempotency_key: parsed_column(row, 8, "idempotency_key", IdempotencyKey::parse)?,
        status: CommandStatus::parse(utf8(status, "status")?).ok_or_else(|| {
            DbError::Corrupt(format!("commands.status of {id_column}: unknown status"))
        })?,
        created_at: timestamp(row.get(9)?)?,
        finished_at,
        lease_expires_at,
        revision: u64::try_from(revision)
            .map_err(|_| DbError::Corrupt(format!("commands.revision of {id_column}: negative")))?,
    };
    let body = utf8(json, "record")?;
    let record = CommandRecord::from_parts(head, body)
        .map_err(|e| DbError::Corrupt(format!("command {id_column}: record: {e}")))?;
    cache.put(
        id,
        Arc::new(Entry {
            json: body.to_owned(),
            record: record.clone(),
        }),
    );
    Ok(record)
}

/// Column `i` of a `commands` row, an identifier read with `parse_id`: a
/// value that is not text, not UTF-8 or not a valid identifier is
/// corruption.
fn parsed_column<T, E: std::fmt::Display>(
    row: &Row<'_>,
    i: usize,
    column: &str,
    parse_id: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, DbError> {
    let text = row
        .get_ref(i)?
        .as_str()
        .map_err(|e| DbError::Corrupt(format!("commands.{column}: {e}")))?;
    parse(parse_id(text), &format!("commands.{column}"))
}

/// The text of a command id in the database: lowercase hyphenated, as the
/// id prints, without going through the formatting machinery.
pub(super) fn id_text(id: &CommandId) -> String {
    let mut buffer = [0u8; 36];
    id.as_uuid()
        .hyphenated()
        .encode_lower(&mut buffer)
        .to_owned()
}

/// The shared session of one row `SELECT project, device, synced_at, meta`
/// of `shared_sessions`; the metadata through `metas`.
pub(super) fn decode_session(row: &Row<'_>, metas: &MetaCache) -> Result<SharedSession, DbError> {
    let text = |i: usize, column: &str| {
        row.get_ref(i)?
            .as_str()
            .map_err(|e| DbError::Corrupt(format!("shared_sessions.{column}: {e}")))
    };
    Ok(SharedSession {
        project: parse(
            ProjectId::parse(text(0, "project")?),
            "shared_sessions.project",
        )?,
        device: parse(
            DeviceId::parse(text(1, "device")?),
            "shared_sessions.device",
        )?,
        meta: metas.get_or_decode(text(3, "meta")?)?,
        synced_at: timestamp(row.get(2)?)?,
    })
}

/// A stored id that no longer parses is corruption.
pub(super) fn parse<T, E: std::fmt::Display>(
    parsed: Result<T, E>,
    column: &str,
) -> Result<T, DbError> {
    parsed.map_err(|e| DbError::Corrupt(format!("{column}: {e}")))
}

pub(super) fn encode_millis(t: Timestamp) -> Result<i64, DbError> {
    i64::try_from(t.as_millis())
        .map_err(|_| DbError::Encode(format!("timestamp {} ms is out of range", t.as_millis())))
}

pub(super) fn millis(t: Timestamp) -> Result<i64, StoreError> {
    encode_millis(t).map_err(store_error)
}

pub(super) fn revision(r: u64) -> Result<i64, StoreError> {
    i64::try_from(r).map_err(|_| StoreError::Backend(format!("revision {r} is too large")))
}

pub(crate) fn timestamp(ms: i64) -> Result<Timestamp, DbError> {
    u64::try_from(ms)
        .map(Timestamp)
        .map_err(|_| DbError::Corrupt(format!("negative timestamp {ms}")))
}

/// A limit, to be written into the SQL text as a literal: SQLite re-plans a
/// statement whenever a `LIMIT ?` parameter is bound again (its value may
/// change the plan), which costs more than the query. The text, and so the
/// cached statement, is the same for every call with the same limit.
pub(crate) fn sql_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(super) fn store_error(e: DbError) -> StoreError {
    match e {
        DbError::Corrupt(m) => StoreError::Corrupt(m),
        other => StoreError::Backend(other.to_string()),
    }
}
