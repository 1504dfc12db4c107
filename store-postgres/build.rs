//! See `tests/skip_build.rs`: `GRAPH_RELAY_SKIP` turns tests that need
//! Postgres into ignored ones.
include!("../tests/skip_build.rs");
