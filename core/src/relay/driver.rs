//! The relay driver: performs a [`Relay`]'s actions with a
//! [`RelayTransport`], an [`Outbox`], an [`Executor`] and an [`Approver`],
//! and feeds each outcome back. Runtime-free: it needs no async runtime of
//! its own, only a [`Clock`] and a [`Sleeper`] (a virtual clock drives it
//! too), and it runs every request, execution and question as a future of
//! its own task, so it spawns nothing.
//!
//! It contains no relay logic: when to pass, sync, claim, poll, cancel, back
//! off, post or stop is decided by the state machine. Shutdown too: when the
//! `shutdown` future resolves the driver calls [`Relay::handle_shutdown`]
//! and keeps performing actions until [`Relay::is_stopped`].
//!
//! Progress: each execution gets a [`ProgressSink`] that keeps only the
//! latest report and wakes the driver once per report it did not take yet,
//! so a Graph reporting a thousand times a second costs the driver a
//! bounded queue; the state machine decides when one is posted.
//!
//! Transports: transport-http supplies the HTTP one; [`QueueTransport`](super::in_process::QueueTransport)
//! (in [`super::in_process`]) calls a [`Queue`](crate::queue::Queue) in the
//! same process, long-poll holds included.
//!
//! ```
//! use std::sync::Arc;
//! use graph_relay_core::relay::driver::{RelayDriver, RelayTransport};
//! use graph_relay_core::relay::{Relay, RelayConfig, SharedSet};
//! # use graph_relay_core::time::Clock;
//! # use graph_relay_core::time::{SystemClock, ThreadSleeper};
//! # use graph_relay_core::relay::executor::{Executor, NoApprover};
//! # use graph_relay_core::outbox::Outbox;
//! # fn demo(transport: Arc<dyn RelayTransport>, outbox: Arc<dyn Outbox>,
//! #         executor: Arc<dyn Executor>) {
//! let clock = Arc::new(SystemClock);
//! let relay = Relay::new(RelayConfig::default(), SharedSet::new(), clock.now());
//! let driver = RelayDriver::new(relay, transport, outbox, executor, clock, Arc::new(ThreadSleeper));
//! // `run` returns once the shutdown future resolved and the relay stopped.
//! let stopped = driver.run(async { /* e.g. Ctrl-C */ }, |event| println!("{event:?}"));
//! futures::executor::block_on(stopped);
//! # }
//! ```

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use async_trait::async_trait;
use futures::channel::{mpsc, oneshot};
use futures::future::{AbortHandle, BoxFuture, FutureExt, abortable};
use futures::stream::{FuturesUnordered, StreamExt};

use super::{
    Action, ApprovalDecision, ClaimOutcome, ExecutionOutcome, Job, PostOutcome, Refusal, Relay,
    RelayCommand, RelayEvent, SharedSet, SyncFailure,
};
use crate::ids::{CommandId, ExecutionId};
use crate::outbox::{Outbox, OutboxError, OutboxItem};
use crate::queue::{ControlAnswer, SyncRequest};
use crate::relay::executor::{
    Approver, CancelHandle, Executor, NoApprover, ProgressReport, ProgressSink, cancel_pair,
};
use crate::time::{Clock, Sleeper, Timestamp};

/// The relay's side of the relay API, one call per request kind.
#[async_trait]
pub trait RelayTransport: Send + Sync {
    /// Sync one project (held by the server when `request.long_poll`).
    async fn sync(&self, request: &SyncRequest) -> Result<Vec<RelayCommand>, SyncFailure>;
    /// Claim a command under `execution`.
    async fn claim(&self, command: &CommandId, execution: &ExecutionId) -> ClaimOutcome;
    /// Ask whether the agent cancelled and whether the command still runs
    /// (held by the server when `long_poll`); `Err` says why there is no
    /// answer (the relay asks again at its control interval either way).
    async fn control(&self, command: &CommandId, long_poll: bool)
    -> Result<ControlAnswer, Refusal>;
    /// Post a completion or a decline.
    async fn post_report(&self, item: &OutboxItem) -> PostOutcome;
    /// Post the latest progress of a running execution.
    async fn post_progress(
        &self,
        command: &CommandId,
        execution: &ExecutionId,
        report: &ProgressReport,
    ) -> PostOutcome;
}

/// A line worth showing, from the state machine or from the driver itself.
#[derive(Debug, Clone, PartialEq)]
pub enum DriverEvent {
    /// A status line of the relay (shutdown included:
    /// [`RelayEvent::Stopping`], [`RelayEvent::Stopped`]).
    Relay(RelayEvent),
    /// The outbox could not be read or written (the run goes on).
    OutboxError(String),
}

/// An outcome coming back to the driver loop.
enum Input {
    Synced(Result<Vec<RelayCommand>, SyncFailure>),
    Claimed(CommandId, ClaimOutcome),
    Controlled(CommandId, Result<ControlAnswer, Refusal>),
    Posted(CommandId, PostOutcome),
    Executed(CommandId, ExecutionOutcome),
    /// The running execution put a report in its progress slot.
    Progress(CommandId, ExecutionId),
    ProgressPosted(CommandId, PostOutcome),
    Approval(CommandId, ApprovalDecision),
    /// The owner cancelled the run on the desktop; the sender learns
    /// whether that changed anything.
    LocalCancel(CommandId, oneshot::Sender<bool>),
    /// The owner changed what is shared.
    Shared(SharedSet),
}

/// Cancels the current run on the desktop from outside the driver (a
/// worker's console): the state machine decides, through
/// [`Relay::handle_local_cancel`], and the run ends `cancelled`.
#[derive(Debug, Clone)]
pub struct LocalCanceller {
    tx: mpsc::UnboundedSender<Input>,
}

impl LocalCanceller {
    /// Asks the driver to cancel `command`. `true` when the run is now
    /// being cancelled; `false` when `command` is not the current run, is
    /// already being stopped or reported, or the driver has ended.
    pub async fn cancel(&self, command: CommandId) -> bool {
        let (reply, answer) = oneshot::channel();
        if self
            .tx
            .unbounded_send(Input::LocalCancel(command, reply))
            .is_err()
        {
            return false;
        }
        answer.await.unwrap_or(false)
    }
}

/// Hands a new [`SharedSet`] to a running driver (the owner edited what is
/// shared); the state machine re-checks with it at once.
#[derive(Debug, Clone)]
pub struct SharedSetSender {
    tx: mpsc::UnboundedSender<Input>,
}

impl SharedSetSender {
    /// Sends `shared`; `false` once the driver has ended.
    pub fn send(&self, shared: SharedSet) -> bool {
        self.tx.unbounded_send(Input::Shared(shared)).is_ok()
    }
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Input")
    }
}

/// The latest progress report of one execution that the driver has not
/// taken yet.
type ProgressSlot = Arc<Mutex<Option<ProgressReport>>>;

/// Runs a [`Relay`] over real IO. See the module docs.
pub struct RelayDriver {
    relay: Relay,
    transport: Arc<dyn RelayTransport>,
    outbox: Arc<dyn Outbox>,
    executor: Arc<dyn Executor>,
    approver: Arc<dyn Approver>,
    clock: Arc<dyn Clock>,
    sleeper: Arc<dyn Sleeper>,
    tx: mpsc::UnboundedSender<Input>,
    rx: mpsc::UnboundedReceiver<Input>,
    /// Every request, execution and question in flight.
    tasks: FuturesUnordered<BoxFuture<'static, Option<Input>>>,
    sync_task: Option<AbortHandle>,
    running: Option<(CommandId, CancelHandle)>,
    /// The question of the run waiting for approval.
    asking: Option<(CommandId, AbortHandle)>,
    progress: Option<(CommandId, ProgressSlot)>,
}

impl std::fmt::Debug for RelayDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayDriver")
            .field("relay", &self.relay)
            .field("in_flight", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl RelayDriver {
    /// A driver for `relay`; it sleeps on `sleeper` until the relay's next
    /// timer, read on `clock`.
    pub fn new(
        relay: Relay,
        transport: Arc<dyn RelayTransport>,
        outbox: Arc<dyn Outbox>,
        executor: Arc<dyn Executor>,
        clock: Arc<dyn Clock>,
        sleeper: Arc<dyn Sleeper>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded();
        Self {
            relay,
            transport,
            outbox,
            executor,
            approver: Arc::new(NoApprover),
            clock,
            sleeper,
            tx,
            rx,
            tasks: FuturesUnordered::new(),
            sync_task: None,
            running: None,
            asking: None,
            progress: None,
        }
    }

    /// A desktop in the same process as `queue`: a long-poll relay for
    /// `device` sharing `shared`, with the queue's cadence
    /// ([`RelayConfig::matching`](super::RelayConfig::matching)) and clock,
    /// over a [`QueueTransport`](super::in_process::QueueTransport);
    /// held requests and timers sleep on `sleeper`.
    pub fn in_process(
        queue: Arc<crate::queue::Queue>,
        device: crate::principal::Device,
        shared: SharedSet,
        outbox: Arc<dyn Outbox>,
        executor: Arc<dyn Executor>,
        sleeper: Arc<dyn Sleeper>,
    ) -> Self {
        let clock = queue.clock().clone();
        let config = super::RelayConfig::matching(queue.config(), super::RelayMode::LongPoll);
        let relay = Relay::new(config, shared, clock.now());
        let transport = super::in_process::QueueTransport::new(queue, device, sleeper.clone());
        Self::new(relay, Arc::new(transport), outbox, executor, clock, sleeper)
    }

    /// A handle that cancels runs on the desktop (see [`LocalCanceller`]);
    /// it works while [`RelayDriver::run`] runs.
    pub fn local_canceller(&self) -> LocalCanceller {
        LocalCanceller {
            tx: self.tx.clone(),
        }
    }

    /// A handle that changes what is shared while [`RelayDriver::run`] runs.
    pub fn shared_set_sender(&self) -> SharedSetSender {
        SharedSetSender {
            tx: self.tx.clone(),
        }
    }

    /// Asks `approver` about the runs of Graphs that need the owner's
    /// approval (without one, such runs wait until their wait ends).
    #[must_use]
    pub fn with_approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = approver;
        self
    }

    /// Runs the relay until `shutdown` resolves and the relay then stopped
    /// ([`Relay::handle_shutdown`] says what stopping does), passing every
    /// status line to `on_event`. Whatever is still in flight when it
    /// returns (a held control request, an execution given up after the
    /// shutdown timeout) is dropped.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()>,
        mut on_event: impl FnMut(DriverEvent),
    ) {
        let mut shutdown = std::pin::pin!(shutdown.fuse());
        let mut shutdown_seen = false;
        // The projects an earlier run synced and did not empty yet.
        match self.outbox.synced_projects().await {
            Ok(projects) => self.relay.remember_synced(projects),
            Err(e) => on_event(DriverEvent::OutboxError(e.to_string())),
        }
        enum Next {
            Shutdown,
            Input(Input),
            Timeout,
        }
        loop {
            self.perform(&mut on_event).await;
            while let Some(event) = self.relay.poll_event() {
                on_event(DriverEvent::Relay(event));
            }
            if self.relay.is_stopped() {
                return;
            }
            let mut sleep = match self.relay.poll_timeout() {
                Some(t) => self.sleeper.sleep(t.since(self.clock.now())),
                None => futures::future::pending().boxed(),
            };
            let (tasks, rx) = (&mut self.tasks, &mut self.rx);
            let next = std::future::poll_fn(|cx| {
                if !shutdown_seen && shutdown.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Next::Shutdown);
                }
                while let Poll::Ready(Some(done)) = tasks.poll_next_unpin(cx) {
                    if let Some(input) = done {
                        return Poll::Ready(Next::Input(input));
                    }
                }
                if let Poll::Ready(Some(input)) = rx.poll_next_unpin(cx) {
                    return Poll::Ready(Next::Input(input));
                }
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Next::Timeout);
                }
                Poll::Pending
            })
            .await;
            let now = self.clock.now();
            match next {
                Next::Shutdown => {
                    shutdown_seen = true;
                    self.relay.handle_shutdown(now);
                }
                Next::Input(input) => self.dispatch(input),
                Next::Timeout => self.relay.handle_timeout(now),
            }
        }
    }

    fn dispatch(&mut self, input: Input) {
        let now = self.clock.now();
        match input {
            Input::Synced(result) => {
                self.sync_task = None;
                self.relay.handle_sync_response(result, now);
            }
            Input::Claimed(command, outcome) => {
                self.relay.handle_claim_response(command, outcome, now)
            }
            Input::Controlled(command, result) => {
                self.relay.handle_control_response(command, result, now);
            }
            Input::Posted(command, outcome) => {
                self.relay.handle_report_posted(command, outcome, now);
            }
            Input::Executed(command, outcome) => {
                if self.running.as_ref().is_some_and(|(c, _)| *c == command) {
                    self.running = None;
                }
                if self.progress.as_ref().is_some_and(|(c, _)| *c == command) {
                    self.progress = None;
                }
                self.relay.handle_execution_finished(command, outcome, now);
            }
            Input::Progress(command, execution) => {
                let report = self
                    .progress
                    .as_ref()
                    .filter(|(c, _)| *c == command)
                    .and_then(|(_, slot)| slot.lock().unwrap_or_else(|p| p.into_inner()).take());
                // An invalid report changes nothing (the state machine
                // refuses it); the executor's sink already bounds reports.
                if let Some(report) = report {
                    let _ = self.relay.handle_progress(command, &execution, report, now);
                }
            }
            Input::ProgressPosted(command, outcome) => {
                self.relay.handle_progress_posted(command, outcome, now)
            }
            Input::Approval(command, decision) => {
                if self.asking.as_ref().is_some_and(|(c, _)| *c == command) {
                    self.asking = None;
                }
                self.relay.handle_approval(command, decision, now);
            }
            Input::LocalCancel(command, reply) => {
                let _ = reply.send(self.relay.handle_local_cancel(command, now));
            }
            Input::Shared(set) => self.relay.handle_shared_set(set, now),
        }
    }

    /// A sink for the execution of `command` under `execution`: it keeps the
    /// latest report in a slot and wakes the driver only when the slot was
    /// empty, so however fast an execution reports, at most one wake-up per
    /// report taken is queued.
    fn progress_sink(&mut self, command: CommandId, execution: ExecutionId) -> ProgressSink {
        let slot: ProgressSlot = Arc::default();
        self.progress = Some((command, slot.clone()));
        let tx = self.tx.clone();
        ProgressSink::new(move |report| {
            let was_empty = slot
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .replace(report)
                .is_none();
            if was_empty {
                let _ = tx.unbounded_send(Input::Progress(command, execution.clone()));
            }
        })
    }

    /// Runs `future` alongside the loop; its output comes back as an input.
    fn start<F>(&mut self, future: F) -> AbortHandle
    where
        F: Future<Output = Input> + Send + 'static,
    {
        let (future, handle) = abortable(future);
        self.tasks.push(future.map(Result::ok).boxed());
        handle
    }

    /// Performs every pending action. Outbox reads and writes are awaited
    /// here, in order, since the state machine's next step depends on them;
    /// requests, executions and approval prompts run alongside the loop and
    /// come back as inputs.
    async fn perform(&mut self, on_event: &mut impl FnMut(DriverEvent)) {
        while let Some(action) = self.relay.poll_action() {
            let now = self.clock.now();
            match action {
                Action::LoadOutbox => {
                    let items = self.outbox.pending().await.unwrap_or_else(|e| {
                        on_event(DriverEvent::OutboxError(e.to_string()));
                        Vec::new()
                    });
                    self.relay.handle_outbox_loaded(items, now);
                }
                Action::RememberProject(project) => {
                    outbox_written(self.outbox.remember_project(&project).await, on_event);
                }
                Action::ForgetProject(project) => {
                    outbox_written(self.outbox.forget_project(&project).await, on_event);
                }
                Action::StoreReport(item) => {
                    outbox_written(self.outbox.put(&item).await, on_event);
                    self.relay.handle_report_stored(item.command, now);
                }
                Action::RemoveReport(command) => {
                    outbox_written(self.outbox.remove(&command).await, on_event);
                }
                Action::RecordAttempt(command) => {
                    outbox_written(self.outbox.record_attempt(&command).await, on_event);
                }
                Action::Sync(request) => self.send_sync(request),
                Action::AbortHeldSync => self.abort_held_sync(now),
                Action::Claim { command, execution } => self.send_claim(command, execution),
                Action::Execute(job) => self.execute(job),
                Action::AskApproval { job, until } => self.ask_approval(job, until),
                Action::WithdrawApproval { command } => self.withdraw_approval(command),
                Action::PostProgress {
                    command,
                    execution,
                    report,
                } => self.send_progress(command, execution, report),
                Action::Control { command, long_poll } => self.send_control(command, long_poll),
                Action::CancelExecution { command } => self.cancel_execution(command),
                Action::PostReport(item) => self.send_report(item),
            }
        }
    }

    /// Sends a sync; it is kept aside so that [`Action::AbortHeldSync`] can
    /// drop it while the server holds it.
    fn send_sync(&mut self, request: SyncRequest) {
        let transport = self.transport.clone();
        let task = self.start(async move { Input::Synced(transport.sync(&request).await) });
        self.sync_task = Some(task);
    }

    /// Drops the sync the server holds and tells the state machine so.
    fn abort_held_sync(&mut self, now: Timestamp) {
        if let Some(task) = self.sync_task.take() {
            task.abort();
        }
        self.relay
            .handle_sync_response(Err(SyncFailure::Aborted), now);
    }

    fn send_claim(&mut self, command: CommandId, execution: ExecutionId) {
        let transport = self.transport.clone();
        self.start(
            async move { Input::Claimed(command, transport.claim(&command, &execution).await) },
        );
    }

    /// Starts the executor on `job`, keeping the handle that cancels it and
    /// the slot its progress reports land in.
    fn execute(&mut self, job: Job) {
        let command = job.command.id;
        let (handle, signal) = cancel_pair();
        self.running = Some((command, handle));
        let progress = self.progress_sink(command, job.execution.clone());
        let executor = self.executor.clone();
        self.start(async move {
            Input::Executed(command, executor.execute(job, signal, progress).await)
        });
    }

    /// Asks the owner to approve `job`; a prompt still open for an earlier
    /// command is withdrawn, since only one is asked at a time.
    fn ask_approval(&mut self, job: Job, until: Timestamp) {
        let command = job.command.id;
        let approver = self.approver.clone();
        let task =
            self.start(async move { Input::Approval(command, approver.ask(job, until).await) });
        if let Some((_, earlier)) = self.asking.replace((command, task)) {
            earlier.abort();
        }
    }

    /// Withdraws the approval prompt for `command`, if that is the one open.
    fn withdraw_approval(&mut self, command: CommandId) {
        if let Some((asked, task)) = self.asking.take() {
            if asked == command {
                task.abort();
            } else {
                self.asking = Some((asked, task));
            }
        }
    }

    fn send_progress(
        &mut self,
        command: CommandId,
        execution: ExecutionId,
        report: ProgressReport,
    ) {
        let transport = self.transport.clone();
        self.start(async move {
            let outcome = transport.post_progress(&command, &execution, &report).await;
            Input::ProgressPosted(command, outcome)
        });
    }

    fn send_control(&mut self, command: CommandId, long_poll: bool) {
        let transport = self.transport.clone();
        self.start(async move {
            Input::Controlled(command, transport.control(&command, long_poll).await)
        });
    }

    /// Asks the execution of `command` to stop, if it is the one running.
    fn cancel_execution(&mut self, command: CommandId) {
        if let Some((running, handle)) = self.running.as_mut()
            && *running == command
        {
            handle.cancel();
        }
    }

    fn send_report(&mut self, item: OutboxItem) {
        let transport = self.transport.clone();
        self.start(async move { Input::Posted(item.command, transport.post_report(&item).await) });
    }
}

/// A failed outbox write is shown as [`DriverEvent::OutboxError`]; the run
/// goes on.
fn outbox_written(result: Result<(), OutboxError>, on_event: &mut impl FnMut(DriverEvent)) {
    if let Err(e) = result {
        on_event(DriverEvent::OutboxError(e.to_string()));
    }
}
