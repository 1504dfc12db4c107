//! What a queue remembers of the devices it serves, so that a busy relay
//! costs the store little: when this queue last wrote each device's
//! liveness (the touch throttle), the liveness it last read, and the syncs
//! it last wrote. Each is a [`Memo`](super::memo::Memo): losing an entry
//! costs one store access, never a different answer.
//!
//! All three are fresh for [`QueueConfig::touch_interval`], the precision
//! at which liveness is written anyway; a long-polling desktop's held
//! syncs are written about once per [`QueueConfig::long_poll_hold`] (see
//! `sync_rewrite_after`).

use super::{Queue, QueueConfig, SyncRequest};
use crate::ids::{DeviceId, OwnerId, ProjectId};
use crate::principal::Device;
use crate::session::SessionMeta;
use crate::store::{DeviceContact, DeviceRecord, DeviceTouch, StoreError};
use crate::time::Timestamp;

/// Syncs remembered per device (one per project it syncs).
const MAX_SYNCS_PER_DEVICE: usize = 32;

/// Desktops whose contacts a queue gathers before the request that finds
/// this many writes them itself, without waiting for
/// [`Queue::flush_contacts`]: bounds the memory they take on a server that
/// runs no maintenance.
pub const MAX_PENDING_CONTACTS: usize = 20_000;

/// Contacts written by one [`Store::touch_devices`](crate::store::Store::touch_devices)
/// call: bounds how long one write keeps the store busy.
pub const CONTACTS_PER_WRITE: usize = 1_000;

/// What this queue last wrote for one device's sync of one project, and when.
pub(super) struct SyncWritten {
    owner: OwnerId,
    project: ProjectId,
    sessions: Vec<SessionMeta>,
    /// The mode the write recorded (not the request's flag: an unheld
    /// sync of a long-polling relay records long-poll).
    long_poll: bool,
    at: Timestamp,
}

impl Queue {
    /// Records that `device` was seen, at most once per
    /// [`QueueConfig::touch_interval`] per device from this queue (liveness
    /// is reported in seconds; a write per relay request would only load the
    /// store). The contact is kept here and written with every other
    /// desktop's by the next [`Queue::flush_contacts`], which
    /// [`Queue::maintain`] runs each second: one store write a second for
    /// all of them instead of one per request. This queue's own reads of the
    /// liveness see it at once ([`Queue::device_record`]). Only if contacts
    /// pile up past [`MAX_PENDING_CONTACTS`] (a server that runs no
    /// maintenance) does the request that finds them so write them itself.
    pub(super) async fn touch(&self, device: &Device) -> Result<(), StoreError> {
        let now = self.clock.now();
        {
            let mut touched = self.touched.lock();
            if touched.get(&device.id).is_some_and(|(owner, t)| {
                *owner == device.owner && now.since(*t) < self.config.touch_interval && *t <= now
            }) {
                return Ok(());
            }
            touched.insert(device.id.clone(), (device.owner.clone(), now));
        }
        let piled_up = {
            let mut contacts = self.pending_contacts();
            gather(&mut contacts, &device.owner, &device.id, now);
            contacts.len() >= MAX_PENDING_CONTACTS
        };
        self.device_contacted(device, DeviceContact::Other, now);
        if piled_up {
            self.flush_contacts().await?;
        }
        Ok(())
    }

    /// Writes the desktops' contacts this queue has gathered since the
    /// last flush ([`Store::touch_devices`](crate::store::Store::touch_devices),
    /// in batches of at most [`CONTACTS_PER_WRITE`]) and returns how many
    /// it wrote. [`Queue::maintain`] runs it each second, and
    /// [`Queue::run_maintenance`] once more when it ends. Contacts a failed
    /// write did not record are kept for the next flush, so a store outage
    /// loses none.
    pub async fn flush_contacts(&self) -> Result<usize, StoreError> {
        let gathered = std::mem::take(&mut *self.pending_contacts());
        if gathered.is_empty() {
            return Ok(0);
        }
        let mut contacts: Vec<DeviceTouch> = gathered
            .into_iter()
            .map(|((owner, device), at)| DeviceTouch { owner, device, at })
            .collect();
        // One order for every server writing to a shared store, so that two
        // batches over the same desktops never wait on each other in turn.
        contacts.sort_unstable_by(|a, b| (&a.owner, &a.device).cmp(&(&b.owner, &b.device)));
        let mut written = 0;
        for batch in contacts.chunks(CONTACTS_PER_WRITE) {
            if let Err(e) = self.store.touch_devices(batch).await {
                let mut pending = self.pending_contacts();
                for contact in &contacts[written..] {
                    gather(&mut pending, &contact.owner, &contact.device, contact.at);
                }
                return Err(e);
            }
            written += batch.len();
        }
        Ok(written)
    }

    /// The contacts not written yet (see [`Queue::flush_contacts`]).
    fn pending_contacts(&self) -> std::sync::MutexGuard<'_, PendingContacts> {
        self.contacts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The liveness of `device` of `owner`: as this queue read it less than
    /// [`QueueConfig::touch_interval`] ago, or else from the store. Liveness
    /// is written at most once per that interval anyway (the touch
    /// throttle), so the copy is as fresh as the store; this queue's own
    /// writes of the device change the copy as they change the store. A
    /// desktop that takes up a run moments after it was queued costs one
    /// read of its liveness, not two (the ticket's pickup hint, then the
    /// lease of `start`).
    pub(super) async fn device_record(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
    ) -> Result<Option<DeviceRecord>, StoreError> {
        let now = self.clock.now();
        {
            let devices = self.devices.lock();
            if let Some((record, read_at)) = devices.get(device)
                && record.owner == *owner
                && *read_at <= now
                && now.since(*read_at) < self.config.touch_interval
            {
                return Ok(Some(record.clone()));
            }
        }
        let mut record = self.store.device(owner, device).await?;
        // A contact this queue has not written yet is as good as written.
        if let Some(&at) = self
            .pending_contacts()
            .get(&(owner.clone(), device.clone()))
        {
            let seen = record.get_or_insert_with(|| DeviceRecord {
                device: device.clone(),
                owner: owner.clone(),
                last_sync_at: None,
                last_seen_at: at,
                long_poll: false,
            });
            seen.record_contact(DeviceContact::Other, at);
        }
        if let Some(record) = &record {
            self.devices
                .lock()
                .insert(device.clone(), (record.clone(), now));
        }
        Ok(record)
    }

    /// Whether `device` of `owner` long-polls: known without a read while
    /// its held sync waits here or a moment after (see
    /// [`waiting`](super::waiting)), else as its row says.
    pub(super) async fn long_polls(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
    ) -> Result<bool, StoreError> {
        if self.waiting.contains(owner, device) {
            return Ok(true);
        }
        Ok(self
            .device_record(owner, device)
            .await?
            .is_some_and(|d| d.long_poll))
    }

    /// This queue just wrote `contact` of `device` at `now`: its copy of
    /// the device's liveness, if it has one, takes the same change, and
    /// the touch throttle counts it as this interval's write (every contact
    /// moves the liveness to `now`, so a `touch` right after a sync, as
    /// the `start` of the run the sync handed out, has nothing to add).
    pub(super) fn device_contacted(&self, device: &Device, contact: DeviceContact, now: Timestamp) {
        self.touched
            .lock()
            .insert(device.id.clone(), (device.owner.clone(), now));
        let mut devices = self.devices.lock();
        if let Some((record, _)) = devices.get_mut(&device.id)
            && record.owner == device.owner
        {
            record.record_contact(contact, now);
        }
    }

    /// Whether this queue wrote exactly this sync (same sessions, and a
    /// mode this one would record again) for this device and project
    /// recently enough ([`sync_rewrite_after`]). Then the store already
    /// shows it, up to its stamps, and the writes are skipped: a relay that
    /// syncs often (or a benchmark) costs one read per sync instead of two
    /// writes. A long-polling relay's pass sends an unheld sync, which
    /// keeps the recorded mode, and at once its held one: the second finds
    /// the first's write.
    pub(super) fn sync_written_recently(
        &self,
        device: &Device,
        request: &SyncRequest,
        now: Timestamp,
    ) -> bool {
        let synced = self.synced.lock();
        synced
            .get(&device.id)
            .and_then(|list| {
                list.iter()
                    .find(|w| w.owner == device.owner && w.project == request.project)
            })
            .is_some_and(|w| {
                w.at <= now
                    && now.since(w.at) < sync_rewrite_after(&self.config, request)
                    && records_mode(request, w.long_poll)
                    && w.sessions == request.sessions
            })
    }

    /// Remembers that this queue wrote `request` of `device` at `now`,
    /// recording the mode `long_poll`, in place of what it wrote before for
    /// the same owner and project.
    pub(super) fn remember_sync(
        &self,
        device: &Device,
        request: &SyncRequest,
        long_poll: bool,
        now: Timestamp,
    ) {
        let mut synced = self.synced.lock();
        let list = synced.get_or_insert_with(device.id.clone(), Vec::new);
        list.retain(|w| !(w.owner == device.owner && w.project == request.project));
        if list.len() >= MAX_SYNCS_PER_DEVICE {
            list.remove(0);
        }
        list.push(SyncWritten {
            owner: device.owner.clone(),
            project: request.project.clone(),
            sessions: request.sessions.clone(),
            long_poll,
            at: now,
        });
    }
}

/// Contacts not written yet: per (owner, device), the latest time seen.
pub(super) type PendingContacts = std::collections::HashMap<(OwnerId, DeviceId), Timestamp>;

/// Adds a contact at `at` to `pending`: a desktop's stamp only moves forward.
fn gather(pending: &mut PendingContacts, owner: &OwnerId, device: &DeviceId, at: Timestamp) {
    let seen = pending.entry((owner.clone(), device.clone())).or_insert(at);
    *seen = (*seen).max(at);
}

/// How long after this queue wrote a sync the same sync is written again.
///
/// [`QueueConfig::touch_interval`] for a sync that is not held. A held
/// sync (a long-polling relay's wait) is what an idle desktop sends once per
/// hold, all day: writing each one would cost the store a transaction per
/// idle desktop per hold to move two stamps. It is written again once
/// [`QueueConfig::long_poll_hold`] has passed instead, so an idle desktop's
/// stored stamps (its last sync, and each share's `synced_at`) lag its
/// latest held sync by less than a hold plus one hold's length: about every
/// other idle hold is written. A desktop is taken for offline only after
/// [`QueueConfig::offline_after_missed_syncs`] holds (3) without a stamp,
/// so a live one never is. A sync that changes anything (its sessions, its
/// recorded mode) is written at once, whatever the interval.
fn sync_rewrite_after(config: &QueueConfig, request: &SyncRequest) -> std::time::Duration {
    if request.long_poll {
        config.touch_interval.max(config.long_poll_hold)
    } else {
        config.touch_interval
    }
}

/// Whether writing `request` would record the mode `recorded` again: a held
/// sync records long-poll; the first sync of a restarted relay records its
/// own mode; any other sync keeps the recorded one (see
/// `Queue::long_polls_after`).
fn records_mode(request: &SyncRequest, recorded: bool) -> bool {
    if request.long_poll || request.restarted {
        request.long_poll == recorded
    } else {
        true
    }
}
