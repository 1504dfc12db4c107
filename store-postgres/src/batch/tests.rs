//! The batching on a real server: what goes together, and what each
//! request is told.
//!
//! Each test runs on a current-thread runtime, where the requests that one
//! `join_all` starts are all queued before any of them runs: the first
//! takes a lane, lets the scheduler run once (the others queue meanwhile)
//! and leads them all as one batch. So the statements a test counts are
//! exact.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use graph_relay_core::command::{CommandRecord, CommandStatus};
use graph_relay_core::ids::IdempotencyKey;
use graph_relay_core::store::{GuardedInsert, IdempotencyRecord, InsertOutcome, Store, StoreError};
use graph_relay_core::testkit::{World, exec, gs, p1, p2};
use graph_relay_core::time::Clock;

use crate::PostgresStore;
use crate::rows::millis;
use crate::testing::{TestSchema, url};

fn block_on<F: std::future::Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
        .block_on(test)
}

/// Command `n` of the world's agent and its key (`template-n`).
fn command(w: &World, n: u128) -> (CommandRecord, IdempotencyRecord) {
    let command = w.sync_template(n);
    let key = IdempotencyRecord {
        owner: command.owner.clone(),
        agent: command.agent.clone(),
        key: command.idempotency_key.clone(),
        command: command.id,
        fingerprint: format!("f-{n}"),
        expires_at: w.clock.now().plus(Duration::from_secs(60)),
    };
    (command, key)
}

/// `command` started: the swap from revision 0 to 1.
fn started(command: &CommandRecord) -> CommandRecord {
    let mut next = command.clone();
    next.revision = 1;
    next.status = CommandStatus::Running;
    next.execution_id = Some(exec("x"));
    next
}

async fn insert_all(
    store: &PostgresStore,
    w: &World,
    ns: impl Iterator<Item = u128>,
) -> Vec<CommandRecord> {
    let rows: Vec<_> = ns.map(|n| command(w, n)).collect();
    let now = w.clock.now();
    let outcomes = join_all(rows.iter().map(|(c, k)| store.insert_command(c, k, now))).await;
    for outcome in outcomes {
        assert_eq!(outcome.expect("insert"), InsertOutcome::Inserted);
    }
    rows.into_iter().map(|(c, _)| c).collect()
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn concurrent_inserts_are_one_statement() {
    let schema = TestSchema::new(&url());
    block_on(async {
        let store = schema.store().await.expect("connect");
        let w = World::new(Arc::new(store.clone()));
        let before = store.statements_executed();
        insert_all(&store, &w, 1..=16).await;
        assert_eq!(
            store.statements_executed() - before,
            1,
            "16 inserts in flight at once are one batch"
        );
        assert_eq!(store.command_count().await.expect("count"), 16);
    });
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn a_failed_swap_in_a_batch_fails_alone() {
    let schema = TestSchema::new(&url());
    block_on(async {
        let store = schema.store().await.expect("connect");
        let w = World::new(Arc::new(store.clone()));
        let commands = insert_all(&store, &w, 1..=8).await;
        // Every command starts, except: the last update names a revision
        // the command does not have, and two rivals race to start command
        // 7; all of them are in the batch.
        let mut updates: Vec<CommandRecord> = commands[..7].iter().map(started).collect();
        let mut rival = started(&commands[6]);
        rival.execution_id = Some(exec("rival"));
        updates.push(rival);
        let mut stale = started(&commands[7]);
        stale.revision = 5;
        updates.push(stale);

        let before = store.statements_executed();
        let outcomes: Vec<bool> = join_all(updates.iter().map(|u| store.update_command(u)))
            .await
            .into_iter()
            .map(|o| o.expect("no backend error"))
            .collect();
        assert_eq!(store.statements_executed() - before, 1, "one batch");
        assert_eq!(outcomes[..6], [true; 6]);
        assert_eq!(
            u8::from(outcomes[6]) + u8::from(outcomes[7]),
            1,
            "one of the rivals wins: {outcomes:?}"
        );
        assert!(!outcomes[8], "a stale revision writes nothing");

        for (n, command) in commands.iter().enumerate() {
            let stored = store
                .command_for_agent(&w.agent.owner, &w.agent.id, &command.id)
                .await
                .expect("read")
                .expect("exists");
            match n {
                6 => assert_eq!(
                    stored,
                    if outcomes[6] {
                        &updates[6]
                    } else {
                        &updates[7]
                    }
                    .clone()
                ),
                7 => assert_eq!(&stored, command, "untouched"),
                _ => assert_eq!(stored, updates[n]),
            }
        }
    });
}

/// Inserts guarded by their share (`insert_command_if_shared`) in one
/// batch: each is judged on its own share, a changed one writes neither
/// command nor key, and the rest of the batch commits.
#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn guarded_inserts_in_a_batch_are_judged_each_alone() {
    let schema = TestSchema::new(&url());
    block_on(async {
        let store = schema.store().await.expect("connect");
        let w = World::new(Arc::new(store.clone()));
        // The desktop shares session 1 to p1 as `graph-1`.
        w.sync(&w.device, p1(), &[1]).await;
        let rows: Vec<_> = (1..=9)
            .map(|n| {
                let (mut command, key) = command(&w, n);
                command.slug = "graph-1".into();
                match n {
                    7 => command.slug = "another-graph".into(),
                    8 => command.device = w.other_device.id.clone(),
                    _ => {}
                }
                (command, key)
            })
            .collect();
        let now = w.clock.now();
        let projects = [p1()];
        let before = store.statements_executed();
        let outcomes = join_all(rows.iter().map(|(c, k)| async {
            if c.id.as_uuid().as_u128() == 9 {
                store
                    .insert_command(c, k, now)
                    .await
                    .map(GuardedInsert::Checked)
            } else {
                store.insert_command_if_shared(c, k, &projects, now).await
            }
        }))
        .await;
        // One insert alone, then one batch; each of the two refused ones
        // then reads its key and the share (their look-ups may share a
        // statement).
        let sent = store.statements_executed() - before;
        assert!((5..=6).contains(&sent), "{sent} statements");
        for ((command, _), outcome) in rows.iter().zip(outcomes) {
            let n = command.id.as_uuid().as_u128();
            let expected = if matches!(n, 7 | 8) {
                GuardedInsert::SessionChanged
            } else {
                GuardedInsert::Checked(InsertOutcome::Inserted)
            };
            assert_eq!(outcome.expect("no backend error"), expected, "command {n}");
            let stored = store
                .command_for_agent(&w.agent.owner, &w.agent.id, &command.id)
                .await
                .expect("read");
            assert_eq!(stored.is_some(), !matches!(n, 7 | 8), "command {n}");
        }
        // Nor was a refused insert's key written: unguarded, it goes in.
        let (command, key) = &rows[6];
        assert_eq!(
            store
                .insert_command(command, key, now)
                .await
                .expect("insert"),
            InsertOutcome::Inserted
        );
    });
}

/// Guarded inserts with different sessions and project lists, in one
/// batch and then each alone: each session resolves in its own insert's
/// projects, in their order, then to the smallest device, as the share
/// look-up resolves it. Each insert is tried once: a refusal is not
/// judged again by a fresh look-up, which would retry an insert that the
/// statement refused wrongly and so hide it.
#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn guarded_inserts_resolve_each_session_in_its_own_projects() {
    let schema = TestSchema::new(&url());
    block_on(async {
        let store = schema.store().await.expect("connect");
        let w = World::new(Arc::new(store.clone()));
        let (desktop, laptop) = (&w.device, &w.other_device);
        // Shares: session 1 in p2 by the desktop and in p1 by the laptop;
        // session 2 in p1 by both.
        w.sync(desktop, p2(), &[1]).await;
        w.sync(desktop, p1(), &[2]).await;
        w.sync(laptop, p1(), &[1, 2]).await;
        // (session, project, device, the agent's projects, written?)
        let cases = [
            (1, p2(), desktop, vec![p2(), p1()], true),
            (1, p1(), laptop, vec![p2(), p1()], false),
            (1, p1(), laptop, vec![p1(), p2()], true),
            (2, p1(), desktop, vec![p1()], true),
            (2, p1(), laptop, vec![p1()], false),
            (3, p1(), desktop, vec![p1(), p2()], false),
            (1, p2(), desktop, vec![p1()], false),
        ];
        let now = millis(w.clock.now()).expect("a time in ms");
        let commands = |first: u128| -> Vec<_> {
            (first..)
                .zip(&cases)
                .map(|(n, (session, project, device, _, _))| {
                    let (mut command, key) = command(&w, n);
                    command.graph_session_id = gs(*session);
                    command.slug = format!("graph-{session}").into();
                    command.project = project.clone();
                    command.device = device.id.clone();
                    (command, key)
                })
                .collect()
        };
        let check = async |rows: &[(CommandRecord, IdempotencyRecord)],
                           wrote: Vec<Result<bool, StoreError>>| {
            for (((command, _), wrote), case) in rows.iter().zip(wrote).zip(&cases) {
                let expected = case.4;
                assert_eq!(wrote.expect("no backend error"), expected, "{case:?}");
                let stored = store
                    .command_for_agent(&w.agent.owner, &w.agent.id, &command.id)
                    .await
                    .expect("read");
                assert_eq!(stored.is_some(), expected, "{case:?}");
            }
        };

        let batched = commands(1);
        let before = store.statements_executed();
        let wrote = join_all(
            batched
                .iter()
                .zip(&cases)
                .map(|((c, k), case)| store.insert_once(c, k, Some(&case.3), now)),
        )
        .await;
        assert_eq!(store.statements_executed() - before, 1, "one batch");
        check(&batched, wrote).await;

        let alone = commands(101);
        let mut wrote = Vec::new();
        for ((c, k), case) in alone.iter().zip(&cases) {
            wrote.push(store.insert_once(c, k, Some(&case.3), now).await);
        }
        check(&alone, wrote).await;
    });
}

/// The writes of runs at different steps (new runs, starts, results) in
/// flight together commit as one statement, and each hears its own outcome.
#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn inserts_and_swaps_in_flight_together_are_one_statement() {
    let schema = TestSchema::new(&url());
    block_on(async {
        let store = schema.store().await.expect("connect");
        let w = World::new(Arc::new(store.clone()));
        let queued = insert_all(&store, &w, 1..=8).await;
        let mut swaps: Vec<CommandRecord> = queued.iter().map(started).collect();
        // A stale revision in the batch writes nothing, alone.
        swaps[7].revision = 5;
        let fresh: Vec<_> = (10..18).map(|n| command(&w, n)).collect();
        let now = w.clock.now();
        let before = store.statements_executed();
        let (inserted, swapped) = futures::join!(
            join_all(fresh.iter().map(|(c, k)| store.insert_command(c, k, now))),
            join_all(swaps.iter().map(|u| store.update_command(u))),
        );
        assert_eq!(
            store.statements_executed() - before,
            1,
            "the inserts and swaps together"
        );
        for outcome in inserted {
            assert_eq!(outcome.expect("insert"), InsertOutcome::Inserted);
        }
        let swapped: Vec<bool> = swapped.into_iter().map(|o| o.expect("swap")).collect();
        assert_eq!(swapped, [true, true, true, true, true, true, true, false]);
        for (n, command) in queued.iter().enumerate() {
            let stored = store
                .command_for_agent(&w.agent.owner, &w.agent.id, &command.id)
                .await
                .expect("read")
                .expect("exists");
            assert_eq!(&stored, if n < 7 { &swaps[n] } else { command });
        }
        for (command, _) in &fresh {
            let stored = store
                .command_for_agent(&w.agent.owner, &w.agent.id, &command.id)
                .await
                .expect("read");
            assert_eq!(stored.as_ref(), Some(command));
        }
    });
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn inserts_under_one_key_take_turns_across_batches() {
    let schema = TestSchema::new(&url());
    block_on(async {
        let store = schema.store().await.expect("connect");
        let w = World::new(Arc::new(store.clone()));
        let key = IdempotencyKey::parse("one-key-for-all").expect("key");
        let rows: Vec<_> = (1..=8)
            .map(|n| {
                let (mut c, mut k) = command(&w, n);
                c.idempotency_key = key.clone();
                k.key = key.clone();
                (c, k)
            })
            .collect();
        let now = w.clock.now();
        let outcomes = join_all(rows.iter().map(|(c, k)| store.insert_command(c, k, now))).await;
        let winners: Vec<_> = outcomes
            .iter()
            .zip(&rows)
            .filter(|(o, _)| matches!(o, Ok(InsertOutcome::Inserted)))
            .map(|(_, (c, _))| c.id)
            .collect();
        assert_eq!(winners.len(), 1, "{outcomes:?}");
        for outcome in outcomes {
            match outcome.expect("no backend error") {
                InsertOutcome::Inserted => {}
                InsertOutcome::KeyTaken(existing) => assert_eq!(existing.command, winners[0]),
            }
        }
        assert_eq!(store.command_count().await.expect("count"), 1);
    });
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn a_refused_batch_runs_again_write_by_write() {
    let schema = TestSchema::new(&url());
    block_on(async {
        let store = schema.store().await.expect("connect");
        let w = World::new(Arc::new(store.clone()));
        let existing = insert_all(&store, &w, 1..=1).await.remove(0);
        // The batch holds good inserts around one that reuses the id of a
        // stored command under a fresh key, which makes the server refuse
        // the whole statement.
        let mut rows = vec![command(&w, 10), command(&w, 20)];
        let (mut clash, mut clash_key) = command(&w, 21);
        clash.id = existing.id;
        clash_key.command = existing.id;
        rows.push((clash, clash_key.clone()));
        rows.push(command(&w, 22));
        let now = w.clock.now();
        let outcomes = join_all(rows.iter().map(|(c, k)| store.insert_command(c, k, now))).await;
        let last = outcomes.len() - 1;
        for (n, outcome) in outcomes.iter().enumerate() {
            if n == last - 1 {
                assert!(
                    matches!(outcome, Err(StoreError::Backend(_))),
                    "{outcome:?}"
                );
            } else {
                assert!(
                    matches!(outcome, Ok(InsertOutcome::Inserted)),
                    "{n}: {outcome:?}"
                );
            }
        }
        // The refused write left nothing behind: not its key either.
        let key = store
            .idempotency(&clash_key.owner, &clash_key.agent, &clash_key.key, now)
            .await
            .expect("read key");
        assert_eq!(key, None);
        assert_eq!(
            store.command_count().await.expect("count"),
            1 + rows.len() as u64 - 1
        );
    });
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn without_a_connection_every_waiter_hears_a_backend_error() {
    let schema = TestSchema::new(&url());
    block_on(async {
        let options = crate::PostgresOptions {
            pool_size: 1,
            connect_timeout: Duration::from_millis(200),
            ..schema.options()
        };
        let store = PostgresStore::connect(schema.url(), &options)
            .await
            .expect("connect");
        let w = World::new(Arc::new(store.clone()));
        let commands = insert_all(&store, &w, 1..=6).await;
        let updates: Vec<_> = commands.iter().map(started).collect();
        // The pool's only connection is taken: no write can get one.
        let taken = store.pool().get().await.expect("the only connection");
        let outcomes = join_all(updates.iter().map(|u| store.update_command(u))).await;
        assert_eq!(outcomes.len(), updates.len());
        for outcome in outcomes {
            assert!(
                matches!(outcome, Err(StoreError::Backend(_))),
                "{outcome:?}"
            );
        }
        drop(taken);
        // The same writes succeed once a connection is free again.
        let outcomes = join_all(updates.iter().map(|u| store.update_command(u))).await;
        assert!(outcomes.into_iter().all(|o| o.expect("written")));
    });
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn a_store_outlives_the_runtime_that_started_its_batches() {
    let schema = TestSchema::new(&url());
    let (store, w) = block_on(async {
        let store = schema.store().await.expect("connect");
        let w = World::new(Arc::new(store.clone()));
        // A batch led on this runtime, and one drained by a task of it.
        let (_, _) = futures::join!(insert_all(&store, &w, 1..=4), async {
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            insert_all(&store, &w, 5..=8).await
        });
        (store, w)
    });
    block_on(async {
        insert_all(&store, &w, 11..=18).await;
        assert_eq!(store.command_count().await.expect("count"), 16);
    });
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn concurrent_look_ups_are_one_statement_per_kind() {
    let schema = TestSchema::new(&url());
    block_on(async {
        let store = schema.store().await.expect("connect");
        let w = World::new(Arc::new(store.clone()));
        w.sync(&w.device, p1(), &[1, 2]).await;
        // One after the other, so that their queue order is known.
        let mut commands = Vec::new();
        for n in 1..=12 {
            commands.extend(insert_all(&store, &w, n..=n).await);
        }
        let owner = &w.agent.owner;
        let project = [p1()];
        let (found_ids, missing_id) = ([gs(2), gs(1)], gs(1));

        // A batch of every kind of look-up, some of them the same.
        let again = (0..2).map(|n| store.command_for_agent(owner, &w.agent.id, &commands[n].id));
        let before = store.statements_executed();
        let (again, by_agent, by_device, by_owner, queued, found, missing) = futures::join!(
            join_all(again),
            join_all(
                commands
                    .iter()
                    .map(|c| store.command_for_agent(owner, &w.agent.id, &c.id))
            ),
            // Another device's commands look like unknown ones.
            join_all(commands.iter().map(|c| store.command_for_device(
                owner,
                &w.other_device.id,
                &c.id
            ))),
            store.command_for_owner(owner, &commands[3].id),
            join_all([&w.device, &w.other_device].map(|d| store.queued_commands(
                owner,
                &project[0],
                &d.id,
                5
            ))),
            join_all(
                found_ids
                    .iter()
                    .map(|id| store.find_shared_session(owner, &project, id))
            ),
            store.find_shared_session(&w.twin.owner, &project, &missing_id),
        );
        assert_eq!(
            store.statements_executed() - before,
            3,
            "one statement per kind of look-up"
        );
        for (found, command) in again.into_iter().zip(&commands) {
            assert_eq!(found.expect("read").as_ref(), Some(command));
        }
        for (found, command) in by_agent.into_iter().zip(&commands) {
            assert_eq!(found.expect("read").as_ref(), Some(command));
        }
        assert!(by_device.into_iter().all(|c| c.expect("read").is_none()));
        assert_eq!(by_owner.expect("read").as_ref(), Some(&commands[3]));
        let [mine, theirs] = <[_; 2]>::try_from(queued).expect("two");
        assert_eq!(
            mine.expect("read"),
            commands[..5].to_vec(),
            "oldest first, at most 5"
        );
        assert_eq!(theirs.expect("read"), Vec::new());
        for (session, id) in found.into_iter().zip(&found_ids) {
            let session = session.expect("read").expect("shared");
            assert_eq!(&session.meta.graph_session_id, id);
            assert_eq!(session.device, w.device.id);
        }
        assert_eq!(
            missing.expect("read"),
            None,
            "another owner's project of the same name"
        );
    });
}

/// Requests that arrive while a batch runs wait for it, then go together
/// as the next batch (taken by a draining task).
#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn requests_arriving_during_a_batch_are_the_next_batch() {
    let schema = TestSchema::new(&url());
    block_on(async {
        let store = schema.store().await.expect("connect");
        let w = World::new(Arc::new(store.clone()));
        let before = store.statements_executed();
        let (first, second) = futures::join!(insert_all(&store, &w, 1..=4), async {
            // The first batch's leader takes its batch and sends it.
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            insert_all(&store, &w, 5..=12).await
        });
        assert_eq!((first.len(), second.len()), (4, 8));
        assert_eq!(store.statements_executed() - before, 2, "two batches");
        assert_eq!(store.command_count().await.expect("count"), 12);
    });
}

/// A leader whose caller stops waiting while its batch runs (a client
/// that hung up) does not take the other requests' answers with it: the
/// batch finishes in a task of its own, its write included.
#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn a_leader_that_stops_waiting_leaves_its_batch_to_finish() {
    let schema = TestSchema::new(&url());
    block_on(async {
        let store = schema.store().await.expect("connect");
        let w = World::new(Arc::new(store.clone()));
        let rows: Vec<_> = (1..=6).map(|n| command(&w, n)).collect();
        let now = w.clock.now();
        let (leader, others) = rows.split_first().expect("rows");
        let mut leader = Box::pin(store.insert_command(&leader.0, &leader.1, now));
        let mut others = Box::pin(join_all(
            others.iter().map(|(c, k)| store.insert_command(c, k, now)),
        ));
        // The leader takes the lane and lets the others queue; then it
        // takes them all and sends the batch.
        assert!(futures::poll!(leader.as_mut()).is_pending());
        assert!(futures::poll!(others.as_mut()).is_pending());
        assert!(futures::poll!(leader.as_mut()).is_pending());
        drop(leader);
        for outcome in others.await {
            assert_eq!(outcome.expect("insert"), InsertOutcome::Inserted);
        }
        assert_eq!(store.command_count().await.expect("count"), 6);
    });
}
