//! A property test of one's own, as a user of the library writes it: the
//! project's operation strategy and reference model, plus an invariant the
//! model does not check, asserted by an observer after every step.

use std::collections::BTreeMap;
use std::sync::Arc;

use graph_relay_core::command::CommandStatus;
use graph_relay_core::testkit::model::{check_with, strategy};
use graph_relay_store_memory::MemoryStore;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    /// Once a run has started, it never shows `queued` again, and its
    /// execution id never changes.
    #[test]
    fn a_started_run_keeps_its_execution(ops in strategy::ops(40)) {
        let store = Arc::new(MemoryStore::new());
        let mut started = BTreeMap::new();
        check_with(store.clone(), &ops, |step| {
            for record in store.commands() {
                let seen = record.at(step.world.queue.now());
                if let Some(first) = started.get(&record.id) {
                    // An observer asserts with a plain panic, which proptest
                    // reports and shrinks like a failed `prop_assert!`.
                    assert_ne!(seen.status, CommandStatus::Queued, "step {}", step.index);
                    assert_eq!(seen.execution_id.as_ref(), Some(first), "step {}", step.index);
                } else if let Some(execution) = &seen.execution_id {
                    started.insert(record.id, execution.clone());
                }
            }
        });
    }
}
