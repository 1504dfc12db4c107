//! `serve_on_threads`: connections served by threads of their own, spread
//! evenly, still bounded as `serve` bounds them, and drained and stopped
//! on shutdown.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::read_head;
use graph_relay_transport_http::{ServeConfig, serve_on_threads};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, oneshot};

/// The tests take turns: one of them counts the process's connection
/// threads, which another test's server would add to.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// A router that answers with the name of the thread serving the request;
/// `/slow` first sleeps for 300 ms.
fn router() -> Router {
    let name = || {
        std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned()
    };
    Router::new()
        .route("/thread", get(move || async move { name() }))
        .route(
            "/slow",
            get(move || async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                name()
            }),
        )
}

/// Sends `GET path` on `stream` and returns the status line and the body
/// (the response has a `content-length`).
async fn request(stream: &mut TcpStream, path: &str) -> (String, String) {
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let head = read_head(stream, Duration::from_secs(10)).await;
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.expect("body");
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// This process's threads that serve connections (Linux; the kernel keeps
/// 15 bytes of a thread's name).
fn connection_threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task (these tests run on Linux)")
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name.starts_with("graph-relay-con"))
        .collect();
    names.sort();
    names
}

/// Serves the router on `threads` threads with `config`; the sender stops it.
async fn start(
    threads: usize,
    config: ServeConfig,
) -> (
    SocketAddr,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(serve_on_threads(
        listener,
        router(),
        config,
        threads,
        async {
            let _ = stopped.await;
        },
    ));
    (addr, stop, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_spread_over_the_threads_and_stay_on_theirs() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (addr, stop, served) = start(2, ServeConfig::default()).await;
    let mut streams = Vec::new();
    let mut names = Vec::new();
    for _ in 0..4 {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let (status, name) = request(&mut stream, "/thread").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        names.push(name);
        streams.push(stream);
    }
    names.sort();
    // Each new connection went to the thread serving fewer.
    assert_eq!(
        names,
        [
            "graph-relay-conn-0",
            "graph-relay-conn-0",
            "graph-relay-conn-1",
            "graph-relay-conn-1"
        ]
    );
    // A kept-alive connection stays on its thread.
    for stream in &mut streams {
        let (_, first) = request(stream, "/thread").await;
        let (_, second) = request(stream, "/thread").await;
        assert_eq!(first, second);
    }
    drop(streams);
    let _ = stop.send(());
    served.await.expect("joined").expect("served");
    // Each thread's runtime is gone when serving returns; the thread
    // itself ends right after.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !connection_threads().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "threads left after serving: {:?}",
            connection_threads()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_a_request_in_flight_finish_then_stops_the_threads() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (addr, stop, served) = start(1, ServeConfig::default()).await;
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let slow = tokio::spawn(async move { request(&mut stream, "/slow").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = stop.send(());
    let (status, name) = slow.await.expect("the slow request");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(name, "graph-relay-conn-0");
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("serving ends once drained")
        .expect("joined")
        .expect("served");
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_and_the_idle_timeout_still_apply() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let idle = Duration::from_millis(300);
    let (addr, stop, served) = start(
        2,
        ServeConfig {
            max_connections: 2,
            idle_timeout: idle,
            ..ServeConfig::default()
        },
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let (status, _) = request(&mut stream, "/thread").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        held.push(stream);
    }
    let mut over = TcpStream::connect(addr).await.expect("connect");
    let (status, _) = request(&mut over, "/thread").await;
    assert_eq!(status, "HTTP/1.1 503 Service Unavailable");
    // Idle past the timeout, the held connections are closed by their
    // threads' timers, and their places serve again.
    for stream in &mut held {
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(idle * 10, stream.read(&mut buf))
            .await
            .expect("closed in time");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
    let mut again = TcpStream::connect(addr).await.expect("connect");
    let (status, _) = request(&mut again, "/thread").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let _ = stop.send(());
    served.await.expect("joined").expect("served");
}

/// The connection threads accept connections themselves: while the
/// caller's runtime is blocked, a new connection is still accepted and
/// served (by the first thread, the one accepting).
#[tokio::test]
async fn connections_are_accepted_while_the_callers_runtime_is_blocked() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (addr, stop, served) = start(2, ServeConfig::default()).await;
    // Let the serving task hand its accept loop to the threads.
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A blocking client on a thread of its own, joined without yielding:
    // this runtime (the test's only thread) stays blocked meanwhile.
    let client = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        stream
            .write_all(b"GET /thread HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .expect("write");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    });
    let answer = client.join().expect("the client");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("graph-relay-conn-0"), "{answer}");
    let _ = stop.send(());
    served.await.expect("joined").expect("served");
}
