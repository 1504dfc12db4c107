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

use crate::args::RunArgs;
use crate::command::{
    CommandRecord, CommandStatus, CompleteRefused, DeclineRefused, InvalidProgress, Progress,
    ProgressRefused, StartRefused, request_fingerprint,
};
use crate::envelope::{EnvelopeError, ResultEnvelope};
use crate::hold::{Hold, Look};
use crate::ids::{CommandId, DeviceId, ExecutionId, GraphSessionId, OwnerId, ProjectId};
use crate::limits::MAX_SESSIONS_PER_SYNC;
use crate::principal::{Agent, Device};
use crate::session::{InvalidSession, SessionMeta, SharedSession};
use crate::signals::{Signals, Topic};
use crate::store::{
    DeviceContact, DeviceRecord, ExternalWrites, IdempotencyRecord, InsertOutcome, PruneReport,
    PruneRequest, Store, StoreError,
};
use crate::time::{Clock, IdSource, Sleeper, Timestamp};
use std::sync::Arc;
use std::time::Duration;

mod maintenance;
pub use maintenance::MAINTENANCE_INTERVAL;

/// What an agent reads for a run that does not exist or is not its own.
pub const RUN_NOT_FOUND: &str = "Graph run not found or access removed";
/// What an agent reads for a session it cannot reach.
pub const SESSION_NOT_FOUND: &str = "Graph session not found or access removed";
/// What an agent reads for a project it is not connected to.
pub const PROJECT_NOT_FOUND: &str = "Project not found or access removed";
/// Devices remembered by the touch throttle before it starts over.
const MAX_TOUCH_CACHE: usize = 100_000;
/// Most running commands one restart announcement closes.
const MAX_RESTART_CLOSES: usize = 100;
/// How many times a transition is retried when another writer got there first.
const MAX_CAS_ATTEMPTS: usize = 16;

/// How long a sync of `device` made at `now` is held: `long_poll_hold`
/// less its jitter, which is at most a fifth of it.
fn sync_hold_length(config: &QueueConfig, device: &Device, now: Timestamp) -> Duration {
    let most = config.long_poll_jitter.min(config.long_poll_hold / 5);
    config
        .long_poll_hold
        .saturating_sub(jitter(device, now, most))
}

/// A share of `most` that differs from device to device and from instant to
/// instant (a hash of both), so successive holds of one device, and the
/// holds of devices that synced together, end at scattered times.
fn jitter(device: &Device, now: Timestamp, most: Duration) -> Duration {
    use std::hash::{BuildHasher, Hash, Hasher};
    if most.is_zero() {
        return Duration::ZERO;
    }
    let mut hasher = foldhash::fast::FixedState::with_seed(0x6a17).build_hasher();
    device.owner.hash(&mut hasher);
    device.id.hash(&mut hasher);
    now.0.hash(&mut hasher);
    // The top 53 bits as a fraction in [0, 1).
    let fraction = (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64;
    most.mul_f64(fraction)
}

/// A run in interval mode holds a lease of at least this many control
/// intervals. Renewals are written only when less than half the lease is
/// left (see [`command`](crate::command) on leases); with three intervals the
/// second control poll after a renewal renews again with an interval to
/// spare, where one or two would let a live desktop's run lapse.
pub const MIN_LEASE_CONTROLS: u32 = 3;

/// How often a held request looks at the store on its own when other
/// processes' writes reach this process anyway (see
/// [`Queue::external_writes_fed`]): a safety net, longer than any hold.
pub const FED_RECHECK: Duration = Duration::from_secs(60);

/// Tunables of the queue. The defaults follow the published relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// How long an idempotency key is remembered (24 h).
    pub idempotency_ttl: Duration,
    /// How long terminal commands are kept before pruning (30 days); `None` keeps them.
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

/// Why `run_graph_session` failed. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The session is not shared to any project the agent reaches.
    #[error("{SESSION_NOT_FOUND}")]
    SessionNotFound,
    /// The key was already used by this agent for a different request.
    #[error(
        "idempotency_key was already used for a different request (command {command}); use a new key for a new run"
    )]
    KeyReused {
        /// The command the key belongs to.
        command: CommandId,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `get_graph_run` failed.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    /// Unknown, or not this agent's.
    #[error("{RUN_NOT_FOUND}")]
    NotFound,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `cancel_graph_run` failed. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    /// Unknown, or not this agent's.
    #[error("{RUN_NOT_FOUND}")]
    NotFound,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `list_graph_sessions` failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The agent is not connected to the project.
    #[error("{PROJECT_NOT_FOUND}")]
    ProjectNotFound,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a relay's sync was refused. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// More than [`MAX_SESSIONS_PER_SYNC`] sessions.
    #[error("a sync may carry at most {MAX_SESSIONS_PER_SYNC} sessions per project; got {0}")]
    TooManySessions(usize),
    /// The same session listed twice.
    #[error("session {0} is listed more than once")]
    DuplicateSession(GraphSessionId),
    /// The device already shares into as many projects as it may.
    #[error(
        "a device may share sessions into at most {limit} projects and this one would be one more; un-share a project first (sync it with no sessions)"
    )]
    TooManyProjects {
        /// [`QueueConfig::max_projects_per_device`].
        limit: usize,
    },
    /// A session's metadata breaks a rule.
    #[error(transparent)]
    InvalidSession(#[from] InvalidSession),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `start` failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Unknown, or not assigned to this device.
    #[error("command not found for this device")]
    NotFound,
    /// The state machine refused (e.g. it was cancelled: it must not run).
    #[error(transparent)]
    Refused(#[from] StartRefused),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `control` failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Unknown, or not assigned to this device.
    #[error("command not found for this device")]
    NotFound,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `complete` failed. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum CompleteError {
    /// Unknown, or not assigned to this device.
    #[error("command not found for this device")]
    NotFound,
    /// The envelope breaks SPEC §7.
    #[error(transparent)]
    Invalid(#[from] EnvelopeError),
    /// The state machine refused (stale execution, conflict, not started).
    #[error(transparent)]
    Refused(#[from] CompleteRefused),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a progress report was not taken. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum ProgressError {
    /// Unknown, or not assigned to this device.
    #[error("command not found for this device")]
    NotFound,
    /// The report breaks a rule (message length, percentage).
    #[error(transparent)]
    Invalid(#[from] InvalidProgress),
    /// Not running, or another execution.
    #[error(transparent)]
    Refused(#[from] ProgressRefused),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How a progress report was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressAck {
    /// Written: the agent sees it now.
    Recorded,
    /// Arrived within [`QueueConfig::progress_interval`] of the last write:
    /// kept, and written with the next report or by [`Queue::maintain`]
    /// unless a newer one replaces it first.
    Coalesced,
    /// The same report as the one recorded: nothing to write.
    Unchanged,
}

/// Why [`Queue::ready`] says the queue cannot serve now.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// [`Queue::shut_down`] was called.
    #[error("shutting down")]
    ShuttingDown,
    /// The store did not answer.
    #[error("the queue's store cannot be reached: {0}")]
    Store(#[from] StoreError),
}

/// The owner and device [`Queue::ready`] looks up: whether such a device
/// exists does not matter, only that the store answers.
const READINESS_PROBE: (&str, &str) = (".graph-relay-readiness", ".readiness");

/// What one [`Queue::maintain`] step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MaintenanceReport {
    /// Coalesced progress reports written.
    pub progress: usize,
    /// Running commands closed (lease lapsed) or granted a lease.
    pub leases: usize,
    /// What pruning removed.
    pub pruned: PruneReport,
    /// Held requests woken because another process wrote to the store
    /// (under [`ExternalWrites::Marker`], when the marker moved).
    pub woken: usize,
}

/// Why `decline` failed.
#[derive(Debug, thiserror::Error)]
pub enum DeclineError {
    /// Unknown, or not assigned to this device.
    #[error("command not found for this device")]
    NotFound,
    /// Already running.
    #[error(transparent)]
    Refused(#[from] DeclineRefused),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether trying the same operation again can succeed: only a store
/// failure is passing; every other refusal is final for that request.
macro_rules! retryable_when_the_store_failed {
    ($($error:ident),* $(,)?) => {
        $(
            impl $error {
                /// True when the same request may succeed later (the store
                /// failed); false when it never can (the request itself is
                /// refused). Relays and transports map this to `retryable`.
                pub fn is_retryable(&self) -> bool {
                    matches!(self, Self::Store(_))
                }
            }
        )*
    };
}

retryable_when_the_store_failed!(
    RunError,
    GetError,
    CancelError,
    ListError,
    SyncError,
    StartError,
    ControlError,
    CompleteError,
    ProgressError,
    DeclineError,
);

/// The ticket `run_graph_session` returns.
#[derive(Debug, Clone, PartialEq)]
pub struct RunTicket {
    /// The command (new, or the first one for a replayed key).
    pub command: CommandRecord,
    /// True when the key had been used already and no run was queued.
    pub replayed: bool,
    /// When to call `get_graph_run` first.
    pub poll_after_seconds: u64,
}

impl RunTicket {
    /// A sentence for the model: this is a ticket, not a result.
    pub fn message(&self) -> String {
        let what = if self.replayed {
            "This idempotency_key was already used for the same request, so no second run was queued; this is the original ticket."
        } else {
            "The Graph run is queued; it has not started yet."
        };
        format!(
            "{what} The owner's desktop picks it up on its next pass. Call get_graph_run with command_id {} to read its progress and result (first check in about {} s).",
            self.command.id, self.poll_after_seconds
        )
    }
}

/// A run as its agent sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunView {
    /// The command.
    pub command: CommandRecord,
    /// When to look again; `None` once terminal.
    pub poll_after_seconds: Option<u64>,
    /// Set when a queued run's desktop looks offline: since when.
    pub device_offline_since: Option<Timestamp>,
}

/// The sessions of one project as `list_graph_sessions` shows them.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionList {
    /// The project.
    pub project: ProjectId,
    /// What the relays' last syncs uploaded.
    pub sessions: Vec<SharedSession>,
}

/// A relay's sync for one project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRequest {
    /// The project the owner enabled on the desktop.
    pub project: ProjectId,
    /// The sessions shared to it (at most 100).
    pub sessions: Vec<SessionMeta>,
    /// The relay holds this request open (long-poll mode).
    pub long_poll: bool,
    /// True on the first sync a relay process sends after it started: the
    /// server then ends this device's running commands other than `running`.
    pub restarted: bool,
    /// The command the relay is executing right now, if any.
    pub running: Option<CommandId>,
}

/// What a sync hands back.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncResponse {
    /// Queued commands of this project for this device, oldest first.
    pub commands: Vec<CommandRecord>,
    /// When the relay should sync again if nothing changes.
    pub poll_after: Duration,
}

/// Whether the relay should stop a running command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlAnswer {
    /// The agent asked to cancel.
    pub cancel_requested: bool,
    /// The command's status now. A terminal status (e.g. the lease lapsed)
    /// means: stop the execution, its result will not be taken.
    pub status: CommandStatus,
}

impl ControlAnswer {
    /// True when the relay has something to act on: cancellation was
    /// requested or the command ended (a held control request answers then).
    pub fn is_settled(&self) -> bool {
        self.cancel_requested || self.status.is_terminal()
    }

    /// The answer for `command` as it stands.
    pub fn of(command: &CommandRecord) -> Self {
        Self {
            cancel_requested: command.cancel_requested,
            status: command.status,
        }
    }
}

/// How `complete` went.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // returned once, by value
pub enum CompleteAck {
    /// The completion was recorded; the command is now in this state.
    Recorded(CommandRecord),
    /// The same completion had been recorded already; nothing changed. The
    /// command as it stands.
    Duplicate(CommandRecord),
}

impl CompleteAck {
    /// The command as it stands after the report.
    pub fn record(&self) -> &CommandRecord {
        match self {
            Self::Recorded(record) | Self::Duplicate(record) => record,
        }
    }
}

/// How `decline` went.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // returned once, by value
pub enum DeclineAck {
    /// The queued command was closed as `cancelled` with
    /// [`NO_LONGER_SHARED`](crate::command::NO_LONGER_SHARED).
    Recorded(CommandRecord),
    /// The command was already closed (declined before, cancelled by its
    /// agent, or finished); nothing changed. The command as it stands.
    Unchanged(CommandRecord),
}

impl DeclineAck {
    /// The command as it stands after the report.
    pub fn record(&self) -> &CommandRecord {
        match self {
            Self::Recorded(record) | Self::Unchanged(record) => record,
        }
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
    touched: Arc<std::sync::Mutex<FastMap<crate::ids::DeviceId, (crate::ids::OwnerId, Timestamp)>>>,
    /// Per device id: its liveness as this queue last read it, and when
    /// (see [`Queue::device_record`]).
    devices: Arc<std::sync::Mutex<FastMap<crate::ids::DeviceId, (DeviceRecord, Timestamp)>>>,
    /// Per device id: the syncs this queue last wrote, one per (owner, project).
    synced: Arc<std::sync::Mutex<FastMap<crate::ids::DeviceId, Vec<SyncWritten>>>>,
    /// Per running command: when this queue last wrote its progress, and
    /// the latest report not written yet.
    progress: Arc<std::sync::Mutex<FastMap<CommandId, ProgressState>>>,
    /// The store's external-write marker as [`Queue::maintain`] last read it.
    marker: Arc<std::sync::Mutex<Option<u64>>>,
    /// Open commands as this queue last wrote or read them: the first
    /// guess of a transition's compare-and-swap (see [`crate::live`]).
    live: Arc<crate::live::LiveRecords>,
}

/// The progress writes of one command by this queue.
struct ProgressState {
    written_at: Timestamp,
    pending: Option<(Device, ExecutionId, Progress)>,
}

/// Commands whose progress throttle this queue remembers before it starts over.
const MAX_PROGRESS_STATES: usize = 100_000;

/// A hash map with a fast keyed hash (seeded per process).
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Syncs remembered per device (one per project it syncs).
const MAX_SYNCS_PER_DEVICE: usize = 32;

/// What this queue last wrote for one device's sync of one project, and when.
struct SyncWritten {
    owner: crate::ids::OwnerId,
    project: ProjectId,
    sessions: Vec<SessionMeta>,
    long_poll: bool,
    at: Timestamp,
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
            clock,
            ids,
            config,
            signals: Arc::new(Signals::new()),
            touched: Arc::default(),
            devices: Arc::default(),
            synced: Arc::default(),
            progress: Arc::default(),
            marker: Arc::default(),
            live: Arc::default(),
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

    // ----- agent side -------------------------------------------------------

    /// Queues a run and returns its ticket at once (or the first ticket for a
    /// retried key). See the module docs for idempotency and project lookup.
    pub async fn run_graph_session(
        &self,
        agent: &Agent,
        args: RunArgs,
    ) -> Result<RunTicket, RunError> {
        let now = self.clock.now();
        let fingerprint = request_fingerprint(&args.graph_session_id, &args.arguments);
        let projects: Vec<ProjectId> = agent.projects.iter().cloned().collect();
        let Some(shared) = self
            .store
            .find_shared_session(&agent.owner, &projects, &args.graph_session_id)
            .await?
        else {
            // A retry must get its ticket even if the session was un-shared since.
            return match self
                .store
                .idempotency(&agent.owner, &agent.id, &args.idempotency_key, now)
                .await?
            {
                Some(existing) => self.replay(agent, existing, &fingerprint, now).await,
                None => Err(RunError::SessionNotFound),
            };
        };
        // A reused key is found by the insert itself (`KeyTaken`), atomically.
        let mut command = CommandRecord::queued(
            self.ids.new_command_id(),
            agent.id.clone(),
            agent.owner.clone(),
            shared.project.clone(),
            shared.device.clone(),
            args.graph_session_id,
            args.arguments,
            args.idempotency_key,
            now,
        );
        command.slug = shared.meta.slug;
        let key = IdempotencyRecord {
            owner: agent.owner.clone(),
            agent: agent.id.clone(),
            key: command.idempotency_key.clone(),
            command: command.id,
            fingerprint: fingerprint.clone(),
            expires_at: now.plus(self.config.idempotency_ttl),
        };
        match self.store.insert_command(&command, &key, now).await? {
            InsertOutcome::Inserted => {
                self.live.put(&command);
                self.signals.notify(&Topic::DeviceWork(
                    command.owner.clone(),
                    command.device.clone(),
                ));
                let poll_after_seconds = self.pickup_hint(&command, now).await?.0;
                Ok(RunTicket {
                    command,
                    replayed: false,
                    poll_after_seconds,
                })
            }
            InsertOutcome::KeyTaken(existing) => {
                self.replay(agent, existing, &fingerprint, now).await
            }
        }
    }

    async fn replay(
        &self,
        agent: &Agent,
        existing: IdempotencyRecord,
        fingerprint: &str,
        now: Timestamp,
    ) -> Result<RunTicket, RunError> {
        if existing.fingerprint != fingerprint {
            return Err(RunError::KeyReused {
                command: existing.command,
            });
        }
        let command = self
            .store
            .command_for_agent(&agent.owner, &agent.id, &existing.command)
            .await?
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "idempotency key points at missing command {}",
                    existing.command
                ))
            })?;
        let poll_after_seconds = self
            .view(command.clone(), now)
            .await?
            .poll_after_seconds
            .unwrap_or(0);
        Ok(RunTicket {
            command,
            replayed: true,
            poll_after_seconds,
        })
    }

    /// Reads a run of this agent.
    pub async fn get_graph_run(&self, agent: &Agent, id: &CommandId) -> Result<RunView, GetError> {
        let now = self.clock.now();
        let command = self
            .store
            .command_for_agent(&agent.owner, &agent.id, id)
            .await?
            .ok_or(GetError::NotFound)?;
        let command = if command.is_lapsed(now) {
            // The lease lapsed and nothing closed the run yet: close it now,
            // so this read and every later one agree.
            self.transition(Party::Agent(agent), id, |record, now| {
                Ok::<_, std::convert::Infallible>(record.lapse_in_place(now))
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => GetError::NotFound,
                TransitionError::Store(s) => GetError::Store(s),
                TransitionError::Refused(never) => match never {},
            })?
        } else {
            command
        };
        Ok(self.view(command, now).await?)
    }

    /// Reads a run of this agent, waiting up to `wait` for it to reach a
    /// terminal state. It returns as soon as the run is terminal (woken by the
    /// queue's [`Signals`], not by polling), or when `wait` has passed. While
    /// waiting it re-reads the store every [`QueueConfig::wait_recheck`] so
    /// that a change made by another process on a shared store is seen too.
    pub async fn wait_graph_run(
        &self,
        agent: &Agent,
        id: &CommandId,
        wait: Duration,
        sleeper: &dyn Sleeper,
    ) -> Result<RunView, GetError> {
        self.watch_graph_run(agent, id, wait, sleeper, &mut |_| {})
            .await
    }

    /// [`Queue::wait_graph_run`], calling `observe` with the run as it is
    /// first read and again whenever its status or its progress changes
    /// while the call waits (each progress report the desktop makes, as
    /// far as the throttle of [`QueueConfig::progress_interval`] lets them
    /// through). The run returned at the end is not passed to `observe`.
    /// This is what MCP progress notifications are made from.
    pub async fn watch_graph_run(
        &self,
        agent: &Agent,
        id: &CommandId,
        wait: Duration,
        sleeper: &dyn Sleeper,
        observe: &mut (dyn FnMut(&RunView) + Send),
    ) -> Result<RunView, GetError> {
        let hold = self.run_hold(id, wait);
        // The last status and progress passed to `observe`.
        let seen: std::sync::Mutex<Option<(CommandStatus, Option<Progress>)>> =
            std::sync::Mutex::new(None);
        let observe = std::sync::Mutex::new(observe);
        let (seen, observe) = (&seen, &observe);
        hold.run(&self.signals, &*self.clock, sleeper, || async move {
            let view = self.get_graph_run(agent, id).await?;
            if view.command.status.is_terminal() {
                return Ok(Look::Ready(view));
            }
            let state = (view.command.status, view.command.progress.clone());
            let mut last = seen.lock().unwrap_or_else(|p| p.into_inner());
            if last.as_ref() != Some(&state) {
                (observe.lock().unwrap_or_else(|p| p.into_inner()))(&view);
                *last = Some(state);
            }
            Ok(Look::NotYet(view))
        })
        .await
    }

    /// True when this process learns of every write another process makes
    /// to the store without reading it: the store has no other writer, or
    /// [`Queue::maintain`] watches its marker ([`ExternalWrites`]), or the
    /// signals' forwarder [delivers](crate::signals::Forwarder::delivers)
    /// other processes' notifications. Held requests then wait on
    /// notifications alone (looking again only every [`FED_RECHECK`], a
    /// safety net), instead of every `hold_recheck` / `wait_recheck`, so
    /// thousands of them cost nothing while nothing happens.
    pub fn external_writes_fed(&self) -> bool {
        match self.store.external_writes() {
            ExternalWrites::None | ExternalWrites::Marker => true,
            ExternalWrites::Poll => self.signals.forwarder_delivers(),
        }
    }

    /// The re-look pace of a held request: `polled` when other processes'
    /// writes show only by reading the store, else [`FED_RECHECK`].
    fn recheck(&self, polled: Duration) -> Duration {
        if self.external_writes_fed() {
            FED_RECHECK.max(polled)
        } else {
            polled
        }
    }

    /// How a relay's long-poll sync of `device` is held: until work is
    /// queued for it ([`Topic::DeviceWork`]) or [`QueueConfig::long_poll_hold`]
    /// less up to [`QueueConfig::long_poll_jitter`] passes, looking at the
    /// store every [`QueueConfig::hold_recheck`] (when other processes'
    /// writes show only by reading it); a notification answers at once,
    /// with what is queued (possibly nothing), so the relay starts a fresh
    /// pass.
    pub fn sync_hold(&self, device: &Device) -> Hold {
        let now = self.clock.now();
        let hold = sync_hold_length(&self.config, device, now);
        Hold {
            topics: vec![Topic::DeviceWork(device.owner.clone(), device.id.clone())],
            until: now.plus(hold),
            recheck: self.recheck(self.config.hold_recheck),
            answer_on_notify: true,
        }
    }

    /// How a relay's long-poll control request for `id`, a run holding
    /// `lease` (as [`Queue::control_renewing`] says), is held: until the
    /// command changes ([`Topic::Command`]) or [`QueueConfig::control_hold`]
    /// of the lease passes; a notification answers at once.
    pub fn control_hold(&self, id: &CommandId, lease: Duration) -> Hold {
        Hold {
            topics: vec![Topic::Command(*id)],
            until: self.clock.now().plus(self.config.control_hold(lease)),
            recheck: self.recheck(self.config.hold_recheck),
            answer_on_notify: true,
        }
    }

    /// A relay's sync, held when it asks for long-poll and nothing is
    /// queued: [`Queue::sync`], then (if `request.long_poll` and it found
    /// nothing) the hold of [`Queue::sync_hold`], shaped by `limit` (a
    /// transport cuts it to its own bound), sleeping on `sleeper`. The
    /// answer is what is queued when the hold ends, possibly nothing. The
    /// HTTP relay API and the in-process transport both answer with it.
    pub async fn sync_held(
        &self,
        device: &Device,
        request: &SyncRequest,
        limit: impl FnOnce(Hold) -> Hold,
        sleeper: &dyn Sleeper,
    ) -> Result<SyncResponse, SyncError> {
        let mut response = self.sync(device, request).await?;
        if request.long_poll && response.commands.is_empty() {
            let hold = limit(self.sync_hold(device));
            response.commands = hold
                .run(&self.signals, &*self.clock, sleeper, || async {
                    let commands = self.queued_for(device, &request.project).await?;
                    Ok::<_, StoreError>(if commands.is_empty() {
                        Look::NotYet(commands)
                    } else {
                        Look::Ready(commands)
                    })
                })
                .await?;
        }
        Ok(response)
    }

    /// A relay's control request, held when it asks for long-poll and there
    /// is nothing to say yet: [`Queue::control`] (which renews the lease),
    /// then the hold of [`Queue::control_hold`] for the run's lease shaped
    /// by `limit`, until cancellation is requested or the command ended.
    /// Each look of the hold only reads.
    pub async fn control_held(
        &self,
        device: &Device,
        id: &CommandId,
        long_poll: bool,
        limit: impl FnOnce(Hold) -> Hold,
        sleeper: &dyn Sleeper,
    ) -> Result<ControlAnswer, ControlError> {
        let (answer, lease) = self.control_renewing(device, id).await?;
        if !long_poll || answer.is_settled() {
            return Ok(answer);
        }
        let hold = limit(self.control_hold(id, lease));
        hold.run(&self.signals, &*self.clock, sleeper, || async {
            let answer = self.peek_control(device, id).await?;
            Ok(if answer.is_settled() {
                Look::Ready(answer)
            } else {
                Look::NotYet(answer)
            })
        })
        .await
    }

    /// How an agent's wait for run `id` is held: for `wait`, looking again
    /// whenever the command changes and at least every
    /// [`QueueConfig::wait_recheck`], answering once the run is terminal.
    pub fn run_hold(&self, id: &CommandId, wait: Duration) -> Hold {
        self.watch_hold(&[*id], wait)
    }

    /// How a stream watching `ids` is held: for `lifetime`, looking again
    /// whenever one of them changes and at least every
    /// [`QueueConfig::wait_recheck`]; the look says when it is done.
    pub fn watch_hold(&self, ids: &[CommandId], lifetime: Duration) -> Hold {
        Hold {
            topics: ids.iter().map(|id| Topic::Command(*id)).collect(),
            until: self.clock.now().plus(lifetime),
            recheck: self.recheck(self.config.wait_recheck),
            answer_on_notify: false,
        }
    }

    /// Cancels a run of this agent and returns it as it now is: a queued run
    /// ends `cancelled` at once, a running one is flagged for its desktop (or
    /// ends `cancelled` at once if its lease lapsed), a closed one is left as
    /// it is (see [`command`](crate::command)).
    pub async fn cancel_graph_run(
        &self,
        agent: &Agent,
        id: &CommandId,
    ) -> Result<RunView, CancelError> {
        let record = self
            .transition(Party::Agent(agent), id, |record, now| {
                Ok::<_, std::convert::Infallible>(record.cancel_in_place(now))
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => CancelError::NotFound,
                TransitionError::Store(s) => CancelError::Store(s),
                TransitionError::Refused(never) => match never {},
            })?;
        let now = self.clock.now();
        Ok(self.view(record, now).await?)
    }

    /// The sessions shared to one of the agent's projects (at most `limit`).
    pub async fn list_graph_sessions(
        &self,
        agent: &Agent,
        project: &ProjectId,
        limit: u32,
    ) -> Result<SessionList, ListError> {
        if !agent.reaches(project) {
            return Err(ListError::ProjectNotFound);
        }
        let sessions = self
            .store
            .shared_sessions(
                &agent.owner,
                project,
                limit.clamp(crate::limits::MIN_LIST_LIMIT, crate::limits::MAX_LIST_LIMIT) as usize,
            )
            .await?;
        Ok(SessionList {
            project: project.clone(),
            sessions,
        })
    }

    // ----- relay side -------------------------------------------------------

    /// A relay uploads the sessions shared to one project and receives the
    /// commands queued there for it. Replaces what `list_graph_sessions`
    /// shows for this device and records when the device last synced, and
    /// whether it long-polls (an unheld sync of a long-polling relay keeps
    /// that mode; see `long_polls_after`).
    pub async fn sync(
        &self,
        device: &Device,
        request: &SyncRequest,
    ) -> Result<SyncResponse, SyncError> {
        if request.sessions.len() > MAX_SESSIONS_PER_SYNC {
            return Err(SyncError::TooManySessions(request.sessions.len()));
        }
        for (index, session) in request.sessions.iter().enumerate() {
            session.validate(index)?;
            // At most 100 sessions: a scan is cheaper than hashing.
            if request.sessions[..index]
                .iter()
                .any(|s| s.graph_session_id == session.graph_session_id)
            {
                return Err(SyncError::DuplicateSession(
                    session.graph_session_id.clone(),
                ));
            }
        }
        let now = self.clock.now();
        if !self.sync_written_recently(device, request, now) {
            if !request.sessions.is_empty() {
                self.check_project_bound(device, &request.project).await?;
            }
            let long_poll = self.long_polls_after(device, request).await?;
            self.store
                .record_sync(
                    &device.owner,
                    &request.project,
                    &device.id,
                    &request.sessions,
                    long_poll,
                    now,
                )
                .await?;
            self.device_contacted(device, DeviceContact::Sync { long_poll }, now);
            self.remember_sync(device, request, now);
        }
        if request.restarted {
            self.close_after_restart(device, request.running.as_ref())
                .await?;
        }
        let mut commands = self.queued_for(device, &request.project).await?;
        // A queued run whose session this device no longer shares to the
        // project (or shares under another slug) can never run here: it
        // ends now with the re-check's error instead of waiting for a claim.
        let mut kept = Vec::with_capacity(commands.len());
        for command in commands.drain(..) {
            let shared = request.sessions.iter().any(|s| {
                s.graph_session_id == command.graph_session_id
                    && (command.slug.is_empty() || s.slug == command.slug)
            });
            if shared {
                kept.push(command);
                continue;
            }
            match self.decline(device, &command.id).await {
                Ok(_) | Err(DeclineError::NotFound | DeclineError::Refused(_)) => {}
                Err(DeclineError::Store(e)) => return Err(e.into()),
            }
        }
        let commands = kept;
        let poll_after = if request.long_poll {
            Duration::ZERO
        } else {
            self.config.sync_interval
        };
        Ok(SyncResponse {
            commands,
            poll_after,
        })
    }

    /// Whether `device` long-polls once `request` is recorded: the mode
    /// the ticket's pickup hint, the lease of the next start and the
    /// desktop's liveness follow. A held sync says it does. A long-polling
    /// relay also sends syncs that are not held: one per project at the
    /// start of every pass, before it waits in a held one, and only those
    /// when the pass finds work (it then runs it and delivers the result
    /// before its next held sync). Such a sync keeps the mode recorded, so
    /// a desktop that just delivered a result is not taken for one that
    /// polls every [`QueueConfig::sync_interval`]. The first sync of a
    /// restarted relay sets the mode afresh: a relay keeps its mode for
    /// its whole life, so only a restart can change it.
    async fn long_polls_after(
        &self,
        device: &Device,
        request: &SyncRequest,
    ) -> Result<bool, StoreError> {
        if request.long_poll || request.restarted {
            return Ok(request.long_poll);
        }
        Ok(self
            .device_record(&device.owner, &device.id)
            .await?
            .is_some_and(|d| d.long_poll))
    }

    /// A relay process started: its device's running commands other than
    /// `running` can no longer be running (their process went with the old
    /// one) and end at once ([`CommandRecord::close_after_restart_in_place`]).
    async fn close_after_restart(
        &self,
        device: &Device,
        running: Option<&CommandId>,
    ) -> Result<(), StoreError> {
        let stale = self
            .store
            .running_commands(&device.owner, &device.id, MAX_RESTART_CLOSES)
            .await?;
        for command in stale.iter().filter(|c| Some(&c.id) != running) {
            let closed = self
                .transition(Party::Device(device), &command.id, |record, now| {
                    Ok::<_, std::convert::Infallible>(record.close_after_restart_in_place(now))
                })
                .await;
            match closed {
                Ok(_) | Err(TransitionError::NotFound) => {}
                Err(TransitionError::Store(e)) => return Err(e),
                Err(TransitionError::Refused(never)) => match never {},
            }
        }
        Ok(())
    }

    /// One bounded sweep of running commands whose lease lapsed: each is
    /// closed as [`CommandRecord::lapse_in_place`] says, and whoever waits
    /// on it is woken. A running command written before leases existed is
    /// granted a lease from now instead. Reads close a lapsed run on their
    /// own, so the sweep is for runs nobody looks at and for waiters; a
    /// server runs it every few seconds. Returns how many commands it wrote.
    pub async fn sweep_lapsed(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let due = self
            .store
            .lapsed_commands(now, self.config.prune_batch)
            .await?;
        let mut written = 0;
        for command in due {
            let lease = self.config.lease_long_poll;
            let swept = self
                .transition(Party::Owner(&command.owner), &command.id, |record, now| {
                    Ok::<_, std::convert::Infallible>(if record.lease_expires_at.is_none() {
                        record.renew_in_place(now, lease)
                    } else {
                        record.lapse_in_place(now)
                    })
                })
                .await;
            match swept {
                Ok(record) if record.revision != command.revision => written += 1,
                Ok(_) | Err(TransitionError::NotFound) => {}
                Err(TransitionError::Store(e)) => return Err(e),
                Err(TransitionError::Refused(never)) => match never {},
            }
        }
        Ok(written)
    }

    /// Queued commands of `project` for `device`, without writing anything
    /// (a long-poll driver calls this while holding a sync).
    pub async fn queued_for(
        &self,
        device: &Device,
        project: &ProjectId,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        let queued = self
            .store
            .queued_commands(
                &device.owner,
                project,
                &device.id,
                self.config.max_commands_per_sync,
            )
            .await?;
        // The desktop starts them next: that transition can begin from
        // these copies.
        for command in &queued {
            self.live.put(command);
        }
        Ok(queued)
    }

    /// The relay starts a command under the engine's execution id. Refused if
    /// the command was cancelled meanwhile, so a cancelled command never runs.
    pub async fn start(
        &self,
        device: &Device,
        id: &CommandId,
        execution: &ExecutionId,
    ) -> Result<CommandRecord, StartError> {
        self.touch(device).await?;
        let long_poll = self
            .device_record(&device.owner, &device.id)
            .await?
            .is_some_and(|d| d.long_poll);
        let lease = self.config.lease(long_poll);
        self.transition(Party::Device(device), id, |record, now| {
            record.start_in_place(execution, now, lease)
        })
        .await
        .map_err(|e| match e {
            TransitionError::NotFound => StartError::NotFound,
            TransitionError::Store(s) => StartError::Store(s),
            TransitionError::Refused(r) => StartError::Refused(r),
        })
    }

    /// The relay's control poll for a running command: is cancellation requested?
    pub async fn control(
        &self,
        device: &Device,
        id: &CommandId,
    ) -> Result<ControlAnswer, ControlError> {
        Ok(self.control_renewing(device, id).await?.0)
    }

    /// [`Queue::control`], with the lease the run holds (the one it was
    /// granted, or [`QueueConfig::lease_long_poll`] for a run without
    /// one): what a held control request's length follows
    /// ([`Queue::control_hold`]).
    pub async fn control_renewing(
        &self,
        device: &Device,
        id: &CommandId,
    ) -> Result<(ControlAnswer, Duration), ControlError> {
        self.touch(device).await?;
        // A control request from the executing desktop renews the lease (of
        // the length it was granted with), or closes a lapsed run.
        let lease_of =
            |record: &CommandRecord| record.lease().unwrap_or(self.config.lease_long_poll);
        let command = self
            .transition(Party::Device(device), id, |record, now| {
                let lease = lease_of(record);
                Ok::<_, std::convert::Infallible>(record.renew_in_place(now, lease))
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => ControlError::NotFound,
                TransitionError::Store(s) => ControlError::Store(s),
                TransitionError::Refused(never) => match never {},
            })?;
        Ok((ControlAnswer::of(&command), lease_of(&command)))
    }

    /// What a control request would answer now, without renewing the lease
    /// or touching the device: for a driver holding a control request, which
    /// looks again while it waits.
    pub async fn peek_control(
        &self,
        device: &Device,
        id: &CommandId,
    ) -> Result<ControlAnswer, ControlError> {
        let command = self
            .store
            .command_for_device(&device.owner, &device.id, id)
            .await?
            .ok_or(ControlError::NotFound)?;
        Ok(ControlAnswer::of(&command.at(self.clock.now())))
    }

    /// The relay reports the end of an execution. Fenced by execution id.
    pub async fn complete(
        &self,
        device: &Device,
        id: &CommandId,
        envelope: &ResultEnvelope,
    ) -> Result<CompleteAck, CompleteError> {
        envelope.validate()?;
        self.touch(device).await?;
        let mut duplicate = false;
        let record = self
            .transition(Party::Device(device), id, |record, now| {
                let changed = record.complete_in_place(envelope, now)?;
                duplicate = !changed;
                Ok(changed)
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => CompleteError::NotFound,
                TransitionError::Store(s) => CompleteError::Store(s),
                TransitionError::Refused(r) => CompleteError::Refused(r),
            })?;
        Ok(if duplicate {
            CompleteAck::Duplicate(record)
        } else {
            CompleteAck::Recorded(record)
        })
    }

    /// The relay's re-check just before running failed: the command is
    /// closed as `cancelled` with "Graph session is no longer shared with this project".
    /// A command that is already closed is left as it is, and the answer
    /// says so ([`DeclineAck::Unchanged`]).
    pub async fn decline(
        &self,
        device: &Device,
        id: &CommandId,
    ) -> Result<DeclineAck, DeclineError> {
        self.touch(device).await?;
        let mut changed = false;
        let record = self
            .transition(Party::Device(device), id, |record, now| {
                changed = record.decline_in_place(now)?;
                Ok(changed)
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => DeclineError::NotFound,
                TransitionError::Store(s) => DeclineError::Store(s),
                TransitionError::Refused(r) => DeclineError::Refused(r),
            })?;
        Ok(if changed {
            DeclineAck::Recorded(record)
        } else {
            DeclineAck::Unchanged(record)
        })
    }

    /// The running Graph reports how far it got (`message` at most
    /// [`MAX_PROGRESS_MESSAGE`](crate::limits::MAX_PROGRESS_MESSAGE)
    /// characters, `percent` from 0 to 100). Fenced by execution id and
    /// taken only while the command runs; it never changes the status.
    /// Writes are throttled to one per [`QueueConfig::progress_interval`]
    /// per command; see [`ProgressAck`].
    pub async fn report_progress(
        &self,
        device: &Device,
        id: &CommandId,
        execution: &ExecutionId,
        message: Option<String>,
        percent: Option<f64>,
    ) -> Result<ProgressAck, ProgressError> {
        let now = self.clock.now();
        let progress = Progress::new(message, percent, now)?;
        let throttled = {
            let states = self.progress.lock().unwrap_or_else(|p| p.into_inner());
            states.get(id).is_some_and(|state| {
                state.written_at <= now
                    && now.since(state.written_at) < self.config.progress_interval
            })
        };
        if throttled {
            // Only a report this device may make waits for its turn.
            let mut probe = self
                .store
                .command_for_device(&device.owner, &device.id, id)
                .await?
                .ok_or(ProgressError::NotFound)?;
            probe.progress_in_place(execution, progress.clone(), now)?;
            let mut states = self.progress.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(state) = states.get_mut(id) {
                state.pending = Some((device.clone(), execution.clone(), progress));
                return Ok(ProgressAck::Coalesced);
            }
        }
        self.write_progress(device, id, execution, progress).await
    }

    async fn write_progress(
        &self,
        device: &Device,
        id: &CommandId,
        execution: &ExecutionId,
        progress: Progress,
    ) -> Result<ProgressAck, ProgressError> {
        let mut changed = false;
        let record = self
            .transition(Party::Device(device), id, |record, now| {
                changed = record.progress_in_place(execution, progress.clone(), now)?;
                Ok(changed)
            })
            .await
            .map_err(|e| match e {
                TransitionError::NotFound => ProgressError::NotFound,
                TransitionError::Store(s) => ProgressError::Store(s),
                TransitionError::Refused(r) => ProgressError::Refused(r),
            })?;
        let mut states = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        if states.len() >= MAX_PROGRESS_STATES && !states.contains_key(id) {
            states.clear();
        }
        if changed {
            states.insert(
                record.id,
                ProgressState {
                    written_at: self.clock.now(),
                    pending: None,
                },
            );
            Ok(ProgressAck::Recorded)
        } else {
            Ok(ProgressAck::Unchanged)
        }
    }

    /// Writes the coalesced progress reports whose interval has passed and
    /// forgets commands that have been quiet for a while. Returns how many
    /// reports it wrote.
    pub async fn flush_progress(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let interval = self.config.progress_interval;
        let due: Vec<(CommandId, (Device, ExecutionId, Progress))> = {
            let mut states = self.progress.lock().unwrap_or_else(|p| p.into_inner());
            states.retain(|_, s| {
                s.pending.is_some() || now < s.written_at || now.since(s.written_at) < interval * 10
            });
            states
                .iter_mut()
                .filter(|(_, s)| now < s.written_at || now.since(s.written_at) >= interval)
                .filter_map(|(id, s)| s.pending.take().map(|p| (*id, p)))
                .collect()
        };
        let mut written = 0;
        for (id, (device, execution, progress)) in due {
            match self
                .write_progress(&device, &id, &execution, progress)
                .await
            {
                Ok(ProgressAck::Recorded) => written += 1,
                Ok(_) | Err(ProgressError::NotFound | ProgressError::Refused(_)) => {}
                Err(ProgressError::Invalid(_)) => {}
                Err(ProgressError::Store(e)) => return Err(e),
            }
        }
        Ok(written)
    }

    /// The server's periodic housekeeping, meant to run about once a
    /// second: writes coalesced progress, closes lapsed runs
    /// ([`Queue::sweep_lapsed`]) and prunes ([`Queue::prune`]).
    pub async fn maintain(&self) -> Result<MaintenanceReport, StoreError> {
        Ok(MaintenanceReport {
            woken: self.watch_external_writes().await?,
            progress: self.flush_progress().await?,
            leases: self.sweep_lapsed().await?,
            pruned: self.prune().await?,
        })
    }

    /// Under [`ExternalWrites::Marker`]: reads the store's marker and, when
    /// it moved since the last call, wakes every held request (each looks
    /// at the store again). Returns how many were woken; the first call
    /// only records the marker. [`Queue::maintain`] calls it.
    pub async fn watch_external_writes(&self) -> Result<usize, StoreError> {
        if self.store.external_writes() != ExternalWrites::Marker {
            return Ok(0);
        }
        let now = self.store.external_write_marker().await?;
        let before = self
            .marker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(now);
        Ok(match before {
            Some(before) if before != now => self.signals.wake_all(),
            _ => 0,
        })
    }

    /// One bounded pruning step: expired keys, and terminal commands past retention.
    pub async fn prune(&self) -> Result<PruneReport, StoreError> {
        let now = self.clock.now();
        self.store
            .prune(PruneRequest {
                now,
                terminal_before: self.config.terminal_retention.map(|r| now.minus(r)),
                batch: self.config.prune_batch,
            })
            .await
    }

    // ----- internals --------------------------------------------------------

    /// Refuses a share into one project more than
    /// [`QueueConfig::max_projects_per_device`]; a project the device
    /// already shares into is always fine.
    async fn check_project_bound(
        &self,
        device: &Device,
        project: &ProjectId,
    ) -> Result<(), SyncError> {
        let limit = self.config.max_projects_per_device;
        let shared = self
            .store
            .shared_projects(&device.owner, &device.id, limit.saturating_add(1))
            .await?;
        if shared.len() < limit || shared.contains(project) {
            Ok(())
        } else {
            Err(SyncError::TooManyProjects { limit })
        }
    }

    /// Records that `device` was seen, at most once per
    /// [`QueueConfig::touch_interval`] per device from this queue (liveness
    /// is reported in seconds; a write per relay request would only load the store).
    async fn touch(&self, device: &Device) -> Result<(), StoreError> {
        let now = self.clock.now();
        {
            let mut touched = self.touched.lock().unwrap_or_else(|p| p.into_inner());
            if touched.get(&device.id).is_some_and(|(owner, t)| {
                *owner == device.owner && now.since(*t) < self.config.touch_interval && *t <= now
            }) {
                return Ok(());
            }
            if touched.len() >= MAX_TOUCH_CACHE {
                touched.clear();
            }
            touched.insert(device.id.clone(), (device.owner.clone(), now));
        }
        self.store
            .touch_device(&device.owner, &device.id, DeviceContact::Other, now)
            .await?;
        self.device_contacted(device, DeviceContact::Other, now);
        Ok(())
    }

    /// The liveness of `device` of `owner`: as this queue read it less than
    /// [`QueueConfig::touch_interval`] ago, or else from the store. Liveness
    /// is written at most once per that interval anyway (the touch
    /// throttle), so the copy is as fresh as the store; this queue's own
    /// writes of the device change the copy as they change the store. A desktop that takes up a run moments
    /// after it was queued costs one read of its liveness, not two (the
    /// ticket's pickup hint, then the lease of `start`).
    async fn device_record(
        &self,
        owner: &crate::ids::OwnerId,
        device: &crate::ids::DeviceId,
    ) -> Result<Option<DeviceRecord>, StoreError> {
        let now = self.clock.now();
        {
            let devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((record, read_at)) = devices.get(device)
                && record.owner == *owner
                && *read_at <= now
                && now.since(*read_at) < self.config.touch_interval
            {
                return Ok(Some(record.clone()));
            }
        }
        let record = self.store.device(owner, device).await?;
        if let Some(record) = &record {
            let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
            if devices.len() >= MAX_TOUCH_CACHE {
                devices.clear();
            }
            devices.insert(device.clone(), (record.clone(), now));
        }
        Ok(record)
    }

    /// This queue just wrote `contact` of `device` at `now`: its copy of
    /// the device's liveness, if it has one, takes the same change.
    fn device_contacted(&self, device: &Device, contact: DeviceContact, now: Timestamp) {
        let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((record, _)) = devices.get_mut(&device.id)
            && record.owner == device.owner
        {
            record.record_contact(contact, now);
        }
    }

    /// Whether this queue wrote exactly this sync (same sessions, same mode)
    /// for this device and project less than [`QueueConfig::touch_interval`]
    /// ago. Then the store already shows it, up to a stamp at most that old,
    /// and the writes are skipped: a relay that syncs often (or a benchmark)
    /// costs one read per sync instead of two writes.
    fn sync_written_recently(
        &self,
        device: &Device,
        request: &SyncRequest,
        now: Timestamp,
    ) -> bool {
        let synced = self.synced.lock().unwrap_or_else(|p| p.into_inner());
        synced
            .get(&device.id)
            .and_then(|list| {
                list.iter()
                    .find(|w| w.owner == device.owner && w.project == request.project)
            })
            .is_some_and(|w| {
                w.at <= now
                    && now.since(w.at) < self.config.touch_interval
                    && w.long_poll == request.long_poll
                    && w.sessions == request.sessions
            })
    }

    fn remember_sync(&self, device: &Device, request: &SyncRequest, now: Timestamp) {
        let mut synced = self.synced.lock().unwrap_or_else(|p| p.into_inner());
        if synced.len() >= MAX_TOUCH_CACHE && !synced.contains_key(&device.id) {
            synced.clear();
        }
        let list = synced.entry(device.id.clone()).or_default();
        list.retain(|w| !(w.owner == device.owner && w.project == request.project));
        if list.len() >= MAX_SYNCS_PER_DEVICE {
            list.remove(0);
        }
        list.push(SyncWritten {
            owner: device.owner.clone(),
            project: request.project.clone(),
            sessions: request.sessions.clone(),
            long_poll: request.long_poll,
            at: now,
        });
    }

    /// Takes a record (this queue's copy of it, see [`crate::live`], or a
    /// fresh read), lets `apply` turn it into the next revision in place
    /// (`Ok(false)`: nothing to write), and writes it with a compare-and-swap,
    /// retrying from a fresh read if another writer won. An answer that
    /// writes nothing is only given on a fresh read. Returns the record as
    /// it stands afterwards.
    async fn transition<E>(
        &self,
        party: Party<'_>,
        id: &CommandId,
        mut apply: impl FnMut(&mut CommandRecord, Timestamp) -> Result<bool, E>,
    ) -> Result<CommandRecord, TransitionError<E>> {
        // The first attempt starts from this queue's last copy, if it has
        // one for this party: a write that succeeds proves the copy was
        // current; any other outcome is judged again on a fresh read.
        let mut guess = self.live.get(id, |record| party.owns(record));
        for _ in 0..MAX_CAS_ATTEMPTS {
            let from_copy = guess.is_some();
            let mut record = match guess.take() {
                Some(copy) => copy,
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
                        self.live.forget(id);
                        return Err(TransitionError::NotFound);
                    };
                    read
                }
            };
            let now = self.clock.now();
            let mut verified = !from_copy;
            if record.is_lapsed(now) && !matches!(party, Party::Agent(_)) {
                // Every report from a desktop finds a lapsed run closed
                // first: the close is written, then the report is judged
                // against the closed run (a late result is refused).
                let mut closed = record.clone();
                closed.lapse_in_place(now);
                if !self.write(&closed).await.map_err(TransitionError::Store)? {
                    continue;
                }
                record = closed;
                verified = true;
            }
            match apply(&mut record, now) {
                // A copy's refusal or "nothing to do" may be out of date.
                Err(_) | Ok(false) if !verified => {
                    self.live.forget(id);
                    continue;
                }
                Err(refusal) => return Err(TransitionError::Refused(refusal)),
                Ok(false) => {
                    self.live.put(&record);
                    return Ok(record);
                }
                Ok(true) => {}
            }
            if self.write(&record).await.map_err(TransitionError::Store)? {
                return Ok(record);
            }
        }
        Err(TransitionError::Store(StoreError::Backend(format!(
            "command update lost {MAX_CAS_ATTEMPTS} races in a row"
        ))))
    }

    /// [`Store::update_command`]; on success whoever waits on the command
    /// is woken and the record becomes this queue's copy, on a lost race
    /// the copy is dropped.
    async fn write(&self, record: &CommandRecord) -> Result<bool, StoreError> {
        let written = self.store.update_command(record).await?;
        if written {
            self.live.put(record);
            self.signals.notify(&Topic::Command(record.id));
        } else {
            self.live.forget(&record.id);
        }
        Ok(written)
    }

    async fn view(&self, command: CommandRecord, now: Timestamp) -> Result<RunView, StoreError> {
        // What a read shows is the run as it is now (a lapsed lease closes it).
        let command = match command.at(now) {
            std::borrow::Cow::Borrowed(_) => command,
            std::borrow::Cow::Owned(closed) => closed,
        };
        let (poll_after_seconds, device_offline_since) = match command.status {
            CommandStatus::Queued => {
                let (secs, offline) = self.pickup_hint(&command, now).await?;
                (Some(secs), offline)
            }
            CommandStatus::Running => (Some(self.config.running_poll_hint.as_secs().max(1)), None),
            _ => (None, None),
        };
        Ok(RunView {
            command,
            poll_after_seconds,
            device_offline_since,
        })
    }

    /// When a queued command will probably be picked up, from the device's
    /// cadence; and since when the device looks offline, if it does.
    async fn pickup_hint(
        &self,
        command: &CommandRecord,
        now: Timestamp,
    ) -> Result<(u64, Option<Timestamp>), StoreError> {
        let device = self.device_record(&command.owner, &command.device).await?;
        Ok(pickup_hint(
            &self.config,
            device.as_ref(),
            command.created_at,
            now,
        ))
    }
}

/// Pure part of [`Queue::pickup_hint`].
fn pickup_hint(
    config: &QueueConfig,
    device: Option<&DeviceRecord>,
    created_at: Timestamp,
    now: Timestamp,
) -> (u64, Option<Timestamp>) {
    let interval_secs = config.sync_interval.as_secs().max(1);
    let Some(device) = device else {
        return (interval_secs, Some(created_at));
    };
    let Some(last_sync) = device.last_sync_at else {
        return (interval_secs, Some(device.last_seen_at));
    };
    let expected_gap = if device.long_poll {
        config.long_poll_hold
    } else {
        config.sync_interval
    };
    let offline_after = expected_gap * config.offline_after_missed_syncs.max(1);
    let last_contact = last_sync.max(device.last_seen_at);
    if now.since(last_contact) > offline_after {
        return (interval_secs, Some(last_contact));
    }
    if device.long_poll {
        return (1, None);
    }
    let next_due = last_sync.plus(config.sync_interval);
    let wait_ms = next_due.as_millis().saturating_sub(now.as_millis());
    (wait_ms.div_ceil(1000).clamp(1, interval_secs) + 1, None)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readiness_probe_ids_are_valid() {
        assert!(OwnerId::parse(READINESS_PROBE.0).is_ok());
        assert!(DeviceId::parse(READINESS_PROBE.1).is_ok());
    }

    /// Multi-threaded runtimes need every queue future to be `Send`.
    #[allow(dead_code)]
    fn queue_futures_are_send(
        q: &Queue,
        agent: &Agent,
        device: &Device,
        id: &CommandId,
        env: &ResultEnvelope,
    ) {
        fn send<T: Send>(_: T) {}
        let exec = ExecutionId::parse("e").expect("valid");
        send(q.cancel_graph_run(agent, id));
        send(q.get_graph_run(agent, id));
        send(q.start(device, id, &exec));
        send(q.complete(device, id, env));
        send(q.decline(device, id));
        send(q.control(device, id));
        send(q.prune());
    }
    use crate::ids::{DeviceId, OwnerId};

    fn device(last_sync: Option<u64>, last_seen: u64, long_poll: bool) -> DeviceRecord {
        DeviceRecord {
            device: DeviceId::parse("d").unwrap(),
            owner: OwnerId::parse("o").unwrap(),
            last_sync_at: last_sync.map(Timestamp),
            last_seen_at: Timestamp(last_seen),
            long_poll,
        }
    }

    #[test]
    fn held_syncs_end_at_scattered_times_within_the_jitter() {
        let most = Duration::from_secs(5);
        let mut seen = std::collections::BTreeSet::new();
        for n in 0..200u64 {
            let d = Device::new(
                DeviceId::parse(&format!("desk-{}", n % 20)).unwrap(),
                OwnerId::parse("o").unwrap(),
            );
            let j = jitter(&d, Timestamp(1_000 * n), most);
            assert!(j < most, "{j:?}");
            seen.insert(j.as_millis() / 250);
        }
        // 200 holds spread over the 20 quarter-seconds of the window.
        assert_eq!(seen.len(), 20, "{seen:?}");
        let d = Device::new(DeviceId::parse("d").unwrap(), OwnerId::parse("o").unwrap());
        assert_eq!(jitter(&d, Timestamp(7), Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn a_short_hold_loses_at_most_a_fifth_to_the_jitter() {
        let d = Device::new(DeviceId::parse("d").unwrap(), OwnerId::parse("o").unwrap());
        let config = QueueConfig {
            long_poll_hold: Duration::from_secs(2),
            ..QueueConfig::default()
        };
        for n in 0..100 {
            let hold = sync_hold_length(&config, &d, Timestamp(n * 37));
            assert!(hold > Duration::from_millis(1_600) && hold <= Duration::from_secs(2));
        }
        let exact = QueueConfig {
            long_poll_jitter: Duration::ZERO,
            ..QueueConfig::default()
        };
        assert_eq!(
            sync_hold_length(&exact, &d, Timestamp(5)),
            Duration::from_secs(25)
        );
    }

    #[test]
    fn a_control_request_is_held_for_at_most_a_third_of_its_runs_lease() {
        let c = QueueConfig::default();
        // The default lease (60 s): the hold is a third of it, 20 s.
        assert_eq!(c.control_hold(c.lease(true)), Duration::from_secs(20));
        // `serve --lease-seconds 10`: 3.33 s, not the 25 s long-poll hold.
        assert_eq!(
            c.control_hold(Duration::from_secs(10)),
            Duration::from_nanos(3_333_333_333)
        );
        // An interval-mode lease held by a desktop that long-polls control.
        assert_eq!(c.control_hold(c.lease(false)), Duration::from_secs(10));
        // A long lease: the long-poll hold.
        assert_eq!(c.control_hold(Duration::from_secs(600)), c.long_poll_hold);
        for lease in [1, 2, 9, 10, 30, 60, 74, 75, 76, 3_600] {
            let lease = Duration::from_secs(lease);
            let hold = c.control_hold(lease);
            assert!(hold <= c.long_poll_hold && hold * 3 <= lease, "{lease:?}");
        }
    }

    #[test]
    fn an_interval_lease_spans_at_least_three_control_polls() {
        for (controls, lease) in [(1, 9), (2, 9), (3, 9), (10, 30)] {
            let c = QueueConfig {
                lease_interval_controls: controls,
                ..QueueConfig::default()
            };
            assert_eq!(c.lease(false), Duration::from_secs(lease), "{controls}");
        }
    }

    #[test]
    fn pickup_hint_follows_the_relay_cadence() {
        let c = QueueConfig::default();
        // Interval mode: synced 5 s ago, next pass due in 15 s.
        assert_eq!(
            pickup_hint(
                &c,
                Some(&device(Some(0), 0, false)),
                Timestamp(0),
                Timestamp(5_000)
            ),
            (16, None)
        );
        // Long-poll: picked up at once.
        assert_eq!(
            pickup_hint(
                &c,
                Some(&device(Some(0), 0, true)),
                Timestamp(0),
                Timestamp(5_000)
            ),
            (1, None)
        );
        // Missed three passes: offline since the last contact.
        assert_eq!(
            pickup_hint(
                &c,
                Some(&device(Some(1_000), 1_000, false)),
                Timestamp(0),
                Timestamp(62_000)
            ),
            (20, Some(Timestamp(1_000)))
        );
        // Never seen.
        assert_eq!(
            pickup_hint(&c, None, Timestamp(7), Timestamp(9)),
            (20, Some(Timestamp(7)))
        );
    }
}
