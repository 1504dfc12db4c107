//! The README and the book, run. Every fenced block in README.md and in
//! each `docs/*.md` page carries a marker on the line before it,
//! `<!-- readme-test: NAME -->` for a block this test runs (names are
//! unique across all the files) or `<!-- readme-test: skip: REASON -->`; a
//! block without one fails the test, naming its file and line, so a new
//! snippet cannot go untested unnoticed.
//!
//! What runs, extracted from the documents themselves:
//! - `first-commands`: the `demo` line (with `--once`, so it ends); its
//!   `serve` line starts the quick start's server;
//! - the quick start end to end, in an empty folder: `serve` as written
//!   (plus `--listen 127.0.0.1:0`, so that the test needs no fixed port;
//!   every `127.0.0.1:8787` in the snippets becomes the bound address), the
//!   device token it prints saved in `device.token`, `quickstart-graphs` as
//!   `graphs.toml`, `echo-script` as `echo.sh`, the `quickstart-worker`
//!   command, the `quickstart-python` client (its `TOKEN` set to the agent
//!   token `serve` printed) with the Python of the real MCP peers, and
//!   `status-command` on the database it left;
//! - `loadtest-small` runs as is (the harness starts its own server);
//!   `cluster-faults` and `cluster-soak`, which take minutes, are checked
//!   to be accepted as written (`cli/tests/fault_cluster.rs` runs the
//!   harness at CI scale);
//! - the configuration examples: `config-server` and `config-oauth` load
//!   as `graph-relay.toml`, `graphs-reference` loads in a worker, and the
//!   `stdio-config` client configuration starts `graph-relay stdio`;
//! - the embedding examples `embed-example` and `in-process-example`: each
//!   `cargo run -p PKG --example NAME` line runs the example binary that
//!   `cargo test --workspace` built (`target/<profile>/examples/NAME`, next
//!   to this test's binary), which must end well and print something;
//! - `console-script` lists a worker's console while a run waits there for
//!   approval, then declines it, and the agent reads the decline.
//!
//! `cargo run --release -p graph-relay --` and a leading `graph-relay`
//! become this build's binary. Nothing is written outside temporary
//! folders (HOME and XDG_DATA_HOME point into them for the worker).

mod common;
use common::Proc;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_graph-relay");
const DEADLINE: Duration = Duration::from_secs(30);

/// A fenced block of the README or of a `docs/*.md` page.
#[derive(Debug, Clone)]
struct Block {
    /// The file it is in, relative to the repository (`docs/operating.md`).
    file: String,
    /// The info string's first word (`sh`, `python`, …).
    language: String,
    /// Its text, without the fences (and without a list item's indent).
    text: String,
    /// Line of the opening fence (1-based).
    line: usize,
}

impl Block {
    /// `file:line` of the opening fence, for messages.
    fn at(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// The documents whose blocks are read: README.md, then every `docs/*.md`
/// in name order, each as (path relative to the repository, text).
fn documents() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut names = vec!["README.md".to_owned()];
    let mut pages: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("the docs folder")
        .map(|e| {
            e.expect("docs entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.sort();
    names.extend(pages);
    names
        .into_iter()
        .map(|name| {
            let text =
                std::fs::read_to_string(root.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, text)
        })
        .collect()
}

/// Every document's named blocks by marker name; panics on a block
/// without a marker and on a name used twice.
fn readme_blocks() -> BTreeMap<String, Block> {
    let mut blocks: BTreeMap<String, Block> = BTreeMap::new();
    for (file, text) in documents() {
        for (marker, block) in file_blocks(&file, &text) {
            if let Some(first) = blocks.get(&marker) {
                panic!(
                    "{}: a second block named `{marker}` (the first is at {})",
                    block.at(),
                    first.at()
                );
            }
            blocks.insert(marker, block);
        }
    }
    blocks
}

/// The named blocks of one document, in order; skipped blocks are checked
/// for a reason and left out.
fn file_blocks(file: &str, document: &str) -> Vec<(String, Block)> {
    let lines: Vec<&str> = document.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        if !fence.starts_with("```") {
            i += 1;
            continue;
        }
        let indent = lines[i].len() - fence.len();
        let language = fence
            .trim_start_matches('`')
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned();
        let marker = i
            .checked_sub(1)
            .map(|p| lines[p].trim())
            .and_then(|l| l.strip_prefix("<!-- readme-test: "))
            .and_then(|l| l.strip_suffix(" -->"))
            .unwrap_or_else(|| {
                panic!(
                    "{file}:{}: a ```{language} block without a `<!-- readme-test: NAME -->` \
                     (or `skip: REASON`) line before it",
                    i + 1
                )
            })
            .to_owned();
        let start = i;
        i += 1;
        let mut text = String::new();
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            let line = lines[i];
            text.push_str(line.get(indent.min(line.len())..).unwrap_or(line));
            text.push('\n');
            i += 1;
        }
        assert!(i < lines.len(), "{file}:{}: unclosed block", start + 1);
        i += 1;
        if marker.starts_with("skip:") {
            assert!(
                marker.len() > "skip: ".len() + 3,
                "{file}:{}: say why the block is not run",
                start + 1
            );
            continue;
        }
        let block = Block {
            file: file.to_owned(),
            language,
            text,
            line: start + 1,
        };
        blocks.push((marker, block));
    }
    blocks
}

fn block(blocks: &BTreeMap<String, Block>, name: &str, language: &str) -> Block {
    let b = blocks
        .get(name)
        .unwrap_or_else(|| panic!("no block marked `{name}` in README.md or docs/*.md"))
        .clone();
    assert_eq!(b.language, language, "{}: `{name}`", b.at());
    b
}

/// The `graph-relay` arguments of a README command line (`cargo run
/// --release -p graph-relay -- …` or `graph-relay …`), comment removed.
fn command_args(line: &str) -> Option<Vec<String>> {
    let line = line.split(" #").next()?.trim();
    let rest = line
        .strip_prefix("cargo run --release -p graph-relay -- ")
        .or_else(|| line.strip_prefix("graph-relay "))?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The one line of `block` that runs the `graph-relay` command `command`.
fn command_line(block: &Block, command: &str) -> Vec<String> {
    block
        .text
        .lines()
        .filter_map(command_args)
        .find(|args| args.first().is_some_and(|a| a == command))
        .unwrap_or_else(|| panic!("{}: no `{command}` command in:\n{}", block.at(), block.text))
}

/// `graph-relay <args>` in `cwd` with the environment a reader has (no
/// log or data-directory overrides from the test's own), plus `env`.
fn spawn(args: &[String], cwd: &Path, env: &[(&str, &Path)]) -> Proc {
    Proc::spawn_with(args, cwd, DEADLINE, |command| {
        command
            .env_remove("GRAPH_RELAY_LOG")
            .env_remove("XDG_DATA_HOME");
        for (name, value) in env {
            command.env(name, value);
        }
    })
}

fn run_ok(args: &[String], cwd: &Path) -> String {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run graph-relay");
    assert!(
        out.status.success(),
        "graph-relay {args:?} exited {}:\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_readme_block_is_run_or_says_why_not() {
    let blocks = readme_blocks();
    for name in [
        "first-commands",
        "quickstart-python",
        "quickstart-graphs",
        "quickstart-worker",
        "echo-script",
        "status-command",
        "loadtest-small",
        "stdio-config",
        "config-server",
        "config-oauth",
        "graphs-reference",
        "embed-example",
        "in-process-example",
        "console-script",
        "haproxy-config",
        "nginx-config",
        "cluster-faults",
        "cluster-soak",
    ] {
        assert!(
            blocks.contains_key(name),
            "no block `{name}` in README.md or docs/*.md"
        );
    }
    assert_eq!(
        blocks.len(),
        18,
        "a block is marked but not run: {:?}",
        blocks
            .iter()
            .map(|(n, b)| format!("{n} ({})", b.at()))
            .collect::<Vec<_>>()
    );
}

/// The fault run and the soak of the operating guide take minutes (the
/// soak half an hour); `cli/tests/fault_cluster.rs` runs the same harness
/// at CI scale. Here each documented command must be accepted as written:
/// with `--fault-gap 0` in it, it stops at that bound, which is checked
/// after every flag was parsed and the bounds before it (desktops, agents,
/// rate, duration, fault hold) held, and before anything starts.
#[test]
fn the_cluster_fault_commands_are_accepted() {
    let blocks = readme_blocks();
    for name in ["cluster-faults", "cluster-soak"] {
        let b = block(&blocks, name, "sh");
        let mut args = command_line(&b, "loadtest");
        assert!(
            args.iter().any(|a| a == "--cluster"),
            "{}: not a cluster run",
            b.at()
        );
        match args.iter().position(|a| a == "--fault-gap") {
            Some(i) => args[i + 1] = "0".into(),
            None => args.extend(["--fault-gap".into(), "0".into()]),
        }
        let out = Command::new(BIN)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run loadtest");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("--fault-gap must be above 0"),
            "{}: {args:?}: {stderr}",
            b.at()
        );
    }
}

/// The package and example of a README line `cargo run [--release] -p PKG
/// --example NAME`, comment removed.
fn example_args(line: &str) -> Option<(String, String)> {
    let line = line.split(" #").next()?.trim();
    let rest = line.strip_prefix("cargo run ")?;
    let rest = rest.strip_prefix("--release ").unwrap_or(rest);
    let words: Vec<&str> = rest.split_whitespace().collect();
    match words.as_slice() {
        ["-p", package, "--example", name] => Some(((*package).to_owned(), (*name).to_owned())),
        _ => None,
    }
}

/// The example binary `name` of `package` as `cargo test --workspace`
/// builds it: `target/<profile>/examples/<name>`, beside the `deps` folder
/// holding this test's binary.
fn example_binary(package: &str, name: &str) -> PathBuf {
    // The example's source is where the docs say: the package's folder
    // is its name without `graph-relay-` (`cli` for the binary's package).
    let folder = match package.strip_prefix("graph-relay-") {
        Some(folder) => folder,
        None if package == "graph-relay" => "cli",
        None => panic!("docs: `{package}` is not a package of this workspace"),
    };
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(folder)
        .join("examples")
        .join(format!("{name}.rs"));
    assert!(
        source.exists(),
        "docs: {package} has no example `{name}` ({} is missing)",
        source.display()
    );
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the profile directory")
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: run `cargo test --workspace`, which builds every example \
         (`--test readme` or `-p graph-relay` alone does not build {package}'s)",
        path.display()
    );
    path
}

#[test]
fn the_embedding_examples_run() {
    let blocks = readme_blocks();
    for name in ["embed-example", "in-process-example"] {
        let b = block(&blocks, name, "sh");
        let examples: Vec<(String, String)> = b.text.lines().filter_map(example_args).collect();
        assert!(
            !examples.is_empty(),
            "{}: no `cargo run -p PKG --example NAME` line in:\n{}",
            b.at(),
            b.text
        );
        for (package, example) in examples {
            let cwd = tempfile::tempdir().expect("cwd");
            let out = Command::new(example_binary(&package, &example))
                .current_dir(cwd.path())
                .stdin(Stdio::null())
                .output()
                .expect("run the example");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{}: {package} --example {example} exited {}:\n{stdout}\n{}",
                b.at(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                !stdout.trim().is_empty(),
                "{}: {package} --example {example} printed nothing",
                b.at()
            );
        }
    }
}

#[test]
fn the_small_load_test_runs_every_run_exactly_once() {
    let blocks = readme_blocks();
    let args = command_line(&block(&blocks, "loadtest-small", "sh"), "loadtest");
    let cwd = tempfile::tempdir().expect("cwd");
    let stdout = run_ok(&args, cwd.path());
    assert!(stdout.contains("twice 0  never 0"), "{stdout}");
    assert!(stdout.contains("errors none"), "{stdout}");
    // The baselines beside the server's CPU per run: `cargo test
    // --workspace` builds the rmcp_echo and fixed_reply examples beside the
    // binary, where the harness finds them.
    for line in [
        "server CPU per run ",
        "baseline rmcp echo ",
        "baseline fixed reply ",
        "a run costs the server ",
    ] {
        assert!(stdout.contains(line), "no `{line}` in:\n{stdout}");
    }
}

#[test]
fn the_first_command_runs_the_demo() {
    let blocks = readme_blocks();
    let first = block(&blocks, "first-commands", "sh");
    let mut demo = command_line(&first, "demo");
    demo.push("--once".into());
    let cwd = tempfile::tempdir().expect("cwd");
    let stdout = run_ok(&demo, cwd.path());
    assert!(stdout.contains("The scripted flow is done."), "{stdout}");
    assert_eq!(std::fs::read_dir(cwd.path()).expect("cwd").count(), 0);
}

#[test]
fn the_configuration_examples_load() {
    let blocks = readme_blocks();
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["config-server", "config-oauth"] {
        let b = block(&blocks, name, "toml");
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(&config, &b.text).expect("config");
        run_ok(
            &[
                "token".into(),
                "list".into(),
                "--config".into(),
                config.display().to_string(),
            ],
            dir.path(),
        );
    }

    // The full graphs.toml reference loads in a worker.
    let b = block(&blocks, "graphs-reference", "toml");
    std::fs::write(dir.path().join("graphs.toml"), &b.text).expect("graphs");
    std::fs::write(dir.path().join("device.token"), "grd_readme\n").expect("token");
    let home = tempfile::tempdir().expect("home");
    let worker = spawn(
        &[
            "worker",
            "--server",
            "http://127.0.0.1:9",
            "--token-file",
            "device.token",
            "--graphs",
            "graphs.toml",
        ]
        .map(String::from),
        dir.path(),
        &[("HOME", home.path())],
    );
    worker.wait_line("worker: relaying graphs.toml");
    assert!(
        !worker.lines().join("\n").contains("graph-relay: "),
        "{}",
        worker.lines().join("\n")
    );
    drop(worker);

    // The stdio client configuration starts a server over stdio that ends
    // when its client closes stdin.
    let b = block(&blocks, "stdio-config", "json");
    let folder = format!("{}/", dir.path().display());
    let config: serde_json::Value =
        serde_json::from_str(&b.text.replace("/path/to/", &folder)).expect("JSON");
    let server = &config["mcpServers"]["graph-relay"];
    assert_eq!(server["command"], "graph-relay");
    let args: Vec<String> = server["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg").to_owned())
        .collect();
    // Its configuration holds the development agent, as `serve` writes it.
    let boot = spawn(
        &["serve", "--listen", "127.0.0.1:0"].map(String::from),
        dir.path(),
        &[],
    );
    boot.wait_line("serving MCP at");
    drop(boot);
    let out = Command::new(BIN)
        .args(&args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("stdio");
    assert!(
        out.status.success(),
        "graph-relay {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
fn the_quick_start_runs_as_written() {
    let blocks = readme_blocks();
    let python = common::peers().python;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = tempfile::tempdir().expect("home");
    let cwd = dir.path();

    // `serve`, as the first commands say (on a free port).
    let mut serve = command_line(&block(&blocks, "first-commands", "sh"), "serve");
    serve.extend(["--listen".into(), "127.0.0.1:0".into()]);
    let server = spawn(&serve, cwd, &[]);
    let line = server.wait_line("serving MCP at http://");
    let address = line
        .split("serving MCP at http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .expect("address")
        .to_owned();
    let token = |kind: &str| {
        server
            .wait_line(kind)
            .split_whitespace()
            .last()
            .expect("token")
            .to_owned()
    };
    let agent_token = token("agent  dev-agent");
    let device_token = token("device dev-desktop");
    let local = |text: &str| text.replace("127.0.0.1:8787", &address);

    // "save the device token printed by `serve` in `device.token`, declare
    // each Graph in `graphs.toml`, and start the relay".
    std::fs::write(cwd.join("device.token"), format!("{device_token}\n")).expect("token");
    let graphs = block(&blocks, "quickstart-graphs", "toml");
    std::fs::write(cwd.join("graphs.toml"), &graphs.text).expect("graphs");
    let echo = block(&blocks, "echo-script", "sh");
    let script = cwd.join("echo.sh");
    std::fs::write(&script, &echo.text).expect("echo.sh");
    set_executable(&script);
    let worker_block = block(&blocks, "quickstart-worker", "sh");
    let worker_args: Vec<String> = command_line(&worker_block, "worker")
        .iter()
        .map(|a| local(a))
        .collect();
    let data = home.path().join("data");
    let worker = spawn(
        &worker_args,
        cwd,
        &[("HOME", home.path()), ("XDG_DATA_HOME", &data)],
    );
    worker.wait_line("sync: project default");

    // The Python client, as written, with the printed agent token.
    let client = block(&blocks, "quickstart-python", "python");
    let mut code = local(&client.text);
    let token_line = code
        .lines()
        .find(|l| l.starts_with("TOKEN = "))
        .expect("the TOKEN line")
        .to_owned();
    code = code.replace(&token_line, &format!("TOKEN = \"{agent_token}\""));
    let path = cwd.join("quickstart.py");
    std::fs::write(&path, code).expect("quickstart.py");
    let out = Command::new(&python)
        .arg(&path)
        .current_dir(cwd)
        .output()
        .expect("python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the quick start's Python failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "run_graph_session",
        "'project_id': 'default'",
        "'name': 'Echo'",
        "Queued ticket, not a result",
    ] {
        assert!(stdout.contains(needle), "no `{needle}` in:\n{stdout}");
    }
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        ["queued", "running", "completed"].contains(&last.trim()),
        "the run's status: {stdout}"
    );
    worker.wait_line("delivered ");
    assert!(
        worker.lines().join("\n").contains(": completed"),
        "{}",
        worker.lines().join("\n")
    );

    // `graph-relay status` on the database the quick start left.
    let status = command_line(&block(&blocks, "status-command", "sh"), "status");
    let text = run_ok(&status, cwd);
    assert!(text.contains("dev-desktop"), "{text}");
    assert!(text.contains("online"), "{text}");
    assert!(text.contains("completed 1"), "{text}");

    // The outbox went to the data directory, nothing to the real HOME.
    assert!(data.join("graph-relay").is_dir());
    drop(worker);
    drop(server);
    let mut left: Vec<String> = std::fs::read_dir(cwd)
        .expect("cwd")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("graph-relay.db"))
        .collect();
    left.sort();
    assert_eq!(
        left,
        vec![
            "device.token",
            "echo.sh",
            "graph-relay.toml",
            "graphs.toml",
            "quickstart.py"
        ]
    );
}

fn set_executable(path: &PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let mut permissions = std::fs::metadata(path).expect("metadata").permissions();
    permissions.set_mode(0o755);
    std::fs::set_permissions(path, permissions).expect("chmod");
}

/// The desktop console's script, as written, against a worker's console
/// while a run waits there for approval: it lists the run, declines it,
/// and the agent reads the decline.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
async fn the_console_script_lists_and_declines_a_waiting_run() {
    const AGENT_TOKEN: &str = "gra_readme_console_agent_0123456789abcdef";
    const DEVICE_TOKEN: &str = "grd_readme_console_device_0123456789abcdef";
    const GS: &str = "gs_0123456789abcdef0123456789abcdef";
    let blocks = readme_blocks();
    let script = block(&blocks, "console-script", "python");
    let python = common::peers().python;

    let relay = common::Relay::new(&[("assistant", AGENT_TOKEN)], DEVICE_TOKEN, DEADLINE);
    relay.script("g", "cat > /dev/null\necho '{\"ran\": true}'\n");
    relay.write_graphs(&[(GS, "g", &["p1"])], "approval = \"always\"\n");
    std::fs::write(relay.path("console.py"), &script.text).expect("console.py");
    let (_server, url) = relay.serve("127.0.0.1:0", &["--db", "queue.db"]);
    let worker = relay.worker(&url, "outbox.db", "2", &["--console", "127.0.0.1:0"]);
    let console = worker
        .wait_line("console: http://")
        .split("console: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the console URL")
        .to_owned();
    worker.wait_line("sync: project p1");
    let script_run = |args: &[&str]| {
        let out = Command::new(&python)
            .arg("console.py")
            .arg(&console)
            .args(args)
            .current_dir(relay.dir.path())
            .output()
            .expect("python");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        (out.status.success(), format!("{stdout}{stderr}"))
    };

    // Runs the script without an answer until its listing shows `needle`.
    let listed = |needle: &str| {
        let deadline = std::time::Instant::now() + DEADLINE;
        loop {
            let (ok, out) = script_run(&[]);
            assert!(ok, "{}: {out}", script.at());
            if out.contains(needle) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{}: never listed `{needle}`:\n{out}",
                script.at()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };

    let id = relay
        .run(&url, GS, "readme-console-0001", serde_json::json!({}))
        .await;
    listed(&format!("waiting  {id} g "));

    let (ok, out) = script_run(&[&id, "deny"]);
    assert!(ok, "{}: {out}", script.at());
    assert!(out.contains(&format!("deny {id} 200 ok")), "{out}");
    let run = relay.wait_status(&url, &id, "failed").await;
    assert_eq!(run["error"], "Declined on the desktop: declined by script");

    // Answered: nothing waits under that id any more, and the script says so.
    let (ok, out) = script_run(&[&id, "approve"]);
    assert!(!ok, "{out}");
    assert!(out.contains("404 no run waits under this id"), "{out}");
    listed(&format!(
        "finished {id} g failed Declined on the desktop: declined by script"
    ));
}

/// The load balancer configurations of the operating guide are valid for
/// the real HAProxy and nginx (Debian's packages; `.ci/run` installs them):
/// each is checked by the program itself, as written.
#[test]
fn the_load_balancer_configs_are_valid() {
    let blocks = readme_blocks();
    let dir = tempfile::tempdir().expect("temp dir");
    let checks: [(&str, &str, &str, Vec<String>); 2] = [
        (
            "haproxy-config",
            "haproxy",
            "/usr/sbin/haproxy",
            vec!["-c".into(), "-f".into()],
        ),
        (
            "nginx-config",
            "nginx",
            "/usr/sbin/nginx",
            vec![
                "-t".into(),
                "-p".into(),
                dir.path().display().to_string(),
                "-e".into(),
                dir.path().join("error.log").display().to_string(),
                "-c".into(),
            ],
        ),
    ];
    for (name, language, program, args) in checks {
        let block = block(&blocks, name, language);
        assert!(
            Path::new(program).is_file(),
            "{}: checking it needs {program}: `apt-get install -y {language}` (.ci/run does)",
            block.at()
        );
        let file = dir.path().join(format!("{name}.conf"));
        std::fs::write(&file, &block.text).expect("write the config");
        let out = Command::new(program)
            .args(&args)
            .arg(&file)
            .output()
            .expect("run the load balancer's check");
        assert!(
            out.status.success(),
            "{}: {program} refuses it:\n{}{}",
            block.at(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
