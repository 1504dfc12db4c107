//! Tests of the queue's configuration and of what every queue future must
//! be. The operations are tested through the store conformance suite, the
//! MCP snapshots and the simulator; pure parts are tested next to their code.

use super::*;
use crate::envelope::ResultEnvelope;
use crate::ids::ExecutionId;

#[test]
fn the_readiness_probe_ids_are_valid() {
    assert!(OwnerId::parse(READINESS_PROBE.0).is_ok());
    assert!(DeviceId::parse(READINESS_PROBE.1).is_ok());
}

/// Multi-threaded runtimes need every queue future to be `Send`.
#[allow(dead_code)]
fn queue_futures_are_send(
    q: &Queue,
    agent: &Agent,
    device: &Device,
    id: &CommandId,
    env: &ResultEnvelope,
) {
    fn send<T: Send>(_: T) {}
    let exec = ExecutionId::parse("e").expect("valid");
    send(q.cancel_graph_run(agent, id));
    send(q.get_graph_run(agent, id));
    send(q.start(device, id, &exec));
    send(q.complete(device, id, env));
    send(q.decline(device, id));
    send(q.control(device, id));
    send(q.prune());
}

#[test]
fn a_control_request_is_held_for_at_most_a_third_of_its_runs_lease() {
    let c = QueueConfig::default();
    // The default lease (60 s): the hold is a third of it, 20 s.
    assert_eq!(c.control_hold(c.lease(true)), Duration::from_secs(20));
    // `serve --lease-seconds 10`: 3.33 s, not the 25 s long-poll hold.
    assert_eq!(
        c.control_hold(Duration::from_secs(10)),
        Duration::from_nanos(3_333_333_333)
    );
    // An interval-mode lease held by a desktop that long-polls control.
    assert_eq!(c.control_hold(c.lease(false)), Duration::from_secs(10));
    // A long lease: the long-poll hold.
    assert_eq!(c.control_hold(Duration::from_secs(600)), c.long_poll_hold);
    for lease in [1, 2, 9, 10, 30, 60, 74, 75, 76, 3_600] {
        let lease = Duration::from_secs(lease);
        let hold = c.control_hold(lease);
        assert!(hold <= c.long_poll_hold && hold * 3 <= lease, "{lease:?}");
    }
}

#[test]
fn an_interval_lease_spans_at_least_three_control_polls() {
    for (controls, lease) in [(1, 9), (2, 9), (3, 9), (10, 30)] {
        let c = QueueConfig {
            lease_interval_controls: controls,
            ..QueueConfig::default()
        };
        assert_eq!(c.lease(false), Duration::from_secs(lease), "{controls}");
    }
}
