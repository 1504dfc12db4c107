//! The cluster of `graph-relay loadtest --cluster`: a Postgres of its own
//! ([`own_postgres`]), several `serve --postgres`
//! processes on it, and HAProxy in front, all children of the harness in
//! one temporary folder. Desktops and agents reach the servers only
//! through HAProxy, which checks each server's `/readyz` every 500 ms: a
//! stopped server, or one that cannot reach the database, leaves the
//! rotation after two failed checks. While no server is ready (the
//! database is down), requests go to the servers that are alive
//! (`/healthz`), so that agents and desktops get the servers' own
//! retryable answers rather than the balancer's error page.
//!
//! Server and balancer lines worth knowing (warnings, errors, health
//! changes, exits nobody asked for) are kept with their time for the
//! report.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use graph_relay_transport_http::auth::{AgentToken, DeviceToken};
use graph_relay_transport_http::config::{ConfigFile, ServerSection};
use nix::sys::signal::Signal;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use super::LoadtestError;
use super::faults::Fault;
use super::own_postgres::{self, OwnPostgres, SCHEMA};
use crate::children::Watched;

/// Most servers in a cluster.
pub const MAX_CLUSTER_SERVERS: usize = 9;
/// Each server's Postgres pool.
const POOL: &str = "8";
/// How long a (re)started server may take to serve.
const SERVE_DEADLINE: Duration = Duration::from_secs(60);
/// Lines of the log kept for the report.
const MAX_LOG_LINES: usize = 20_000;

/// Options of `loadtest --cluster`.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Start a cluster for the run and load it through its load balancer:
    /// a Postgres of its own (initdb in a temporary folder), servers on it
    /// (`serve --postgres`) and HAProxy in front, checking `/readyz`.
    #[arg(long, conflicts_with_all = ["server", "config", "server_pid"])]
    pub cluster: bool,
    /// With `--cluster`: how many servers.
    #[arg(long, value_name = "N", default_value_t = 3, requires = "cluster",
          value_parser = clap::value_parser!(u64).range(1..=MAX_CLUSTER_SERVERS as u64))]
    pub cluster_servers: u64,
    /// With `--cluster`: faults to inject, in order, one after another
    /// (comma-separated): kill-server, stop-server, terminate-backends,
    /// crash-postgres, disk-full.
    #[arg(long, value_enum, value_delimiter = ',', requires = "cluster")]
    pub faults: Vec<Fault>,
    /// How long a fault lasts: a killed server stays down, a stopped one
    /// stopped, Postgres down, the disk full.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10.0,
        requires = "cluster"
    )]
    pub fault_hold: f64,
    /// Steady load before the first fault and after each one.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 20.0,
        requires = "cluster"
    )]
    pub fault_gap: f64,
    /// The servers' run lease (`serve --lease-seconds`); the server's
    /// default when not given.
    #[arg(long, value_name = "SECONDS", requires = "cluster",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub lease_seconds: Option<u64>,
    /// Seconds between two rows of figures (pickup p50/p99, servers' RSS
    /// and sockets, the database's sizes and connections), printed on
    /// stderr as the run goes and in the report.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, requires = "cluster",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub report_every: u64,
    /// The folder of PostgreSQL's `initdb`, `pg_ctl` and `postgres`
    /// (default: the newest /usr/lib/postgresql/*/bin, else PATH).
    #[arg(long, value_name = "DIR", requires = "cluster")]
    pub postgres_bin: Option<PathBuf>,
    /// With `--cluster`: `graph-relay worker` processes besides the
    /// in-process desktops, each sharing one Graph (a shell script that
    /// writes the command id it runs under to a ledger); runs go round
    /// robin over desktops and workers.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "cluster",
          value_parser = clap::value_parser!(u64).range(0..=100))]
    pub workers: u64,
    /// HAProxy's binary.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/usr/sbin/haproxy",
        requires = "cluster"
    )]
    pub haproxy: PathBuf,
}

/// Where a kept line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A server (its name in the line).
    Server,
    /// HAProxy.
    Balancer,
    /// The harness, about a process.
    Harness,
}

/// One kept line.
#[derive(Debug, Clone)]
pub struct LogLine {
    /// When it was read.
    pub at: Instant,
    /// Who said it.
    pub source: Source,
    /// The line (a server's carries its name first).
    pub text: String,
}

/// The lines kept for the report, with their time.
#[derive(Debug, Default)]
pub struct ClusterLog {
    lines: Mutex<Vec<LogLine>>,
    unplanned_exits: Mutex<Vec<String>>,
}

impl ClusterLog {
    fn push(&self, source: Source, text: String) {
        let mut lines = self
            .lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if lines.len() < MAX_LOG_LINES {
            lines.push(LogLine {
                at: Instant::now(),
                source,
                text,
            });
        }
    }

    /// Every kept line so far.
    pub fn lines(&self) -> Vec<LogLine> {
        self.lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Servers that exited without being told to, with their status and
    /// last lines.
    pub fn unplanned_exits(&self) -> Vec<String> {
        self.unplanned_exits
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// A running server process.
struct ServerProcess {
    pid: u32,
    /// Set before the harness kills or stops it on purpose.
    planned: Arc<AtomicBool>,
    /// Resolves when the process has exited.
    exited: tokio::task::JoinHandle<()>,
}

/// One server of the cluster.
struct ClusterServer {
    name: String,
    port: u16,
    process: Mutex<Option<ServerProcess>>,
}

/// The running cluster.
pub struct Cluster {
    /// The temporary folder (configuration, logs, the database's data).
    dir: tempfile::TempDir,
    config: PathBuf,
    postgres: OwnPostgres,
    servers: Vec<ClusterServer>,
    balancer: Mutex<Option<Child>>,
    url: String,
    lease_seconds: Option<u64>,
    log: Arc<ClusterLog>,
}

impl Cluster {
    /// Starts Postgres, the servers (one after another, so that one of
    /// them migrates the schema) and HAProxy; returns once the balancer
    /// finds every server ready.
    pub async fn start(
        args: &ClusterArgs,
        max_connections: usize,
        agents: Vec<AgentToken>,
        devices: Vec<DeviceToken>,
    ) -> Result<Self, LoadtestError> {
        if !args.haproxy.is_file() {
            return Err(LoadtestError::Cluster(format!(
                "the cluster needs HAProxy at {} (`apt-get install -y haproxy`, or --haproxy FILE)",
                args.haproxy.display()
            )));
        }
        let bin = own_postgres::find_bin(args.postgres_bin.as_deref())?;
        let dir = tempfile::tempdir()?;
        let postgres = OwnPostgres::start(dir.path(), &bin, free_port()?).await?;
        if args.faults.contains(&Fault::DiskFull) && !postgres.can_fill_disk() {
            postgres.stop().await;
            return Err(LoadtestError::Cluster(
                "the disk-full fault needs root: the database's data goes on a tmpfs in a \
                 private mount namespace, which is then shrunk to what is in use"
                    .into(),
            ));
        }
        let balancer_port = free_port()?;
        let config = dir.path().join("graph-relay.toml");
        ConfigFile {
            server: ServerSection {
                // Requests through the balancer name its port in `Host`.
                allowed_ports: vec![balancer_port],
                max_connections: Some(max_connections),
                ..ServerSection::default()
            },
            oauth: None,
            agents,
            devices,
        }
        .save(&config)?;
        let count = usize::try_from(args.cluster_servers).unwrap_or(3);
        let mut servers = Vec::with_capacity(count);
        for i in 0..count {
            servers.push(ClusterServer {
                name: format!("s{}", i + 1),
                port: free_port()?,
                process: Mutex::new(None),
            });
        }
        let cluster = Self {
            dir,
            config,
            postgres,
            servers,
            balancer: Mutex::new(None),
            url: format!("http://127.0.0.1:{balancer_port}"),
            lease_seconds: args.lease_seconds,
            log: Arc::new(ClusterLog::default()),
        };
        let started = async {
            for i in 0..cluster.servers.len() {
                cluster.start_server(i).await?;
            }
            cluster
                .start_balancer(&args.haproxy, balancer_port, max_connections)
                .await
        };
        if let Err(e) = started.await {
            cluster.stop().await;
            return Err(e);
        }
        Ok(cluster)
    }

    /// The balancer's base URL, where desktops and agents go.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster's temporary folder.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The database.
    pub fn postgres(&self) -> &OwnPostgres {
        &self.postgres
    }

    /// The kept lines.
    pub fn log(&self) -> &ClusterLog {
        &self.log
    }

    /// The servers' names, in order.
    pub fn server_names(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.name.clone()).collect()
    }

    /// The servers' base URLs, in order.
    pub fn server_urls(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|s| format!("http://127.0.0.1:{}", s.port))
            .collect()
    }

    /// Each server's process id now (`None` while it is down).
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.servers
            .iter()
            .map(|s| lock(&s.process).as_ref().map(|p| p.pid))
            .collect()
    }

    /// SIGKILLs server `i` (its exit is expected).
    pub async fn kill_server(&self, i: usize) -> Result<(), LoadtestError> {
        let process = self.servers.get(i).and_then(|s| lock(&s.process).take());
        let Some(process) = process else {
            return Err(LoadtestError::Cluster(format!("server {i} is not running")));
        };
        process.planned.store(true, Ordering::SeqCst);
        signal(process.pid, Signal::SIGKILL);
        let _ = tokio::time::timeout(Duration::from_secs(10), process.exited).await;
        Ok(())
    }

    /// Sends `signal` (SIGSTOP, SIGCONT) to server `i`.
    pub fn signal_server(&self, i: usize, signal_to_send: Signal) -> Result<(), LoadtestError> {
        let pid = self
            .servers
            .get(i)
            .and_then(|s| lock(&s.process).as_ref().map(|p| p.pid))
            .ok_or_else(|| LoadtestError::Cluster(format!("server {i} is not running")))?;
        signal(pid, signal_to_send);
        Ok(())
    }

    /// Starts server `i` on its port and waits until it serves.
    pub async fn start_server(&self, i: usize) -> Result<(), LoadtestError> {
        let server = self
            .servers
            .get(i)
            .ok_or_else(|| LoadtestError::Cluster(format!("no server {i}")))?;
        let exe = std::env::current_exe()?;
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(exe)
            .args(["serve", "--listen", &format!("127.0.0.1:{}", server.port)])
            .arg("--config")
            .arg(&self.config)
            .args(["--postgres", &self.postgres.url()])
            .args(["--postgres-schema", SCHEMA, "--postgres-pool", POOL])
            .args(["--max-wait-seconds", &super::WAIT_SECONDS.to_string()]);
        if let Some(lease) = self.lease_seconds {
            command.args(["--lease-seconds", &lease.to_string()]);
        }
        let mut child = command
            .env("GRAPH_RELAY_LOG", "info")
            .watched()
            .spawn()
            .map_err(|e| {
                LoadtestError::Cluster(format!("cannot start `setpriv … serve` (util-linux): {e}"))
            })?;
        let pid = child
            .id()
            .ok_or_else(|| LoadtestError::Cluster(format!("{} exited at once", server.name)))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| LoadtestError::Cluster("no stderr".into()))?;
        let (serving_tx, serving_rx) = oneshot::channel();
        let tail = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(read_server_lines(
            server.name.clone(),
            stderr,
            Arc::clone(&self.log),
            Arc::clone(&tail),
            serving_tx,
        ));
        let planned = Arc::new(AtomicBool::new(false));
        let exited = tokio::spawn(watch_exit(
            server.name.clone(),
            child,
            Arc::clone(&planned),
            Arc::clone(&self.log),
            tail,
        ));
        *lock(&server.process) = Some(ServerProcess {
            pid,
            planned,
            exited,
        });
        match tokio::time::timeout(SERVE_DEADLINE, serving_rx).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(LoadtestError::Cluster(format!(
                "{} exited before it served: {}",
                server.name,
                self.log.unplanned_exits().join("\n")
            ))),
            Err(_) => Err(LoadtestError::Cluster(format!(
                "{} did not serve within {} s",
                server.name,
                SERVE_DEADLINE.as_secs()
            ))),
        }
    }

    /// Writes the balancer's configuration, starts HAProxy and waits until
    /// it finds every server ready.
    async fn start_balancer(
        &self,
        haproxy: &Path,
        port: u16,
        max_connections: usize,
    ) -> Result<(), LoadtestError> {
        let path = self.config.with_file_name("haproxy.cfg");
        std::fs::write(&path, haproxy_config(port, max_connections, &self.servers))?;
        let mut child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(haproxy)
            .arg("-f")
            .arg(&path)
            .arg("-db")
            .watched()
            .spawn()
            .map_err(|e| LoadtestError::Cluster(format!("cannot start HAProxy: {e}")))?;
        if let Some(stderr) = child.stderr.take() {
            let log = Arc::clone(&self.log);
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    log.push(Source::Balancer, line);
                }
            });
        }
        *lock(&self.balancer) = Some(child);
        // Ready through the balancer, on every server: each check must
        // have passed twice (`rise 2`) before the load starts.
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| LoadtestError::Cluster(e.to_string()))?;
        let start = Instant::now();
        let mut ready_in_a_row = 0;
        while ready_in_a_row < 2 * self.servers.len() + 2 {
            let exited = lock(&self.balancer)
                .as_mut()
                .is_none_or(|child| !matches!(child.try_wait(), Ok(None)));
            let ready = http
                .get(format!("{}/readyz", self.url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            ready_in_a_row = if ready { ready_in_a_row + 1 } else { 0 };
            if exited || start.elapsed() > SERVE_DEADLINE {
                let said: Vec<String> = self
                    .log
                    .lines()
                    .into_iter()
                    .filter(|l| l.source == Source::Balancer)
                    .map(|l| l.text)
                    .collect();
                return Err(LoadtestError::Cluster(format!(
                    "HAProxy exited, or did not find the servers ready within {} s; it said:\n{}",
                    SERVE_DEADLINE.as_secs(),
                    said.join("\n")
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Let the checks of every server pass `rise` times.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        Ok(())
    }

    /// Stops the balancer, the servers (SIGCONT first, in case one is
    /// stopped; then SIGTERM) and Postgres.
    pub async fn stop(&self) {
        let balancer = lock(&self.balancer).take();
        if let Some(mut balancer) = balancer {
            let _ = balancer.kill().await;
        }
        for server in &self.servers {
            let process = lock(&server.process).take();
            if let Some(process) = process {
                process.planned.store(true, Ordering::SeqCst);
                signal(process.pid, Signal::SIGCONT);
                signal(process.pid, Signal::SIGTERM);
                if tokio::time::timeout(Duration::from_secs(15), process.exited)
                    .await
                    .is_err()
                {
                    signal(process.pid, Signal::SIGKILL);
                }
            }
        }
        self.postgres.stop().await;
    }
}

/// HAProxy's configuration: round robin over the servers that are ready;
/// while none is, over those that are alive.
fn haproxy_config(port: u16, max_connections: usize, servers: &[ClusterServer]) -> String {
    // HAProxy wants two descriptors per connection and refuses to start
    // when the limit does not allow it: no more than the load needs.
    let mut config = format!(
        "global\n    maxconn {max_connections}\n\n\
         defaults\n    mode http\n    timeout connect 1s\n    timeout client 60s\n    \
         timeout server 60s\n    retries 2\n    option redispatch\n\n\
         frontend mcp\n    bind 127.0.0.1:{port}\n    \
         use_backend graph_relay_alive if {{ nbsrv(graph_relay) eq 0 }}\n    \
         default_backend graph_relay\n"
    );
    for (backend, probe) in [
        ("graph_relay", "/readyz"),
        ("graph_relay_alive", "/healthz"),
    ] {
        config.push_str(&format!(
            "\nbackend {backend}\n    balance roundrobin\n    option httpchk GET {probe}\n    \
             http-check expect status 200\n    \
             default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions\n"
        ));
        for server in servers {
            config.push_str(&format!(
                "    server {} 127.0.0.1:{} check\n",
                server.name, server.port
            ));
        }
    }
    config
}

/// Reads a server's stderr: says when it serves, keeps its warnings and
/// errors (and its last lines, for an exit nobody asked for).
async fn read_server_lines(
    name: String,
    stderr: tokio::process::ChildStderr,
    log: Arc<ClusterLog>,
    tail: Arc<Mutex<Vec<String>>>,
    serving: oneshot::Sender<()>,
) {
    let mut serving = Some(serving);
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.contains("serving MCP at ")
            && let Some(tx) = serving.take()
        {
            let _ = tx.send(());
        }
        if line.contains(" WARN ") || line.contains(" ERROR ") {
            log.push(Source::Server, format!("{name} | {line}"));
        }
        let mut tail = lock(&tail);
        if tail.len() >= 20 {
            tail.remove(0);
        }
        tail.push(line);
    }
}

/// Waits for a server's exit; one the harness did not cause is recorded
/// with the server's last lines.
async fn watch_exit(
    name: String,
    mut child: Child,
    planned: Arc<AtomicBool>,
    log: Arc<ClusterLog>,
    tail: Arc<Mutex<Vec<String>>>,
) {
    let status = child.wait().await;
    if planned.load(Ordering::SeqCst) {
        return;
    }
    // The reader may still be taking the last lines in.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = match status {
        Ok(status) => status.to_string(),
        Err(e) => format!("unknown ({e})"),
    };
    let text = format!(
        "{name} exited on its own ({status}); its last lines:\n{}",
        lock(&tail).join("\n")
    );
    log.push(
        Source::Harness,
        format!("{name} exited on its own ({status})"),
    );
    log.unplanned_exits
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(text);
}

fn signal(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A loopback port nothing listens on now.
fn free_port() -> Result<u16, LoadtestError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn haproxy_checks_readiness_and_falls_back_to_liveness() {
        let servers: Vec<ClusterServer> = [8001, 8002]
            .iter()
            .enumerate()
            .map(|(i, port)| ClusterServer {
                name: format!("s{}", i + 1),
                port: *port,
                process: Mutex::new(None),
            })
            .collect();
        let config = haproxy_config(9000, 600, &servers);
        assert!(config.contains("bind 127.0.0.1:9000"), "{config}");
        assert!(config.contains("maxconn 600"), "{config}");
        assert!(config.contains("option httpchk GET /readyz"), "{config}");
        assert!(config.contains("option httpchk GET /healthz"), "{config}");
        assert!(
            config.contains("use_backend graph_relay_alive if { nbsrv(graph_relay) eq 0 }"),
            "{config}"
        );
        assert_eq!(config.matches("server s2 127.0.0.1:8002 check").count(), 2);
    }
}
