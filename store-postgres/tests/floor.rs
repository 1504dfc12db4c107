//! The floor of the Postgres benches (`benches/graphile/floor.sql`, see
//! the README beside it) does what its figures claim: each transaction of
//! the script queues `rows` commands, reads them, starts them and completes
//! them, and nothing else. Runs the script with `pgbench` and reads the
//! table back with `psql`, as `run.sh` does, in the floor's own schema
//! (`graph_relay_floor`, dropped at the end).
//!
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`)
//! and its client programs `psql` and `pgbench` on the `PATH`;
//! `GRAPH_RELAY_SKIP=postgres` lists this test as ignored instead.

use std::path::PathBuf;
use std::process::Command;

use graph_relay_store_postgres::testing::url;

/// A file of the floor, beside `run.sh`.
fn floor_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("benches/graphile")
        .join(name)
}

/// Runs `program` with `args`; its standard output, or a panic that shows
/// what it said.
fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{program} could not start ({e}): the floor test needs Postgres' client programs"
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("error"),
        "{program} {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
#[test]
fn the_floor_script_takes_each_command_through_its_lifecycle() {
    let url = url();
    let table = floor_file("floor-table.sql");
    let script = floor_file("floor.sql");
    run(
        "psql",
        &[
            &url,
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            table.to_str().expect("path"),
        ],
    );
    let bench = run(
        "pgbench",
        &[
            "-n",
            "-M",
            "prepared",
            "-c",
            "1",
            "-t",
            "3",
            "-D",
            "rows=4",
            "-f",
            script.to_str().expect("path"),
            &url,
        ],
    );
    assert!(
        bench.contains("number of transactions actually processed: 3/3"),
        "pgbench ran every transaction:\n{bench}"
    );
    let rows = run(
        "psql",
        &[
            &url,
            "-At",
            "-c",
            "SELECT status, revision, finished_at IS NOT NULL, count(*), count(DISTINCT id) \
             FROM graph_relay_floor.commands GROUP BY 1, 2, 3",
        ],
    );
    run(
        "psql",
        &[
            &url,
            "-q",
            "-c",
            "SET client_min_messages = warning",
            "-c",
            "DROP SCHEMA graph_relay_floor CASCADE",
        ],
    );
    // Three steps of four lifecycles: twelve commands, each queued,
    // started and completed once, none left open.
    assert_eq!(rows.trim(), "completed|3|t|12|12");
}
