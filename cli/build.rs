//! See `store-postgres/skip_build.rs`: `GRAPH_RELAY_SKIP` turns tests that
//! need Postgres, the real MCP peers or a browser into ignored ones.
include!("../store-postgres/skip_build.rs");
