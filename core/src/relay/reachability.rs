//! When the relay says that the server stopped answering, that it still
//! does not, and that it answers again: the rule behind
//! [`RelayEvent::ServerLost`], [`RelayEvent::StillUnreachable`] and
//! [`RelayEvent::ServerBack`].
//!
//! The evidence is the requests that ask the server for work or for a run's
//! fate: syncs, claims and control requests. Each one either got an answer
//! (any answer, a final refusal included: the server is there) or got none
//! that is usable (no answer at all, a timeout, or a refusal the server or a
//! proxy in front of it says to retry, such as a 503 at its connection cap
//! or a 502 from a load balancer whose backend died). Report and progress
//! posts are left out: a lost one is retried on the next pass, whose sync
//! tells the same story, and a fault injected into them says nothing about
//! the server.
//!
//! An outage is said once when it begins, then at most once per gap that
//! starts at [`FIRST_REPORT_GAP`] and doubles up to [`LONGEST_REPORT_GAP`]:
//! a server restarted in a few seconds costs one line and its return, and a
//! worker whose server is away for a day writes a few hundred lines, not
//! one per retry. Its end is said once, with how long it lasted. The lines come
//! with the attempts themselves, so no timer of its own is needed.

use std::time::Duration;

use super::RelayEvent;
use crate::time::Timestamp;

/// The time from [`RelayEvent::ServerLost`] to the first
/// [`RelayEvent::StillUnreachable`] line; the gap doubles after each.
pub const FIRST_REPORT_GAP: Duration = Duration::from_secs(10);
/// The longest time between two [`RelayEvent::StillUnreachable`] lines.
pub const LONGEST_REPORT_GAP: Duration = Duration::from_secs(300);

/// Whether the server answers, as the relay's requests find it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) enum Reachability {
    /// The last request got an answer (or none was sent yet).
    #[default]
    Answering,
    /// Requests get no answer since `since`.
    Unreachable {
        /// When the first request without an answer ended.
        since: Timestamp,
        /// Requests without an answer so far.
        attempts: u32,
        /// No line before then (after the first attempts).
        quiet_until: Timestamp,
        /// The gap after the next line.
        gap: Duration,
    },
}

impl Reachability {
    /// A request got an answer at `now`: the end of an outage, if one was on.
    #[must_use]
    pub(super) fn answered(&mut self, now: Timestamp) -> Option<RelayEvent> {
        match std::mem::take(self) {
            Reachability::Answering => None,
            Reachability::Unreachable {
                since, attempts, ..
            } => Some(RelayEvent::ServerBack {
                unreachable_for: now.since(since),
                attempts,
            }),
        }
    }

    /// A request got no usable answer at `now`, for `reason`: the line to
    /// show, if this attempt is one to report.
    #[must_use]
    pub(super) fn no_answer(&mut self, reason: &str, now: Timestamp) -> Option<RelayEvent> {
        match self {
            Reachability::Answering => {
                *self = Reachability::Unreachable {
                    since: now,
                    attempts: 1,
                    quiet_until: now.plus(FIRST_REPORT_GAP),
                    gap: FIRST_REPORT_GAP,
                };
                Some(RelayEvent::ServerLost {
                    reason: reason.to_owned(),
                })
            }
            Reachability::Unreachable {
                since,
                attempts,
                quiet_until,
                gap,
            } => {
                *attempts = attempts.saturating_add(1);
                if now < *quiet_until {
                    return None;
                }
                *gap = (*gap * 2).min(LONGEST_REPORT_GAP);
                *quiet_until = now.plus(*gap);
                Some(RelayEvent::StillUnreachable {
                    attempts: *attempts,
                    unreachable_for: now.since(*since),
                    reason: reason.to_owned(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Timestamp = Timestamp(5_000_000);

    fn at(ms: u64) -> Timestamp {
        T0.plus(Duration::from_millis(ms))
    }

    #[test]
    fn an_outage_is_said_once_when_it_begins_and_once_when_it_ends() {
        let mut r = Reachability::default();
        assert_eq!(r.answered(at(0)), None, "answers are not news");
        assert_eq!(
            r.no_answer("connection refused", at(1_000)),
            Some(RelayEvent::ServerLost {
                reason: "connection refused".into()
            })
        );
        // A quick restart: the next attempts are not news.
        for n in 2..=4u64 {
            assert_eq!(r.no_answer("connection refused", at(1_000 * n)), None);
        }
        assert_eq!(
            r.answered(at(7_500)),
            Some(RelayEvent::ServerBack {
                unreachable_for: Duration::from_millis(6_500),
                attempts: 4,
            })
        );
        assert_eq!(r.answered(at(8_000)), None, "the return is said once");
        assert_eq!(
            r.no_answer("reset", at(9_000)),
            Some(RelayEvent::ServerLost {
                reason: "reset".into()
            }),
            "a new outage is said again"
        );
    }

    #[test]
    fn a_long_outage_is_reported_at_doubling_gaps_up_to_five_minutes() {
        let mut r = Reachability::default();
        // An attempt every second for an hour.
        let mut said: Vec<(u32, Duration)> = Vec::new();
        for s in 0..3_600u64 {
            match r.no_answer("down", at(s * 1_000)) {
                Some(RelayEvent::ServerLost { .. }) => said.push((1, Duration::ZERO)),
                Some(RelayEvent::StillUnreachable {
                    attempts,
                    unreachable_for,
                    ..
                }) => said.push((attempts, unreachable_for)),
                Some(other) => panic!("{other:?}"),
                None => {}
            }
        }
        let secs: Vec<u64> = said.iter().map(|(_, d)| d.as_secs()).collect();
        // The loss, then 10 s after it and doubling gaps (20, 40, ...) up
        // to 300 s, then every 300 s.
        assert_eq!(
            &secs[..9],
            &[0, 10, 30, 70, 150, 310, 610, 910, 1210],
            "{secs:?}"
        );
        assert!(
            secs.windows(2).skip(5).all(|w| w[1] - w[0] == 300),
            "{secs:?}"
        );
        assert!(said.len() < 25, "{} lines for an hour", said.len());
        // Each line counts the attempts so far and the time since the first.
        assert!(
            said.iter().all(|(n, d)| u64::from(*n) == d.as_secs() + 1),
            "{said:?}"
        );
        let back = r.answered(at(3_600_000));
        assert_eq!(
            back,
            Some(RelayEvent::ServerBack {
                unreachable_for: Duration::from_secs(3_600),
                attempts: 3_600,
            })
        );
    }
}
