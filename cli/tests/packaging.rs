//! Packaging: shell completions and man pages come from the command
//! definitions, and the systemd units under `packaging/` only use commands
//! and options the binary has.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_graph-relay");

fn run(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().expect("run");
    assert!(
        out.status.success(),
        "graph-relay {args:?} exited {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn completions_cover_every_command_in_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = run(&["completions", shell]);
        for command in [
            "demo",
            "serve",
            "worker",
            "status",
            "token",
            "completions",
            "man",
        ] {
            assert!(script.contains(command), "{shell}: no `{command}`");
        }
    }
    assert!(run(&["completions", "bash"]).contains("--metrics"));
}

#[test]
fn man_pages_are_generated_for_the_binary_and_each_command() {
    let page = run(&["man"]);
    assert!(page.contains(".TH graph-relay 1"), "{page}");
    assert!(page.contains("demo"), "{page}");
    let dir = tempfile::tempdir().expect("tempdir");
    run(&["man", "--out", dir.path().to_str().expect("path")]);
    let serve = std::fs::read_to_string(dir.path().join("graph-relay-serve.1")).expect("page");
    assert!(serve.contains(".TH graph-relay-serve 1"), "{serve}");
    assert!(serve.contains(r"\-\-metrics"), "{serve}");
    for name in [
        "graph-relay.1",
        "graph-relay-worker.1",
        "graph-relay-status.1",
        "graph-relay-demo.1",
    ] {
        assert!(dir.path().join(name).exists(), "{name}");
    }
    // The hidden development command gets no page.
    assert!(!dir.path().join("graph-relay-dev-share.1").exists());
}

#[test]
fn the_systemd_units_use_only_existing_commands_and_options() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd");
    for unit in ["graph-relay.service", "graph-relay-worker.service"] {
        let text = std::fs::read_to_string(dir.join(unit)).expect("unit");
        // ExecStart with its continuation lines joined.
        let exec = text
            .replace("\\\n", " ")
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart=").map(str::to_owned))
            .unwrap_or_else(|| panic!("{unit}: no ExecStart"));
        let words: Vec<&str> = exec.split_whitespace().collect();
        assert!(words[0].ends_with("/graph-relay"), "{unit}: {exec}");
        let help = run(&[words[1], "--help"]);
        for flag in words.iter().filter(|w| w.starts_with("--")) {
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "{unit}: `{flag}` is not an option of `graph-relay {}`",
                words[1]
            );
        }
    }
}
