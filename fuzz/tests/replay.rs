//! Replays the committed corpora (and a seeded sweep of extra inputs)
//! through every target, so the normal test suite checks the fuzz
//! invariants without a fuzzing campaign.

use std::path::Path;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 5] = [
    ("mcp_message", graph_relay_fuzz::mcp_message),
    ("tool_args", graph_relay_fuzz::tool_args),
    ("queue_ops", graph_relay_fuzz::queue_ops),
    ("envelope", graph_relay_fuzz::envelope),
    ("relay_events", graph_relay_fuzz::relay_events),
];

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            (
                p.display().to_string(),
                std::fs::read(&p).expect("readable corpus file"),
            )
        })
        .collect()
}

#[test]
fn every_target_has_a_seed_corpus_and_replays_it() {
    for (name, target) in TARGETS {
        let inputs = corpus(name);
        assert!(!inputs.is_empty(), "{name} has no corpus");
        for (path, bytes) in inputs {
            eprintln!("replaying {path}");
            target(&bytes);
        }
    }
}

#[test]
fn seeded_sweep_of_random_inputs() {
    let mut state = 0x2026_1130_u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as u8
    };
    for (name, target) in TARGETS {
        for round in 0..150 {
            let len = [8usize, 32, 128, 512][round % 4];
            let bytes: Vec<u8> = (0..len).map(|_| next()).collect();
            let result = std::panic::catch_unwind(|| target(&bytes));
            assert!(result.is_ok(), "{name} failed on {bytes:?}");
        }
    }
}
