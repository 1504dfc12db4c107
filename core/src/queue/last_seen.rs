//! The open commands a queue last wrote or read, so that its next
//! transition of one can skip the read.
//!
//! A transition ([`Queue::start`](crate::queue::Queue::start),
//! `complete`, `control`, `cancel_graph_run`, …) is a read followed by a
//! compare-and-swap on the record's revision. Most transitions of a command
//! follow one this queue made itself a moment earlier: the insert, then the
//! start, then the control renewals, then the result. [`LastSeen`] keeps
//! the record as this queue last saw it, and the transition tries its
//! compare-and-swap on that copy straight away.
//!
//! The copy is a guess, never an answer:
//! - the store's compare-and-swap takes it only if no other writer (another
//!   server, another queue on the same store) wrote the command since; if
//!   one did, the write fails and the transition reads the command afresh;
//! - a transition that would refuse or leave the command unchanged judged
//!   by the copy reads it afresh and judges again, so every refusal and
//!   every "already done" answer comes from the store;
//! - a copy is used only for the party it belongs to (owner and agent, or
//!   owner and device), so "not yours" is still answered by the store.
//!
//! Finished commands are not kept (no transition but a duplicate report
//! follows, and their results can be large); the finished runs an agent
//! reads again have a cache of their own, with its own bound
//! ([`finished`](super::finished)). The cache is bounded: two
//! generations of at most [`GENERATION`] records each; when the current one
//! is full it becomes the previous one and the older one is dropped.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::command::CommandRecord;
use crate::ids::CommandId;

/// Most records in one generation. A record of an open command is small
/// (no result yet) but for its arguments, at most
/// [`MAX_ARGUMENTS_BYTES`](crate::limits::MAX_ARGUMENTS_BYTES) of JSON and
/// shared with every other copy of the record, so the cache's worst case
/// is 512 runs that all carry the largest arguments allowed.
pub(crate) const GENERATION: usize = 256;

type Map = std::collections::HashMap<CommandId, CommandRecord, foldhash::fast::RandomState>;

/// See the module docs.
#[derive(Default)]
pub(crate) struct LastSeen {
    state: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    current: Map,
    previous: Map,
}

impl LastSeen {
    fn lock(&self) -> MutexGuard<'_, Generations> {
        // Every change below leaves both maps consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The last copy of command `id` that `belongs` accepts.
    pub(crate) fn get(
        &self,
        id: &CommandId,
        belongs: impl FnOnce(&CommandRecord) -> bool,
    ) -> Option<CommandRecord> {
        let mut state = self.lock();
        if let Some(record) = state.current.get(id) {
            return belongs(record).then(|| record.clone());
        }
        let record = state.previous.remove(id)?;
        let found = belongs(&record).then(|| record.clone());
        state.insert(record);
        found
    }

    /// Remembers `record` as the latest revision of its command (a
    /// finished command is forgotten instead). An older revision than the
    /// one kept is ignored.
    pub(crate) fn put(&self, record: &CommandRecord) {
        let mut state = self.lock();
        if record.status.is_terminal() {
            state.current.remove(&record.id);
            state.previous.remove(&record.id);
            return;
        }
        let newer_kept = state
            .current
            .get(&record.id)
            .or_else(|| state.previous.get(&record.id))
            .is_some_and(|kept| kept.revision > record.revision);
        if !newer_kept {
            state.previous.remove(&record.id);
            state.insert(record.clone());
        }
    }

    /// Forgets command `id` (its copy lost a compare-and-swap).
    pub(crate) fn forget(&self, id: &CommandId) {
        let mut state = self.lock();
        state.current.remove(id);
        state.previous.remove(id);
    }

    /// Records kept, for tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let state = self.lock();
        state.current.len() + state.previous.len()
    }
}

impl Generations {
    fn insert(&mut self, record: CommandRecord) {
        if self.current.len() >= GENERATION && !self.current.contains_key(&record.id) {
            // The older generation's table, emptied, is reused.
            std::mem::swap(&mut self.previous, &mut self.current);
            self.current.clear();
        }
        self.current.insert(record.id, record);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::command::CommandStatus;
    use crate::ids::{AgentId, DeviceId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId};
    use crate::time::{IdSource, SeededIds, Timestamp};

    /// A queued command of agent `agent`, owner `owner` (the queue's
    /// caches' tests share it).
    pub(in crate::queue) fn queued(id: CommandId) -> CommandRecord {
        CommandRecord::queued(
            id,
            AgentId::parse("agent").expect("id"),
            OwnerId::parse("owner").expect("id"),
            ProjectId::parse("project").expect("id"),
            DeviceId::parse("desktop").expect("id"),
            GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef").expect("id"),
            serde_json::Map::new(),
            IdempotencyKey::parse("key-0001").expect("key"),
            Timestamp(1_000),
        )
    }

    #[test]
    fn keeps_the_newest_open_revision_and_forgets_finished_ones() {
        let ids = SeededIds::new(1);
        let live = LastSeen::default();
        let mut record = queued(ids.new_command_id());
        live.put(&record);
        let older = record.clone();
        record.revision += 1;
        live.put(&record);
        live.put(&older);
        let kept = live.get(&record.id, |_| true).expect("kept");
        assert_eq!(kept.revision, record.revision, "an older copy never wins");
        assert!(
            live.get(&record.id, |_| false).is_none(),
            "not this party's"
        );
        live.forget(&record.id);
        assert!(live.get(&record.id, |_| true).is_none(), "forgotten");
        live.put(&record);
        record.status = CommandStatus::Completed;
        record.revision += 1;
        live.put(&record);
        assert!(
            live.get(&record.id, |_| true).is_none(),
            "finished: forgotten"
        );
        assert_eq!(live.len(), 0);
    }

    #[test]
    fn holds_at_most_two_generations() {
        let ids = SeededIds::new(7);
        let live = LastSeen::default();
        let first = queued(ids.new_command_id());
        live.put(&first);
        let second = queued(ids.new_command_id());
        live.put(&second);
        for _ in 0..(2 * GENERATION) {
            live.put(&queued(ids.new_command_id()));
            // A copy that is used moves to the current generation.
            assert!(live.get(&second.id, |_| true).is_some());
        }
        assert!(live.len() <= 2 * GENERATION, "{} kept", live.len());
        assert!(live.get(&first.id, |_| true).is_none(), "the oldest went");
        assert!(live.get(&second.id, |_| true).is_some(), "a used one stays");
    }
}
