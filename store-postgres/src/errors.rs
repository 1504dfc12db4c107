//! Why connecting, migrating or dropping a schema failed, and how a
//! driver or pool error is described (the database's own severity, code
//! and message when it sent one).

/// Why [`PostgresStore::connect`](crate::PostgresStore::connect) failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL is not a Postgres connection string.
    #[error("invalid Postgres URL: {0}")]
    Url(String),
    /// The schema name is not a plain lowercase identifier.
    #[error(
        "invalid schema name `{0}`: use 1 to 63 characters of lowercase letters, digits and `_`, not starting with a digit"
    )]
    InvalidSchema(String),
    /// The pool could not be built or no connection could be made.
    #[error("cannot connect to Postgres: {0}")]
    Connect(String),
    /// A migration failed; nothing of it was kept.
    #[error("migrating the schema failed: {0}")]
    Migrate(String),
    /// The connection's `search_path` names no existing schema.
    #[error("the connection's search_path names no existing schema; pass a schema")]
    NoSchema,
    /// The database was migrated by a newer build.
    #[error(
        "the database has schema version {found}; this build supports up to {supported} (refusing to touch it)"
    )]
    NewerSchema {
        /// The newest recorded migration.
        found: i32,
        /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).
        supported: i32,
    },
}

impl ConnectError {
    pub(crate) fn migrate(e: tokio_postgres::Error) -> Self {
        Self::Migrate(describe(&e))
    }
}

/// Why [`PostgresStore::drop_schema`](crate::PostgresStore::drop_schema) failed.
#[derive(Debug, thiserror::Error)]
pub enum DropSchemaError {
    /// The URL is not a Postgres connection string.
    #[error("invalid Postgres URL: {0}")]
    Url(String),
    /// The schema name is not a plain lowercase identifier.
    #[error("invalid schema name `{0}`")]
    InvalidSchema(String),
    /// The server refused or could not be reached.
    #[error("dropping the schema failed: {0}")]
    Postgres(String),
}

/// The server's message for a database error, the error itself otherwise.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({}): {}", db.severity(), db.code().code(), db.message()),
        None => match std::error::Error::source(e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}

pub(crate) fn pool_error(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(e) => describe(e),
        other => other.to_string(),
    }
}
