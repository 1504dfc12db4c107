//! The harness: the real `Queue` (memory store) and the real relay state
//! machine, on one virtual clock.
//!
//! Only what lies outside the system is simulated: network latency, the
//! Graph's run time, lost requests and the agent's script. Time moves from
//! one deadline to the next (as quinn-proto's test `Pair` does): the earliest
//! of the scheduled deliveries and the relay's own timer.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::executor::block_on;
use graph_relay_core::command::{CommandRecord, CommandStatus};
use graph_relay_core::envelope::FinishStatus;
use graph_relay_core::hold::Hold;
use graph_relay_core::ids::{
    AgentId, CommandId, DeviceId, ExecutionId, GraphSessionId, OwnerId, ProjectId,
};
use graph_relay_core::outbox::{Outbox, OutboxItem, RelayReport};
use graph_relay_core::principal::{Agent, Device};
use graph_relay_core::queue::{ControlAnswer, Queue, QueueConfig, RunView, SyncRequest};
use graph_relay_core::relay::driver::RelayTransport;
use graph_relay_core::relay::executor::ProgressReport;
use graph_relay_core::relay::in_process::QueueTransport;
use graph_relay_core::relay::{
    Action, ClaimOutcome, ExecutionOutcome, Job, PostOutcome, Refusal, Relay, RelayCommand,
    RelayConfig, RelayMode, SharedSet, SyncFailure,
};
use graph_relay_core::session::SessionMeta;
use graph_relay_core::signals::{Subscription, Topic};
use graph_relay_core::time::{Clock, ManualClock, SeededIds, Timestamp};
use graph_relay_store_memory::{MemoryOutbox, MemoryStore};
use serde_json::json;

use crate::rng::SimRng;

mod desktop;
mod events;
mod server;

use self::events::{Answer, Event, Held, HeldKind, Request, Scheduled};

/// The simulated start of time: 2026-01-01T00:00:00Z.
pub const START: Timestamp = Timestamp(1_767_225_600_000);

/// Synthetic Graph run times: lognormal with a median and a floor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunTime {
    /// Median run time in seconds (60).
    pub median_secs: f64,
    /// Lognormal shape (0.75).
    pub sigma: f64,
    /// Shortest run in seconds (5).
    pub min_secs: f64,
}

impl Default for RunTime {
    fn default() -> Self {
        Self {
            median_secs: 60.0,
            sigma: 0.75,
            min_secs: 5.0,
        }
    }
}

/// How a world is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct WorldConfig {
    /// Interval (published) or long-poll relay.
    pub mode: RelayMode,
    /// One-way network latency of every relay request (25 ms).
    pub latency: Duration,
    /// How long the server holds a long-poll request (25 s).
    pub hold: Duration,
    /// Whether the relay's outbox is durable (on) or absent (off).
    pub outbox: bool,
    /// Graph run times.
    pub run_time: RunTime,
    /// When the relay's first pass happens, from the start (its phase).
    pub relay_start: Duration,
    /// Seed of run times and the relay's jitter.
    pub seed: u64,
    /// How often the server runs its housekeeping ([`Queue::maintain`]:
    /// coalesced progress, lapsed leases, pruning); `None` never (reads still
    /// close a lapsed run).
    pub maintain: Option<Duration>,
    /// The synthetic Graph reports progress this often (a percentage
    /// through the run, and a message), or never.
    pub progress_every: Option<Duration>,
}

impl Default for WorldConfig {
    fn default() -> Self {
        Self {
            mode: RelayMode::Interval,
            latency: Duration::from_millis(25),
            hold: Duration::from_secs(25),
            outbox: true,
            run_time: RunTime::default(),
            relay_start: Duration::ZERO,
            seed: 1,
            maintain: None,
            progress_every: None,
        }
    }
}

/// What the executor saw of one execution.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionRecord {
    /// The command.
    pub command: CommandId,
    /// When the executor started it.
    pub started: Timestamp,
    /// When it stopped.
    pub ended: Option<Timestamp>,
    /// How it ended.
    pub status: Option<FinishStatus>,
}

/// One simulated world: an owner, one desktop with one project and one
/// shared session, the agent that queues runs, and a second agent.
pub struct World {
    clock: Arc<ManualClock>,
    /// The real queue over the memory store.
    pub queue: Queue,
    relay: Relay,
    relay_config: RelayConfig,
    /// The desktop process now running (or last run), counted from 1.
    epoch: u64,
    /// False between [`World::kill_desktop`] and the desktop's restart.
    desktop_up: bool,
    /// When the desktop last died.
    pub died_at: Option<Timestamp>,
    outbox: Option<MemoryOutbox>,
    config: WorldConfig,
    heap: BinaryHeap<Reverse<Scheduled>>,
    seq: u64,
    rng: SimRng,
    held: Vec<Held>,
    hold_generation: u64,
    running: Option<(CommandId, u64)>,
    exec_generation: u64,
    lose_posts: usize,
    /// Every execution the desktop started, in order.
    pub executions: Vec<ExecutionRecord>,
    /// The agent that queues runs.
    pub agent: Agent,
    /// Another agent of the same owner, connected to the same project.
    pub other_agent: Agent,
    /// The desktop.
    pub device: Device,
    /// The project the session is shared to.
    pub project: ProjectId,
    /// The shared session.
    pub session: GraphSessionId,
}

fn valid<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| unreachable!("literal ids are valid: {e:?}"))
}

/// What the simulated desktop shares: one synthetic Graph in `project`.
fn synthetic_share(project: &ProjectId, session: &GraphSessionId) -> SharedSet {
    let mut shared = SharedSet::new();
    shared.share(
        project.clone(),
        SessionMeta {
            graph_session_id: session.clone(),
            name: "Synthetic graph".into(),
            description: "Runs for a lognormal time".into(),
            slug: "synthetic".into(),
            version: "1".into(),
            status: "ready".into(),
        },
    );
    shared
}

impl World {
    /// A world at [`START`] with the desktop's first pass at `config.relay_start`.
    pub fn new(config: WorldConfig) -> Self {
        let clock = Arc::new(ManualClock::new(START));
        let queue_config = QueueConfig {
            long_poll_hold: config.hold,
            ..QueueConfig::default()
        };
        let queue = Queue::new(
            Arc::new(MemoryStore::new()),
            clock.clone(),
            Arc::new(SeededIds::new(config.seed)),
            queue_config,
        );
        let owner = valid(OwnerId::parse("owner"));
        let project = valid(ProjectId::parse("project"));
        let session = valid(GraphSessionId::parse("gs_0123456789abcdef0123456789abcdef"));
        let shared = synthetic_share(&project, &session);
        let relay_config = RelayConfig {
            mode: config.mode,
            seed: config.seed,
            ..RelayConfig::default()
        };
        let relay = Relay::new(
            relay_config.clone(),
            shared.clone(),
            START.plus(config.relay_start),
        );
        let device = Device::new(valid(DeviceId::parse("desktop")), owner.clone());
        // The desktop shared its session once before the experiment starts.
        let share = SyncRequest {
            project: project.clone(),
            sessions: shared.sessions(&project),
            long_poll: false,
            restarted: false,
            running: None,
        };
        let _ = block_on(queue.sync(&device, &share));
        let rng = SimRng::new(config.seed ^ 0x5eed);
        let mut world = Self {
            outbox: config.outbox.then(MemoryOutbox::new),
            clock,
            queue,
            relay,
            relay_config,
            epoch: 1,
            desktop_up: true,
            died_at: None,
            heap: BinaryHeap::new(),
            seq: 0,
            rng,
            held: Vec::new(),
            hold_generation: 0,
            running: None,
            exec_generation: 0,
            lose_posts: 0,
            executions: Vec::new(),
            agent: Agent::new(
                valid(AgentId::parse("agent")),
                owner.clone(),
                [project.clone()],
            ),
            other_agent: Agent::new(
                valid(AgentId::parse("second-agent")),
                owner,
                [project.clone()],
            ),
            project,
            device,
            session,
            config,
        };
        if let Some(every) = world.config.maintain {
            world.schedule(START.plus(every), Event::Maintain);
        }
        world
    }

    /// The desktop dies at once (power cut, SIGKILL): its relay and the
    /// Graph it runs stop, and answers to its requests in flight are lost.
    /// Its durable outbox survives. The server notices nothing.
    pub fn kill_desktop(&mut self) {
        let now = self.now();
        self.desktop_up = false;
        self.died_at = Some(now);
        if self.running.take().is_some()
            && let Some(record) = self.executions.last_mut()
            && record.ended.is_none()
        {
            record.ended = Some(now);
        }
    }

    /// The desktop starts again after `delay`: a new relay process on the
    /// same outbox, whose first syncs announce the restart.
    pub fn restart_desktop_after(&mut self, delay: Duration) {
        let at = self.now().plus(delay);
        self.schedule(at, Event::DesktopStarts);
    }

    /// True while the desktop runs.
    pub fn desktop_up(&self) -> bool {
        self.desktop_up
    }

    fn start_desktop(&mut self) {
        if self.desktop_up {
            return;
        }
        let now = self.now();
        self.epoch += 1;
        self.desktop_up = true;
        // A new process: new jitter and new execution ids.
        let config = RelayConfig {
            seed: self.relay_config.seed ^ self.epoch,
            ..self.relay_config.clone()
        };
        let mut relay = Relay::new(config, self.relay.shared().clone(), now);
        if let Some(outbox) = &self.outbox {
            relay.remember_synced(block_on(outbox.synced_projects()).unwrap_or_default());
        }
        self.relay = relay;
    }

    /// The virtual time.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The configuration.
    pub fn config(&self) -> &WorldConfig {
        &self.config
    }

    /// Loses the next `n` report POSTs (they never reach the server).
    pub fn lose_next_posts(&mut self, n: usize) {
        self.lose_posts += n;
    }

    /// A command as its agent sees it.
    pub fn command(&self, agent: &Agent, id: &CommandId) -> Option<CommandRecord> {
        block_on(self.queue.get_graph_run(agent, id))
            .ok()
            .map(|v| v.command)
    }

    fn schedule(&mut self, at: Timestamp, event: Event) {
        self.seq += 1;
        self.heap.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            event,
        }));
    }

    fn after_latency(&self) -> Timestamp {
        self.now().plus(self.config.latency)
    }

    /// Advances virtual time to `until`, processing everything due on the way.
    pub fn run_until(&mut self, until: Timestamp) {
        while self.step(until) {}
        if until > self.now() {
            self.clock.set(until);
        }
    }

    /// Performs pending relay actions, answers woken held requests, then
    /// processes the one next due event or relay timer if it is due by
    /// `limit`. Returns false when nothing more is due by `limit`.
    fn step(&mut self, limit: Timestamp) -> bool {
        self.perform_actions();
        self.wake_held();
        let relay_due = self.relay_timeout();
        let heap_due = self.heap.peek().map(|Reverse(s)| s.at);
        let next = match (relay_due, heap_due) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => return false,
        };
        if next > limit {
            return false;
        }
        self.clock.set(next.max(self.now()));
        if heap_due == Some(next) {
            if let Some(Reverse(s)) = self.heap.pop() {
                self.dispatch(s.event);
            }
        } else {
            let now = self.now();
            self.relay.handle_timeout(now);
        }
        true
    }

    /// Runs until `done` holds (checked after every step) or `limit` passes.
    pub fn run_while(&mut self, limit: Timestamp, mut done: impl FnMut(&World) -> bool) {
        while !done(self) && self.now() < limit {
            let next = self.next_due().unwrap_or(limit).min(limit);
            self.run_until(next.max(self.now()));
            if self.next_due().is_none() && !done(self) {
                self.run_until(limit);
                break;
            }
        }
    }

    /// An agent's `get_graph_run` with `wait_seconds`, answered as the
    /// server answers it: at once if the run is terminal, else when the
    /// queue signals a change to the run (then re-read), or at the bound.
    pub fn wait_call(&mut self, id: &CommandId, wait: Duration) -> Option<RunView> {
        let deadline = self.now().plus(wait);
        loop {
            let mut changed = self.queue.signals().subscribe(Topic::Command(*id));
            let view = block_on(self.queue.get_graph_run(&self.agent, id)).ok()?;
            if view.command.status.is_terminal() || self.now() >= deadline {
                return Some(view);
            }
            // Step event by event so the answer goes out the moment the run changes.
            loop {
                if !self.step(deadline) {
                    self.clock.set(deadline.max(self.now()));
                    break;
                }
                if (&mut changed).now_or_never().is_some() {
                    break;
                }
            }
        }
    }

    /// The relay's timer, while the desktop runs.
    fn relay_timeout(&self) -> Option<Timestamp> {
        self.relay.poll_timeout().filter(|_| self.desktop_up)
    }

    fn next_due(&self) -> Option<Timestamp> {
        let relay = self.relay_timeout();
        let heap = self.heap.peek().map(|Reverse(s)| s.at);
        match (relay, heap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn dispatch(&mut self, event: Event) {
        let now = self.now();
        match event {
            Event::Arrive(epoch, request) => self.serve(epoch, request),
            Event::Maintain => {
                // What `serve` does about once a second: progress, leases, pruning.
                let _ = block_on(self.queue.maintain());
                if let Some(every) = self.config.maintain {
                    self.schedule(now.plus(every), Event::Maintain);
                }
            }
            Event::DesktopStarts => self.start_desktop(),
            Event::Answer(epoch, _) if epoch != self.epoch || !self.desktop_up => {}
            Event::Answer(_, answer) => self.hear(answer, now),
            Event::ExecutionDone {
                command,
                generation,
                status,
            } => self.execution_done(command, generation, status, now),
            Event::Progress {
                command,
                execution,
                generation,
                n,
                ends_at,
            } => self.report_progress(command, execution, generation, n, ends_at, now),
            Event::HoldExpired { generation } => {
                let Some(index) = self.held.iter().position(|h| h.generation == generation) else {
                    return;
                };
                let held = self.held.remove(index);
                self.answer_held(held);
            }
        }
    }

    /// Status of a command straight from the queue (as its agent sees it).
    pub fn status(&self, id: &CommandId) -> Option<CommandStatus> {
        self.command(&self.agent, id).map(|c| c.status)
    }
}
