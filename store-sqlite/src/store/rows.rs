//! How a command and a shared session are written to and read from their
//! rows, and how the row's errors become the store's.

use std::sync::Arc;

use graph_relay_core::command::CommandRecord;
use graph_relay_core::ids::{CommandId, DeviceId, ProjectId};
use graph_relay_core::session::SharedSession;
use graph_relay_core::store::StoreError;
use graph_relay_core::time::Timestamp;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, Row, params};

use crate::cache::{Entry, MetaCache, RecordCache};
use crate::database::{DbError, Statements};

/// A command as its row stores it; the record and its JSON are shared with
/// the cache, which learns them once the write committed.
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
                json: c.to_json().map_err(|e| DbError::Encode(e.to_string()))?,
                record: c,
            }),
        })
    }

    pub(super) fn insert(&self, conn: &Connection, statements: &Statements) -> Result<(), DbError> {
        let c = &self.entry.record;
        statements.add(1);
        let inserted = conn
            .prepare_cached(
                "INSERT INTO commands
                    (id, agent, owner, project, device, idempotency_key, status, created_at,
                     finished_at, revision, record, lease_expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT (id) DO NOTHING",
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
                self.lease_expires_at
            ])?;
        if inserted == 0 {
            return Err(DbError::Sqlite(format!(
                "command {} already exists",
                self.id
            )));
        }
        Ok(())
    }
}

/// The record of one row selected with [`select_commands!`].
///
/// The record is the JSON column, taken from `cache` if it holds exactly
/// that JSON, else decoded (and remembered). The other columns are copies
/// of its fields for the indexes and are checked against it.
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
    let id_column = utf8(text(0, "id")?, "id")?;
    let id = parse(CommandId::parse(id_column), "commands.id")?;
    let json = text(5, "record")?;
    let (entry, fresh) = match cache.get(&id, json) {
        Some(entry) => (entry, false),
        None => {
            let json = utf8(json, "record")?;
            let record: CommandRecord = serde_json::from_str(json)
                .map_err(|e| DbError::Corrupt(format!("command {id_column}: record: {e}")))?;
            let entry = Entry {
                json: json.to_owned(),
                record,
            };
            (Arc::new(entry), true)
        }
    };
    let record = &entry.record;
    let consistent = record.id == id
        && record.agent.as_str().as_bytes() == text(1, "agent")?
        && record.owner.as_str().as_bytes() == text(6, "owner")?
        && record.device.as_str().as_bytes() == text(2, "device")?
        && record.status.as_str().as_bytes() == text(3, "status")?
        && i64::try_from(record.revision).ok() == Some(row.get::<_, i64>(4)?);
    if !consistent {
        return Err(DbError::Corrupt(format!(
            "command {id_column}: the columns disagree with the stored record"
        )));
    }
    let decoded = record.clone();
    if fresh {
        cache.put(id, entry);
    }
    Ok(decoded)
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
