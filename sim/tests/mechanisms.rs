//! Tests that pin mechanisms of the simulated system, not figures.

use std::time::Duration;

use futures::executor::block_on;
use graph_relay_core::args::RunArgs;
use graph_relay_core::command::{CommandStatus, DESKTOP_RESTARTED, LEASE_LAPSED};
use graph_relay_core::ids::{CommandId, IdempotencyKey};
use graph_relay_core::relay::RelayMode;
use graph_relay_sim::experiments::{self, RESTART_AFTER};
use graph_relay_sim::rng::SimRng;
use graph_relay_sim::world::{START, World, WorldConfig};

fn queue(w: &mut World, n: u32) -> CommandId {
    let args = RunArgs {
        graph_session_id: w.session.clone(),
        arguments: Default::default(),
        idempotency_key: IdempotencyKey::parse(&format!("mech-key-{n:04}")).expect("key"),
    };
    block_on(w.queue.run_graph_session(&w.agent, args))
        .expect("run")
        .command
        .id
}

#[test]
fn same_seed_prints_byte_identical_output() {
    let render = |seed| {
        let outcomes = vec![
            experiments::pickup(seed, 60),
            experiments::five_at_once(seed),
            experiments::polling(seed, 15),
            experiments::cancellation(seed, 60),
            experiments::idempotency(seed, 20, 2),
            experiments::offline(seed),
            experiments::result_size(),
            experiments::second_agent(seed, 20),
            experiments::desktop_dies(seed, 10),
        ];
        (
            graph_relay_sim::render_text(&outcomes, seed),
            graph_relay_sim::render_json(&outcomes, seed).to_string(),
        )
    };
    let (a, b) = (render(7), render(7));
    assert_eq!(a, b);
    assert_ne!(a.0, render(8).0, "another seed gives other figures");
}

#[test]
fn interval_mode_never_waits_more_than_one_interval_for_pickup() {
    for seed in 0..40 {
        let mut w = World::new(WorldConfig {
            mode: RelayMode::Interval,
            relay_start: Duration::from_millis(seed * 487 % 20_000),
            seed,
            ..WorldConfig::default()
        });
        w.run_until(START.plus(Duration::from_secs(20)));
        let id = queue(&mut w, 1);
        let limit = w.now().plus(Duration::from_secs(60));
        w.run_while(limit, |w| {
            w.command(&w.agent, &id)
                .is_some_and(|c| c.started_at.is_some())
        });
        let c = w.command(&w.agent, &id).expect("visible");
        let wait = c.started_at.expect("started").since(c.created_at);
        // One interval plus the request round trips (25 ms each way).
        assert!(
            wait <= Duration::from_millis(20_000 + 100),
            "waited {wait:?}"
        );
    }
}

#[test]
fn a_run_cancelled_while_queued_never_reaches_the_executor() {
    for mode in [RelayMode::Interval, RelayMode::LongPoll] {
        let mut w = World::new(WorldConfig {
            mode,
            relay_start: Duration::from_secs(30),
            ..WorldConfig::default()
        });
        let id = queue(&mut w, 1);
        let view = block_on(w.queue.cancel_graph_run(&w.agent, &id)).expect("cancel");
        assert_eq!(view.command.status, CommandStatus::Cancelled);
        assert_eq!(
            view.command.finished_at,
            Some(w.now()),
            "terminal after 0 s"
        );
        w.run_until(START.plus(Duration::from_secs(300)));
        assert!(w.executions.is_empty(), "{mode:?}: {:?}", w.executions);
    }
}

#[test]
fn a_lost_completion_is_delivered_only_with_the_outbox_and_otherwise_the_lease_ends_the_run() {
    for mode in [RelayMode::Interval, RelayMode::LongPoll] {
        for outbox in [true, false] {
            let mut w = World::new(WorldConfig {
                mode,
                outbox,
                ..WorldConfig::default()
            });
            w.lose_next_posts(1);
            let id = queue(&mut w, 1);
            w.run_until(START.plus(Duration::from_secs(3600)));
            assert_eq!(w.executions.len(), 1);
            let c = w.command(&w.agent, &id).expect("visible");
            if outbox {
                assert_eq!(c.status, CommandStatus::Completed, "{mode:?}");
            } else {
                // The result is lost, but the run does not stay `running`.
                assert_eq!(c.status, CommandStatus::Failed, "{mode:?}");
                assert!(
                    c.reason
                        .as_deref()
                        .is_some_and(|r| r.starts_with(LEASE_LAPSED)),
                    "{mode:?}: {c:?}"
                );
            }
        }
    }
}

#[test]
fn a_desktop_that_dies_mid_run_fails_it_within_the_lease_or_at_its_restart() {
    for (mode, lease) in [
        (RelayMode::Interval, Duration::from_secs(30)),
        (RelayMode::LongPoll, Duration::from_secs(60)),
    ] {
        let mut rng = SimRng::new(11);
        for _ in 0..25 {
            let death = experiments::dies_mid_run(mode, None, &mut rng).expect("started");
            assert_eq!(death.status, CommandStatus::Failed, "{mode:?}");
            assert!(death.reason.starts_with(LEASE_LAPSED), "{death:?}");
            // The sweep runs once a second and wakes the waiting agent (plus
            // the 25 ms a control request sent just before the death took).
            assert!(
                death.learned_after <= lease + Duration::from_millis(1100),
                "{mode:?}: {death:?}"
            );
            assert!(death.learned_after >= death.closed_after, "{death:?}");

            let death =
                experiments::dies_mid_run(mode, Some(RESTART_AFTER), &mut rng).expect("started");
            assert_eq!(death.status, CommandStatus::Failed, "{mode:?}");
            if death.reason.starts_with(DESKTOP_RESTARTED) {
                // The first sync of the new process: the restart delay plus
                // one round trip (25 ms each way), well within one pass.
                assert!(
                    death.learned_after <= RESTART_AFTER + Duration::from_millis(100),
                    "{mode:?}: {death:?}"
                );
            } else {
                // The lease lapsed before the desktop was back.
                assert!(death.reason.starts_with(LEASE_LAPSED), "{death:?}");
                assert!(death.learned_after <= RESTART_AFTER, "{death:?}");
            }
        }
    }
}

#[test]
fn a_restarted_desktop_does_not_run_the_dead_run_again() {
    let mut w = World::new(WorldConfig {
        mode: RelayMode::LongPoll,
        maintain: Some(Duration::from_secs(1)),
        run_time: graph_relay_sim::world::RunTime {
            median_secs: 3600.0,
            sigma: 0.0,
            min_secs: 3600.0,
        },
        ..WorldConfig::default()
    });
    let id = queue(&mut w, 1);
    w.run_until(START.plus(Duration::from_secs(10)));
    assert_eq!(w.executions.len(), 1);
    w.kill_desktop();
    w.restart_desktop_after(Duration::from_secs(5));
    w.run_until(START.plus(Duration::from_secs(600)));
    assert!(w.desktop_up());
    assert_eq!(w.executions.len(), 1, "never run again: {:?}", w.executions);
    let c = w.command(&w.agent, &id).expect("visible");
    assert_eq!(c.status, CommandStatus::Failed);
    assert!(
        c.reason
            .as_deref()
            .is_some_and(|r| r.starts_with(DESKTOP_RESTARTED))
    );
    // The new desktop still takes new work.
    let next = queue(&mut w, 2);
    w.run_until(w.now().plus(Duration::from_secs(5)));
    assert_eq!(w.status(&next), Some(CommandStatus::Running));
}

#[test]
fn a_second_agent_always_gets_the_hidden_error() {
    let outcome = experiments::second_agent(3, 50);
    assert_eq!(outcome.figures["leaked"], 0);
    assert_eq!(outcome.figures["get_hidden"], 50);
    assert_eq!(outcome.figures["cancel_hidden"], 50);
    assert_eq!(outcome.figures["same_as_unknown"], 100);
}

#[test]
fn five_runs_queued_at_once_run_one_after_another_in_order() {
    for mode in [RelayMode::Interval, RelayMode::LongPoll] {
        let mut w = World::new(WorldConfig {
            mode,
            ..WorldConfig::default()
        });
        let ids: Vec<CommandId> = (0..5).map(|i| queue(&mut w, i)).collect();
        w.run_until(START.plus(Duration::from_secs(4 * 3600)));
        let order: Vec<CommandId> = w.executions.iter().map(|e| e.command).collect();
        assert_eq!(order, ids, "{mode:?}: first queued, first run");
        for pair in w.executions.windows(2) {
            assert!(
                pair[0].ended.expect("ended") <= pair[1].started,
                "never two at once"
            );
        }
    }
}

#[test]
fn plots_are_written_as_svg() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outcomes = vec![
        experiments::pickup(1, 30),
        experiments::polling(1, 5),
        experiments::cancellation(1, 30),
    ];
    let files = graph_relay_sim::plot::write_all(&outcomes, dir.path()).expect("plots");
    assert_eq!(files.len(), 3);
    for f in files {
        let text = std::fs::read_to_string(&f).expect("svg");
        assert!(
            text.starts_with("<svg") && text.contains("</svg>"),
            "{}",
            f.display()
        );
    }
}

#[test]
fn progress_reported_every_10_ms_reaches_the_agent_and_costs_at_most_a_write_a_second() {
    for mode in [RelayMode::Interval, RelayMode::LongPoll] {
        let mut w = World::new(WorldConfig {
            mode,
            maintain: Some(Duration::from_secs(1)),
            progress_every: Some(Duration::from_millis(10)),
            run_time: graph_relay_sim::world::RunTime {
                median_secs: 60.0,
                sigma: 0.0,
                min_secs: 60.0,
            },
            ..WorldConfig::default()
        });
        let id = queue(&mut w, 1);
        w.run_until(START.plus(Duration::from_secs(25)));
        let started = w.executions.first().expect("started").started;
        // Mid-run the agent sees a recent report.
        w.run_until(started.plus(Duration::from_secs(30)));
        let c = w.command(&w.agent, &id).expect("visible");
        assert_eq!(c.status, CommandStatus::Running);
        let p = c.progress.expect("progress");
        assert!(
            w.now().since(p.updated_at) <= Duration::from_millis(1100),
            "{mode:?}: {p:?} at {:?}",
            w.now()
        );
        assert!((45.0..=50.0).contains(&p.percent.unwrap_or(0.0)), "{p:?}");
        let before = c.revision;
        w.run_until(started.plus(Duration::from_secs(40)));
        let writes = w.command(&w.agent, &id).expect("visible").revision - before;
        // 1,000 reports in 10 s: at most one write a second (plus a lease renewal).
        assert!(
            (5..=11).contains(&writes),
            "{mode:?}: {writes} writes in 10 s"
        );
        w.run_until(started.plus(Duration::from_secs(120)));
        let c = w.command(&w.agent, &id).expect("visible");
        assert_eq!(c.status, CommandStatus::Completed);
        assert!(
            c.progress.is_some(),
            "the last report is kept after the end"
        );
    }
}

#[test]
fn every_polling_strategy_sees_every_run_end_and_tasks_get_keeps_the_hints_pace() {
    let runs = 12;
    let figures = experiments::polling(3, runs).figures;
    let strategies = figures.as_object().expect("one entry per strategy");
    assert_eq!(strategies.len(), experiments::STRATEGIES.len());
    for (strategy, modes) in strategies {
        for mode in ["interval (published)", "long-poll"] {
            assert_eq!(
                modes[mode]["tool_calls"]["n"], runs,
                "{strategy}, {mode}: every run's end is seen"
            );
        }
    }
    // pollIntervalMs is poll_after_seconds in milliseconds, so a tasks
    // client makes the same calls, at the same times, as one following the hint.
    assert_eq!(
        figures["tasks extension (tasks/get at pollIntervalMs)"],
        figures["poll_after_seconds hint"]
    );
}
