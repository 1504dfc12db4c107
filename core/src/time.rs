//! Time and randomness as inputs.
//!
//! The core never reads the wall clock or an entropy source directly: it asks
//! a [`Clock`] and an [`IdSource`]. [`SystemClock`] and [`RandomIds`] are the
//! production choices; [`ManualClock`] and [`SeededIds`] make runs
//! reproducible in tests and in the simulator.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::CommandId;

/// Milliseconds since the Unix epoch.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// This instant plus `d`, saturating.
    #[must_use]
    pub fn plus(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// This instant minus `d`, saturating at the epoch.
    #[must_use]
    pub fn minus(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// RFC 3339 in UTC with millisecond precision, e.g. `2026-11-30T06:48:47.123Z`.
    /// The year has four digits up to 9999 and as many as it needs after.
    pub fn to_rfc3339(self) -> String {
        let secs = self.0 / 1000;
        let millis = self.0 % 1000;
        let days = secs / 86_400;
        let rem = secs % 86_400;
        let (year, month, day) = civil_from_days(days as i64);
        let (hour, minute, second) = (rem / 3600, (rem % 3600) / 60, rem % 60);
        let year = match u64::try_from(year) {
            Ok(year) if year <= 9999 => year,
            _ => {
                return format!(
                    "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millis:03}Z"
                );
            }
        };
        // Written by hand into a fixed buffer: `format!` cost ten times as
        // much, and every run a client reads carries a few of these.
        let mut text = *b"0000-00-00T00:00:00.000Z";
        let digits = |out: &mut [u8], mut value: u64| {
            for slot in out.iter_mut().rev() {
                // A digit: `value % 10` is below 10.
                *slot = b'0' + (value % 10) as u8;
                value /= 10;
            }
        };
        digits(&mut text[0..4], year);
        digits(&mut text[5..7], u64::from(month));
        digits(&mut text[8..10], u64::from(day));
        digits(&mut text[11..13], hour);
        digits(&mut text[14..16], minute);
        digits(&mut text[17..19], second);
        digits(&mut text[20..23], millis);
        // ASCII digits and separators: always UTF-8.
        std::str::from_utf8(&text).map_or_else(|_| String::new(), str::to_owned)
    }
}

/// Converts days since 1970-01-01 to a (year, month, day) civil date
/// (Howard Hinnant's algorithm, proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({})", self.to_rfc3339())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

/// The one way the core learns the time.
pub trait Clock: Send + Sync {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The wall clock. The only place in the core that reads system time.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to; shareable across threads.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self(AtomicU64::new(start.0))
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// Sets the clock to `t` (it may move backwards; the core tolerates that).
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

/// A timer supplied by the runtime that drives the core (tokio, a test
/// executor, a simulator). The core never sleeps on its own.
pub trait Sleeper: Send + Sync {
    /// A future that resolves after `duration`.
    fn sleep(&self, duration: Duration) -> futures::future::BoxFuture<'static, ()>;
}

/// A [`Sleeper`] that needs no async runtime: one timer thread, started on
/// first use and shared by every sleeper, wakes each sleeping future at its
/// deadline. For embedders that drive the core with
/// `futures::executor::block_on` or an executor without a timer; with
/// tokio use its timer instead. Like [`SystemClock`], the other place in
/// the core that reads the system's time.
///
/// ```
/// use std::time::Duration;
/// use graph_relay_core::time::{Sleeper, ThreadSleeper};
/// let started = std::time::Instant::now();
/// futures::executor::block_on(ThreadSleeper.sleep(Duration::from_millis(20)));
/// assert!(started.elapsed() >= Duration::from_millis(20));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ThreadSleeper;

/// A sleeper waiting on the timer thread: its deadline, a tie-break, and
/// how to wake it.
type Alarm = (
    std::time::Instant,
    u64,
    futures::channel::oneshot::Sender<()>,
);

/// The timer thread's mailbox, once it runs.
fn timer() -> Option<&'static std::sync::Mutex<std::sync::mpsc::Sender<Alarm>>> {
    static TIMER: std::sync::OnceLock<Option<std::sync::Mutex<std::sync::mpsc::Sender<Alarm>>>> =
        std::sync::OnceLock::new();
    TIMER
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Alarm>();
            std::thread::Builder::new()
                .name("graph-relay-timer".into())
                .spawn(move || run_timer(&rx))
                .ok()
                .map(|_| std::sync::Mutex::new(tx))
        })
        .as_ref()
}

/// Wakes each alarm at its deadline, earliest first, until every sender is gone.
fn run_timer(alarms: &std::sync::mpsc::Receiver<Alarm>) {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut due: BinaryHeap<Reverse<(std::time::Instant, u64)>> = BinaryHeap::new();
    let mut wakers = std::collections::HashMap::new();
    loop {
        let now = std::time::Instant::now();
        while let Some(Reverse((at, seq))) = due.peek().copied() {
            if at > now {
                break;
            }
            due.pop();
            if let Some(waker) = wakers.remove(&seq) {
                let _ = futures::channel::oneshot::Sender::send(waker, ());
            }
        }
        let next = match due.peek() {
            Some(Reverse((at, _))) => alarms.recv_timeout(at.saturating_duration_since(now)),
            None => alarms
                .recv()
                .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected),
        };
        match next {
            Ok((at, seq, waker)) => {
                due.push(Reverse((at, seq)));
                wakers.insert(seq, waker);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

impl Sleeper for ThreadSleeper {
    fn sleep(&self, duration: Duration) -> futures::future::BoxFuture<'static, ()> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let (tx, rx) = futures::channel::oneshot::channel();
        let deadline = std::time::Instant::now() + duration;
        let sent = timer().is_some_and(|t| {
            t.lock()
                .unwrap_or_else(|p| p.into_inner())
                .send((deadline, SEQ.fetch_add(1, Ordering::Relaxed), tx))
                .is_ok()
        });
        Box::pin(async move {
            if sent {
                // A timer gone (the process is ending) wakes it too.
                let _ = rx.await;
            } else {
                // No timer thread could be started: sleep on this thread.
                std::thread::sleep(deadline.saturating_duration_since(std::time::Instant::now()));
            }
        })
    }
}

/// Where new command ids come from.
pub trait IdSource: Send + Sync {
    /// A fresh command id, never returned before by this source.
    fn new_command_id(&self) -> CommandId;
}

/// Time-ordered version-7 UUIDs (RFC 9562): 48 bits of Unix milliseconds
/// from the system clock, then random bits from the operating system's
/// generator, increasing within this process even inside one millisecond.
///
/// Ids made one after another sort one after another, so a store's index
/// on the id takes new entries at its end (a few hot pages) instead of at
/// random places all over a large file. The id is as hard to guess as a
/// version-4 one (74 random bits against 122 at the same millisecond), and
/// it reveals when the command was created, which `get_graph_run` tells its
/// owner anyway.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomIds;

impl IdSource for RandomIds {
    fn new_command_id(&self) -> CommandId {
        CommandId::from_uuid(uuid::Uuid::now_v7())
    }
}

/// Deterministic version-4-shaped UUIDs from a seed (splitmix64), for
/// reproducible tests and simulations.
#[derive(Debug)]
pub struct SeededIds(AtomicU64);

impl SeededIds {
    /// A source whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Self(AtomicU64::new(seed))
    }
}

/// One step of splitmix64 from `state`.
pub(crate) fn splitmix64(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl IdSource for SeededIds {
    fn new_command_id(&self) -> CommandId {
        let n = self.0.fetch_add(2, Ordering::SeqCst);
        let hi = splitmix64(n).to_be_bytes();
        let lo = splitmix64(n.wrapping_add(1)).to_be_bytes();
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&hi);
        bytes[8..].copy_from_slice(&lo);
        CommandId::from_uuid(uuid::Builder::from_random_bytes(bytes).into_uuid())
    }
}

impl<S: IdSource + ?Sized> IdSource for std::sync::Arc<S> {
    fn new_command_id(&self) -> CommandId {
        (**self).new_command_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Timestamp::to_rfc3339` as it was first written, with `format!`.
    fn rfc3339_by_format(t: Timestamp) -> String {
        let secs = t.0 / 1000;
        let millis = t.0 % 1000;
        let days = secs / 86_400;
        let rem = secs % 86_400;
        let (year, month, day) = civil_from_days(days as i64);
        format!(
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60
        )
    }

    #[test]
    fn rfc3339_written_by_hand_matches_format() {
        assert_eq!(
            Timestamp(1_767_225_600_123).to_rfc3339(),
            "2026-01-01T00:00:00.123Z"
        );
        // Year 9999's last millisecond, then five-digit years.
        let last_four_digit_year = 253_402_300_799_999;
        assert_eq!(
            Timestamp(last_four_digit_year).to_rfc3339(),
            "9999-12-31T23:59:59.999Z"
        );
        assert_eq!(
            Timestamp(last_four_digit_year + 1).to_rfc3339(),
            "10000-01-01T00:00:00.000Z"
        );
        let mut samples = vec![
            0,
            999,
            1000,
            86_399_999,
            86_400_000,
            951_782_400_000, // 2000-02-29
            last_four_digit_year,
            last_four_digit_year + 1,
            u64::MAX,
        ];
        let mut state = 7_u64;
        for _ in 0..20_000 {
            state = splitmix64(state);
            samples.push(state % (last_four_digit_year + 10_000_000_000));
        }
        for t in samples {
            assert_eq!(
                Timestamp(t).to_rfc3339(),
                rfc3339_by_format(Timestamp(t)),
                "{t}"
            );
        }
    }

    #[test]
    fn the_thread_sleeper_wakes_every_sleeper_once_its_deadline_passed() {
        use std::sync::{Arc, Mutex};
        let woke = Arc::new(Mutex::new(Vec::new()));
        let started = std::time::Instant::now();
        let sleeps = [60u64, 10, 30, 0].map(|ms| {
            let woke = woke.clone();
            let sleep = ThreadSleeper.sleep(Duration::from_millis(ms));
            async move {
                sleep.await;
                assert!(started.elapsed() >= Duration::from_millis(ms));
                woke.lock().unwrap().push(ms);
            }
        });
        // One sleeper given up early costs nothing and wakes no one.
        drop(ThreadSleeper.sleep(Duration::from_millis(5)));
        futures::executor::block_on(futures::future::join_all(sleeps));
        let mut order = woke.lock().unwrap().clone();
        assert_eq!(order.len(), 4);
        order.sort_unstable();
        assert_eq!(order, vec![0, 10, 30, 60]);
    }

    #[test]
    fn rfc3339_formatting() {
        assert_eq!(Timestamp(0).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            Timestamp(1_796_021_327_123).to_rfc3339(),
            "2026-11-30T06:48:47.123Z"
        );
        assert_eq!(
            Timestamp(951_782_400_000).to_rfc3339(),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn seeded_ids_are_reproducible_and_distinct() {
        let a = SeededIds::new(7);
        let b = SeededIds::new(7);
        let xs: Vec<_> = (0..100).map(|_| a.new_command_id()).collect();
        let ys: Vec<_> = (0..100).map(|_| b.new_command_id()).collect();
        assert_eq!(xs, ys);
        let unique: std::collections::HashSet<_> = xs.iter().collect();
        assert_eq!(unique.len(), 100);
        assert_eq!(xs[0].as_uuid().get_version_num(), 4);
    }

    #[test]
    fn random_ids_are_version_7_and_increase() {
        let ids: Vec<_> = (0..1000).map(|_| RandomIds.new_command_id()).collect();
        assert!(ids.iter().all(|id| id.as_uuid().get_version_num() == 7));
        // Strictly increasing, also within one millisecond.
        assert!(ids.windows(2).all(|w| w[0].as_uuid() < w[1].as_uuid()));
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(Timestamp(1000));
        assert_eq!(c.now(), Timestamp(1000));
        c.advance(Duration::from_secs(2));
        assert_eq!(c.now(), Timestamp(3000));
    }
}
