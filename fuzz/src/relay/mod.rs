//! The relay state machine under arbitrary event orders and failures,
//! against a model server with leases, restarts and un-sharing.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use graph_relay_core::command::WAITING_FOR_APPROVAL;
use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use graph_relay_core::ids::{CommandId, ExecutionId, GraphSessionId, ProjectId};
use graph_relay_core::outbox::{OutboxItem, RelayReport};
use graph_relay_core::queue::SyncRequest;
use graph_relay_core::relay::executor::ProgressReport;
use graph_relay_core::relay::{
    APPROVED_ON_THE_DESKTOP, Action, ApprovalDecision, CANCELLED_ON_THE_DESKTOP, ClaimOutcome,
    ExecutionOutcome, Job, PostOutcome, Relay, RelayCommand, RelayConfig, RelayMode, SharedSet,
    SyncFailure,
};
use graph_relay_core::session::SessionMeta;
use graph_relay_core::testkit::{meta, p1, p2};
use graph_relay_core::time::Timestamp;
use serde_json::json;

mod answers;
mod checks;
mod parties;

use self::parties::{Closed, Desktop, InFlight, ModelServer, Seen, ServerState};

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
}
