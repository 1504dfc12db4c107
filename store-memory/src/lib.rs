//! # graph-relay-store-memory
//!
//! An in-memory [`Store`] for graph-relay's core: every command, key, shared
//! session and device record lives in one mutex-guarded map set. It is the
//! store of the simulator and of tests, and a fine choice for a
//! single-process server that may lose its queue on restart. For anything
//! that must survive a restart use `graph-relay-store-sqlite`.
//!
//! It passes the core's store conformance suite (`graph_relay_core::testkit`).
//!
//! # Example: embed the queue
//! ```
//! # futures::executor::block_on(async {
//! use std::sync::Arc;
//! use graph_relay_core::prelude::*;
//! use graph_relay_store_memory::MemoryStore;
//!
//! let queue = Queue::new(Arc::new(MemoryStore::new()), Arc::new(SystemClock), Arc::new(RandomIds), QueueConfig::default());
//! let owner = OwnerId::parse("alice")?;
//! let project = ProjectId::parse("research")?;
//! let agent = Agent::new(AgentId::parse("assistant")?, owner.clone(), [project.clone()]);
//! let list = queue.list_graph_sessions(&agent, &project, 50).await?;
//! assert!(list.sessions.is_empty()); // nothing is shared until the desktop syncs
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::collections::{BTreeMap, BTreeSet};

// foldhash is keyed per process (seeded at random), so agent-chosen keys
// cannot be aimed at one bucket, and it is several times faster than SipHash.
// hashbrown's map looks composite keys up by borrowed parts (`Parts`), so a
// look-up copies no ids.
type HashMap<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// A borrowed view of a tuple key `(A, B)` or `(A, B, C)`: hashes like the
/// tuple and compares equal to it.
#[derive(Hash)]
struct Parts<T>(T);

impl<A: PartialEq, B: PartialEq> hashbrown::Equivalent<(A, B)> for Parts<(&A, &B)> {
    fn equivalent(&self, key: &(A, B)) -> bool {
        *self.0.0 == key.0 && *self.0.1 == key.1
    }
}

impl<A: PartialEq, B: PartialEq, C: PartialEq> hashbrown::Equivalent<(A, B, C)>
    for Parts<(&A, &B, &C)>
{
    fn equivalent(&self, key: &(A, B, C)) -> bool {
        *self.0.0 == key.0 && *self.0.1 == key.1 && *self.0.2 == key.2
    }
}
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use graph_relay_core::command::{CommandRecord, CommandStatus};
use graph_relay_core::ids::{
    AgentId, CommandId, DeviceId, GraphSessionId, IdempotencyKey, OwnerId, ProjectId,
};
use graph_relay_core::outbox::{Outbox, OutboxError, OutboxItem};
use graph_relay_core::session::{SessionMeta, SharedSession};
use graph_relay_core::store::{
    DeviceContact, DeviceRecord, ExternalWrites, IdempotencyRecord, InsertOutcome, PruneReport,
    PruneRequest, Store, StoreError,
};
use graph_relay_core::time::Timestamp;

/// Where queued commands of one device in one project are indexed.
type QueueKey = (OwnerId, ProjectId, DeviceId);

/// A command with its insertion number (the tie-break of the queued order).
struct Entry {
    record: CommandRecord,
    order: u64,
}

#[derive(Default)]
struct Inner {
    // Boxed: a resize moves pointers, not whole records.
    commands: HashMap<CommandId, Box<Entry>>,
    keys: HashMap<KeySlot, IdempotencyRecord>,
    /// Live keys by expiry, so pruning reads only what it deletes.
    expiries: BTreeSet<(Timestamp, KeySlot)>,
    /// Terminal commands by the instant they finished, for pruning.
    finished: BTreeSet<(Timestamp, CommandId)>,
    /// Terminal commands pruning found still held by a live key:
    /// (key expiry, finished at, id). They return to `finished` when the key expires.
    held: BTreeSet<(Timestamp, Timestamp, CommandId)>,
    queued: HashMap<QueueKey, BTreeSet<(Timestamp, u64, CommandId)>>,
    /// Running commands by lease expiry (`None`: no lease yet, first).
    running: BTreeSet<(Option<Timestamp>, CommandId)>,
    next_insert: u64,
    sessions: HashMap<(OwnerId, ProjectId), BTreeMap<(GraphSessionId, DeviceId), SharedSession>>,
    /// The projects each device shares at least one session to.
    shared_projects: HashMap<(OwnerId, DeviceId), BTreeSet<ProjectId>>,
    devices: HashMap<(OwnerId, DeviceId), DeviceRecord>,
}

/// Where an idempotency key lives: keys are scoped per (owner, agent).
type KeySlot = (OwnerId, AgentId, IdempotencyKey);

impl Inner {
    /// Moves `c` between the queued, running and finished indexes after a
    /// write. `before` is the stored version's status and lease before the
    /// write (`None` for a new command).
    fn index(
        &mut self,
        c: &CommandRecord,
        order: u64,
        before: Option<(CommandStatus, Option<Timestamp>)>,
    ) {
        let was_queued = before.is_some_and(|(status, _)| status == CommandStatus::Queued);
        if let Some((CommandStatus::Running, lease)) = before {
            self.running.remove(&(lease, c.id));
        }
        if c.status == CommandStatus::Running {
            self.running.insert((c.lease_expires_at, c.id));
        }
        let is_queued = c.status == CommandStatus::Queued;
        if is_queued != was_queued {
            let key = Parts((&c.owner, &c.project, &c.device));
            let entry = (c.created_at, order, c.id);
            if is_queued {
                match self.queued.get_mut(&key) {
                    Some(set) => {
                        set.insert(entry);
                    }
                    None => {
                        let key = (c.owner.clone(), c.project.clone(), c.device.clone());
                        self.queued.insert(key, BTreeSet::from([entry]));
                    }
                }
            } else if let Some(set) = self.queued.get_mut(&key) {
                set.remove(&entry);
                if set.is_empty() {
                    self.queued.remove(&key);
                }
            }
        }
        if c.status.is_terminal()
            && let Some(t) = c.finished_at
        {
            self.finished.insert((t, c.id));
        }
    }

    /// When the live key (unexpired at `now`) that still points at `c` expires, if there is one.
    fn held_until(&self, c: &CommandRecord, now: Timestamp) -> Option<Timestamp> {
        self.keys
            .get(&Parts((&c.owner, &c.agent, &c.idempotency_key)))
            .filter(|k| k.command == c.id && k.expires_at > now)
            .map(|k| k.expires_at)
    }
}

/// A [`Store`] kept in memory. Cheap to create; `Send + Sync`.
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("MemoryStore")
            .field("commands", &inner.commands.len())
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of commands held (all states).
    pub fn command_count(&self) -> usize {
        self.lock().commands.len()
    }

    /// Every command held, ordered by id: a snapshot for tests that check
    /// that a refused request changed nothing.
    pub fn commands(&self) -> Vec<CommandRecord> {
        let mut all: Vec<CommandRecord> = self
            .lock()
            .commands
            .values()
            .map(|e| e.record.clone())
            .collect();
        all.sort_by_key(|c| c.id);
        all
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-written in a
        // way later readers would misread (each method writes at the end), so
        // recover the guard rather than poisoning every later call.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn idempotency(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .keys
            .get(&Parts((owner, agent, key)))
            .filter(|k| k.expires_at > now)
            .cloned())
    }

    async fn insert_command(
        &self,
        command: &CommandRecord,
        key: &IdempotencyRecord,
        now: Timestamp,
    ) -> Result<InsertOutcome, StoreError> {
        let mut inner = self.lock();
        if let Some(existing) = inner
            .keys
            .get(&Parts((&key.owner, &key.agent, &key.key)))
            .filter(|k| k.expires_at > now)
        {
            return Ok(InsertOutcome::KeyTaken(existing.clone()));
        }
        if inner.commands.contains_key(&command.id) {
            return Err(StoreError::Backend(format!(
                "command {} already exists",
                command.id
            )));
        }
        let slot = (key.owner.clone(), key.agent.clone(), key.key.clone());
        inner.expiries.insert((key.expires_at, slot.clone()));
        if let Some(expired) = inner.keys.insert(slot, key.clone()) {
            inner.expiries.remove(&(
                expired.expires_at,
                (expired.owner, expired.agent, expired.key),
            ));
        }
        inner.next_insert += 1;
        let order = inner.next_insert;
        inner.index(command, order, None);
        inner.commands.insert(
            command.id,
            Box::new(Entry {
                record: command.clone(),
                order,
            }),
        );
        Ok(InsertOutcome::Inserted)
    }

    async fn command_for_agent(
        &self,
        owner: &OwnerId,
        agent: &AgentId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        Ok(self
            .lock()
            .commands
            .get(id)
            .filter(|e| &e.record.agent == agent && &e.record.owner == owner)
            .map(|e| e.record.clone()))
    }

    async fn command_for_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        Ok(self
            .lock()
            .commands
            .get(id)
            .filter(|e| &e.record.device == device && &e.record.owner == owner)
            .map(|e| e.record.clone()))
    }

    async fn command_for_owner(
        &self,
        owner: &OwnerId,
        id: &CommandId,
    ) -> Result<Option<CommandRecord>, StoreError> {
        Ok(self
            .lock()
            .commands
            .get(id)
            .filter(|e| &e.record.owner == owner)
            .map(|e| e.record.clone()))
    }

    async fn running_commands(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .running
            .iter()
            .filter_map(|(_, id)| inner.commands.get(id))
            .map(|e| &e.record)
            .filter(|c| &c.owner == owner && &c.device == device)
            .take(limit)
            .cloned()
            .collect())
    }

    async fn lapsed_commands(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .running
            .iter()
            .take_while(|(lease, _)| lease.is_none_or(|t| t <= now))
            .take(limit)
            .filter_map(|(_, id)| inner.commands.get(id).map(|e| e.record.clone()))
            .collect())
    }

    async fn update_command(&self, next: &CommandRecord) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        match inner.commands.get_mut(&next.id) {
            Some(current) if next.revision > 0 && current.record.revision == next.revision - 1 => {
                let before = (current.record.status, current.record.lease_expires_at);
                let order = current.order;
                current.record.overwrite_with(next);
                inner.index(next, order, Some(before));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn queued_commands(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        let inner = self.lock();
        let Some(queued) = inner.queued.get(&Parts((owner, project, device))) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(queued.len().min(limit));
        out.extend(
            queued
                .iter()
                .take(limit)
                .filter_map(|(_, _, id)| inner.commands.get(id).map(|e| e.record.clone())),
        );
        Ok(out)
    }

    async fn replace_shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        device: &DeviceId,
        sessions: &[SessionMeta],
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let device_key = Parts((owner, device));
        if sessions.is_empty() {
            if let Some(projects) = inner.shared_projects.get_mut(&device_key) {
                projects.remove(project);
                if projects.is_empty() {
                    inner.shared_projects.remove(&device_key);
                }
            }
        } else {
            match inner.shared_projects.get_mut(&device_key) {
                Some(projects) => {
                    if !projects.contains(project) {
                        projects.insert(project.clone());
                    }
                }
                None => {
                    inner.shared_projects.insert(
                        (owner.clone(), device.clone()),
                        BTreeSet::from([project.clone()]),
                    );
                }
            }
        }
        let shared = inner
            .sessions
            .entry((owner.clone(), project.clone()))
            .or_default();
        // Steady state: the same sessions again. Refresh the stamp in place
        // instead of dropping and re-allocating every entry.
        shared
            .retain(|(id, d), _| d != device || sessions.iter().any(|m| &m.graph_session_id == id));
        for meta in sessions {
            let key = (meta.graph_session_id.clone(), device.clone());
            match shared.get_mut(&key) {
                Some(existing) => {
                    if existing.meta != *meta {
                        existing.meta = meta.clone();
                    }
                    existing.synced_at = now;
                }
                None => {
                    shared.insert(
                        key,
                        SharedSession {
                            project: project.clone(),
                            device: device.clone(),
                            meta: meta.clone(),
                            synced_at: now,
                        },
                    );
                }
            }
        }
        Ok(())
    }

    async fn shared_projects(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        limit: usize,
    ) -> Result<Vec<ProjectId>, StoreError> {
        Ok(self
            .lock()
            .shared_projects
            .get(&Parts((owner, device)))
            .map(|p| p.iter().take(limit).cloned().collect())
            .unwrap_or_default())
    }

    async fn shared_sessions(
        &self,
        owner: &OwnerId,
        project: &ProjectId,
        limit: usize,
    ) -> Result<Vec<SharedSession>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .sessions
            .get(&Parts((owner, project)))
            .map(|m| m.values().take(limit).cloned().collect())
            .unwrap_or_default())
    }

    async fn find_shared_session(
        &self,
        owner: &OwnerId,
        projects: &[ProjectId],
        id: &GraphSessionId,
    ) -> Result<Option<SharedSession>, StoreError> {
        let inner = self.lock();
        for project in projects {
            if let Some(map) = inner.sessions.get(&Parts((owner, project)))
                && let Some((_, s)) = map
                    .range((id.clone(), min_device())..)
                    .next()
                    .filter(|((g, _), _)| g == id)
            {
                return Ok(Some(s.clone()));
            }
        }
        Ok(None)
    }

    async fn touch_device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        contact: DeviceContact,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        match inner.devices.get_mut(&Parts((owner, device))) {
            Some(record) => record.record_contact(contact, now),
            None => {
                let mut record = DeviceRecord {
                    device: device.clone(),
                    owner: owner.clone(),
                    last_sync_at: None,
                    last_seen_at: now,
                    long_poll: false,
                };
                record.record_contact(contact, now);
                inner
                    .devices
                    .insert((owner.clone(), device.clone()), record);
            }
        }
        Ok(())
    }

    async fn device(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
    ) -> Result<Option<DeviceRecord>, StoreError> {
        Ok(self.lock().devices.get(&Parts((owner, device))).cloned())
    }

    /// Only this process can write to memory it owns.
    fn external_writes(&self) -> ExternalWrites {
        ExternalWrites::None
    }

    async fn prune(&self, request: PruneRequest) -> Result<PruneReport, StoreError> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut keys = 0;
        while keys < request.batch {
            let Some(first) = inner.expiries.first() else {
                break;
            };
            if first.0 > request.now {
                break;
            }
            let Some((_, slot)) = inner.expiries.pop_first() else {
                break;
            };
            inner.keys.remove(&slot);
            keys += 1;
        }
        let mut commands = 0;
        if let Some(cutoff) = request.terminal_before {
            // Commands whose key has expired since are candidates again.
            while let Some(&(expires_at, finished_at, id)) = inner.held.first() {
                if expires_at > request.now {
                    break;
                }
                inner.held.pop_first();
                inner.finished.insert((finished_at, id));
            }
            // A command a live key still points at is set aside until the
            // key expires, so each command is passed over at most once.
            // Look at a bounded number of candidates so one call stays short.
            let mut looked_at = 0;
            while commands < request.batch && looked_at < request.batch.saturating_mul(4) {
                let Some(&(finished_at, id)) = inner.finished.first() else {
                    break;
                };
                if finished_at > cutoff {
                    break;
                }
                looked_at += 1;
                inner.finished.pop_first();
                let Some(entry) = inner.commands.get(&id) else {
                    continue;
                };
                let c = &entry.record;
                if !c.status.is_terminal() || c.finished_at != Some(finished_at) {
                    continue; // rewritten since; its own entry is indexed
                }
                if let Some(expires_at) = inner.held_until(c, request.now) {
                    inner.held.insert((expires_at, finished_at, id));
                    continue;
                }
                inner.commands.remove(&id);
                commands += 1;
            }
        }
        Ok(PruneReport { keys, commands })
    }
}

/// A relay outbox kept in memory: for tests and the simulator. It is *not*
/// durable; a real relay uses the SQLite outbox.
#[derive(Debug, Default)]
pub struct MemoryOutbox {
    items: Mutex<BTreeMap<CommandId, OutboxItem>>,
}

impl MemoryOutbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<CommandId, OutboxItem>> {
        self.items
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl Outbox for MemoryOutbox {
    async fn put(&self, item: &OutboxItem) -> Result<(), OutboxError> {
        self.lock().insert(item.command, item.clone());
        Ok(())
    }

    async fn pending(&self) -> Result<Vec<OutboxItem>, OutboxError> {
        let mut items: Vec<OutboxItem> = self.lock().values().cloned().collect();
        items.sort_by_key(|i| (i.stored_at, i.command));
        Ok(items)
    }

    async fn record_attempt(&self, command: &CommandId) -> Result<(), OutboxError> {
        if let Some(item) = self.lock().get_mut(command) {
            item.attempts = item.attempts.saturating_add(1);
        }
        Ok(())
    }

    async fn remove(&self, command: &CommandId) -> Result<(), OutboxError> {
        self.lock().remove(command);
        Ok(())
    }
}

/// The smallest possible device id, to start a range scan over (session, device) pairs.
fn min_device() -> DeviceId {
    static MIN: std::sync::OnceLock<DeviceId> = std::sync::OnceLock::new();
    MIN.get_or_init(|| {
        DeviceId::parse("-").unwrap_or_else(|_| unreachable!("`-` is a valid device id"))
    })
    .clone()
}
