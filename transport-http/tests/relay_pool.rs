//! The relay's connections to the server: after a burst of requests it
//! keeps at most `pool_max_idle` of them open, and closes those once they
//! sat unused for `pool_idle_timeout` (at 200 runs a second over 10,000
//! desktops, connections left open for longer reached the server's cap).
//!
//! The server here is a few lines of HTTP/1.1 over a real socket that
//! counts the connections it holds open, so the test sees what a server
//! would see.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use graph_relay_core::queue::SyncRequest;
use graph_relay_core::relay::driver::RelayTransport;
use graph_relay_core::testkit::{meta, p1};
use graph_relay_transport_http::relay_http::{
    HttpRelayConfig, HttpRelayTransport, POOL_IDLE_TIMEOUT, POOL_MAX_IDLE,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// Connections the server accepted and holds open now.
#[derive(Default)]
struct Counts {
    accepted: AtomicUsize,
    open: AtomicUsize,
}

/// Answers every request with an empty sync reply after `delay` (so that
/// concurrent requests overlap and need a connection each), keeping each
/// connection open until the client closes it.
async fn server(delay: Duration) -> (String, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let counts = Arc::new(Counts::default());
    let shared = Arc::clone(&counts);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            shared.accepted.fetch_add(1, Ordering::SeqCst);
            shared.open.fetch_add(1, Ordering::SeqCst);
            let counts = Arc::clone(&shared);
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                while answer_one(&mut stream, delay).await {}
                counts.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (url, counts)
}

/// Reads one request and answers it; false once the client closed.
async fn answer_one(stream: &mut BufReader<tokio::net::TcpStream>, delay: Duration) -> bool {
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        match stream.read_line(&mut line).await {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    if stream.read_exact(&mut body).await.is_err() {
        return false;
    }
    tokio::time::sleep(delay).await;
    let reply = br#"{"commands":[],"poll_after_seconds":5}"#;
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        reply.len()
    );
    let stream = stream.get_mut();
    stream.write_all(head.as_bytes()).await.is_ok() && stream.write_all(reply).await.is_ok()
}

fn sync() -> SyncRequest {
    SyncRequest {
        project: p1(),
        sessions: vec![meta(1)],
        long_poll: false,
        restarted: false,
        running: None,
    }
}

/// Waits (up to 20 s) until at most `open` connections remain; returns how
/// many were open when that was first seen.
async fn settle_at(counts: &Counts, open: usize) -> usize {
    for _ in 0..1000 {
        if counts.open.load(Ordering::SeqCst) <= open {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    counts.open.load(Ordering::SeqCst)
}

#[test]
fn the_defaults_are_the_published_limits() {
    let config = HttpRelayConfig::new("http://127.0.0.1:1", "token");
    assert_eq!(config.pool_max_idle, POOL_MAX_IDLE);
    assert_eq!(config.pool_idle_timeout, POOL_IDLE_TIMEOUT);
    assert_eq!((POOL_MAX_IDLE, POOL_IDLE_TIMEOUT.as_secs()), (2, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_burst_the_relay_keeps_at_most_its_idle_limit_and_then_none() {
    let (url, counts) = server(Duration::from_millis(200)).await;
    let mut config = HttpRelayConfig::new(url, "device-token");
    config.pool_idle_timeout = Duration::from_millis(1500);
    let transport = HttpRelayTransport::new(config).expect("client");

    let burst = 6;
    let request = sync();
    let answers = futures::future::join_all((0..burst).map(|_| transport.sync(&request))).await;
    for answer in answers {
        assert_eq!(answer.expect("an empty sync reply").len(), 0);
    }
    assert_eq!(
        counts.accepted.load(Ordering::SeqCst),
        burst,
        "each overlapping request had a connection of its own"
    );
    // Freed connections beyond the limit are closed at once (not after the
    // idle timeout, which would close all of them)...
    assert_eq!(settle_at(&counts, POOL_MAX_IDLE).await, POOL_MAX_IDLE);
    // ... and the ones kept are reused by the next request, not doubled.
    transport
        .sync(&request)
        .await
        .expect("reuses a kept connection");
    assert_eq!(counts.accepted.load(Ordering::SeqCst), burst);
    // Unused for the idle timeout, the kept ones close too.
    assert_eq!(settle_at(&counts, 0).await, 0, "idle connections close");
}
