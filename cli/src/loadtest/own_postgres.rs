//! The Postgres of `loadtest --cluster`: `initdb` in the harness's
//! temporary folder, one `postgres` child on a free loopback port, and the
//! database faults (every backend terminated, an immediate stop, a full
//! disk). No other database is touched: the faults must never reach a
//! Postgres that other programs (or other tests) use.
//!
//! As root, the data folder lives on a tmpfs mounted in a private mount
//! namespace (`unshare --mount`) that a holder process keeps alive. Nothing
//! outside that namespace sees the mount, it goes away with the holder,
//! and shrinking it to what is in use (`mount -o remount,size=…`) is a full
//! disk for this Postgres alone, without writing a byte of filler. Postgres
//! refuses to run as root, so its programs run as the `postgres` user
//! (`setpriv`). As any other user the folder is an ordinary one and the
//! disk fault is not available.
//!
//! Every child gets `setpriv --pdeathsig KILL`: a harness that is killed
//! takes its Postgres (and the holder, hence the mount) with it.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// The database the servers use.
pub const DATABASE: &str = "graph_relay";
/// The schema of the queue's tables.
pub const SCHEMA: &str = "graph_relay";
/// The user Postgres runs as when the harness is root.
const RUN_AS: &str = "postgres";
/// Nominal size of the tmpfs; only what Postgres writes takes memory.
const TMPFS_SIZE: &str = "4g";
/// How long Postgres may take to accept connections after a start.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// Why the harness's Postgres could not be set up or faulted.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    /// A program is missing or failed.
    #[error("{0}")]
    Setup(String),
    /// A statement failed.
    #[error("postgres: {0}")]
    Sql(#[from] tokio_postgres::Error),
    /// A file or process could not be used.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// The holder of the private mount namespace (root only).
struct Namespace {
    holder: Child,
    pid: u32,
    /// The tmpfs's mount point, as the harness names it.
    mount: PathBuf,
}

/// The harness's own Postgres.
pub struct OwnPostgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    log: PathBuf,
    namespace: Option<Namespace>,
    postmaster: Mutex<Option<Child>>,
}

impl OwnPostgres {
    /// Creates a cluster with `initdb` under `dir`, starts it on `port`
    /// and creates [`DATABASE`]. `bin` is the folder of `initdb`, `pg_ctl`
    /// and `postgres`.
    pub async fn start(dir: &Path, bin: &Path, port: u16) -> Result<Self, PostgresError> {
        let root = nix::unistd::geteuid().is_root();
        let mount = dir.join("pg");
        std::fs::create_dir_all(&mount)?;
        let namespace = if root {
            // The `postgres` user must reach the mount point through the
            // harness's private temporary folder.
            set_mode(dir, 0o711)?;
            Some(Namespace::mount(&mount).await?)
        } else {
            None
        };
        let postgres = Self {
            bin: bin.to_owned(),
            data: mount.join("data"),
            port,
            log: dir.join("postgres.log"),
            namespace,
            postmaster: Mutex::new(None),
        };
        let initdb = postgres
            .command(&bin.join("initdb"), false)
            .arg("-D")
            .arg(&postgres.data)
            .args(["--auth=trust", "--username=postgres", "-E", "UTF8"])
            .args(["--locale=C", "--no-sync", "--wal-segsize=1"])
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| PostgresError::Setup(format!("cannot run initdb: {e}")))?;
        if !initdb.status.success() {
            return Err(PostgresError::Setup(format!(
                "initdb failed ({}): {}",
                initdb.status,
                String::from_utf8_lossy(&initdb.stderr).trim()
            )));
        }
        postgres.spawn_postmaster().await?;
        let admin = postgres.connect("postgres").await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
            .await?;
        Ok(postgres)
    }

    /// The URL the servers connect with.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// Whether the full-disk fault is available (the data is on a tmpfs).
    pub fn can_fill_disk(&self) -> bool {
        self.namespace.is_some()
    }

    /// Terminates every backend of [`DATABASE`] but the caller's own
    /// (`pg_terminate_backend`); returns how many.
    pub async fn terminate_backends(&self) -> Result<u64, PostgresError> {
        let client = self.connect(DATABASE).await?;
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
                 FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND backend_type = 'client backend'",
                &[],
            )
            .await?;
        Ok(row
            .try_get::<_, i64>(0)
            .ok()
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0))
    }

    /// `pg_ctl stop -m immediate`: every Postgres process ends at once,
    /// without a checkpoint, as in a crash.
    pub async fn crash(&self) -> Result<(), PostgresError> {
        let out = self
            .command(&self.bin.join("pg_ctl"), false)
            .args(["stop", "-m", "immediate", "-D"])
            .arg(&self.data)
            .stdin(Stdio::null())
            .output()
            .await?;
        if !out.status.success() {
            return Err(PostgresError::Setup(format!(
                "pg_ctl stop -m immediate failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let child = self.lock().take();
        if let Some(mut child) = child {
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        }
        Ok(())
    }

    /// Starts Postgres again (after [`OwnPostgres::crash`], or after it
    /// stopped on its own) and waits until it accepts connections.
    pub async fn restart(&self) -> Result<(), PostgresError> {
        self.spawn_postmaster().await
    }

    /// Whether the postmaster has exited (it gives up when it cannot
    /// recover, e.g. on a disk still full).
    pub fn exited(&self) -> bool {
        let mut guard = self.lock();
        match guard.as_mut() {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Shrinks the tmpfs to what is in use: from now on every write that
    /// needs a new block fails with "No space left on device". Returns the
    /// size it was shrunk to, in bytes.
    pub async fn fill_disk(&self) -> Result<u64, PostgresError> {
        let namespace = self.namespace.as_ref().ok_or_else(|| {
            PostgresError::Setup(
                "the disk fault needs the data on a tmpfs of its own, which needs root".into(),
            )
        })?;
        // Postgres writes meanwhile, so a size read a moment ago may already
        // be too small for the kernel; read it again and retry.
        let mut last = String::new();
        for _ in 0..50 {
            let used = namespace.used_bytes()?;
            let kib = used.div_ceil(1024);
            match namespace.remount(&format!("size={kib}k")).await {
                Ok(()) => return Ok(kib * 1024),
                Err(e) => last = e.to_string(),
            }
        }
        Err(PostgresError::Setup(format!(
            "cannot shrink the tmpfs to its use: {last}"
        )))
    }

    /// Gives the tmpfs its room back.
    pub async fn free_disk(&self) -> Result<(), PostgresError> {
        match &self.namespace {
            Some(namespace) => namespace.remount(&format!("size={TMPFS_SIZE}")).await,
            None => Ok(()),
        }
    }

    /// Statement counts and sizes for the report; `None` while the
    /// database does not answer.
    pub async fn figures(&self) -> Option<DatabaseFigures> {
        let read = async {
            let client = self.connect(DATABASE).await?;
            let tables = client
                .query(
                    "SELECT c.relname, pg_table_size(c.oid), pg_indexes_size(c.oid)
                     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = $1 AND c.relkind = 'r' ORDER BY c.relname",
                    &[&SCHEMA],
                )
                .await?;
            let connections = client
                .query(
                    "SELECT coalesce(state, 'unknown'), count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND backend_type = 'client backend'
                     GROUP BY 1 ORDER BY 1",
                    &[],
                )
                .await?;
            let bytes = |r: &tokio_postgres::Row, i: usize| {
                r.try_get::<_, i64>(i)
                    .ok()
                    .and_then(|n| u64::try_from(n).ok())
                    .unwrap_or(0)
            };
            Ok::<_, PostgresError>(DatabaseFigures {
                tables: tables
                    .iter()
                    .filter_map(|r| {
                        Some(TableSize {
                            name: r.try_get(0).ok()?,
                            table_bytes: bytes(r, 1),
                            index_bytes: bytes(r, 2),
                        })
                    })
                    .collect(),
                connections: connections
                    .iter()
                    .filter_map(|r| Some((r.try_get(0).ok()?, bytes(r, 1))))
                    .collect(),
            })
        };
        match tokio::time::timeout(Duration::from_secs(5), read).await {
            Ok(Ok(figures)) => Some(figures),
            _ => None,
        }
    }

    /// Stops Postgres (fast shutdown) and the mount namespace's holder.
    pub async fn stop(&self) {
        let child = self.lock().take();
        if let Some(mut child) = child {
            if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                // SIGINT is Postgres's fast shutdown.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGINT,
                );
            }
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
        if let Some(namespace) = &self.namespace {
            namespace.release().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.postmaster
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts `postgres` as a child, logging to the harness's folder, and
    /// waits until it accepts connections.
    async fn spawn_postmaster(&self) -> Result<(), PostgresError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = self
            .command(&self.bin.join("postgres"), true)
            .arg("-D")
            .arg(&self.data)
            .arg("-p")
            .arg(self.port.to_string())
            // TCP on loopback only: no socket file in a shared folder.
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            .args(["-c", "max_connections=200"])
            .args(["-c", "shared_buffers=32MB"])
            .args(["-c", "log_line_prefix=%m [%p] "])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| PostgresError::Setup(format!("cannot start postgres: {e}")))?;
        *self.lock() = Some(child);
        let start = Instant::now();
        loop {
            match self.connect("postgres").await {
                Ok(_) => return Ok(()),
                Err(e) if start.elapsed() > START_DEADLINE => {
                    return Err(PostgresError::Setup(format!(
                        "postgres did not accept connections within {} s ({e}); see {}",
                        START_DEADLINE.as_secs(),
                        self.log.display()
                    )));
                }
                Err(_) if self.exited() => {
                    return Err(PostgresError::Setup(format!(
                        "postgres exited at start; see {}",
                        self.log.display()
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// A connection as the superuser to `database`, with its driver task.
    async fn connect(&self, database: &str) -> Result<tokio_postgres::Client, PostgresError> {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(database)
            .application_name("graph-relay-loadtest")
            .connect_timeout(Duration::from_secs(2));
        let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// `program` as Postgres runs: in the mount namespace and as
    /// [`RUN_AS`] when root; with a parent-death signal when `owned`.
    fn command(&self, program: &Path, owned: bool) -> Command {
        let mut argv: Vec<OsString> = Vec::new();
        if let Some(namespace) = &self.namespace {
            argv.extend(["nsenter".into(), "-t".into()]);
            argv.push(namespace.pid.to_string().into());
            argv.extend(["-m".into(), "--".into()]);
        }
        let as_user = self.namespace.is_some();
        if as_user || owned {
            argv.push("setpriv".into());
            if as_user {
                argv.extend([
                    format!("--reuid={RUN_AS}").into(),
                    format!("--regid={RUN_AS}").into(),
                    "--clear-groups".into(),
                ]);
            }
            if owned {
                argv.extend(["--pdeathsig".into(), "KILL".into()]);
            }
            argv.push("--".into());
        }
        argv.push(program.as_os_str().to_owned());
        command(&argv)
    }
}

impl Namespace {
    /// Starts the holder: a private mount namespace with a tmpfs on `mount`
    /// owned by [`RUN_AS`].
    async fn mount(mount: &Path) -> Result<Self, PostgresError> {
        let script = format!(
            "mount -t tmpfs -o size={TMPFS_SIZE},mode=0700 tmpfs \"$1\" && chown {RUN_AS}: \"$1\" && echo mounted && exec sleep 2147483647"
        );
        let mut holder = command(&[
            "setpriv".into(),
            "--pdeathsig".into(),
            "KILL".into(),
            "--".into(),
            "unshare".into(),
            "--mount".into(),
            "--propagation".into(),
            "private".into(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            script.into(),
            "sh".into(),
            mount.as_os_str().to_owned(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            PostgresError::Setup(format!(
                "cannot start `setpriv … unshare --mount` (util-linux) for the tmpfs: {e}"
            ))
        })?;
        let stdout = holder
            .stdout
            .take()
            .ok_or_else(|| PostgresError::Setup("the holder has no stdout".into()))?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let said = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
        if !matches!(&said, Ok(Ok(Some(line))) if line == "mounted") {
            let _ = holder.kill().await;
            let output = holder.wait_with_output().await?;
            return Err(PostgresError::Setup(format!(
                "cannot mount a tmpfs in a private mount namespace (needs root and util-linux, \
                 and the `{RUN_AS}` user): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        let pid = holder
            .id()
            .ok_or_else(|| PostgresError::Setup("the holder exited".into()))?;
        Ok(Self {
            holder,
            pid,
            mount: mount.to_owned(),
        })
    }

    /// The mount point as seen from inside the namespace (through the
    /// holder's `/proc/PID/root`).
    fn inside(&self) -> PathBuf {
        let relative = self.mount.strip_prefix("/").unwrap_or(&self.mount);
        PathBuf::from(format!("/proc/{}/root", self.pid)).join(relative)
    }

    /// Bytes in use on the tmpfs.
    fn used_bytes(&self) -> Result<u64, PostgresError> {
        let stat = nix::sys::statvfs::statvfs(&self.inside()).map_err(std::io::Error::from)?;
        let used_blocks = stat.blocks().saturating_sub(stat.blocks_free());
        Ok(used_blocks.saturating_mul(stat.fragment_size()))
    }

    /// `mount -o remount,OPTIONS` of the tmpfs, inside the namespace.
    async fn remount(&self, options: &str) -> Result<(), PostgresError> {
        let out = command(&[
            "nsenter".into(),
            "-t".into(),
            self.pid.to_string().into(),
            "-m".into(),
            "--".into(),
            "mount".into(),
            "-o".into(),
            format!("remount,{options}").into(),
            self.mount.as_os_str().to_owned(),
        ])
        .stdin(Stdio::null())
        .output()
        .await?;
        if out.status.success() {
            Ok(())
        } else {
            Err(PostgresError::Setup(format!(
                "mount -o remount,{options}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// Ends the holder; the namespace and its tmpfs go with the last
    /// process in it.
    async fn release(&self) {
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.holder.start_kill();
    }
}

/// What the report says of the database at one moment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DatabaseFigures {
    /// The queue's tables.
    pub tables: Vec<TableSize>,
    /// Client connections to the database by state (`active`, `idle`, …).
    pub connections: Vec<(String, u64)>,
}

impl DatabaseFigures {
    /// Every table's and index's bytes.
    pub fn total_bytes(&self) -> u64 {
        self.tables
            .iter()
            .map(|t| t.table_bytes + t.index_bytes)
            .sum()
    }

    /// Client connections in all.
    pub fn connection_count(&self) -> u64 {
        self.connections.iter().map(|(_, n)| n).sum()
    }
}

/// One table's size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TableSize {
    /// Its name.
    pub name: String,
    /// The table (with TOAST), bytes.
    pub table_bytes: u64,
    /// Its indexes, bytes.
    pub index_bytes: u64,
}

/// The folder of PostgreSQL's server programs: `explicit`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian), else a folder on `PATH` that has
/// `initdb`.
pub fn find_bin(explicit: Option<&Path>) -> Result<PathBuf, PostgresError> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file();
    if let Some(dir) = explicit {
        return if has_initdb(dir) {
            Ok(dir.to_owned())
        } else {
            Err(PostgresError::Setup(format!(
                "--postgres-bin {}: no initdb there",
                dir.display()
            )))
        };
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, bin)| has_initdb(bin))
        .collect();
    debian.sort();
    if let Some((_, bin)) = debian.pop() {
        return Ok(bin);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|dir| has_initdb(dir))
        .ok_or_else(|| {
            PostgresError::Setup(
                "the cluster needs PostgreSQL's server programs (initdb, pg_ctl, postgres): \
                 install them (Debian: `apt-get install -y postgresql`) or name their folder \
                 with --postgres-bin"
                    .into(),
            )
        })
}

/// A command from its argument vector (the program first).
fn command<S: AsRef<OsStr>>(argv: &[S]) -> Command {
    match argv.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args);
            command
        }
        // Every caller names a program; an empty one fails at spawn.
        None => Command::new(""),
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}
