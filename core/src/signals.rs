//! Wake-ups without a runtime.
//!
//! A held request (a relay's long-poll sync or control call, an agent's
//! `wait_seconds`) subscribes to a [`Topic`] *before* it looks at the store,
//! then awaits the [`Subscription`] (with a timeout from its own runtime).
//! The [`Queue`](crate::queue::Queue) notifies a topic after every write that
//! matters to it, so a waiter wakes as soon as the state it waits for can
//! have changed, and costs nothing while it waits.
//!
//! Notifications are hints, never data: a woken waiter re-reads the store.
//! Processes that share a store (several servers on one database) forward
//! notifications to each other through [`Signals::set_forwarder`].

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures::channel::oneshot;

use crate::ids::{CommandId, DeviceId, OwnerId, ProjectId};

mod changes;
mod quiet;
pub(crate) use changes::{Mark, RemoteChanges};
pub(crate) use quiet::QuietDevices;

/// What a waiter waits for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Topic {
    /// A command was queued for this device (of this owner).
    DeviceWork(OwnerId, DeviceId),
    /// This command changed (started, cancel requested, finished).
    Command(CommandId),
}

/// Receives every local notification, e.g. to publish it to other processes.
pub trait Forwarder: Send + Sync {
    /// Called after local waiters on `topic` were woken.
    fn forward(&self, topic: &Topic);

    /// True while every notification the other processes send reaches this
    /// process's [`Signals`] too (e.g. a listening database connection).
    /// Held requests then rely on notifications alone instead of looking at
    /// a shared store every recheck; a forwarder that was not delivering
    /// (its connection was lost) calls [`Signals::wake_all`] once it
    /// delivers again, so nothing written meanwhile is missed. The default
    /// makes no promise.
    fn delivers(&self) -> bool {
        false
    }
}

/// How many notifications a [`Signals`] had and how many waiters they woke,
/// since it was made: `woken / notified` is the wake-ups per notification
/// (1 or less when each change concerns one waiter, as a relay's sync or an
/// agent's wait; a figure growing with the number of waiters would be a
/// thundering herd).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SignalCounts {
    /// Topics notified in this process (local and forwarded from others).
    pub notified: u64,
    /// Waiters those notifications woke.
    pub woken: u64,
    /// Waiters woken by [`Signals::wake_all`].
    pub woken_all: u64,
}

/// The registry of waiters. Cheap to share (`Arc`).
#[derive(Default)]
pub struct Signals {
    waiters: Mutex<HashMap<Topic, Vec<oneshot::Sender<()>>>>,
    forwarder: Mutex<Option<Arc<dyn Forwarder>>>,
    /// Desktops whose queue was found empty, until a notification says
    /// work may have come (see [`QuietDevices`]).
    quiet: QuietDevices,
    /// Commands other processes changed, and when (see [`RemoteChanges`]).
    changes: RemoteChanges,
    closed: std::sync::atomic::AtomicBool,
    notified: AtomicU64,
    woken: AtomicU64,
    woken_all: AtomicU64,
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signals")
            .field("topics", &self.lock().len())
            .finish_non_exhaustive()
    }
}

impl Signals {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Topic, Vec<oneshot::Sender<()>>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers interest in `topic`. Subscribe first, then check the store,
    /// then await: a change between the check and the await is not lost.
    /// After [`Signals::close`] the subscription is ready at once.
    pub fn subscribe(&self, topic: Topic) -> Subscription {
        let (tx, rx) = oneshot::channel();
        let mut waiters = self.lock();
        if self.is_closed() {
            return Subscription(rx);
        }
        let list = waiters.entry(topic).or_default();
        // Drop senders whose waiters gave up (timed out) so idle topics do not grow.
        list.retain(|s| !s.is_canceled());
        list.push(tx);
        Subscription(rx)
    }

    /// Wakes every waiter on `topic` (here, and through the forwarder elsewhere).
    pub fn notify(&self, topic: &Topic) {
        self.wake(topic);
        self.forward(topic);
    }

    /// Publishes `topic` to the other processes, if a forwarder is installed.
    fn forward(&self, topic: &Topic) {
        let forwarder = self
            .forwarder
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(f) = forwarder {
            f.forward(topic);
        }
    }

    /// Wakes every waiter on the work of `device` of `owner` (here, and
    /// through the forwarder elsewhere) for run `id`, which this process
    /// just queued there in `project`: [`Signals::notify`] of
    /// [`Topic::DeviceWork`], except that the desktop's look kept in memory
    /// takes the run in rather than being forgotten.
    pub fn notify_queued(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        project: &ProjectId,
        id: CommandId,
    ) {
        // Before any waiter wakes: its look may come from memory.
        self.quiet.queued_here(owner, device, project, id);
        let topic = Topic::DeviceWork(owner.clone(), device.clone());
        self.wake_waiters(&topic);
        self.forward(&topic);
    }

    /// Wakes the waiters of this process only (for a notification that came
    /// from another process). A command it names is no longer answered
    /// from the queue's own copy of it until the queue reads it again.
    pub fn notify_local(&self, topic: &Topic) {
        if let Topic::Command(id) = topic {
            // Before any waiter wakes: its look must not come from a copy.
            self.changes.command(id);
        }
        self.wake(topic);
    }

    /// Wakes the waiters on `topic` in this process.
    fn wake(&self, topic: &Topic) {
        if let Topic::DeviceWork(_, device) = topic {
            // Before any waiter wakes: its look must not come from memory.
            self.quiet.work_for(device);
        }
        self.wake_waiters(topic);
    }

    /// Wakes the waiters on `topic` in this process, leaving the memory of
    /// quiet desktops to the caller.
    fn wake_waiters(&self, topic: &Topic) {
        self.notified.fetch_add(1, Ordering::Relaxed);
        let senders = {
            let mut waiters = self.lock();
            if waiters.is_empty() {
                return;
            }
            waiters.remove(topic)
        };
        let mut woken = 0;
        for s in senders.into_iter().flatten() {
            if s.send(()).is_ok() {
                woken += 1;
            }
        }
        self.woken.fetch_add(woken, Ordering::Relaxed);
    }

    /// The notifications and wake-ups so far.
    pub fn counts(&self) -> SignalCounts {
        SignalCounts {
            notified: self.notified.load(Ordering::Relaxed),
            woken: self.woken.load(Ordering::Relaxed),
            woken_all: self.woken_all.load(Ordering::Relaxed),
        }
    }

    /// Installs the forwarder that publishes notifications to other processes.
    pub fn set_forwarder(&self, forwarder: Arc<dyn Forwarder>) {
        *self.forwarder.lock().unwrap_or_else(|p| p.into_inner()) = Some(forwarder);
    }

    /// Wakes every waiter once (each looks at the store again and, if it is
    /// still not answered, waits anew): anything may have changed, e.g.
    /// another process wrote to a shared store while its notifications
    /// could not arrive. Returns the number of waiters woken.
    pub fn wake_all(&self) -> usize {
        self.quiet.forget_all();
        self.changes.everything();
        let all = std::mem::take(&mut *self.lock());
        let mut woken = 0;
        for s in all.into_values().flatten() {
            if s.send(()).is_ok() {
                woken += 1;
            }
        }
        self.woken_all
            .fetch_add(u64::try_from(woken).unwrap_or(u64::MAX), Ordering::Relaxed);
        woken
    }

    /// True when a forwarder is installed and
    /// [delivers](Forwarder::delivers) other processes' notifications now.
    pub fn forwarder_delivers(&self) -> bool {
        self.forwarder
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|f| f.delivers())
    }

    /// The commands other processes changed (see [`RemoteChanges`]).
    pub(crate) fn changes(&self) -> &RemoteChanges {
        &self.changes
    }

    /// The desktops known to have nothing queued (see [`QuietDevices`]).
    pub(crate) fn quiet(&self) -> &QuietDevices {
        &self.quiet
    }

    /// Wakes every waiter, now and from now on: the process is shutting
    /// down, and a held request answers with what it has at once instead of
    /// waiting (see [`Queue::shut_down`](crate::queue::Queue::shut_down)).
    pub fn close(&self) {
        let all = {
            let mut waiters = self.lock();
            self.closed.store(true, Ordering::SeqCst);
            std::mem::take(&mut *waiters)
        };
        drop(all);
    }

    /// True once [`Signals::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Number of live waiters (for tests and metrics).
    pub fn waiting(&self) -> usize {
        self.lock()
            .values()
            .map(|l| l.iter().filter(|s| !s.is_canceled()).count())
            .sum()
    }
}

/// A future that resolves when its topic is notified. Dropping it unsubscribes.
#[derive(Debug)]
#[must_use = "a subscription does nothing unless awaited"]
pub struct Subscription(oneshot::Receiver<()>);

impl Future for Subscription {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // A dropped registry also wakes the waiter: it must re-check the store.
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn notify_wakes_subscribers_of_that_topic_only() {
        let s = Signals::new();
        let id = CommandId::from_uuid(uuid::Uuid::from_u128(1));
        let other = CommandId::from_uuid(uuid::Uuid::from_u128(2));
        let mut a = s.subscribe(Topic::Command(id));
        let mut b = s.subscribe(Topic::Command(other));
        assert_eq!(s.waiting(), 2);
        assert!((&mut a).now_or_never().is_none());
        s.notify(&Topic::Command(id));
        assert!((&mut a).now_or_never().is_some());
        assert!((&mut b).now_or_never().is_none());
        assert_eq!(s.waiting(), 1);
        s.notify(&Topic::Command(id));
        assert_eq!(
            s.counts(),
            SignalCounts {
                notified: 2,
                woken: 1,
                woken_all: 0
            }
        );
    }

    #[test]
    fn close_wakes_every_waiter_now_and_later() {
        let s = Signals::new();
        let id = CommandId::from_uuid(uuid::Uuid::from_u128(1));
        let mut before = s.subscribe(Topic::Command(id));
        assert!((&mut before).now_or_never().is_none());
        assert!(!s.is_closed());
        s.close();
        assert!(s.is_closed());
        assert!(before.now_or_never().is_some());
        assert!(s.subscribe(Topic::Command(id)).now_or_never().is_some());
        assert_eq!(s.waiting(), 0);
    }

    #[test]
    fn abandoned_subscriptions_are_cleaned_up() {
        let s = Signals::new();
        let id = CommandId::from_uuid(uuid::Uuid::from_u128(1));
        for _ in 0..1000 {
            drop(s.subscribe(Topic::Command(id)));
        }
        let _live = s.subscribe(Topic::Command(id));
        assert_eq!(s.lock().get(&Topic::Command(id)).map(Vec::len), Some(1));
    }

    #[test]
    fn wake_all_wakes_every_topic_once_and_keeps_the_registry_open() {
        let s = Signals::new();
        let a_id = CommandId::from_uuid(uuid::Uuid::from_u128(1));
        let mut a = s.subscribe(Topic::Command(a_id));
        let mut b = s.subscribe(Topic::DeviceWork(
            OwnerId::parse("o").unwrap(),
            DeviceId::parse("d").unwrap(),
        ));
        drop(s.subscribe(Topic::Command(a_id)));
        assert_eq!(s.wake_all(), 2);
        assert_eq!(s.counts().woken_all, 2);
        assert!((&mut a).now_or_never().is_some());
        assert!((&mut b).now_or_never().is_some());
        assert!(!s.is_closed());
        let mut later = s.subscribe(Topic::Command(a_id));
        assert!((&mut later).now_or_never().is_none());
        assert_eq!(s.wake_all(), 1);
    }

    #[test]
    fn forwarder_delivers_only_when_one_says_so() {
        struct Says(bool);
        impl Forwarder for Says {
            fn forward(&self, _: &Topic) {}
            fn delivers(&self) -> bool {
                self.0
            }
        }
        let s = Signals::new();
        assert!(!s.forwarder_delivers());
        s.set_forwarder(Arc::new(Says(false)));
        assert!(!s.forwarder_delivers());
        s.set_forwarder(Arc::new(Says(true)));
        assert!(s.forwarder_delivers());
    }

    #[test]
    fn forwarder_sees_every_notification() {
        struct Count(Mutex<Vec<Topic>>);
        impl Forwarder for Count {
            fn forward(&self, topic: &Topic) {
                self.0.lock().unwrap().push(topic.clone());
            }
        }
        let s = Signals::new();
        let count = Arc::new(Count(Mutex::new(Vec::new())));
        s.set_forwarder(count.clone());
        let id = CommandId::from_uuid(uuid::Uuid::from_u128(3));
        s.notify(&Topic::Command(id));
        s.notify_local(&Topic::Command(id));
        assert_eq!(count.0.lock().unwrap().as_slice(), &[Topic::Command(id)]);
    }
}
