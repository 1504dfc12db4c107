//! The `Queue` service: the only place that changes command state.
//!
//! Agent side: [`Queue::run_graph_session`], [`Queue::get_graph_run`],
//! [`Queue::cancel_graph_run`], [`Queue::list_graph_sessions`]. Relay side:
//! [`Queue::sync`], [`Queue::start`], [`Queue::control`],
//! [`Queue::complete`], [`Queue::decline`]. Each operation has its own
//! error enum; [`RUN_NOT_FOUND`] is the one text an agent sees for a run
//! that does not exist *and* for one that is not its own.
//!
//! # How a run finds its project
//! `run_graph_session` carries no project. The queue looks for the session
//! among the sessions shared to the agent's projects (in the projects'
//! sorted order; the first project that has it wins, and within a project
//! the smallest device id). The command is filed under that project and
//! assigned to the device that shared it. A session the agent cannot reach
//! (not shared, shared only to projects the agent is not connected to, or
//! another owner's) gets [`SESSION_NOT_FOUND`], the same text in every case.
//!
//! # Idempotency
//! Keys are scoped per agent and kept for [`QueueConfig::idempotency_ttl`]
//! (24 h by default), then pruned. The same key with the same session and
//! arguments (compared by [`request_fingerprint`]) returns the first command,
//! marked `replayed`, and writes nothing, even after that command finished
//! or was cancelled. The same key with a different session or arguments is
//! refused with [`RunError::KeyReused`] and writes nothing.
//!
//! # What a queue remembers
//! A queue keeps its own copy of each open command it queued, handed out
//! to a desktop or wrote last, and tries the next transition's
//! compare-and-swap on that copy instead of reading the command first
//! (`start` and `complete` cost one write each). A copy made stale by
//! another queue or server loses the swap and the transition reads
//! afresh; a refusal or "nothing to do" is only ever answered from a fresh
//! read; and a copy is used only for the party it belongs to. This relies
//! on the store's contract that every change of a command raises its
//! revision ([`Store::update_command`]): a tool that edits stored commands
//! by hand must raise it too. A queue also keeps the device liveness it
//! read for [`QueueConfig::touch_interval`], the precision at which
//! liveness is written anyway.
//!
//! A queue also keeps the finished commands it wrote or read, and
//! [`Queue::get_graph_run`] answers from them without the store: a
//! finished command never changes, and pruning, which deletes it, cannot
//! reach it before its `finished_at` plus the pruner's
//! [`QueueConfig::terminal_retention`]. A kept command is served only to
//! its own agent, and only until that instant by this queue's retention,
//! and never longer than an hour after it finished; on a store several
//! processes share, this assumes none of them prunes finished commands
//! sooner than that (the hour keeps the assumption small: any retention of
//! an hour or more, whatever the others use).
//!
//! # Where things are
//! This file holds the [`Queue`], its [`QueueConfig`] and the one path by
//! which a command changes (`transition`, then `write`). The operations
//! live beside it, each file for one side of the queue: the agent's tools,
//! the relay's requests and its progress reports, the holds (how long a
//! request waits, and on what), the periodic maintenance, and the device
//! liveness and syncs a queue remembers. Their errors are in one file, with
//! the one rule of which are worth retrying.
//!
//! [`request_fingerprint`]: crate::command::request_fingerprint

use crate::command::CommandRecord;
use crate::ids::{CommandId, DeviceId, OwnerId};
use crate::principal::{Agent, Device};
use crate::signals::{Mark, Signals, Topic};
use crate::store::{DeviceRecord, Store, StoreError};
use crate::time::{Clock, IdSource, Timestamp};
use std::sync::Arc;
use std::time::Duration;

mod agent;
mod devices;
mod errors;
mod finished;
mod holds;
mod last_seen;
mod maintenance;
mod memo;
mod progress;
mod relay;
mod session_guess;
mod sync;
#[cfg(test)]
mod tests;
mod waiting;

pub use agent::{RunTicket, RunView, SessionList};
pub use devices::{CONTACTS_PER_WRITE, MAX_PENDING_CONTACTS};
pub use errors::{
    CancelError, CompleteError, ControlError, DeclineError, GetError, ListError, NotReady,
    PROJECT_NOT_FOUND, ProgressError, RUN_NOT_FOUND, RunError, SESSION_NOT_FOUND, StartError,
    SyncError,
};
pub use holds::FED_RECHECK;
pub use maintenance::{MAINTENANCE_INTERVAL, MaintenanceReport};
pub use progress::ProgressAck;
pub use relay::{CompleteAck, ControlAnswer, DeclineAck};
pub use sync::{SyncRequest, SyncResponse};

use devices::SyncWritten;
use last_seen::Since;
use memo::Memo;
use progress::ProgressState;

/// Devices remembered by the touch throttle, the liveness copies and the
/// sync memo before each starts over.
const MAX_TOUCH_CACHE: usize = 100_000;
/// Commands whose progress throttle this queue remembers before it starts over.
const MAX_PROGRESS_STATES: usize = 100_000;
/// How many times a transition is retried when another writer got there first.
const MAX_CAS_ATTEMPTS: usize = 16;

/// A run in interval mode holds a lease of at least this many control
/// intervals. Renewals are written only when less than half the lease is
/// left (see [`command`](crate::command) on leases); with three intervals the
/// second control poll after a renewal renews again with an interval to
/// spare, where one or two would let a live desktop's run lapse.
pub const MIN_LEASE_CONTROLS: u32 = 3;

/// Tunables of the queue. The defaults follow the published relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// How long an idempotency key is remembered (24 h).
    pub idempotency_ttl: Duration,
    /// How long terminal commands are kept before pruning (30 days); `None` keeps them.
    /// A queue serves a finished run it read or wrote from memory for at
    /// most this long, and at most an hour, after it finished: every
    /// process pruning the same store must keep finished runs at least
    /// that long.
    pub terminal_retention: Option<Duration>,
    /// The relay's pass interval in interval mode (20 s).
    pub sync_interval: Duration,
    /// How long the server holds a long-poll sync or control request (25 s);
    /// a control request is held for less when its run's lease is short
    /// (see [`QueueConfig::control_hold`]).
    pub long_poll_hold: Duration,
    /// A held sync ends up to this much (5 s) before `long_poll_hold`, by
    /// an amount that differs from hold to hold. Desktops that connected
    /// together (all of them, after a server restart) otherwise come back
    /// together at every hold, a burst of thousands of syncs every 25 s
    /// that delays the runs queued meanwhile; with it their re-syncs drift
    /// apart and spread evenly over time. At most a fifth of
    /// `long_poll_hold` is taken off; zero holds exactly `long_poll_hold`.
    pub long_poll_jitter: Duration,
    /// The relay's control poll while a command runs (3 s).
    pub control_interval: Duration,
    /// A device that missed this many expected syncs is reported offline (3).
    pub offline_after_missed_syncs: u32,
    /// `poll_after_seconds` suggested while a run is running (5 s).
    pub running_poll_hint: Duration,
    /// Most queued commands handed out by one sync (100).
    pub max_commands_per_sync: usize,
    /// Most keys and commands deleted by one pruning step (500).
    pub prune_batch: usize,
    /// A device's non-sync contacts are written to the store at most this
    /// often (1 s). A sync is always written unless it repeats, within this
    /// interval, the sessions and mode this queue last wrote for the same
    /// device and project; then the stored stamps may lag by up to this much.
    /// A held sync that repeats them is written again only after
    /// [`long_poll_hold`](Self::long_poll_hold), if that is longer: an idle
    /// long-polling desktop's stamps are then written about every other
    /// hold, and never lag enough for it to look offline.
    pub touch_interval: Duration,
    /// While a `wait_seconds` call waits, the store is re-read at least this
    /// often (1 s), for changes made by another process on the same store,
    /// when those reach this process only by reading it (see
    /// [`Queue::external_writes_fed`]; otherwise [`FED_RECHECK`]).
    pub wait_recheck: Duration,
    /// While a relay's long-poll sync or control request is held, the
    /// store is looked at at least this often (500 ms), for work queued by
    /// another process on the same store, when that reaches this process
    /// only by reading it (see [`Queue::external_writes_fed`]; otherwise
    /// [`FED_RECHECK`]).
    pub hold_recheck: Duration,
    /// Most projects one device may share sessions into at once (100). A
    /// sync that would share into one more is refused with
    /// [`SyncError::TooManyProjects`]; un-sharing (a sync with no sessions)
    /// is always accepted. Two syncs of one device racing on two servers
    /// may each pass the check, so the bound can be exceeded by the number
    /// of servers, never more.
    pub max_projects_per_device: usize,
    /// The lease of a run started by a long-polling desktop (60 s): without
    /// a control request from it for this long, the run is over (see
    /// [`command`](crate::command) on leases).
    pub lease_long_poll: Duration,
    /// The lease of a run started by a desktop in interval mode, in control
    /// intervals (10, i.e. 30 s with the default 3 s control poll; at least
    /// [`MIN_LEASE_CONTROLS`] whatever is configured).
    pub lease_interval_controls: u32,
    /// A run's progress is written at most this often (1 s) by one queue;
    /// reports in between are coalesced, and the latest one is written by
    /// the next report after the interval or by [`Queue::maintain`].
    pub progress_interval: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            idempotency_ttl: Duration::from_secs(24 * 3600),
            terminal_retention: Some(Duration::from_secs(30 * 24 * 3600)),
            sync_interval: Duration::from_secs(20),
            long_poll_hold: Duration::from_secs(25),
            long_poll_jitter: Duration::from_secs(5),
            control_interval: Duration::from_secs(3),
            offline_after_missed_syncs: 3,
            running_poll_hint: Duration::from_secs(5),
            max_commands_per_sync: 100,
            prune_batch: 500,
            wait_recheck: Duration::from_secs(1),
            hold_recheck: Duration::from_millis(500),
            touch_interval: Duration::from_secs(1),
            max_projects_per_device: 100,
            lease_long_poll: Duration::from_secs(60),
            lease_interval_controls: 10,
            progress_interval: Duration::from_secs(1),
        }
    }
}

impl QueueConfig {
    /// The lease of a run started by a desktop in long-poll mode or not.
    pub fn lease(&self, long_poll: bool) -> Duration {
        if long_poll {
            self.lease_long_poll
        } else {
            self.control_interval
                .saturating_mul(self.lease_interval_controls.max(MIN_LEASE_CONTROLS))
        }
    }

    /// How long a long-poll control request of a run holding `lease` is
    /// held: [`QueueConfig::long_poll_hold`], but at most a third of the
    /// lease. Only a control request's arrival renews the lease, and a
    /// renewal is written only when less than half of it is left; control
    /// requests at most a third of a lease apart therefore renew it with
    /// at least a sixth of it to spare, whatever the lease is configured
    /// to, and however a progress report's wake-up shifts them. A hold as
    /// long as the lease would let the run of a live desktop lapse.
    pub fn control_hold(&self, lease: Duration) -> Duration {
        self.long_poll_hold.min(lease / 3)
    }
}

/// The queue of Graph runs: rules over a [`Store`].
#[derive(Clone)]
pub struct Queue {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    ids: Arc<dyn IdSource>,
    config: QueueConfig,
    signals: Arc<Signals>,
    /// Per device id: its owner and when this queue last wrote its liveness.
    touched: Arc<Memo<DeviceId, (OwnerId, Timestamp)>>,
    /// Contacts of desktops not written yet, per (owner, device): the
    /// latest time each was seen (see [`Queue::flush_contacts`]).
    contacts: Arc<std::sync::Mutex<devices::PendingContacts>>,
    /// Per device id: its liveness as this queue last read it, and when
    /// (see [`Queue::device_record`]).
    devices: Arc<Memo<DeviceId, (DeviceRecord, Timestamp)>>,
    /// Per device id: the syncs this queue last wrote, one per (owner, project).
    synced: Arc<Memo<DeviceId, Vec<SyncWritten>>>,
    /// Per running command: when this queue last wrote its progress, and
    /// the latest report not written yet.
    progress: Arc<Memo<CommandId, ProgressState>>,
    /// The store's external-write marker as [`Queue::maintain`] last read it.
    marker: Arc<std::sync::Mutex<Option<u64>>>,
    /// Open commands as this queue last wrote or read them: the first
    /// guess of a transition's compare-and-swap (see [`last_seen`]).
    last_seen: Arc<last_seen::LastSeen>,
    /// Finished commands as this queue last wrote or read them: what
    /// `get_graph_run` answers from without the store (see [`finished`]).
    finished: Arc<finished::FinishedRuns>,
    /// The share each session last resolved to for a run: the guess a
    /// run's insert checks instead of looking it up (see [`session_guess`]).
    session_guesses: Arc<session_guess::SessionGuesses>,
    /// The desktops whose held sync waits here now: the pickup hint of a
    /// run queued for one of them needs no read (see [`waiting`]).
    waiting: Arc<waiting::WaitingDevices>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Queue {
    /// A queue over `store`, reading time from `clock` and ids from `ids`.
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        ids: Arc<dyn IdSource>,
        config: QueueConfig,
    ) -> Self {
        Self {
            store,
            clock: Arc::clone(&clock),
            ids,
            signals: Arc::new(Signals::new()),
            touched: Arc::new(Memo::new(MAX_TOUCH_CACHE)),
            contacts: Arc::default(),
            devices: Arc::new(Memo::new(MAX_TOUCH_CACHE)),
            synced: Arc::new(Memo::new(MAX_TOUCH_CACHE)),
            progress: Arc::new(Memo::new(MAX_PROGRESS_STATES)),
            marker: Arc::default(),
            last_seen: Arc::default(),
            finished: Arc::new(finished::FinishedRuns::new(config.terminal_retention)),
            session_guesses: Arc::default(),
            waiting: Arc::new(waiting::WaitingDevices::new(
                Arc::clone(&clock),
                config.touch_interval,
            )),
            config,
        }
    }

    /// The wake-up registry: every write that a held request may wait for
    /// notifies it (see [`Signals`]).
    pub fn signals(&self) -> &Arc<Signals> {
        &self.signals
    }

    /// The process is shutting down: every held request (a long-poll sync or
    /// control, a `wait_seconds` call, a listen stream) answers at once with
    /// what it has, and new ones do not wait ([`Signals::close`]). Writes
    /// still work, so requests in flight finish.
    pub fn shut_down(&self) {
        self.signals.close();
    }

    /// True once [`Queue::shut_down`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.signals.is_closed()
    }

    /// Whether the store answers now: one read of a device record that
    /// never exists (an indexed look-up on every store), for a server's
    /// readiness check. Shutting down counts as not ready.
    pub async fn ready(&self) -> Result<(), NotReady> {
        if self.is_shutting_down() {
            return Err(NotReady::ShuttingDown);
        }
        // The probe ids are valid (a test holds them to it); the answer is
        // not looked at, only whether the store gave one.
        if let (Ok(owner), Ok(device)) = (
            OwnerId::parse(READINESS_PROBE.0),
            DeviceId::parse(READINESS_PROBE.1),
        ) {
            self.store.device(&owner, &device).await?;
        }
        Ok(())
    }

    /// The configuration.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// The store underneath.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The current time on the queue's clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Takes a record (this queue's copy of it, see [`last_seen`], or a
    /// fresh read), lets `apply` turn it into the next revision in place
    /// (`Ok(false)`: nothing to write), and writes it with a compare-and-swap,
    /// retrying from a fresh read if another writer won. An answer that
    /// writes nothing is only given on a fresh read (or, for a lease
    /// renewal, on a current copy: see [`Unchanged`]). Returns the record
    /// as it stands afterwards.
    async fn transition<E>(
        &self,
        party: Party<'_>,
        id: &CommandId,
        apply: impl FnMut(&mut CommandRecord, Timestamp) -> Result<bool, E>,
    ) -> Result<CommandRecord, TransitionError<E>> {
        self.transition_announced(party, id, Announce::Always, Unchanged::FromStore, apply)
            .await
    }

    /// [`Queue::transition`], announcing its write as `announce` says (a
    /// lapse it closes first is always announced); a transition with
    /// nothing to write answers from where `unchanged` says.
    async fn transition_announced<E>(
        &self,
        party: Party<'_>,
        id: &CommandId,
        announce: Announce,
        unchanged: Unchanged,
        mut apply: impl FnMut(&mut CommandRecord, Timestamp) -> Result<bool, E>,
    ) -> Result<CommandRecord, TransitionError<E>> {
        // The first attempt starts from this queue's last copy, if it has
        // one for this party: a write that succeeds proves the copy was
        // current; any other outcome is judged again on a fresh read,
        // except "nothing to write" on a current copy where `unchanged`
        // allows it.
        let mut guess = self.last_seen.get(id, |record| party.owns(record));
        for _ in 0..MAX_CAS_ATTEMPTS {
            let since = self.copy_since();
            let (mut record, mut verified, copy_mark) = match guess.take() {
                Some((copy, mark)) => (copy, false, mark),
                None => {
                    let read = match party {
                        Party::Agent(agent) => {
                            self.store
                                .command_for_agent(&agent.owner, &agent.id, id)
                                .await
                        }
                        Party::Device(device) => {
                            self.store
                                .command_for_device(&device.owner, &device.id, id)
                                .await
                        }
                        Party::Owner(owner) => self.store.command_for_owner(owner, id).await,
                    }
                    .map_err(TransitionError::Store)?;
                    let Some(read) = read else {
                        self.last_seen.forget(id);
                        return Err(TransitionError::NotFound);
                    };
                    self.remember(&read, since);
                    (read, true, None)
                }
            };
            let now = self.clock.now();
            if record.is_lapsed(now) && !matches!(party, Party::Agent(_)) {
                // Every report from a desktop finds a lapsed run closed
                // first: the close is written, then the report is judged
                // against the closed run (a late result is refused).
                let mut closed = record.clone();
                closed.lapse_in_place(now);
                if !self
                    .write(&closed, since)
                    .await
                    .map_err(TransitionError::Store)?
                {
                    continue;
                }
                record = closed;
                verified = true;
            }
            match apply(&mut record, now) {
                Ok(false)
                    if !verified
                        && unchanged == Unchanged::FromCurrentCopy
                        && self.is_current(id, copy_mark) =>
                {
                    return Ok(record);
                }
                // A copy's refusal or "nothing to do" may be out of date.
                Err(_) | Ok(false) if !verified => continue,
                Err(refusal) => return Err(TransitionError::Refused(refusal)),
                Ok(false) => return Ok(record),
                Ok(true) => {}
            }
            let written = match announce {
                Announce::Always => self.write(&record, since).await,
                Announce::Never => self.write_unannounced(&record, since).await,
            };
            if written.map_err(TransitionError::Store)? {
                return Ok(record);
            }
        }
        Err(TransitionError::Store(StoreError::Backend(format!(
            "command update lost {MAX_CAS_ATTEMPTS} races in a row"
        ))))
    }

    /// [`Store::update_command`]; on success whoever waits on the command
    /// is woken and the record becomes this queue's copy, on a lost race
    /// the copy is dropped. `since`: when the operation began, before it
    /// read or wrote the command.
    async fn write(&self, record: &CommandRecord, since: Since) -> Result<bool, StoreError> {
        let written = self.write_unannounced(record, since).await?;
        if written {
            self.signals.notify(&Topic::Command(record.id));
        }
        Ok(written)
    }

    /// [`Queue::write`] without waking anyone: for a change that nobody
    /// holding a request on the command waits for.
    async fn write_unannounced(
        &self,
        record: &CommandRecord,
        since: Since,
    ) -> Result<bool, StoreError> {
        let written = self.store.update_command(record).await?;
        if written {
            self.remember(record, since);
        } else {
            self.last_seen.forget(&record.id);
        }
        Ok(written)
    }

    /// Now, for an operation about to read or write a command: what a copy
    /// it keeps may have missed (see [`last_seen`]).
    fn copy_since(&self) -> Since {
        self.last_seen.since(self.signals.changes().mark())
    }

    /// True when a copy of command `id` kept as current from `mark` is the
    /// stored command: every other process's write reaches this queue as a
    /// notification, and none of `id` came since `mark`.
    fn is_current(&self, id: &CommandId, mark: Option<Mark>) -> bool {
        mark.is_some_and(|mark| {
            self.external_writes_fed() && self.signals.changes().unchanged_since(id, mark)
        })
    }

    /// This queue's copy of open command `id`, if it belongs to `party` and
    /// is current (see [`last_seen`]): the stored command, without a read.
    fn current_copy(&self, party: Party<'_>, id: &CommandId) -> Option<CommandRecord> {
        let (record, mark) = self.last_seen.get(id, |record| party.owns(record))?;
        self.is_current(id, mark).then_some(record)
    }
}

/// Where a transition that has nothing to write takes its answer from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unchanged {
    /// A fresh read of the store.
    FromStore,
    /// This queue's copy when it is current (see [`last_seen`]), else a
    /// fresh read: for a lease renewal, which a desktop sends every few
    /// seconds while its run has nothing to say.
    FromCurrentCopy,
}

/// Whether a transition's write wakes the requests held on its command
/// ([`Topic::Command`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Announce {
    /// Every write: the run changed in a way its waiters look for.
    Always,
    /// Never: a lease renewal, which changes nothing a waiter answers with
    /// (an agent's wait answers once the run ends, a listen stream reports
    /// status and progress, a control hold a cancel or the run's end). Not
    /// announcing it spares every waiter a wake-up and a look, and lets the
    /// renewing control request's own hold start from the renewal's answer.
    Never,
}

impl Queue {
    /// Keeps `record`, just written or read fresh, as this queue's copy:
    /// an open one for the next transition's compare-and-swap, a finished
    /// one for the next read.
    fn remember(&self, record: &CommandRecord, since: Since) {
        self.last_seen.put(record, since);
        self.finished.put(record, self.clock.now());
    }
}

/// The owner and device [`Queue::ready`] looks up: whether such a device
/// exists does not matter, only that the store answers.
const READINESS_PROBE: (&str, &str) = (".graph-relay-readiness", ".readiness");

/// Whose view a transition loads the command through: always (owner, name),
/// so "not yours" and "does not exist" are one code path. The server's own
/// maintenance reads by the owner and command id it just listed.
#[derive(Clone, Copy)]
enum Party<'a> {
    Agent(&'a Agent),
    Device(&'a Device),
    Owner(&'a crate::ids::OwnerId),
}

impl Party<'_> {
    /// Whether `record` is one this party may see (the store's look-up by
    /// the same keys would find it).
    fn owns(&self, record: &CommandRecord) -> bool {
        match self {
            Party::Agent(agent) => record.owner == agent.owner && record.agent == agent.id,
            Party::Device(device) => record.owner == device.owner && record.device == device.id,
            Party::Owner(owner) => record.owner == **owner,
        }
    }
}

enum TransitionError<E> {
    NotFound,
    Refused(E),
    Store(StoreError),
}
