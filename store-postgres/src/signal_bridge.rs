//! Cross-instance wake-ups over `LISTEN`/`NOTIFY`.
//!
//! Each server has its own [`Signals`]: a held request subscribes to a
//! [`Topic`] there, and the queue notifies the topic after a write. With
//! several servers on one database the write may happen on another server.
//! [`SignalBridge`] closes that gap with one dedicated connection per server:
//!
//! * [`SignalForwarder`], installed with [`Signals::set_forwarder`], hands
//!   every local notification to the listener task without blocking (a
//!   bounded queue; when it is full the hint is dropped and counted);
//! * [`SignalListener::run`] `LISTEN`s on [`CHANNEL`], publishes the queued
//!   topics with `pg_notify` (several per statement), and calls
//!   [`Signals::notify_local`] for each notification another server sent.
//!   Its own notifications come back with its own backend process id and
//!   are ignored. If the connection drops it reconnects, with a backoff
//!   from 100 ms up to 5 s.
//!
//! The channel is per database: deployments in different schemas of one
//! database hear each other's topics. That costs a spurious wake-up at most
//! (a woken waiter re-reads its own store and waits again), and only when
//! both use the same owner and device names.
//!
//! Notifications sent while a listener is reconnecting are lost to it:
//! meanwhile held requests re-check the store (500 ms for syncs and
//! control, 1 s for `wait_seconds`), and once it listens again it wakes
//! every held request once ([`Signals::wake_all`]). Hints this server could
//! not publish are made up for by a [`WAKE_ALL`] to the others. See the
//! crate docs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use graph_relay_core::ids::{CommandId, DeviceId, OwnerId};
use graph_relay_core::signals::{Forwarder, Signals};
use tokio::sync::{mpsc, watch};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Notification, Socket};

use graph_relay_core::signals::Topic;

use crate::errors::describe;

/// The notification channel: `LISTEN graph_relay`.
pub const CHANNEL: &str = "graph_relay";

/// The payload that asks every other server to wake all its held requests
/// once ([`Signals::wake_all`]): sent after this server lost hints (its
/// publish queue was full, a publish failed, or it was not connected), so
/// that what those hints were about is looked at anyway. `*` is never a
/// topic's payload.
pub const WAKE_ALL: &str = "*";

/// Topics waiting to be published; beyond this, hints are dropped.
const QUEUE: usize = 4096;
/// Most topics published in one statement.
const BATCH: usize = 256;
/// Backoff between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The payload of `topic`: `w/<owner>/<device>` or `c/<command uuid>`.
pub fn encode_topic(topic: &Topic) -> String {
    match topic {
        Topic::DeviceWork(owner, device) => format!("w/{owner}/{device}"),
        Topic::Command(id) => format!("c/{id}"),
    }
}

/// A payload that is not a topic written by [`encode_topic`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a graph-relay topic: {reason}")]
pub struct TopicDecodeError {
    /// What is wrong with it.
    pub reason: String,
}

/// Parses a payload written by [`encode_topic`]; ids are validated.
pub fn decode_topic(payload: &str) -> Result<Topic, TopicDecodeError> {
    let bad = |reason: String| TopicDecodeError { reason };
    let mut parts = payload.split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("w"), Some(owner), Some(device), None) => Ok(Topic::DeviceWork(
            OwnerId::parse(owner).map_err(|e| bad(e.to_string()))?,
            DeviceId::parse(device).map_err(|e| bad(e.to_string()))?,
        )),
        (Some("c"), Some(id), None, None) => Ok(Topic::Command(
            CommandId::parse(id).map_err(|e| bad(e.to_string()))?,
        )),
        _ => Err(bad(format!(
            "expected `w/<owner>/<device>` or `c/<command id>`, got {} bytes",
            payload.len()
        ))),
    }
}

/// Counters of one [`SignalBridge`], for tests and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SignalStats {
    /// Topics published with `pg_notify`.
    pub published: u64,
    /// Notifications from other servers, applied to the local waiters.
    pub received: u64,
    /// This server's own notifications, come back and ignored.
    pub own: u64,
    /// Hints dropped: the publish queue was full, or a publish failed.
    pub dropped: u64,
    /// Notifications on the channel that were not topics.
    pub malformed: u64,
    /// Connections made (the first one and every reconnection).
    pub connects: u64,
    /// [`WAKE_ALL`] requests published (after hints were lost here).
    pub wake_alls_sent: u64,
    /// [`WAKE_ALL`] requests received from other servers, and reconnections
    /// of this listener: each woke every local held request once.
    pub wake_alls: u64,
}

#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    received: AtomicU64,
    own: AtomicU64,
    dropped: AtomicU64,
    malformed: AtomicU64,
    connects: AtomicU64,
    wake_alls_sent: AtomicU64,
    wake_alls: AtomicU64,
}

/// State shared by the forwarder, the listener and the status handles.
#[derive(Debug)]
struct Shared {
    counters: Counters,
    /// Backend process id of the listening connection; 0 while not listening.
    pid: AtomicI32,
    listening: watch::Sender<bool>,
    /// A hint was dropped since the last [`WAKE_ALL`] was published.
    lost: AtomicBool,
}

impl Shared {
    fn count(&self, field: impl Fn(&Counters) -> &AtomicU64, n: u64) {
        field(&self.counters).fetch_add(n, Ordering::Relaxed);
    }

    /// `n` hints could not be published: counted, and the other servers
    /// will be asked to wake everything once this server can publish.
    fn drop_hints(&self, n: u64) {
        self.count(|c| &c.dropped, n);
        self.lost.store(true, Ordering::Release);
    }

    fn set_listening(&self, pid: Option<i32>) {
        self.pid.store(pid.unwrap_or(0), Ordering::Release);
        self.listening.send_replace(pid.is_some());
    }
}

/// The wake-up bridge of one server: a forwarder for its [`Signals`] and
/// the listener task that owns the dedicated connection.
///
/// Either [`install`](Self::install) it (inside a Tokio runtime), or take it
/// apart with [`into_parts`](Self::into_parts) and run the listener yourself.
pub struct SignalBridge<T> {
    forwarder: Arc<SignalForwarder>,
    listener: SignalListener<T>,
}

impl<T> std::fmt::Debug for SignalBridge<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalBridge").finish_non_exhaustive()
    }
}

impl<T> SignalBridge<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    /// A bridge for `signals` over connections made from `config` with `tls`.
    /// Nothing connects until the listener runs.
    pub fn new(config: tokio_postgres::Config, tls: T, signals: Arc<Signals>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let shared = Arc::new(Shared {
            counters: Counters::default(),
            pid: AtomicI32::new(0),
            listening: watch::Sender::new(false),
            lost: AtomicBool::new(false),
        });
        Self {
            forwarder: Arc::new(SignalForwarder {
                tx,
                shared: shared.clone(),
            }),
            listener: SignalListener {
                config,
                tls,
                signals,
                rx,
                shared,
            },
        }
    }

    /// A status handle.
    pub fn status(&self) -> SignalStatus {
        SignalStatus(self.listener.shared.clone())
    }

    /// The forwarder, the listener and a status handle.
    pub fn into_parts(self) -> (Arc<SignalForwarder>, SignalListener<T>, SignalStatus) {
        let status = self.status();
        (self.forwarder, self.listener, status)
    }

    /// Installs the forwarder on the signals and spawns the listener on the
    /// current Tokio runtime (panics outside one, like `tokio::spawn`).
    pub fn install(self) -> SignalBridgeHandle {
        let (forwarder, listener, status) = self.into_parts();
        listener.signals.set_forwarder(forwarder);
        SignalBridgeHandle {
            task: tokio::spawn(listener.run()),
            status,
        }
    }
}

/// Publishes local notifications to the other servers (through the listener
/// task's connection). Never blocks.
#[derive(Debug)]
pub struct SignalForwarder {
    tx: mpsc::Sender<String>,
    shared: Arc<Shared>,
}

impl Forwarder for SignalForwarder {
    fn forward(&self, topic: &Topic) {
        if self.tx.try_send(encode_topic(topic)).is_err() {
            // Full (the database is slow or gone) or stopped: a hint lost,
            // made up for by a wake-all once the listener publishes again.
            self.shared.drop_hints(1);
        }
    }

    /// True while the listener listens: every other server's hint then
    /// arrives here (a reconnection wakes everything, see the module docs).
    fn delivers(&self) -> bool {
        *self.shared.listening.borrow()
    }
}

/// The task that owns the dedicated connection: listens, publishes,
/// reconnects. Run it with [`run`](Self::run).
pub struct SignalListener<T> {
    config: tokio_postgres::Config,
    tls: T,
    signals: Arc<Signals>,
    rx: mpsc::Receiver<String>,
    shared: Arc<Shared>,
}

impl<T> std::fmt::Debug for SignalListener<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalListener").finish_non_exhaustive()
    }
}

impl<T> SignalListener<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    /// Listens until the task is dropped or aborted, reconnecting as needed.
    /// From the moment it is dropped or aborted it no longer counts as
    /// listening (the forwarder stops [delivering](Forwarder::delivers)).
    pub async fn run(mut self) {
        let mut backoff = BACKOFF_MIN;
        let mut failing = false;
        loop {
            let outcome = self.session(&mut backoff, &mut failing).await;
            self.shared.set_listening(None);
            match outcome {
                Ok(()) => tracing::warn!("postgres wake-ups: connection closed; reconnecting"),
                Err(e) if !failing => {
                    tracing::warn!(error = %e, "postgres wake-ups: connection lost; reconnecting");
                    failing = true;
                }
                Err(e) => tracing::debug!(error = %e, "postgres wake-ups: reconnect failed"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One connection's life: returns when it ends.
    async fn session(&mut self, backoff: &mut Duration, failing: &mut bool) -> Result<(), String> {
        let (client, driver, mut incoming) = self.connect().await?;
        let _abort = AbortOnDrop(driver.abort_handle());
        let pid = self.listen(&client).await?;
        // Not listening once this session ends, also when the task running
        // it is aborted or dropped mid-way.
        let _listening = ListeningUntilDrop(self.shared.clone());
        self.listening_again(backoff, failing);
        let publish = client
            .prepare("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
            .await
            .map_err(|e| describe(&e))?;
        self.publish_wake_all_if_lost(&client).await?;
        let mut forwarders_gone = false;
        loop {
            tokio::select! {
                note = incoming.recv() => match note {
                    Some(n) => self.apply(&n, pid),
                    None => return match driver.is_finished() {
                        true => Err("the connection ended".into()),
                        false => Ok(()),
                    },
                },
                first = self.rx.recv(), if !forwarders_gone => match first {
                    Some(first) => self.publish(&client, &publish, first).await?,
                    None => forwarders_gone = true,
                },
            }
        }
    }

    /// A new connection, its driver (which ends with the connection's
    /// error, if any) and the notifications the driver passes on.
    async fn connect(
        &self,
    ) -> Result<
        (
            tokio_postgres::Client,
            tokio::task::JoinHandle<Result<(), String>>,
            mpsc::UnboundedReceiver<Notification>,
        ),
        String,
    > {
        let (client, mut connection) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(|e| describe(&e))?;
        let (notes, incoming) = mpsc::unbounded_channel::<Notification>();
        let driver = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        if notes.send(n).is_err() {
                            return Ok(());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => return Err(describe(&e)),
                }
            }
            Ok(())
        });
        Ok((client, driver, incoming))
    }

    /// Listens on `client` and counts it as listening: returns the
    /// connection's backend pid (its own notifications carry it).
    async fn listen(&self, client: &tokio_postgres::Client) -> Result<i32, String> {
        client
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .await
            .map_err(|e| describe(&e))?;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(|e| describe(&e))?
            .get(0);
        self.shared.count(|c| &c.connects, 1);
        self.shared.set_listening(Some(pid));
        Ok(pid)
    }

    /// Once listening: after a reconnection, wakes every local held
    /// request; ends a spell of failures and resets the backoff.
    fn listening_again(&self, backoff: &mut Duration, failing: &mut bool) {
        if self.shared.counters.connects.load(Ordering::Relaxed) > 1 {
            // Other servers' hints sent while this listener was away are
            // lost: every local held request looks once.
            self.shared.count(|c| &c.wake_alls, 1);
            self.signals.wake_all();
        }
        if *failing {
            tracing::info!("postgres wake-ups: listening again");
            *failing = false;
        }
        *backoff = BACKOFF_MIN;
    }

    /// Publishes `first` and the hints queued behind it (up to [`BATCH`],
    /// each once) with `publish`, then [`WAKE_ALL`] if hints were lost.
    async fn publish(
        &mut self,
        client: &tokio_postgres::Client,
        publish: &tokio_postgres::Statement,
        first: String,
    ) -> Result<(), String> {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match self.rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        batch.sort_unstable();
        batch.dedup();
        let n = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        if let Err(e) = client.execute(publish, &[&CHANNEL, &batch]).await {
            self.shared.drop_hints(n);
            return Err(describe(&e));
        }
        self.shared.count(|c| &c.published, n);
        self.publish_wake_all_if_lost(client).await
    }

    /// Publishes [`WAKE_ALL`] if hints were lost since the last one.
    async fn publish_wake_all_if_lost(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<(), String> {
        if !self.shared.lost.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        if let Err(e) = client
            .execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &WAKE_ALL])
            .await
        {
            self.shared.lost.store(true, Ordering::Release);
            return Err(describe(&e));
        }
        self.shared.count(|c| &c.wake_alls_sent, 1);
        Ok(())
    }

    fn apply(&self, n: &Notification, own_pid: i32) {
        if n.channel() != CHANNEL {
            return;
        }
        if n.process_id() == own_pid {
            self.shared.count(|c| &c.own, 1);
            return;
        }
        // Counted once delivered: whoever sees a count sees its wake-ups.
        if n.payload() == WAKE_ALL {
            self.signals.wake_all();
            self.shared.count(|c| &c.wake_alls, 1);
            return;
        }
        match decode_topic(n.payload()) {
            Ok(topic) => {
                self.signals.notify_local(&topic);
                self.shared.count(|c| &c.received, 1);
            }
            Err(e) => {
                self.shared.count(|c| &c.malformed, 1);
                tracing::debug!(error = %e, "postgres wake-ups: ignored a notification");
            }
        }
    }
}

/// Marks the bridge not listening when a session ends, however it ends.
struct ListeningUntilDrop(Arc<Shared>);

impl Drop for ListeningUntilDrop {
    fn drop(&mut self) {
        self.0.set_listening(None);
    }
}

/// Aborts the connection driver when a session ends.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Observes a [`SignalBridge`]: whether it listens, and its counters.
#[derive(Debug, Clone)]
pub struct SignalStatus(Arc<Shared>);

impl SignalStatus {
    /// Whether the listener is connected and listening now.
    pub fn listening(&self) -> bool {
        *self.0.listening.borrow()
    }

    /// Backend process id of the listening connection, while listening.
    pub fn backend_pid(&self) -> Option<i32> {
        match self.0.pid.load(Ordering::Acquire) {
            0 => None,
            pid => Some(pid),
        }
    }

    /// Waits until the listener listens, at most `timeout`; returns whether it does.
    pub async fn wait_listening(&self, timeout: Duration) -> bool {
        let mut rx = self.0.listening.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|l| *l))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The counters now.
    pub fn stats(&self) -> SignalStats {
        let c = &self.0.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SignalStats {
            published: get(&c.published),
            received: get(&c.received),
            own: get(&c.own),
            dropped: get(&c.dropped),
            malformed: get(&c.malformed),
            connects: get(&c.connects),
            wake_alls_sent: get(&c.wake_alls_sent),
            wake_alls: get(&c.wake_alls),
        }
    }
}

/// A running listener, from [`SignalBridge::install`]. Dropping the handle
/// leaves it running; [`stop`](Self::stop) ends it.
#[derive(Debug)]
pub struct SignalBridgeHandle {
    task: tokio::task::JoinHandle<()>,
    status: SignalStatus,
}

impl SignalBridgeHandle {
    /// Its status.
    pub fn status(&self) -> &SignalStatus {
        &self.status
    }

    /// Stops listening (the forwarder then drops every hint, and no longer
    /// [delivers](graph_relay_core::signals::Forwarder::delivers), so held
    /// requests go back to looking at the store every recheck).
    pub fn stop(self) {
        self.task.abort();
        self.status.0.set_listening(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_round_trip_through_payloads() {
        let owner = OwnerId::parse("alice@example.com").expect("owner");
        let device = DeviceId::parse("desk:1.local").expect("device");
        let id = CommandId::from_uuid(uuid::Uuid::from_u128(0xabc));
        for topic in [Topic::DeviceWork(owner, device), Topic::Command(id)] {
            let payload = encode_topic(&topic);
            assert_eq!(decode_topic(&payload), Ok(topic));
        }
        assert_eq!(
            encode_topic(&Topic::Command(id)),
            "c/00000000-0000-0000-0000-000000000abc"
        );
    }

    #[test]
    fn foreign_payloads_are_refused() {
        for bad in [
            "",
            "w/alice",
            "w/alice/desk/extra",
            "c/not-a-uuid",
            "x/alice/desk",
            "w//desk",
            "c/00000000-0000-0000-0000-000000000abc/1",
        ] {
            assert!(decode_topic(bad).is_err(), "{bad:?}");
        }
    }
}
