//! The examples run as documented: `cargo test` builds them next to the
//! test binaries (`target/<profile>/examples/`), and this test runs them.

use std::path::PathBuf;
use std::process::Command;

/// The example binary `name` built by this `cargo test`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/examples-… → target/<profile>/examples/<name>
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the profile directory")
        .join("examples");
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test -p graph-relay-store-sqlite` \
         (which builds the examples), not with `--test examples` alone",
        path.display()
    );
    path
}

#[test]
fn the_in_process_desktop_example_runs_a_graph_on_sqlite_in_long_poll_mode() {
    let out = Command::new(example("in_process_desktop"))
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("Completed: Some(ResultEnvelope"),
        "{stdout}"
    );
    assert!(stdout.contains(r#""hello": String("desktop")"#), "{stdout}");
}
