//! A record in two parts, for a store that keeps some of its fields in
//! columns of their own: the [`RecordHead`] (what the store indexes,
//! matches or updates on) and the body, the rest, as JSON.
//!
//! A SQLite row used to carry the whole record as JSON beside copies of
//! its head in columns: the head twice, and every field that is `null` or
//! `false` spelled out. Half of a typical record's JSON was such repeats,
//! and the bytes of a row are what a write pays for (its pages, the WAL,
//! the checkpoint). The body leaves the head out, and with it every field
//! at its default.
//!
//! The body of a record is read back with [`CommandRecord::from_parts`],
//! which also takes the JSON of a whole record: its head fields are then
//! ignored in favour of the head given, so rows written before the split
//! read the same.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::json::{into_string, number, string};
use super::{CommandRecord, CommandStatus, Progress};
use crate::envelope::ResultEnvelope;
use crate::ids::{
    AgentId, CommandId, DeviceId, ExecutionId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId,
};
use crate::time::Timestamp;

/// The fields of a record a store keeps in columns: its identity, where it
/// is filed, the idempotency key, and what its indexes and conditional
/// writes read (status, times, lease, revision). The rest is the body
/// ([`CommandRecord::write_body_json`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHead {
    /// [`CommandRecord::id`].
    pub id: CommandId,
    /// [`CommandRecord::agent`].
    pub agent: AgentId,
    /// [`CommandRecord::owner`].
    pub owner: OwnerId,
    /// [`CommandRecord::project`].
    pub project: ProjectId,
    /// [`CommandRecord::device`].
    pub device: DeviceId,
    /// [`CommandRecord::idempotency_key`].
    pub idempotency_key: IdempotencyKey,
    /// [`CommandRecord::status`].
    pub status: CommandStatus,
    /// [`CommandRecord::created_at`].
    pub created_at: Timestamp,
    /// [`CommandRecord::finished_at`].
    pub finished_at: Option<Timestamp>,
    /// [`CommandRecord::lease_expires_at`].
    pub lease_expires_at: Option<Timestamp>,
    /// [`CommandRecord::revision`].
    pub revision: u64,
}

/// The body as it is read: every field of a record that is not in the
/// head, each at its default when absent. Unknown fields (a whole record's
/// head) are skipped.
#[derive(Deserialize)]
struct Body {
    graph_session_id: GraphSessionId,
    arguments: Arc<Map<String, Value>>,
    #[serde(default)]
    slug: Arc<str>,
    #[serde(default)]
    cancel_requested: bool,
    #[serde(default)]
    execution_id: Option<ExecutionId>,
    #[serde(default)]
    started_at: Option<Timestamp>,
    #[serde(default)]
    cancel_requested_at: Option<Timestamp>,
    #[serde(default)]
    completion: Option<ResultEnvelope>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    heard_at: Option<Timestamp>,
    #[serde(default)]
    progress: Option<Progress>,
}

impl CommandRecord {
    /// Appends the JSON of this record's body to `out`: the fields that are
    /// not in its [`RecordHead`], leaving out those at their default
    /// (`false`, `null`).
    ///
    /// ```
    /// use graph_relay_core::command::CommandRecord;
    /// use graph_relay_core::ids::*;
    /// use graph_relay_core::time::Timestamp;
    ///
    /// let record = CommandRecord::queued(
    ///     CommandId::from_uuid(uuid::Uuid::from_u128(7)),
    ///     AgentId::parse("assistant")?,
    ///     OwnerId::parse("alice")?,
    ///     ProjectId::parse("p1")?,
    ///     DeviceId::parse("desk-1")?,
    ///     GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef")?,
    ///     serde_json::Map::from_iter([("q".to_owned(), "text".into())]),
    ///     IdempotencyKey::parse("run-key-0001")?,
    ///     Timestamp(1_767_225_600_000),
    /// );
    /// let mut body = Vec::new();
    /// record.write_body_json(&mut body)?;
    /// assert_eq!(
    ///     std::str::from_utf8(&body)?,
    ///     r#"{"graph_session_id":"gs_0123456789abcdef0123456789abcdef","arguments":{"q":"text"},"slug":""}"#
    /// );
    /// let back = CommandRecord::from_parts(record.head(), std::str::from_utf8(&body)?)?;
    /// assert_eq!(back, record);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write_body_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        // Every field, so that a new one cannot be left out unnoticed: a
        // field is either in the head or written here.
        let CommandRecord {
            id: _,
            agent: _,
            owner: _,
            project: _,
            device: _,
            idempotency_key: _,
            status: _,
            created_at: _,
            finished_at: _,
            lease_expires_at: _,
            revision: _,
            graph_session_id,
            arguments,
            slug,
            cancel_requested,
            execution_id,
            started_at,
            cancel_requested_at,
            completion,
            reason,
            heard_at,
            progress,
        } = self;
        out.extend_from_slice(b"{\"graph_session_id\":");
        string(out, graph_session_id.as_str())?;
        out.extend_from_slice(b",\"arguments\":");
        serde_json::to_writer(&mut *out, &**arguments)?;
        out.extend_from_slice(b",\"slug\":");
        string(out, slug)?;
        if *cancel_requested {
            out.extend_from_slice(b",\"cancel_requested\":true");
        }
        if let Some(execution) = execution_id {
            out.extend_from_slice(b",\"execution_id\":");
            string(out, execution.as_str())?;
        }
        time_field(out, b",\"started_at\":", *started_at);
        time_field(out, b",\"cancel_requested_at\":", *cancel_requested_at);
        if let Some(envelope) = completion {
            out.extend_from_slice(b",\"completion\":");
            serde_json::to_writer(&mut *out, envelope)?;
        }
        if let Some(text) = reason {
            out.extend_from_slice(b",\"reason\":");
            string(out, text)?;
        }
        time_field(out, b",\"heard_at\":", *heard_at);
        if let Some(progress) = progress {
            out.extend_from_slice(b",\"progress\":");
            serde_json::to_writer(&mut *out, progress)?;
        }
        out.push(b'}');
        Ok(())
    }

    /// This record's body JSON as a string ([`CommandRecord::write_body_json`]).
    pub fn body_json(&self) -> Result<String, serde_json::Error> {
        // A typical body is 200-500 bytes.
        let mut json = Vec::with_capacity(512);
        self.write_body_json(&mut json)?;
        into_string(json)
    }

    /// This record's head.
    pub fn head(&self) -> RecordHead {
        RecordHead {
            id: self.id,
            agent: self.agent.clone(),
            owner: self.owner.clone(),
            project: self.project.clone(),
            device: self.device.clone(),
            idempotency_key: self.idempotency_key.clone(),
            status: self.status,
            created_at: self.created_at,
            finished_at: self.finished_at,
            lease_expires_at: self.lease_expires_at,
            revision: self.revision,
        }
    }

    /// The record of `head` and `body`, the JSON of its body
    /// ([`CommandRecord::write_body_json`]) or of the whole record, whose
    /// head fields are then ignored.
    pub fn from_parts(head: RecordHead, body: &str) -> Result<Self, serde_json::Error> {
        let Body {
            graph_session_id,
            arguments,
            slug,
            cancel_requested,
            execution_id,
            started_at,
            cancel_requested_at,
            completion,
            reason,
            heard_at,
            progress,
        } = serde_json::from_str(body)?;
        let RecordHead {
            id,
            agent,
            owner,
            project,
            device,
            idempotency_key,
            status,
            created_at,
            finished_at,
            lease_expires_at,
            revision,
        } = head;
        Ok(CommandRecord {
            id,
            agent,
            owner,
            project,
            device,
            graph_session_id,
            arguments,
            slug,
            idempotency_key,
            status,
            cancel_requested,
            execution_id,
            created_at,
            started_at,
            cancel_requested_at,
            finished_at,
            completion,
            reason,
            lease_expires_at,
            heard_at,
            progress,
            revision,
        })
    }
}

/// `,"name":n` when the time is there.
fn time_field(out: &mut Vec<u8>, key: &[u8], at: Option<Timestamp>) {
    if let Some(at) = at {
        out.extend_from_slice(key);
        number(out, at.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::json::tests::records;

    #[test]
    fn a_record_is_its_head_and_its_body() {
        for record in records() {
            let body = record.body_json().expect("encodes");
            let back = CommandRecord::from_parts(record.head(), &body).expect("decodes");
            assert_eq!(back, record);
        }
    }

    #[test]
    fn the_body_leaves_out_the_head_and_the_defaults() {
        for record in records() {
            let body = record.body_json().expect("encodes");
            let fields: serde_json::Map<String, Value> =
                serde_json::from_str(&body).expect("an object");
            for head in [
                "id",
                "agent",
                "owner",
                "project",
                "device",
                "idempotency_key",
                "status",
                "created_at",
                "finished_at",
                "lease_expires_at",
                "revision",
            ] {
                assert!(!fields.contains_key(head), "{head} is in the head");
            }
            assert!(
                fields
                    .values()
                    .all(|v| !v.is_null() && v != &Value::Bool(false))
            );
            assert!(body.len() < record.to_json().expect("encodes").len() / 2 + 200);
        }
    }

    #[test]
    fn the_json_of_a_whole_record_reads_as_a_body() {
        for record in records() {
            let whole = record.to_json().expect("encodes");
            let back = CommandRecord::from_parts(record.head(), &whole).expect("decodes");
            assert_eq!(back, record);
            // The head given wins over the one in the JSON.
            let mut head = record.head();
            head.revision = head.revision.wrapping_add(1);
            let moved = CommandRecord::from_parts(head, &whole).expect("decodes");
            assert_eq!(moved.revision, record.revision.wrapping_add(1));
        }
    }

    #[test]
    fn a_body_without_its_required_fields_is_refused() {
        let record = records().remove(0);
        for broken in ["{}", r#"{"arguments":{}}"#, "[]", "not json"] {
            assert!(CommandRecord::from_parts(record.head(), broken).is_err());
        }
    }
}
