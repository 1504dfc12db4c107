//! A record's JSON written straight into a buffer: byte for byte what its
//! `Serialize` gives `serde_json`, for the stores that write it at every
//! transition.
//!
//! Going through serde costs a call per field and a byte-by-byte escape
//! scan of every key and string; a record is about 25 fields, and a
//! lifecycle writes it three times (queued, running, finished), which made
//! the encoding about a seventh of a SQLite lifecycle's instructions. Here
//! the keys are literals and a string without anything to escape is copied
//! whole; what is not flat (the arguments, a result envelope, progress)
//! still goes through `serde_json`. The test below holds the two encodings
//! equal over records in every state, with strings that need escaping.

use super::CommandRecord;
use crate::time::Timestamp;

impl CommandRecord {
    /// Appends this record's JSON to `out`: the same bytes as
    /// `serde_json::to_writer(out, self)`, written faster.
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
    ///     serde_json::Map::from_iter([("q".to_owned(), "a \"quoted\" text".into())]),
    ///     IdempotencyKey::parse("run-key-0001")?,
    ///     Timestamp(1_767_225_600_000),
    /// );
    /// let mut fast = Vec::new();
    /// record.write_json(&mut fast)?;
    /// assert_eq!(fast, serde_json::to_vec(&record)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        // Every field, so that a new one cannot be left out unnoticed.
        let CommandRecord {
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
        } = self;
        let mut uuid = uuid::Uuid::encode_buffer();
        out.extend_from_slice(b"{\"id\":");
        string(out, id.as_uuid().hyphenated().encode_lower(&mut uuid))?;
        out.extend_from_slice(b",\"agent\":");
        string(out, agent.as_str())?;
        out.extend_from_slice(b",\"owner\":");
        string(out, owner.as_str())?;
        out.extend_from_slice(b",\"project\":");
        string(out, project.as_str())?;
        out.extend_from_slice(b",\"device\":");
        string(out, device.as_str())?;
        out.extend_from_slice(b",\"graph_session_id\":");
        string(out, graph_session_id.as_str())?;
        out.extend_from_slice(b",\"arguments\":");
        serde_json::to_writer(&mut *out, &**arguments)?;
        out.extend_from_slice(b",\"slug\":");
        string(out, slug)?;
        out.extend_from_slice(b",\"idempotency_key\":");
        string(out, idempotency_key.as_str())?;
        out.extend_from_slice(b",\"status\":");
        string(out, status.as_str())?;
        out.extend_from_slice(if *cancel_requested {
            b",\"cancel_requested\":true"
        } else {
            b",\"cancel_requested\":false"
        });
        out.extend_from_slice(b",\"execution_id\":");
        match execution_id {
            Some(e) => string(out, e.as_str())?,
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"created_at\":");
        number(out, created_at.0);
        out.extend_from_slice(b",\"started_at\":");
        optional_time(out, *started_at);
        out.extend_from_slice(b",\"cancel_requested_at\":");
        optional_time(out, *cancel_requested_at);
        out.extend_from_slice(b",\"finished_at\":");
        optional_time(out, *finished_at);
        out.extend_from_slice(b",\"completion\":");
        match completion {
            Some(envelope) => serde_json::to_writer(&mut *out, envelope)?,
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"reason\":");
        match reason {
            Some(text) => string(out, text)?,
            None => out.extend_from_slice(b"null"),
        }
        // Left out when absent, as the derive's `skip_serializing_if` does.
        if let Some(at) = lease_expires_at {
            out.extend_from_slice(b",\"lease_expires_at\":");
            number(out, at.0);
        }
        if let Some(at) = heard_at {
            out.extend_from_slice(b",\"heard_at\":");
            number(out, at.0);
        }
        if let Some(progress) = progress {
            out.extend_from_slice(b",\"progress\":");
            serde_json::to_writer(&mut *out, progress)?;
        }
        out.extend_from_slice(b",\"revision\":");
        number(out, *revision);
        out.push(b'}');
        Ok(())
    }
}

impl CommandRecord {
    /// This record's JSON as a string ([`CommandRecord::write_json`]): what
    /// a store keeps in its `record` column.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        // The buffer starts at 1 KiB: grown from a small one by doubling, a
        // typical record of 500-900 bytes took three reallocations and
        // copies (1.3% of the instructions of a SQLite lifecycle, measured
        // with callgrind).
        let mut json = Vec::with_capacity(JSON_CAPACITY);
        self.write_json(&mut json)?;
        into_string(json)
    }
}

/// JSON written by this module as a string. Every byte came from a `&str`
/// or from `serde_json`, so the check cannot fail; it is kept rather than
/// trusted.
pub(super) fn into_string(json: Vec<u8>) -> Result<String, serde_json::Error> {
    String::from_utf8(json)
        .map_err(|e| serde_json::Error::io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// Initial size of the buffer of `CommandRecord::to_json`: a typical
/// record fits.
const JSON_CAPACITY: usize = 1024;

/// `text` as a JSON string: copied whole when nothing in it is escaped
/// (the ids, keys and slugs always), else written by `serde_json`.
pub(super) fn string(out: &mut Vec<u8>, text: &str) -> Result<(), serde_json::Error> {
    // No early exit: the scan of a whole id is then a few vector compares.
    let escaped = text.bytes().fold(false, |seen, b| {
        seen | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if escaped {
        return serde_json::to_writer(&mut *out, text);
    }
    out.reserve(text.len() + 2);
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
    Ok(())
}

/// A number, or `null`.
fn optional_time(out: &mut Vec<u8>, at: Option<Timestamp>) {
    match at {
        Some(at) => number(out, at.0),
        None => out.extend_from_slice(b"null"),
    }
}

/// `n` in decimal, as `serde_json` writes it.
pub(super) fn number(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::command::{CommandStatus, Progress};
    use crate::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
    use crate::ids::{
        AgentId, CommandId, DeviceId, ExecutionId, GraphSessionId, IdempotencyKey, OwnerId,
        ProjectId,
    };

    fn queued(text: &str) -> CommandRecord {
        let arguments = json!({"q": text, "n": [1, 2.5, -3], "deep": {"x": null, "y": true}});
        let serde_json::Value::Object(arguments) = arguments else {
            unreachable!("an object")
        };
        let mut record = CommandRecord::queued(
            CommandId::from_uuid(uuid::Uuid::from_u128(
                0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
            )),
            AgentId::parse("assistant").expect("id"),
            OwnerId::parse("alice").expect("id"),
            ProjectId::parse("p1").expect("id"),
            DeviceId::parse("desk-1").expect("id"),
            GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef").expect("id"),
            arguments,
            IdempotencyKey::parse("run-key-0001").expect("key"),
            Timestamp(1_767_225_600_000),
        );
        record.slug = Arc::from(format!("graph {text}"));
        record
    }

    /// Records in every state the queue writes, with text that needs
    /// escaping (quotes, backslashes, control characters, non-ASCII).
    pub(in crate::command) fn records() -> Vec<CommandRecord> {
        let texts = [
            "plain",
            "",
            "a \"quoted\" \\ back\\slash",
            "line\nbreak\ttab\u{1}\u{1f}",
            "日本語 ünïcødé 🚀",
        ];
        let mut all = Vec::new();
        for text in texts {
            let fresh = queued(text);
            let mut running = fresh.clone();
            running.status = CommandStatus::Running;
            running.execution_id = Some(ExecutionId::parse("exec-1").expect("id"));
            running.started_at = Some(Timestamp(1_767_225_601_000));
            running.lease_expires_at = Some(Timestamp(1_767_225_631_000));
            running.heard_at = Some(Timestamp(1_767_225_602_000));
            running.progress = Some(Progress {
                message: Some(text.to_owned()),
                percent: Some(42.5),
                updated_at: Timestamp(1_767_225_602_000),
            });
            running.revision = 1;
            let mut cancelling = running.clone();
            cancelling.cancel_requested = true;
            cancelling.cancel_requested_at = Some(Timestamp(1_767_225_603_000));
            cancelling.revision = 2;
            let mut completed = running.clone();
            completed.status = CommandStatus::Completed;
            completed.finished_at = Some(Timestamp(u64::MAX));
            completed.completion = Some(ResultEnvelope {
                execution_id: ExecutionId::parse("exec-1").expect("id"),
                status: FinishStatus::Completed,
                body: Some(Arc::new(EnvelopeBody {
                    result: json!({"text": text, "cost": 0.1}),
                    total_tokens: Some(42),
                    reported_cost: Some(0.5),
                    error: None,
                })),
            });
            completed.revision = u64::MAX;
            let mut truncated = completed.clone();
            truncated.status = CommandStatus::Failed;
            truncated.completion = Some(ResultEnvelope {
                execution_id: ExecutionId::parse("exec-1").expect("id"),
                status: FinishStatus::Failed,
                body: None,
            });
            let mut cancelled = fresh.clone();
            cancelled.status = CommandStatus::Cancelled;
            cancelled.reason = Some(text.to_owned());
            cancelled.finished_at = Some(Timestamp(0));
            all.extend([fresh, running, cancelling, completed, truncated, cancelled]);
        }
        all
    }

    #[test]
    fn the_fast_encoding_is_serdes_byte_for_byte() {
        for record in records() {
            let fast = record.to_json().expect("encodes").into_bytes();
            let slow = serde_json::to_vec(&record).expect("encodes");
            assert_eq!(
                String::from_utf8_lossy(&fast),
                String::from_utf8_lossy(&slow)
            );
            let back: CommandRecord = serde_json::from_slice(&fast).expect("decodes");
            assert_eq!(back, record);
        }
    }

    #[test]
    fn numbers_are_written_in_decimal() {
        for n in [0, 7, 10, 99, 1_767_225_600_000, u64::MAX] {
            let mut out = Vec::new();
            number(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
    }
}
