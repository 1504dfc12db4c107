//! Real desktops for `loadtest --cluster --workers N`: `graph-relay
//! worker` processes (long-poll mode, a SQLite outbox, the process
//! executor), each sharing one Graph session through the cluster's load
//! balancer. Their Graph is a shell script that first appends to a ledger
//! the command id it runs under, when it started and the arguments it got
//! (the run's number among them), then sleeps `--run-seconds`: the ledger
//! is what the Graph wrote, and every run a worker executed is counted
//! from it.
//!
//! The workers' status lines that say something went wrong (a failed
//! sync, an unconfirmed start, a report kept in the outbox, the server
//! lost and back, a run closed by the server) are counted by kind with
//! their time, like the in-process desktops' events.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::process::Child;

use super::desktops::reason_kind;
use super::tally::{Party, Tally};
use super::{LoadtestError, PROJECT, session_id};
use crate::children::Watched;

/// The Graph: ledger line first (so a run that is stopped still counts),
/// then the run itself.
const SCRIPT: &str = r#"#!/bin/sh
args=$(cat)
printf '%s %s %s\n' "$GRAPH_RELAY_COMMAND_ID" "$(date +%s%N)" "$args" >> "$LEDGER"
sleep "$RUN_SECONDS"
printf '{"ok": true}'
"#;

/// One execution, as a worker's Graph wrote it.
#[derive(Debug, Clone)]
pub struct LedgerEntry {
    /// The command id it ran under.
    pub command: String,
    /// When the Graph started.
    pub started: SystemTime,
    /// The run's number, from its arguments.
    pub run: Option<u64>,
}

/// The worker processes.
pub struct Workers {
    children: Vec<Child>,
    ledgers: Vec<PathBuf>,
}

impl Workers {
    /// Starts one worker per token against `server`, in folders under
    /// `dir`; worker `k` shares session `session_id(first_session + k)`.
    pub async fn start(
        dir: &Path,
        server: &str,
        tokens: &[String],
        first_session: usize,
        run_seconds: f64,
        tally: Arc<Tally>,
    ) -> Result<Self, LoadtestError> {
        let exe = std::env::current_exe()?;
        let mut workers = Self {
            children: Vec::with_capacity(tokens.len()),
            ledgers: Vec::with_capacity(tokens.len()),
        };
        for (k, token) in tokens.iter().enumerate() {
            let folder = dir.join(format!("worker-{}", k + 1));
            std::fs::create_dir_all(&folder)?;
            std::fs::write(folder.join("device.token"), format!("{token}\n"))?;
            std::fs::write(folder.join("graph.sh"), SCRIPT)?;
            let ledger = folder.join("ledger.txt");
            std::fs::write(
                folder.join("graphs.toml"),
                graphs_file(&session_id(first_session + k), k, &ledger, run_seconds),
            )?;
            let mut child = tokio::process::Command::new("setpriv")
                .args(["--pdeathsig", "KILL", "--"])
                .arg(&exe)
                .args(["worker", "--server", server])
                .arg("--token-file")
                .arg(folder.join("device.token"))
                .arg("--graphs")
                .arg(folder.join("graphs.toml"))
                .arg("--outbox")
                .arg(folder.join("outbox.db"))
                .args(["--progress-every", "0"])
                .env("GRAPH_RELAY_LOG", "warn")
                .watched()
                .spawn()
                .map_err(|e| LoadtestError::Cluster(format!("cannot start a worker: {e}")))?;
            if let Some(stderr) = child.stderr.take() {
                tokio::spawn(read_status_lines(stderr, Arc::clone(&tally)));
            }
            workers.children.push(child);
            workers.ledgers.push(ledger);
        }
        Ok(workers)
    }

    /// Stops every worker (SIGTERM: it reports what it runs and flushes its
    /// outbox), then reads their ledgers.
    pub async fn stop(mut self) -> Vec<LedgerEntry> {
        for child in &mut self.children {
            if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        for child in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(15), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
        self.ledgers
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(parse_ledger_line)
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// The worker's `graphs.toml`: one Graph, `graph.sh`, with its ledger and
/// run time in its environment.
fn graphs_file(session: &str, k: usize, ledger: &Path, run_seconds: f64) -> String {
    // TOML basic strings: the path is escaped as JSON escapes it, which
    // TOML reads the same.
    let ledger = Value::String(ledger.display().to_string()).to_string();
    format!(
        "projects = [\"{PROJECT}\"]\n\n[[graph]]\nid = \"{session}\"\nname = \"Load test worker {}\"\n\
         slug = \"loadtest\"\nversion = \"1\"\nprojects = [\"{PROJECT}\"]\n\
         command = [\"/bin/sh\", \"graph.sh\"]\nworking_dir = \".\"\n\
         env = {{ LEDGER = {ledger}, RUN_SECONDS = \"{run_seconds}\" }}\n",
        k + 1
    )
}

/// `COMMAND_ID START_NANOS ARGUMENTS_JSON`.
fn parse_ledger_line(line: &str) -> Option<LedgerEntry> {
    let mut parts = line.splitn(3, ' ');
    let command = parts.next()?.to_owned();
    let nanos: u64 = parts.next()?.parse().ok()?;
    let arguments: Value = serde_json::from_str(parts.next().unwrap_or("null")).unwrap_or_default();
    Some(LedgerEntry {
        command,
        started: SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos),
        run: arguments["run"].as_u64(),
    })
}

/// Counts the worker's status lines that say something went wrong.
async fn read_status_lines(stderr: tokio::process::ChildStderr, tally: Arc<Tally>) {
    let mut connected = false;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if !connected && line.starts_with("sync: project ") && line.contains(" queued") {
            connected = true;
            tally
                .workers_connected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(kind) = status_kind(&line) {
            tally.observe(Party::Desktop, format!("worker {kind}"));
        }
    }
}

/// The kind of a worker's status line, when it says something went wrong.
fn status_kind(line: &str) -> Option<String> {
    let after = |marker: &str| line.split_once(marker).map(|(_, rest)| reason_kind(rest));
    if line.starts_with("sync: ") {
        return after(" failed: ").map(|k| format!("sync failed: {k}"));
    }
    if line.starts_with("start of ") {
        return after(" unconfirmed (").map(|k| format!("start unconfirmed: {k}"));
    }
    if line.starts_with("delivery of ") {
        return after("(kept in the outbox): ").map(|k| format!("report kept in the outbox: {k}"));
    }
    if line.starts_with("report for ") {
        return after(" dropped: ").map(|k| format!("report dropped: {k}"));
    }
    if line.starts_with("not run ") {
        return Some("start refused".into());
    }
    if line.starts_with("stopping ") && line.contains("the server closed the run") {
        return Some("run closed by the server".into());
    }
    if line.starts_with("warning: server unreachable") {
        return Some("server lost".into());
    }
    if line.starts_with("server reachable again") {
        return Some("server back".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_line_names_the_command_the_start_and_the_run() {
        let e = parse_ledger_line(
            r#"0b3f0e36-9d47-4c4e-9d39-6a3b0e2c1f00 1764832000123456789 {"hold":false,"run":42}"#,
        )
        .expect("a ledger entry");
        assert_eq!(e.command, "0b3f0e36-9d47-4c4e-9d39-6a3b0e2c1f00");
        assert_eq!(e.run, Some(42));
        assert_eq!(
            e.started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .ok(),
            Some(1_764_832_000_123_456_789)
        );
        assert!(parse_ledger_line("torn").is_none());
    }

    #[test]
    fn worker_lines_are_counted_by_kind() {
        let kind = |l: &str| status_kind(l);
        assert_eq!(
            kind("sync: project loadtest failed: 503 Service Unavailable store_unavailable: the store is down").as_deref(),
            Some("sync failed: 503 Service Unavailable store_unavailable")
        );
        assert_eq!(
            kind(
                "delivery of abc failed (kept in the outbox): network error: error sending request"
            )
            .as_deref(),
            Some("report kept in the outbox: no answer (network error)")
        );
        assert_eq!(
            kind("warning: server unreachable (network error); retrying").as_deref(),
            Some("server lost")
        );
        assert_eq!(kind("started abc (execution e1)"), None);
    }

    #[test]
    fn the_graphs_file_loads() {
        let text = graphs_file(&session_id(3), 0, Path::new("/tmp/a \"b\"/ledger.txt"), 0.1);
        let parsed: toml::Value = toml::from_str(&text).expect("TOML");
        assert_eq!(
            parsed["graph"][0]["env"]["LEDGER"].as_str(),
            Some("/tmp/a \"b\"/ledger.txt")
        );
    }
}
