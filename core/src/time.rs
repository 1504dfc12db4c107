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
    pub fn to_rfc3339(self) -> String {
        let secs = self.0 / 1000;
        let millis = self.0 % 1000;
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

/// Where new command ids come from.
pub trait IdSource: Send + Sync {
    /// A fresh command id, never returned before by this source.
    fn new_command_id(&self) -> CommandId;
}

/// Random version-4 UUIDs from the operating system's generator.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomIds;

impl IdSource for RandomIds {
    fn new_command_id(&self) -> CommandId {
        CommandId::from_uuid(uuid::Uuid::new_v4())
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
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(Timestamp(1000));
        assert_eq!(c.now(), Timestamp(1000));
        c.advance(Duration::from_secs(2));
        assert_eq!(c.now(), Timestamp(3000));
    }
}
