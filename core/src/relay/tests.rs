//! Unit tests of the state machine.

use std::time::Duration;

use super::*;
use crate::command::{CommandStatus, InvalidProgress, WAITING_FOR_APPROVAL};
use crate::envelope::ResultEnvelope;
use crate::ids::{ExecutionId, GraphSessionId};
use crate::outbox::RelayReport;
use crate::queue::{ControlAnswer, SyncRequest};
use crate::relay::executor::ProgressReport;
use crate::session::SessionMeta;
use serde_json::Map;
use serde_json::json;

const T0: Timestamp = Timestamp(1_000_000);

fn secs(s: u64) -> Timestamp {
    T0.plus(Duration::from_secs(s))
}

fn project() -> ProjectId {
    ProjectId::parse("p1").unwrap()
}

fn session(n: u32, slug: &str) -> SessionMeta {
    SessionMeta {
        graph_session_id: GraphSessionId::parse(&format!("gs_{n:032x}")).unwrap(),
        name: format!("g{n}").into(),
        description: "".into(),
        slug: slug.into(),
        version: "1".into(),
        status: "ready".into(),
    }
}

fn shared(slugs: &[(u32, &str)]) -> SharedSet {
    let mut s = SharedSet::new();
    s.enable(project());
    for (n, slug) in slugs {
        s.share(project(), session(*n, slug));
    }
    s
}

fn command(id: u128, n: u32, slug: &str) -> RelayCommand {
    RelayCommand {
        id: CommandId::from_uuid(uuid::Uuid::from_u128(id)),
        project: project(),
        graph_session_id: session(n, slug).graph_session_id,
        arguments: Map::new(),
        slug: slug.into(),
        agent: None,
    }
}

/// A control answer: keep running.
fn go_on() -> ControlAnswer {
    ControlAnswer {
        cancel_requested: false,
        status: CommandStatus::Running,
    }
}

/// A control answer: the agent asked to cancel.
fn cancel_asked() -> ControlAnswer {
    ControlAnswer {
        cancel_requested: true,
        status: CommandStatus::Running,
    }
}

fn interval() -> RelayConfig {
    RelayConfig {
        mode: RelayMode::Interval,
        ..RelayConfig::default()
    }
}

/// Every pending action.
fn drain_all(r: &mut Relay) -> Vec<Action> {
    std::iter::from_fn(|| r.poll_action()).collect()
}

/// The pending actions but the bookkeeping of synced projects.
fn drain(r: &mut Relay) -> Vec<Action> {
    drain_all(r)
        .into_iter()
        .filter(|a| !matches!(a, Action::RememberProject(_) | Action::ForgetProject(_)))
        .collect()
}

/// Runs the pass start: empty outbox, the one project's sync (held in a
/// long-polling relay's later passes) answered with `commands`.
fn pass_with(r: &mut Relay, now: Timestamp, commands: Vec<RelayCommand>) -> Vec<Action> {
    assert_eq!(drain(r), vec![Action::LoadOutbox]);
    r.handle_outbox_loaded(vec![], now);
    let a = drain(r);
    assert!(matches!(a.as_slice(), [Action::Sync(_)]), "{a:?}");
    r.handle_sync_response(Ok(commands), now);
    drain(r)
}

#[test]
fn interval_mode_passes_every_20_s_with_a_fixed_phase() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(7));
    assert_eq!(r.poll_timeout(), Some(secs(7)));
    r.handle_timeout(secs(6));
    assert!(drain(&mut r).is_empty(), "not due yet");
    r.handle_timeout(secs(7));
    assert!(pass_with(&mut r, secs(7), vec![]).is_empty());
    assert!(!r.is_busy());
    assert_eq!(r.poll_timeout(), Some(secs(27)));
}

#[test]
fn a_tick_during_a_busy_pass_is_skipped() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    let a = pass_with(&mut r, secs(0), vec![command(1, 1, "a")]);
    assert!(matches!(a.as_slice(), [Action::Claim { .. }]));
    r.handle_claim_response(command(1, 1, "a").id, ClaimOutcome::Granted, secs(0));
    assert!(matches!(drain(&mut r).as_slice(), [Action::Execute(_)]));
    // The run lasts 50 s: ticks at 20 and 40 come while busy.
    for t in (3..=48).step_by(3) {
        r.handle_timeout(secs(t));
        for action in drain(&mut r) {
            assert!(
                matches!(
                    action,
                    Action::Control {
                        long_poll: false,
                        ..
                    }
                ),
                "{action:?}"
            );
            r.handle_control_response(command(1, 1, "a").id, Ok(go_on()), secs(t));
        }
    }
    r.handle_execution_finished(command(1, 1, "a").id, ExecutionOutcome::default(), secs(50));
    let a = drain(&mut r);
    let [Action::StoreReport(item)] = a.as_slice() else {
        panic!("{a:?}")
    };
    r.handle_report_stored(item.command, secs(50));
    let a = drain(&mut r);
    assert!(matches!(a.as_slice(), [Action::PostReport(_)]));
    r.handle_report_posted(item.command, PostOutcome::Acknowledged, secs(50));
    assert_eq!(drain(&mut r), vec![Action::RemoveReport(item.command)]);
    assert!(!r.is_busy());
    // The next pass keeps the phase: 60 s, not 50 + 20.
    assert_eq!(r.poll_timeout(), Some(secs(60)));
}

#[test]
fn control_polls_every_3_s_and_cancel_is_sent_once_and_wins() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    let c = command(1, 1, "a");
    pass_with(&mut r, secs(0), vec![c.clone()]);
    r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(0));
    drain(&mut r);
    assert_eq!(r.poll_timeout(), Some(secs(3)));
    r.handle_timeout(secs(3));
    assert_eq!(
        drain(&mut r),
        vec![Action::Control {
            command: c.id,
            long_poll: false
        }]
    );
    r.handle_control_response(c.id, Ok(cancel_asked()), secs(3));
    assert_eq!(
        drain(&mut r),
        vec![Action::CancelExecution { command: c.id }]
    );
    // No more control polls, no second cancel.
    r.handle_timeout(secs(30));
    assert!(
        drain(&mut r)
            .iter()
            .all(|a| !matches!(a, Action::Control { .. } | Action::CancelExecution { .. }))
    );
    // The Graph finished anyway: recorded as cancelled.
    let outcome = ExecutionOutcome {
        status: Some(FinishStatus::Completed),
        result: json!("done"),
        ..Default::default()
    };
    r.handle_execution_finished(c.id, outcome, secs(31));
    let a = drain(&mut r);
    let [
        Action::StoreReport(OutboxItem {
            report: RelayReport::Completion { envelope },
            ..
        }),
    ] = a.as_slice()
    else {
        panic!("{a:?}")
    };
    assert_eq!(envelope.status, FinishStatus::Cancelled);
}

#[test]
fn recheck_declines_unshared_and_renamed_sessions() {
    let mut r = Relay::new(interval(), shared(&[(1, "a"), (2, "b")]), secs(0));
    r.handle_timeout(secs(0));
    // Session 3 is not shared; session 2's slug changed since it was queued.
    let a = pass_with(
        &mut r,
        secs(0),
        vec![
            command(1, 3, "c"),
            command(2, 2, "old-slug"),
            command(3, 1, "a"),
        ],
    );
    let [Action::StoreReport(item)] = a.as_slice() else {
        panic!("{a:?}")
    };
    assert_eq!(item.report, RelayReport::Declined);
    assert_eq!(item.command, command(1, 3, "c").id);
    r.handle_report_stored(item.command, secs(0));
    assert!(matches!(
        drain(&mut r).as_slice(),
        [Action::PostReport(OutboxItem {
            report: RelayReport::Declined,
            ..
        })]
    ));
    r.handle_report_posted(item.command, PostOutcome::Acknowledged, secs(0));
    let a = drain(&mut r);
    assert!(
        matches!(
            a.as_slice(),
            [
                Action::RemoveReport(_),
                Action::StoreReport(OutboxItem {
                    report: RelayReport::Declined,
                    ..
                })
            ]
        ),
        "{a:?}"
    );
    r.handle_report_stored(command(2, 2, "old-slug").id, secs(0));
    drain(&mut r);
    r.handle_report_posted(
        command(2, 2, "old-slug").id,
        PostOutcome::Acknowledged,
        secs(0),
    );
    let a = drain(&mut r);
    assert!(
        matches!(
            a.as_slice(),
            [Action::RemoveReport(_), Action::Claim { .. }]
        ),
        "{a:?}"
    );
}

#[test]
fn a_change_to_the_shared_set_applies_to_the_recheck_at_once() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
    r.handle_outbox_loaded(vec![], secs(0));
    drain(&mut r);
    // The owner un-shares while the sync is in flight.
    r.handle_shared_set(shared(&[]), secs(1));
    r.handle_sync_response(Ok(vec![command(1, 1, "a")]), secs(1));
    assert!(matches!(
        drain(&mut r).as_slice(),
        [Action::StoreReport(OutboxItem {
            report: RelayReport::Declined,
            ..
        })]
    ));
}

#[test]
fn outbox_items_are_resent_first_and_kept_on_failure() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
    let old = OutboxItem {
        command: command(9, 1, "a").id,
        report: RelayReport::Declined,
        stored_at: T0,
        attempts: 1,
    };
    r.handle_outbox_loaded(vec![old.clone()], secs(0));
    assert_eq!(drain(&mut r), vec![Action::PostReport(old.clone())]);
    r.handle_report_posted(
        old.command,
        PostOutcome::Retry("connection refused".into()),
        secs(0),
    );
    let a = drain(&mut r);
    assert_eq!(
        a[0],
        Action::RecordAttempt(old.command),
        "kept, not removed"
    );
    assert!(matches!(a[1], Action::Sync(_)));
    assert!(!a.iter().any(|x| matches!(x, Action::RemoveReport(_))));
}

#[test]
fn a_refused_report_is_dropped_and_a_refused_claim_never_runs() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    let c = command(1, 1, "a");
    pass_with(&mut r, secs(0), vec![c.clone(), command(2, 1, "a")]);
    r.handle_claim_response(c.id, ClaimOutcome::Refused("cancelled".into()), secs(0));
    let a = drain(&mut r);
    assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))));
    assert!(
        matches!(a.as_slice(), [Action::Claim { .. }]),
        "the next command is claimed: {a:?}"
    );
}

#[test]
fn long_poll_holds_one_sync_when_idle_and_control_is_held_too() {
    let mut r = Relay::new(RelayConfig::default(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    assert!(pass_with(&mut r, secs(0), vec![]).iter().any(|a| matches!(
        a,
        Action::Sync(SyncRequest {
            long_poll: true,
            ..
        })
    )));
    // The held sync returns when work arrives.
    let c = command(1, 1, "a");
    r.handle_sync_response(Ok(vec![c.clone()]), secs(4));
    assert!(matches!(drain(&mut r).as_slice(), [Action::Claim { .. }]));
    r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(4));
    let a = drain(&mut r);
    assert!(
        matches!(
            a.as_slice(),
            [
                Action::Execute(_),
                Action::Control {
                    long_poll: true,
                    ..
                }
            ]
        ),
        "{a:?}"
    );
    r.handle_control_response(c.id, Ok(go_on()), secs(29));
    assert_eq!(
        drain(&mut r),
        vec![Action::Control {
            command: c.id,
            long_poll: true
        }]
    );
    r.handle_control_response(c.id, Err(Refusal::no_answer("timeout")), secs(30));
    assert!(
        std::iter::from_fn(|| r.poll_event()).any(|e| e
            == RelayEvent::ControlFailed {
                command: c.id,
                reason: "timeout".into()
            }),
        "a failed control poll is told"
    );
    assert!(
        drain(&mut r).is_empty(),
        "a failed control waits before retrying"
    );
    assert_eq!(r.poll_timeout(), Some(secs(33)));
    r.handle_timeout(secs(33));
    assert_eq!(
        drain(&mut r),
        vec![Action::Control {
            command: c.id,
            long_poll: true
        }]
    );
}

#[test]
fn long_poll_backs_off_with_jitter_after_failures() {
    let mut r = Relay::new(RelayConfig::default(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    drain(&mut r);
    r.handle_outbox_loaded(vec![], secs(0));
    drain(&mut r);
    r.handle_sync_response(Err(SyncFailure::Network("down".into())), secs(0));
    assert!(!r.is_busy());
    let wake = r.poll_timeout().unwrap();
    assert!(wake > secs(0) && wake <= secs(1), "{wake:?}");
    let mut last = Duration::ZERO;
    let mut now = wake;
    for _ in 0..8 {
        r.handle_timeout(now);
        drain(&mut r);
        r.handle_outbox_loaded(vec![], now);
        drain(&mut r);
        r.handle_sync_response(Err(SyncFailure::Network("down".into())), now);
        let next = r.poll_timeout().unwrap();
        last = next.since(now);
        now = next;
    }
    assert!(
        last <= Duration::from_secs(5) && last >= Duration::from_millis(2_500),
        "{last:?}"
    );
}

/// A long-poll relay whose syncs all go unanswered: the pauses between
/// its attempts, from the first failure on.
fn pauses_while_down(seed: u64, attempts: usize) -> Vec<Duration> {
    let config = RelayConfig {
        seed,
        ..RelayConfig::default()
    };
    let mut r = Relay::new(config, shared(&[(1, "a")]), secs(0));
    let mut now = secs(0);
    let mut pauses = Vec::new();
    for _ in 0..attempts {
        r.handle_timeout(now);
        assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
        r.handle_outbox_loaded(vec![], now);
        assert!(matches!(drain(&mut r).as_slice(), [Action::Sync(_)]));
        r.handle_sync_response(Err(SyncFailure::Network("refused".into())), now);
        let next = r.poll_timeout().expect("a retry is due");
        pauses.push(next.since(now));
        now = next;
    }
    pauses
}

#[test]
fn the_backoff_is_capped_at_5_s_and_jittered_between_half_and_all_of_it() {
    assert_eq!(RelayConfig::default().backoff_max, Duration::from_secs(5));
    let mut at_cap = Vec::new();
    for seed in 0..200 {
        let pauses = pauses_while_down(seed, 12);
        // 1 s, 2 s, 4 s, then the 5 s cap, each between half and all of it.
        for (n, pause) in pauses.iter().enumerate() {
            let base = Duration::from_secs([1, 2, 4].get(n).copied().unwrap_or(5));
            assert!(
                *pause >= base / 2 && *pause <= base,
                "seed {seed}, attempt {n}: {pause:?} outside [{:?}, {base:?}]",
                base / 2
            );
        }
        at_cap.extend_from_slice(&pauses[3..]);
        assert_eq!(pauses, pauses_while_down(seed, 12), "the seed decides");
    }
    // The jitter spreads the retries over the whole interval, so desktops
    // that lost one server do not come back in step.
    let (low, high) = (Duration::from_millis(2_750), Duration::from_millis(4_750));
    assert!(at_cap.iter().any(|p| *p < low), "{at_cap:?}");
    assert!(at_cap.iter().any(|p| *p > high), "{at_cap:?}");
    let mut distinct = at_cap.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() > at_cap.len() / 2, "{distinct:?}");
    let firsts: BTreeSet<Duration> = (0..50).map(|s| pauses_while_down(s, 1)[0]).collect();
    assert!(firsts.len() > 40, "seeds draw apart: {firsts:?}");
}

/// The outage lines among the pending events.
fn outage_events(r: &mut Relay) -> Vec<RelayEvent> {
    std::iter::from_fn(|| r.poll_event())
        .filter(|e| {
            matches!(
                e,
                RelayEvent::ServerLost { .. }
                    | RelayEvent::StillUnreachable { .. }
                    | RelayEvent::ServerBack { .. }
            )
        })
        .collect()
}

#[test]
fn a_lost_server_is_said_once_retries_at_a_bounded_rate_and_its_return_once() {
    let mut r = Relay::new(RelayConfig::default(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    assert!(pass_with(&mut r, secs(0), vec![]).iter().any(|a| matches!(
        a,
        Action::Sync(SyncRequest {
            long_poll: true,
            ..
        })
    )));
    assert!(outage_events(&mut r).is_empty(), "an answer is not news");
    // The server holding the held sync dies at 10 s.
    r.handle_sync_response(
        Err(SyncFailure::Network("connection reset".into())),
        secs(10),
    );
    assert_eq!(
        outage_events(&mut r),
        vec![RelayEvent::ServerLost {
            reason: "connection reset".into()
        }]
    );
    // It stays away for ten minutes; the relay keeps trying.
    let mut now = r.poll_timeout().expect("a retry");
    let mut lines = Vec::new();
    let mut attempts = 1;
    while now < secs(610) {
        r.handle_timeout(now);
        drain(&mut r);
        r.handle_outbox_loaded(vec![], now);
        drain(&mut r);
        r.handle_sync_response(Err(SyncFailure::Network("refused".into())), now);
        attempts += 1;
        lines.extend(outage_events(&mut r));
        now = r.poll_timeout().expect("a retry");
        assert!(now.since(secs(0)) < Duration::from_secs(700));
    }
    assert!(attempts > 100, "{attempts} attempts in ten minutes");
    assert!(
        lines.len() <= 12,
        "{} lines for {attempts} attempts: {lines:?}",
        lines.len()
    );
    // Each line names the attempts and the time; the first comes after
    // ten seconds, not with the next attempts.
    let counted: Vec<(u32, Duration)> = lines
        .iter()
        .map(|e| match e {
            RelayEvent::StillUnreachable {
                attempts,
                unreachable_for,
                reason,
            } => {
                assert_eq!(reason, "refused");
                (*attempts, *unreachable_for)
            }
            other => panic!("only reports while down: {other:?}"),
        })
        .collect();
    assert!(
        counted[0].1 >= Duration::from_secs(10) && counted[0].0 > 2,
        "{counted:?}"
    );
    assert!(
        counted
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1),
        "{counted:?}"
    );
    assert!(counted.last().unwrap().1 > Duration::from_secs(300));
    // The server is back: the next sync gets an answer.
    r.handle_timeout(now);
    drain(&mut r);
    r.handle_outbox_loaded(vec![], now);
    drain(&mut r);
    r.handle_sync_response(Ok(vec![]), now);
    assert_eq!(
        outage_events(&mut r),
        vec![RelayEvent::ServerBack {
            unreachable_for: now.since(secs(10)),
            attempts,
        }]
    );
    assert_eq!(r.poll_timeout(), None, "no back-off once it answers");
    assert!(
        matches!(
            drain(&mut r).as_slice(),
            [Action::Sync(SyncRequest {
                long_poll: true,
                ..
            })]
        ),
        "held again at once"
    );
    r.handle_sync_response(Ok(vec![]), now.plus(Duration::from_secs(25)));
    assert!(outage_events(&mut r).is_empty(), "the return is said once");
}

#[test]
fn a_lost_server_is_said_while_a_run_executes_through_its_control_requests() {
    let (mut r, c) = executing_relay();
    let mut now = secs(3);
    r.handle_timeout(now);
    assert!(matches!(drain(&mut r).as_slice(), [Action::Control { .. }]));
    r.handle_control_response(c.id, Err(Refusal::no_answer("connection reset")), now);
    assert_eq!(
        outage_events(&mut r),
        vec![RelayEvent::ServerLost {
            reason: "connection reset".into()
        }]
    );
    for _ in 0..4 {
        now = r.poll_timeout().expect("the next control poll");
        r.handle_timeout(now);
        assert!(matches!(drain(&mut r).as_slice(), [Action::Control { .. }]));
        r.handle_control_response(c.id, Err(Refusal::no_answer("refused")), now);
    }
    let lines = outage_events(&mut r);
    assert!(
        matches!(
            lines.as_slice(),
            [RelayEvent::StillUnreachable { unreachable_for, .. }] if *unreachable_for >= Duration::from_secs(10)
        ),
        "one line, ten seconds after the loss: {lines:?}"
    );
    now = r.poll_timeout().expect("the next control poll");
    r.handle_timeout(now);
    drain(&mut r);
    r.handle_control_response(c.id, Ok(go_on()), now);
    assert_eq!(
        outage_events(&mut r),
        vec![RelayEvent::ServerBack {
            unreachable_for: now.since(secs(3)),
            attempts: 5,
        }]
    );
}

#[test]
fn a_refusal_is_an_answer_not_an_outage() {
    let mut r = Relay::new(RelayConfig::default(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    drain(&mut r);
    r.handle_outbox_loaded(vec![], secs(0));
    drain(&mut r);
    r.handle_sync_response(Err(SyncFailure::Refused("401 bad token".into())), secs(0));
    assert!(outage_events(&mut r).is_empty());
    // A held sync the relay aborts itself says nothing either.
    let mut r = Relay::new(RelayConfig::default(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    pass_with(&mut r, secs(0), vec![]);
    r.handle_shared_set(shared(&[(1, "a"), (2, "b")]), secs(1));
    assert_eq!(drain(&mut r), vec![Action::AbortHeldSync]);
    r.handle_sync_response(Err(SyncFailure::Aborted), secs(1));
    assert!(outage_events(&mut r).is_empty());
}

#[test]
fn shared_set_change_aborts_a_held_sync() {
    let mut r = Relay::new(RelayConfig::default(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    pass_with(&mut r, secs(0), vec![]);
    r.handle_shared_set(shared(&[(1, "a"), (2, "b")]), secs(2));
    assert_eq!(drain(&mut r), vec![Action::AbortHeldSync]);
    r.handle_sync_response(Err(SyncFailure::Aborted), secs(2));
    // A new pass starts at once with the new set.
    assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
}

#[test]
fn a_claim_without_an_answer_is_claimed_again_under_the_same_execution() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    let c = command(1, 1, "a");
    let a = pass_with(&mut r, secs(0), vec![c.clone(), command(2, 1, "a")]);
    let [Action::Claim { execution, .. }] = a.as_slice() else {
        panic!("{a:?}")
    };
    let execution = execution.clone();
    r.handle_claim_response(c.id, ClaimOutcome::Network("timeout".into()), secs(1));
    assert!(drain(&mut r).is_empty(), "the pass ends");
    assert!(!r.is_busy());
    r.handle_timeout(secs(20));
    assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
    r.handle_outbox_loaded(vec![], secs(20));
    assert_eq!(
        drain(&mut r),
        vec![Action::Claim {
            command: c.id,
            execution: execution.clone()
        }]
    );
    r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(20));
    let a = drain(&mut r);
    assert!(
        matches!(a.as_slice(), [Action::Execute(job)] if job.execution == execution),
        "{a:?}"
    );
}

#[test]
fn an_unconfirmed_claim_of_an_unshared_session_is_closed_as_cancelled() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    let c = command(1, 1, "a");
    pass_with(&mut r, secs(0), vec![c.clone()]);
    r.handle_claim_response(c.id, ClaimOutcome::Network("timeout".into()), secs(1));
    r.handle_shared_set(shared(&[]), secs(2));
    r.handle_timeout(secs(20));
    drain(&mut r);
    r.handle_outbox_loaded(vec![], secs(20));
    let a = drain(&mut r);
    let [
        Action::StoreReport(OutboxItem {
            report: RelayReport::Completion { envelope },
            ..
        }),
    ] = a.as_slice()
    else {
        panic!("{a:?}")
    };
    assert_eq!(envelope.status, FinishStatus::Cancelled);
    assert_eq!(
        envelope.body.as_ref().and_then(|b| b.error.as_deref()),
        Some(crate::command::NO_LONGER_SHARED)
    );
    assert!(
        !a.iter()
            .any(|x| matches!(x, Action::Claim { .. } | Action::Execute(_)))
    );
}

#[test]
fn consent_withdrawn_while_the_claim_is_in_flight_means_it_never_runs() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    let c = command(1, 1, "a");
    pass_with(&mut r, secs(0), vec![c.clone()]);
    r.handle_shared_set(shared(&[]), secs(1));
    r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(1));
    let a = drain(&mut r);
    assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))), "{a:?}");
    let [
        Action::StoreReport(OutboxItem {
            report: RelayReport::Completion { envelope },
            ..
        }),
    ] = a.as_slice()
    else {
        panic!("{a:?}")
    };
    assert_eq!(envelope.status, FinishStatus::Cancelled);
    assert_eq!(
        envelope.body.as_ref().and_then(|b| b.error.as_deref()),
        Some(crate::command::NO_LONGER_SHARED)
    );
}

#[test]
fn a_late_control_answer_does_not_touch_a_command_not_yet_running() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    let c = command(1, 1, "a");
    pass_with(&mut r, secs(0), vec![c.clone()]);
    // A stale "cancel requested" for this command arrives while it is being claimed.
    r.handle_control_response(c.id, Ok(cancel_asked()), secs(1));
    assert!(drain(&mut r).is_empty());
    r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(1));
    assert!(matches!(drain(&mut r).as_slice(), [Action::Execute(_)]));
}

#[test]
fn the_first_syncs_announce_the_restart_after_the_outbox_and_until_one_succeeds() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    assert!(r.announces_restart());
    r.handle_timeout(secs(0));
    assert_eq!(drain_all(&mut r), vec![Action::LoadOutbox]);
    // A result recorded before the crash goes out before any sync.
    let old = OutboxItem {
        command: command(9, 1, "a").id,
        report: RelayReport::Declined,
        stored_at: T0,
        attempts: 0,
    };
    r.handle_outbox_loaded(vec![old.clone()], secs(0));
    assert_eq!(drain_all(&mut r), vec![Action::PostReport(old.clone())]);
    r.handle_report_posted(old.command, PostOutcome::Acknowledged, secs(0));
    assert_eq!(
        drain_all(&mut r),
        vec![
            Action::RemoveReport(old.command),
            Action::RememberProject(project()),
            Action::Sync(SyncRequest {
                project: project(),
                sessions: vec![session(1, "a")],
                long_poll: false,
                restarted: true,
                running: None,
            }),
        ]
    );
    // That sync got no answer: the next pass announces the restart again.
    r.handle_sync_response(Err(SyncFailure::Network("down".into())), secs(0));
    r.handle_timeout(secs(20));
    drain_all(&mut r);
    r.handle_outbox_loaded(vec![], secs(20));
    let a = drain_all(&mut r);
    assert!(
        matches!(
            a.as_slice(),
            [Action::Sync(SyncRequest {
                restarted: true,
                running: None,
                ..
            })]
        ),
        "{a:?}"
    );
    r.handle_sync_response(Ok(vec![]), secs(20));
    assert!(!r.announces_restart());
    // Once one sync succeeded, later syncs are ordinary.
    r.handle_timeout(secs(40));
    drain_all(&mut r);
    r.handle_outbox_loaded(vec![], secs(40));
    let a = drain_all(&mut r);
    assert!(
        matches!(
            a.as_slice(),
            [Action::Sync(SyncRequest {
                restarted: false,
                ..
            })]
        ),
        "{a:?}"
    );
}

#[test]
fn a_project_no_longer_enabled_is_synced_empty_until_that_succeeds_then_forgotten() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    drain_all(&mut r);
    r.handle_outbox_loaded(vec![], secs(0));
    let a = drain_all(&mut r);
    assert_eq!(a[0], Action::RememberProject(project()), "{a:?}");
    r.handle_sync_response(Ok(vec![]), secs(0));
    assert!(r.synced_projects().eq([&project()]));
    // The owner removes the project's last graph and the project itself.
    r.handle_shared_set(SharedSet::new(), secs(5));
    assert_eq!(drain_all(&mut r), vec![Action::LoadOutbox]);
    r.handle_outbox_loaded(vec![], secs(5));
    let empty_sync = Action::Sync(SyncRequest {
        project: project(),
        sessions: vec![],
        long_poll: false,
        restarted: false,
        running: None,
    });
    assert_eq!(drain_all(&mut r), vec![empty_sync.clone()]);
    // Not acknowledged: still remembered, synced empty again next pass.
    r.handle_sync_response(Err(SyncFailure::Network("down".into())), secs(5));
    assert!(drain_all(&mut r).is_empty());
    r.handle_timeout(secs(20));
    drain_all(&mut r);
    r.handle_outbox_loaded(vec![], secs(20));
    assert_eq!(drain_all(&mut r), vec![empty_sync]);
    // Acknowledged: forgotten; a command it hands out fails the re-check.
    let queued = command(1, 1, "a");
    r.handle_sync_response(Ok(vec![queued.clone()]), secs(20));
    let a = drain_all(&mut r);
    assert_eq!(a[0], Action::ForgetProject(project()), "{a:?}");
    assert!(
        matches!(
            &a[1..],
            [Action::StoreReport(OutboxItem {
                report: RelayReport::Declined,
                command,
                ..
            })] if *command == queued.id
        ),
        "{a:?}"
    );
    assert!(
        std::iter::from_fn(|| r.poll_event())
            .any(|e| e == RelayEvent::Unshared { project: project() })
    );
    assert_eq!(r.synced_projects().count(), 0);
    r.handle_report_stored(queued.id, secs(20));
    drain_all(&mut r);
    r.handle_report_posted(queued.id, PostOutcome::Acknowledged, secs(20));
    drain_all(&mut r);
    // Later passes sync nothing.
    r.handle_timeout(secs(40));
    drain_all(&mut r);
    r.handle_outbox_loaded(vec![], secs(40));
    assert!(drain_all(&mut r).is_empty());
    assert!(!r.is_busy());
}

#[test]
fn a_project_withdrawn_while_a_sync_sharing_into_it_is_in_flight_is_emptied_before_it_is_forgotten()
{
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    drain_all(&mut r);
    r.handle_outbox_loaded(vec![], secs(0));
    assert!(matches!(
        drain_all(&mut r).as_slice(),
        [Action::RememberProject(_), Action::Sync(SyncRequest { sessions, .. })] if !sessions.is_empty()
    ));
    // The owner withdraws the project while that sync is in flight; the
    // server takes the sync, so it holds the session's share.
    r.handle_shared_set(SharedSet::new(), secs(1));
    r.handle_sync_response(Ok(vec![]), secs(1));
    assert!(
        !drain_all(&mut r)
            .iter()
            .any(|a| matches!(a, Action::ForgetProject(_))),
        "not forgotten: the server still holds its shares"
    );
    assert!(r.synced_projects().eq([&project()]));
    // The next pass empties it, and only then forgets it.
    r.handle_timeout(secs(20));
    drain_all(&mut r);
    r.handle_outbox_loaded(vec![], secs(20));
    assert!(matches!(
        drain_all(&mut r).as_slice(),
        [Action::Sync(SyncRequest { sessions, .. })] if sessions.is_empty()
    ));
    r.handle_sync_response(Ok(vec![]), secs(20));
    assert_eq!(drain_all(&mut r), vec![Action::ForgetProject(project())]);
}

#[test]
fn a_project_enabled_again_while_its_empty_sync_is_in_flight_stays_remembered() {
    let mut r = Relay::new(interval(), SharedSet::new(), secs(0));
    r.remember_synced([project()]);
    r.handle_timeout(secs(0));
    drain_all(&mut r);
    r.handle_outbox_loaded(vec![], secs(0));
    assert!(matches!(
        drain_all(&mut r).as_slice(),
        [Action::Sync(SyncRequest { sessions, .. })] if sessions.is_empty()
    ));
    r.handle_shared_set(shared(&[(1, "a")]), secs(1));
    r.handle_sync_response(Ok(vec![]), secs(1));
    assert!(
        !drain_all(&mut r)
            .iter()
            .any(|a| matches!(a, Action::ForgetProject(_)))
    );
    assert!(r.synced_projects().eq([&project()]));
}

#[test]
fn projects_remembered_by_an_earlier_run_are_emptied_after_a_restart() {
    let mut r = Relay::new(RelayConfig::default(), SharedSet::new(), secs(0));
    r.remember_synced([project()]);
    r.handle_timeout(secs(0));
    assert_eq!(drain_all(&mut r), vec![Action::LoadOutbox]);
    r.handle_outbox_loaded(vec![], secs(0));
    assert_eq!(
        drain_all(&mut r),
        vec![Action::Sync(SyncRequest {
            project: project(),
            sessions: vec![],
            long_poll: false,
            restarted: true,
            running: None,
        })]
    );
    r.handle_sync_response(Ok(vec![]), secs(0));
    assert_eq!(drain_all(&mut r), vec![Action::ForgetProject(project())]);
    // Nothing enabled, nothing left to empty: the relay waits for a change.
    assert!(!r.is_busy());
    assert_eq!(r.poll_timeout(), Some(secs(20)));
}

#[test]
fn the_servers_retryable_flag_alone_decides_what_is_tried_again() {
    let refused = Refusal::new(Some(false), "403 device_token_required: no");
    let retry = Refusal::new(Some(true), "503 store_unavailable: later");
    let silent = Refusal::new(None, "401: no flag");
    let down = Refusal::no_answer("connection refused");
    assert!(refused.is_final());
    assert_eq!(
        PostOutcome::from(refused.clone()),
        PostOutcome::Rejected(refused.reason.clone())
    );
    assert_eq!(
        ClaimOutcome::from(refused.clone()),
        ClaimOutcome::Refused(refused.reason.clone())
    );
    assert_eq!(
        SyncFailure::from(refused.clone()),
        SyncFailure::Refused(refused.reason.clone())
    );
    for r in [retry, silent, down] {
        assert!(!r.is_final());
        assert_eq!(
            PostOutcome::from(r.clone()),
            PostOutcome::Retry(r.reason.clone())
        );
        assert_eq!(
            ClaimOutcome::from(r.clone()),
            ClaimOutcome::Network(r.reason.clone())
        );
        assert_eq!(
            SyncFailure::from(r.clone()),
            SyncFailure::Network(r.reason.clone())
        );
    }
}

/// An interval relay executing `command(1, 1, "a")` since `secs(0)`,
/// with `command(2, 1, "a")` queued behind it.
fn executing_relay() -> (Relay, RelayCommand) {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    let c = command(1, 1, "a");
    pass_with(&mut r, secs(0), vec![c.clone(), command(2, 1, "a")]);
    r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(0));
    assert!(matches!(drain(&mut r).as_slice(), [Action::Execute(_)]));
    (r, c)
}

fn execution_of(r: &Relay) -> ExecutionId {
    r.awaiting.run().expect("executing").job.execution.clone()
}

fn report(message: &str, percent: f64) -> ProgressReport {
    ProgressReport {
        message: Some(message.into()),
        percent: Some(percent),
    }
}

fn at_ms(ms: u64) -> Timestamp {
    T0.plus(Duration::from_millis(ms))
}

#[test]
fn a_restart_is_announced_only_once_the_outbox_is_empty() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    let old = OutboxItem {
        command: command(9, 1, "a").id,
        report: RelayReport::Declined,
        stored_at: T0,
        attempts: 0,
    };
    // Pass 1: the report from before the crash is not delivered (503):
    // the pass syncs, but without the announcement.
    r.handle_timeout(secs(0));
    assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
    r.handle_outbox_loaded(vec![old.clone()], secs(0));
    assert_eq!(drain(&mut r), vec![Action::PostReport(old.clone())]);
    r.handle_report_posted(old.command, PostOutcome::Retry("503".into()), secs(0));
    let a = drain(&mut r);
    assert!(
        matches!(
            a.as_slice(),
            [
                Action::RecordAttempt(_),
                Action::Sync(SyncRequest {
                    restarted: false,
                    ..
                })
            ]
        ),
        "{a:?}"
    );
    r.handle_sync_response(Ok(vec![]), secs(0));
    assert!(r.announces_restart(), "the announcement is only held back");
    // Pass 2: the server refuses it for good (its run was closed when the
    // lease lapsed): dropped, the outbox is empty, the restart is announced.
    r.handle_timeout(secs(20));
    drain(&mut r);
    r.handle_outbox_loaded(vec![old.clone()], secs(20));
    drain(&mut r);
    r.handle_report_posted(
        old.command,
        PostOutcome::Rejected("409 run_closed: discarded".into()),
        secs(20),
    );
    let a = drain(&mut r);
    assert!(
        matches!(
            a.as_slice(),
            [Action::RemoveReport(c), Action::Sync(SyncRequest { restarted: true, running: None, .. })]
                if *c == old.command
        ),
        "{a:?}"
    );
    r.handle_sync_response(Ok(vec![]), secs(20));
    assert!(!r.announces_restart());
    // Pass 3: nothing left to re-send, nothing to announce.
    r.handle_timeout(secs(40));
    drain(&mut r);
    r.handle_outbox_loaded(vec![], secs(40));
    assert!(matches!(
        drain(&mut r).as_slice(),
        [Action::Sync(SyncRequest {
            restarted: false,
            ..
        })]
    ));
}

#[test]
fn a_run_the_server_closed_is_stopped_once_and_nothing_is_reported() {
    let (mut r, c) = executing_relay();
    r.handle_timeout(secs(3));
    assert!(matches!(drain(&mut r).as_slice(), [Action::Control { .. }]));
    // The lease lapsed while the desktop was unreachable.
    let closed = ControlAnswer {
        cancel_requested: false,
        status: CommandStatus::Failed,
    };
    r.handle_control_response(c.id, Ok(closed), secs(40));
    assert_eq!(
        drain(&mut r),
        vec![Action::CancelExecution { command: c.id }]
    );
    assert!(std::iter::from_fn(|| r.poll_event()).any(|e| e
        == RelayEvent::ClosedByServer {
            command: c.id,
            status: CommandStatus::Failed
        }));
    // No more control requests, no second stop, no progress.
    r.handle_timeout(secs(60));
    let execution = execution_of(&r);
    assert_eq!(
        r.handle_progress(c.id, &execution, report("late", 90.0), secs(60)),
        Ok(())
    );
    assert!(drain(&mut r).is_empty());
    // The engine stopped: no report is stored or posted, and the pass
    // goes on with the next command.
    r.handle_execution_finished(
        c.id,
        ExecutionOutcome {
            status: Some(FinishStatus::Cancelled),
            ..Default::default()
        },
        secs(61),
    );
    let a = drain(&mut r);
    assert!(
        matches!(a.as_slice(), [Action::Claim { command, .. }] if *command == command_id(2)),
        "{a:?}"
    );
    assert!(
        std::iter::from_fn(|| r.poll_event()).any(|e| e == RelayEvent::Abandoned { command: c.id })
    );
}

fn command_id(n: u128) -> CommandId {
    command(n, 1, "a").id
}

#[test]
fn a_closed_answer_after_a_cancel_stops_nothing_twice() {
    let (mut r, c) = executing_relay();
    r.handle_timeout(secs(3));
    drain(&mut r);
    r.handle_control_response(c.id, Ok(cancel_asked()), secs(3));
    assert_eq!(
        drain(&mut r),
        vec![Action::CancelExecution { command: c.id }]
    );
    // A late answer (e.g. held on another server) says the run is closed.
    let closed = ControlAnswer {
        cancel_requested: true,
        status: CommandStatus::Cancelled,
    };
    r.handle_control_response(c.id, Ok(closed), secs(4));
    assert!(drain(&mut r).is_empty(), "one stop only");
}

#[test]
fn progress_is_posted_at_once_then_the_latest_at_most_once_a_second() {
    let (mut r, c) = executing_relay();
    let execution = execution_of(&r);
    r.handle_progress(c.id, &execution, report("step 1", 20.0), at_ms(100))
        .unwrap();
    assert_eq!(
        drain(&mut r),
        vec![Action::PostProgress {
            command: c.id,
            execution: execution.clone(),
            report: report("step 1", 20.0)
        }]
    );
    // Three more within the second: kept, only the latest.
    for (ms, n) in [(200, 2), (500, 3), (900, 4)] {
        r.handle_progress(
            c.id,
            &execution,
            report(&format!("step {n}"), f64::from(n) * 20.0),
            at_ms(ms),
        )
        .unwrap();
    }
    r.handle_progress_posted(c.id, PostOutcome::Acknowledged, at_ms(300));
    assert!(
        std::iter::from_fn(|| r.poll_event())
            .any(|e| e == RelayEvent::ProgressPosted { command: c.id }),
        "a report the server took is told"
    );
    assert!(drain(&mut r).is_empty());
    assert_eq!(r.poll_timeout(), Some(at_ms(1100)));
    r.handle_timeout(at_ms(1099));
    assert!(drain(&mut r).is_empty());
    r.handle_timeout(at_ms(1100));
    assert_eq!(
        drain(&mut r),
        vec![Action::PostProgress {
            command: c.id,
            execution: execution.clone(),
            report: report("step 4", 80.0)
        }]
    );
    // Nothing pending: no timer for progress.
    r.handle_progress_posted(c.id, PostOutcome::Acknowledged, at_ms(1200));
    assert_eq!(r.poll_timeout(), Some(secs(3)), "only the control poll");
}

#[test]
fn a_progress_post_in_flight_holds_the_next_one_and_a_failure_loses_only_that_report() {
    let (mut r, c) = executing_relay();
    let execution = execution_of(&r);
    r.handle_progress(c.id, &execution, report("a", 1.0), at_ms(0))
        .unwrap();
    drain(&mut r);
    r.handle_progress(c.id, &execution, report("b", 2.0), at_ms(1500))
        .unwrap();
    r.handle_timeout(at_ms(2000));
    assert!(
        drain(&mut r).is_empty(),
        "the first post is still in flight"
    );
    r.handle_progress_posted(c.id, PostOutcome::Retry("timeout".into()), at_ms(2500));
    assert_eq!(
        drain(&mut r),
        vec![Action::PostProgress {
            command: c.id,
            execution: execution.clone(),
            report: report("b", 2.0)
        }]
    );
}

#[test]
fn progress_stops_when_the_run_ends_or_the_server_refuses_it() {
    let (mut r, c) = executing_relay();
    let execution = execution_of(&r);
    r.handle_progress(c.id, &execution, report("a", 1.0), at_ms(0))
        .unwrap();
    drain(&mut r);
    r.handle_progress_posted(
        c.id,
        PostOutcome::Rejected("409 progress_refused: not running".into()),
        at_ms(100),
    );
    assert!(
        std::iter::from_fn(|| r.poll_event())
            .any(|e| matches!(e, RelayEvent::ProgressRefused { command, .. } if command == c.id))
    );
    r.handle_progress(c.id, &execution, report("b", 2.0), at_ms(2000))
        .unwrap();
    r.handle_timeout(at_ms(3000));
    assert!(
        !drain(&mut r)
            .iter()
            .any(|a| matches!(a, Action::PostProgress { .. })),
        "no progress after a final refusal"
    );

    let (mut r, c) = executing_relay();
    let execution = execution_of(&r);
    r.handle_progress(c.id, &execution, report("a", 1.0), at_ms(0))
        .unwrap();
    r.handle_progress(c.id, &execution, report("b", 2.0), at_ms(10))
        .unwrap();
    drain(&mut r);
    r.handle_progress_posted(c.id, PostOutcome::Acknowledged, at_ms(20));
    r.handle_execution_finished(c.id, ExecutionOutcome::default(), at_ms(30));
    r.handle_timeout(at_ms(5000));
    assert!(
        !drain(&mut r)
            .iter()
            .any(|a| matches!(a, Action::PostProgress { .. })),
        "the pending report is dropped when the run ends"
    );
}

#[test]
fn progress_of_another_execution_is_dropped_and_an_invalid_report_refused() {
    let (mut r, c) = executing_relay();
    let stale = ExecutionId::parse("exec-stale").unwrap();
    r.handle_progress(c.id, &stale, report("a", 1.0), at_ms(0))
        .unwrap();
    r.handle_progress(command_id(7), &stale, report("a", 1.0), at_ms(0))
        .unwrap();
    assert!(drain(&mut r).is_empty());
    let execution = execution_of(&r);
    assert!(matches!(
        r.handle_progress(c.id, &execution, report("a", 101.0), at_ms(0)),
        Err(InvalidProgress::Percent(_))
    ));
    assert!(drain(&mut r).is_empty());
}

/// An interval relay whose `command(1, 1, "a")` (session 1 needs
/// approval, 600 s) was just claimed at `secs(0)`; `command(2, 1, "a")`
/// is queued behind it. Returns the actions of the grant.
fn waiting_relay() -> (Relay, RelayCommand, Vec<Action>) {
    let mut set = shared(&[(1, "a")]);
    set.require_approval(session(1, "a").graph_session_id, Duration::from_secs(600));
    let mut r = Relay::new(interval(), set, secs(0));
    r.handle_timeout(secs(0));
    let c = command(1, 1, "a");
    pass_with(&mut r, secs(0), vec![c.clone(), command(2, 1, "a")]);
    r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(0));
    let a = drain(&mut r);
    (r, c, a)
}

fn stored_completion(a: &[Action]) -> Option<&ResultEnvelope> {
    a.iter().find_map(|x| match x {
        Action::StoreReport(OutboxItem {
            report: RelayReport::Completion { envelope },
            ..
        }) => Some(envelope),
        _ => None,
    })
}

fn error_of(envelope: &ResultEnvelope) -> Option<&str> {
    envelope.body.as_ref().and_then(|b| b.error.as_deref())
}

#[test]
fn a_run_needing_approval_is_claimed_asked_and_runs_only_once_approved() {
    let (mut r, c, a) = waiting_relay();
    let execution = execution_of(&r);
    assert_eq!(
        a,
        vec![
            Action::AskApproval {
                job: Job {
                    command: c.clone(),
                    execution: execution.clone(),
                    channel: c.id.channel(),
                },
                until: secs(600),
            },
            Action::PostProgress {
                command: c.id,
                execution: execution.clone(),
                report: ProgressReport {
                    message: Some(WAITING_FOR_APPROVAL.into()),
                    percent: None
                }
            },
        ]
    );
    r.handle_progress_posted(c.id, PostOutcome::Acknowledged, secs(0));
    // While it waits: control polls (the lease, a cancel), a sync names it.
    r.handle_timeout(secs(3));
    assert_eq!(
        drain(&mut r),
        vec![Action::Control {
            command: c.id,
            long_poll: false
        }]
    );
    r.handle_control_response(c.id, Ok(go_on()), secs(3));
    assert_eq!(r.executing(), Some(c.id));
    assert_eq!(r.poll_timeout(), Some(secs(6)));
    r.handle_timeout(secs(6));
    assert!(matches!(drain(&mut r).as_slice(), [Action::Control { .. }]));
    r.handle_approval(c.id, ApprovalDecision::Approved, secs(5));
    // The server confirms the run is still ours before anything runs.
    assert_eq!(
        drain(&mut r),
        vec![Action::Claim {
            command: c.id,
            execution: execution.clone()
        }]
    );
    // The control answer that was in flight is ignored meanwhile.
    r.handle_control_response(c.id, Ok(go_on()), secs(5));
    assert!(drain(&mut r).is_empty());
    r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(5));
    let a = drain(&mut r);
    assert!(
        matches!(&a[..], [Action::Execute(job), Action::PostProgress { report, .. }]
            if job.command.id == c.id
                && report.message.as_deref() == Some(APPROVED_ON_THE_DESKTOP)),
        "{a:?}"
    );
    // Control polling goes on for the execution.
    r.handle_timeout(secs(8));
    assert!(
        drain(&mut r)
            .iter()
            .any(|x| matches!(x, Action::Control { .. })),
        "control resumes"
    );
}

#[test]
fn an_approved_run_the_server_closed_during_the_wait_never_starts() {
    let (mut r, c, _) = waiting_relay();
    r.handle_approval(c.id, ApprovalDecision::Approved, secs(200));
    assert!(matches!(drain(&mut r).as_slice(), [Action::Claim { .. }]));
    // Its lease lapsed while the desktop was unreachable.
    r.handle_claim_response(
        c.id,
        ClaimOutcome::Refused("409 start_refused: the command is already failed".into()),
        secs(200),
    );
    let a = drain(&mut r);
    assert!(
        !a.iter()
            .any(|x| matches!(x, Action::Execute(_) | Action::StoreReport(_))),
        "{a:?}"
    );
    assert!(
        matches!(a.as_slice(), [Action::Claim { command, .. }] if *command == command_id(2)),
        "{a:?}"
    );
}

#[test]
fn an_approval_survives_a_confirming_claim_without_an_answer() {
    let (mut r, c, _) = waiting_relay();
    r.handle_approval(c.id, ApprovalDecision::Approved, secs(5));
    drain(&mut r);
    r.handle_claim_response(c.id, ClaimOutcome::Network("timeout".into()), secs(5));
    drain(&mut r);
    r.handle_timeout(secs(20));
    drain(&mut r);
    r.handle_outbox_loaded(vec![], secs(20));
    assert!(matches!(drain(&mut r).as_slice(), [Action::Claim { .. }]));
    r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(20));
    let a = drain(&mut r);
    assert!(
        matches!(a.first(), Some(Action::Execute(job)) if job.command.id == c.id),
        "not asked again: {a:?}"
    );
}

#[test]
fn a_denied_run_fails_with_the_owners_reason_and_never_runs() {
    let (mut r, c, _) = waiting_relay();
    r.handle_approval(
        c.id,
        ApprovalDecision::Denied(Some("  not on my budget ".into())),
        secs(10),
    );
    let a = drain(&mut r);
    assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))), "{a:?}");
    let envelope = stored_completion(&a).expect("a completion");
    assert_eq!(envelope.status, FinishStatus::Failed);
    assert_eq!(
        error_of(envelope),
        Some("Declined on the desktop: not on my budget")
    );
    // Without a reason: the bare text.
    let (mut r, c, _) = waiting_relay();
    r.handle_approval(c.id, ApprovalDecision::Denied(None), secs(10));
    let a = drain(&mut r);
    assert_eq!(
        error_of(stored_completion(&a).unwrap()),
        Some(DECLINED_ON_THE_DESKTOP)
    );
}

#[test]
fn an_approval_that_does_not_come_in_time_fails_the_run_and_withdraws_the_prompt() {
    let (mut r, c, _) = waiting_relay();
    // Control keeps the lease alive meanwhile.
    for t in (3..600).step_by(3) {
        r.handle_timeout(secs(t));
        for action in drain(&mut r) {
            if let Action::Control { .. } = action {
                r.handle_control_response(c.id, Ok(go_on()), secs(t));
            }
        }
    }
    r.handle_timeout(secs(600));
    let a = drain(&mut r);
    assert_eq!(a[0], Action::WithdrawApproval { command: c.id });
    let envelope = stored_completion(&a).expect("a completion");
    assert_eq!(envelope.status, FinishStatus::Failed);
    let error = error_of(envelope).unwrap();
    assert!(
        error.starts_with(NOT_APPROVED_IN_TIME) && error.contains("600 s"),
        "{error}"
    );
    assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))));
    // A late approval changes nothing.
    r.handle_approval(c.id, ApprovalDecision::Approved, secs(601));
    assert!(
        !drain(&mut r)
            .iter()
            .any(|x| matches!(x, Action::Execute(_)))
    );
}

#[test]
fn a_cancel_while_waiting_withdraws_the_prompt_and_ends_cancelled() {
    let (mut r, c, _) = waiting_relay();
    r.handle_timeout(secs(3));
    drain(&mut r);
    r.handle_control_response(c.id, Ok(cancel_asked()), secs(3));
    let a = drain(&mut r);
    assert_eq!(a[0], Action::WithdrawApproval { command: c.id });
    assert!(
        !a.iter()
            .any(|x| matches!(x, Action::Execute(_) | Action::CancelExecution { .. })),
        "{a:?}"
    );
    assert_eq!(
        stored_completion(&a).map(|e| e.status),
        Some(FinishStatus::Cancelled)
    );
    r.handle_approval(c.id, ApprovalDecision::Approved, secs(4));
    assert!(
        !drain(&mut r)
            .iter()
            .any(|x| matches!(x, Action::Execute(_)))
    );
}

#[test]
fn a_cancel_on_the_desktop_stops_the_execution_once_and_ends_cancelled() {
    let (mut r, c) = executing_relay();
    assert!(
        !r.handle_local_cancel(command_id(2), secs(1)),
        "not the current run"
    );
    assert!(r.handle_local_cancel(c.id, secs(1)));
    assert_eq!(
        drain(&mut r),
        vec![Action::CancelExecution { command: c.id }]
    );
    assert_eq!(
        std::iter::from_fn(|| r.poll_event())
            .filter(|e| matches!(e, RelayEvent::CancelledOnTheDesktop { .. }))
            .count(),
        1
    );
    // A second click, or the agent's cancel afterwards, stops nothing twice.
    assert!(!r.handle_local_cancel(c.id, secs(2)));
    r.handle_timeout(secs(3));
    for action in drain(&mut r) {
        assert!(matches!(action, Action::Control { .. }), "{action:?}");
        r.handle_control_response(c.id, Ok(cancel_asked()), secs(3));
    }
    assert!(
        !drain(&mut r)
            .iter()
            .any(|x| matches!(x, Action::CancelExecution { .. }))
    );
    // The Graph finished between the click and the stop: still cancelled,
    // with the owner's word for it, under the run's execution id.
    let outcome = ExecutionOutcome {
        status: Some(FinishStatus::Completed),
        result: json!("done"),
        error: Some("terminated by SIGTERM".into()),
        ..Default::default()
    };
    let execution = execution_of(&r);
    r.handle_execution_finished(c.id, outcome, secs(4));
    let a = drain(&mut r);
    let envelope = stored_completion(&a).expect("a completion");
    assert_eq!(envelope.status, FinishStatus::Cancelled);
    assert_eq!(envelope.execution_id, execution);
    assert_eq!(error_of(envelope), Some(CANCELLED_ON_THE_DESKTOP));
    assert!(!r.handle_local_cancel(c.id, secs(5)), "already reported");
}

#[test]
fn a_cancel_on_the_desktop_while_waiting_withdraws_the_prompt_and_runs_nothing() {
    let (mut r, c, _) = waiting_relay();
    assert!(r.handle_local_cancel(c.id, secs(2)));
    let a = drain(&mut r);
    assert_eq!(a[0], Action::WithdrawApproval { command: c.id });
    assert!(
        !a.iter()
            .any(|x| matches!(x, Action::Execute(_) | Action::CancelExecution { .. })),
        "{a:?}"
    );
    let envelope = stored_completion(&a).expect("a completion");
    assert_eq!(envelope.status, FinishStatus::Cancelled);
    assert!(error_of(envelope).is_some_and(|e| e.starts_with(CANCELLED_ON_THE_DESKTOP)));
    r.handle_approval(c.id, ApprovalDecision::Approved, secs(3));
    assert!(
        !drain(&mut r)
            .iter()
            .any(|x| matches!(x, Action::Execute(_)))
    );
}

#[test]
fn a_cancel_on_the_desktop_after_the_server_closed_the_run_changes_nothing() {
    let (mut r, c) = executing_relay();
    r.handle_timeout(secs(3));
    drain(&mut r);
    let closed = ControlAnswer {
        cancel_requested: false,
        status: CommandStatus::Failed,
    };
    r.handle_control_response(c.id, Ok(closed), secs(3));
    drain(&mut r);
    assert!(!r.handle_local_cancel(c.id, secs(4)));
    assert!(drain(&mut r).is_empty());
}

#[test]
fn consent_withdrawn_while_waiting_is_checked_again_right_before_the_start() {
    let (mut r, c, _) = waiting_relay();
    let mut set = shared(&[]);
    set.require_approval(session(1, "a").graph_session_id, Duration::from_secs(600));
    r.handle_shared_set(set, secs(5));
    drain(&mut r);
    r.handle_approval(c.id, ApprovalDecision::Approved, secs(6));
    let a = drain(&mut r);
    assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))), "{a:?}");
    let envelope = stored_completion(&a).expect("a completion");
    assert_eq!(envelope.status, FinishStatus::Cancelled);
    assert_eq!(error_of(envelope), Some(crate::command::NO_LONGER_SHARED));
}

#[test]
fn a_run_the_server_closed_while_waiting_withdraws_the_prompt_and_reports_nothing() {
    let (mut r, c, _) = waiting_relay();
    r.handle_timeout(secs(3));
    drain(&mut r);
    let closed = ControlAnswer {
        cancel_requested: false,
        status: CommandStatus::Failed,
    };
    r.handle_control_response(c.id, Ok(closed), secs(40));
    let a = drain(&mut r);
    assert_eq!(a[0], Action::WithdrawApproval { command: c.id });
    assert!(stored_completion(&a).is_none(), "{a:?}");
    assert!(
        matches!(&a[1..], [Action::Claim { command, .. }] if *command == command_id(2)),
        "the pass goes on: {a:?}"
    );
}

#[test]
fn a_worker_stopping_while_a_run_waits_gives_it_up_with_a_clear_reason() {
    let (mut r, c, _) = waiting_relay();
    r.handle_shutdown(secs(7));
    let a = drain(&mut r);
    assert_eq!(a[0], Action::WithdrawApproval { command: c.id });
    let envelope = stored_completion(&a).expect("a completion");
    assert_eq!(envelope.status, FinishStatus::Failed);
    assert!(
        error_of(envelope)
            .unwrap()
            .starts_with(WORKER_STOPPED_BEFORE_APPROVAL)
    );
}

#[test]
fn shutdown_stops_the_run_reports_it_flushes_the_outbox_once_and_then_stops() {
    let (mut r, c) = executing_relay();
    r.handle_shutdown(secs(1));
    assert_eq!(
        drain(&mut r),
        vec![Action::CancelExecution { command: c.id }]
    );
    assert!(!r.is_stopped());
    // Nothing new is asked for while the run ends: no control, no pass.
    r.handle_timeout(secs(25));
    assert!(drain(&mut r).is_empty());
    r.handle_execution_finished(
        c.id,
        ExecutionOutcome {
            status: Some(FinishStatus::Cancelled),
            ..Default::default()
        },
        secs(26),
    );
    let a = drain(&mut r);
    let envelope = stored_completion(&a).expect("the run's report");
    assert_eq!(envelope.status, FinishStatus::Cancelled);
    let item = match &a[..] {
        [Action::StoreReport(item)] => item.clone(),
        other => panic!("{other:?}"),
    };
    r.handle_report_stored(c.id, secs(26));
    assert_eq!(drain(&mut r), vec![Action::PostReport(item.clone())]);
    r.handle_report_posted(c.id, PostOutcome::Retry("down".into()), secs(27));
    // The report stays in the outbox, which gets one last attempt.
    assert_eq!(
        drain(&mut r),
        vec![Action::RecordAttempt(c.id), Action::LoadOutbox]
    );
    let older = OutboxItem {
        command: command_id(9),
        report: RelayReport::Declined,
        stored_at: secs(0),
        attempts: 3,
    };
    r.handle_outbox_loaded(vec![older.clone(), item.clone()], secs(27));
    assert_eq!(drain(&mut r), vec![Action::PostReport(older.clone())]);
    r.handle_report_posted(older.command, PostOutcome::Acknowledged, secs(27));
    assert_eq!(
        drain(&mut r),
        vec![
            Action::RemoveReport(older.command),
            Action::PostReport(item)
        ]
    );
    r.handle_report_posted(c.id, PostOutcome::Retry("still down".into()), secs(28));
    assert_eq!(drain(&mut r), vec![Action::RecordAttempt(c.id)]);
    assert!(r.is_stopped());
    let events: Vec<_> = std::iter::from_fn(|| r.poll_event()).collect();
    assert!(events.contains(&RelayEvent::Stopping {
        running: Some(c.id)
    }));
    assert_eq!(
        events.last(),
        Some(&RelayEvent::Stopped {
            delivered: 1,
            kept: 1
        })
    );
    assert_eq!(r.poll_timeout(), None);
    // Later calls change nothing.
    r.handle_shutdown(secs(30));
    r.handle_timeout(secs(90));
    assert!(drain(&mut r).is_empty());
}

#[test]
fn shutdown_gives_up_a_run_that_does_not_end_in_time() {
    let (mut r, c) = executing_relay();
    r.handle_shutdown(secs(1));
    assert_eq!(
        drain(&mut r),
        vec![Action::CancelExecution { command: c.id }]
    );
    let deadline = secs(1).plus(RelayConfig::default().shutdown_timeout);
    assert_eq!(r.poll_timeout(), Some(deadline));
    r.handle_timeout(deadline);
    assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
    r.handle_outbox_loaded(vec![], deadline);
    assert!(r.is_stopped());
    let events: Vec<_> = std::iter::from_fn(|| r.poll_event()).collect();
    assert!(events.contains(&RelayEvent::GaveUpWaiting { command: c.id }));
}

#[test]
fn a_claim_granted_while_stopping_never_runs() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    let c = command(1, 1, "a");
    pass_with(&mut r, secs(0), vec![c.clone()]);
    r.handle_shutdown(secs(1));
    assert!(drain(&mut r).is_empty(), "the claim is in flight");
    r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(2));
    let a = drain(&mut r);
    assert!(!a.iter().any(|x| matches!(x, Action::Execute(_))), "{a:?}");
    let envelope = stored_completion(&a).expect("a completion");
    assert_eq!(envelope.status, FinishStatus::Failed);
    assert_eq!(error_of(envelope), Some(WORKER_STOPPED_BEFORE_START));
}

#[test]
fn shutdown_aborts_a_held_sync_and_syncs_nothing_more() {
    let mut r = Relay::new(RelayConfig::default(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
    r.handle_outbox_loaded(vec![], secs(0));
    let a = drain(&mut r);
    assert!(matches!(a.as_slice(), [Action::Sync(_)]), "{a:?}");
    r.handle_shutdown(secs(1));
    assert_eq!(drain(&mut r), vec![Action::AbortHeldSync]);
    r.handle_sync_response(Err(SyncFailure::Aborted), secs(1));
    assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
    r.handle_outbox_loaded(vec![], secs(1));
    assert!(r.is_stopped());
    r.handle_shared_set(shared(&[(1, "a"), (2, "b")]), secs(2));
    r.handle_timeout(secs(100));
    assert!(drain(&mut r).is_empty());
}

#[test]
fn one_command_at_a_time() {
    let mut r = Relay::new(interval(), shared(&[(1, "a")]), secs(0));
    r.handle_timeout(secs(0));
    let cs: Vec<_> = (1..=3).map(|i| command(i, 1, "a")).collect();
    let mut a = pass_with(&mut r, secs(0), cs.clone());
    for c in &cs {
        assert_eq!(a.len(), 1);
        assert!(matches!(&a[0], Action::Claim { command, .. } if *command == c.id));
        assert!(r.current_command() == Some(c.id));
        r.handle_claim_response(c.id, ClaimOutcome::Granted, secs(1));
        assert!(matches!(drain(&mut r).as_slice(), [Action::Execute(_)]));
        r.handle_execution_finished(c.id, ExecutionOutcome::default(), secs(2));
        drain(&mut r);
        r.handle_report_stored(c.id, secs(2));
        drain(&mut r);
        r.handle_report_posted(c.id, PostOutcome::Acknowledged, secs(2));
        a = drain(&mut r);
        a.retain(|x| !matches!(x, Action::RemoveReport(_)));
    }
    assert!(a.is_empty());
    assert!(!r.is_busy());
}

/// A long-polling relay sharing one session to each of `projects`, past
/// its first pass (whose syncs, answered with nothing, announced its start),
/// its second pass started and its outbox loaded (empty).
fn long_polling_relay(projects: &[&str]) -> Relay {
    let mut set = SharedSet::new();
    for (n, name) in projects.iter().enumerate() {
        let p = ProjectId::parse(name).unwrap();
        set.enable(p.clone());
        set.share(p, session(n as u32 + 1, "a"));
    }
    let mut r = Relay::new(RelayConfig::default(), set, secs(0));
    r.handle_timeout(secs(0));
    for _pass in 0..2 {
        assert_eq!(drain(&mut r), vec![Action::LoadOutbox]);
        r.handle_outbox_loaded(vec![], secs(0));
        if !r.announces_restart() {
            break;
        }
        // The first pass: every sync answered at once, the last one held.
        while let [Action::Sync(request)] = drain(&mut r).as_slice() {
            let held = request.long_poll;
            r.handle_sync_response(Ok(vec![]), secs(0));
            if held {
                break;
            }
        }
    }
    r
}

/// The project and held flag of each sync of a long-polling pass over
/// `projects` whose syncs find nothing, up to its held one.
fn long_poll_syncs(projects: &[&str]) -> Vec<(String, bool)> {
    let mut r = long_polling_relay(projects);
    let mut syncs = Vec::new();
    while let [Action::Sync(request)] = drain(&mut r).as_slice() {
        syncs.push((request.project.as_str().to_owned(), request.long_poll));
        if request.long_poll {
            break;
        }
        r.handle_sync_response(Ok(vec![]), secs(0));
    }
    syncs
}

#[test]
fn a_long_polling_pass_syncs_each_project_once_and_waits_in_the_last_sync() {
    // The first pass of a process syncs unheld, then waits in a held sync
    // (see `long_poll_holds_one_sync_when_idle_and_control_is_held_too`).
    // Later passes, one project: its sync is the wait.
    assert_eq!(long_poll_syncs(&["p1"]), vec![("p1".into(), true)]);
    // Several: the others first, unheld; the last is held.
    assert_eq!(
        long_poll_syncs(&["p1", "p2", "p3"]),
        vec![
            ("p1".into(), false),
            ("p2".into(), false),
            ("p3".into(), true)
        ]
    );
    // A pass that found work does not wait: the claim comes next.
    let mut r = long_polling_relay(&["p1", "p2"]);
    assert!(matches!(
        drain(&mut r).as_slice(),
        [Action::Sync(SyncRequest {
            long_poll: false,
            ..
        })]
    ));
    r.handle_sync_response(Ok(vec![command(7, 1, "a")]), secs(0));
    let a = drain(&mut r);
    assert!(matches!(a.as_slice(), [Action::Claim { .. }]), "{a:?}");
}
