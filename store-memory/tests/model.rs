//! Model-based test: random sequences of agent and relay operations applied
//! to `Queue` + `MemoryStore`, checked after every step by the core's
//! reference model (`graph_relay_core::testkit::model`).

use std::sync::Arc;

use graph_relay_core::testkit::model::{check, strategy};
use graph_relay_store_memory::MemoryStore;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn queue_keeps_its_invariants(ops in strategy::ops(60)) {
        check(Arc::new(MemoryStore::new()), &ops);
    }
}
