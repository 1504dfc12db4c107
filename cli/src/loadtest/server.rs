//! The servers under load: started by the harness (a child `serve`, or a
//! cluster), or running already; and how their processes are sampled.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use graph_relay_transport_http::auth::{AgentToken, DeviceToken};
use graph_relay_transport_http::config::{ConfigFile, ServerSection};
use tokio::sync::oneshot;

use super::{LoadtestArgs, LoadtestError, WAIT_SECONDS, cluster};
use crate::children::Watched;

/// CPU use of each server between two samples of all of them.
pub(super) fn cpu_since(
    now: &[Option<ProcessSample>],
    then: &[Option<ProcessSample>],
) -> Vec<Option<f64>> {
    now.iter()
        .zip(then)
        .map(|(now, then)| now.cpu_percent_since(then))
        .collect()
}

/// One server the load goes to.
pub(super) struct Target {
    /// Its base URL.
    pub(super) base: String,
    /// Its process, when known.
    pub(super) pid: Option<u32>,
}

/// The servers the load goes to, and how to read their processes.
pub(super) struct ServerUnderTest {
    /// One, or (with several `--server`) every server, in order.
    pub(super) targets: Vec<Target>,
    /// Where desktops and agents connect: the targets, or a cluster's
    /// load balancer.
    pub(super) entry: Vec<String>,
    /// The cluster, with `--cluster`.
    pub(super) cluster: Option<Arc<cluster::Cluster>>,
    /// The child process and its folder, when the harness started it.
    child: Option<(tokio::process::Child, tempfile::TempDir)>,
    /// With an external server: its configuration file and the owner whose
    /// tokens the harness added.
    added: Option<(PathBuf, String)>,
}

impl ServerUnderTest {
    /// Starts this binary's `serve` on a SQLite file in a temporary folder.
    pub(super) async fn local(
        args: &LoadtestArgs,
        agents: Vec<AgentToken>,
        devices: Vec<DeviceToken>,
    ) -> Result<Self, LoadtestError> {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("graph-relay.toml");
        let file = ConfigFile {
            server: ServerSection {
                max_connections: Some(max_connections(args)),
                ..ServerSection::default()
            },
            oauth: None,
            agents,
            devices,
        };
        file.save(&config)?;
        let exe = std::env::current_exe()?;
        let mut child = tokio::process::Command::new(exe)
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--config")
            .arg(&config)
            .arg("--db")
            .arg(dir.path().join("queue.db"))
            .args(["--max-wait-seconds", &WAIT_SECONDS.to_string()])
            .env("GRAPH_RELAY_LOG", "info")
            .watched()
            .spawn()
            .map_err(|e| LoadtestError::Server(format!("cannot start `serve`: {e}")))?;
        let pid = child.id();
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| LoadtestError::Server("no stderr".into()))?;
        // Read the log: the address, then drain it.
        let (address_tx, address_rx) = oneshot::channel();
        tokio::spawn(read_server_log(stderr, address_tx));
        let base = tokio::time::timeout(Duration::from_secs(30), address_rx)
            .await
            .map_err(|_| LoadtestError::Server("did not start within 30 s".into()))?
            .map_err(|_| LoadtestError::Server("exited before it listened".into()))?;
        Ok(Self {
            entry: vec![base.clone()],
            targets: vec![Target { base, pid }],
            cluster: None,
            child: Some((child, dir)),
            added: None,
        })
    }

    /// Starts a cluster: its Postgres, its servers and HAProxy.
    pub(super) async fn cluster(
        args: &LoadtestArgs,
        agents: Vec<AgentToken>,
        devices: Vec<DeviceToken>,
    ) -> Result<Self, LoadtestError> {
        let cluster =
            cluster::Cluster::start(&args.cluster, max_connections(args), agents, devices).await?;
        Ok(Self {
            targets: cluster
                .server_urls()
                .into_iter()
                .map(|base| Target { base, pid: None })
                .collect(),
            entry: vec![cluster.url().to_owned()],
            cluster: Some(Arc::new(cluster)),
            child: None,
            added: None,
        })
    }

    /// Running servers sharing the token file `config`: adds the harness's
    /// tokens to it. `pids` are the servers' process ids, in their order.
    pub(super) async fn external(
        urls: &[String],
        config: &Path,
        owner: &str,
        agents: Vec<AgentToken>,
        devices: Vec<DeviceToken>,
        pids: &[u32],
    ) -> Result<Self, LoadtestError> {
        let mut file = ConfigFile::load(config)?;
        file.agents.extend(agents);
        file.devices.extend(devices);
        file.save(config)?;
        // The server looks at its token file four times a second.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let targets: Vec<Target> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| Target {
                base: url.trim_end_matches('/').to_owned(),
                pid: pids.get(i).copied(),
            })
            .collect();
        Ok(Self {
            entry: targets.iter().map(|t| t.base.clone()).collect(),
            targets,
            cluster: None,
            child: None,
            added: Some((config.to_owned(), owner.to_owned())),
        })
    }

    /// CPU and memory of each server's process, where it is known.
    pub(super) fn sample(&self) -> Vec<Option<ProcessSample>> {
        match &self.cluster {
            // A cluster's servers change their process when restarted.
            Some(cluster) => cluster
                .pids()
                .into_iter()
                .map(|pid| pid.and_then(ProcessSample::of))
                .collect(),
            None => self
                .targets
                .iter()
                .map(|t| t.pid.and_then(ProcessSample::of))
                .collect(),
        }
    }

    /// Stops the child server (SIGTERM, then SIGKILL after 15 s), or
    /// removes the harness's tokens from an external server's file.
    pub(super) async fn stop(&mut self) -> Result<(), LoadtestError> {
        if let Some(cluster) = self.cluster.take() {
            cluster.stop().await;
        }
        if let Some((path, owner)) = self.added.take() {
            let mut file = ConfigFile::load(&path)?;
            file.agents.retain(|a| a.owner != owner);
            file.devices.retain(|d| d.owner != owner);
            file.save(&path)?;
        }
        if let Some((mut child, _dir)) = self.child.take() {
            if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            match tokio::time::timeout(Duration::from_secs(15), child.wait()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(LoadtestError::Server(e.to_string())),
                Err(_) => {
                    let _ = child.kill().await;
                    return Err(LoadtestError::Server(
                        "did not stop within 15 s; killed".into(),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Connections a server should take: every desktop's held sync and its
/// posts, every agent's requests in flight, and slack.
pub(super) fn max_connections(args: &LoadtestArgs) -> usize {
    let in_flight = (args.rate * (args.run_seconds + f64::from(WAIT_SECONDS))).ceil() as usize;
    args.desktops + args.agents * 2 + in_flight + 256
}

/// Reads the child server's log: sends its base URL once it listens, then
/// passes warnings and errors on to this process's stderr.
async fn read_server_log(stderr: tokio::process::ChildStderr, address: oneshot::Sender<String>) {
    use tokio::io::AsyncBufReadExt;
    let mut address = Some(address);
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(rest) = line.split("serving MCP at ").nth(1)
            && let Some(tx) = address.take()
        {
            let url = rest.split_whitespace().next().unwrap_or_default();
            let _ = tx.send(url.trim_end_matches("/mcp").to_owned());
            continue;
        }
        if line.contains(" WARN ") || line.contains(" ERROR ") {
            eprintln!("server | {line}");
        }
    }
}

/// CPU time and memory of a process at one moment (`/proc/<pid>`).
#[derive(Debug, Clone, Copy)]
pub(super) struct ProcessSample {
    /// Whose (`None`: this process).
    pid: Option<u32>,
    at: Instant,
    cpu: Duration,
    /// Resident memory, bytes.
    pub(super) rss_bytes: u64,
    /// Peak resident memory, bytes.
    pub(super) peak_rss_bytes: u64,
}

impl ProcessSample {
    /// Process `pid`, or `None` where `/proc` does not have it.
    pub(super) fn of(pid: u32) -> Option<Self> {
        Self::read(&format!("/proc/{pid}"), Some(pid))
    }

    /// This process.
    pub(super) fn of_self() -> Option<Self> {
        Self::read("/proc/self", None)
    }

    fn read(dir: &str, pid: Option<u32>) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
        let cpu = crate::baseline::cpu_of_stat(&stat)?;
        let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
        let kib = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .map(|v| v * 1024)
        };
        Some(Self {
            pid,
            at: Instant::now(),
            cpu,
            rss_bytes: kib("VmRSS:")?,
            peak_rss_bytes: kib("VmHWM:").unwrap_or_default(),
        })
    }
}

/// CPU use between two samples, in percent of one core.
pub(super) trait CpuSince {
    fn cpu_percent_since(&self, earlier: &Self) -> Option<f64>;
}

impl CpuSince for Option<ProcessSample> {
    fn cpu_percent_since(&self, earlier: &Self) -> Option<f64> {
        let (now, then) = ((*self)?, (*earlier)?);
        // A server restarted in between: the CPU of two processes.
        if now.pid != then.pid {
            return None;
        }
        let wall = now.at.saturating_duration_since(then.at).as_secs_f64();
        (wall > 0.0).then(|| now.cpu.saturating_sub(then.cpu).as_secs_f64() / wall * 100.0)
    }
}
