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
//! | [`relay_events`] | arbitrary event orders and failures | never two commands at once; no outbox item dropped without a 2xx or a final refusal; every claim follows a re-check that holds at that moment |

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use futures::executor::block_on;
use graph_relay_core::args::ToolArgs;
use graph_relay_core::catalog::{ToolCatalog, ToolKind};
use graph_relay_core::envelope::{
    ERROR_LIMIT, EnvelopeBody, FinishStatus, RESULT_LIMIT, ResultEnvelope, js_json_length,
    utf16_len,
};
use graph_relay_core::ids::{CommandId, ExecutionId, GraphSessionId, ProjectId};
use graph_relay_core::mcp::{Caller, McpServer, McpSession, ServerInfo};
use graph_relay_core::outbox::RelayReport;
use graph_relay_core::relay::{
    Action, ClaimOutcome, ExecutionOutcome, PostOutcome, Relay, RelayCommand, RelayConfig,
    RelayMode, SharedSet, SyncFailure,
};
use graph_relay_core::session::SessionMeta;
use graph_relay_core::testkit::{World, meta, model, p1};
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
    Loaded(Vec<(u8, bool)>),
    Share(u8),
}

fn session(n: u8) -> SessionMeta {
    meta(u32::from(n % 4) + 1)
}

fn shared_set(bits: u8) -> SharedSet {
    let mut set = SharedSet::new();
    if bits & 0x80 == 0 {
        set.enable(p1());
        for n in 0..4u8 {
            if bits & (1 << n) != 0 {
                set.share(p1(), session(n));
            }
        }
    }
    set
}

fn command_id(n: u8) -> CommandId {
    CommandId::from_uuid(uuid::Uuid::from_u128(u128::from(n % 8) + 1))
}

/// Drives the relay state machine with arbitrary answers in arbitrary order.
pub fn relay_events(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(interval) = bool::arbitrary(&mut u) else {
        return;
    };
    let Ok(bits) = u8::arbitrary(&mut u) else {
        return;
    };
    let mode = if interval {
        RelayMode::Interval
    } else {
        RelayMode::LongPoll
    };
    let t0 = Timestamp(1_767_225_600_000);
    let mut now = t0;
    let mut relay = Relay::new(
        RelayConfig {
            mode,
            ..RelayConfig::default()
        },
        shared_set(bits),
        t0,
    );
    relay.handle_timeout(now);

    let mut pending_sync: Option<ProjectId> = None;
    let mut pending_claim: Option<CommandId> = None;
    let mut pending_controls: Vec<CommandId> = Vec::new();
    let mut pending_store: Option<CommandId> = None;
    let mut pending_posts: Vec<(CommandId, bool)> = Vec::new();
    let mut pending_load = false;
    let mut running: Option<CommandId> = None;
    // Commands the server closed for good (a decline or completion it took):
    // it never hands them out again, and the relay must never claim them.
    let mut closed: BTreeSet<CommandId> = BTreeSet::new();
    // The last version of each command a sync handed out.
    let mut offered: HashMap<CommandId, RelayCommand> = HashMap::new();
    let mut may_remove: HashMap<CommandId, bool> = HashMap::new();

    for _ in 0..256 {
        // Perform (record) every action, checking the invariants.
        while let Some(action) = relay.poll_action() {
            match action {
                Action::LoadOutbox => pending_load = true,
                Action::Sync {
                    project, sessions, ..
                } => {
                    assert!(pending_sync.is_none(), "one sync at a time");
                    assert!(sessions.len() <= 100);
                    assert!(
                        relay.shared().is_enabled(&project) || sessions.is_empty(),
                        "a project no longer enabled is synced with an empty list"
                    );
                    pending_sync = Some(project);
                }
                Action::RememberProject(project) => assert!(
                    relay.shared().is_enabled(&project),
                    "only an enabled project is remembered"
                ),
                Action::ForgetProject(project) => assert!(
                    !relay.shared().is_enabled(&project),
                    "only a project no longer enabled is forgotten"
                ),
                Action::AbortHeldSync => {
                    if pending_sync.take().is_some() {
                        relay.handle_sync_response(Err(SyncFailure::Aborted), now);
                    }
                }
                Action::Claim { command, .. } => {
                    assert!(running.is_none(), "never claims while a command runs");
                    let c = &offered[&command];
                    assert!(
                        relay
                            .shared()
                            .still_shared(&c.project, &c.graph_session_id, &c.slug),
                        "a claim always follows a re-check that holds now"
                    );
                    pending_claim = Some(command);
                }
                Action::Execute(job) => {
                    assert!(running.is_none(), "never two commands at once");
                    assert!(!closed.contains(&job.command.id), "nothing closed runs");
                    assert!(
                        relay.shared().still_shared(
                            &job.command.project,
                            &job.command.graph_session_id,
                            &job.command.slug
                        ),
                        "the re-check held when it was claimed"
                    );
                    running = Some(job.command.id);
                }
                Action::Control { command, .. } => pending_controls.push(command),
                Action::CancelExecution { command } => assert_eq!(running, Some(command)),
                Action::PostProgress { .. } => {}
                Action::StoreReport(item) => pending_store = Some(item.command),
                Action::PostReport(item) => {
                    pending_posts.push((item.command, item.report == RelayReport::Declined))
                }
                Action::RemoveReport(command) => {
                    assert_eq!(
                        may_remove.remove(&command),
                        Some(true),
                        "an outbox item was dropped without a 2xx or a final refusal"
                    );
                }
                Action::RecordAttempt(_) => {}
            }
        }
        let Ok(step) = Step::arbitrary(&mut u) else {
            break;
        };
        match step {
            Step::Tick(secs) => {
                now = now.plus(Duration::from_millis(u64::from(secs) * 250));
                relay.handle_timeout(now);
            }
            Step::AnswerSync { commands, failure } => {
                let Some(project) = pending_sync.take() else {
                    continue;
                };
                let mut seen = BTreeSet::new();
                let answer = match failure % 4 {
                    1 => Err(SyncFailure::Network("down".into())),
                    2 => Err(SyncFailure::Refused("403".into())),
                    _ => Ok(commands
                        .into_iter()
                        .take(6)
                        .filter(|(id, _, _)| !closed.contains(&command_id(*id)))
                        // A sync lists each queued command once.
                        .filter(|(id, _, _)| seen.insert(command_id(*id)))
                        // A command's project, session and slug never change: an id
                        // handed out before is handed out the same, and only in its project.
                        .filter_map(|(id, n, renamed)| match offered.get(&command_id(id)) {
                            Some(known) => (known.project == project).then(|| known.clone()),
                            None => Some(RelayCommand {
                                id: command_id(id),
                                project: project.clone(),
                                graph_session_id: GraphSessionId::clone(
                                    &session(n).graph_session_id,
                                ),
                                arguments: Default::default(),
                                slug: if renamed {
                                    "renamed".into()
                                } else {
                                    session(n).slug.to_string()
                                },
                            }),
                        })
                        .collect::<Vec<_>>()),
                };
                if let Ok(commands) = &answer {
                    for c in commands {
                        offered.entry(c.id).or_insert_with(|| c.clone());
                    }
                }
                relay.handle_sync_response(answer, now);
            }
            Step::AnswerClaim(o) => {
                let Some(command) = pending_claim.take() else {
                    continue;
                };
                let outcome = match o % 3 {
                    // The server never grants a command it has closed.
                    0 if closed.contains(&command) => ClaimOutcome::Refused("cancelled".into()),
                    0 => ClaimOutcome::Granted,
                    1 => ClaimOutcome::Refused("cancelled".into()),
                    _ => ClaimOutcome::Network("timeout".into()),
                };
                relay.handle_claim_response(command, outcome, now);
            }
            Step::AnswerControl(o) => {
                if pending_controls.is_empty() {
                    continue;
                }
                let command = pending_controls.remove(0);
                let answer = match o % 3 {
                    0 => Ok(graph_relay_core::queue::ControlAnswer {
                        cancel_requested: false,
                        status: graph_relay_core::command::CommandStatus::Running,
                    }),
                    1 => Ok(graph_relay_core::queue::ControlAnswer {
                        cancel_requested: true,
                        status: graph_relay_core::command::CommandStatus::Running,
                    }),
                    _ => Err("timeout".to_string()),
                };
                relay.handle_control_response(command, answer, now);
            }
            Step::Finish(o) => {
                let Some(command) = running.take() else {
                    continue;
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
            Step::Stored => {
                if let Some(command) = pending_store.take() {
                    relay.handle_report_stored(command, now);
                }
            }
            Step::AnswerPost(o) => {
                if pending_posts.is_empty() {
                    continue;
                }
                let (command, declined) = pending_posts.remove(0);
                let outcome = match o % 3 {
                    0 => PostOutcome::Acknowledged,
                    1 => PostOutcome::Rejected("conflict".into()),
                    _ => PostOutcome::Retry("timeout".into()),
                };
                may_remove.insert(command, !matches!(outcome, PostOutcome::Retry(_)));
                if outcome == PostOutcome::Acknowledged && (declined || running.is_none()) {
                    closed.insert(command);
                }
                relay.handle_report_posted(command, outcome, now);
            }
            Step::Loaded(items) => {
                if !std::mem::take(&mut pending_load) {
                    continue;
                }
                let items = items
                    .into_iter()
                    .take(4)
                    .map(|(id, declined_item)| graph_relay_core::outbox::OutboxItem {
                        command: CommandId::from_uuid(uuid::Uuid::from_u128(1000 + u128::from(id))),
                        report: if declined_item {
                            RelayReport::Declined
                        } else {
                            RelayReport::Completion {
                                envelope: ResultEnvelope::build(
                                    ExecutionId::parse("exec-old").expect("valid"),
                                    FinishStatus::Completed,
                                    EnvelopeBody::default(),
                                ),
                            }
                        },
                        stored_at: t0,
                        attempts: 0,
                    })
                    .collect();
                relay.handle_outbox_loaded(items, now);
            }
            Step::Share(bits) => relay.handle_shared_set(shared_set(bits), now),
        }
    }
}
