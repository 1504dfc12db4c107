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

/// A request on its way to the server.
#[derive(Debug)]
enum Request {
    Sync(SyncRequest),
    Claim {
        command: CommandId,
        execution: graph_relay_core::ids::ExecutionId,
    },
    Control {
        command: CommandId,
        long_poll: bool,
    },
    Post(OutboxItem),
    Progress {
        command: CommandId,
        execution: graph_relay_core::ids::ExecutionId,
        report: ProgressReport,
    },
}

/// An answer on its way to the relay.
#[derive(Debug)]
enum Answer {
    Sync(Result<Vec<RelayCommand>, SyncFailure>),
    Claim(CommandId, ClaimOutcome),
    Control(CommandId, Result<ControlAnswer, Refusal>),
    Posted(CommandId, PostOutcome),
    ProgressPosted(CommandId, PostOutcome),
}

/// Requests and answers carry the epoch of the desktop process that sent
/// them: an answer for a process that died is lost with it.
#[derive(Debug)]
enum Event {
    Arrive(u64, Request),
    Answer(u64, Answer),
    /// The server's periodic housekeeping ([`Queue::maintain`]).
    Maintain,
    /// The desktop (a new relay process) starts.
    DesktopStarts,
    ExecutionDone {
        command: CommandId,
        generation: u64,
        status: FinishStatus,
    },
    HoldExpired {
        generation: u64,
    },
    /// The synthetic Graph of execution `generation` reports its `n`th progress.
    Progress {
        command: CommandId,
        execution: graph_relay_core::ids::ExecutionId,
        generation: u64,
        n: u64,
        ends_at: Timestamp,
    },
}

struct Scheduled {
    at: Timestamp,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// A long-poll request the server is holding (for the desktop process of
/// `epoch`), under the queue's own [`Hold`] rule: subscribed to its topics
/// before the look that found nothing, answered with the next look when a
/// topic fires (both relay holds answer on notify) or at the hold's `until`.
/// The simulated clock stands in for the hold's timer; the periodic re-look
/// for writes of other processes has nothing to find in one process.
struct Held {
    epoch: u64,
    kind: HeldKind,
    subscriptions: Vec<Subscription>,
    generation: u64,
}

/// What the held request will look at when it answers.
enum HeldKind {
    Sync(ProjectId),
    Control(CommandId),
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

    fn perform_actions(&mut self) {
        if !self.desktop_up {
            return;
        }
        while let Some(action) = self.relay.poll_action() {
            let now = self.now();
            match action {
                Action::LoadOutbox => {
                    let items = match &self.outbox {
                        Some(o) => block_on(o.pending()).unwrap_or_default(),
                        None => Vec::new(),
                    };
                    self.relay.handle_outbox_loaded(items, now);
                }
                Action::Sync(request) => self.send(Request::Sync(request)),
                Action::RememberProject(project) => {
                    if let Some(o) = &self.outbox {
                        let _ = block_on(o.remember_project(&project));
                    }
                }
                Action::ForgetProject(project) => {
                    if let Some(o) = &self.outbox {
                        let _ = block_on(o.forget_project(&project));
                    }
                }
                Action::AbortHeldSync => {
                    self.held.retain(|h| !matches!(h.kind, HeldKind::Sync(_)));
                    self.relay
                        .handle_sync_response(Err(SyncFailure::Aborted), now);
                }
                Action::Claim { command, execution } => {
                    self.send(Request::Claim { command, execution });
                }
                Action::Execute(job) => self.execute(job),
                Action::Control { command, long_poll } => {
                    self.send(Request::Control { command, long_poll });
                }
                Action::CancelExecution { command } => self.cancel_execution(command, now),
                // The simulated desktop shares no Graph that needs approval.
                Action::AskApproval { .. } | Action::WithdrawApproval { .. } => {}
                Action::PostProgress {
                    command,
                    execution,
                    report,
                } => self.send(Request::Progress {
                    command,
                    execution,
                    report,
                }),
                Action::StoreReport(item) => {
                    if let Some(o) = &self.outbox {
                        let _ = block_on(o.put(&item));
                    }
                    self.relay.handle_report_stored(item.command, now);
                }
                Action::PostReport(item) => self.post_report(item, now),
                Action::RemoveReport(command) => {
                    if let Some(o) = &self.outbox {
                        let _ = block_on(o.remove(&command));
                    }
                }
                Action::RecordAttempt(command) => {
                    if let Some(o) = &self.outbox {
                        let _ = block_on(o.record_attempt(&command));
                    }
                }
            }
        }
    }

    /// A request from the desktop reaches the server one latency later.
    fn send(&mut self, request: Request) {
        let at = self.after_latency();
        self.schedule(at, Event::Arrive(self.epoch, request));
    }

    /// Posts a report, unless the experiment loses this completion on the
    /// way: then the desktop hears, after a round trip, that it should retry.
    fn post_report(&mut self, item: OutboxItem, now: Timestamp) {
        if self.lose_posts > 0 && matches!(item.report, RelayReport::Completion { .. }) {
            self.lose_posts -= 1;
            let at = now.plus(self.config.latency * 2);
            self.schedule(
                at,
                Event::Answer(
                    self.epoch,
                    Answer::Posted(item.command, PostOutcome::Retry("lost".into())),
                ),
            );
        } else {
            self.send(Request::Post(item));
        }
    }

    /// The engine stops the execution of `command` at once, if it runs.
    fn cancel_execution(&mut self, command: CommandId, now: Timestamp) {
        if let Some((running, generation)) = self.running
            && running == command
        {
            self.schedule(
                now,
                Event::ExecutionDone {
                    command,
                    generation,
                    status: FinishStatus::Cancelled,
                },
            );
        }
    }

    fn execute(&mut self, job: Job) {
        let now = self.now();
        self.exec_generation += 1;
        let generation = self.exec_generation;
        let rt = self.config.run_time;
        let secs = self.rng.lognormal(rt.median_secs, rt.sigma, rt.min_secs);
        let command = job.command.id;
        self.running = Some((command, generation));
        self.executions.push(ExecutionRecord {
            command,
            started: now,
            ended: None,
            status: None,
        });
        let at = now.plus(Duration::from_secs_f64(secs));
        self.schedule(
            at,
            Event::ExecutionDone {
                command,
                generation,
                status: FinishStatus::Completed,
            },
        );
        if let Some(every) = self.config.progress_every {
            self.schedule(
                now.plus(every),
                Event::Progress {
                    command,
                    execution: job.execution,
                    generation,
                    n: 1,
                    ends_at: at,
                },
            );
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

    /// The server's answer reaches the running desktop's relay.
    fn hear(&mut self, answer: Answer, now: Timestamp) {
        match answer {
            Answer::Sync(result) => self.relay.handle_sync_response(result, now),
            Answer::Claim(command, outcome) => {
                self.relay.handle_claim_response(command, outcome, now)
            }
            Answer::Control(command, result) => {
                self.relay.handle_control_response(command, result, now)
            }
            Answer::Posted(command, outcome) => {
                self.relay.handle_report_posted(command, outcome, now)
            }
            Answer::ProgressPosted(command, outcome) => {
                self.relay.handle_progress_posted(command, outcome, now)
            }
        }
    }

    /// The execution `generation` of `command` ended with `status`: it is
    /// recorded and the relay told, unless a later execution replaced it.
    fn execution_done(
        &mut self,
        command: CommandId,
        generation: u64,
        status: FinishStatus,
        now: Timestamp,
    ) {
        if self.running != Some((command, generation)) {
            return;
        }
        self.running = None;
        if let Some(record) = self
            .executions
            .iter_mut()
            .rev()
            .find(|e| e.command == command)
        {
            record.ended = Some(now);
            record.status = Some(status);
        }
        let outcome = ExecutionOutcome {
            status: Some(status),
            result: json!({"text": "synthetic result"}),
            total_tokens: Some(1000),
            reported_cost: None,
            error: None,
        };
        self.relay.handle_execution_finished(command, outcome, now);
    }

    /// The running execution reports its `n`th step (how far it is, by the
    /// time it will take) and schedules the next one.
    fn report_progress(
        &mut self,
        command: CommandId,
        execution: ExecutionId,
        generation: u64,
        n: u64,
        ends_at: Timestamp,
        now: Timestamp,
    ) {
        if self.running != Some((command, generation)) || !self.desktop_up {
            return;
        }
        let (Some(every), Some(started)) = (
            self.config.progress_every,
            self.executions.last().map(|e| e.started),
        ) else {
            return;
        };
        let total = ends_at.since(started).as_secs_f64().max(0.001);
        let done = now.since(started).as_secs_f64();
        let report = ProgressReport {
            message: Some(format!("step {n}")),
            percent: Some((done / total * 100.0).clamp(0.0, 100.0).floor()),
        };
        let _ = self.relay.handle_progress(command, &execution, report, now);
        self.schedule(
            now.plus(every),
            Event::Progress {
                command,
                execution,
                generation,
                n: n + 1,
                ends_at,
            },
        );
    }

    /// The server side of each relay request: the real queue.
    fn serve(&mut self, epoch: u64, request: Request) {
        let reply_at = self.after_latency();
        let device = self.device.clone();
        match request {
            Request::Sync(request) => {
                // A long poll subscribes before the look, as the queue's hold
                // does; a request that is never held needs no subscription.
                let held = request.long_poll.then(|| {
                    let hold = self.queue.sync_hold(&device);
                    let subscriptions = self.subscribe(&hold);
                    (hold, subscriptions)
                });
                let answer = match (block_on(self.queue.sync(&device, &request)), held) {
                    (Ok(response), Some((hold, subscriptions))) if response.commands.is_empty() => {
                        self.hold(epoch, HeldKind::Sync(request.project), subscriptions, &hold);
                        return;
                    }
                    (Ok(response), _) => {
                        Ok(response.commands.iter().map(RelayCommand::from).collect())
                    }
                    (Err(e), _) => Err(Refusal::new(Some(e.is_retryable()), e.to_string()).into()),
                };
                self.schedule(reply_at, Event::Answer(epoch, Answer::Sync(answer)));
            }
            Request::Claim { command, execution } => {
                let outcome = block_on(self.desk(&device).claim(&command, &execution));
                self.schedule(
                    reply_at,
                    Event::Answer(epoch, Answer::Claim(command, outcome)),
                );
            }
            Request::Control { command, long_poll } => {
                // A long poll subscribes before the look, as the queue's hold
                // does; how long it holds follows the lease the look reports.
                let subscriptions = long_poll.then(|| {
                    let lease = self.queue.config().lease_long_poll;
                    self.subscribe(&self.queue.control_hold(&command, lease))
                });
                let answer = match (
                    block_on(self.queue.control_renewing(&device, &command)),
                    subscriptions,
                ) {
                    (Ok((a, lease)), Some(subscriptions)) if !a.is_settled() => {
                        let hold = self.queue.control_hold(&command, lease);
                        self.hold(epoch, HeldKind::Control(command), subscriptions, &hold);
                        return;
                    }
                    (Ok((a, _)), _) => Ok(a),
                    (Err(e), _) => Err(Refusal::new(Some(e.is_retryable()), e.to_string())),
                };
                self.schedule(
                    reply_at,
                    Event::Answer(epoch, Answer::Control(command, answer)),
                );
            }
            Request::Progress {
                command,
                execution,
                report,
            } => {
                let outcome = block_on(
                    self.desk(&device)
                        .post_progress(&command, &execution, &report),
                );
                self.schedule(
                    reply_at,
                    Event::Answer(epoch, Answer::ProgressPosted(command, outcome)),
                );
            }
            Request::Post(item) => {
                let outcome = block_on(self.desk(&device).post_report(&item));
                self.schedule(
                    reply_at,
                    Event::Answer(epoch, Answer::Posted(item.command, outcome)),
                );
            }
        }
    }

    /// The in-process relay transport over the real queue: the simulated
    /// server answers claims, reports and progress exactly as an embedded
    /// desktop is answered (its held requests are scheduled here instead).
    fn desk(&self, device: &Device) -> QueueTransport {
        let sleeper = Arc::new(graph_relay_core::time::ThreadSleeper);
        QueueTransport::new(Arc::new(self.queue.clone()), device.clone(), sleeper)
    }

    /// Subscriptions to every topic of `hold`.
    fn subscribe(&self, hold: &Hold) -> Vec<Subscription> {
        let signals = self.queue.signals();
        hold.topics
            .iter()
            .map(|t| signals.subscribe(t.clone()))
            .collect()
    }

    /// Parks a request under `hold` until a topic fires or `hold.until`.
    fn hold(&mut self, epoch: u64, kind: HeldKind, subscriptions: Vec<Subscription>, hold: &Hold) {
        debug_assert!(hold.answer_on_notify, "relay holds answer on notify");
        self.hold_generation += 1;
        let generation = self.hold_generation;
        self.held.push(Held {
            epoch,
            kind,
            subscriptions,
            generation,
        });
        self.schedule(hold.until, Event::HoldExpired { generation });
    }

    /// Answers held requests whose topic was notified.
    fn wake_held(&mut self) {
        let mut index = 0;
        while index < self.held.len() {
            let notified = self.held[index]
                .subscriptions
                .iter_mut()
                .any(|s| s.now_or_never().is_some());
            if notified {
                let held = self.held.remove(index);
                self.answer_held(held);
            } else {
                index += 1;
            }
        }
    }

    fn answer_held(&mut self, held: Held) {
        let reply_at = self.after_latency();
        let device = self.device.clone();
        let epoch = held.epoch;
        match held.kind {
            HeldKind::Sync(project) => {
                let answer = block_on(self.queue.queued_for(&device, &project))
                    .map(|cs| cs.iter().map(RelayCommand::from).collect())
                    .map_err(|e| SyncFailure::Network(e.to_string()));
                self.schedule(reply_at, Event::Answer(epoch, Answer::Sync(answer)));
            }
            HeldKind::Control(command) => {
                // As the HTTP server does: the held request renewed the lease
                // when it arrived; its answer only looks.
                let answer = block_on(self.queue.peek_control(&device, &command))
                    .map_err(|e| Refusal::new(Some(e.is_retryable()), e.to_string()));
                self.schedule(
                    reply_at,
                    Event::Answer(epoch, Answer::Control(command, answer)),
                );
            }
        }
    }

    /// Status of a command straight from the queue (as its agent sees it).
    pub fn status(&self, id: &CommandId) -> Option<CommandStatus> {
        self.command(&self.agent, id).map(|c| c.status)
    }
}
