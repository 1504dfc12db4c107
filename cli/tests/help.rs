//! Every feature of `serve` and `worker` is findable from `--help`: a table
//! of feature → the words its mention must use, checked against the help
//! each command prints. A mention removed from the help fails here.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_graph-relay");

/// `graph-relay <command> --help` (stdout).
fn help(command: &str) -> String {
    let out = Command::new(BIN)
        .args([command, "--help"])
        .output()
        .expect("run graph-relay");
    assert!(out.status.success(), "{command} --help failed");
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// Each feature's words that are missing from `text`.
fn missing<'a>(text: &str, table: &[(&'a str, &[&'a str])]) -> Vec<(&'a str, &'a str)> {
    table
        .iter()
        .flat_map(|(feature, words)| words.iter().map(move |w| (*feature, *w)))
        .filter(|(_, word)| !text.contains(word))
        .collect()
}

const SERVE: &[(&str, &[&str])] = &[
    ("the configuration file", &["--config", "graph-relay.toml"]),
    (
        "[server] section and every key",
        &[
            "[server]",
            "public_url",
            "authorization_servers",
            "allowed_hosts",
            "allowed_origins",
            "allowed_ports",
            "max_body_bytes",
            "request_timeout_secs",
            "max_connections",
            "header_read_timeout_secs",
            "idle_timeout_secs",
            "max_sessions",
            "max_sessions_per_agent",
            "session_idle_timeout_secs",
            "max_listen_streams_per_agent",
            "max_listen_lifetime_secs",
            "lease_seconds",
            "lease_interval_controls",
            "metrics_listen",
            "operator_token_sha256",
        ],
    ),
    (
        "OAuth: the [oauth] section and its keys",
        &[
            "[oauth]",
            "OAuth",
            "issuer",
            "jwks_uri",
            "audience",
            "algorithms",
            "clock_skew_seconds",
            "token_types",
            "agent_claim",
            "owner_claim",
            "projects_claim",
            "jwks_cache_seconds",
            "jwks_refetch_min_seconds",
            "http_timeout_seconds",
            "[[oauth.subject]]",
            "[oauth.introspection]",
            "active_cache_seconds",
            "inactive_cache_seconds",
            "oauth-protected-resource/mcp",
        ],
    ),
    (
        "static tokens",
        &["[[agent]]", "[[device]]", "graph-relay token"],
    ),
    (
        "the MCP tools and extensions",
        &[
            "/mcp",
            "run_graph_session",
            "list_graph_sessions",
            "get_graph_run",
            "cancel_graph_run",
            "tasks",
            "subscriptions/listen",
        ],
    ),
    (
        "long-poll",
        &["long-poll", "--max-wait-seconds", "wait_seconds"],
    ),
    ("connection threads", &["threads", "--connection-threads"]),
    ("leases", &["leases", "--lease-seconds", "--lease-controls"]),
    ("progress", &["progress"]),
    ("approval", &["approval", "--console"]),
    ("metrics", &["metrics", "--metrics", "/metrics"]),
    (
        "status",
        &["/admin/status", "graph-relay status", "token operator"],
    ),
    ("stores", &["--db", "--memory", "--postgres"]),
    ("log", &["GRAPH_RELAY_LOG"]),
    (
        "where it is documented",
        &[
            "docs/operating.md",
            "docs/connecting-clients.md",
            "docs/desktop-console.md",
            "README.md",
        ],
    ),
];

const WORKER: &[(&str, &[&str])] = &[
    ("server and device token", &["--server", "--token-file"]),
    (
        "graphs.toml and every key",
        &[
            "--graphs",
            "graphs.toml",
            "projects = [...]",
            "[[graph]]",
            "id (gs_",
            "description",
            "slug",
            "command (argv, no shell)",
            "working_dir",
            "timeout_seconds",
            "re-checked",
        ],
    ),
    (
        "approval",
        &[
            "approval",
            "approval = \"always\"",
            "approval_timeout_seconds",
            "approval_command",
            "graph-relay approve",
            "graph-relay deny",
        ],
    ),
    ("console", &["--console", "console"]),
    (
        "progress",
        &[
            "progress",
            "file descriptor 3",
            "GRAPH_RELAY_PROGRESS_FD",
            "--progress-every",
        ],
    ),
    (
        "long-poll, interval and leases",
        &["--mode", "long-poll", "interval", "lease"],
    ),
    ("outbox", &["--outbox", "outbox"]),
    ("metrics", &["--metrics", "/metrics"]),
    (
        "the script contract",
        &[
            "stdin",
            "stdout",
            "graph_relay",
            "GRAPH_RELAY_COMMAND_ID",
            "GRAPH_RELAY_EXECUTION_ID",
            "GRAPH_RELAY_CHANNEL",
            "--grace-seconds",
        ],
    ),
    ("output", &["--quiet", "--verbose", "GRAPH_RELAY_LOG"]),
    (
        "where it is documented",
        &[
            "docs/writing-a-graph.md",
            "docs/desktop-console.md",
            "docs/operating.md",
            "README.md",
        ],
    ),
];

#[test]
fn serve_help_names_every_feature() {
    let text = help("serve");
    let missing = missing(&text, SERVE);
    assert!(
        missing.is_empty(),
        "serve --help does not name: {missing:?}\n{text}"
    );
}

#[test]
fn worker_help_names_every_feature() {
    let text = help("worker");
    let missing = missing(&text, WORKER);
    assert!(
        missing.is_empty(),
        "worker --help does not name: {missing:?}\n{text}"
    );
}

/// Every `docs/….md` page a help text sends the reader to exists.
#[test]
fn the_pages_the_help_names_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for command in ["serve", "worker"] {
        let text = help(command);
        let pages: Vec<&str> = text
            .split(|c: char| c.is_whitespace() || matches!(c, ',' | '(' | ')'))
            .filter(|word| word.starts_with("docs/") && word.ends_with(".md"))
            .collect();
        assert!(!pages.is_empty(), "{command} --help names no docs page");
        for page in pages {
            assert!(
                root.join(page).is_file(),
                "{command} --help names {page}, which does not exist"
            );
        }
    }
}
