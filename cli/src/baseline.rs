//! Baselines measured in the same run as a figure of ours, so that the
//! figure travels between machines as a ratio: the rmcp `echo` example (the
//! official Rust SDK answering a trivial tool) and the `fixed_reply`
//! example (the HTTP stack of `graph-relay serve` answering a fixed result
//! of the same size: the ceiling of that stack).
//!
//! Each server is a child process loaded by one client: keep-alive
//! HTTP/1.1 connections on the caller's runtime, each sending its next
//! request when its last answer arrived. Every answer is checked; a wrong
//! one ends the measurement with an error. The CPU per request is the
//! server's own (utime + stime from `/proc/<pid>/stat` over the window).
//!
//! `loadtest` uses this module, and the `vs_rmcp` example includes the same
//! file, so both measure the baselines one way.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// What a measurement can fail with: a message for the operator.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The text the rmcp `echo` tool is asked to return.
const ECHO_TEXT: &str = "hello from the load generator";
/// What every `fixed_reply` answer's text holds (the example's `MARKER`).
const FIXED_MARKER: &str = "fixed reply";
/// The size of the ceiling's answer when the caller has none to match:
/// about a `get_graph_run` answer of a queued run.
pub const DEFAULT_REPLY_BYTES: usize = 600;
/// How long a child has to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One server under load: how to ask it, and how to tell a right answer.
pub struct Target {
    /// What the figures are printed as.
    pub label: &'static str,
    /// The process whose CPU is read.
    pub pid: u32,
    /// `host:port`.
    pub addr: String,
    /// The request head up to (not including) `Content-Length`.
    pub head: String,
    /// A body per connection (its JSON-RPC id is the connection's index).
    pub body: fn(usize, &str) -> String,
    /// What the body's tool argument is.
    pub argument: String,
    /// What every answer's text must contain.
    pub expect: String,
    /// The server's process, killed when dropped.
    pub child: Child,
}

/// The executable `name` built beside the running one: in the `examples`
/// folder next to it (the `graph-relay` binary), or next to it (another
/// example), unless the environment variable `env` names it.
pub fn example_binary(env: &str, name: &str) -> Result<PathBuf, Error> {
    if let Ok(path) = std::env::var(env) {
        return Ok(PathBuf::from(path));
    }
    let me = std::env::current_exe()?;
    let folder = me.parent().ok_or("no folder for this executable")?;
    [folder.join("examples").join(name), folder.join(name)]
        .into_iter()
        .find(|path| path.is_file())
        .ok_or_else(|| {
            format!(
                "{name} is not built beside {}: build it (cargo build --release -p graph-relay --example {name}) or set {env}",
                me.display()
            )
            .into()
        })
}

/// Starts the rmcp `echo` example at `exe`.
pub async fn start_rmcp_echo(exe: &Path) -> Result<Target, Error> {
    let (child, pid, addr) = start(exe, &["127.0.0.1:0"]).await?;
    Ok(Target {
        label: "rmcp 3.x echo (stateless JSON)",
        pid,
        head: mcp_head(&addr, ""),
        body: echo_body,
        expect: ECHO_TEXT.to_owned(),
        argument: ECHO_TEXT.to_owned(),
        addr,
        child,
    })
}

/// Starts the `fixed_reply` example at `exe`, answering `reply_bytes`.
pub async fn start_fixed_reply(exe: &Path, reply_bytes: usize) -> Result<Target, Error> {
    let bytes = reply_bytes.to_string();
    let (child, pid, addr) = start(exe, &["127.0.0.1:0", "--reply-bytes", &bytes]).await?;
    let target = Target {
        label: "fixed reply (serve's HTTP stack)",
        pid,
        head: mcp_head(&addr, ""),
        // The same request as the echo's: the ceiling reads a body of that
        // shape and size.
        body: echo_body,
        expect: FIXED_MARKER.to_owned(),
        argument: ECHO_TEXT.to_owned(),
        addr,
        child,
    };
    // The ceiling is only fair at the size asked for (an answer to a
    // one-digit id; the bare shape, about 100 bytes, when less is asked).
    let mut connection = Connection::open(&target.addr).await?;
    let (status, body) = connection
        .exchange(&request(&target.head, &echo_body(1, ECHO_TEXT)))
        .await?;
    if status != 200 || (body.len() != reply_bytes && reply_bytes >= MIN_FIXED_REPLY) {
        return Err(format!(
            "fixed_reply answered {status} with {} bytes; {reply_bytes} were asked",
            body.len()
        )
        .into());
    }
    Ok(target)
}

/// The bare fixed reply's size: a smaller size cannot be asked.
const MIN_FIXED_REPLY: usize = 128;

/// Spawns `exe args` and waits for its `listening on http://ADDR/mcp`.
async fn start(exe: &Path, args: &[&str]) -> Result<(Child, u32, String), Error> {
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let pid = child
        .id()
        .ok_or_else(|| format!("{} exited at once", exe.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let addr = host_port(&announced(stdout, "listening on ").await?)?;
    Ok((child, pid, addr))
}

/// A `POST /mcp` head for `addr`, with `extra` header lines (each ending
/// in CRLF).
pub fn mcp_head(addr: &str, extra: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{extra}"
    )
}

fn echo_body(id: usize, text: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}"}}}}}}"#
    )
}

/// Reads `stream` line by line until one contains `marker`, and returns
/// what follows it up to the next space; the rest is drained (lines with
/// `ERROR` or `WARN` are shown).
pub async fn announced<R>(stream: R, marker: &'static str) -> Result<String, Error>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.split(marker).nth(1)
                && let Some(tx) = tx.take()
            {
                let word = rest.split_whitespace().next().unwrap_or_default();
                let _ = tx.send(word.to_owned());
            } else if line.contains("ERROR") || line.contains("WARN") {
                eprintln!("server | {line}");
            }
        }
    });
    Ok(tokio::time::timeout(START_TIMEOUT, rx)
        .await
        .map_err(|_| format!("no `{marker}` within {} s", START_TIMEOUT.as_secs()))?
        .map_err(|_| format!("exited before printing `{marker}`"))?)
}

/// The address part of `http://host:port/mcp`.
pub fn host_port(url: &str) -> Result<String, Error> {
    Ok(url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .ok_or_else(|| format!("unexpected URL {url}"))?
        .to_owned())
}

/// A process's CPU time so far (user + system), from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> Result<Duration, Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    Ok(cpu_of_stat(&stat).ok_or("unreadable /proc/<pid>/stat")?)
}

/// The CPU time (user + system) in the text of a `/proc/<pid>/stat`.
pub fn cpu_of_stat(stat: &str) -> Option<Duration> {
    // Fields after the command name, which ends at the last ')' and may
    // hold spaces: utime and stime are fields 14 and 15 of the line, 12
    // and 13 after the name.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|hz| u64::try_from(hz).ok())
        .filter(|&hz| hz > 0)?;
    Some(Duration::from_secs_f64(ticks as f64 / hz as f64))
}

/// An HTTP/1.1 request: `head`, then the length and `body`.
pub fn request(head: &str, body: &str) -> Vec<u8> {
    format!("{head}Content-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

/// One keep-alive HTTP/1.1 connection.
pub struct Connection {
    stream: BufReader<TcpStream>,
    line: String,
    body: Vec<u8>,
}

impl Connection {
    /// Connects to `addr` (`host:port`).
    pub async fn open(addr: &str) -> Result<Self, Error> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: BufReader::with_capacity(16 * 1024, stream),
            line: String::new(),
            body: Vec::with_capacity(4096),
        })
    }

    /// Sends `request` and reads the answer: its status and body
    /// (`Content-Length` or chunked).
    pub async fn exchange(&mut self, request: &[u8]) -> Result<(u16, &[u8]), Error> {
        self.stream.get_mut().write_all(request).await?;
        self.line.clear();
        self.stream.read_line(&mut self.line).await?;
        let status: u16 = self
            .line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("not an HTTP status line: {:?}", self.line))?;
        let (length, chunked) = self.read_head().await?;
        self.body.clear();
        if chunked {
            self.read_chunks().await?;
        } else {
            let length = length.ok_or("an answer without Content-Length")?;
            self.body.resize(length, 0);
            self.stream.read_exact(&mut self.body).await?;
        }
        Ok((status, &self.body))
    }

    /// The header lines after the status line: `Content-Length`, and
    /// whether the body is chunked.
    async fn read_head(&mut self) -> Result<(Option<usize>, bool), Error> {
        let mut length = None;
        let mut chunked = false;
        loop {
            self.line.clear();
            if self.stream.read_line(&mut self.line).await? == 0 {
                return Err("connection closed in the head".into());
            }
            let line = self.line.trim_end();
            if line.is_empty() {
                return Ok((length, chunked));
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.trim().parse::<usize>()?);
            } else if name.eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
            {
                chunked = true;
            }
        }
    }

    async fn read_chunks(&mut self) -> Result<(), Error> {
        loop {
            self.line.clear();
            self.stream.read_line(&mut self.line).await?;
            let size = usize::from_str_radix(self.line.trim_end(), 16)?;
            if size == 0 {
                self.line.clear();
                self.stream.read_line(&mut self.line).await?;
                return Ok(());
            }
            let start = self.body.len();
            self.body.resize(start + size + 2, 0);
            self.stream.read_exact(&mut self.body[start..]).await?;
            self.body.truncate(start + size);
        }
    }
}

/// True when `body` is the right answer to request `id`: cheap substring
/// checks on every answer; `parse` adds a full JSON decode (every 256th).
fn right_answer(body: &[u8], id: usize, expect: &str, parse: bool) -> bool {
    let Ok(text) = std::str::from_utf8(body) else {
        return false;
    };
    let id_ok = [",", "}"]
        .iter()
        .any(|end| text.contains(&format!("\"id\":{id}{end}")));
    if !(id_ok && text.contains("\"isError\":false") && text.contains(expect)) {
        return false;
    }
    if !parse {
        return true;
    }
    serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| {
        v["id"] == id
            && v["result"]["isError"] == false
            && v["result"]["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains(expect.replace("\\\"", "\"").as_str()))
    })
}

/// Drives `target` with `connections` connections until `until`, and
/// returns the latencies (µs) of the answers to requests sent from `from`
/// on (earlier ones are warm-up).
pub async fn drive(
    target: &Target,
    connections: usize,
    from: Instant,
    until: Instant,
) -> Result<Vec<u32>, Error> {
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..connections {
        let id = index + 1;
        let bytes = request(&target.head, &(target.body)(id, &target.argument));
        let expect = target.expect.clone();
        let addr = target.addr.clone();
        tasks.spawn(async move {
            let mut connection = Connection::open(&addr).await?;
            let mut latencies = Vec::new();
            let mut n = 0u64;
            loop {
                let sent = Instant::now();
                if sent >= until {
                    break;
                }
                let (status, body) = connection.exchange(&bytes).await?;
                let done = Instant::now();
                n += 1;
                if status != 200 || !right_answer(body, id, &expect, n % 256 == 1) {
                    let body = String::from_utf8_lossy(body);
                    return Err::<_, Error>(
                        format!("wrong answer ({status}) on connection {id}: {body}").into(),
                    );
                }
                if sent >= from {
                    latencies.push(u32::try_from((done - sent).as_micros()).unwrap_or(u32::MAX));
                }
            }
            Ok(latencies)
        });
    }
    let mut all = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        all.extend(joined.map_err(|e| format!("a connection task failed: {e}"))??);
    }
    Ok(all)
}

/// One measured window of one server.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Round {
    /// Answers per second.
    pub rate: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// The server's CPU per answer, µs.
    pub cpu_us_per_request: f64,
}

/// One window of `seconds` (after half a second of warm-up) of `target`
/// under `connections` connections.
pub async fn measure(target: &Target, connections: usize, seconds: f64) -> Result<Round, Error> {
    let window = Duration::from_secs_f64(seconds);
    let from = Instant::now() + Duration::from_millis(500);
    let until = from + window;
    let pid = target.pid;
    // The CPU window is the counted window: sampled when it opens and closes.
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(from.into()).await;
        let before = cpu_time(pid)?;
        tokio::time::sleep_until(until.into()).await;
        Ok::<_, Error>(cpu_time(pid)? - before)
    });
    let mut latencies = drive(target, connections, from, until).await?;
    let cpu = cpu.await??;
    if latencies.is_empty() {
        return Err(format!("{}: no answers in the window", target.label).into());
    }
    latencies.sort_unstable();
    let at = |q: f64| {
        f64::from(latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)])
    };
    let n = latencies.len() as f64;
    Ok(Round {
        rate: n / window.as_secs_f64(),
        p50_us: at(0.50),
        p99_us: at(0.99),
        cpu_us_per_request: cpu.as_secs_f64() * 1e6 / n,
    })
}

/// The median of `values` (the mean of the middle two for an even count;
/// 0 for none).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    match values.len() {
        0 => 0.0,
        n if n % 2 == 0 => (values[mid - 1] + values[mid]) / 2.0,
        _ => values[mid],
    }
}

/// Each figure's median over `rounds`.
pub fn median_round(rounds: &[Round]) -> Round {
    let pick = |f: fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    Round {
        rate: pick(|r| r.rate),
        p50_us: pick(|r| r.p50_us),
        p99_us: pick(|r| r.p99_us),
        cpu_us_per_request: pick(|r| r.cpu_us_per_request),
    }
}

/// Stops `child` with SIGTERM (so that a profiler wrapping it, e.g.
/// valgrind's callgrind, writes its output), and kills it if it has not
/// exited within 60 s.
pub async fn stop(child: &mut Child) -> Result<(), Error> {
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        if tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .is_ok()
        {
            return Ok(());
        }
    }
    child.start_kill()?;
    child.wait().await?;
    Ok(())
}

/// The two baselines, measured in turn for `rounds` windows of `seconds`
/// each under `connections` connections: (rmcp echo, fixed reply), each
/// the median of its rounds.
pub async fn measure_baselines(
    reply_bytes: usize,
    connections: usize,
    rounds: usize,
    seconds: f64,
) -> Result<(Round, Round), Error> {
    let echo_exe = example_binary("RMCP_ECHO_BIN", "rmcp_echo")?;
    let fixed_exe = example_binary("FIXED_REPLY_BIN", "fixed_reply")?;
    let mut targets = [
        start_rmcp_echo(&echo_exe).await?,
        start_fixed_reply(&fixed_exe, reply_bytes).await?,
    ];
    let mut measured: [Vec<Round>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..rounds.max(1) {
        for (target, rounds) in targets.iter().zip(&mut measured) {
            rounds.push(measure(target, connections, seconds).await?);
        }
    }
    for target in &mut targets {
        stop(&mut target.child).await?;
    }
    Ok((median_round(&measured[0]), median_round(&measured[1])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn answers_are_checked() {
        let good = r#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"fixed reply..."}],"isError":false}}"#;
        assert!(right_answer(good.as_bytes(), 3, FIXED_MARKER, true));
        assert!(!right_answer(good.as_bytes(), 4, FIXED_MARKER, true));
        assert!(!right_answer(good.as_bytes(), 3, ECHO_TEXT, false));
        let failed = good.replace("\"isError\":false", "\"isError\":true");
        assert!(!right_answer(failed.as_bytes(), 3, FIXED_MARKER, false));
    }
}
