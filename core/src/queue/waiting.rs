//! The desktops waiting in a held sync on this queue, now or a moment ago.
//!
//! A desktop whose held sync waits here has just recorded a long-polling
//! sync (the held sync writes it, or finds the same one written less than
//! a hold ago), and the hold answers as soon as work is queued for it. So
//! it long-polls and is online, which is all that three answers need from
//! the device's row: a run's pickup hint (at once), the lease of the run
//! it starts (the long-polling one) and the mode an unheld sync keeps
//! (`Queue::long_polls`). They read nothing for such a desktop, nor for
//! one whose last hold ended less than [`QueueConfig::touch_interval`] ago:
//! the hold that hands a run out ends as the run is queued, and the
//! agent's first look and the desktop's start follow at once. That is as
//! long as the queue trusts its own copy of a device's row anyway, and
//! the row says the same then.
//!
//! Only a relay that restarted in interval mode while its old held sync
//! still waits here (its connection not yet seen closed) could make the
//! stored row say otherwise. The answers are then those of a long-polling
//! desktop for that moment, as they were a moment before: a hint of one
//! second, and a run started then gets the longer long-polling lease, so
//! if that desktop dies the run lapses later, never twice.
//!
//! An entry lives as long as its holds, and for the interval after the
//! last one ended: the map holds no more entries than there are held
//! syncs, which the server's connection limit bounds, and the holds that
//! ended within one interval.
//!
//! [`QueueConfig::touch_interval`]: super::QueueConfig::touch_interval

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::ids::{DeviceId, OwnerId};
use crate::time::{Clock, Timestamp};

type Key = (OwnerId, DeviceId);

/// See the module docs.
pub(crate) struct WaitingDevices {
    clock: Arc<dyn Clock>,
    /// How long a desktop counts as waiting after its last hold ended.
    linger: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Per desktop: its holds waiting now, and when the last one ended.
    devices: HashMap<Key, Entry>,
    /// Desktops whose last hold ended, oldest first: what to forget when.
    ended: VecDeque<(Timestamp, Key)>,
}

#[derive(Clone, Copy)]
struct Entry {
    holds: u32,
    ended_at: Timestamp,
}

/// One held sync waiting: counted from [`WaitingDevices::enter`] until dropped.
pub(crate) struct Waiting<'a> {
    devices: &'a WaitingDevices,
    key: Key,
}

impl WaitingDevices {
    /// Desktops waiting on `clock`, counted for `linger` after their last
    /// hold ended.
    pub(crate) fn new(clock: Arc<dyn Clock>, linger: Duration) -> Self {
        Self {
            clock,
            linger,
            state: Mutex::default(),
        }
    }

    /// The state, with what ended more than `linger` ago forgotten.
    fn lock(&self) -> (MutexGuard<'_, State>, Timestamp) {
        // A panic while counting leaves the counts as they were.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.clock.now();
        while let Some((at, _)) = state.ended.front()
            && !self.lingers(*at, now)
        {
            let Some((at, key)) = state.ended.pop_front() else {
                break;
            };
            // Only if it did not wait again since.
            if state
                .devices
                .get(&key)
                .is_some_and(|e| e.holds == 0 && e.ended_at == at)
            {
                state.devices.remove(&key);
            }
        }
        (state, now)
    }

    /// Whether a hold that ended at `at` still counts at `now`.
    fn lingers(&self, at: Timestamp, now: Timestamp) -> bool {
        at <= now && now.since(at) < self.linger
    }

    /// A held sync of `device` of `owner` starts waiting.
    pub(crate) fn enter(&self, owner: &OwnerId, device: &DeviceId) -> Waiting<'_> {
        let key = (owner.clone(), device.clone());
        let (mut state, now) = self.lock();
        state
            .devices
            .entry(key.clone())
            .or_insert(Entry {
                holds: 0,
                ended_at: now,
            })
            .holds += 1;
        Waiting { devices: self, key }
    }

    /// Whether a held sync of `device` of `owner` waits here now, or the
    /// last one ended less than the linger ago.
    pub(crate) fn contains(&self, owner: &OwnerId, device: &DeviceId) -> bool {
        let (state, now) = self.lock();
        state
            .devices
            .get(&(owner.clone(), device.clone()))
            .is_some_and(|e| e.holds > 0 || self.lingers(e.ended_at, now))
    }

    fn leave(&self, key: &Key) {
        let (mut state, now) = self.lock();
        let Some(entry) = state.devices.get_mut(key) else {
            return;
        };
        entry.holds = entry.holds.saturating_sub(1);
        if entry.holds == 0 {
            entry.ended_at = now;
            state.ended.push_back((now, key.clone()));
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.devices.leave(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::ManualClock;

    fn ids(owner: &str, device: &str) -> (OwnerId, DeviceId) {
        (
            OwnerId::parse(owner).expect("owner"),
            DeviceId::parse(device).expect("device"),
        )
    }

    fn devices() -> (WaitingDevices, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(Timestamp(1_000)));
        (
            WaitingDevices::new(clock.clone(), Duration::from_secs(1)),
            clock,
        )
    }

    #[test]
    fn a_device_waits_while_a_hold_does_and_for_the_linger_after() {
        let (devices, clock) = devices();
        let (o, d) = ids("o", "d");
        assert!(!devices.contains(&o, &d));
        let first = devices.enter(&o, &d);
        let second = devices.enter(&o, &d);
        clock.advance(Duration::from_secs(30));
        assert!(devices.contains(&o, &d), "however long the hold");
        drop(first);
        assert!(devices.contains(&o, &d));
        drop(second);
        clock.advance(Duration::from_millis(999));
        assert!(devices.contains(&o, &d), "a moment after");
        clock.advance(Duration::from_millis(1));
        assert!(!devices.contains(&o, &d), "past the linger");
        let (state, _) = devices.lock();
        assert!(state.devices.is_empty() && state.ended.is_empty());
    }

    #[test]
    fn waiting_again_keeps_the_entry_past_the_older_end() {
        let (devices, clock) = devices();
        let (o, d) = ids("o", "d");
        drop(devices.enter(&o, &d));
        let again = devices.enter(&o, &d);
        clock.advance(Duration::from_secs(5));
        // The first end is forgotten; the entry of the waiting hold stays.
        assert!(devices.contains(&o, &d));
        drop(again);
        clock.advance(Duration::from_secs(1));
        assert!(!devices.contains(&o, &d));
    }

    #[test]
    fn identity_is_owner_and_device() {
        let (devices, _) = devices();
        let (o, d) = ids("o", "d");
        let (other_owner, _) = ids("p", "d");
        let _waiting = devices.enter(&o, &d);
        assert!(!devices.contains(&other_owner, &d));
    }
}
