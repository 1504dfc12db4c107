//! Connections over real sockets with `serve` (issue 13, item 5): the
//! token is checked before any body byte is read, heads must arrive in
//! time, idle connections close, and over the cap a connection is told 503.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use graph_relay_transport_http::{HttpConfig, ServeConfig};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn server(serve_config: ServeConfig) -> (graph_relay_transport_http::HttpState, SocketAddr) {
    serve_on_socket(
        |addr| async move {
            static_state(HttpConfig {
                listen_addr: Some(addr),
                // The `Host` of the in-process (`oneshot`) helpers.
                allowed_ports: vec![8787],
                ..HttpConfig::default()
            })
            .await
        },
        serve_config,
    )
    .await
}

/// Reads until the server closes the connection (or `within` passes);
/// returns what was read and whether it closed.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&text).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&text).into_owned(), true),
            Ok(Ok(n)) => text.extend_from_slice(&buf[..n]),
        }
    }
}

/// Issue 13, item 5: 200 connections without a token, each announcing
/// 1 MiB − 1 bytes, sending 64 KiB of it and stalling, held 200 MB until
/// the request timeout. Now each is answered 401 at once and closed; the
/// rest of the body is never read, so the client cannot send it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_bodies_are_never_read() {
    const CONNECTIONS: usize = 200;
    const ANNOUNCED: usize = 1024 * 1024 - 1;
    let (_state, addr) = server(ServeConfig::default()).await;
    let started = Instant::now();
    let mut clients = Vec::new();
    for i in 0..CONNECTIONS {
        clients.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            let auth = if i % 2 == 0 {
                String::new()
            } else {
                "Authorization: Bearer not-a-token\r\n".to_owned()
            };
            let head = format!(
                "POST /mcp HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {ANNOUNCED}\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await.expect("head");
            let chunk = vec![b' '; 64 * 1024];
            stream.write_all(&chunk).await.expect("first 64 KiB");
            // Stall: the answer must come without the rest of the body.
            let (text, closed) = read_until_closed(&mut stream, Duration::from_secs(10)).await;
            assert!(text.starts_with("HTTP/1.1 401"), "{text}");
            assert!(text.to_ascii_lowercase().contains("connection: close"), "{text}");
            assert!(text.to_ascii_lowercase().contains("www-authenticate: bearer"), "{text}");
            assert!(closed, "the server kept the connection open");
            // The server does not read the remaining ~960 KiB: once its
            // close reaches the client, writing the rest fails.
            let mut sent = 64 * 1024;
            let refused = tokio::time::timeout(Duration::from_secs(10), async {
                while sent < ANNOUNCED {
                    match stream.write(&chunk[..chunk.len().min(ANNOUNCED - sent)]).await {
                        Ok(n) => sent += n,
                        Err(_) => return true,
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                false
            })
            .await
            .unwrap_or(false);
            assert!(refused, "the whole body could be sent ({sent} bytes): the server read it");
        }));
    }
    for client in clients {
        client.await.expect("client");
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}

/// The relay API checks the device token first too: a request without
/// one is answered 401 and closed before its path is parsed or its body
/// read, whatever the route (a command id that is not even text included).
#[tokio::test]
async fn the_relay_api_refuses_a_missing_token_before_the_path_and_the_body() {
    let (_state, addr) = server(ServeConfig::default()).await;
    let prefix = graph_relay_transport_http::relay_wire::RELAY_PREFIX;
    for path in [
        format!("{prefix}/sync"),
        format!("{prefix}/commands/%FF%FE/start"),
        format!("{prefix}/commands/not-a-command/complete"),
    ] {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.expect("head");
        stream.write_all(&[b' '; 4096]).await.expect("some body");
        let (text, closed) = read_until_closed(&mut stream, Duration::from_secs(10)).await;
        assert!(text.starts_with("HTTP/1.1 401"), "{path}: {text}");
        let lower = text.to_ascii_lowercase();
        assert!(lower.contains("www-authenticate: bearer"), "{path}: {text}");
        assert!(lower.contains("connection: close"), "{path}: {text}");
        assert!(closed, "{path}: the server kept the connection open");
    }
}

/// A client that sends its request head too slowly is dropped after the
/// header-read timeout; so is one that sends nothing.
#[tokio::test]
async fn slow_request_heads_are_dropped_after_the_header_timeout() {
    let timeout = Duration::from_millis(400);
    let (_state, addr) = server(ServeConfig {
        header_read_timeout: timeout,
        ..ServeConfig::default()
    })
    .await;
    // Slowloris: a byte every 50 ms, never finishing the head.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    let head = format!(
        "GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: {addr}\r\nX-Pad: "
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let dropped = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if slow.write_all(b"a").await.is_err() {
                return;
            }
            let mut probe = [0u8; 1];
            match tokio::time::timeout(Duration::from_millis(1), slow.read(&mut probe)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return,
                _ => {}
            }
        }
    })
    .await;
    assert!(dropped.is_ok(), "a head trickling in was never dropped");
    let took = started.elapsed();
    assert!(
        took >= timeout - Duration::from_millis(50),
        "dropped too early: {took:?}"
    );

    // Silence from the start.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    let (_, closed) = read_until_closed(&mut silent, Duration::from_secs(10)).await;
    assert!(closed, "a silent connection was never dropped");
    assert!(started.elapsed() >= timeout - Duration::from_millis(50));
}

/// A kept-alive connection serves more requests, and closes once idle for
/// the idle timeout; a streamed response is not idle.
#[tokio::test]
async fn idle_connections_close_and_streams_are_not_idle() {
    let idle = Duration::from_millis(400);
    let (state, addr) = server(ServeConfig {
        idle_timeout: idle,
        header_read_timeout: Duration::from_secs(5),
        ..ServeConfig::default()
    })
    .await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let get =
        format!("GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let mut quiet = Instant::now();
    for _ in 0..3 {
        stream.write_all(get.as_bytes()).await.unwrap();
        let head = read_head(&mut stream, Duration::from_secs(5)).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(str::to_owned)
            })
            .and_then(|v| v.trim().parse().ok())
            .expect("content-length");
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await.unwrap();
        quiet = Instant::now();
        tokio::time::sleep(idle / 4).await;
    }
    let (_, closed) = read_until_closed(&mut stream, Duration::from_secs(10)).await;
    assert!(closed, "an idle connection was never closed");
    assert!(quiet.elapsed() >= idle - Duration::from_millis(50));

    // A listen stream lives longer than the idle timeout.
    let task = run(&state, FULL, "idle-listen-1").await;
    let (body, headers) = modern(
        "subscriptions/listen",
        json!({"notifications": {"taskIds": [task]}}),
    );
    let mut extra = String::new();
    for (k, v) in &headers {
        extra.push_str(&format!("{k}: {v}\r\n"));
    }
    let mut listen = TcpStream::connect(addr).await.unwrap();
    listen
        .write_all(
            format!(
                "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {FULL}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{extra}Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let head = read_head(&mut listen, Duration::from_secs(5)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (_, closed) = read_until_closed(&mut listen, idle * 3).await;
    assert!(!closed, "the idle timeout cut a streamed response");
    assert_eq!(state.listen_count(), 1);
}

/// Over the connection cap, a new connection is answered 503 with
/// `Retry-After` instead of silence; a freed place serves again.
#[tokio::test]
async fn over_the_cap_a_connection_gets_503_with_retry_after() {
    let (_state, addr) = server(ServeConfig {
        max_connections: 4,
        header_read_timeout: Duration::from_secs(30),
        retry_after: Duration::from_secs(2),
        ..ServeConfig::default()
    })
    .await;
    let get =
        format!("GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        // Served, and kept alive: each holds a place.
        stream.write_all(get.as_bytes()).await.unwrap();
        let head = read_head(&mut stream, Duration::from_secs(5)).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        held.push(stream);
    }
    let mut extra = TcpStream::connect(addr).await.unwrap();
    extra.write_all(get.as_bytes()).await.unwrap();
    let (text, closed) = read_until_closed(&mut extra, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 503"), "{text:?}");
    assert!(text.contains("Retry-After: 2\r\n"), "{text}");
    assert!(closed);
    // One place freed: a new connection is served.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = TcpStream::connect(addr).await.unwrap();
        again.write_all(get.as_bytes()).await.unwrap();
        let head = read_head(&mut again, Duration::from_secs(5)).await;
        if head.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(head.starts_with("HTTP/1.1 503"), "{head}");
        assert!(
            Instant::now() < deadline,
            "the freed place was never reused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A request held longer than both timeouts is not cut by them (no
/// deadline runs while a request is in flight), and once it is answered
/// the connection's idle time counts from that answer: a request sent
/// before it runs out is served, and the connection closes an idle
/// timeout after the last answer.
#[tokio::test]
async fn a_held_request_outlives_the_timeouts_and_the_idle_time_counts_from_its_answer() {
    let hold = Duration::from_millis(900);
    let idle = Duration::from_millis(300);
    let router = axum::Router::new()
        .route(
            "/held",
            axum::routing::get(move || async move {
                tokio::time::sleep(hold).await;
                "held"
            }),
        )
        .route("/quick", axum::routing::get(|| async { "quick" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(graph_relay_transport_http::serve(
        listener,
        router,
        ServeConfig {
            header_read_timeout: Duration::from_millis(200),
            idle_timeout: idle,
            ..ServeConfig::default()
        },
        std::future::pending(),
    ));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let answer = async |stream: &mut TcpStream, body: &str| {
        let head = read_head(stream, Duration::from_secs(5)).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let mut text = vec![0u8; body.len()];
        stream.read_exact(&mut text).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&text), body);
    };
    let asked = Instant::now();
    stream.write_all(request("/held").as_bytes()).await.unwrap();
    answer(&mut stream, "held").await;
    assert!(asked.elapsed() >= hold);
    // Most of the idle time, then another request on the same connection.
    tokio::time::sleep(idle * 2 / 3).await;
    stream
        .write_all(request("/quick").as_bytes())
        .await
        .unwrap();
    answer(&mut stream, "quick").await;
    let quiet = Instant::now();
    let (_, closed) = read_until_closed(&mut stream, Duration::from_secs(10)).await;
    assert!(closed, "the connection was never closed once idle");
    let waited = quiet.elapsed();
    assert!(
        waited >= idle - Duration::from_millis(50),
        "closed {waited:?} after the last answer, before the idle timeout"
    );
}
