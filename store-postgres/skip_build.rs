// Shared by the build scripts of the crates whose tests need an outside
// dependency (Postgres, the real MCP peers, a chromium browser). `GRAPH_RELAY_SKIP` is a
// comma-separated list of what a machine cannot provide; each name turns on
// a `cfg` under which the tests that need it are compiled as `#[ignore]`d
// with the reason, so `cargo test` lists them as ignored instead of
// passing them without running. Nothing else is ever skipped.

/// Every name `GRAPH_RELAY_SKIP` may contain, with the cfg it sets.
const SKIPPABLE: &[(&str, &str)] = &[
    ("postgres", "graph_relay_skip_postgres"),
    ("peers", "graph_relay_skip_peers"),
    ("browser", "graph_relay_skip_browser"),
];

fn main() {
    println!("cargo::rerun-if-env-changed=GRAPH_RELAY_SKIP");
    for (_, cfg) in SKIPPABLE {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    let skip = std::env::var("GRAPH_RELAY_SKIP").unwrap_or_default();
    for name in skip.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match SKIPPABLE.iter().find(|(known, _)| *known == name) {
            Some((_, cfg)) => println!("cargo::rustc-cfg={cfg}"),
            None => println!(
                "cargo::warning=GRAPH_RELAY_SKIP names `{name}`, which is not one of: postgres, peers, browser"
            ),
        }
    }
}
