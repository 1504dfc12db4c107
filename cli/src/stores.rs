//! The store a command runs on, from its flags: SQLite (default), memory
//! or Postgres, and the MCP server of `stdio` on it.

use std::sync::Arc;

use graph_relay_core::catalog::ToolCatalog;
use graph_relay_core::mcp::{DEFAULT_INSTRUCTIONS, McpServer, ServerInfo};
use graph_relay_core::prelude::*;
use graph_relay_core::stats::OperatorStats;
use graph_relay_core::store::Store;

use crate::CliError;
use crate::command_line::StoreArgs;

/// The store of `args` when it is not Postgres: memory or SQLite.
pub(crate) fn open_store(args: &StoreArgs) -> Result<Arc<dyn Store>, CliError> {
    if args.postgres.is_some() {
        return Err(CliError::Usage(
            "--postgres is supported by `serve` and `stdio`".into(),
        ));
    }
    if args.memory {
        return Ok(Arc::new(graph_relay_store_memory::MemoryStore::new()));
    }
    Ok(Arc::new(open_sqlite(args)?))
}

/// The SQLite store of `--db`.
pub(crate) fn open_sqlite(
    args: &StoreArgs,
) -> Result<graph_relay_store_sqlite::SqliteStore, CliError> {
    graph_relay_store_sqlite::SqliteStore::open(&args.db)
        .map_err(|e| CliError::Db(format!("{}: {e}", args.db.display())))
}

/// The Postgres store of `--postgres`, connected and migrated on `runtime`
/// (which then drives its connections); `None` without the flag.
pub(crate) fn open_postgres(
    args: &StoreArgs,
    runtime: &tokio::runtime::Runtime,
) -> Result<Option<graph_relay_store_postgres::PostgresStore>, CliError> {
    let Some(url) = &args.postgres else {
        return Ok(None);
    };
    let defaults = graph_relay_store_postgres::PostgresOptions::default();
    let options = graph_relay_store_postgres::PostgresOptions {
        schema: args.postgres_schema.clone(),
        pool_size: args.postgres_pool.unwrap_or(defaults.pool_size),
        ..defaults
    };
    runtime
        .block_on(graph_relay_store_postgres::PostgresStore::connect(
            url, &options,
        ))
        .map(Some)
        .map_err(|e| CliError::Db(format!("postgres: {e}")))
}

/// `postgres` (opened by [`open_postgres`]) or else `open_store`; with
/// Postgres, the queue's signals are forwarded to (and woken by) the other
/// servers on the database.
pub(crate) fn open_any_store(
    args: &StoreArgs,
    postgres: Option<graph_relay_store_postgres::PostgresStore>,
    runtime: &tokio::runtime::Runtime,
) -> Result<McpServer, CliError> {
    match postgres {
        None => mcp_server(open_store(args)?),
        Some(pg) => {
            let server = mcp_server(Arc::new(pg.clone()))?;
            let _enter = runtime.enter();
            // The listener runs (and reconnects) for the life of the runtime.
            let _listener = pg.signal_bridge(server.queue().signals().clone()).install();
            tracing::info!(schema = ?pg.schema(), "queue and MCP sessions on Postgres; wake-ups over LISTEN/NOTIFY");
            Ok(server)
        }
    }
}

/// The MCP server of `graph-relay stdio`: the published catalog on `store`.
fn mcp_server(store: Arc<dyn Store>) -> Result<McpServer, CliError> {
    let queue = Queue::new(
        store,
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        QueueConfig::default(),
    );
    let mut info = ServerInfo::new("graph-relay", env!("CARGO_PKG_VERSION"));
    info.instructions = Some(DEFAULT_INSTRUCTIONS.into());
    let catalog = ToolCatalog::builder()
        .build()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(McpServer::new(queue, catalog, info))
}

/// The stores `serve` runs on.
pub(crate) struct ServeStores {
    /// The queue's store.
    pub(crate) queue: Arc<dyn Store>,
    /// Where `/admin/status` and the metrics read the queue's figures
    /// (none on the memory store).
    pub(crate) stats: Option<Arc<dyn OperatorStats>>,
    /// The Postgres store, when the queue is on one: its MCP sessions and
    /// its wake-ups are the cluster's.
    pub(crate) postgres: Option<graph_relay_store_postgres::PostgresStore>,
}

/// Opens the stores of `serve` from its flags: Postgres, memory or SQLite.
pub(crate) fn open_for_serve(
    args: &StoreArgs,
    runtime: &tokio::runtime::Runtime,
) -> Result<ServeStores, CliError> {
    let postgres = open_postgres(args, runtime)?;
    let (queue, stats): (Arc<dyn Store>, Option<Arc<dyn OperatorStats>>) = match &postgres {
        Some(pg) => (Arc::new(pg.clone()), Some(Arc::new(pg.clone()))),
        None if args.memory => (open_store(args)?, None),
        None => {
            let sqlite = Arc::new(open_sqlite(args)?);
            (sqlite.clone(), Some(sqlite))
        }
    };
    Ok(ServeStores {
        queue,
        stats,
        postgres,
    })
}
