//! See `skip_build.rs`: `GRAPH_RELAY_SKIP` turns tests that need Postgres
//! into ignored ones. The file lives in this crate so that the published
//! package builds on its own; `cli/build.rs` includes the same file.
include!("skip_build.rs");
