//! Test support (feature `testing`): the test database, a throw-away
//! schema per test ([`TestSchema`]), and a throw-away database per test
//! ([`TestDatabase`]) for tests that count wake-ups: `NOTIFY` channels are
//! per database, so only a database of its own keeps other tests'
//! notifications out of a test's counts.
//!
//! The database is `GRAPH_RELAY_POSTGRES_URL`, or the conventional local
//! server [`DEFAULT_URL`] when that is unset. A test that cannot reach it
//! fails and says how to provide one; a machine without Postgres opts out
//! with `GRAPH_RELAY_SKIP=postgres`, which compiles the Postgres tests as
//! ignored (see `skip_build.rs` in this crate).

use std::time::Duration;

use crate::{ConnectError, PostgresOptions, PostgresStore};

/// The environment variable holding the test database URL, e.g.
/// `postgres://postgres@127.0.0.1:5432/test`.
pub const URL_ENV: &str = "GRAPH_RELAY_POSTGRES_URL";

/// The database the tests use when [`URL_ENV`] is unset: the local server
/// of a development machine (trust authentication, database `test`).
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The test database URL: [`URL_ENV`], else [`DEFAULT_URL`]. Panics, saying
/// what is missing and how to provide it, when nothing listens there.
pub fn url() -> String {
    let url = match std::env::var(URL_ENV) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => DEFAULT_URL.to_owned(),
    };
    if let Err(why) = reachable(&url) {
        panic!(
            "the Postgres tests need a server: {why}. Start one (e.g. `pg_ctlcluster <version> main start`), \
             point {URL_ENV} at one, or opt out with GRAPH_RELAY_SKIP=postgres"
        );
    }
    url
}

/// Whether something accepts TCP connections at the URL's first host and port.
fn reachable(url: &str) -> Result<(), String> {
    use std::str::FromStr;
    let config = tokio_postgres::Config::from_str(url)
        .map_err(|e| format!("{url} is not a Postgres URL: {e}"))?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        // A Unix socket: let the connection itself tell.
        Some(_) => return Ok(()),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let addrs = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
        .map_err(|e| format!("cannot resolve {host}:{port}: {e}"))?;
    for addr in addrs {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok() {
            return Ok(());
        }
    }
    Err(format!(
        "nothing accepts connections at {host}:{port} ({url})"
    ))
}

/// A schema `graph_relay_test_<random>` that is dropped (with everything
/// in it) when this value is dropped.
#[derive(Debug)]
pub struct TestSchema {
    url: String,
    name: String,
}

impl TestSchema {
    /// A fresh schema name on the database at `url`. The schema itself is
    /// created by the first store that connects with [`options`](Self::options).
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            name: format!("graph_relay_test_{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// The schema name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Options that put a store in this schema (pool of 8).
    pub fn options(&self) -> PostgresOptions {
        PostgresOptions {
            schema: Some(self.name.clone()),
            pool_size: 8,
            application_name: "graph-relay-test".into(),
            ..PostgresOptions::default()
        }
    }

    /// A store in this schema (call inside a Tokio runtime).
    pub async fn store(&self) -> Result<PostgresStore, ConnectError> {
        PostgresStore::connect(&self.url, &self.options()).await
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        // On a thread of its own with its own runtime: this may run inside
        // (or outside) any runtime.
        let (url, name) = (self.url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(30),
                    PostgresStore::drop_schema(&url, &name),
                )
                .await
                .map_err(|_| "timed out".to_owned())?
                .map_err(|e| e.to_string())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop test schema {}: {e}", self.name),
            Err(_) => eprintln!("could not drop test schema {}: panicked", self.name),
        }
    }
}

/// A database `graph_relay_test_<random>` created for one test and dropped
/// (`WITH (FORCE)`, so connections still open are ended) when this value is
/// dropped. Its `LISTEN`/`NOTIFY` channel is its own: servers in it hear no
/// other test's notifications.
#[derive(Debug)]
pub struct TestDatabase {
    admin_url: String,
    name: String,
    config: tokio_postgres::Config,
}

impl TestDatabase {
    /// Creates a fresh database on the server at `url` (whose user may
    /// create databases). Call inside a Tokio runtime.
    pub async fn create(url: &str) -> Result<Self, ConnectError> {
        use std::str::FromStr;
        let mut config = tokio_postgres::Config::from_str(url)
            .map_err(|e| ConnectError::Url(crate::errors::describe(&e)))?;
        let name = format!("graph_relay_test_{}", uuid::Uuid::new_v4().simple());
        run_admin(url, &format!("CREATE DATABASE \"{name}\""))
            .await
            .map_err(ConnectError::Connect)?;
        config.dbname(&name);
        Ok(Self {
            admin_url: url.to_owned(),
            name,
            config,
        })
    }

    /// The database name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A connection configuration for this database.
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// Options that put a store in schema `graph_relay` of this database
    /// (pool of 8).
    pub fn options(&self) -> PostgresOptions {
        PostgresOptions {
            schema: Some("graph_relay".into()),
            pool_size: 8,
            application_name: "graph-relay-test".into(),
            ..PostgresOptions::default()
        }
    }

    /// A store in this database (call inside a Tokio runtime); every store
    /// made here shares one schema, as several servers share one queue.
    pub async fn store(&self) -> Result<PostgresStore, ConnectError> {
        PostgresStore::connect_config(self.config.clone(), &self.options()).await
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let (url, name) = (self.admin_url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(30),
                    run_admin(
                        &url,
                        &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
                    ),
                )
                .await
                .map_err(|_| "timed out".to_owned())?
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop test database {}: {e}", self.name),
            Err(_) => eprintln!("could not drop test database {}: panicked", self.name),
        }
    }
}

/// Runs one statement on its own connection to `url` (outside any
/// transaction, as `CREATE DATABASE` needs).
async fn run_admin(url: &str, sql: &str) -> Result<(), String> {
    use std::str::FromStr;
    let config = tokio_postgres::Config::from_str(url).map_err(|e| crate::errors::describe(&e))?;
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| crate::errors::describe(&e))?;
    let driver = tokio::spawn(connection);
    let outcome = client
        .batch_execute(sql)
        .await
        .map_err(|e| crate::errors::describe(&e));
    drop(client);
    let _ = driver.await;
    outcome
}
