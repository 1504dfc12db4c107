//! OAuth 2.1 against a real authorization server: `oidc-provider` (a
//! certified OpenID Provider, installed with the peers by
//! `.ci/mcp-peers.sh`) started on loopback by `tests/oidc/provider.mjs`
//! with resource indicators, so that its access tokens are JWTs for
//! graph-relay's `/mcp` URL; `graph-relay serve` validates them with the
//! `[oauth]` section of its configuration.
//!
//! - the official Python `mcp` 2.3.0 client, starting from the server's URL
//!   alone, with client credentials and with the authorization-code flow
//!   (PKCE, dynamic client registration, login and consent played over
//!   HTTP), in both protocol eras;
//! - every refusal with its status and `WWW-Authenticate` challenge;
//! - key rotation while the server runs;
//! - an authorization server that is down at start (503, then served);
//! - opaque tokens through introspection.
//!
//! A machine without Python or Node opts out with `GRAPH_RELAY_SKIP=peers`,
//! which lists these tests as ignored.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::Proc;
use graph_relay_transport_http::auth::hash_token;
use serde_json::{Value, json};

const GS: &str = "gs_0123456789abcdef0123456789abcdef";
/// A static token of `dev/cc-agent`: the same identity as the OAuth client `cc-agent`.
const STATIC_CC_AGENT: &str = "gra_static_token_of_cc_agent";
const DEADLINE: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A loopback port where a connection is accepted and closed at once (an
/// authorization server that is down); freed on drop.
struct RefusingPort {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RefusingPort {
    fn bind() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(std::sync::atomic::Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => drop(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for RefusingPort {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// oidc-provider on loopback (`tests/oidc/provider.mjs`).
struct AuthServer {
    child: Child,
    issuer: String,
}

impl AuthServer {
    fn start(port: u16, format: &str) -> Self {
        let peers = common::peers();
        let mut child = Command::new(&peers.node)
            .arg(repo().join("tests/oidc/provider.mjs"))
            .env("OIDC_MODULES", &peers.oidc_provider)
            .env("PORT", port.to_string())
            .env("TOKEN_FORMAT", format)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the authorization server");
        let stderr = child.stderr.take().expect("stderr");
        let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = said.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut said) = sink.lock() {
                    said.push_str(&line);
                    said.push('\n');
                }
            }
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("listening ") {
                    let _ = tx.send(url.to_owned());
                }
            }
        });
        let issuer = rx.recv_timeout(DEADLINE).unwrap_or_else(|e| {
            panic!(
                "the authorization server did not start ({e}):\n{}",
                said.lock().map(|s| s.clone()).unwrap_or_default()
            )
        });
        Self { child, issuer }
    }

    /// A token from the token endpoint (client credentials) for `resource`.
    async fn token(&self, client: &str, resource: &str) -> String {
        let reply: Value = reqwest::Client::new()
            .post(format!("{}/token", self.issuer))
            .basic_auth(client, Some("cc-secret"))
            .form(&[
                ("grant_type", "client_credentials"),
                ("resource", resource),
                ("scope", "osfoundry:read osfoundry:run"),
            ])
            .send()
            .await
            .expect("token endpoint")
            .json()
            .await
            .expect("token JSON");
        reply["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no access_token: {reply}"))
            .to_owned()
    }

    async fn test_endpoint(&self, path: &str, body: Value) -> Value {
        reqwest::Client::new()
            .post(format!("{}/test/{path}", self.issuer))
            .json(&body)
            .send()
            .await
            .expect("test endpoint")
            .json()
            .await
            .expect("JSON")
    }

    /// `claims` signed with the provider's current (or previous) key.
    async fn sign(&self, claims: Value, previous: bool) -> String {
        self.test_endpoint("sign", json!({"claims": claims, "previous": previous}))
            .await["token"]
            .as_str()
            .expect("token")
            .to_owned()
    }

    async fn rotate(&self) {
        self.test_endpoint("rotate", json!({})).await;
    }
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A folder with `graph-relay.toml` (a device, a static token for
/// `dev/cc-agent`, and `[oauth]` for `issuer`) and a database where the
/// device shares GS to project `default`.
fn setup(issuer: &str, extra_oauth: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "[[agent]]\nname = \"cc-agent\"\nowner = \"dev\"\nprojects = [\"default\"]\nscopes = [\"osfoundry:read\", \"osfoundry:run\"]\ntoken_sha256 = \"{}\"\n\n\
         [[device]]\nname = \"dev-desktop\"\nowner = \"dev\"\ntoken_sha256 = \"{}\"\n\n\
         [oauth]\nissuer = \"{issuer}\"\nowner = \"dev\"\nprojects = [\"default\"]\njwks_refetch_min_seconds = 0\n{extra_oauth}",
        hash_token(STATIC_CC_AGENT),
        hash_token("grd_device")
    );
    std::fs::write(dir.path().join("graph-relay.toml"), config).expect("config");
    let status = Command::new(common::BIN)
        .args(["dev-share", "--config", "graph-relay.toml", "--db", "g.db"])
        .args([
            "--device",
            "dev-desktop",
            "--project",
            "default",
            "--session",
            GS,
        ])
        .current_dir(dir.path())
        .stderr(Stdio::null())
        .status()
        .expect("dev-share");
    assert!(status.success());
    dir
}

/// `graph-relay serve` in `dir` on a free port; returns it and its `/mcp` URL.
fn serve(dir: &Path) -> (Proc, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let server = Proc::spawn(
        &[
            "serve",
            "--listen",
            &listen,
            "--config",
            "graph-relay.toml",
            "--db",
            "g.db",
        ],
        dir,
        DEADLINE,
    );
    server.wait_line("serving MCP at http://");
    (server, format!("http://{listen}/mcp"))
}

/// What a stateless (2026-07-28) `tools/call` with `token` got: status,
/// `WWW-Authenticate` and the body.
async fn call(url: &str, token: &str, tool: &str, arguments: Value) -> (u16, String, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": tool, "arguments": arguments,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
    let response = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .json(&body)
        .send()
        .await
        .expect("HTTP answer");
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, challenge, body)
}

/// `list_graph_sessions` with `token` must succeed.
async fn assert_accepted(url: &str, token: &str) {
    let (status, challenge, body) = call(
        url,
        token,
        "list_graph_sessions",
        json!({"project_id": "default"}),
    )
    .await;
    assert_eq!(status, 200, "{challenge} {body}");
    assert_eq!(body["result"]["isError"], false, "{body}");
}

/// `list_graph_sessions` with `token` must get 401 `invalid_token` saying `why`.
async fn assert_refused(url: &str, token: &str, why: &str) {
    let (status, challenge, body) = call(
        url,
        token,
        "list_graph_sessions",
        json!({"project_id": "default"}),
    )
    .await;
    let metadata = url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp");
    assert_eq!(status, 401, "{why}: {body}");
    assert_eq!(
        challenge,
        format!(
            "Bearer resource_metadata=\"{metadata}\", error=\"invalid_token\", error_description=\"{why}\""
        )
    );
    assert_eq!(body["error"], "invalid_token");
}

fn python(args: &[&str]) -> String {
    let out = Command::new(common::peers().python)
        .arg(repo().join("tests/python/oauth_flow.py"))
        .args(args)
        .output()
        .expect("python");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
async fn python_client_credentials_from_the_url_alone_in_both_eras() {
    let auth = AuthServer::start(0, "jwt");
    let dir = setup(&auth.issuer, "");
    let (_server, url) = serve(dir.path());
    // The resource metadata sends clients to the authorization server.
    let metadata: Value =
        reqwest::get(url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp"))
            .await
            .expect("metadata")
            .json()
            .await
            .expect("JSON");
    assert_eq!(
        metadata,
        json!({"resource": url, "authorization_servers": [auth.issuer], "resource_name": "graph-relay",
               "scopes_supported": ["osfoundry:read", "osfoundry:run"], "bearer_methods_supported": ["header"]})
    );
    for mode in ["legacy", "2026-07-28"] {
        let out = python(&[
            "client-credentials",
            mode,
            &url,
            &auth.issuer,
            "cc-agent",
            "cc-secret",
        ]);
        let command = out
            .split_whitespace()
            .last()
            .expect("the command id")
            .to_owned();
        // The OAuth client and the static token of dev/cc-agent are one
        // identity: the run is readable with either.
        let (status, _, body) = call(
            &url,
            STATIC_CC_AGENT,
            "get_graph_run",
            json!({"command_id": command}),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(
            body["result"]["structuredContent"]["status"], "cancelled",
            "{body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
async fn python_authorization_code_with_pkce_and_registration_in_both_eras() {
    let auth = AuthServer::start(0, "jwt");
    let dir = setup(&auth.issuer, "");
    let (_server, url) = serve(dir.path());
    for mode in ["legacy", "2026-07-28"] {
        let out = python(&[
            "authorization-code",
            mode,
            &url,
            &auth.issuer,
            "alice-connector",
        ]);
        assert!(out.contains("OK authorization-code"), "{out}");
        // The run is filed under the user who signed in (sub), not under
        // the client: another identity does not see it.
        let command = out.split_whitespace().last().expect("command id");
        let (_, _, body) = call(
            &url,
            STATIC_CC_AGENT,
            "get_graph_run",
            json!({"command_id": command}),
        )
        .await;
        assert_eq!(
            body["result"]["content"][0]["text"],
            "Graph run not found or access removed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
async fn refusals_carry_their_status_and_challenge() {
    let auth = AuthServer::start(0, "jwt");
    let dir = setup(&auth.issuer, "");
    let (_server, url) = serve(dir.path());
    let good = auth.token("cc-agent", &url).await;
    assert_accepted(&url, &good).await;
    let claims = |edit: &dyn Fn(&mut Value)| {
        let mut c = json!({"iss": auth.issuer, "aud": url, "sub": "cc-agent", "client_id": "cc-agent",
                           "scope": "osfoundry:read osfoundry:run", "iat": now(), "exp": now() + 600});
        edit(&mut c);
        c
    };
    // Minted by the test endpoint with the provider's own key: accepted as such.
    assert_accepted(&url, &auth.sign(claims(&|_| {}), false).await).await;

    let other_audience = auth
        .token("cc-agent", "http://127.0.0.1:1/another-resource")
        .await;
    assert_refused(
        &url,
        &other_audience,
        &format!("the token is not meant for this resource (aud must include {url})"),
    )
    .await;
    let wrong_issuer = auth
        .sign(claims(&|c| c["iss"] = json!("http://127.0.0.1:2")), false)
        .await;
    assert_refused(
        &url,
        &wrong_issuer,
        "the token was issued by another authorization server (iss)",
    )
    .await;
    let expired = auth
        .sign(
            claims(&|c| {
                c["iat"] = json!(now() - 7200);
                c["exp"] = json!(now() - 3600);
            }),
            false,
        )
        .await;
    assert_refused(&url, &expired, "the token has expired").await;
    let early = auth
        .sign(claims(&|c| c["nbf"] = json!(now() + 3600)), false)
        .await;
    assert_refused(&url, &early, "the token is not valid yet (nbf)").await;
    let payload = URL_SAFE_NO_PAD.encode(claims(&|_| {}).to_string());
    let none = format!(
        "{}.{payload}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"at+jwt"}"#)
    );
    assert_refused(
        &url,
        &none,
        "the token is not a well-formed JWT signed with an algorithm this server accepts",
    )
    .await;
    let hs256 = auth
        .test_endpoint("sign-hs256", json!({"claims": claims(&|_| {})}))
        .await["token"]
        .as_str()
        .expect("token")
        .to_owned();
    assert_refused(
        &url,
        &hs256,
        "the token is signed with HS256, which this server does not accept",
    )
    .await;
    // A real token whose payload was swapped for one naming another agent.
    let parts: Vec<&str> = good.split('.').collect();
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(claims(&|c| c["sub"] = json!("root")).to_string()),
        parts[2]
    );
    assert_refused(&url, &forged, "the token's signature does not verify").await;

    // Key rotation: a token of the old key is refused once the new key set
    // (which no longer has it) is loaded.
    let old_key = auth.sign(claims(&|_| {}), false).await;
    assert_accepted(&url, &old_key).await;
    auth.rotate().await;
    assert_accepted(&url, &auth.token("cc-agent", &url).await).await;
    assert_refused(
        &url,
        &old_key,
        "the token is signed with a key the authorization server does not publish",
    )
    .await;
    assert_refused(
        &url,
        &auth.sign(claims(&|_| {}), true).await,
        "the token is signed with a key the authorization server does not publish",
    )
    .await;

    // A token without the run scope: reading works, running is 403.
    let reader = auth.token("cc-reader", &url).await;
    assert_accepted(&url, &reader).await;
    let (status, challenge, body) = call(
        &url,
        &reader,
        "run_graph_session",
        json!({"graph_session_id": GS, "idempotency_key": "reader-tries-to-run"}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        challenge.starts_with("Bearer error=\"insufficient_scope\", scope=\"osfoundry:run\""),
        "{challenge}"
    );
    assert_eq!(body["scope"], "osfoundry:run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
async fn key_rotation_while_serving_needs_no_restart() {
    let auth = AuthServer::start(0, "jwt");
    let dir = setup(&auth.issuer, "");
    let (server, url) = serve(dir.path());
    assert_accepted(&url, &auth.token("cc-agent", &url).await).await;
    for _ in 0..3 {
        auth.rotate().await;
        assert_accepted(&url, &auth.token("cc-agent", &url).await).await;
    }
    assert_eq!(
        server.count("graph-relay serving MCP"),
        1,
        "never restarted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
async fn an_unreachable_authorization_server_means_503_until_its_keys_load() {
    // The port stays taken (every connection refused at once) until the
    // authorization server starts on it, so no other test can take it.
    let closed = RefusingPort::bind();
    let port = closed.port;
    let issuer = format!("http://127.0.0.1:{port}");
    let dir = setup(&issuer, "");
    let (server, url) = serve(dir.path());
    server.wait_line("cannot load the authorization server's signing keys");
    let claims =
        json!({"iss": issuer, "aud": url, "sub": "cc-agent", "iat": now(), "exp": now() + 600});
    let unverifiable = format!(
        "{}.{}.c2ln",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"at+jwt","kid":"k"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let (status, _, body) = call(
        &url,
        &unverifiable,
        "list_graph_sessions",
        json!({"project_id": "default"}),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    // Static tokens do not depend on the authorization server.
    assert_accepted(&url, STATIC_CC_AGENT).await;
    drop(closed);
    let auth = AuthServer::start(port, "jwt");
    let token = auth.token("cc-agent", &url).await;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (status, _, _) = call(
            &url,
            &token,
            "list_graph_sessions",
            json!({"project_id": "default"}),
        )
        .await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503);
        assert!(Instant::now() < deadline, "the keys never loaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.wait_line("OAuth tokens are accepted again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(graph_relay_skip_peers, ignore = "GRAPH_RELAY_SKIP names peers")]
async fn opaque_tokens_are_introspected() {
    let auth = AuthServer::start(0, "opaque");
    let dir = setup(
        &auth.issuer,
        "\n[oauth.introspection]\nclient_id = \"graph-relay\"\nclient_secret = \"rs-secret\"\n",
    );
    let (_server, url) = serve(dir.path());
    let opaque = auth.token("cc-agent", &url).await;
    assert_eq!(opaque.matches('.').count(), 0, "an opaque token: {opaque}");
    assert_accepted(&url, &opaque).await;
    let reader = auth.token("cc-reader", &url).await;
    let (status, _, _) = call(
        &url,
        &reader,
        "run_graph_session",
        json!({"graph_session_id": GS, "idempotency_key": "reader-tries-to-run"}),
    )
    .await;
    assert_eq!(status, 403);
    assert_refused(
        &url,
        "not-a-token-the-server-issued",
        "the authorization server says the token is not active",
    )
    .await;
}
