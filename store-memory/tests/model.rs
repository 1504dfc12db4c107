//! Model-based test: random sequences of agent and relay operations applied
//! to `Queue` + `MemoryStore`, checked after every step against a small
//! reference model of what must always hold.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use graph_relay_core::command::{CommandRecord, CommandStatus};
use graph_relay_core::envelope::{EnvelopeBody, FinishStatus, ResultEnvelope};
use graph_relay_core::ids::{CommandId, IdempotencyKey};
use graph_relay_core::principal::{Agent, Device};
use graph_relay_core::queue::{CompleteAck, GetError, QueueConfig, RunError};
use graph_relay_core::testkit::{World, exec, p1, p2, run_args};
use graph_relay_store_memory::MemoryStore;
use proptest::prelude::*;
use serde_json::json;

#[derive(Debug, Clone)]
enum Op {
    Run {
        agent: usize,
        session: u32,
        key: u8,
        arg: u8,
    },
    Get {
        agent: usize,
        command: usize,
    },
    Cancel {
        agent: usize,
        command: usize,
    },
    Sync {
        device: usize,
        project: bool,
        sessions: std::collections::BTreeSet<u32>,
    },
    Start {
        device: usize,
        command: usize,
        execution: u8,
    },
    Control {
        device: usize,
        command: usize,
    },
    Complete {
        device: usize,
        command: usize,
        execution: u8,
        status: u8,
        result: u8,
    },
    Decline {
        device: usize,
        command: usize,
    },
    Advance {
        secs: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, 1..4u32, 0..4u8, 0..2u8).prop_map(|(agent, session, key, arg)| Op::Run { agent, session, key, arg }),
        2 => (0..3usize, 0..12usize).prop_map(|(agent, command)| Op::Get { agent, command }),
        2 => (0..3usize, 0..12usize).prop_map(|(agent, command)| Op::Cancel { agent, command }),
        2 => (0..3usize, any::<bool>(), proptest::collection::btree_set(1..4u32, 0..3))
            .prop_map(|(device, project, sessions)| Op::Sync { device, project, sessions }),
        3 => (0..3usize, 0..12usize, 0..2u8).prop_map(|(device, command, execution)| Op::Start { device, command, execution }),
        1 => (0..3usize, 0..12usize).prop_map(|(device, command)| Op::Control { device, command }),
        3 => (0..3usize, 0..12usize, 0..2u8, 0..3u8, 0..2u8)
            .prop_map(|(device, command, execution, status, result)| Op::Complete { device, command, execution, status, result }),
        1 => (0..3usize, 0..12usize).prop_map(|(device, command)| Op::Decline { device, command }),
        1 => (0..120u16).prop_map(|secs| Op::Advance { secs }),
    ]
}

/// What the model remembers of each command.
struct Known {
    owner: usize,
    terminal: Option<CommandRecord>,
    completions_applied: usize,
}

fn check(ops: Vec<Op>) {
    // Keys live longer than any generated sequence, so a key never expires mid-test.
    let w = World::with_config(Arc::new(MemoryStore::new()), QueueConfig::default());
    let agents: [&Agent; 3] = [&w.agent, &w.other_agent, &w.stranger];
    let devices: [&Device; 3] = [&w.device, &w.other_device, &w.stranger_device];
    let mut commands: Vec<CommandId> = Vec::new();
    let mut known: HashMap<CommandId, Known> = HashMap::new();
    let mut keys: HashMap<(usize, u8), (CommandId, u8, u32)> = HashMap::new();

    for op in ops {
        let pick = |i: usize| commands.get(i % commands.len().max(1)).copied();
        match op {
            Op::Run {
                agent,
                session,
                key,
                arg,
            } => {
                let key_text = format!("model-key-{key}");
                let result = block_on(w.queue.run_graph_session(
                    agents[agent],
                    run_args(session, &key_text, json!({"v": arg})),
                ));
                match (result, keys.get(&(agent, key))) {
                    (Ok(ticket), Some(&(first, first_arg, first_session))) => {
                        assert!(ticket.replayed);
                        assert_eq!(ticket.command.id, first, "one command per (agent, key)");
                        assert_eq!((arg, session), (first_arg, first_session));
                    }
                    (Ok(ticket), None) => {
                        assert!(!ticket.replayed);
                        assert_eq!(ticket.command.agent, agents[agent].id);
                        keys.insert((agent, key), (ticket.command.id, arg, session));
                        commands.push(ticket.command.id);
                        known.insert(
                            ticket.command.id,
                            Known {
                                owner: agent,
                                terminal: None,
                                completions_applied: 0,
                            },
                        );
                    }
                    (
                        Err(RunError::KeyReused { command }),
                        Some(&(first, first_arg, first_session)),
                    ) => {
                        assert_eq!(command, first);
                        assert_ne!((arg, session), (first_arg, first_session));
                    }
                    (Err(RunError::SessionNotFound), None) => {}
                    (other, k) => panic!("unexpected run outcome {other:?} with key state {k:?}"),
                }
            }
            Op::Get { agent, command } | Op::Cancel { agent, command } => {
                let Some(id) = pick(command) else { continue };
                let owner = known[&id].owner;
                let cancel = matches!(op, Op::Cancel { .. });
                let visible = if cancel {
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
                    agent == owner,
                    "only the owning agent sees a command"
                );
            }
            Op::Sync {
                device,
                project,
                sessions,
            } => {
                let project = if project { p1() } else { p2() };
                let sessions: Vec<u32> = sessions.into_iter().collect();
                block_on(w.sync(devices[device], project, &sessions));
            }
            Op::Start {
                device,
                command,
                execution,
            } => {
                let Some(id) = pick(command) else { continue };
                let before = known[&id].terminal.clone();
                if let Ok(rec) = block_on(w.queue.start(
                    devices[device],
                    &id,
                    &exec(&format!("x{execution}")),
                )) {
                    assert!(
                        before.is_none(),
                        "a terminal (e.g. cancelled) command never starts"
                    );
                    assert_eq!(rec.status, CommandStatus::Running);
                    assert_eq!(rec.device, devices[device].id);
                }
            }
            Op::Control { device, command } => {
                let Some(id) = pick(command) else { continue };
                let _ = block_on(w.queue.control(devices[device], &id));
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
                ][status as usize];
                let envelope = ResultEnvelope::build(
                    exec(&format!("x{execution}")),
                    status,
                    EnvelopeBody {
                        result: json!(result),
                        ..EnvelopeBody::default()
                    },
                );
                if let Ok(CompleteAck::Recorded(_)) =
                    block_on(w.queue.complete(devices[device], &id, &envelope))
                {
                    let k = known.get_mut(&id).expect("known");
                    k.completions_applied += 1;
                    assert_eq!(
                        k.completions_applied, 1,
                        "a completion applies at most once"
                    );
                }
            }
            Op::Decline { device, command } => {
                let Some(id) = pick(command) else { continue };
                let _ = block_on(w.queue.decline(devices[device], &id));
            }
            Op::Advance { secs } => w.clock.advance(Duration::from_secs(u64::from(secs))),
        }

        // Invariants over every known command, after every step.
        for (id, k) in known.iter_mut() {
            let now = block_on(w.queue.get_graph_run(agents[k.owner], id))
                .expect("owner always sees it")
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
    }
    let _ = IdempotencyKey::parse("unused-check");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn queue_keeps_its_invariants(ops in proptest::collection::vec(op(), 1..60)) {
        check(ops);
    }
}
