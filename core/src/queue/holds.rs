//! How long a request waits, and on what: the holds of a relay's long-poll
//! sync and control requests and of an agent's `wait_seconds` call.
//!
//! A hold is a value ([`Hold`]) that names the topics it wakes on, when it
//! ends and how often it looks at the store on its own; HTTP, stdio and the
//! simulator only park on it. A held sync ends at a time that varies from
//! hold to hold (the jitter), so desktops that connected together drift
//! apart instead of coming back in bursts; within that spread, held syncs
//! end on a grid of [`SYNC_HOLD_GRID`], so the server answers the ones that
//! time out close together in one wake-up instead of one each.

use super::{
    ControlAnswer, ControlError, Queue, QueueConfig, SyncError, SyncRequest, SyncResponse, sync,
};
use crate::command::CommandRecord;
use crate::hold::{Hold, Look};
use crate::ids::CommandId;
use crate::principal::Device;
use crate::signals::Topic;
use crate::store::{ExternalWrites, StoreError};
use crate::time::{Sleeper, Timestamp};
use std::time::Duration;

/// How often a held request looks at the store on its own when other
/// processes' writes reach this process anyway (see
/// [`Queue::external_writes_fed`]): a safety net, longer than any hold.
pub const FED_RECHECK: Duration = Duration::from_secs(60);

/// The grid on the clock that held syncs end on, where their jitter
/// leaves room: a tenth of a second.
///
/// Thousands of idle desktops time out all the time. Ending each at its
/// own millisecond cost the server a wake-up, and a context switch, per
/// timeout; ending those of one tenth of a second together lets one
/// wake-up answer all of them, and their next syncs arrive together too.
/// At 10,000 desktops and 200 runs/s that took about 5% off the server's
/// CPU per run. The grid is far finer than the jitter (up to 5 s by
/// default), so the holds stay spread over it.
pub const SYNC_HOLD_GRID: Duration = Duration::from_millis(100);

/// How long a sync of `device` made at `now` is held: `long_poll_hold`
/// less its jitter, which is at most a fifth of it, moved to the nearest
/// earlier (else later) point of the [`SYNC_HOLD_GRID`] that keeps it
/// within `long_poll_hold` and its jitter, if there is one.
fn sync_hold_length(config: &QueueConfig, device: &Device, now: Timestamp) -> Duration {
    let most = config.long_poll_jitter.min(config.long_poll_hold / 5);
    let length = config
        .long_poll_hold
        .saturating_sub(jitter(device, now, most));
    // As the jitter itself: less than `most` taken off, never more time.
    let shortest = config.long_poll_hold.saturating_sub(most);
    let allowed = |length: &Duration| *length > shortest && *length <= config.long_poll_hold;
    let end = now.plus(length).0;
    let grid = SYNC_HOLD_GRID.as_millis() as u64;
    let earlier = end - end % grid;
    [earlier, earlier.saturating_add(grid)]
        .into_iter()
        .map(|point| Timestamp(point).since(now))
        .find(allowed)
        .unwrap_or(length)
}

/// A share of `most` that differs from device to device and from instant to
/// instant (a hash of both), so successive holds of one device, and the
/// holds of devices that synced together, end at scattered times.
fn jitter(device: &Device, now: Timestamp, most: Duration) -> Duration {
    use std::hash::{BuildHasher, Hash, Hasher};
    if most.is_zero() {
        return Duration::ZERO;
    }
    let mut hasher = foldhash::fast::FixedState::with_seed(0x6a17).build_hasher();
    device.owner.hash(&mut hasher);
    device.id.hash(&mut hasher);
    now.0.hash(&mut hasher);
    // The top 53 bits as a fraction in [0, 1).
    let fraction = (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64;
    most.mul_f64(fraction)
}

impl Queue {
    /// True when this process learns of every write another process makes
    /// to the store without reading it: the store has no other writer, or
    /// [`Queue::maintain`] watches its marker ([`ExternalWrites`]), or the
    /// signals' forwarder [delivers](crate::signals::Forwarder::delivers)
    /// other processes' notifications. Held requests then wait on
    /// notifications alone (looking again only every [`FED_RECHECK`], a
    /// safety net), instead of every `hold_recheck` / `wait_recheck`, so
    /// thousands of them cost nothing while nothing happens.
    pub fn external_writes_fed(&self) -> bool {
        match self.store.external_writes() {
            ExternalWrites::None | ExternalWrites::Marker => true,
            ExternalWrites::Poll => self.signals.forwarder_delivers(),
        }
    }

    /// The re-look pace of a held request: `polled` when other processes'
    /// writes show only by reading the store, else [`FED_RECHECK`].
    fn recheck(&self, polled: Duration) -> Duration {
        if self.external_writes_fed() {
            FED_RECHECK.max(polled)
        } else {
            polled
        }
    }

    /// How a relay's long-poll sync of `device` is held: until work is
    /// queued for it ([`Topic::DeviceWork`]) or [`QueueConfig::long_poll_hold`]
    /// less up to [`QueueConfig::long_poll_jitter`] passes, looking at the
    /// store every [`QueueConfig::hold_recheck`] (when other processes'
    /// writes show only by reading it); a notification answers at once,
    /// with what is queued (possibly nothing), so the relay starts a fresh
    /// pass.
    pub fn sync_hold(&self, device: &Device) -> Hold {
        let now = self.clock.now();
        let hold = sync_hold_length(&self.config, device, now);
        Hold {
            topics: vec![Topic::DeviceWork(device.owner.clone(), device.id.clone())],
            until: now.plus(hold),
            recheck: self.recheck(self.config.hold_recheck),
            answer_on_notify: true,
        }
    }

    /// How a relay's long-poll control request for `id`, a run holding
    /// `lease` (as [`Queue::control_renewing`] says), is held: until the
    /// command changes ([`Topic::Command`]) or [`QueueConfig::control_hold`]
    /// of the lease passes; a notification answers at once.
    pub fn control_hold(&self, id: &CommandId, lease: Duration) -> Hold {
        Hold {
            topics: vec![Topic::Command(*id)],
            until: self.clock.now().plus(self.config.control_hold(lease)),
            recheck: self.recheck(self.config.hold_recheck),
            answer_on_notify: true,
        }
    }

    /// A relay's sync, held when it asks for long-poll and nothing is
    /// queued: [`Queue::sync`], then (if `request.long_poll` and it found
    /// nothing) the hold of [`Queue::sync_hold`], shaped by `limit` (a
    /// transport cuts it to its own bound), sleeping on `sleeper`. The
    /// answer is what is queued when the hold ends, possibly nothing. The
    /// HTTP relay API and the in-process transport both answer with it.
    ///
    /// The hold subscribes before the sync reads what is queued, and that
    /// read is its first look ([`Hold::run_from`]): an idle held sync reads
    /// the queue once, not twice. When the device's previous look found
    /// nothing and no notification of work for it came since, the first
    /// look is that memory and an idle held sync reads no queue at all
    /// (only while every other process's write reaches this one as a
    /// notification: [`Queue::external_writes_fed`]). A run queued just
    /// before, whose notification was still on its way, wakes the hold,
    /// and that look reads the store, unless it is the one run this queue
    /// queued for the device since: then the look is this queue's current
    /// copy of it, and the run is handed out without a read either.
    pub async fn sync_held(
        &self,
        device: &Device,
        request: &SyncRequest,
        limit: impl FnOnce(Hold) -> Hold,
        sleeper: &dyn Sleeper,
    ) -> Result<SyncResponse, SyncError> {
        if !request.long_poll {
            return self.sync(device, request).await;
        }
        // Subscribed before the sync reads what is queued, so that its read
        // is the hold's first look: work queued after it wakes the hold.
        // (A sync itself notifies no device's work.)
        let hold = limit(self.sync_hold(device));
        let watch = hold.watch(&self.signals);
        let mut response = self
            .sync_looking(device, request, sync::Look::QuietFromMemory)
            .await?;
        if response.commands.is_empty() {
            // The sync is recorded: the desktop long-polls and waits here.
            let _waiting = self.waiting.enter(&device.owner, &device.id);
            let look = |commands: Vec<CommandRecord>| {
                if commands.is_empty() {
                    Look::NotYet(commands)
                } else {
                    Look::Ready(commands)
                }
            };
            let first = look(std::mem::take(&mut response.commands));
            response.commands = hold
                .run_from(
                    watch,
                    first,
                    &self.signals,
                    &*self.clock,
                    sleeper,
                    || async {
                        let commands = self
                            .queued_remembered(device, &request.project, false)
                            .await?;
                        Ok::<_, StoreError>(look(commands))
                    },
                )
                .await?;
        }
        Ok(response)
    }

    /// A relay's control request, held when it asks for long-poll and there
    /// is nothing to say yet: [`Queue::control`] (which renews the lease),
    /// then the hold of [`Queue::control_hold`] for the run's lease shaped
    /// by `limit`, until cancellation is requested or the command ended.
    /// Each look of the hold only reads.
    ///
    /// The hold subscribes before the renewal, and the renewal's answer is
    /// its first look ([`Hold::run_from`]): the renewal read the command
    /// fresh, or wrote it (a renewal wakes no one, so it does not wake this
    /// hold either); a cancel or end written after the subscription wakes
    /// the hold, one written before it is in the renewal's answer.
    pub async fn control_held(
        &self,
        device: &Device,
        id: &CommandId,
        long_poll: bool,
        limit: impl FnOnce(Hold) -> Hold,
        sleeper: &dyn Sleeper,
    ) -> Result<ControlAnswer, ControlError> {
        let watch = long_poll.then(|| {
            self.control_hold(id, self.config.lease_long_poll)
                .watch(&self.signals)
        });
        let (answer, lease) = self.control_renewing(device, id).await?;
        let Some(watch) = watch.filter(|_| !answer.is_settled()) else {
            return Ok(answer);
        };
        let hold = limit(self.control_hold(id, lease));
        hold.run_from(
            watch,
            Look::NotYet(answer),
            &self.signals,
            &*self.clock,
            sleeper,
            || async {
                let answer = self.peek_control(device, id).await?;
                Ok(if answer.is_settled() {
                    Look::Ready(answer)
                } else {
                    Look::NotYet(answer)
                })
            },
        )
        .await
    }

    /// How an agent's wait for run `id` is held: for `wait`, looking again
    /// whenever the command changes and at least every
    /// [`QueueConfig::wait_recheck`], answering once the run is terminal.
    pub fn run_hold(&self, id: &CommandId, wait: Duration) -> Hold {
        self.watch_hold(&[*id], wait)
    }

    /// How a stream watching `ids` is held: for `lifetime`, looking again
    /// whenever one of them changes and at least every
    /// [`QueueConfig::wait_recheck`]; the look says when it is done.
    pub fn watch_hold(&self, ids: &[CommandId], lifetime: Duration) -> Hold {
        Hold {
            topics: ids.iter().map(|id| Topic::Command(*id)).collect(),
            until: self.clock.now().plus(lifetime),
            recheck: self.recheck(self.config.wait_recheck),
            answer_on_notify: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{DeviceId, OwnerId};

    #[test]
    fn held_syncs_end_at_scattered_times_within_the_jitter() {
        let most = Duration::from_secs(5);
        let mut seen = std::collections::BTreeSet::new();
        for n in 0..200u64 {
            let d = Device::new(
                DeviceId::parse(&format!("desk-{}", n % 20)).unwrap(),
                OwnerId::parse("o").unwrap(),
            );
            let j = jitter(&d, Timestamp(1_000 * n), most);
            assert!(j < most, "{j:?}");
            seen.insert(j.as_millis() / 250);
        }
        // 200 holds spread over the 20 quarter-seconds of the window.
        assert_eq!(seen.len(), 20, "{seen:?}");
        let d = Device::new(DeviceId::parse("d").unwrap(), OwnerId::parse("o").unwrap());
        assert_eq!(jitter(&d, Timestamp(7), Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn a_short_hold_loses_at_most_a_fifth_to_the_jitter() {
        let d = Device::new(DeviceId::parse("d").unwrap(), OwnerId::parse("o").unwrap());
        let config = QueueConfig {
            long_poll_hold: Duration::from_secs(2),
            ..QueueConfig::default()
        };
        for n in 0..100 {
            let hold = sync_hold_length(&config, &d, Timestamp(n * 37));
            assert!(hold > Duration::from_millis(1_600) && hold <= Duration::from_secs(2));
        }
        let exact = QueueConfig {
            long_poll_jitter: Duration::ZERO,
            ..QueueConfig::default()
        };
        assert_eq!(
            sync_hold_length(&exact, &d, Timestamp(5)),
            Duration::from_secs(25)
        );
    }

    #[test]
    fn held_syncs_end_on_the_grid_and_those_of_one_tenth_end_together() {
        let config = QueueConfig::default();
        let (hold, most) = (config.long_poll_hold, config.long_poll_jitter);
        let grid = SYNC_HOLD_GRID.as_millis() as u64;
        let mut ends = std::collections::BTreeMap::<u64, usize>::new();
        for n in 0..2_000u64 {
            let d = Device::new(
                DeviceId::parse(&format!("desk-{n}")).unwrap(),
                OwnerId::parse("o").unwrap(),
            );
            // 2,000 desktops syncing over two seconds, one a millisecond.
            let now = Timestamp(1_700_000_000_123 + n);
            let length = sync_hold_length(&config, &d, now);
            assert!(length <= hold && length > hold - most, "{length:?}");
            let end = now.plus(length).0;
            assert_eq!(end % grid, 0, "the hold of {n} ends off the grid");
            *ends.entry(end).or_default() += 1;
        }
        // Spread over the jitter's 5 s (50 tenths), many holds to a tenth.
        assert!(ends.len() > 40, "{}", ends.len());
        assert!(ends.values().all(|&k| k < 200), "{ends:?}");
        assert!(ends.values().any(|&k| k > 20), "{ends:?}");
    }

    #[test]
    fn a_hold_whose_grid_point_is_beyond_its_jitter_ends_exactly() {
        let d = Device::new(DeviceId::parse("d").unwrap(), OwnerId::parse("o").unwrap());
        // A jitter of 10 ms cannot reach back to the grid from most instants.
        let config = QueueConfig {
            long_poll_hold: Duration::from_secs(2),
            long_poll_jitter: Duration::from_millis(10),
            ..QueueConfig::default()
        };
        let now = Timestamp(1_000_050);
        let length = sync_hold_length(&config, &d, now);
        assert!(length > Duration::from_millis(1_990) && length <= Duration::from_secs(2));
        assert_ne!(now.plus(length).0 % 100, 0);
        // No jitter at all: exactly the hold, wherever it ends.
        let exact = QueueConfig {
            long_poll_jitter: Duration::ZERO,
            ..config
        };
        assert_eq!(sync_hold_length(&exact, &d, now), Duration::from_secs(2));
    }
}
