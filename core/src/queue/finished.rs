//! Finished runs a queue last wrote or read, so that reading one again
//! ([`Queue::get_graph_run`](crate::queue::Queue::get_graph_run), and every
//! look of a `wait_seconds` call) costs no store access.
//!
//! A finished (terminal) command never changes: the state machine has no
//! transition out of `completed`, `failed` or `cancelled`, and a duplicate
//! report writes nothing. The one thing that can still happen to its row
//! is that a pruner deletes it. [`FinishedRuns`] keeps three rules:
//!
//! - An open record is never kept. A run that another process completes,
//!   cancels or closes is therefore read from the store the first time
//!   this queue looks at it finished, and only that read (or this queue's
//!   own write of the finished record) fills the cache.
//! - Pruning deletes a terminal command once `finished_at <= now -
//!   retention` ([`PruneRequest`](crate::store::PruneRequest)). A kept
//!   record is served only while `now < finished_at + horizon`, where the
//!   horizon is the queue's [`terminal_retention`] but at most
//!   [`MAX_HORIZON`] (one hour; with no retention, the hour). So a record
//!   leaves the cache no later than the first instant this queue's own
//!   pruning could delete its row, and no later than an hour after it
//!   finished whatever the configuration says.
//! - A record is served only to its own party, under its owner: the agent
//!   that queued it, exactly as [`Store::command_for_agent`] would find
//!   it, or the desktop it ran on, as [`Store::command_for_device`] would
//!   (a held control request that its run's end woke). Anyone else's read
//!   (and "not found") goes to the store.
//!
//! The assumption, for stores shared by several processes (a SQLite file,
//! a Postgres database): every process that prunes keeps finished runs for
//! at least this queue's horizon, i.e. its `terminal_retention` is at
//! least `min(this queue's terminal_retention, 1 h)`, plus however far its
//! clock runs ahead of this one. Processes with the same configuration (or
//! the default thirty days) meet it with an hour to spare; only a pruner
//! configured to keep finished runs for less than an hour, next to queues
//! that keep them longer, breaks it. The hour costs little: a finished run
//! is read again mostly in the minutes after it finished (the agent's poll
//! or `wait_seconds` call that sees it end, then the reads of its result).
//!
//! The cache is bounded in records and in bytes: two generations of at
//! most [`GENERATION_RECORDS`] records and [`GENERATION_BYTES`] each (a
//! record weighs what its result, arguments and texts take in memory,
//! estimated); when the current one is full it becomes the previous one
//! and the older one is dropped. A record heavier than [`MAX_RECORD_BYTES`]
//! is not kept.
//!
//! [`terminal_retention`]: crate::queue::QueueConfig::terminal_retention
//! [`Store::command_for_agent`]: crate::store::Store::command_for_agent
//! [`Store::command_for_device`]: crate::store::Store::command_for_device

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::Value;

use super::Party;
use crate::command::CommandRecord;
use crate::ids::CommandId;
use crate::time::Timestamp;

/// The longest a finished record is served after it finished, whatever the
/// retention: what makes the cache safe next to pruners with a shorter
/// retention than this queue's (see the module docs).
pub(crate) const MAX_HORIZON: Duration = Duration::from_secs(3600);
/// Most records in one generation.
pub(crate) const GENERATION_RECORDS: usize = 1024;
/// Most estimated bytes in one generation.
pub(crate) const GENERATION_BYTES: usize = 8 << 20;
/// Heavier records are read from the store every time. A result envelope
/// is at most [`RESULT_LIMIT`](crate::limits::RESULT_LIMIT) characters of
/// JSON, which weighs well under this unless it is made of tiny values.
pub(crate) const MAX_RECORD_BYTES: usize = 1 << 20;

/// A kept record, its weight and until when it may be served.
struct Entry {
    record: CommandRecord,
    bytes: usize,
    /// `finished_at` plus the horizon: from this instant a pruner may have
    /// deleted the row.
    serve_until: Timestamp,
}

type Map = HashMap<CommandId, Entry, foldhash::fast::RandomState>;

/// See the module docs.
pub(crate) struct FinishedRuns {
    horizon: Duration,
    state: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    current: Map,
    /// Weight of `current`.
    current_bytes: usize,
    previous: Map,
}

impl FinishedRuns {
    /// An empty cache for a queue that keeps finished runs for `retention`
    /// (`None`: forever).
    pub(crate) fn new(retention: Option<Duration>) -> Self {
        Self {
            horizon: retention.map_or(MAX_HORIZON, |r| r.min(MAX_HORIZON)),
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Generations> {
        // Every change below leaves both maps consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The finished record of command `id` if it is `party`'s and may
    /// still be served at `now`.
    pub(super) fn get(
        &self,
        party: &Party<'_>,
        id: &CommandId,
        now: Timestamp,
    ) -> Option<CommandRecord> {
        let mut state = self.lock();
        if !state.current.contains_key(id) {
            // A record that is read moves to the current generation.
            let entry = state.previous.remove(id)?;
            state.insert(*id, entry);
        }
        let entry = state.current.get(id)?;
        if now >= entry.serve_until {
            // A pruner may have deleted the row: never again from here.
            let bytes = entry.bytes;
            state.current.remove(id);
            state.current_bytes -= bytes;
            return None;
        }
        let record = &entry.record;
        party.owns(record).then(|| record.clone())
    }

    /// Keeps `record` if it is finished and may be served at `now`; open
    /// records are never kept.
    pub(crate) fn put(&self, record: &CommandRecord, now: Timestamp) {
        if !record.status.is_terminal() {
            return;
        }
        let Some(finished_at) = record.finished_at else {
            return;
        };
        let serve_until = finished_at.plus(self.horizon);
        let bytes = weight(record);
        if now >= serve_until || bytes > MAX_RECORD_BYTES {
            return;
        }
        let entry = Entry {
            record: record.clone(),
            bytes,
            serve_until,
        };
        let mut state = self.lock();
        state.previous.remove(&record.id);
        state.insert(record.id, entry);
    }

    /// Records kept and their weight, for tests.
    #[cfg(test)]
    pub(crate) fn footprint(&self) -> (usize, usize) {
        let state = self.lock();
        let previous: usize = state.previous.values().map(|e| e.bytes).sum();
        (
            state.current.len() + state.previous.len(),
            state.current_bytes + previous,
        )
    }
}

impl Generations {
    fn insert(&mut self, id: CommandId, entry: Entry) {
        if let Some(old) = self.current.remove(&id) {
            self.current_bytes -= old.bytes;
        }
        if self.current.len() >= GENERATION_RECORDS
            || self.current_bytes + entry.bytes > GENERATION_BYTES
        {
            // The older generation's table, emptied, becomes the new
            // current one: its allocation is reused, not grown again.
            std::mem::swap(&mut self.previous, &mut self.current);
            self.current.clear();
            self.current_bytes = 0;
        }
        self.current_bytes += entry.bytes;
        self.current.insert(id, entry);
    }
}

/// What `record` takes in memory, estimated: the record itself plus what
/// its JSON values and texts hold on the heap.
pub(super) fn weight(record: &CommandRecord) -> usize {
    let texts = [
        record.reason.as_deref(),
        record.progress.as_ref().and_then(|p| p.message.as_deref()),
    ];
    let mut bytes = std::mem::size_of::<CommandRecord>()
        + record.slug.len()
        + texts.iter().flatten().map(|t| t.len()).sum::<usize>()
        + record
            .arguments
            .iter()
            .map(|(k, v)| map_entry_weight(k, v))
            .sum::<usize>();
    if let Some(completion) = &record.completion {
        bytes += std::mem::size_of_val(completion);
        if let Some(body) = &completion.body {
            bytes += value_weight(&body.result) + body.error.as_ref().map_or(0, String::len);
        }
    }
    bytes
}

/// A JSON value's own size and what it holds on the heap (a map entry
/// counts its key, its value and a few words of the map's node).
fn value_weight(value: &Value) -> usize {
    std::mem::size_of::<Value>()
        + match value {
            Value::String(s) => s.len(),
            Value::Array(items) => items.iter().map(value_weight).sum(),
            Value::Object(map) => map.iter().map(|(k, v)| map_entry_weight(k, v)).sum(),
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
        }
}

fn map_entry_weight(key: &str, value: &Value) -> usize {
    std::mem::size_of::<String>()
        + key.len()
        + 2 * std::mem::size_of::<usize>()
        + value_weight(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::CommandStatus;
    use crate::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
    use crate::ids::{AgentId, DeviceId, ExecutionId, OwnerId, ProjectId};
    use crate::principal::{Agent, Device};
    use crate::time::{IdSource, SeededIds};

    const FINISHED: Timestamp = Timestamp(10_000);

    fn agent(owner: &str, name: &str) -> Agent {
        Agent::new(
            AgentId::parse(name).expect("id"),
            OwnerId::parse(owner).expect("id"),
            [ProjectId::parse("project").expect("id")],
        )
    }

    fn finished(id: CommandId, result: Value) -> CommandRecord {
        let mut record = crate::queue::last_seen::tests::queued(id);
        record.status = CommandStatus::Completed;
        record.finished_at = Some(FINISHED);
        record.completion = Some(ResultEnvelope::build(
            ExecutionId::parse("exec").expect("id"),
            FinishStatus::Completed,
            EnvelopeBody {
                result,
                total_tokens: None,
                reported_cost: None,
                error: None,
            },
        ));
        record.revision = 3;
        record
    }

    #[test]
    fn a_finished_record_is_served_to_its_agent_until_its_horizon() {
        let ids = SeededIds::new(1);
        let cache = FinishedRuns::new(Some(Duration::from_secs(60)));
        let record = finished(ids.new_command_id(), Value::from(1));
        let owner = agent("owner", "agent");
        cache.put(&record, FINISHED);
        assert_eq!(
            cache.get(&Party::Agent(&owner), &record.id, FINISHED),
            Some(record.clone())
        );
        // The same agent name under another owner, another agent of the owner.
        assert_eq!(
            cache.get(
                &Party::Agent(&agent("other", "agent")),
                &record.id,
                FINISHED
            ),
            None
        );
        assert_eq!(
            cache.get(
                &Party::Agent(&agent("owner", "helper")),
                &record.id,
                FINISHED
            ),
            None
        );
        let last = Timestamp(FINISHED.0 + 59_999);
        assert!(cache.get(&Party::Agent(&owner), &record.id, last).is_some());
        // From finished_at + retention on, a pruner may delete the row.
        let prunable = Timestamp(FINISHED.0 + 60_000);
        assert_eq!(cache.get(&Party::Agent(&owner), &record.id, prunable), None);
        assert_eq!(cache.footprint(), (0, 0), "an expired record is dropped");
        cache.put(&record, prunable);
        assert_eq!(cache.footprint(), (0, 0), "nor kept again");
    }

    #[test]
    fn a_finished_record_is_served_to_the_desktop_it_ran_on() {
        let ids = SeededIds::new(5);
        let cache = FinishedRuns::new(None);
        let record = finished(ids.new_command_id(), Value::from(2));
        cache.put(&record, FINISHED);
        let device = |owner: &str, name: &str| {
            Device::new(
                DeviceId::parse(name).expect("id"),
                OwnerId::parse(owner).expect("id"),
            )
        };
        let own = device(record.owner.as_str(), record.device.as_str());
        assert_eq!(
            cache.get(&Party::Device(&own), &record.id, FINISHED),
            Some(record.clone())
        );
        // The same device name under another owner, another desktop of the owner.
        let elsewhere = device("other", record.device.as_str());
        assert_eq!(
            cache.get(&Party::Device(&elsewhere), &record.id, FINISHED),
            None
        );
        let sibling = device(record.owner.as_str(), "another-desk");
        assert_eq!(
            cache.get(&Party::Device(&sibling), &record.id, FINISHED),
            None
        );
    }

    #[test]
    fn open_records_are_never_kept() {
        let ids = SeededIds::new(2);
        let cache = FinishedRuns::new(None);
        let mut record = finished(ids.new_command_id(), Value::Null);
        record.status = CommandStatus::Running;
        record.finished_at = None;
        cache.put(&record, FINISHED);
        assert_eq!(
            cache.get(
                &Party::Agent(&agent("owner", "agent")),
                &record.id,
                FINISHED
            ),
            None
        );
    }

    #[test]
    fn the_horizon_is_the_retention_but_at_most_an_hour() {
        let hour_ms = MAX_HORIZON.as_millis() as u64;
        let owner = agent("owner", "agent");
        for (retention, horizon_ms) in [
            (None, hour_ms),
            (Some(Duration::from_secs(30 * 24 * 3600)), hour_ms),
            (Some(Duration::from_secs(10)), 10_000),
            (Some(Duration::ZERO), 0),
        ] {
            let ids = SeededIds::new(3);
            let cache = FinishedRuns::new(retention);
            let record = finished(ids.new_command_id(), Value::Null);
            cache.put(&record, FINISHED);
            let before = Timestamp((FINISHED.0 + horizon_ms).saturating_sub(1));
            let at = Timestamp(FINISHED.0 + horizon_ms);
            assert_eq!(
                cache
                    .get(&Party::Agent(&owner), &record.id, before)
                    .is_some(),
                horizon_ms > 0,
                "{retention:?}"
            );
            assert!(
                cache.get(&Party::Agent(&owner), &record.id, at).is_none(),
                "{retention:?}"
            );
        }
    }

    #[test]
    fn holds_at_most_two_generations_by_count_and_by_bytes() {
        let ids = SeededIds::new(4);
        let owner = agent("owner", "agent");
        let cache = FinishedRuns::new(None);
        let hot = finished(ids.new_command_id(), Value::Null);
        cache.put(&hot, FINISHED);
        for _ in 0..(3 * GENERATION_RECORDS) {
            cache.put(&finished(ids.new_command_id(), Value::Null), FINISHED);
            // A record that is read moves to the current generation.
            assert!(
                cache
                    .get(&Party::Agent(&owner), &hot.id, FINISHED)
                    .is_some()
            );
            assert!(cache.footprint().0 <= 2 * GENERATION_RECORDS);
        }
        // Large results: the bytes bind before the count does.
        let large = Value::String("x".repeat(90_000));
        let cache = FinishedRuns::new(None);
        let first = finished(ids.new_command_id(), large.clone());
        cache.put(&first, FINISHED);
        for _ in 0..(4 * GENERATION_BYTES / 90_000) {
            cache.put(&finished(ids.new_command_id(), large.clone()), FINISHED);
            let (records, bytes) = cache.footprint();
            assert!(bytes <= 2 * GENERATION_BYTES, "{bytes} bytes");
            assert!(records < GENERATION_RECORDS, "{records} records");
        }
        assert!(
            cache
                .get(&Party::Agent(&owner), &first.id, FINISHED)
                .is_none(),
            "the oldest went"
        );
        // A record heavier than the bound is not kept at all.
        let huge = Value::Array(vec![Value::from(0); MAX_RECORD_BYTES / 32]);
        let heavy = finished(ids.new_command_id(), huge);
        assert!(weight(&heavy) > MAX_RECORD_BYTES);
        cache.put(&heavy, FINISHED);
        assert!(
            cache
                .get(&Party::Agent(&owner), &heavy.id, FINISHED)
                .is_none()
        );
    }
}
