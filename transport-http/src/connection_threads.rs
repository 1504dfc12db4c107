//! Connection threads: OS threads, each running a single-threaded Tokio
//! runtime of its own, that accept and serve the connections of
//! [`crate::serve_on_threads`]. The first thread runs the accept loop.
//!
//! A multi-threaded runtime lets its idle workers steal each other's tasks.
//! With many connections that are mostly waiting (long-polling desktops
//! whose requests are held for seconds), the price shows: when one worker
//! takes a few ready tasks from the I/O driver it wakes a sleeping one to
//! share them, which usually finds nothing and sleeps again, a futex wake
//! and two context switches each time. A connection that stays on one
//! thread for its life never pays that: its thread sleeps in `epoll_wait`
//! and wakes only for its own connections' events (and for wakers called
//! from other threads, such as a run queued for a desktop held elsewhere).
//!
//! A new connection goes to the thread serving the fewest, so long-lived
//! connections spread evenly.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The threads and what each serves; dropping it stops every thread (what
/// it still runs is dropped).
#[derive(Debug)]
pub(crate) struct ConnectionThreads {
    threads: Vec<Thread>,
}

#[derive(Debug)]
struct Thread {
    handle: Handle,
    /// Connections the thread serves now.
    open: Arc<AtomicUsize>,
    /// Dropped (or sent) to stop the thread.
    stop: Option<oneshot::Sender<()>>,
    /// Answered once the thread's runtime is gone.
    stopped: Option<oneshot::Receiver<()>>,
}

/// Counts a connection on its thread until dropped.
#[derive(Debug)]
pub(crate) struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ConnectionThreads {
    /// Starts `count` threads (at least one), named `graph-relay-conn-N`.
    pub(crate) fn start(count: usize) -> io::Result<Self> {
        let mut threads = Vec::with_capacity(count.max(1));
        for n in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let (stop, stop_rx) = oneshot::channel::<()>();
            let (stopped_tx, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("graph-relay-conn-{n}"))
                .spawn(move || {
                    // Either the signal or the sender's drop ends the wait.
                    let _ = runtime.block_on(stop_rx);
                    drop(runtime);
                    let _ = stopped_tx.send(());
                })?;
            threads.push(Thread {
                handle,
                open: Arc::new(AtomicUsize::new(0)),
                stop: Some(stop),
                stopped: Some(stopped),
            });
        }
        Ok(Self { threads })
    }

    /// The runtime of the first thread, where the accept loop runs.
    pub(crate) fn home(&self) -> Handle {
        self.threads
            .first()
            .unwrap_or_else(|| unreachable!("at least one thread is started"))
            .handle
            .clone()
    }

    /// Places a new connection on the thread serving the fewest, counting
    /// it there, and gives that thread's runtime; `None` for the first
    /// thread, where the accept loop runs and the connection stays. Ties go
    /// to the first thread: a connection placed there costs no hand-over.
    pub(crate) fn pick(&self) -> (Open, Option<Handle>) {
        let (index, thread) = self
            .threads
            .iter()
            .enumerate()
            .min_by_key(|(_, t)| t.open.load(Ordering::Acquire))
            .unwrap_or_else(|| unreachable!("at least one thread is started"));
        thread.open.fetch_add(1, Ordering::AcqRel);
        let open = Open(Arc::clone(&thread.open));
        let elsewhere = (index > 0).then(|| thread.handle.clone());
        (open, elsewhere)
    }

    /// Stops every thread and waits until their runtimes are gone.
    pub(crate) fn stop(mut self) -> impl Future<Output = ()> + Send {
        let stopped: Vec<_> = self
            .threads
            .iter_mut()
            .filter_map(|t| {
                drop(t.stop.take());
                t.stopped.take()
            })
            .collect();
        async move {
            for thread in stopped {
                let _ = thread.await;
            }
        }
    }
}
