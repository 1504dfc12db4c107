//! [`serve`]: a router over TCP with every connection bounded (the docs are
//! on [`serve`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::connection_threads::ConnectionThreads;

/// Default of [`ServeConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default of [`ServeConfig::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ServeConfig::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`ServeConfig::retry_after`].
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Default of [`ServeConfig::shutdown_grace`].
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Most connections over the cap that are being answered 503 at one time;
/// beyond, a connection over the cap is closed without an answer.
pub const MAX_REFUSING: usize = 64;
/// How long a 503 refusal may take to write and drain before its
/// connection is dropped.
const REFUSAL_TIME: Duration = Duration::from_secs(1);
/// File descriptors kept for everything but connections (listener, store,
/// logs, token file, refusals), when checking the open-file limit.
pub const RESERVED_FILES: u64 = 64 + MAX_REFUSING as u64;

/// Bounds of [`serve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    /// Most open connections (default 4,096); one more is answered 503.
    pub max_connections: usize,
    /// Longest wait for a complete request head, from the connection's
    /// start or from the first byte of a later request (default 10 s).
    pub header_read_timeout: Duration,
    /// Longest silence of a kept-alive connection between requests
    /// (default 30 s).
    pub idle_timeout: Duration,
    /// The `Retry-After` of a 503 over the cap, rounded up to seconds (default 1 s).
    pub retry_after: Duration,
    /// After shutdown is requested, how long requests in flight may finish (default 10 s).
    pub shutdown_grace: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            retry_after: DEFAULT_RETRY_AFTER,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves. Returns once
/// every connection is closed; `Err` only when the listener's address
/// cannot be read.
///
/// Serving a router over TCP with every connection bounded.
///
/// [`serve`] is what `graph-relay serve` runs, and what an embedder should
/// run instead of `axum::serve` (which has no connection cap and no
/// timeouts). It speaks HTTP/1.1 and adds, per [`ServeConfig`]:
///
/// - a **connection cap** ([`ServeConfig::max_connections`], default 4,096):
///   a connection beyond it is answered `503 Service Unavailable` with
///   `Retry-After` and closed, instead of waiting unseen in the backlog or
///   exhausting file descriptors;
/// - a **header-read timeout** ([`ServeConfig::header_read_timeout`],
///   default 10 s): a connection that opened, or began a request, and has not
///   delivered a complete request head by then is closed;
/// - an **idle timeout** ([`ServeConfig::idle_timeout`], default 30 s): a
///   kept-alive connection with no request in flight and no new byte is
///   closed. A request in flight, including a streamed response such as a
///   `subscriptions/listen` stream, keeps its connection (the router's
///   request timeout and the streams' own bounds apply there);
/// - a **graceful shutdown**: once `shutdown` resolves, no connection is
///   accepted, idle ones close, requests in flight may finish for
///   [`ServeConfig::shutdown_grace`], then the rest are dropped.
///
/// Request bodies are read only when a handler asks for them, so the
/// router's authentication gate answers before any body byte is read.
///
/// [`raise_open_file_limit`] raises the process's soft limit on open files
/// towards its hard limit; call it once at start (see `graph-relay serve`).
pub async fn serve<F>(
    listener: TcpListener,
    router: Router,
    config: ServeConfig,
    shutdown: F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_with(listener, router, config, None, shutdown).await
}

/// [`serve`], with the connections accepted and served by `threads`
/// threads of their own instead of the caller's runtime (the returned
/// future only waits for them).
///
/// Each thread runs a single-threaded Tokio runtime, and a connection
/// stays on one thread for its life (a new one goes to the thread with the
/// fewest); the first thread also accepts them. Where most connections
/// wait (long-polling desktops), this spares the wake-ups with which a
/// multi-threaded runtime's workers share their tasks; `graph-relay serve`
/// runs one thread per processor. The router's handlers then run on those
/// threads: what they spawn runs there too, and ends when the server does.
/// `threads` is at least one. Fails when a thread cannot be started, or as
/// [`serve`] does.
///
/// ```no_run
/// # async fn run(router: axum::Router) -> std::io::Result<()> {
/// use graph_relay_transport_http::{ServeConfig, serve_on_threads, shutdown_signal};
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8787").await?;
/// let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
/// serve_on_threads(listener, router, ServeConfig::default(), threads, shutdown_signal()).await
/// # }
/// ```
pub async fn serve_on_threads<F>(
    listener: TcpListener,
    router: Router,
    config: ServeConfig,
    threads: usize,
    shutdown: F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let threads = ConnectionThreads::start(threads)?;
    serve_with(listener, router, config, Some(threads), shutdown).await
}

/// [`serve`] on the caller's runtime or on `threads`.
///
/// With threads, the accept loop itself runs on the first of them: a new
/// connection placed there is served where it was accepted, and one placed
/// on another thread costs one hand-over. Accepting on the caller's
/// multi-threaded runtime instead cost a wake-up of one of its workers
/// (which often wakes another to share the work) for every connection.
async fn serve_with<F>(
    listener: TcpListener,
    router: Router,
    config: ServeConfig,
    threads: Option<ConnectionThreads>,
    shutdown: F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let Some(threads) = threads else {
        return accept_loop(listener, router, config, None, shutdown).await;
    };
    let threads = Arc::new(threads);
    let home = threads.home();
    let listener = listener.into_std()?;
    let accepting = {
        let threads = Arc::clone(&threads);
        home.spawn(async move {
            let listener = TcpListener::from_std(listener)?;
            accept_loop(listener, router, config, Some(threads), shutdown).await
        })
    };
    let served = accepting
        .await
        .unwrap_or_else(|e| Err(io::Error::other(format!("the accept loop failed: {e}"))));
    // The loop's share of the threads went with its task. (Were it still
    // held, its drop would stop the threads without waiting for them.)
    if let Ok(threads) = Arc::try_unwrap(threads) {
        threads.stop().await;
    }
    served
}

/// Accepts connections on the current runtime until `shutdown`, serving
/// each here or on one of `threads`; then drains them.
async fn accept_loop<F>(
    listener: TcpListener,
    router: Router,
    config: ServeConfig,
    threads: Option<Arc<ConnectionThreads>>,
    shutdown: F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let local = listener.local_addr()?;
    let config = Arc::new(config);
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut last_accept_warning: Option<Instant> = None;
    let mut last_cap_warning: Option<Instant> = None;
    let mut shutdown = std::pin::pin!(shutdown);
    tracing::debug!(%local, max_connections = config.max_connections, "accepting connections");
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors (or another transient failure):
                // say so, at most once a second, and give the system a moment.
                if warning_due(&mut last_accept_warning) {
                    tracing::warn!(error = %e, "accepting a connection failed");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if warning_due(&mut last_cap_warning) {
                tracing::warn!(
                    limit = config.max_connections,
                    "connection cap reached; answering new connections with 503"
                );
            }
            if let Ok(refusal) = refusing.clone().try_acquire_owned() {
                let retry_after = config.retry_after;
                tokio::spawn(async move {
                    let _refusal = refusal;
                    refuse(stream, retry_after).await;
                });
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let config = config.clone();
        let stop = stop_rx.clone();
        let (open, elsewhere) = match &threads {
            Some(threads) => {
                let (open, elsewhere) = threads.pick();
                (Some(open), elsewhere)
            }
            None => (None, None),
        };
        let Some(thread) = elsewhere else {
            // Served where it was accepted.
            connections.spawn(async move {
                let _slot = slot;
                let _open = open;
                connection(stream, router, &config, stop).await;
                tracing::trace!(%peer, "connection closed");
            });
            continue;
        };
        // The socket leaves this runtime's I/O driver and joins the
        // thread's, where the connection then lives.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "a connection could not be handed to its thread");
                continue;
            }
        };
        connections.spawn_on(
            async move {
                let _slot = slot;
                let _open = open;
                match TcpStream::from_std(stream) {
                    Ok(stream) => connection(stream, router, &config, stop).await,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "a connection's thread could not take it");
                    }
                }
                tracing::trace!(%peer, "connection closed");
            },
            &thread,
        );
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drain(connections, config.shutdown_grace).await;
    Ok(())
}

/// Whether a warning whose last time is `last` may be said again (at most
/// once a second: a flood of failures must not flood the log); if so, now
/// is its last time.
fn warning_due(last: &mut Option<Instant>) -> bool {
    let due = last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
    if due {
        *last = Some(Instant::now());
    }
    due
}

/// Waits up to `grace` for the connections (told to stop) to finish their
/// requests, then closes the rest.
async fn drain(mut connections: JoinSet<()>, grace: Duration) {
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            left = connections.len(),
            "requests still in flight after the shutdown grace; closing them"
        );
        connections.shutdown().await;
    }
}

/// Answers a connection over the cap: 503 with `Retry-After`, then closes.
async fn refuse(mut stream: TcpStream, retry_after: Duration) {
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    let body = format!(
        "{{\"error\":\"temporarily_unavailable\",\"error_description\":\"the server holds its maximum number of connections; retry after {seconds} s\"}}"
    );
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: {seconds}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent (bounded) so that closing does not
        // reset the connection before the client has read the answer.
        let mut sink = [0u8; 4096];
        let mut left = 64 * 1024usize;
        while left > 0 {
            let n = tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        Ok::<(), io::Error>(())
    })
    .await;
}

/// What the connection's watchdog knows: requests in flight and when the
/// connection last went quiet or began a request head.
///
/// Every change a request makes (bytes read, a head parsed, a response
/// done) happens while the connection's task polls the connection, so the
/// task sets the watchdog to the new deadline right after that poll. A
/// request costs a few atomic operations and, when it ends, moving the
/// timer later (an atomic update: the timer wheel files it again only when
/// its first time comes). While a request is in flight there is no
/// deadline, so a held request (a desktop's long-poll) costs no wake-up.
#[derive(Debug)]
struct Activity {
    start: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds since `start` when the last request finished; `u64::MAX`
    /// before the first one.
    idle_since: AtomicU64,
    /// Milliseconds since `start` of the first byte read while no request
    /// was in flight; `u64::MAX` for none.
    head_since: AtomicU64,
}

const NEVER: u64 = u64::MAX;

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(NEVER),
            head_since: AtomicU64::new(NEVER),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(NEVER - 1)
    }

    fn at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    /// Bytes arrived.
    fn read(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.head_since.load(Ordering::Acquire) == NEVER
        {
            let _ = self.head_since.compare_exchange(
                NEVER,
                self.now_ms(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// A request head was parsed; its guard ends it.
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NEVER, Ordering::Release);
        InFlight(self.clone())
    }

    /// When the connection is to be closed if nothing happens; `None` while
    /// a request is in flight.
    fn deadline(&self, config: &ServeConfig) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let head = self.head_since.load(Ordering::Acquire);
        if head != NEVER {
            return Some(self.at(head) + config.header_read_timeout);
        }
        match self.idle_since.load(Ordering::Acquire) {
            // Nothing served yet: the first request head is due.
            NEVER => Some(self.start + config.header_read_timeout),
            idle => Some(self.at(idle) + config.idle_timeout),
        }
    }
}

/// One request in flight, until its response body is done or dropped.
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        activity
            .idle_since
            .store(activity.now_ms(), Ordering::Release);
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves one connection until it ends, times out or shutdown drains it.
async fn connection(
    stream: TcpStream,
    router: Router,
    config: &ServeConfig,
    mut stop: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        stream,
        activity: activity.clone(),
    });
    let service_activity = activity.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let flight = service_activity.begin();
        let router = router.clone();
        async move {
            let response = tower::ServiceExt::oneshot(router, request.map(Body::new)).await;
            Ok::<_, std::convert::Infallible>(match response {
                Ok(response) => response.map(|body| {
                    Body::new(Tracked {
                        body,
                        flight: Some(flight),
                    })
                }),
                Err(never) => match never {},
            })
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.keep_alive(true);
    let conn = builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut draining = false;
    let mut stopped = std::pin::pin!(async move {
        while !*stop.borrow_and_update() {
            if stop.changed().await.is_err() {
                break;
            }
        }
    });
    let mut deadline = activity.deadline(config);
    // Until a deadline is set, the timer waits at its first one: the head
    // of the first request is due then.
    let watchdog = tokio::time::sleep_until(
        deadline
            .unwrap_or_else(|| activity.start + config.header_read_timeout)
            .into(),
    );
    let mut watchdog = std::pin::pin!(watchdog);
    std::future::poll_fn(|cx| {
        if !draining && stopped.as_mut().poll(cx).is_ready() {
            draining = true;
            conn.as_mut().graceful_shutdown();
        }
        loop {
            if let Poll::Ready(result) = conn.as_mut().poll(cx) {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return Poll::Ready(());
            }
            let now_due = activity.deadline(config);
            if now_due != deadline {
                deadline = now_due;
                if let Some(at) = deadline {
                    watchdog.as_mut().reset(at.into());
                }
            }
            // No deadline while a request is in flight: the timer is not
            // looked at (if it fires, the task finds nothing due).
            let Some(at) = deadline else {
                return Poll::Pending;
            };
            if watchdog.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if at <= Instant::now() {
                tracing::debug!(
                    "closing a connection: no complete request head in time, or idle too long"
                );
                return Poll::Ready(());
            }
            // The timer's clock ticks in milliseconds: had it fired before
            // the deadline, it is set again.
            watchdog.as_mut().reset(at.into());
        }
    })
    .await;
}

/// The TCP stream, reporting reads to the connection's [`Activity`].
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// A response body that keeps its request in flight until it is done.
struct Tracked {
    body: Body,
    flight: Option<InFlight>,
}

impl HttpBody for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.flight = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// What [`raise_open_file_limit`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The soft limit before.
    pub before: u64,
    /// The soft limit now.
    pub now: u64,
    /// The hard limit.
    pub hard: u64,
}

/// Why the open-file limit could not be read or raised.
#[derive(Debug, thiserror::Error)]
pub enum OpenFileLimitError {
    /// The system refused.
    #[error("the open-file limit could not be read or raised: {0}")]
    System(String),
    /// Not a Unix system.
    #[error("open-file limits are not managed on this system")]
    Unsupported,
}

/// Raises the soft limit on open files (`RLIMIT_NOFILE`) to the hard limit
/// and returns both. A server needs one descriptor per connection: compare
/// the result with [`ServeConfig::max_connections`] plus [`RESERVED_FILES`]
/// and warn when it is lower (`graph-relay serve` does).
pub fn raise_open_file_limit() -> Result<OpenFileLimit, OpenFileLimitError> {
    #[cfg(unix)]
    {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let system = |e: nix::Error| OpenFileLimitError::System(e.to_string());
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(system)?;
        if soft >= hard {
            return Ok(OpenFileLimit {
                before: soft,
                now: soft,
                hard,
            });
        }
        // macOS refuses an unlimited soft limit; try a finite one there.
        let now = match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(_) => {
                let finite = hard.min(1 << 20);
                setrlimit(Resource::RLIMIT_NOFILE, finite, hard).map_err(system)?;
                finite
            }
        };
        Ok(OpenFileLimit {
            before: soft,
            now,
            hard,
        })
    }
    #[cfg(not(unix))]
    {
        Err(OpenFileLimitError::Unsupported)
    }
}
