//! Test support (feature `testing`): the database URL from the environment
//! and a throw-away schema per test.

use std::time::Duration;

use crate::{ConnectError, PostgresOptions, PostgresStore};

/// The environment variable holding the test database URL, e.g.
/// `postgres://postgres@127.0.0.1:5432/test`.
pub const URL_ENV: &str = "GRAPH_RELAY_POSTGRES_URL";

/// The test database URL, or `None` after printing why `test` is skipped.
pub fn url_or_skip(test: &str) -> Option<String> {
    match std::env::var(URL_ENV) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            eprintln!(
                "skipped {test}: {URL_ENV} is not set (e.g. {URL_ENV}=postgres://postgres@127.0.0.1:5432/test)"
            );
            None
        }
    }
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
