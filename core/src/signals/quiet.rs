//! Desktops found with nothing queued, kept until work may have come.
//!
//! Thousands of idle long-polling desktops come back every hold, and the
//! first look of each held sync used to read the store only to find the
//! queue empty, as it was at the previous one. [`Signals`] notifies
//! [`Topic::DeviceWork`] after every queued run (from this process and,
//! through the forwarder, from the others), and [`Signals::wake_all`] when
//! anything may have changed; so a desktop whose last look found nothing,
//! and that no notification named since, still has nothing queued.
//!
//! A look that found a few runs counts too: the desktop takes them, and
//! once this queue started each of them ([`QuietDevices::started`]) and no
//! notification named the desktop since, nothing is queued for it either.
//! So the held sync a desktop sends after delivering its result reads no
//! queue.
//!
//! A run this queue queues for a desktop it knows joins the runs it has
//! to take, instead of making it forgotten: when that run is the only one,
//! the held sync it wakes answers with this queue's current copy of it
//! (`Queue::queued_from_memory`), again without reading the queue.
//!
//! The rules that make it exact:
//!
//! - A look is kept only if *no* notification at all (of any desktop)
//!   arrived between the moment it began ([`QuietDevices::look`]) and the
//!   moment it is kept ([`QuietDevices::found`]): a run queued while the
//!   store was read may be missing from what it read. It is kept only if
//!   it saw everything queued (it was not cut at the sync's limit).
//! - A notification of a desktop's work forgets it, and a wake-up of all
//!   forgets every one, under the same lock and before any waiter wakes.
//!   A run queued here is added to the desktop's runs to take under the
//!   same lock and before any waiter wakes, and only to a look of its
//!   owner and project; it counts as a notification for the looks under
//!   way.
//! - A run leaves the runs still to take only when this queue started it:
//!   it is then running, and nothing brings a run back to the queue. A run
//!   that ended otherwise (cancelled, declined, started by another
//!   process) stays, and the desktop's next look reads the store.
//! - A queued run is notified only after its write: until then a look
//!   from memory may miss it, as a look at the store a moment earlier
//!   would have. A held sync subscribes before its first look, so the
//!   notification that follows wakes it, and that look reads the store.
//!
//! The registry is bounded like the queue's memos: at
//! [`MAX_QUIET_DEVICES`] a new desktop empties it first.
//!
//! [`Signals`]: super::Signals
//! [`Signals::wake_all`]: super::Signals::wake_all
//! [`Topic::DeviceWork`]: super::Topic::DeviceWork

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::ids::{CommandId, DeviceId, OwnerId, ProjectId};

/// Most desktops kept before the registry starts over.
pub(crate) const MAX_QUIET_DEVICES: usize = 100_000;
/// A look that found more runs than this is not kept.
pub(crate) const MAX_TO_TAKE: usize = 8;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct QuietDevices {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Notifications of work (and wake-ups of all) so far.
    epoch: u64,
    /// Per device id: what its last kept look found.
    devices: HashMap<DeviceId, Found>,
}

/// What a look found queued for a desktop in one project.
#[derive(Debug)]
struct Found {
    owner: OwnerId,
    project: ProjectId,
    /// The runs found that this queue has not started yet.
    to_take: Vec<CommandId>,
}

/// A look at a desktop's queue that began: what
/// [`QuietDevices::found_nothing`] checks for notifications since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Look(u64);

impl QuietDevices {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change below is one assignment: nothing half-done to see.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A look at the store begins (call it before reading).
    pub(crate) fn look(&self) -> Look {
        Look(self.lock().epoch)
    }

    /// The look that began as `look` found `queued`, everything queued for
    /// `device` of `owner` in `project`: kept, unless a notification came
    /// meanwhile or it found more than [`MAX_TO_TAKE`].
    pub(crate) fn found(
        &self,
        look: Look,
        owner: &OwnerId,
        device: &DeviceId,
        project: &ProjectId,
        queued: &[CommandId],
    ) {
        let mut state = self.lock();
        if state.epoch != look.0 || queued.len() > MAX_TO_TAKE {
            return;
        }
        if state.devices.len() >= MAX_QUIET_DEVICES && !state.devices.contains_key(device) {
            state.devices.clear();
        }
        state.devices.insert(
            device.clone(),
            Found {
                owner: owner.clone(),
                project: project.clone(),
                to_take: queued.to_vec(),
            },
        );
    }

    /// This queue started run `id` of `device` of `owner`: it is no longer
    /// queued.
    pub(crate) fn started(&self, owner: &OwnerId, device: &DeviceId, id: &CommandId) {
        let mut state = self.lock();
        if let Some(found) = state.devices.get_mut(device)
            && found.owner == *owner
        {
            found.to_take.retain(|taken| taken != id);
        }
    }

    /// True when nothing is queued for `device` of `owner` in `project`, as
    /// far as the notifications since its last kept look tell.
    pub(crate) fn is_quiet(&self, owner: &OwnerId, device: &DeviceId, project: &ProjectId) -> bool {
        self.lock().devices.get(device).is_some_and(|found| {
            found.owner == *owner && found.project == *project && found.to_take.is_empty()
        })
    }

    /// This queue queued run `id` for `device` of `owner` in `project`
    /// (written, not yet notified): a desktop whose last kept look was of
    /// that owner and project now has that run to take too, so its next
    /// look can answer from memory ([`QuietDevices::only_run`]); any other
    /// desktop of that name is forgotten, as by [`QuietDevices::work_for`].
    /// Counted as a notification: a look under way is not kept.
    pub(crate) fn queued_here(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        project: &ProjectId,
        id: CommandId,
    ) {
        let mut state = self.lock();
        state.epoch += 1;
        match state.devices.get_mut(device) {
            Some(found)
                if found.owner == *owner
                    && found.project == *project
                    && found.to_take.len() < MAX_TO_TAKE =>
            {
                found.to_take.push(id);
            }
            Some(_) => {
                state.devices.remove(device);
            }
            None => {}
        }
    }

    /// The one run queued for `device` of `owner` in `project`, as far as
    /// the notifications since its last kept look tell: `None` when the
    /// desktop is not known, is quiet, or has several runs to take (their
    /// order is the store's to tell).
    pub(crate) fn only_run(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        project: &ProjectId,
    ) -> Option<CommandId> {
        let state = self.lock();
        let found = state.devices.get(device)?;
        match found.to_take.as_slice() {
            [id] if found.owner == *owner && found.project == *project => Some(*id),
            _ => None,
        }
    }

    /// Work was queued for `device` (of some owner). Kept by the device's
    /// name alone: another owner's device of the same name is forgotten
    /// too, which only costs it a read.
    pub(crate) fn work_for(&self, device: &DeviceId) {
        let mut state = self.lock();
        state.epoch += 1;
        state.devices.remove(device);
    }

    /// Anything may have changed: every desktop is forgotten.
    pub(crate) fn forget_all(&self) {
        let mut state = self.lock();
        state.epoch += 1;
        state.devices.clear();
    }

    /// Desktops kept, for tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().devices.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(owner: &str, device: &str, project: &str) -> (OwnerId, DeviceId, ProjectId) {
        (
            OwnerId::parse(owner).expect("id"),
            DeviceId::parse(device).expect("id"),
            ProjectId::parse(project).expect("id"),
        )
    }

    #[test]
    fn an_empty_look_is_kept_for_its_owner_device_and_project_only() {
        let quiet = QuietDevices::default();
        let (o, d, p) = ids("alice", "desk", "p1");
        assert!(!quiet.is_quiet(&o, &d, &p));
        let look = quiet.look();
        quiet.found(look, &o, &d, &p, &[]);
        assert!(quiet.is_quiet(&o, &d, &p));
        let (bob, laptop, p2) = ids("bob", "laptop", "p2");
        assert!(!quiet.is_quiet(&bob, &d, &p), "another owner");
        assert!(!quiet.is_quiet(&o, &laptop, &p), "another device");
        assert!(!quiet.is_quiet(&o, &d, &p2), "another project");
    }

    #[test]
    fn a_notification_during_the_look_keeps_nothing() {
        let quiet = QuietDevices::default();
        let (o, d, p) = ids("alice", "desk", "p1");
        let (_, other, _) = ids("alice", "laptop", "p1");
        let look = quiet.look();
        // Work for any desktop while the store was read.
        quiet.work_for(&other);
        quiet.found(look, &o, &d, &p, &[]);
        assert!(!quiet.is_quiet(&o, &d, &p));
        let look = quiet.look();
        quiet.forget_all();
        quiet.found(look, &o, &d, &p, &[]);
        assert!(!quiet.is_quiet(&o, &d, &p));
    }

    #[test]
    fn work_forgets_its_desktop_and_a_wake_up_of_all_forgets_every_one() {
        let quiet = QuietDevices::default();
        let (o, d, p) = ids("alice", "desk", "p1");
        let (_, laptop, _) = ids("alice", "laptop", "p1");
        for device in [&d, &laptop] {
            let look = quiet.look();
            quiet.found(look, &o, device, &p, &[]);
        }
        quiet.work_for(&d);
        assert!(!quiet.is_quiet(&o, &d, &p));
        assert!(quiet.is_quiet(&o, &laptop, &p));
        quiet.forget_all();
        assert!(!quiet.is_quiet(&o, &laptop, &p));
        assert_eq!(quiet.len(), 0);
    }

    #[test]
    fn the_registry_starts_over_at_its_bound() {
        let quiet = QuietDevices::default();
        let (o, _, p) = ids("alice", "desk", "p1");
        for n in 0..=MAX_QUIET_DEVICES {
            let d = DeviceId::parse(&format!("desk-{n}")).expect("id");
            let look = quiet.look();
            quiet.found(look, &o, &d, &p, &[]);
            assert!(quiet.len() <= MAX_QUIET_DEVICES);
        }
        assert_eq!(quiet.len(), 1, "the new desktop after starting over");
    }

    #[test]
    fn a_look_that_found_runs_is_quiet_once_this_queue_started_them() {
        let quiet = QuietDevices::default();
        let (o, d, p) = ids("alice", "desk", "p1");
        let (bob, _, _) = ids("bob", "desk", "p1");
        let [one, two] = [1u128, 2].map(|n| CommandId::from_uuid(uuid::Uuid::from_u128(n)));
        let look = quiet.look();
        quiet.found(look, &o, &d, &p, &[one, two]);
        assert!(!quiet.is_quiet(&o, &d, &p));
        quiet.started(&o, &d, &one);
        quiet.started(&bob, &d, &two);
        assert!(
            !quiet.is_quiet(&o, &d, &p),
            "one to take, and another owner's start"
        );
        quiet.started(&o, &d, &two);
        assert!(quiet.is_quiet(&o, &d, &p));
        // Work that came after the look: the next look reads the store.
        let look = quiet.look();
        quiet.found(look, &o, &d, &p, &[one]);
        quiet.work_for(&d);
        quiet.started(&o, &d, &one);
        assert!(!quiet.is_quiet(&o, &d, &p));
    }

    #[test]
    fn a_run_queued_here_is_the_one_to_take_of_a_known_desktop() {
        let quiet = QuietDevices::default();
        let (o, d, p) = ids("alice", "desk", "p1");
        let (bob, laptop, p2) = ids("bob", "laptop", "p2");
        let [one, two, three] =
            [1u128, 2, 3].map(|n| CommandId::from_uuid(uuid::Uuid::from_u128(n)));
        // Not known: nothing to tell, and nothing kept.
        quiet.queued_here(&o, &d, &p, one);
        assert_eq!(quiet.only_run(&o, &d, &p), None);
        assert_eq!(quiet.len(), 0);
        let look = quiet.look();
        quiet.found(look, &o, &d, &p, &[]);
        assert_eq!(quiet.only_run(&o, &d, &p), None, "quiet: no run");
        quiet.queued_here(&o, &d, &p, one);
        assert!(!quiet.is_quiet(&o, &d, &p));
        assert_eq!(quiet.only_run(&o, &d, &p), Some(one));
        assert_eq!(quiet.only_run(&bob, &d, &p), None, "another owner");
        assert_eq!(quiet.only_run(&o, &d, &p2), None, "another project");
        assert_eq!(quiet.only_run(&o, &laptop, &p), None, "another device");
        // Two to take: their order is the store's.
        quiet.queued_here(&o, &d, &p, two);
        assert_eq!(quiet.only_run(&o, &d, &p), None);
        quiet.started(&o, &d, &one);
        assert_eq!(quiet.only_run(&o, &d, &p), Some(two));
        quiet.started(&o, &d, &two);
        assert!(quiet.is_quiet(&o, &d, &p));
        // Work in another project, or of another owner's desktop of that
        // name, forgets the desktop.
        quiet.queued_here(&o, &d, &p2, three);
        assert_eq!(quiet.len(), 0);
        let look = quiet.look();
        quiet.found(look, &o, &d, &p, &[]);
        quiet.queued_here(&bob, &d, &p, three);
        assert_eq!(quiet.len(), 0);
        // A look under way when a run is queued is not kept.
        let look = quiet.look();
        quiet.queued_here(&o, &laptop, &p, three);
        quiet.found(look, &o, &d, &p, &[]);
        assert_eq!(quiet.len(), 0);
    }

    #[test]
    fn a_full_list_to_take_forgets_its_desktop_when_another_run_comes() {
        let quiet = QuietDevices::default();
        let (o, d, p) = ids("alice", "desk", "p1");
        let many: Vec<CommandId> = (0..MAX_TO_TAKE as u128)
            .map(|n| CommandId::from_uuid(uuid::Uuid::from_u128(n)))
            .collect();
        let look = quiet.look();
        quiet.found(look, &o, &d, &p, &many);
        assert_eq!(quiet.len(), 1);
        quiet.queued_here(&o, &d, &p, CommandId::from_uuid(uuid::Uuid::from_u128(99)));
        assert_eq!(quiet.len(), 0);
    }

    #[test]
    fn a_look_that_found_too_many_runs_is_not_kept() {
        let quiet = QuietDevices::default();
        let (o, d, p) = ids("alice", "desk", "p1");
        let many: Vec<CommandId> = (0..=MAX_TO_TAKE as u128)
            .map(|n| CommandId::from_uuid(uuid::Uuid::from_u128(n)))
            .collect();
        let look = quiet.look();
        quiet.found(look, &o, &d, &p, &many);
        for id in &many {
            quiet.started(&o, &d, id);
        }
        assert!(!quiet.is_quiet(&o, &d, &p));
        assert_eq!(quiet.len(), 0);
    }
}
