//! # graph-relay-fuzz
//!
//! The bodies of graph-relay's fuzz targets, as plain functions. The
//! cargo-fuzz binaries in `fuzz_targets/` call them (feature `libfuzzer`),
//! and `tests/replay.rs` replays the committed corpora through them in the
//! normal test suite, so CI checks every target without a fuzzing campaign.
//! Each function panics when an invariant breaks; that is the finding.
//!
//! | target | input | what must hold |
//! |---|---|---|
//! | [`mcp_message`] | newline-separated raw messages | never panics; every answer is valid JSON-RPC 2.0; a refused request changes nothing |
//! | [`tool_args`] | a JSON document | decoding never panics; accepted arguments obey the schema |
//! | [`queue_ops`] | `Arbitrary` agent and relay operations | the reference model of `graph_relay_core::testkit::model` |
//! | [`envelope`] | arbitrary Unicode | never over 100,000; truncated exactly when the full form does not fit; error cuts keep whole characters |
//! | [`relay_events`] | arbitrary event orders and failures against a model server with leases, restarts and un-sharing | never two commands at once; no outbox item dropped without a 2xx or a final refusal; every claim follows a re-check that holds at that moment; a restart is announced only once the reports from before it are delivered; a run the server closed is stopped once and never reported; progress is only the running execution's latest, one post at a time and at most one per second; the server never holds shares in a project the desktop forgot; nothing that needs the owner's approval runs unless approved, and only a question still open is withdrawn |

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use futures::executor::block_on;
use graph_relay_core::args::ToolArgs;
use graph_relay_core::catalog::{ToolCatalog, ToolKind};
use graph_relay_core::command::WAITING_FOR_APPROVAL;
use graph_relay_core::envelope::{
    EnvelopeBody, FinishStatus, ResultEnvelope, js_json_length, utf16_len,
};
use graph_relay_core::ids::{CommandId, ExecutionId, GraphSessionId, ProjectId};
use graph_relay_core::limits::{ERROR_LIMIT, RESULT_LIMIT};
use graph_relay_core::mcp::{Caller, McpServer, McpSession, ServerInfo};
use graph_relay_core::outbox::{OutboxItem, RelayReport};
use graph_relay_core::queue::SyncRequest;
use graph_relay_core::relay::executor::ProgressReport;
use graph_relay_core::relay::{
    APPROVED_ON_THE_DESKTOP, Action, ApprovalDecision, CANCELLED_ON_THE_DESKTOP, ClaimOutcome,
    ExecutionOutcome, Job, PostOutcome, Relay, RelayCommand, RelayConfig, RelayMode, SharedSet,
    SyncFailure,
};
use graph_relay_core::session::SessionMeta;
use graph_relay_core::testkit::{World, meta, model, p1, p2};
use graph_relay_core::time::Timestamp;
use graph_relay_store_memory::MemoryStore;
use serde_json::{Value, json};

// ----- 1. MCP messages ------------------------------------------------------

/// Feeds each line of `data` to the core's MCP handling as one message.
pub fn mcp_message(data: &[u8]) {
    let store = Arc::new(MemoryStore::new());
    let world = World::new(store.clone());
    // One shared session, so that `run_graph_session` can succeed.
    block_on(world.sync(&world.device, p1(), &[1]));
    let catalog = ToolCatalog::builder()
        .wait_seconds(Some(5))
        .build()
        .unwrap_or_default();
    let server = McpServer::new(
        world.queue.clone(),
        catalog,
        ServerInfo::new("graph-relay-fuzz", "0"),
    );
    let caller = Caller::new(world.agent.clone(), ["osfoundry:read", "osfoundry:run"]);
    let mut session = McpSession::new();
    for line in data.split(|b| *b == b'\n').take(32) {
        let before = store.commands();
        let answer = block_on(server.handle(&mut session, &caller, line));
        let Some(answer) = answer else {
            assert_eq!(
                store.commands(),
                before,
                "a notification or response changed state"
            );
            continue;
        };
        let message: Value =
            serde_json::from_slice(&answer.to_bytes()).expect("every answer is JSON");
        assert_eq!(message["jsonrpc"], "2.0", "{message}");
        assert!(
            message.get("id").is_some(),
            "an answer always carries an id (null if unknown): {message}"
        );
        let (result, error) = (message.get("result"), message.get("error"));
        assert!(
            result.is_some() != error.is_some(),
            "exactly one of result and error: {message}"
        );
        if let Some(error) = error {
            assert!(error["code"].is_i64(), "{message}");
            assert!(
                error["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{message}"
            );
        }
        let refused = error.is_some() || result.is_some_and(|r| r["isError"] == json!(true));
        if refused {
            assert_eq!(
                store.commands(),
                before,
                "a refused request changed state: {message}"
            );
        }
    }
}

// ----- 2. tool arguments ----------------------------------------------------

/// Decodes `data` (when it is JSON) as the arguments of every tool.
pub fn tool_args(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for kind in ToolKind::ALL {
        for max_wait in [None, Some(60)] {
            let decoded = ToolArgs::decode(kind, Some(&value), max_wait);
            let object = value.as_object();
            match decoded {
                Ok(args) => {
                    let object = object.expect("only objects are accepted");
                    let allowed: &[&str] = match kind {
                        ToolKind::RunGraphSession => {
                            &["graph_session_id", "arguments", "idempotency_key"]
                        }
                        ToolKind::ListGraphSessions => &["project_id", "limit"],
                        ToolKind::GetGraphRun => &["command_id", "wait_seconds"],
                        ToolKind::CancelGraphRun => &["command_id"],
                    };
                    assert!(
                        object.keys().all(|k| allowed.contains(&k.as_str())),
                        "{value}"
                    );
                    match args {
                        ToolArgs::Run(a) => {
                            assert!(
                                (8..=128).contains(&a.idempotency_key.as_str().chars().count())
                            );
                        }
                        ToolArgs::List(a) => assert!((1..=50).contains(&a.limit)),
                        ToolArgs::Get(a) => assert!(a.wait_seconds <= max_wait.unwrap_or(0)),
                        ToolArgs::Cancel(_) => {}
                    }
                }
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
    }
}

// ----- 3. queue operations --------------------------------------------------

/// Applies arbitrary agent and relay operations to `Queue` + the memory store.
pub fn queue_ops(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(ops) = Vec::<model::Op>::arbitrary(&mut u) else {
        return;
    };
    if ops.len() > 200 {
        return;
    }
    model::check(Arc::new(MemoryStore::new()), &ops);
}

// ----- 4. result envelope ---------------------------------------------------

#[derive(Debug, Arbitrary)]
struct EnvelopeInput {
    piece: String,
    repeat: u16,
    error: String,
    error_repeat: u8,
    tokens: Option<u64>,
    cost: Option<i32>,
    status: u8,
}

/// Builds envelopes from arbitrary Unicode and checks the limits of SPEC §7.
pub fn envelope(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(input) = EnvelopeInput::arbitrary(&mut u) else {
        return;
    };
    // Up to 150,000 bytes: past the 100,000-unit limit without slowing every run.
    let result = input
        .piece
        .repeat(usize::from(input.repeat).min(150_000 / input.piece.len().max(1)));
    let error = input.error.repeat(usize::from(input.error_repeat));
    // Oracle: for strings, serde_json escapes exactly as JSON.stringify does.
    let text = Value::String(result.clone());
    let serialized = serde_json::to_string(&text).expect("a string serializes");
    assert_eq!(js_json_length(&text), serialized.encode_utf16().count());

    let status = [
        FinishStatus::Completed,
        FinishStatus::Failed,
        FinishStatus::Cancelled,
    ][usize::from(input.status % 3)];
    let exec = ExecutionId::parse("exec-fuzz").expect("valid id");
    let body = EnvelopeBody {
        result: text,
        total_tokens: input.tokens,
        reported_cost: input.cost.map(|c| f64::from(c) / 100.0),
        error: (!error.is_empty()).then(|| error.clone()),
    };
    let built = ResultEnvelope::build(exec.clone(), status, body.clone());
    assert!(built.js_length() <= RESULT_LIMIT, "never over the limit");
    assert!(built.validate().is_ok());
    // The cut error is a prefix of whole characters, within the limit, and as long as it can be.
    let mut cut = error.clone();
    graph_relay_core::envelope::cut_utf16(&mut cut, ERROR_LIMIT);
    assert!(error.starts_with(&cut) && utf16_len(&cut) <= ERROR_LIMIT);
    if cut.len() < error.len() {
        let next = error[cut.len()..].chars().next().map_or(0, char::len_utf16);
        assert!(
            utf16_len(&cut) + next > ERROR_LIMIT,
            "cut shorter than needed"
        );
    }
    let full = ResultEnvelope {
        execution_id: exec,
        status,
        body: Some(std::sync::Arc::new(EnvelopeBody {
            error: (!error.is_empty()).then_some(cut),
            ..body
        })),
    };
    assert_eq!(
        built.is_truncated(),
        full.js_length() > RESULT_LIMIT,
        "truncated exactly when the full form does not fit"
    );
    if !built.is_truncated() {
        assert_eq!(built, full);
    }
    // The wire form reads back as it was written.
    let wire = serde_json::to_string(&built).expect("serializes");
    let back: ResultEnvelope = serde_json::from_str(&wire).expect("reads back");
    assert_eq!(back.is_truncated(), built.is_truncated());
}

// ----- 5. relay state machine -----------------------------------------------

#[derive(Debug, Arbitrary)]
enum Step {
    Tick(u8),
    AnswerSync {
        commands: Vec<(u8, u8, bool)>,
        failure: u8,
    },
    AnswerClaim(u8),
    AnswerControl(u8),
    Finish(u8),
    Stored,
    AnswerPost(u8),
    Loaded,
    Share(u8),
    /// The desktop process dies and a new one starts on the same outbox
    /// (one time in 16: a restart wipes out everything in flight).
    Restart(u8),
    /// The agent cancels the command running on the server.
    AgentCancels,
    /// The executor reports progress (a percentage; over 100 is invalid).
    Progress(u8),
    AnswerProgress(u8),
    /// The owner answers the question about the run waiting for approval
    /// (even: approve; odd: deny).
    Approve(u8),
    /// The owner cancels the current run (executing or waiting) on the desktop.
    OwnerCancels,
}

fn session(n: u8) -> SessionMeta {
    meta(u32::from(n % 4) + 1)
}

/// The desktop's consent: `p1` with sessions 0–3 (bits 0–3) unless bit 7 is
/// set; `p2` with session `bits >> 4 & 3` when bit 6 is set. Clearing a
/// project's bit withdraws the whole project. Sessions whose bit is set in
/// `approvals` need the owner's approval (for 60 s).
fn shared_set(bits: u8, approvals: u8) -> SharedSet {
    let mut set = SharedSet::new();
    for n in 0..4u8 {
        if approvals & (1 << n) != 0 {
            set.require_approval(
                GraphSessionId::clone(&session(n).graph_session_id),
                Duration::from_secs(60),
            );
        }
    }
    if bits & 0x80 == 0 {
        set.enable(p1());
        for n in 0..4u8 {
            if bits & (1 << n) != 0 {
                set.share(p1(), session(n));
            }
        }
    }
    if bits & 0x40 != 0 {
        set.share(p2(), session((bits >> 4) & 3));
    }
    set
}

fn command_id(n: u8) -> CommandId {
    CommandId::from_uuid(uuid::Uuid::from_u128(u128::from(n % 8) + 1))
}

/// Why the model server closed a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    /// A completion or decline of the relay was taken.
    Reported,
    /// Cancelled while queued, or closed by the server's own re-check.
    BeforeStart,
    /// Its lease lapsed.
    Lapsed,
    /// Its desktop announced a restart.
    Restarted,
}

/// A command as the model server holds it.
#[derive(Debug, Clone, PartialEq)]
enum ServerState {
    Queued,
    Running {
        execution: ExecutionId,
        lease_until: Timestamp,
        cancel: bool,
    },
    Closed(Closed),
}

/// The server of the relay, reduced to what the relay's answers depend on:
/// leases on running commands (granted by a claim, renewed by a control
/// request, lapsing into a close), the restart announcement, and the shares
/// a sync replaces (a sync that no longer shares a session closes its
/// queued commands).
struct ModelServer {
    lease: Duration,
    commands: HashMap<CommandId, ServerState>,
    /// The last version of each command a sync handed out.
    offered: HashMap<CommandId, RelayCommand>,
    /// Projects the server holds shares of this desktop in.
    shares: BTreeSet<ProjectId>,
}

impl ModelServer {
    /// The command as it stands at `now`: a lapsed lease closes it.
    fn state(&mut self, id: &CommandId, now: Timestamp) -> Option<ServerState> {
        let state = self.commands.get_mut(id)?;
        if let ServerState::Running { lease_until, .. } = state
            && *lease_until <= now
        {
            *state = ServerState::Closed(Closed::Lapsed);
        }
        Some(state.clone())
    }

    fn close_running_after_restart(&mut self, running: Option<CommandId>, now: Timestamp) {
        let ids: Vec<CommandId> = self.commands.keys().copied().collect();
        for id in ids {
            if Some(id) != running
                && matches!(self.state(&id, now), Some(ServerState::Running { .. }))
            {
                self.commands
                    .insert(id, ServerState::Closed(Closed::Restarted));
            }
        }
    }
}

/// What the harness remembers of one relay process and of the desktop's disk.
#[derive(Default)]
struct Desktop {
    /// The durable outbox: each item with the process (epoch) that stored it.
    outbox: HashMap<CommandId, (u64, graph_relay_core::outbox::OutboxItem)>,
    /// Projects recorded as synced (durable).
    remembered: BTreeSet<ProjectId>,
}

/// Requests of the current process awaiting an answer.
#[derive(Default)]
struct InFlight {
    sync: Option<(ProjectId, Vec<SessionMeta>, bool, Option<CommandId>)>,
    claim: Option<(CommandId, ExecutionId)>,
    controls: Vec<CommandId>,
    store: Option<CommandId>,
    posts: Vec<graph_relay_core::outbox::OutboxItem>,
    load: bool,
    progress: Vec<(CommandId, ExecutionId)>,
}

/// What the current process was told or did, for the invariants.
#[derive(Default)]
struct Seen {
    running: Option<(CommandId, ExecutionId)>,
    /// The run waiting for the owner's approval.
    asking: Option<(CommandId, ExecutionId)>,
    /// Runs the owner approved and that have not started yet.
    approved: BTreeSet<CommandId>,
    /// A control answer said the server closed these runs.
    told_closed: BTreeSet<CommandId>,
    cancels: BTreeSet<CommandId>,
    /// Reports the server refused for good.
    refused: Vec<graph_relay_core::outbox::OutboxItem>,
    may_remove: HashMap<CommandId, bool>,
    latest_progress: HashMap<CommandId, ProgressReport>,
    last_progress_post: HashMap<CommandId, Timestamp>,
    /// Runs the owner cancelled on the desktop (the cancel was taken).
    owner_cancelled: BTreeSet<CommandId>,
}

/// Drives the relay state machine with arbitrary answers in arbitrary order
/// against a model server with leases, restarts and un-sharing.
pub fn relay_events(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Some(mut fuzz) = RelayFuzz::new(&mut u) else {
        return;
    };
    for _ in 0..256 {
        // Perform (record) every action, checking the invariants.
        while let Some(action) = fuzz.relay.poll_action() {
            fuzz.check_action(action);
        }
        assert!(
            fuzz.server.shares.is_subset(&fuzz.desktop.remembered),
            "the server holds shares in a project the desktop forgot: {:?} vs {:?}",
            fuzz.server.shares,
            fuzz.desktop.remembered
        );
        let Ok(step) = Step::arbitrary(&mut u) else {
            break;
        };
        fuzz.step(step);
    }
}

/// The desktop a crashed earlier process (epoch 0) left: a report in the
/// outbox for each of the first four `left_over` commands, which the server
/// holds running under a granted lease (or queued, for a decline).
fn left_over_outbox(
    left_over: Vec<(u8, bool)>,
    server: &mut ModelServer,
    t0: Timestamp,
) -> Desktop {
    let mut desktop = Desktop::default();
    for (n, declined) in left_over.into_iter().take(4) {
        let command = CommandId::from_uuid(uuid::Uuid::from_u128(1000 + u128::from(n)));
        let execution = ExecutionId::parse("exec-old").expect("valid");
        server.commands.insert(
            command,
            if declined {
                ServerState::Queued
            } else {
                ServerState::Running {
                    execution: execution.clone(),
                    lease_until: t0.plus(server.lease),
                    cancel: false,
                }
            },
        );
        let report = if declined {
            RelayReport::Declined
        } else {
            RelayReport::Completion {
                envelope: ResultEnvelope::build(
                    execution,
                    FinishStatus::Completed,
                    EnvelopeBody::default(),
                ),
            }
        };
        let item = graph_relay_core::outbox::OutboxItem {
            command,
            report,
            stored_at: t0,
            attempts: 0,
        };
        desktop.outbox.insert(command, (0, item));
    }
    desktop
}

/// One run of [`relay_events`]: the relay, the model server and desktop it
/// talks to, what is in flight between them, and what the checks have seen.
struct RelayFuzz {
    config: RelayConfig,
    /// Which sessions need the owner's approval (see [`shared_set`]).
    approvals: u8,
    now: Timestamp,
    /// The desktop process: a restart starts the next one.
    epoch: u64,
    shared: SharedSet,
    server: ModelServer,
    desktop: Desktop,
    relay: Relay,
    flight: InFlight,
    seen: Seen,
}

impl RelayFuzz {
    /// A relay started on a desktop whose outbox holds what an earlier
    /// process left, or `None` when the input ends first.
    fn new(u: &mut Unstructured<'_>) -> Option<Self> {
        let Ok(interval) = bool::arbitrary(u) else {
            return None;
        };
        let Ok(bits) = u8::arbitrary(u) else {
            return None;
        };
        let Ok(left_over) = Vec::<(u8, bool)>::arbitrary(u) else {
            return None;
        };
        let Ok(approvals) = u8::arbitrary(u) else {
            return None;
        };
        let config = RelayConfig {
            mode: if interval {
                RelayMode::Interval
            } else {
                RelayMode::LongPoll
            },
            ..RelayConfig::default()
        };
        let t0 = Timestamp(1_767_225_600_000);
        let now = t0;
        let shared = shared_set(bits, approvals);
        let mut server = ModelServer {
            lease: if interval {
                Duration::from_secs(30)
            } else {
                Duration::from_secs(60)
            },
            commands: HashMap::new(),
            offered: HashMap::new(),
            shares: BTreeSet::new(),
        };
        let desktop = left_over_outbox(left_over, &mut server, t0);
        let epoch = 1u64;
        let mut relay = Relay::new(config.clone(), shared.clone(), t0);
        let flight = InFlight::default();
        let seen = Seen::default();
        relay.handle_timeout(now);
        Some(Self {
            config,
            approvals,
            now,
            epoch,
            shared,
            server,
            desktop,
            relay,
            flight,
            seen,
        })
    }

    /// Checks one action of the relay against what it may do now, and
    /// records it as in flight.
    fn check_action(&mut self, action: Action) {
        let Self {
            relay,
            desktop,
            flight,
            seen,
            now,
            ..
        } = self;
        let now = *now;
        match action {
            Action::LoadOutbox => flight.load = true,
            Action::Sync(SyncRequest {
                project,
                sessions,
                restarted,
                running,
                ..
            }) => self.check_sync(project, sessions, restarted, running),
            Action::RememberProject(project) => {
                assert!(
                    relay.shared().is_enabled(&project),
                    "only an enabled project is remembered"
                );
                desktop.remembered.insert(project);
            }
            Action::ForgetProject(project) => self.check_forget_project(project),
            Action::AbortHeldSync => {
                if flight.sync.take().is_some() {
                    relay.handle_sync_response(Err(SyncFailure::Aborted), now);
                }
            }
            Action::Claim { command, execution } => self.check_claim(command, execution),
            Action::AskApproval { job, .. } => self.check_ask_approval(job),
            Action::WithdrawApproval { command } => {
                assert_eq!(
                    seen.asking.take().map(|(c, _)| c),
                    Some(command),
                    "only an open question is withdrawn"
                );
            }
            Action::Execute(job) => self.check_execute(job),
            Action::Control { command, .. } => {
                assert!(
                    !seen.told_closed.contains(&command),
                    "no control request for a run the server closed"
                );
                flight.controls.push(command);
            }
            Action::CancelExecution { command } => {
                assert_eq!(seen.running.as_ref().map(|(c, _)| *c), Some(command));
                assert!(seen.cancels.insert(command), "the engine is stopped once");
            }
            Action::PostProgress {
                command,
                execution,
                report,
            } => self.check_progress_post(command, execution, report),
            Action::StoreReport(item) => self.check_store_report(item),
            Action::PostReport(item) => self.check_post_report(item),
            Action::RemoveReport(command) => {
                assert_eq!(
                    seen.may_remove.remove(&command),
                    Some(true),
                    "an outbox item was dropped without a 2xx or a final refusal"
                );
                desktop.outbox.remove(&command);
            }
            Action::RecordAttempt(_) => {}
        }
    }

    /// A forgotten project: no longer enabled, and no share of it left on
    /// the server.
    fn check_forget_project(&mut self, project: ProjectId) {
        let Self {
            relay,
            server,
            desktop,
            ..
        } = self;
        assert!(
            !relay.shared().is_enabled(&project),
            "only a project no longer enabled is forgotten"
        );
        assert!(
            !server.shares.contains(&project),
            "a project is forgotten only once the server holds no shares there"
        );
        desktop.remembered.remove(&project);
    }

    /// A claim: one run at a time, of a command still shared as offered.
    fn check_claim(&mut self, command: CommandId, execution: ExecutionId) {
        let Self {
            relay,
            server,
            flight,
            seen,
            ..
        } = self;
        assert!(seen.running.is_none(), "never claims while a command runs");
        assert!(seen.asking.is_none(), "never claims while a run waits");
        // A claim starts a new attempt at the run: the answers to
        // the progress posts of an earlier one are lost.
        flight.progress.retain(|(c, _)| *c != command);
        seen.last_progress_post.remove(&command);
        let c = &server.offered[&command];
        assert!(
            relay
                .shared()
                .still_shared(&c.project, &c.graph_session_id, &c.slug),
            "a claim always follows a re-check that holds now"
        );
        flight.claim = Some((command, execution));
    }

    /// An approval asked: for a Graph that needs it, of a run claimed and
    /// nothing else running or waiting.
    fn check_ask_approval(&mut self, job: Job) {
        let Self {
            server,
            seen,
            shared,
            now,
            ..
        } = self;
        let now = *now;
        assert!(
            shared.approval(&job.command.graph_session_id).is_some(),
            "approval is asked only for a Graph that needs it"
        );
        assert!(seen.running.is_none() && seen.asking.is_none());
        assert!(
            matches!(
                server.state(&job.command.id, now),
                Some(ServerState::Running { execution, .. }) if execution == job.execution
            ),
            "a run waits for approval once claimed"
        );
        seen.asking = Some((job.command.id, job.execution));
    }

    /// A report posted: never one the server refused for good.
    fn check_post_report(&mut self, item: OutboxItem) {
        let Self { flight, seen, .. } = self;
        assert!(
            !seen
                .refused
                .iter()
                .any(|r| r.command == item.command && r.report == item.report),
            "a report refused for good is never posted again"
        );
        flight.posts.push(item);
    }

    /// A sync the relay sends: one at a time, naming what runs, sharing only remembered projects.
    fn check_sync(
        &mut self,
        project: ProjectId,
        sessions: Vec<SessionMeta>,
        restarted: bool,
        running: Option<CommandId>,
    ) {
        let Self {
            relay,
            desktop,
            flight,
            seen,
            epoch,
            ..
        } = self;
        let epoch = *epoch;
        assert!(flight.sync.is_none(), "one sync at a time");
        assert!(sessions.len() <= 100);
        assert!(
            relay.shared().is_enabled(&project) || sessions.is_empty(),
            "a project no longer enabled is synced with an empty list"
        );
        assert_eq!(
            running,
            seen.running
                .as_ref()
                .or(seen.asking.as_ref())
                .map(|(c, _)| *c),
            "a sync names the command the relay executes or asks about"
        );
        if restarted {
            assert!(
                desktop.outbox.values().all(|(e, _)| *e == epoch),
                "a restart is announced only once the reports from before it are delivered"
            );
        }
        if !sessions.is_empty() {
            assert!(
                desktop.remembered.contains(&project),
                "a project is remembered before a sync shares into it"
            );
        }
        flight.sync = Some((project, sessions, restarted, running));
    }

    /// An execution the relay starts: one at a time, approved when it must be, claimed and still shared.
    fn check_execute(&mut self, job: Job) {
        let Self {
            relay,
            server,
            seen,
            shared,
            now,
            ..
        } = self;
        let now = *now;
        assert!(seen.running.is_none(), "never two commands at once");
        assert!(seen.asking.is_none(), "nothing runs while a run waits");
        if shared.approval(&job.command.graph_session_id).is_some() {
            assert!(
                seen.approved.remove(&job.command.id),
                "nothing that needs approval runs unless approved"
            );
        }
        assert!(
            matches!(
                server.state(&job.command.id, now),
                Some(ServerState::Running { execution, .. }) if execution == job.execution
            ),
            "only a command running on the server under this execution runs"
        );
        assert!(
            relay.shared().still_shared(
                &job.command.project,
                &job.command.graph_session_id,
                &job.command.slug
            ),
            "the re-check held when it was claimed"
        );
        seen.running = Some((job.command.id, job.execution));
    }

    /// A progress post: of the claimed execution, one at a time, at most one per interval, the latest report.
    fn check_progress_post(
        &mut self,
        command: CommandId,
        execution: ExecutionId,
        report: ProgressReport,
    ) {
        let Self {
            flight,
            seen,
            now,
            config,
            ..
        } = self;
        let now = *now;
        let own = Some(&(command, execution.clone()));
        assert!(
            seen.running.as_ref() == own || seen.asking.as_ref() == own,
            "progress only of the claimed execution"
        );
        assert!(
            !seen.told_closed.contains(&command),
            "no progress for a run the server closed"
        );
        assert!(
            flight.progress.iter().all(|(c, _)| *c != command),
            "one progress post of a run at a time"
        );
        if let Some(last) = seen.last_progress_post.get(&command) {
            assert!(
                now.since(*last) >= config.progress_interval,
                "at most one progress post per interval"
            );
        }
        let relays_own = matches!(
            report.message.as_deref(),
            Some(WAITING_FOR_APPROVAL | APPROVED_ON_THE_DESKTOP)
        );
        if !relays_own {
            assert_eq!(
                seen.latest_progress.get(&command),
                Some(&report),
                "the latest report is posted"
            );
        }
        seen.last_progress_post.insert(command, now);
        flight.progress.push((command, execution));
    }

    /// A report the relay stores before posting it.
    fn check_store_report(&mut self, item: OutboxItem) {
        let Self {
            desktop,
            flight,
            seen,
            epoch,
            ..
        } = self;
        let epoch = *epoch;
        assert!(
            !seen.told_closed.contains(&item.command),
            "nothing is reported of a run the server closed"
        );
        if seen.owner_cancelled.contains(&item.command)
            && let RelayReport::Completion { envelope } = &item.report
        {
            assert_eq!(envelope.status, FinishStatus::Cancelled);
            assert!(
                envelope
                    .body
                    .as_ref()
                    .and_then(|b| b.error.as_deref())
                    .is_some_and(|e| e.starts_with(CANCELLED_ON_THE_DESKTOP)),
                "a run the owner cancelled says so: {envelope:?}"
            );
        }
        if seen
            .asking
            .as_ref()
            .is_some_and(|(c, _)| *c == item.command)
        {
            // Denied: the question is answered, nothing ran.
            seen.asking = None;
        }
        desktop.outbox.insert(item.command, (epoch, item.clone()));
        flight.store = Some(item.command);
    }

    /// Performs one step of the world.
    fn step(&mut self, step: Step) {
        match step {
            Step::Tick(secs) => {
                self.now = self.now.plus(Duration::from_millis(u64::from(secs) * 250));
                self.relay.handle_timeout(self.now);
            }
            Step::AnswerSync { commands, failure } => self.answer_sync(commands, failure),
            Step::AnswerClaim(o) => self.answer_claim(o),
            Step::AnswerControl(o) => self.answer_control(o),
            Step::AgentCancels => self.agent_cancels(),
            Step::Finish(o) => self.finish(o),
            Step::Stored => self.stored(),
            Step::AnswerPost(o) => self.answer_post(o),
            Step::Loaded => self.loaded(),
            Step::Share(bits) => {
                self.shared = shared_set(bits, self.approvals);
                self.relay.handle_shared_set(self.shared.clone(), self.now);
            }
            Step::Restart(r) => self.restart(r),
            Step::Progress(p) => self.progress(p),
            Step::Approve(o) => self.approve(o),
            Step::OwnerCancels => self.owner_cancels(),
            Step::AnswerProgress(o) => self.answer_progress(o),
        }
    }

    /// The sync in flight gets its answer (or is lost on the way).
    fn answer_sync(&mut self, commands: Vec<(u8, u8, bool)>, failure: u8) {
        let Self {
            relay,
            server,
            flight,
            now,
            ..
        } = self;
        let now = *now;
        let Some((project, sessions, restarted, running)) = flight.sync.take() else {
            return;
        };
        // 1: lost before the server; 2: refused; 3: reached the
        // server, answer lost; else answered.
        let arrived = !matches!(failure % 4, 1 | 2);
        if arrived {
            if sessions.is_empty() {
                server.shares.remove(&project);
            } else {
                server.shares.insert(project.clone());
            }
            if restarted {
                server.close_running_after_restart(running, now);
            }
        }
        let answer = match failure % 4 {
            1 | 3 => Err(SyncFailure::Network("down".into())),
            2 => Err(SyncFailure::Refused("403".into())),
            _ => {
                let mut handed = Vec::new();
                for (id, n, renamed) in commands.into_iter().take(6) {
                    let id = command_id(id);
                    let c = server
                        .offered
                        .get(&id)
                        .cloned()
                        .unwrap_or_else(|| RelayCommand {
                            id,
                            project: project.clone(),
                            graph_session_id: GraphSessionId::clone(&session(n).graph_session_id),
                            arguments: Default::default(),
                            slug: if renamed {
                                "renamed".into()
                            } else {
                                session(n).slug.to_string()
                            },
                            agent: None,
                        });
                    // Only this project's queued commands, each once.
                    if c.project != project || handed.iter().any(|h: &RelayCommand| h.id == id) {
                        continue;
                    }
                    match server.state(&id, now) {
                        None | Some(ServerState::Queued) => {}
                        _ => continue,
                    }
                    server.offered.entry(id).or_insert_with(|| c.clone());
                    // A queued run of a session this sync does not share
                    // (under its slug) ends here with the re-check error.
                    let still = sessions
                        .iter()
                        .any(|s| s.graph_session_id == c.graph_session_id && *s.slug == *c.slug);
                    if still {
                        server.commands.insert(id, ServerState::Queued);
                        handed.push(c);
                    } else {
                        server
                            .commands
                            .insert(id, ServerState::Closed(Closed::BeforeStart));
                    }
                }
                Ok(handed)
            }
        };
        relay.handle_sync_response(answer, now);
    }

    /// The claim in flight gets its answer.
    fn answer_claim(&mut self, o: u8) {
        let Self {
            relay,
            server,
            flight,
            now,
            ..
        } = self;
        let now = *now;
        let Some((command, execution)) = flight.claim.take() else {
            return;
        };
        let state = server.state(&command, now);
        let outcome = match (o % 4, state) {
            (3, _) => ClaimOutcome::Network("timeout".into()),
            (1, Some(ServerState::Queued)) => {
                // The agent cancelled it meanwhile.
                server
                    .commands
                    .insert(command, ServerState::Closed(Closed::BeforeStart));
                ClaimOutcome::Refused("cancelled".into())
            }
            (_, Some(ServerState::Queued)) => {
                server.commands.insert(
                    command,
                    ServerState::Running {
                        execution: execution.clone(),
                        lease_until: now.plus(server.lease),
                        cancel: false,
                    },
                );
                ClaimOutcome::Granted
            }
            (_, Some(ServerState::Running { execution: e, .. })) if e == execution => {
                ClaimOutcome::Granted
            }
            _ => ClaimOutcome::Refused("start_refused".into()),
        };
        relay.handle_claim_response(command, outcome, now);
    }

    /// The oldest control request in flight gets its answer; a running command's lease is renewed.
    fn answer_control(&mut self, o: u8) {
        let Self {
            relay,
            server,
            flight,
            seen,
            now,
            ..
        } = self;
        let now = *now;
        if flight.controls.is_empty() {
            return;
        }
        let command = flight.controls.remove(0);
        let answer = if o % 3 == 2 {
            Err(graph_relay_core::relay::Refusal::no_answer("timeout"))
        } else {
            let state = server.state(&command, now);
            let lease = server.lease;
            match server.commands.get_mut(&command) {
                // The request renews the lease of a running command.
                Some(ServerState::Running {
                    lease_until,
                    cancel,
                    ..
                }) => {
                    *lease_until = now.plus(lease);
                    *cancel |= o % 3 == 1;
                    Ok(graph_relay_core::queue::ControlAnswer {
                        cancel_requested: *cancel,
                        status: graph_relay_core::command::CommandStatus::Running,
                    })
                }
                _ => Ok(graph_relay_core::queue::ControlAnswer {
                    cancel_requested: false,
                    status: match state {
                        Some(ServerState::Queued) | None => {
                            graph_relay_core::command::CommandStatus::Queued
                        }
                        _ => graph_relay_core::command::CommandStatus::Failed,
                    },
                }),
            }
        };
        if let Ok(a) = &answer
            && a.status.is_terminal()
            && seen.running.as_ref().is_some_and(|(c, _)| *c == command)
        {
            seen.told_closed.insert(command);
        }
        relay.handle_control_response(command, answer, now);
    }

    /// The agent cancels the command running on the server.
    fn agent_cancels(&mut self) {
        let Self { server, seen, .. } = self;
        if let Some((command, _)) = &seen.running
            && let Some(ServerState::Running { cancel, .. }) = server.commands.get_mut(command)
        {
            *cancel = true;
        }
    }

    /// The running execution ends.
    fn finish(&mut self, o: u8) {
        let Self {
            relay, seen, now, ..
        } = self;
        let now = *now;
        let Some((command, _)) = seen.running.take() else {
            return;
        };
        let status = [
            None,
            Some(FinishStatus::Completed),
            Some(FinishStatus::Failed),
            Some(FinishStatus::Cancelled),
        ][usize::from(o % 4)];
        relay.handle_execution_finished(
            command,
            ExecutionOutcome {
                status,
                result: json!(o),
                ..Default::default()
            },
            now,
        );
    }

    /// The report being stored is on disk.
    fn stored(&mut self) {
        let Self {
            relay, flight, now, ..
        } = self;
        let now = *now;
        if let Some(command) = flight.store.take() {
            relay.handle_report_stored(command, now);
        }
    }

    /// The oldest report post in flight gets its answer.
    fn answer_post(&mut self, o: u8) {
        let Self {
            relay,
            server,
            flight,
            seen,
            now,
            ..
        } = self;
        let now = *now;
        if flight.posts.is_empty() {
            return;
        }
        let item = flight.posts.remove(0);
        let command = item.command;
        let state = server.state(&command, now);
        let outcome = match (&item.report, state) {
            _ if o % 3 == 2 => PostOutcome::Retry("timeout".into()),
            (RelayReport::Declined, Some(ServerState::Queued) | None) => {
                server
                    .commands
                    .insert(command, ServerState::Closed(Closed::BeforeStart));
                PostOutcome::Acknowledged
            }
            (RelayReport::Declined, Some(ServerState::Closed(_))) => PostOutcome::Acknowledged,
            (
                RelayReport::Completion { envelope },
                Some(ServerState::Running { execution, .. }),
            ) if envelope.execution_id == execution => {
                server
                    .commands
                    .insert(command, ServerState::Closed(Closed::Reported));
                PostOutcome::Acknowledged
            }
            (RelayReport::Completion { .. }, Some(ServerState::Closed(Closed::Reported)))
                if o.is_multiple_of(3) =>
            {
                // The same completion, recorded before: a duplicate.
                PostOutcome::Acknowledged
            }
            // Lapsed, closed after a restart, never started, another
            // execution, a running command declined: final.
            _ => PostOutcome::Rejected("409 run_closed".into()),
        };
        if let PostOutcome::Rejected(_) = &outcome {
            seen.refused.push(item.clone());
        }
        seen.may_remove
            .insert(command, !matches!(outcome, PostOutcome::Retry(_)));
        relay.handle_report_posted(command, outcome, now);
    }

    /// The outbox the relay asked for is loaded.
    fn loaded(&mut self) {
        let Self {
            relay,
            desktop,
            flight,
            now,
            ..
        } = self;
        let now = *now;
        if !std::mem::take(&mut flight.load) {
            return;
        }
        let mut items: Vec<_> = desktop.outbox.values().map(|(_, i)| i.clone()).collect();
        items.sort_by_key(|i| (i.stored_at, i.command));
        relay.handle_outbox_loaded(items, now);
    }

    /// The desktop process dies and a new one starts on the same disk (one
    /// time in 16).
    fn restart(&mut self, r: u8) {
        if !r.is_multiple_of(16) {
            return;
        }
        // The process dies: its requests' answers are lost, its
        // execution is gone; the disk (outbox, projects) stays.
        self.epoch += 1;
        self.flight = InFlight::default();
        self.seen = Seen::default();
        // A new process draws new execution ids.
        let fresh = RelayConfig {
            seed: self.config.seed ^ self.epoch,
            ..self.config.clone()
        };
        self.relay = Relay::new(fresh, self.shared.clone(), self.now);
        self.relay
            .remember_synced(self.desktop.remembered.iter().cloned());
        self.relay.handle_timeout(self.now);
    }

    /// The executor reports progress.
    fn progress(&mut self, p: u8) {
        let Self {
            relay, seen, now, ..
        } = self;
        let now = *now;
        let Some((command, execution)) = seen.running.clone() else {
            return;
        };
        let report = ProgressReport {
            message: Some(format!("step {p}")),
            percent: Some(f64::from(p % 128)),
        };
        let taken = relay.handle_progress(command, &execution, report.clone(), now);
        assert_eq!(taken.is_ok(), p % 128 <= 100, "{taken:?}");
        if taken.is_ok() && !seen.told_closed.contains(&command) {
            seen.latest_progress.insert(command, report);
        }
    }

    /// The owner answers the question about the waiting run.
    fn approve(&mut self, o: u8) {
        let Self {
            relay, seen, now, ..
        } = self;
        let now = *now;
        let Some((command, _)) = seen.asking.take() else {
            return;
        };
        let decision = if o.is_multiple_of(2) {
            seen.approved.insert(command);
            ApprovalDecision::Approved
        } else {
            ApprovalDecision::Denied((o % 4 == 1).then(|| "not now".to_owned()))
        };
        relay.handle_approval(command, decision, now);
    }

    /// The owner cancels the current run on the desktop.
    fn owner_cancels(&mut self) {
        let Self {
            relay, seen, now, ..
        } = self;
        let now = *now;
        let Some((command, _)) = seen.running.clone().or_else(|| seen.asking.clone()) else {
            return;
        };
        if relay.handle_local_cancel(command, now) {
            seen.owner_cancelled.insert(command);
        }
    }

    /// The oldest progress post in flight gets its answer.
    fn answer_progress(&mut self, o: u8) {
        let Self {
            relay,
            server,
            flight,
            now,
            ..
        } = self;
        let now = *now;
        if flight.progress.is_empty() {
            return;
        }
        let (command, execution) = flight.progress.remove(0);
        let outcome = match server.state(&command, now) {
            _ if o % 3 == 2 => PostOutcome::Retry("timeout".into()),
            Some(ServerState::Running { execution: e, .. }) if e == execution => {
                PostOutcome::Acknowledged
            }
            _ => PostOutcome::Rejected("409 progress_refused".into()),
        };
        relay.handle_progress_posted(command, outcome, now);
    }
}
