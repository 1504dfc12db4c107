//! The process executor: one OS process per run, as declared in `graphs.toml`.
//!
//! - The process starts in its own process group, in the Graph's working
//!   directory, with the Graph's environment plus `GRAPH_RELAY_COMMAND_ID`,
//!   `GRAPH_RELAY_EXECUTION_ID` and `GRAPH_RELAY_CHANNEL`.
//! - The arguments are written to its stdin as one JSON object, then stdin
//!   is closed.
//! - Its stdout is the result: parsed as JSON if the whole text is JSON,
//!   otherwise kept as a string (trailing newlines removed; empty → `null`).
//! - Usage: if the **last non-empty line** of stdout is exactly a JSON object
//!   with the single key `graph_relay`, e.g.
//!   `{"graph_relay": {"total_tokens": 1234, "reported_cost": 0.02}}`,
//!   that line is removed from the result and its `total_tokens` (a
//!   non-negative integer) and `reported_cost` (a number) are reported; both
//!   are optional and `null` otherwise.
//! - Exit status 0 is `completed`; anything else is `failed` with the tail of
//!   stderr (at most 2,000 UTF-16 units) as the error. Passing the Graph's
//!   `timeout_seconds` is `failed` too.
//! - Cancellation (and the timeout) send SIGTERM to the whole process group,
//!   then SIGKILL after the grace period. When the main process ends, the
//!   group is sent SIGKILL as well, so no child it left behind outlives the run.
//! - A program given as a relative path was resolved against the graphs
//!   file's folder when the file was read ([`crate::graphs`]).
//! - With a ledger ([`ProcessExecutor::with_ledger`], the outbox file), the
//!   group and its leader's start time are recorded right after the process
//!   started, before its arguments are written, and the record is removed
//!   when the run ended; the next worker ends a group a crashed worker left
//!   behind ([`crate::orphans`]).
//! - On Linux the process gets SIGTERM from the kernel if the worker dies
//!   (`PR_SET_PDEATHSIG`; see [`prepare_child`]).
//! - Progress: the process finds the write end of a pipe on file descriptor
//!   3, named in `GRAPH_RELAY_PROGRESS_FD`, and may write JSON lines to it,
//!   `{"message": "step 2 of 5: fetching", "percent": 40}` (both fields
//!   optional, at least one given; the message at most 500 characters, the
//!   percent from 0 to 100). Each valid line goes to the run's
//!   [`ProgressSink`]; an invalid line (not such an object, a line longer
//!   than [`MAX_PROGRESS_LINE`] bytes) is ignored, and the first one of a run
//!   is logged. Its children inherit the descriptor; a process that never
//!   writes to it (or closes it) runs as before.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use graph_relay_core::envelope::{FinishStatus, cut_utf16};
use graph_relay_core::ids::CommandId;
use graph_relay_core::limits::ERROR_LIMIT;
use graph_relay_core::relay::executor::{CancelSignal, Executor, ProgressReport, ProgressSink};
use graph_relay_core::relay::{ExecutionOutcome, Job};
use graph_relay_store_sqlite::SqliteOutbox;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::graphs::{GraphSpec, SpecTable};
use crate::orphans;

/// Most stdout bytes kept (a larger result is truncated by the envelope anyway).
const STDOUT_CAP: usize = 16 * 1024 * 1024;
/// Most stderr bytes kept (only the tail is reported).
const STDERR_TAIL: usize = 64 * 1024;
/// How long to wait for the pipes to close after the process group is gone.
const PIPE_DRAIN: Duration = Duration::from_secs(5);
/// The file descriptor the Graph's process writes progress lines to.
pub const PROGRESS_FD: RawFd = 3;
/// The longest progress line read, in bytes (newline excluded); a longer
/// line is discarded whole.
pub const MAX_PROGRESS_LINE: usize = 4096;

/// Runs Graphs as processes; see the module docs.
#[derive(Debug, Clone)]
pub struct ProcessExecutor {
    specs: SpecTable,
    grace: Duration,
    ledger: Option<Arc<SqliteOutbox>>,
}

impl ProcessExecutor {
    /// An executor reading run specifications from `specs`; SIGKILL follows
    /// SIGTERM after `grace`.
    pub fn new(specs: SpecTable, grace: Duration) -> Self {
        Self {
            specs,
            grace,
            ledger: None,
        }
    }

    /// Records every process group it starts in `outbox` until the run
    /// ended, for [`orphans::end_left_over`] in the next worker.
    pub fn with_ledger(mut self, outbox: Arc<SqliteOutbox>) -> Self {
        self.ledger = Some(outbox);
        self
    }
}

/// Sets up the Graph's process between fork and exec:
///
/// - the write end of the progress pipe, `progress` (close-on-exec in the
///   worker), becomes [`PROGRESS_FD`] in the child, inherited across exec;
/// - on Linux, the kernel is asked to send SIGTERM to the process when the
///   worker dies, so that a worker killed with SIGKILL does not leave it
///   running (elsewhere the next worker's [`orphans::end_left_over`] is the
///   only guard). The signal is tied to the *thread* that starts the
///   process; runs start from the tokio runtime's worker threads, which live
///   as long as the worker.
#[allow(unsafe_code)]
fn prepare_child(command: &mut tokio::process::Command, progress: RawFd) {
    #[cfg(target_os = "linux")]
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child between fork and exec,
    // where only async-signal-safe operations are allowed. It makes only
    // system calls: dup2(2) or fcntl(2) on two plain descriptor numbers (the
    // parent's write end stays open until after the spawn returned, so the
    // child's copy is valid), and on Linux prctl(2) and getppid(2) through
    // nix's thin wrappers. It allocates nothing, takes no lock and touches no
    // memory shared with the parent's other threads; its errors are built
    // from raw errnos, which does not allocate either.
    unsafe {
        command.pre_exec(move || {
            let moved = if progress == PROGRESS_FD {
                // Already in place: only clear its close-on-exec flag.
                nix::libc::fcntl(PROGRESS_FD, nix::libc::F_SETFD, 0)
            } else {
                // dup2 leaves the new descriptor without close-on-exec.
                nix::libc::dup2(progress, PROGRESS_FD)
            };
            if moved == -1 {
                return Err(std::io::Error::last_os_error());
            }
            #[cfg(target_os = "linux")]
            {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)
                    .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
                // The worker died between fork and prctl: the signal will never
                // come, so do not start the Graph at all.
                if nix::unistd::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
                }
            }
            Ok(())
        });
    }
}

/// One line written to the progress descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProgressLine {
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    percent: Option<f64>,
}

/// Why a progress line was ignored.
#[derive(Debug, thiserror::Error)]
enum InvalidLine {
    #[error("a progress line is at most {MAX_PROGRESS_LINE} bytes; a longer one was discarded")]
    TooLong,
    #[error("a progress line must be a JSON object with `message` and/or `percent`: {0}")]
    NotAReport(String),
    #[error("a progress line must give `message`, `percent` or both")]
    Empty,
    #[error(transparent)]
    Rule(#[from] graph_relay_core::command::InvalidProgress),
}

/// Parses one progress line (without its newline).
fn parse_progress_line(line: &[u8]) -> Result<ProgressReport, InvalidLine> {
    let parsed: ProgressLine =
        serde_json::from_slice(line).map_err(|e| InvalidLine::NotAReport(e.to_string()))?;
    if parsed.message.is_none() && parsed.percent.is_none() {
        return Err(InvalidLine::Empty);
    }
    let report = ProgressReport {
        message: parsed.message,
        percent: parsed.percent,
    };
    report.check()?;
    Ok(report)
}

/// What reading a run's progress descriptor saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct ProgressCounts {
    valid: u64,
    invalid: u64,
}

/// Reads progress lines from `pipe` until every writer closed it, handing
/// each valid one to `sink`. Memory is bounded by [`MAX_PROGRESS_LINE`]; the
/// first invalid line is logged, later ones only counted.
async fn read_progress(
    mut pipe: impl tokio::io::AsyncRead + Unpin,
    sink: ProgressSink,
    command: CommandId,
) -> ProgressCounts {
    let mut counts = ProgressCounts::default();
    let mut line: Vec<u8> = Vec::with_capacity(256);
    // Inside a line longer than the limit: skip until its newline.
    let mut discarding = false;
    let mut buf = vec![0u8; 8 * 1024];
    let judge = |verdict: Result<ProgressReport, InvalidLine>, counts: &mut ProgressCounts| {
        match verdict {
            Ok(report) => {
                counts.valid += 1;
                sink.report(report);
            }
            Err(why) => {
                counts.invalid += 1;
                if counts.invalid == 1 {
                    tracing::warn!(%command, "ignoring an invalid progress line (later ones of this run are ignored silently): {why}");
                }
            }
        }
    };
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for chunk in buf[..n].split_inclusive(|b| *b == b'\n') {
            let complete = chunk.last() == Some(&b'\n');
            let body = if complete {
                &chunk[..chunk.len() - 1]
            } else {
                chunk
            };
            if discarding {
                if complete {
                    discarding = false;
                }
                continue;
            }
            if line.len() + body.len() > MAX_PROGRESS_LINE {
                line.clear();
                judge(Err(InvalidLine::TooLong), &mut counts);
                discarding = !complete;
                continue;
            }
            line.extend_from_slice(body);
            if complete {
                if !line.iter().all(u8::is_ascii_whitespace) {
                    judge(parse_progress_line(&line), &mut counts);
                }
                line.clear();
            }
        }
    }
    // A last line without its newline still counts.
    if !discarding && !line.iter().all(u8::is_ascii_whitespace) {
        judge(parse_progress_line(&line), &mut counts);
    }
    counts
}

enum Ending {
    Exited(std::io::Result<ExitStatus>),
    Cancelled,
    TimedOut,
}

fn failed(error: String) -> ExecutionOutcome {
    ExecutionOutcome {
        status: Some(FinishStatus::Failed),
        error: Some(error),
        ..Default::default()
    }
}

fn signal_group(pgid: Option<i32>, signal: Signal) {
    if let Some(pgid) = pgid.filter(|p| *p > 0) {
        // ESRCH: the group is already gone.
        let _ = killpg(Pid::from_raw(pgid), signal);
    }
}

#[async_trait]
impl Executor for ProcessExecutor {
    async fn execute(
        &self,
        job: Job,
        cancel: CancelSignal,
        progress: ProgressSink,
    ) -> ExecutionOutcome {
        let spec = self
            .specs
            .read()
            .ok()
            .and_then(|t| t.get(&job.command.graph_session_id).cloned());
        let Some(spec) = spec else {
            return failed(format!(
                "Graph session {} is not declared in the graphs file",
                job.command.graph_session_id
            ));
        };
        if cancel.is_cancelled() {
            return ExecutionOutcome {
                status: Some(FinishStatus::Cancelled),
                ..Default::default()
            };
        }
        let (mut child, progress_read) = match spawn(&spec, &job) {
            Ok(started) => started,
            Err(outcome) => return outcome,
        };
        let command_id = job.command.id;
        let progress_task = match tokio::net::unix::pipe::Receiver::from_owned_fd(progress_read) {
            Ok(pipe) => Some(tokio::spawn(read_progress(pipe, progress, command_id))),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the progress pipe; progress is ignored");
                None
            }
        };
        let pgid = child.id().and_then(|p| i32::try_from(p).ok());
        // Recorded before the Graph gets its arguments (most wait for them).
        let record = self.record_group(&child, command_id).await;
        let input = serde_json::to_vec(&Value::Object(job.command.arguments.clone()))
            .unwrap_or_else(|_| b"{}".to_vec());
        if let Some(mut stdin) = child.stdin.take() {
            tokio::spawn(async move {
                // A process that does not read its stdin is fine.
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            });
        }
        let stdout = child
            .stdout
            .take()
            .map(|out| tokio::spawn(keep_head(out, STDOUT_CAP)));
        let stderr = child
            .stderr
            .take()
            .map(|err| tokio::spawn(keep_tail(err, STDERR_TAIL)));

        let ending = tokio::select! {
            status = child.wait() => Ending::Exited(status),
            () = cancel => Ending::Cancelled,
            () = tokio::time::sleep(spec.timeout) => Ending::TimedOut,
        };
        self.stop_group(&mut child, pgid, &ending).await;
        if let (Some(ledger), Some(record)) = (&self.ledger, &record)
            && let Err(e) = ledger.remove_process(record.pgid, record.start_time).await
        {
            tracing::warn!(error = %e, pgid = record.pgid, "cannot remove the record of the Graph's process group");
        }
        let out = drain(stdout).await;
        let err = drain(stderr).await;
        if let Some(task) = progress_task {
            finish_progress(task, command_id).await;
        }
        outcome(
            ending,
            &String::from_utf8_lossy(&out),
            &String::from_utf8_lossy(&err),
            spec.timeout,
        )
    }
}

impl ProcessExecutor {
    /// Records the child's process group in the ledger, so that a worker
    /// that dies meanwhile finds it on its next start.
    async fn record_group(
        &self,
        child: &tokio::process::Child,
        command: CommandId,
    ) -> Option<graph_relay_store_sqlite::GraphProcess> {
        let (ledger, pid) = (self.ledger.as_ref()?, child.id()?);
        let record = orphans::record_of(pid, command)?;
        match ledger.record_process(&record).await {
            Ok(()) => Some(record),
            Err(e) => {
                tracing::warn!(error = %e, pid, "cannot record the Graph's process group");
                None
            }
        }
    }

    /// Ends the Graph's process group: a process that did not exit gets
    /// SIGTERM, then SIGKILL after the grace period; whatever the main
    /// process left behind in its group goes too.
    async fn stop_group(
        &self,
        child: &mut tokio::process::Child,
        pgid: Option<i32>,
        ending: &Ending,
    ) {
        if !matches!(ending, Ending::Exited(_)) {
            signal_group(pgid, Signal::SIGTERM);
            if tokio::time::timeout(self.grace, child.wait())
                .await
                .is_err()
            {
                signal_group(pgid, Signal::SIGKILL);
                let _ = child.wait().await;
            }
        }
        signal_group(pgid, Signal::SIGKILL);
    }
}

/// Starts the Graph's process in a group of its own, with its piped
/// standard streams and the write end of the progress pipe; returns it with
/// the read end.
fn spawn(
    spec: &GraphSpec,
    job: &Job,
) -> Result<(tokio::process::Child, OwnedFd), ExecutionOutcome> {
    let Some((program, args)) = spec.command.split_first() else {
        return Err(failed("the Graph has no command".into()));
    };
    // Both ends close on exec in the worker; the child gets the write
    // end as PROGRESS_FD (prepare_child).
    let (progress_read, progress_write) =
        std::io::pipe().map_err(|e| failed(format!("cannot open the progress pipe: {e}")))?;
    let progress_write = OwnedFd::from(progress_write);
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .envs(&spec.env)
        .env("GRAPH_RELAY_COMMAND_ID", job.command.id.to_string())
        .env("GRAPH_RELAY_EXECUTION_ID", job.execution.as_str())
        .env("GRAPH_RELAY_CHANNEL", &job.channel)
        .env("GRAPH_RELAY_PROGRESS_FD", PROGRESS_FD.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = &spec.working_dir {
        command.current_dir(dir);
    }
    prepare_child(&mut command, progress_write.as_raw_fd());
    let spawned = command.spawn();
    // The child has its copy; ours must go, so that the pipe ends when
    // the Graph's processes are gone.
    drop(progress_write);
    let child = spawned.map_err(|e| failed(format!("cannot start `{program}`: {e}")))?;
    Ok((child, OwnedFd::from(progress_read)))
}

/// The first `cap` bytes `stream` writes (the rest is read and dropped).
async fn keep_head(mut stream: impl tokio::io::AsyncRead + Unpin, cap: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = cap.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    kept
}

/// The last `tail` bytes `stream` writes.
async fn keep_tail(mut stream: impl tokio::io::AsyncRead + Unpin, tail: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > tail {
            kept.drain(..kept.len() - tail);
        }
    }
    kept
}

/// What a pipe reader kept, waiting at most [`PIPE_DRAIN`] (a process
/// that escaped the group may hold the pipe open).
async fn drain(task: Option<tokio::task::JoinHandle<Vec<u8>>>) -> Vec<u8> {
    match task {
        Some(t) => tokio::time::timeout(PIPE_DRAIN, t)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default(),
        None => Vec::new(),
    }
}

/// Waits at most [`PIPE_DRAIN`] for the progress reader (a process that
/// escaped the group may hold the pipe open), and logs invalid lines.
async fn finish_progress(task: tokio::task::JoinHandle<ProgressCounts>, command: CommandId) {
    let abort = task.abort_handle();
    match tokio::time::timeout(PIPE_DRAIN, task).await {
        Ok(Ok(counts)) if counts.invalid > 0 => tracing::info!(
            command = %command,
            valid = counts.valid,
            invalid = counts.invalid,
            "progress lines read"
        ),
        Ok(_) => {}
        Err(_) => abort.abort(),
    }
}

/// How the run ended, from how the process ended and what it wrote.
fn outcome(ending: Ending, out: &str, err: &str, timeout: Duration) -> ExecutionOutcome {
    let stderr_tail = tail_utf16(err, ERROR_LIMIT);
    let (result, total_tokens, reported_cost) = parse_stdout(out);
    match ending {
        Ending::Cancelled => ExecutionOutcome {
            status: Some(FinishStatus::Cancelled),
            ..Default::default()
        },
        Ending::TimedOut => ExecutionOutcome {
            result,
            total_tokens,
            reported_cost,
            ..failed(format!(
                "timed out after {} s{}",
                timeout.as_secs(),
                if stderr_tail.trim().is_empty() {
                    String::new()
                } else {
                    format!("; stderr: {stderr_tail}")
                }
            ))
        },
        Ending::Exited(Err(e)) => failed(format!("cannot wait for the process: {e}")),
        Ending::Exited(Ok(status)) if status.success() => ExecutionOutcome {
            status: Some(FinishStatus::Completed),
            result,
            total_tokens,
            reported_cost,
            error: None,
        },
        Ending::Exited(Ok(status)) => ExecutionOutcome {
            result,
            total_tokens,
            reported_cost,
            ..failed(if stderr_tail.trim().is_empty() {
                format!("the process exited with {status}")
            } else {
                stderr_tail
            })
        },
    }
}

/// The last `limit` UTF-16 units of `text` (whole characters only).
fn tail_utf16(text: &str, limit: usize) -> String {
    let mut units = 0;
    let mut start = text.len();
    for (index, ch) in text.char_indices().rev() {
        units += ch.len_utf16();
        if units > limit {
            break;
        }
        start = index;
    }
    let mut tail = text[start..].to_owned();
    cut_utf16(&mut tail, limit);
    tail
}

/// Splits the optional usage line off stdout and parses the rest.
fn parse_stdout(text: &str) -> (Value, Option<u64>, Option<f64>) {
    let trimmed = text.trim_end();
    let (body, last) = match trimmed.rsplit_once('\n') {
        Some((body, last)) => (body, last),
        None => ("", trimmed),
    };
    let usage = serde_json::from_str::<Value>(last.trim())
        .ok()
        .and_then(|v| match v {
            Value::Object(mut map) if map.len() == 1 => match map.remove("graph_relay") {
                Some(Value::Object(u)) => Some(u),
                _ => None,
            },
            _ => None,
        });
    let (rest, tokens, cost) = match usage {
        Some(u) => (
            body,
            u.get("total_tokens").and_then(Value::as_u64),
            u.get("reported_cost").and_then(Value::as_f64),
        ),
        None => (trimmed, None, None),
    };
    let rest = rest.trim_end_matches(['\n', '\r']);
    let result = if rest.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(rest).unwrap_or_else(|_| Value::String(rest.to_owned()))
    };
    (result, tokens, cost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::task::{Context, Poll};

    /// Hands out its bytes at most `chunk` at a time, as a pipe may.
    struct Chunked {
        bytes: Vec<u8>,
        at: usize,
        chunk: usize,
    }

    impl tokio::io::AsyncRead for Chunked {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let end = (self.at + self.chunk)
                .min(self.bytes.len())
                .min(self.at + buf.remaining());
            let at = self.at;
            buf.put_slice(&self.bytes[at..end]);
            self.at = end;
            Poll::Ready(Ok(()))
        }
    }

    fn read_all(bytes: &[u8], chunk: usize) -> (Vec<ProgressReport>, ProgressCounts) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        let sink = ProgressSink::new(move |r| into.lock().unwrap().push(r));
        let pipe = Chunked {
            bytes: bytes.to_vec(),
            at: 0,
            chunk,
        };
        let command = CommandId::from_uuid(uuid::Uuid::from_u128(1));
        let counts = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(read_progress(pipe, sink, command));
        let reports = seen.lock().unwrap().clone();
        (reports, counts)
    }

    fn report(message: Option<&str>, percent: Option<f64>) -> ProgressReport {
        ProgressReport {
            message: message.map(str::to_owned),
            percent,
        }
    }

    #[test]
    fn valid_progress_lines_are_reported_in_order_whatever_the_chunks() {
        let text = b"{\"message\": \"step 1 of 2\", \"percent\": 40}\n\n{\"percent\": 100}\n{\"message\": \"done\"}";
        for chunk in [1, 3, 7, 8192] {
            let (reports, counts) = read_all(text, chunk);
            assert_eq!(
                reports,
                vec![
                    report(Some("step 1 of 2"), Some(40.0)),
                    report(None, Some(100.0)),
                    report(Some("done"), None),
                ],
                "chunks of {chunk}"
            );
            assert_eq!(
                counts,
                ProgressCounts {
                    valid: 3,
                    invalid: 0
                }
            );
        }
    }

    #[test]
    fn invalid_progress_lines_are_ignored_and_the_next_ones_still_count() {
        let long_message = format!("{{\"message\": \"{}\"}}", "x".repeat(501));
        let lines = [
            "not json",
            "[1, 2]",
            "{}",
            "{\"pct\": 5}",
            "{\"percent\": 150}",
            "{\"percent\": -1}",
            "{\"percent\": \"half\"}",
            long_message.as_str(),
            "{\"percent\": 7}",
        ];
        let text = lines.join("\n") + "\n";
        let (reports, counts) = read_all(text.as_bytes(), 5);
        assert_eq!(reports, vec![report(None, Some(7.0))]);
        assert_eq!(
            counts,
            ProgressCounts {
                valid: 1,
                invalid: 8
            }
        );
        // 500 characters (not bytes) are fine.
        let ok = format!("{{\"message\": \"{}\"}}\n", "日".repeat(500));
        assert_eq!(read_all(ok.as_bytes(), 64).1.valid, 1);
    }

    #[test]
    fn a_line_longer_than_the_limit_is_discarded_whole_and_memory_stays_bounded() {
        // A 1 MiB line (no newline for a long time), then a valid one.
        let mut text = vec![b'{'; 1024 * 1024];
        text.extend_from_slice(b"\n{\"percent\": 12}\n");
        let (reports, counts) = read_all(&text, 4096);
        assert_eq!(reports, vec![report(None, Some(12.0))]);
        assert_eq!(
            counts,
            ProgressCounts {
                valid: 1,
                invalid: 1
            }
        );
        // Exactly the limit is still read.
        let padded = format!("{{\"message\": \"{}\"}}", "a".repeat(400));
        let line = format!("{padded:<width$}\n", width = MAX_PROGRESS_LINE);
        assert_eq!(line.len(), MAX_PROGRESS_LINE + 1);
        let (reports, _) = read_all(line.as_bytes(), 1000);
        assert_eq!(reports.len(), 1);
        // One byte more is not.
        let line = format!("{padded:<width$}\n", width = MAX_PROGRESS_LINE + 1);
        let (reports, counts) = read_all(line.as_bytes(), 1000);
        assert!(reports.is_empty());
        assert_eq!(counts.invalid, 1);
    }

    #[test]
    fn stdout_is_json_or_text_and_the_usage_line_is_split_off() {
        assert_eq!(parse_stdout("{\"a\": 1}\n"), (json!({"a": 1}), None, None));
        assert_eq!(
            parse_stdout("hello\nworld\n"),
            (json!("hello\nworld"), None, None)
        );
        assert_eq!(parse_stdout(""), (Value::Null, None, None));
        assert_eq!(
            parse_stdout(
                "[1,2]\n{\"graph_relay\": {\"total_tokens\": 12, \"reported_cost\": 0.5}}\n"
            ),
            (json!([1, 2]), Some(12), Some(0.5))
        );
        assert_eq!(
            parse_stdout("{\"graph_relay\": {\"total_tokens\": 7}}"),
            (Value::Null, Some(7), None)
        );
        // Another object on the last line is part of the result.
        assert_eq!(
            parse_stdout("{\"graph_relay\": 1, \"x\": 2}"),
            (json!({"graph_relay": 1, "x": 2}), None, None)
        );
    }

    #[test]
    fn the_stderr_tail_keeps_the_end_within_the_limit() {
        let text = format!("{}END", "あ".repeat(3000));
        let tail = tail_utf16(&text, ERROR_LIMIT);
        assert!(tail.ends_with("END"));
        assert_eq!(graph_relay_core::envelope::utf16_len(&tail), ERROR_LIMIT);
        let emoji = "😀".repeat(1500);
        let tail = tail_utf16(&emoji, ERROR_LIMIT);
        assert_eq!(graph_relay_core::envelope::utf16_len(&tail), ERROR_LIMIT);
        assert_eq!(tail_utf16("short", ERROR_LIMIT), "short");
    }
}
