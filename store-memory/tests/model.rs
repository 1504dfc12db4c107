//! Model-based test: random sequences of agent and relay operations applied
//! to `Queue` + `MemoryStore`, checked after every step by the core's
//! reference model (`graph_relay_core::testkit::model`).

use std::sync::Arc;

use graph_relay_core::testkit::model::{Op, check};
use graph_relay_store_memory::MemoryStore;
use proptest::prelude::*;

fn op() -> impl Strategy<Value = Op> {
    let small = || 0..6u8;
    prop_oneof![
        3 => (small(), small(), small(), small()).prop_map(|(agent, session, key, arg)| Op::Run { agent, session, key, arg }),
        2 => (small(), any::<u8>()).prop_map(|(agent, command)| Op::Get { agent, command }),
        2 => (small(), any::<u8>()).prop_map(|(agent, command)| Op::Cancel { agent, command }),
        2 => (small(), any::<bool>(), 0..16u8).prop_map(|(device, first_project, sessions)| Op::Sync { device, first_project, sessions }),
        3 => (small(), any::<u8>(), small()).prop_map(|(device, command, execution)| Op::Start { device, command, execution }),
        1 => (small(), any::<u8>()).prop_map(|(device, command)| Op::Control { device, command }),
        3 => (small(), any::<u8>(), small(), small(), small())
            .prop_map(|(device, command, execution, status, result)| Op::Complete { device, command, execution, status, result }),
        1 => (small(), any::<u8>()).prop_map(|(device, command)| Op::Decline { device, command }),
        1 => (0..120u16).prop_map(|secs| Op::Advance { secs }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn queue_keeps_its_invariants(ops in proptest::collection::vec(op(), 1..60)) {
        check(Arc::new(MemoryStore::new()), &ops);
    }
}
