//! Which commands other processes changed, and since when: what tells a
//! queue whether its own copy of an open command is still the stored one.
//!
//! A queue keeps the open commands it last wrote or read (`last_seen` in
//! the queue). Its own writes keep those copies up to date; another
//! process's write reaches it only as a notification (through the
//! forwarder, [`Signals::notify_local`]) or as a wake-up of every waiter
//! ([`Signals::wake_all`]: a forwarder that delivers again, a shared file's
//! marker that moved). [`RemoteChanges`] numbers those events: a copy made
//! by an operation that began at [`RemoteChanges::mark`] is the stored
//! command as long as no event since names it
//! ([`RemoteChanges::unchanged_since`]).
//!
//! The events of the commands are kept per command id, bounded: at
//! [`MAX_CHANGED_COMMANDS`] the registry forgets them and counts that as
//! a change of everything.
//!
//! [`Signals::notify_local`]: super::Signals::notify_local
//! [`Signals::wake_all`]: super::Signals::wake_all

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::ids::CommandId;

/// Most commands whose last change is kept before the registry starts over.
pub(crate) const MAX_CHANGED_COMMANDS: usize = 10_000;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct RemoteChanges {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Events so far.
    events: u64,
    /// The event after which nothing is known to be unchanged.
    everything: u64,
    /// Per command: its last event.
    commands: HashMap<CommandId, u64>,
}

/// An instant in the registry's events: taken before an operation reads or
/// writes a command, it says what the operation's copy may have missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Mark(u64);

impl RemoteChanges {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change below leaves the state whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Now, for an operation that is about to begin.
    pub(crate) fn mark(&self) -> Mark {
        Mark(self.lock().events)
    }

    /// Another process changed command `id`.
    pub(crate) fn command(&self, id: &CommandId) {
        let mut state = self.lock();
        state.events += 1;
        let event = state.events;
        if state.commands.len() >= MAX_CHANGED_COMMANDS && !state.commands.contains_key(id) {
            state.commands.clear();
            state.everything = event;
        }
        state.commands.insert(*id, event);
    }

    /// Anything may have changed.
    pub(crate) fn everything(&self) {
        let mut state = self.lock();
        state.events += 1;
        state.everything = state.events;
        state.commands.clear();
    }

    /// True when no change of command `id` by another process is known to
    /// have happened after `mark`.
    pub(crate) fn unchanged_since(&self, id: &CommandId, mark: Mark) -> bool {
        let state = self.lock();
        mark.0 >= state.everything && state.commands.get(id).is_none_or(|&event| mark.0 >= event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> CommandId {
        CommandId::from_uuid(uuid::Uuid::from_u128(n))
    }

    #[test]
    fn a_change_after_the_mark_names_only_its_command() {
        let changes = RemoteChanges::default();
        let before = changes.mark();
        changes.command(&id(1));
        let after = changes.mark();
        assert!(!changes.unchanged_since(&id(1), before));
        assert!(changes.unchanged_since(&id(2), before), "another command");
        assert!(
            changes.unchanged_since(&id(1), after),
            "changed before the mark"
        );
        changes.everything();
        assert!(!changes.unchanged_since(&id(2), after));
        assert!(changes.unchanged_since(&id(2), changes.mark()));
    }

    #[test]
    fn a_full_registry_starts_over_as_a_change_of_everything() {
        let changes = RemoteChanges::default();
        let before = changes.mark();
        for n in 0..MAX_CHANGED_COMMANDS as u128 {
            changes.command(&id(n));
        }
        let after = changes.mark();
        assert!(changes.unchanged_since(&id(u128::MAX), before));
        changes.command(&id(MAX_CHANGED_COMMANDS as u128));
        assert!(!changes.unchanged_since(&id(u128::MAX), after));
        assert!(changes.unchanged_since(&id(u128::MAX), changes.mark()));
        assert_eq!(changes.lock().commands.len(), 1);
    }
}
