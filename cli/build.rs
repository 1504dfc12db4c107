//! See `tests/skip_build.rs`: `GRAPH_RELAY_SKIP` turns tests that need
//! Postgres or the real MCP peers into ignored ones.
include!("../tests/skip_build.rs");
