//! Group commit on the callers' own threads.
//!
//! The first caller to write while no group is forming leads the next
//! group: it queues its job, yields once, and then commits everything that
//! was queued meanwhile in one transaction, on its own thread, with the
//! writing connection. Callers that write while a group forms or runs only
//! queue their job and wait for its answer.
//!
//! The yield is what makes the groups. An executor polls every other task
//! that is ready before it polls the leader again, so the writes of tasks
//! that run together (the requests being served at the moment, a
//! benchmark's `join_all`) join the group; on a quiet server a write waits
//! for nothing but that one poll. Committing on the caller's thread saves
//! the writer thread's hand-offs: waking it, its spinning for more jobs,
//! and waking the callers from another thread cost more CPU than the
//! writes themselves (with 64 lifecycles in flight, 50-54 µs of CPU per
//! lifecycle through the writer thread against 33-34 µs here).
//!
//! The leader runs at most [`LEADER_GROUPS`] groups (its own, then the
//! jobs that came from other threads while it ran) and hands whatever still
//! waits to the writer thread, so that a leader's own request is not held up
//! by a stream of others. A group whose write lock is not free at once
//! (another process, or the checkpoint thread, holds it) goes to the writer
//! thread too, which waits for the lock with its patience; so does a group
//! whose leader was dropped before it ran it (a cancelled request).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use super::writer::{MAX_GROUP, WriteJob};

/// Groups a leader runs at most before it hands the rest to the writer
/// thread (each one at most [`MAX_GROUP`] jobs).
pub(super) const LEADER_GROUPS: usize = 4;

/// The jobs queued for the next group, and whether a caller leads it.
#[derive(Default)]
pub(super) struct Forming(Mutex<Queued>);

#[derive(Default)]
struct Queued {
    jobs: Vec<WriteJob>,
    /// A caller leads: it will take `jobs` (or hand them on) before it
    /// lets go.
    led: bool,
}

impl Forming {
    fn lock(&self) -> MutexGuard<'_, Queued> {
        // Every change below leaves the queue consistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job`; `true` if the caller is to lead (nobody else does).
    pub(super) fn join(&self, job: WriteJob) -> bool {
        let mut queued = self.lock();
        queued.jobs.push(job);
        !std::mem::replace(&mut queued.led, true)
    }

    /// The leader's next group (at most [`MAX_GROUP`] jobs, oldest
    /// first), or `None` once nothing is queued: the leader then no longer
    /// leads.
    pub(super) fn next_group(&self) -> Option<Vec<WriteJob>> {
        let mut queued = self.lock();
        if queued.jobs.is_empty() {
            queued.led = false;
            return None;
        }
        let taken = queued.jobs.len().min(MAX_GROUP);
        let rest = queued.jobs.split_off(taken);
        Some(std::mem::replace(&mut queued.jobs, rest))
    }

    /// Ends the leader's turn: what is queued, for the writer thread.
    pub(super) fn resign(&self) -> Vec<WriteJob> {
        let mut queued = self.lock();
        queued.led = false;
        std::mem::take(&mut queued.jobs)
    }
}

/// A future that is pending once, having asked to be polled again: the
/// executor first polls the other tasks that are ready.
#[derive(Default)]
pub(super) struct YieldOnce {
    yielded: bool,
}

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::reply::{Answer, channel};
    use super::super::writer::Work;
    use super::*;

    fn job() -> (WriteJob, Answer<()>) {
        let (reply, answer) = channel();
        let work: WriteJob = Box::new(Work::new(|_: &rusqlite::Connection| Ok(()), reply));
        (work, answer)
    }

    #[test]
    fn the_first_caller_leads_until_nothing_is_queued() {
        let forming = Forming::default();
        let mut answers = Vec::new();
        let (first, answer) = job();
        answers.push(answer);
        assert!(forming.join(first), "the first caller leads");
        for _ in 0..MAX_GROUP + 2 {
            let (next, answer) = job();
            answers.push(answer);
            assert!(!forming.join(next), "the others only queue");
        }
        assert_eq!(forming.next_group().map(|g| g.len()), Some(MAX_GROUP));
        let (during, answer) = job();
        answers.push(answer);
        assert!(!forming.join(during), "still led while a group runs");
        assert_eq!(forming.next_group().map(|g| g.len()), Some(4));
        assert!(forming.next_group().is_none());
        let (after, _answer) = job();
        assert!(forming.join(after), "the next caller leads again");
        assert_eq!(forming.resign().len(), 1);
        let (again, _answer) = job();
        assert!(forming.join(again), "a resigned leader leads no more");
        drop(answers);
    }

    #[test]
    fn yield_once_is_pending_once_and_asks_to_be_polled_again() {
        struct Count(std::sync::atomic::AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let count = Arc::new(Count(0.into()));
        let waker = std::task::Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let mut once = YieldOnce::default();
        assert!(Pin::new(&mut once).poll(&mut cx).is_pending());
        assert_eq!(count.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert!(Pin::new(&mut once).poll(&mut cx).is_ready());
    }
}
