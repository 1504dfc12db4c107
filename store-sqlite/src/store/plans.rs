//! The query plans of the statements on the hot paths: every sync's, and
//! the look-ups of keys and devices.

use super::*;

/// The query plan of `sql`, one line per step.
fn plan(conn: &rusqlite::Connection, sql: &str) -> String {
    let mut stmt = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .expect("prepare");
    let params = vec![rusqlite::types::Value::Text("x".into()); stmt.parameter_count()];
    let rows = stmt
        .query_map(rusqlite::params_from_iter(params), |row| {
            row.get::<_, String>(3)
        })
        .expect("query");
    rows.map(|r| r.expect("row"))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// A database with this build's schema, and a connection to it.
fn fresh_schema() -> (tempfile::TempDir, rusqlite::Connection) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("plans.sqlite");
    drop(SqliteStore::open(&path).expect("open"));
    let conn = rusqlite::Connection::open(&path).expect("connect");
    (dir, conn)
}

/// Each statement's plan uses the index named beside it, and no step of
/// it walks the commands table.
fn assert_indexed_without_walking_commands(conn: &rusqlite::Connection, cases: &[(String, &str)]) {
    for (sql, wanted) in cases {
        let plan = plan(conn, sql);
        assert!(plan.contains(wanted), "{sql}\n  -> {plan}");
        assert!(
            plan.split(" / ").all(|step| step != "SCAN commands"),
            "{sql}\n  -> {plan}"
        );
    }
}

/// The statements every sync runs search by all their key columns,
/// never by a prefix that spans an owner's or a project's rows (with
/// one owner and 10,000 desktops in one project, the planner's own
/// choice for the DELETE walked every share of the project per sync).
#[test]
fn per_sync_statements_search_by_every_key_column() {
    let (_dir, conn) = fresh_schema();
    for (sql, wanted) in [
        (
            shares::DELETE_SHARES.to_string(),
            "shared_sessions_by_device (device=? AND owner=? AND project=?)",
        ),
        (
            shares::SELECT_SHARES.to_string(),
            "shared_sessions_by_device (device=? AND owner=? AND project=?)",
        ),
        (
            shares::STAMP_SHARES.to_string(),
            "shared_sessions_by_device (device=? AND owner=? AND project=?)",
        ),
        (
            shares::shared_projects_sql(101),
            "shared_sessions_by_device (device=? AND owner=?)",
        ),
        (
            queued_commands_sql(100),
            "commands_open (device=? AND owner=? AND project=?)",
        ),
    ] {
        let plan = plan(&conn, &sql);
        assert!(plan.contains(wanted), "{sql}\n  -> {plan}");
        assert!(!plan.contains("SCAN"), "{sql}\n  -> {plan}");
    }
    // Without the named index the planner takes the primary key's
    // prefix, which is what the names prevent.
    let unnamed = plan(
        &conn,
        "DELETE FROM shared_sessions WHERE owner = ?1 AND project = ?2 AND device = ?3",
    );
    assert!(
        unnamed.contains("PRIMARY KEY (owner=? AND project=?)"),
        "{unnamed}"
    );
}

/// A device's open commands, and the running ones whose lease lapsed, are
/// found through their indexes; a queued backlog is never walked to find
/// running commands.
#[test]
fn open_and_running_commands_are_found_by_their_indexes() {
    let (_dir, conn) = fresh_schema();
    // Walking the running index in lease order is fine; walking the table
    // is not.
    assert_indexed_without_walking_commands(
        &conn,
        &[
            (
                running_commands_sql(100),
                "commands_open (device=? AND owner=?)",
            ),
            (lapsed_commands_sql(100), "commands_running"),
        ],
    );
}

/// Keys and devices are found by all their key columns, led by the one
/// that tells rows apart (the key, the device) rather than the owner every
/// row of a one-owner server shares; expired keys are released along the
/// expiry index. None of them walks the commands.
#[test]
fn keys_and_devices_are_found_by_all_their_key_columns() {
    let (_dir, conn) = fresh_schema();
    assert_indexed_without_walking_commands(
        &conn,
        &[
            (
                KEY_HOLDER.to_string(),
                "commands_keys (idempotency_key=? AND agent=? AND owner=?)",
            ),
            (DEVICE.to_string(), "PRIMARY KEY (device=? AND owner=?)"),
            (
                expired_keys_sql(100),
                "commands_key_expiry (key_expires_at<?)",
            ),
        ],
    );
}
