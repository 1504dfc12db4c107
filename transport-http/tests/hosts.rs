//! Strict `Host` and `Origin` (issue 13, item 3): parsed as RFC 3986
//! authorities, checked against the allowed hosts and the listening port,
//! and never used to build a URL.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use graph_relay_transport_http::HttpConfig;
use serde_json::json;

fn prm(host: &str) -> Request<Body> {
    Request::get("/.well-known/oauth-protected-resource/mcp")
        .header("host", host)
        .body(Body::empty())
        .unwrap()
}

fn mcp(host: &str, origin: Option<&str>, token: Option<&str>) -> Request<Body> {
    let mut request = Request::post("/mcp")
        .header("host", host)
        .header("content-type", "application/json");
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request
        .body(Body::from(initialize_body(
            &json!({"name": "t", "version": "1"}),
        )))
        .unwrap()
}

/// Each bad `Host` of the issue, and its relatives, is refused (403) on
/// every route, before authentication.
#[tokio::test]
async fn bad_hosts_are_refused() {
    let state = static_state(HttpConfig::default()).await;
    for host in [
        // userinfo: old code took `localhost` and ignored the rest
        "localhost:1@evil.example",
        "localhost@evil.example",
        "user:pw@127.0.0.1:8787",
        // a look-alike suffix after an IP-literal or a name
        "[::1].evil.example",
        "[::1]evil.example:8787",
        "localhost.evil.com",
        "localhost.evil.com:8787",
        "127.0.0.1.evil.example:8787",
        // unknown hosts
        "evil.example.com",
        "evil.example.com:8787",
        // the port is checked against the listening port (8787)
        "localhost:1",
        "127.0.0.1:80",
        "[::1]:8788",
        "localhost",
        // garbage
        "",
        "local host:8787",
        "localhost:8787:1",
        "localhost:99999",
        "localhost:87a7",
        "[::1",
        "[v7.zz]:8787",
        "127.0.0.1:8787/mcp",
        "localhost\t:8787",
    ] {
        for request in [
            prm(host),
            mcp(host, None, Some(FULL)),
            mcp(host, None, None),
        ] {
            let reply = send(&state, request).await;
            assert_eq!(
                reply.status,
                StatusCode::FORBIDDEN,
                "Host {host:?}: {}",
                reply.body
            );
            assert_eq!(reply.body["error"], "forbidden_host", "Host {host:?}");
        }
    }
    // No Host at all.
    let reply = send(
        &state,
        Request::get("/.well-known/oauth-protected-resource/mcp")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn good_hosts_are_served() {
    let state = static_state(HttpConfig::default()).await;
    for host in [
        "127.0.0.1:8787",
        "localhost:8787",
        "LocalHost:8787",
        "[::1]:8787",
        "[0:0:0:0:0:0:0:1]:8787",
        "localhost:08787",
    ] {
        assert_eq!(
            send(&state, prm(host)).await.status,
            StatusCode::OK,
            "{host}"
        );
        assert_eq!(
            send(&state, mcp(host, None, Some(FULL))).await.status,
            StatusCode::OK,
            "{host}"
        );
    }
}

/// Behind a proxy: the public URL's host and port, and configured ports.
#[tokio::test]
async fn configured_hosts_and_ports() {
    let state = static_state(HttpConfig {
        public_url: Some("https://relay.example.com".into()),
        allowed_hosts: vec!["relay.example.com".into(), "pinned.example.com:9000".into()],
        allowed_ports: vec![8443],
        ..HttpConfig::default()
    })
    .await;
    for (host, status) in [
        ("relay.example.com", StatusCode::OK),
        ("relay.example.com:443", StatusCode::OK),
        ("relay.example.com:8443", StatusCode::OK),
        ("relay.example.com:8787", StatusCode::OK),
        ("RELAY.example.com:8787", StatusCode::OK),
        ("pinned.example.com:9000", StatusCode::OK),
        ("relay.example.com:9999", StatusCode::FORBIDDEN),
        ("pinned.example.com:8787", StatusCode::FORBIDDEN),
        ("relay.example.com.evil.example", StatusCode::FORBIDDEN),
        ("localhost:8787", StatusCode::FORBIDDEN),
        ("relay.example.com:1@evil.example", StatusCode::FORBIDDEN),
    ] {
        assert_eq!(send(&state, prm(host)).await.status, status, "{host}");
    }
    // `*` accepts any well-formed host on any port, but still parses it.
    let any = static_state(HttpConfig {
        allowed_hosts: vec!["*".into()],
        ..HttpConfig::default()
    })
    .await;
    for (host, status) in [
        ("anything.example:1", StatusCode::OK),
        ("10.0.0.7", StatusCode::OK),
        ("localhost:1@evil.example", StatusCode::FORBIDDEN),
        ("[::1].evil.example", StatusCode::FORBIDDEN),
        ("a b", StatusCode::FORBIDDEN),
    ] {
        assert_eq!(send(&any, prm(host)).await.status, status, "{host}");
    }
}

#[tokio::test]
async fn origins_are_parsed_the_same_way() {
    let state = static_state(HttpConfig {
        allowed_origins: vec!["https://app.example.com".into()],
        ..HttpConfig::default()
    })
    .await;
    for (origin, status) in [
        ("http://localhost:3000", StatusCode::OK),
        ("https://[::1]", StatusCode::OK),
        ("http://127.0.0.1:8787", StatusCode::OK),
        ("https://app.example.com", StatusCode::OK),
        ("https://APP.example.com:443", StatusCode::OK),
        ("http://app.example.com", StatusCode::FORBIDDEN),
        ("https://app.example.com:8443", StatusCode::FORBIDDEN),
        ("http://localhost:1@evil.example", StatusCode::FORBIDDEN),
        ("http://[::1].evil.example", StatusCode::FORBIDDEN),
        ("http://localhost.evil.com", StatusCode::FORBIDDEN),
        ("http://evil.example.com", StatusCode::FORBIDDEN),
        ("http://localhost:3000/path", StatusCode::FORBIDDEN),
        ("null", StatusCode::FORBIDDEN),
        ("file://localhost", StatusCode::FORBIDDEN),
    ] {
        let reply = send(&state, mcp("127.0.0.1:8787", Some(origin), Some(FULL))).await;
        assert_eq!(reply.status, status, "Origin {origin}: {}", reply.body);
        if status == StatusCode::FORBIDDEN {
            assert_eq!(reply.body["error"], "forbidden_origin");
        }
    }
}

/// Issue 13, item 3: the metadata and the 401 challenge pointed at the
/// request's Host. They use `public_url`, or the listening address.
#[tokio::test]
async fn urls_are_never_built_from_the_host_header() {
    // Any host accepted, so that a hostile one reaches the handlers.
    let state = static_state(HttpConfig {
        allowed_hosts: vec!["*".into()],
        ..HttpConfig::default()
    })
    .await;
    for host in ["evil.example:8787", "localhost:8787", "127.0.0.2"] {
        let reply = send(&state, prm(host)).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.body["resource"], "http://127.0.0.1:8787/mcp",
            "{host}"
        );
        assert_eq!(
            reply.body["authorization_servers"],
            json!(["http://127.0.0.1:8787"]),
            "{host}"
        );
        let challenge = send(&state, mcp(host, None, None)).await;
        assert_eq!(challenge.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            challenge.headers["www-authenticate"],
            "Bearer resource_metadata=\"http://127.0.0.1:8787/.well-known/oauth-protected-resource/mcp\"",
            "{host}"
        );
    }
    let public = static_state(HttpConfig {
        public_url: Some("https://relay.example.com/".into()),
        allowed_hosts: vec!["*".into()],
        ..HttpConfig::default()
    })
    .await;
    let reply = send(&public, prm("evil.example")).await;
    assert_eq!(reply.body["resource"], "https://relay.example.com/mcp");
    let challenge = send(&public, mcp("evil.example", None, Some("wrong"))).await;
    assert!(
        challenge.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer resource_metadata=\"https://relay.example.com/.well-known/"),
    );
    // Listening on every interface: a name that reaches it locally.
    let wildcard = static_state(HttpConfig {
        listen_addr: Some("0.0.0.0:9000".parse().unwrap()),
        allowed_hosts: vec!["*".into()],
        ..HttpConfig::default()
    })
    .await;
    let reply = send(&wildcard, prm("evil.example:9000")).await;
    assert_eq!(reply.body["resource"], "http://localhost:9000/mcp");
}

/// The relay API passes the same check.
#[tokio::test]
async fn the_relay_api_checks_hosts_too() {
    let state = static_state(HttpConfig::default()).await;
    for host in [
        "localhost:1@evil.example",
        "[::1].evil.example",
        "localhost:1",
    ] {
        let reply = send(
            &state,
            Request::post("/external-assistants/graph-relays/sync")
                .header("host", host)
                .header("authorization", format!("Bearer {DEVICE}"))
                .header("content-type", "application/json")
                .body(Body::from(r#"{"project_id":"p1","sessions":[]}"#))
                .unwrap(),
        )
        .await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{host}");
    }
}
