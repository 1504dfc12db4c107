//! An initialize-era MCP session works on every server of a cluster: three
//! `serve --postgres` processes on one schema behind a real HAProxy
//! (round robin). The client initializes through the load balancer, keeps
//! its `MCP-Session-Id` across calls that land on every server, and goes
//! on after the server that created the session is SIGKILLed. `DELETE
//! /mcp` on one server ends the session on all of them.
//!
//! Needs a Postgres server (`graph_relay_store_postgres::testing::url`;
//! `GRAPH_RELAY_SKIP=postgres` lists it as ignored) and HAProxy at
//! `/usr/sbin/haproxy` (`apt-get install -y haproxy`): without it the test
//! fails and says so.

mod common;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Proc, Relay};
use graph_relay_store_postgres::testing::{TestSchema, url};
use reqwest::StatusCode;
use serde_json::{Value, json};

const HAPROXY: &str = "/usr/sbin/haproxy";
const TOKEN: &str = "cluster-agent-token";
const DEADLINE: Duration = Duration::from_secs(60);
const VERSION: &str = "2025-11-25";

/// The HAProxy child, killed when dropped.
struct Haproxy(Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Starts HAProxy in the foreground (`-db`) on `port`, round robin over
/// `servers`, each health-checked every 500 ms (a dead one is taken out
/// after one failed check); a request refused by a dead server is retried
/// on another (`retries`, `option redispatch`). Every response names the
/// server that answered in `X-Served-By`.
fn haproxy(dir: &Path, port: u16, servers: &[String]) -> Haproxy {
    assert!(
        Path::new(HAPROXY).exists(),
        "this test needs HAProxy at {HAPROXY}: install it with `apt-get install -y haproxy`"
    );
    let mut config = format!(
        "global\n    maxconn 256\n\
         defaults\n    mode http\n    timeout connect 1s\n    timeout client 30s\n    timeout server 30s\n    retries 3\n    option redispatch 1\n\
         frontend mcp\n    bind 127.0.0.1:{port}\n    default_backend graph_relay\n\
         backend graph_relay\n    balance roundrobin\n    http-response set-header X-Served-By %[srv_name]\n"
    );
    for (i, server) in servers.iter().enumerate() {
        let address = server.trim_start_matches("http://");
        config.push_str(&format!(
            "    server s{i} {address} check inter 500ms fall 1 rise 1\n"
        ));
    }
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, config).expect("haproxy.cfg");
    let child = Command::new(HAPROXY)
        .arg("-f")
        .arg(&path)
        .arg("-db")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start haproxy");
    let haproxy = Haproxy(child);
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < DEADLINE,
            "HAProxy never listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    haproxy
}

/// An initialize-era MCP client over plain HTTP.
struct Client {
    http: reqwest::Client,
    next_id: u64,
}

/// One answer: status, the server HAProxy chose, the session id header and the body.
struct Answer {
    status: StatusCode,
    served_by: Option<String>,
    session: Option<String>,
    body: Value,
}

impl Client {
    async fn post(&mut self, base: &str, session: Option<&str>, message: Value) -> Answer {
        self.next_id += 1;
        let mut request = self
            .http
            .post(format!("{base}/mcp"))
            .bearer_auth(TOKEN)
            .header("accept", "application/json, text/event-stream")
            .json(&message);
        if let Some(id) = session {
            request = request
                .header("mcp-session-id", id)
                .header("mcp-protocol-version", VERSION);
        }
        let response = request.send().await.expect("an HTTP answer");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (status, served_by, session) = (
            response.status(),
            header("x-served-by"),
            header("mcp-session-id"),
        );
        let text = response.text().await.expect("a body");
        Answer {
            status,
            served_by,
            session,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    /// `initialize` then `notifications/initialized`; returns the session id
    /// and the server that created it.
    async fn initialize(&mut self, base: &str) -> (String, String) {
        let id = self.next_id;
        let init = self
            .post(
                base,
                None,
                json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
                    "protocolVersion": VERSION, "capabilities": {},
                    "clientInfo": {"name": "cluster-test", "version": "1"}}}),
            )
            .await;
        assert_eq!(init.status, StatusCode::OK, "initialize: {}", init.body);
        assert_eq!(init.body["result"]["protocolVersion"], VERSION);
        let session = init.session.expect("an MCP-Session-Id");
        let creator = init.served_by.expect("X-Served-By");
        let done = self
            .post(
                base,
                Some(&session),
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            )
            .await;
        assert_eq!(done.status, StatusCode::ACCEPTED, "{}", done.body);
        (session, creator)
    }

    async fn tools_list(&mut self, base: &str, session: &str) -> Answer {
        let id = self.next_id;
        self.post(
            base,
            Some(session),
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}),
        )
        .await
    }
}

/// Six calls through round robin all answer 200 with the four tools, on
/// every server; after the creator is killed the calls still work; a
/// DELETE on one server ends the session everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(graph_relay_skip_postgres, ignore = "GRAPH_RELAY_SKIP names postgres")]
async fn an_initialize_era_session_works_on_every_server() {
    let database = url();
    let schema = TestSchema::new(&database);
    let relay = Relay::new(&[("assistant", TOKEN)], "cluster-device-token", DEADLINE);
    let port = free_port();
    // Requests through the load balancer carry its port in `Host`.
    let config = std::fs::read_to_string(relay.path("graph-relay.toml")).expect("config");
    std::fs::write(
        relay.path("graph-relay.toml"),
        format!("[server]\nallowed_ports = [{port}]\n\n{config}"),
    )
    .expect("config");
    let store = [
        "--postgres",
        database.as_str(),
        "--postgres-schema",
        schema.name(),
    ];
    let mut servers: Vec<(Proc, String)> = Vec::new();
    for _ in 0..3 {
        let mut args = store.to_vec();
        args.extend(["--postgres-pool", "4"]);
        servers.push(relay.serve("127.0.0.1:0", &args));
    }
    let urls: Vec<String> = servers.iter().map(|(_, url)| url.clone()).collect();
    let _haproxy = haproxy(relay.dir.path(), port, &urls);
    let lb = format!("http://127.0.0.1:{port}");
    let mut client = Client {
        http: reqwest::Client::new(),
        next_id: 1,
    };

    let (session, creator) = client.initialize(&lb).await;
    let mut statuses = Vec::new();
    let mut served_by = BTreeSet::new();
    for _ in 0..6 {
        let answer = client.tools_list(&lb, &session).await;
        statuses.push(answer.status.as_u16());
        served_by.extend(answer.served_by);
        let tools = answer.body["result"]["tools"].as_array().map(Vec::len);
        assert_eq!(tools, Some(4), "{}", answer.body);
    }
    assert_eq!(statuses, [200; 6], "every call through round robin");
    assert_eq!(
        served_by.len(),
        3,
        "the calls reached every server: {served_by:?}"
    );
    // Each server, asked directly, serves the session.
    for url in &urls {
        let answer = client.tools_list(url, &session).await;
        assert_eq!(answer.status, StatusCode::OK, "{url}: {}", answer.body);
    }

    // Kill the server that created the session.
    let index: usize = creator
        .trim_start_matches('s')
        .parse()
        .expect("a server name s<i>");
    let (killed, _) = servers.remove(index);
    killed.sigkill();
    let mut after = Vec::new();
    for _ in 0..6 {
        let answer = client.tools_list(&lb, &session).await;
        after.push(answer.status.as_u16());
        assert_ne!(answer.served_by.as_deref(), Some(creator.as_str()));
    }
    assert_eq!(after, [200; 6], "the session outlives its creator");

    // DELETE on one server ends it on the others.
    let deleted = client
        .http
        .delete(format!("{}/mcp", servers[0].1))
        .bearer_auth(TOKEN)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", VERSION)
        .send()
        .await
        .expect("an HTTP answer");
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    let gone = client.tools_list(&servers[1].1, &session).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.body);
    let gone = client.tools_list(&lb, &session).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.body);
}
