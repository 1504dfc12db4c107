//! A reference model for random sequences of agent and relay operations.
//!
//! [`check`] applies [`Op`]s to the real [`Queue`](crate::queue::Queue) over any store and asserts,
//! after every step, what must always hold: terminal states never change, at
//! most one command per (owner, agent, key), no agent ever sees another's
//! command, no device acts on a command not assigned to it, a completion
//! applies at most once, and a cancelled command never starts. Among the
//! parties are two owners whose agents and desktops have the same names, so
//! an identity by name alone is caught.
//! The store's proptest and the fuzz target `queue_ops` both drive it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use serde_json::json;

use super::{World, exec, p1, p2, run_args};
use crate::command::{CommandRecord, CommandStatus};
use crate::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use crate::ids::CommandId;
use crate::principal::{Agent, Device};
use crate::queue::{CompleteAck, GetError, QueueConfig, RunError};
use crate::store::Store;

/// One operation by an agent or a relay. Indices are taken modulo the
/// number of parties / known commands, so any values are meaningful.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Op {
    /// An agent queues session `session % 4` with key `key % 4` and argument `arg % 2`.
    Run {
        /// Which agent.
        agent: u8,
        /// Which session.
        session: u8,
        /// Which key.
        key: u8,
        /// Which argument value.
        arg: u8,
    },
    /// An agent reads a command.
    Get {
        /// Which agent.
        agent: u8,
        /// Which known command.
        command: u8,
    },
    /// An agent cancels a command.
    Cancel {
        /// Which agent.
        agent: u8,
        /// Which known command.
        command: u8,
    },
    /// A device syncs a project with the sessions in the bit set `sessions`.
    Sync {
        /// Which device.
        device: u8,
        /// Project p1 (true) or p2.
        first_project: bool,
        /// Bits 0..3: sessions 1..=4.
        sessions: u8,
    },
    /// A device starts a command under execution `x{execution % 2}`.
    Start {
        /// Which device.
        device: u8,
        /// Which known command.
        command: u8,
        /// Which execution id.
        execution: u8,
    },
    /// A device's control poll.
    Control {
        /// Which device.
        device: u8,
        /// Which known command.
        command: u8,
    },
    /// A device completes a command.
    Complete {
        /// Which device.
        device: u8,
        /// Which known command.
        command: u8,
        /// Which execution id.
        execution: u8,
        /// completed / failed / cancelled.
        status: u8,
        /// The result value.
        result: u8,
    },
    /// A device declines a command (re-check failed).
    Decline {
        /// Which device.
        device: u8,
        /// Which known command.
        command: u8,
    },
    /// Time passes.
    Advance {
        /// Seconds.
        secs: u16,
    },
}

struct Known {
    owner: usize,
    /// The device (index) the command is assigned to.
    device: usize,
    terminal: Option<CommandRecord>,
    completions: usize,
}

/// What an observer of [`check_with`] sees after each operation, once the
/// model's own invariants held.
pub struct Step<'a> {
    /// The operation's position in the sequence.
    pub index: usize,
    /// The operation just applied.
    pub op: &'a Op,
    /// The world it was applied to: the queue, its clock and the parties.
    pub world: &'a World,
    /// Every command queued so far, in the order they were queued.
    pub commands: &'a [CommandId],
}

/// Applies `ops` to a fresh queue over `store`, asserting the invariants after each.
pub fn check(store: Arc<dyn Store>, ops: &[Op]) {
    check_with(store, ops, |_| {});
}

/// [`check`], calling `observer` after every operation so that a user can
/// assert invariants of their own (a store wrapper's counters, say) on the
/// same random sequences.
///
/// ```
/// # #[cfg(feature = "testkit")] {
/// use std::sync::Arc;
/// use graph_relay_core::testkit::model::{Op, check_with};
/// # use graph_relay_core::store::Store;
/// # fn store() -> Arc<dyn Store> { unimplemented!() }
/// let ops = [Op::Advance { secs: 1 }];
/// let mut steps = 0;
/// # if false {
/// check_with(store(), &ops, |step| {
///     steps += 1;
///     assert!(step.commands.len() <= step.index + 1);
/// });
/// # }
/// # }
/// ```
pub fn check_with(store: Arc<dyn Store>, ops: &[Op], mut observer: impl FnMut(&Step<'_>)) {
    // Keys outlive any sequence (at most 65,535 s per step, 24 h TTL is checked per key below).
    let w = World::with_config(
        store,
        QueueConfig {
            idempotency_ttl: Duration::from_secs(u64::MAX / 4_000),
            ..QueueConfig::default()
        },
    );
    // Index 3 is Bob's: an agent and a desktop named like Alice's (index 0).
    let agents: [&Agent; 4] = [&w.agent, &w.other_agent, &w.stranger, &w.twin];
    let devices: [&Device; 4] = [
        &w.device,
        &w.other_device,
        &w.stranger_device,
        &w.twin_device,
    ];
    let device_index = |c: &CommandRecord| {
        devices
            .iter()
            .position(|d| d.id == c.device && d.owner == c.owner)
            .expect("a command is assigned to a device of its owner")
    };
    let mut commands: Vec<CommandId> = Vec::new();
    let mut known: HashMap<CommandId, Known> = HashMap::new();
    let mut keys: HashMap<(usize, u8), (CommandId, u8, u8)> = HashMap::new();

    for (index, op) in ops.iter().enumerate() {
        let pick =
            |i: u8| (!commands.is_empty()).then(|| commands[usize::from(i) % commands.len()]);
        match *op {
            Op::Run {
                agent,
                session,
                key,
                arg,
            } => {
                let (agent, session, key, arg) =
                    (usize::from(agent) % 4, session % 4 + 1, key % 4, arg % 2);
                let text = format!("model-key-{key}");
                let result = block_on(w.queue.run_graph_session(
                    agents[agent],
                    run_args(u32::from(session), &text, json!({"v": arg})),
                ));
                match (result, keys.get(&(agent, key)).copied()) {
                    (Ok(ticket), Some((first, first_session, first_arg))) => {
                        assert!(ticket.replayed, "a reused key must replay");
                        assert_eq!(ticket.command.id, first, "one command per (agent, key)");
                        assert_eq!((session, arg), (first_session, first_arg));
                    }
                    (Ok(ticket), None) => {
                        assert!(!ticket.replayed, "a key of another (owner, agent) replayed");
                        assert_eq!(ticket.command.agent, agents[agent].id);
                        assert_eq!(ticket.command.owner, agents[agent].owner);
                        keys.insert((agent, key), (ticket.command.id, session, arg));
                        commands.push(ticket.command.id);
                        known.insert(
                            ticket.command.id,
                            Known {
                                owner: agent,
                                device: device_index(&ticket.command),
                                terminal: None,
                                completions: 0,
                            },
                        );
                    }
                    (
                        Err(RunError::KeyReused { command }),
                        Some((first, first_session, first_arg)),
                    ) => {
                        assert_eq!(command, first);
                        assert_ne!(
                            (session, arg),
                            (first_session, first_arg),
                            "same request must replay"
                        );
                    }
                    (Err(RunError::SessionNotFound), None) => {}
                    (other, state) => {
                        panic!("unexpected run outcome {other:?} with key state {state:?}")
                    }
                }
            }
            Op::Get { agent, command } | Op::Cancel { agent, command } => {
                let Some(id) = pick(command) else { continue };
                let agent = usize::from(agent) % 4;
                let visible = if matches!(op, Op::Cancel { .. }) {
                    block_on(w.queue.cancel_graph_run(agents[agent], &id)).is_ok()
                } else {
                    match block_on(w.queue.get_graph_run(agents[agent], &id)) {
                        Ok(_) => true,
                        Err(GetError::NotFound) => false,
                        Err(e) => panic!("{e}"),
                    }
                };
                assert_eq!(
                    visible,
                    agent == known[&id].owner,
                    "only the owning agent sees a command"
                );
            }
            Op::Sync {
                device,
                first_project,
                sessions,
            } => {
                let project = if first_project { p1() } else { p2() };
                let set: Vec<u32> = (0..4)
                    .filter(|b| sessions & (1 << b) != 0)
                    .map(|b| b + 1)
                    .collect();
                block_on(w.sync(devices[usize::from(device) % 4], project, &set));
            }
            Op::Start {
                device,
                command,
                execution,
            } => {
                let Some(id) = pick(command) else { continue };
                let frozen = known[&id].terminal.is_some();
                let index = usize::from(device) % 4;
                if let Ok(record) = block_on(w.queue.start(
                    devices[index],
                    &id,
                    &exec(&format!("x{}", execution % 2)),
                )) {
                    assert!(!frozen, "a terminal (e.g. cancelled) command never starts");
                    assert_eq!(record.status, CommandStatus::Running);
                    assert_eq!(index, known[&id].device, "only its own device starts it");
                }
            }
            Op::Control { device, command } => {
                let Some(id) = pick(command) else { continue };
                let index = usize::from(device) % 4;
                let answered = block_on(w.queue.control(devices[index], &id)).is_ok();
                assert_eq!(
                    answered,
                    index == known[&id].device,
                    "control by its own device only"
                );
            }
            Op::Complete {
                device,
                command,
                execution,
                status,
                result,
            } => {
                let Some(id) = pick(command) else { continue };
                let status = [
                    FinishStatus::Completed,
                    FinishStatus::Failed,
                    FinishStatus::Cancelled,
                ][usize::from(status % 3)];
                let envelope = ResultEnvelope::build(
                    exec(&format!("x{}", execution % 2)),
                    status,
                    EnvelopeBody {
                        result: json!(result),
                        ..EnvelopeBody::default()
                    },
                );
                let index = usize::from(device) % 4;
                if let Ok(CompleteAck::Recorded(_)) =
                    block_on(w.queue.complete(devices[index], &id, &envelope))
                {
                    let k = known.get_mut(&id).expect("known command");
                    assert_eq!(index, k.device, "only its own device completes it");
                    k.completions += 1;
                    assert_eq!(k.completions, 1, "a completion applies at most once");
                }
            }
            Op::Decline { device, command } => {
                let Some(id) = pick(command) else { continue };
                let index = usize::from(device) % 4;
                if block_on(w.queue.decline(devices[index], &id)).is_ok() {
                    assert_eq!(index, known[&id].device, "only its own device declines it");
                }
            }
            Op::Advance { secs } => w.clock.advance(Duration::from_secs(u64::from(secs))),
        }

        for (id, k) in known.iter_mut() {
            let now = block_on(w.queue.get_graph_run(agents[k.owner], id))
                .expect("the owner always sees its command")
                .command;
            if let Some(frozen) = &k.terminal {
                assert_eq!(&now, frozen, "terminal states never change");
            } else if now.status.is_terminal() {
                k.terminal = Some(now);
            }
            for (other, agent) in agents.iter().enumerate() {
                if other != k.owner {
                    assert!(matches!(
                        block_on(w.queue.get_graph_run(agent, id)),
                        Err(GetError::NotFound)
                    ));
                }
            }
        }
        observer(&Step {
            index,
            op,
            world: &w,
            commands: &commands,
        });
    }
    let distinct: BTreeSet<_> = keys.values().map(|(id, _, _)| *id).collect();
    assert_eq!(
        distinct.len(),
        keys.len(),
        "every (owner, agent, key) has its own command"
    );
}

/// The proptest strategy of [`Op`] the project's own property test uses
/// (feature `proptest`): agents, devices, sessions, keys and executions
/// drawn from small ranges so that operations collide, time steps up to two
/// minutes so that leases lapse.
///
/// ```
/// # #[cfg(feature = "proptest")] {
/// use proptest::prelude::*;
/// use graph_relay_core::testkit::model::strategy;
/// let ops = proptest::collection::vec(strategy::op(), 1..60);
/// # let _ = ops;
/// # }
/// ```
#[cfg(feature = "proptest")]
pub mod strategy {
    use proptest::prelude::*;

    use super::Op;

    /// One operation.
    pub fn op() -> impl Strategy<Value = Op> {
        let small = || 0..6u8;
        prop_oneof![
            3 => (small(), small(), small(), small())
                .prop_map(|(agent, session, key, arg)| Op::Run { agent, session, key, arg }),
            2 => (small(), any::<u8>()).prop_map(|(agent, command)| Op::Get { agent, command }),
            2 => (small(), any::<u8>()).prop_map(|(agent, command)| Op::Cancel { agent, command }),
            2 => (small(), any::<bool>(), 0..16u8)
                .prop_map(|(device, first_project, sessions)| Op::Sync { device, first_project, sessions }),
            3 => (small(), any::<u8>(), small())
                .prop_map(|(device, command, execution)| Op::Start { device, command, execution }),
            1 => (small(), any::<u8>()).prop_map(|(device, command)| Op::Control { device, command }),
            3 => (small(), any::<u8>(), small(), small(), small()).prop_map(
                |(device, command, execution, status, result)| Op::Complete {
                    device,
                    command,
                    execution,
                    status,
                    result,
                }
            ),
            1 => (small(), any::<u8>()).prop_map(|(device, command)| Op::Decline { device, command }),
            1 => (0..120u16).prop_map(|secs| Op::Advance { secs }),
        ]
    }

    /// A sequence of 1 to `max` operations.
    pub fn ops(max: usize) -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(op(), 1..max.max(2))
    }
}
