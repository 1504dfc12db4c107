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
//! The rules that make it exact:
//!
//! - A look that found nothing is kept only if *no* notification at all
//!   (of any desktop) arrived between the moment it began
//!   ([`QuietDevices::look`]) and the moment it is kept
//!   ([`QuietDevices::found_nothing`]): a run queued while the store was
//!   read may be missing from what it read.
//! - A notification of a desktop's work forgets it, and a wake-up of all
//!   forgets every one, under the same lock and before any waiter wakes.
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

use crate::ids::{DeviceId, OwnerId, ProjectId};

/// Most desktops kept before the registry starts over.
pub(crate) const MAX_QUIET_DEVICES: usize = 100_000;

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
    /// Per device id: its owner and the project a look found empty.
    devices: HashMap<DeviceId, (OwnerId, ProjectId)>,
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

    /// The look that began as `look` found nothing queued for `device` of
    /// `owner` in `project`: kept, unless a notification came meanwhile.
    pub(crate) fn found_nothing(
        &self,
        look: Look,
        owner: &OwnerId,
        device: &DeviceId,
        project: &ProjectId,
    ) {
        let mut state = self.lock();
        if state.epoch != look.0 {
            return;
        }
        if state.devices.len() >= MAX_QUIET_DEVICES && !state.devices.contains_key(device) {
            state.devices.clear();
        }
        state
            .devices
            .insert(device.clone(), (owner.clone(), project.clone()));
    }

    /// True when nothing is queued for `device` of `owner` in `project`, as
    /// far as the notifications since its last empty look tell.
    pub(crate) fn is_quiet(&self, owner: &OwnerId, device: &DeviceId, project: &ProjectId) -> bool {
        self.lock()
            .devices
            .get(device)
            .is_some_and(|(o, p)| o == owner && p == project)
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
        quiet.found_nothing(look, &o, &d, &p);
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
        quiet.found_nothing(look, &o, &d, &p);
        assert!(!quiet.is_quiet(&o, &d, &p));
        let look = quiet.look();
        quiet.forget_all();
        quiet.found_nothing(look, &o, &d, &p);
        assert!(!quiet.is_quiet(&o, &d, &p));
    }

    #[test]
    fn work_forgets_its_desktop_and_a_wake_up_of_all_forgets_every_one() {
        let quiet = QuietDevices::default();
        let (o, d, p) = ids("alice", "desk", "p1");
        let (_, laptop, _) = ids("alice", "laptop", "p1");
        for device in [&d, &laptop] {
            let look = quiet.look();
            quiet.found_nothing(look, &o, device, &p);
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
            quiet.found_nothing(look, &o, &d, &p);
            assert!(quiet.len() <= MAX_QUIET_DEVICES);
        }
        assert_eq!(quiet.len(), 1, "the new desktop after starting over");
    }
}
