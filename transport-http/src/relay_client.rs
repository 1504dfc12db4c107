//! The desktop relay's HTTP client and the driver of `core::relay`.
//!
//! [`HttpRelayTransport`] speaks the relay API (reqwest over rustls) and maps
//! every answer onto the inputs of the state machine: a 2xx is success;
//! anything else becomes a [`Refusal`] carrying the server's `retryable` flag
//! ([`ErrorReply`]), and the core's one mapping decides: `retryable: false`
//! is final ([`PostOutcome::Rejected`], [`ClaimOutcome::Refused`],
//! [`SyncFailure::Refused`]); a retryable refusal, an answer without the flag
//! (e.g. a 401 of the authentication layer, a proxy's 502) and no answer at
//! all are retried later. The status code alone never decides.
//!
//! [`RelayDriver`] performs the [`Action`]s of a [`Relay`] with a
//! [`RelayTransport`], an [`Outbox`] and an [`Executor`], and feeds each
//! outcome back. It contains no relay logic: when to pass, sync, claim, poll,
//! cancel, back off or post is decided by the state machine. It performs
//! actions in the order they come; executions are started only on
//! [`Action::Execute`], which the state machine emits for one command at a time.
//!
//! Progress: each execution gets a [`ProgressSink`] that keeps only the
//! latest report and wakes the driver once per report it did not take yet,
//! so a Graph reporting a thousand times a second costs the driver a
//! bounded queue; the state machine decides when one is posted.
//!
//! The owner may cancel the current run on the desktop through a
//! [`LocalCanceller`] ([`RelayDriver::local_canceller`]); the state machine
//! decides what that means.
//!
//! [`FaultyTransport`] wraps a transport and loses completion POSTs on
//! purpose, for tests of the outbox.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use graph_relay_core::Clock;
use graph_relay_core::command::CommandStatus;
use graph_relay_core::executor::{
    Approver, CancelHandle, Executor, NoApprover, ProgressReport, ProgressSink, cancel_pair,
};
use graph_relay_core::ids::{CommandId, ExecutionId};
use graph_relay_core::outbox::{Outbox, OutboxItem, RelayReport};
use graph_relay_core::queue::{ControlAnswer, SyncRequest};
use graph_relay_core::relay::{
    Action, ApprovalDecision, ClaimOutcome, ExecutionOutcome, PostOutcome, Refusal, Relay,
    RelayCommand, RelayEvent, SharedSet, SyncFailure,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;

use crate::relay_wire::{
    ControlBody, ControlReply, ErrorReply, ProgressBody, StartBody, SyncBody, SyncReply,
    command_path, sync_path,
};

/// The relay's side of the relay API, one call per request kind.
#[async_trait]
pub trait RelayTransport: Send + Sync {
    /// Sync one project (held by the server when `request.long_poll`).
    async fn sync(&self, request: &SyncRequest) -> Result<Vec<RelayCommand>, SyncFailure>;
    /// Claim a command under `execution`.
    async fn claim(&self, command: &CommandId, execution: &ExecutionId) -> ClaimOutcome;
    /// Ask whether the agent cancelled and whether the command still runs
    /// (held by the server when `long_poll`); `Err` says why there is no answer.
    async fn control(&self, command: &CommandId, long_poll: bool) -> Result<ControlAnswer, String>;
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

/// Settings of [`HttpRelayTransport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRelayConfig {
    /// Base URL of the server, e.g. `https://relay.example.com` (no trailing slash needed).
    pub server: String,
    /// The device token.
    pub token: String,
    /// Timeout of an ordinary request (15 s).
    pub request_timeout: Duration,
    /// Timeout of a held request: the server's hold bound plus slack (40 s).
    pub held_timeout: Duration,
    /// Connect timeout (5 s).
    pub connect_timeout: Duration,
}

impl HttpRelayConfig {
    /// Defaults for `server` and `token`.
    pub fn new(server: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            server: server.into().trim_end_matches('/').to_owned(),
            token: token.into(),
            request_timeout: Duration::from_secs(15),
            held_timeout: Duration::from_secs(40),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// Why the HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientBuildError {
    /// The server URL is not `http://` or `https://`.
    #[error("the server URL must start with http:// or https://, got `{0}`")]
    BadUrl(String),
    /// The device token is empty or contains characters a header cannot carry.
    #[error("the device token is empty or not printable ASCII")]
    BadToken,
    /// reqwest refused the configuration.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The relay API over HTTP (reqwest with rustls).
#[derive(Debug, Clone)]
pub struct HttpRelayTransport {
    client: reqwest::Client,
    config: HttpRelayConfig,
}

/// How one request ended: the answer, or why not (with the server's word
/// on retrying, if it gave one).
type Answer<T> = Result<T, Refusal>;

impl HttpRelayTransport {
    /// A client for `config`.
    pub fn new(config: HttpRelayConfig) -> Result<Self, ClientBuildError> {
        if !(config.server.starts_with("http://") || config.server.starts_with("https://")) {
            return Err(ClientBuildError::BadUrl(config.server));
        }
        if config.token.is_empty() || !config.token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ClientBuildError::BadToken);
        }
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .user_agent(concat!("graph-relay/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { client, config })
    }

    async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        held: bool,
    ) -> Answer<T> {
        let timeout = if held {
            self.config.held_timeout
        } else {
            self.config.request_timeout
        };
        let response = self
            .client
            .post(format!("{}{path}", self.config.server))
            .bearer_auth(&self.config.token)
            .timeout(timeout)
            .json(body)
            .send()
            .await;
        let response = match response {
            Ok(r) => r,
            Err(e) => return Err(Refusal::no_answer(format!("network error: {e}"))),
        };
        let status = response.status();
        let bytes = match response.bytes().await {
            Ok(b) => b,
            Err(e) => {
                return Err(Refusal::no_answer(format!(
                    "network error reading the answer: {e}"
                )));
            }
        };
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| Refusal::no_answer(format!("unreadable answer ({status}): {e}")));
        }
        Err(refusal(status, &bytes))
    }
}

/// A non-2xx answer as a [`Refusal`]: the server's [`ErrorReply`] carries its
/// `retryable` flag; any other body (an authentication challenge, a proxy's
/// page) carries none, and is therefore tried again.
fn refusal(status: reqwest::StatusCode, body: &[u8]) -> Refusal {
    match serde_json::from_slice::<ErrorReply>(body) {
        Ok(e) => Refusal::new(
            Some(e.retryable),
            format!("{status} {}: {}", e.error, e.message),
        ),
        Err(_) => Refusal::new(
            None,
            format!("{status}: {}", String::from_utf8_lossy(body).trim()),
        ),
    }
}

#[async_trait]
impl RelayTransport for HttpRelayTransport {
    async fn sync(&self, request: &SyncRequest) -> Result<Vec<RelayCommand>, SyncFailure> {
        let body = SyncBody {
            project_id: request.project.clone(),
            sessions: request.sessions.clone(),
            long_poll: request.long_poll,
            restarted: request.restarted,
            running_command_id: request.running,
        };
        self.post::<_, SyncReply>(&sync_path(), &body, request.long_poll)
            .await
            .map(|reply| {
                reply
                    .commands
                    .into_iter()
                    .map(|c| c.into_relay_command())
                    .collect()
            })
            .map_err(SyncFailure::from)
    }

    async fn claim(&self, command: &CommandId, execution: &ExecutionId) -> ClaimOutcome {
        let body = StartBody {
            execution_id: execution.clone(),
        };
        match self
            .post::<_, serde_json::Value>(&command_path(command, "start"), &body, false)
            .await
        {
            Ok(_) => ClaimOutcome::Granted,
            Err(refusal) => refusal.into(),
        }
    }

    async fn control(&self, command: &CommandId, long_poll: bool) -> Result<ControlAnswer, String> {
        let body = ControlBody { long_poll };
        match self
            .post::<_, ControlReply>(&command_path(command, "control"), &body, long_poll)
            .await
        {
            Ok(reply) => match CommandStatus::parse(&reply.status) {
                Some(status) => Ok(ControlAnswer {
                    cancel_requested: reply.cancel_requested,
                    status,
                }),
                None => Err(format!(
                    "unreadable control answer: unknown status `{}`",
                    reply.status
                )),
            },
            Err(refusal) => Err(refusal.reason),
        }
    }

    async fn post_progress(
        &self,
        command: &CommandId,
        execution: &ExecutionId,
        report: &ProgressReport,
    ) -> PostOutcome {
        let body = ProgressBody {
            execution_id: execution.clone(),
            message: report.message.clone(),
            percent: report.percent,
        };
        match self
            .post::<_, serde_json::Value>(&command_path(command, "progress"), &body, false)
            .await
        {
            Ok(_) => PostOutcome::Acknowledged,
            Err(refusal) => refusal.into(),
        }
    }

    async fn post_report(&self, item: &OutboxItem) -> PostOutcome {
        let answer = match &item.report {
            RelayReport::Completion { envelope } => {
                self.post::<_, serde_json::Value>(
                    &command_path(&item.command, "complete"),
                    envelope,
                    false,
                )
                .await
            }
            RelayReport::Declined => {
                self.post::<_, serde_json::Value>(
                    &command_path(&item.command, "decline"),
                    &serde_json::json!({}),
                    false,
                )
                .await
            }
        };
        match answer {
            Ok(_) => PostOutcome::Acknowledged,
            Err(refusal) => refusal.into(),
        }
    }
}

/// Fault injection for tests: loses completion POSTs.
///
/// `lose_before_send` completions are never sent (as if the connection
/// dropped); `lose_after_send` are sent but their answer is discarded (the
/// server recorded them; the resend is a duplicate and must get a 2xx).
/// Declines and every other request pass through.
#[derive(Debug)]
pub struct FaultyTransport<T> {
    inner: T,
    lose_before_send: AtomicU32,
    lose_after_send: AtomicU32,
}

impl<T> FaultyTransport<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, lose_before_send: u32, lose_after_send: u32) -> Self {
        Self {
            inner,
            lose_before_send: AtomicU32::new(lose_before_send),
            lose_after_send: AtomicU32::new(lose_after_send),
        }
    }
}

fn take_one(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait]
impl<T: RelayTransport> RelayTransport for FaultyTransport<T> {
    async fn sync(&self, request: &SyncRequest) -> Result<Vec<RelayCommand>, SyncFailure> {
        self.inner.sync(request).await
    }

    async fn claim(&self, command: &CommandId, execution: &ExecutionId) -> ClaimOutcome {
        self.inner.claim(command, execution).await
    }

    async fn control(&self, command: &CommandId, long_poll: bool) -> Result<ControlAnswer, String> {
        self.inner.control(command, long_poll).await
    }

    async fn post_progress(
        &self,
        command: &CommandId,
        execution: &ExecutionId,
        report: &ProgressReport,
    ) -> PostOutcome {
        self.inner.post_progress(command, execution, report).await
    }

    async fn post_report(&self, item: &OutboxItem) -> PostOutcome {
        let completion = matches!(item.report, RelayReport::Completion { .. });
        if completion && take_one(&self.lose_before_send) {
            return PostOutcome::Retry(
                "fault injection: completion POST lost before sending".into(),
            );
        }
        let outcome = self.inner.post_report(item).await;
        if completion && take_one(&self.lose_after_send) {
            return PostOutcome::Retry(
                "fault injection: answer to the completion POST lost".into(),
            );
        }
        outcome
    }
}

/// Settings of [`RelayDriver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverOptions {
    /// On shutdown, how long to wait for the cancelled run to end and its
    /// report to be posted before giving up (the outbox keeps it) (30 s).
    pub shutdown_timeout: Duration,
}

impl Default for DriverOptions {
    fn default() -> Self {
        Self {
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// A line worth showing, from the state machine or from the driver itself.
#[derive(Debug, Clone, PartialEq)]
pub enum DriverEvent {
    /// A status line of the relay.
    Relay(RelayEvent),
    /// The outbox could not be read or written (the run goes on).
    OutboxError(String),
    /// Shutdown began; the running command (if any) is being cancelled.
    Stopping {
        /// The command running at that moment.
        running: Option<CommandId>,
    },
    /// The final delivery attempt of the outbox ended.
    Flushed {
        /// Reports delivered (or refused for good and dropped).
        delivered: usize,
        /// Reports still in the outbox.
        kept: usize,
    },
}

/// An outcome coming back to the driver loop.
enum Input {
    Synced(Result<Vec<RelayCommand>, SyncFailure>),
    Claimed(CommandId, ClaimOutcome),
    Controlled(CommandId, Result<ControlAnswer, String>),
    Posted(CommandId, PostOutcome),
    Executed(CommandId, ExecutionOutcome),
    /// The running execution put a report in its progress slot.
    Progress(CommandId, ExecutionId),
    ProgressPosted(CommandId, PostOutcome),
    Approval(CommandId, ApprovalDecision),
    /// The owner cancelled the run on the desktop; the sender learns
    /// whether that changed anything.
    LocalCancel(CommandId, oneshot::Sender<bool>),
}

/// Cancels the current run on the desktop from outside the driver (the
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
        if self.tx.send(Input::LocalCancel(command, reply)).is_err() {
            return false;
        }
        answer.await.unwrap_or(false)
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
    options: DriverOptions,
    tx: mpsc::UnboundedSender<Input>,
    rx: mpsc::UnboundedReceiver<Input>,
    sync_task: Option<AbortHandle>,
    control_task: Option<AbortHandle>,
    running: Option<(CommandId, CancelHandle)>,
    /// The question of the run waiting for approval.
    asking: Option<(CommandId, AbortHandle)>,
    progress: Option<(CommandId, ProgressSlot)>,
    posts_in_flight: usize,
    stopping: bool,
}

impl std::fmt::Debug for RelayDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayDriver")
            .field("relay", &self.relay)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RelayDriver {
    /// A driver for `relay`.
    pub fn new(
        relay: Relay,
        transport: Arc<dyn RelayTransport>,
        outbox: Arc<dyn Outbox>,
        executor: Arc<dyn Executor>,
        clock: Arc<dyn Clock>,
        options: DriverOptions,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            relay,
            transport,
            outbox,
            executor,
            approver: Arc::new(NoApprover),
            clock,
            options,
            tx,
            rx,
            sync_task: None,
            control_task: None,
            running: None,
            asking: None,
            progress: None,
            posts_in_flight: 0,
            stopping: false,
        }
    }

    /// A handle that cancels runs on the desktop (see [`LocalCanceller`]);
    /// it works while [`RelayDriver::run`] runs.
    pub fn local_canceller(&self) -> LocalCanceller {
        LocalCanceller {
            tx: self.tx.clone(),
        }
    }

    /// Asks `approver` about the runs of Graphs that need the owner's
    /// approval (without one, such runs wait until their wait ends).
    pub fn with_approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = approver;
        self
    }

    /// Runs until `shutdown` resolves, feeding every change of `shared` to
    /// the relay and every status line to `on_event`. On shutdown the
    /// running command is cancelled (the executor applies its grace), its
    /// report goes through the outbox, and every pending report gets one
    /// more delivery attempt.
    pub async fn run(
        mut self,
        mut shared: watch::Receiver<SharedSet>,
        shutdown: impl Future<Output = ()>,
        mut on_event: impl FnMut(DriverEvent),
    ) {
        tokio::pin!(shutdown);
        // The projects an earlier run synced and did not empty yet.
        match self.outbox.synced_projects().await {
            Ok(projects) => self.relay.remember_synced(projects),
            Err(e) => on_event(DriverEvent::OutboxError(e.to_string())),
        }
        let mut shared_open = true;
        loop {
            self.perform(&mut on_event).await;
            while let Some(event) = self.relay.poll_event() {
                on_event(DriverEvent::Relay(event));
            }
            let wait = self.relay.poll_timeout().map(|t| t.since(self.clock.now()));
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(input) = self.rx.recv() => self.dispatch(input),
                changed = shared.changed(), if shared_open => match changed {
                    Ok(()) => {
                        let set = shared.borrow_and_update().clone();
                        self.relay.handle_shared_set(set, self.clock.now());
                    }
                    Err(_) => shared_open = false,
                },
                () = sleep_opt(wait) => self.relay.handle_timeout(self.clock.now()),
            }
        }
        self.stop(&mut on_event).await;
    }

    async fn stop(&mut self, on_event: &mut impl FnMut(DriverEvent)) {
        self.stopping = true;
        on_event(DriverEvent::Stopping {
            running: self.relay.running(),
        });
        if let Some(task) = self.sync_task.take() {
            task.abort();
            self.relay
                .handle_sync_response(Err(SyncFailure::Aborted), self.clock.now());
        }
        if let Some(task) = self.control_task.take() {
            task.abort();
        }
        if let Some((_, handle)) = self.running.as_mut() {
            handle.cancel();
        }
        // A run waiting for approval is given up (the prompt is withdrawn).
        self.relay.handle_shutdown(self.clock.now());
        let deadline = tokio::time::Instant::now() + self.options.shutdown_timeout;
        loop {
            self.perform(on_event).await;
            while let Some(event) = self.relay.poll_event() {
                on_event(DriverEvent::Relay(event));
            }
            if self.running.is_none() && self.relay.running().is_none() && self.posts_in_flight == 0
            {
                break;
            }
            tokio::select! {
                Some(input) = self.rx.recv() => self.dispatch(input),
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        // One more delivery attempt for everything still owed.
        let (mut delivered, mut kept) = (0, 0);
        match self.outbox.pending().await {
            Ok(items) => {
                for item in items {
                    let outcome = self.transport.post_report(&item).await;
                    if let PostOutcome::Rejected(reason) = &outcome {
                        on_event(DriverEvent::Relay(RelayEvent::Dropped {
                            command: item.command,
                            reason: reason.clone(),
                        }));
                    }
                    match outcome {
                        PostOutcome::Acknowledged | PostOutcome::Rejected(_) => {
                            delivered += 1;
                            if let Err(e) = self.outbox.remove(&item.command).await {
                                on_event(DriverEvent::OutboxError(e.to_string()));
                            }
                        }
                        PostOutcome::Retry(_) => {
                            kept += 1;
                            if let Err(e) = self.outbox.record_attempt(&item.command).await {
                                on_event(DriverEvent::OutboxError(e.to_string()));
                            }
                        }
                    }
                }
            }
            Err(e) => on_event(DriverEvent::OutboxError(e.to_string())),
        }
        on_event(DriverEvent::Flushed { delivered, kept });
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
                self.control_task = None;
                self.relay.handle_control_response(command, result, now);
            }
            Input::Posted(command, outcome) => {
                self.posts_in_flight = self.posts_in_flight.saturating_sub(1);
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
                if let Some(report) = report
                    && let Err(e) = self.relay.handle_progress(command, &execution, report, now)
                {
                    tracing::debug!(%command, error = %e, "progress report dropped");
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
                let _ = tx.send(Input::Progress(command, execution.clone()));
            }
        })
    }

    fn spawn<F>(&self, future: F) -> AbortHandle
    where
        F: Future<Output = Input> + Send + 'static,
    {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let _ = tx.send(future.await);
        })
        .abort_handle()
    }

    /// Performs every pending action.
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
                Action::Sync {
                    project,
                    sessions,
                    long_poll,
                    restarted,
                    running,
                } => {
                    if self.stopping {
                        let failure = SyncFailure::Network("the worker is stopping".into());
                        self.relay.handle_sync_response(Err(failure), now);
                        continue;
                    }
                    let request = SyncRequest {
                        project,
                        sessions,
                        long_poll,
                        restarted,
                        running,
                    };
                    let transport = self.transport.clone();
                    self.sync_task = Some(
                        self.spawn(async move { Input::Synced(transport.sync(&request).await) }),
                    );
                }
                Action::RememberProject(project) => {
                    if let Err(e) = self.outbox.remember_project(&project).await {
                        on_event(DriverEvent::OutboxError(e.to_string()));
                    }
                }
                Action::ForgetProject(project) => {
                    if let Err(e) = self.outbox.forget_project(&project).await {
                        on_event(DriverEvent::OutboxError(e.to_string()));
                    }
                }
                Action::AbortHeldSync => {
                    if let Some(task) = self.sync_task.take() {
                        task.abort();
                    }
                    self.relay
                        .handle_sync_response(Err(SyncFailure::Aborted), now);
                }
                Action::Claim { command, execution } => {
                    if self.stopping {
                        let outcome = ClaimOutcome::Network("the worker is stopping".into());
                        self.relay.handle_claim_response(command, outcome, now);
                        continue;
                    }
                    let transport = self.transport.clone();
                    self.spawn(async move {
                        Input::Claimed(command, transport.claim(&command, &execution).await)
                    });
                }
                Action::Execute(job) => {
                    let command = job.command.id;
                    let (mut handle, signal) = cancel_pair();
                    if self.stopping {
                        handle.cancel();
                    }
                    self.running = Some((command, handle));
                    let progress = self.progress_sink(command, job.execution.clone());
                    let executor = self.executor.clone();
                    self.spawn(async move {
                        Input::Executed(command, executor.execute(job, signal, progress).await)
                    });
                }
                Action::AskApproval { job, until } => {
                    let command = job.command.id;
                    let approver = self.approver.clone();
                    let task = self.spawn(async move {
                        Input::Approval(command, approver.ask(job, until).await)
                    });
                    if let Some((_, earlier)) = self.asking.replace((command, task)) {
                        earlier.abort();
                    }
                }
                Action::WithdrawApproval { command } => {
                    if let Some((asked, task)) = self.asking.take() {
                        if asked == command {
                            task.abort();
                        } else {
                            self.asking = Some((asked, task));
                        }
                    }
                }
                Action::PostProgress {
                    command,
                    execution,
                    report,
                } => {
                    if self.stopping {
                        continue;
                    }
                    let transport = self.transport.clone();
                    self.spawn(async move {
                        let outcome = transport.post_progress(&command, &execution, &report).await;
                        Input::ProgressPosted(command, outcome)
                    });
                }
                Action::Control { command, long_poll } => {
                    if self.stopping {
                        continue;
                    }
                    let transport = self.transport.clone();
                    self.control_task = Some(self.spawn(async move {
                        Input::Controlled(command, transport.control(&command, long_poll).await)
                    }));
                }
                Action::CancelExecution { command } => {
                    if let Some((running, handle)) = self.running.as_mut()
                        && *running == command
                    {
                        handle.cancel();
                    }
                }
                Action::StoreReport(item) => {
                    if let Err(e) = self.outbox.put(&item).await {
                        on_event(DriverEvent::OutboxError(e.to_string()));
                    }
                    self.relay.handle_report_stored(item.command, now);
                }
                Action::PostReport(item) => {
                    self.posts_in_flight += 1;
                    let transport = self.transport.clone();
                    self.spawn(async move {
                        Input::Posted(item.command, transport.post_report(&item).await)
                    });
                }
                Action::RemoveReport(command) => {
                    if let Err(e) = self.outbox.remove(&command).await {
                        on_event(DriverEvent::OutboxError(e.to_string()));
                    }
                }
                Action::RecordAttempt(command) => {
                    if let Err(e) = self.outbox.record_attempt(&command).await {
                        on_event(DriverEvent::OutboxError(e.to_string()));
                    }
                }
            }
        }
    }
}

async fn sleep_opt(wait: Option<Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
