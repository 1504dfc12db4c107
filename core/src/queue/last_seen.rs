//! The open commands a queue last wrote or read, so that its next
//! transition of one can skip the read, and so that a request held on one
//! can look at it without the store.
//!
//! A transition ([`Queue::start`](crate::queue::Queue::start),
//! `complete`, `control`, `cancel_graph_run`, …) is a read followed by a
//! compare-and-swap on the record's revision. Most transitions of a command
//! follow one this queue made itself a moment earlier: the insert, then the
//! start, then the control renewals, then the result. [`LastSeen`] keeps
//! the record as this queue last saw it, and the transition tries its
//! compare-and-swap on that copy straight away.
//!
//! A copy is a guess:
//! - the store's compare-and-swap takes it only if no other writer (another
//!   server, another queue on the same store) wrote the command since; if
//!   one did, the write fails and the transition reads the command afresh;
//! - a copy is used only for the party it belongs to (owner and agent, or
//!   owner and device), so "not yours" is still answered by the store.
//!
//! A copy is also an answer when it is *current*: the queue learns of
//! every other process's write as a notification
//! ([`Queue::external_writes_fed`](crate::queue::Queue::external_writes_fed)),
//! and no notification of the command (nor a wake-up of every waiter) came
//! after the operation that made the copy began (its [`Since`], see
//! [`RemoteChanges`](crate::signals::RemoteChanges)). The queue's own
//! writes replace the copy before they notify anyone. A current copy
//! answers a desktop's lease renewal that has nothing to write and the
//! looks of an agent's wait; every refusal is still judged on a fresh read.
//!
//! What makes a copy current only when it is:
//! - an older revision never replaces a newer one;
//! - a command that finished, or whose copy lost a compare-and-swap, leaves
//!   a *tombstone* with the revision it had, so a read that began before
//!   and is kept after cannot bring back an older revision;
//! - a generation that rolls over may take tombstones with it, so a copy
//!   kept by an operation that began before a roll-over is a guess only,
//!   unless the command's entry outlived it.
//!
//! Finished commands are not kept (no transition but a duplicate report
//! follows, and their results can be large); the finished runs an agent
//! reads again have a cache of their own, with its own bound
//! ([`finished`](super::finished)). The cache is bounded in entries and in
//! bytes: two generations of at most [`GENERATION_ENTRIES`] entries and
//! [`GENERATION_BYTES`] each (a copy weighs what its record takes in
//! memory, estimated as the finished runs' cache does); when the current
//! one is full it becomes the previous one and the older one is dropped.
//! A generation holds the runs of several seconds at hundreds of runs a
//! second, so a run's copy outlives the run.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::finished::weight;
use crate::command::CommandRecord;
use crate::ids::CommandId;
use crate::signals::Mark;

/// Most entries in one generation: at 200 runs a second, a run's copy is
/// kept for at least 20 s after its last use.
pub(crate) const GENERATION_ENTRIES: usize = 4096;
/// Most estimated bytes in one generation. A record of an open command is
/// small (no result yet) but for its arguments, at most
/// [`MAX_ARGUMENTS_BYTES`](crate::limits::MAX_ARGUMENTS_BYTES) of JSON.
pub(crate) const GENERATION_BYTES: usize = 8 << 20;

type Map = std::collections::HashMap<CommandId, Kept, foldhash::fast::RandomState>;

/// An entry and its weight.
struct Kept {
    entry: Entry,
    bytes: usize,
}

/// When an operation that reads or writes a command began: what its copy
/// may have missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Since {
    /// Other processes' changes so far.
    pub(crate) remote: Mark,
    /// This cache's roll-overs so far.
    generation: u64,
}

/// What is kept of a command.
// A tombstone takes a copy's room in the table for as long as a copy
// would stay; boxing the copy instead would cost an allocation per put.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Entry {
    /// An open command, and when the operation that kept it began (`None`:
    /// a guess only, see the module docs).
    Open(CommandRecord, Option<Mark>),
    /// A command that finished, or whose copy turned out old: no copy, and
    /// none older than this revision.
    Gone(u64),
}

impl Entry {
    fn revision(&self) -> u64 {
        match self {
            Entry::Open(record, _) => record.revision,
            Entry::Gone(revision) => *revision,
        }
    }
}

/// See the module docs.
#[derive(Default)]
pub(crate) struct LastSeen {
    state: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    current: Map,
    /// Weight of `current`.
    current_bytes: usize,
    previous: Map,
    /// Roll-overs so far.
    rolled: u64,
}

impl LastSeen {
    fn lock(&self) -> MutexGuard<'_, Generations> {
        // Every change below leaves both maps consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Now, for an operation that is about to read or write a command
    /// (`remote`: [`RemoteChanges::mark`](crate::signals::RemoteChanges::mark)).
    pub(crate) fn since(&self, remote: Mark) -> Since {
        Since {
            remote,
            generation: self.lock().rolled,
        }
    }

    /// The last copy of command `id` that `belongs` accepts, and the mark
    /// it is current from, if it may be.
    pub(crate) fn get(
        &self,
        id: &CommandId,
        belongs: impl FnOnce(&CommandRecord) -> bool,
    ) -> Option<(CommandRecord, Option<Mark>)> {
        let mut state = self.lock();
        if !state.current.contains_key(id) {
            // A copy that is used moves to the current generation.
            let kept = state.previous.remove(id)?;
            state.insert(*id, kept.entry);
        }
        match &state.current.get(id)?.entry {
            Entry::Open(record, mark) => belongs(record).then(|| (record.clone(), *mark)),
            Entry::Gone(_) => None,
        }
    }

    /// Keeps `record`, as the operation that began at `since` read or wrote
    /// it, unless a newer revision is kept (a finished command leaves a
    /// tombstone instead).
    pub(crate) fn put(&self, record: &CommandRecord, since: Since) {
        let mut state = self.lock();
        let kept = state.entry(&record.id);
        let mark = match kept {
            Some(Entry::Gone(revision)) if *revision >= record.revision => return,
            Some(kept) if kept.revision() > record.revision => return,
            // The same revision kept by two operations: each saw it
            // current after its own mark, so it is current from the later.
            Some(Entry::Open(same, mark)) if same.revision == record.revision => {
                Some(mark.map_or(since.remote, |m| m.max(since.remote)))
            }
            Some(_) => Some(since.remote),
            // A tombstone may have gone with a roll-over since.
            None => (since.generation == state.rolled).then_some(since.remote),
        };
        let entry = if record.status.is_terminal() {
            Entry::Gone(record.revision)
        } else {
            Entry::Open(record.clone(), mark)
        };
        state.previous.remove(&record.id);
        state.insert(record.id, entry);
    }

    /// Command `id`'s copy turned out old (it lost a compare-and-swap, or
    /// the command is not found): no copy until the next read or write.
    pub(crate) fn forget(&self, id: &CommandId) {
        let mut state = self.lock();
        let Some(revision) = state.entry(id).map(Entry::revision) else {
            return;
        };
        state.previous.remove(id);
        state.insert(*id, Entry::Gone(revision));
    }

    /// Entries kept (copies and tombstones), for tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let state = self.lock();
        state.current.len() + state.previous.len()
    }
}

impl Generations {
    fn entry(&self, id: &CommandId) -> Option<&Entry> {
        self.current
            .get(id)
            .or_else(|| self.previous.get(id))
            .map(|kept| &kept.entry)
    }

    /// Puts `entry` in the current generation (the caller took it out of
    /// the previous one).
    fn insert(&mut self, id: CommandId, entry: Entry) {
        if let Some(old) = self.current.remove(&id) {
            self.current_bytes -= old.bytes;
        }
        let bytes = match &entry {
            Entry::Open(record, _) => weight(record),
            Entry::Gone(_) => std::mem::size_of::<Kept>(),
        };
        if self.current.len() >= GENERATION_ENTRIES || self.current_bytes + bytes > GENERATION_BYTES
        {
            // The older generation's table, emptied, is reused.
            std::mem::swap(&mut self.previous, &mut self.current);
            self.current.clear();
            self.current_bytes = 0;
            self.rolled += 1;
        }
        self.current_bytes += bytes;
        self.current.insert(id, Kept { entry, bytes });
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::command::CommandStatus;
    use crate::ids::{AgentId, DeviceId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId};
    use crate::signals::RemoteChanges;
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

    /// A registry of other processes' changes, and `since` from it.
    fn at(changes: &RemoteChanges, live: &LastSeen) -> Since {
        live.since(changes.mark())
    }

    #[test]
    fn keeps_the_newest_open_revision_and_forgets_finished_ones() {
        let ids = SeededIds::new(1);
        let (live, changes) = (LastSeen::default(), RemoteChanges::default());
        let mut record = queued(ids.new_command_id());
        live.put(&record, at(&changes, &live));
        let older = record.clone();
        record.revision += 1;
        live.put(&record, at(&changes, &live));
        live.put(&older, at(&changes, &live));
        let (kept, mark) = live.get(&record.id, |_| true).expect("kept");
        assert_eq!(kept.revision, record.revision, "an older copy never wins");
        assert!(mark.is_some(), "current from its mark");
        assert!(
            live.get(&record.id, |_| false).is_none(),
            "not this party's"
        );
        live.forget(&record.id);
        assert!(live.get(&record.id, |_| true).is_none(), "forgotten");
        live.put(&record, at(&changes, &live));
        assert!(
            live.get(&record.id, |_| true).is_none(),
            "the revision that turned out old does not come back"
        );
        record.revision += 1;
        live.put(&record, at(&changes, &live));
        assert!(live.get(&record.id, |_| true).is_some(), "a newer one does");
        record.status = CommandStatus::Completed;
        record.revision += 1;
        live.put(&record, at(&changes, &live));
        assert!(
            live.get(&record.id, |_| true).is_none(),
            "finished: forgotten"
        );
        assert_eq!(live.len(), 1, "its tombstone");
    }

    #[test]
    fn a_read_kept_after_the_run_finished_does_not_bring_it_back() {
        let ids = SeededIds::new(2);
        let (live, changes) = (LastSeen::default(), RemoteChanges::default());
        let mut record = queued(ids.new_command_id());
        // A sync reads the queued run; before it keeps what it read, the
        // run is started and finished by this queue.
        let read = record.clone();
        let read_began = at(&changes, &live);
        record.revision += 1;
        live.put(&record, at(&changes, &live));
        record.status = CommandStatus::Completed;
        record.revision += 1;
        live.put(&record, at(&changes, &live));
        live.put(&read, read_began);
        assert!(live.get(&record.id, |_| true).is_none());
    }

    #[test]
    fn a_copy_kept_across_a_roll_over_is_a_guess_unless_its_entry_stayed() {
        let ids = SeededIds::new(3);
        let (live, changes) = (LastSeen::default(), RemoteChanges::default());
        let stays = queued(ids.new_command_id());
        live.put(&stays, at(&changes, &live));
        let began = at(&changes, &live);
        let unseen = queued(ids.new_command_id());
        for _ in 0..GENERATION_ENTRIES {
            live.put(&queued(ids.new_command_id()), at(&changes, &live));
        }
        // Rolled over once: `stays` is in the previous generation.
        live.put(&unseen, began);
        live.put(&stays, began);
        let (_, mark) = live.get(&unseen.id, |_| true).expect("kept");
        assert_eq!(mark, None, "its tombstone may have gone with the roll-over");
        let (_, mark) = live.get(&stays.id, |_| true).expect("kept");
        assert!(mark.is_some(), "its entry outlived the roll-over");
    }

    #[test]
    fn the_same_revision_is_current_from_the_later_mark() {
        let ids = SeededIds::new(4);
        let (live, changes) = (LastSeen::default(), RemoteChanges::default());
        let record = queued(ids.new_command_id());
        let early = at(&changes, &live);
        changes.command(&record.id);
        let late = at(&changes, &live);
        live.put(&record, late);
        live.put(&record, early);
        let (_, mark) = live.get(&record.id, |_| true).expect("kept");
        assert_eq!(mark, Some(late.remote));
        assert!(changes.unchanged_since(&record.id, late.remote));
    }

    #[test]
    fn holds_at_most_two_generations() {
        let ids = SeededIds::new(7);
        let (live, changes) = (LastSeen::default(), RemoteChanges::default());
        let first = queued(ids.new_command_id());
        live.put(&first, at(&changes, &live));
        let second = queued(ids.new_command_id());
        live.put(&second, at(&changes, &live));
        for _ in 0..(2 * GENERATION_ENTRIES) {
            live.put(&queued(ids.new_command_id()), at(&changes, &live));
            // A copy that is used moves to the current generation.
            assert!(live.get(&second.id, |_| true).is_some());
        }
        assert!(live.len() <= 2 * GENERATION_ENTRIES, "{} kept", live.len());
        assert!(live.get(&first.id, |_| true).is_none(), "the oldest went");
        assert!(live.get(&second.id, |_| true).is_some(), "a used one stays");
    }

    #[test]
    fn holds_at_most_two_generations_of_bytes() {
        let ids = SeededIds::new(8);
        let (live, changes) = (LastSeen::default(), RemoteChanges::default());
        let mut arguments = serde_json::Map::new();
        arguments.insert("blob".into(), "x".repeat(1 << 20).into());
        let arguments = std::sync::Arc::new(arguments);
        for _ in 0..40 {
            let mut record = queued(ids.new_command_id());
            record.arguments = arguments.clone();
            live.put(&record, at(&changes, &live));
        }
        // Each weighs a little over 1 MiB: fewer than 8 fit in 8 MiB.
        assert!(
            live.len() <= 2 * (GENERATION_BYTES >> 20),
            "{} kept",
            live.len()
        );
        assert!(live.len() >= 2, "{} kept", live.len());
    }
}
