//! Held requests: the one rule for every request that may wait.
//!
//! A relay's long-poll sync and control request, an agent's `wait_seconds`
//! call and a `subscriptions/listen` stream all wait the same way: they
//! subscribe to the [`Topic`]s that can change their answer *before* they
//! look at the store, answer at once when what they see is ready, and
//! otherwise park until a topic fires, the hold's deadline passes, or the
//! periodic re-look finds something written by another process on a shared
//! store. A [`Hold`] says what to wait on and until when; the queue makes
//! them ([`Queue::sync_hold`](crate::queue::Queue::sync_hold),
//! [`Queue::control_hold`](crate::queue::Queue::control_hold),
//! [`Queue::run_hold`](crate::queue::Queue::run_hold)) from its
//! configuration, so every transport, the simulator and embedders follow
//! the same rules. [`Hold::run`] performs one on a runtime's timer; a
//! driver on a virtual clock (the simulator) reads the same fields instead.
//!
//! A hold ends early, with what the look sees, once the queue is shutting
//! down ([`Signals::close`]).

use std::future::Future;
use std::time::Duration;

use crate::signals::{Signals, Subscription, Topic};
use crate::time::{Clock, Sleeper, Timestamp};

/// What a held request waits on, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// A notification on any of these can change the answer.
    pub topics: Vec<Topic>,
    /// The request answers with what it sees by then at the latest.
    pub until: Timestamp,
    /// While it waits it looks again at least this often, for writes made
    /// by another process on the same store (whose notifications may not
    /// arrive).
    pub recheck: Duration,
    /// When a topic fires, answer with the next look whatever it sees (a
    /// relay's held sync and control: the relay then starts afresh), or
    /// answer only once the look is ready (an agent's wait, a listen stream).
    ///
    /// Such a hold that reaches its deadline with no topic fired answers
    /// with what its last look saw, without looking again: the relay's next
    /// request looks at once anyway, and an idle desktop's hold then costs
    /// one look instead of two. Any other hold looks once more at its
    /// deadline, since its caller may not ask again soon.
    pub answer_on_notify: bool,
}

/// What one look at the store found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look<T> {
    /// The answer: the request ends with it.
    Ready(T),
    /// Not yet: the request may go on waiting; this is what it would answer
    /// now if the hold ended.
    NotYet(T),
}

impl<T> Look<T> {
    /// The answer, ready or not.
    pub fn into_inner(self) -> T {
        match self {
            Self::Ready(t) | Self::NotYet(t) => t,
        }
    }
}

/// A hold's topics, subscribed before its request looked at the store
/// itself ([`Hold::watch`]): whatever is notified from then on wakes the
/// hold that [`Hold::run_from`] starts from that look.
#[derive(Debug)]
#[must_use = "a watch does nothing unless a hold runs from it"]
pub struct Watch {
    subscriptions: Vec<Subscription>,
}

impl Hold {
    /// The same hold ending no later than `deadline` (e.g. before a
    /// transport's request timeout would cut it).
    #[must_use]
    pub fn until_at_most(mut self, deadline: Timestamp) -> Self {
        self.until = self.until.min(deadline);
        self
    }

    /// Subscribes to the hold's topics now, for a request that looks at
    /// the store itself before it knows whether it will be held: it hands
    /// what it saw to [`Hold::run_from`] instead of the hold looking again
    /// at once. A change made after this call and before the hold parks is
    /// not lost.
    pub fn watch(&self, signals: &Signals) -> Watch {
        Watch {
            subscriptions: self
                .topics
                .iter()
                .map(|topic| signals.subscribe(topic.clone()))
                .collect(),
        }
    }

    /// Performs the hold: subscribes, looks, and answers as the fields
    /// say, parking on `signals` and `sleeper` in between. `look` is called
    /// at least once and again after every wake-up; it may report progress
    /// of its own as it goes (a listen stream sends each change).
    ///
    /// Time slept on `sleeper` also bounds the hold, so a clock that does
    /// not move (a test's manual clock) cannot hold a request forever.
    pub async fn run<T, E, F, Fut>(
        &self,
        signals: &Signals,
        clock: &dyn Clock,
        sleeper: &dyn Sleeper,
        look: F,
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Look<T>, E>>,
    {
        self.perform(None, signals, clock, sleeper, look).await
    }

    /// [`Hold::run`] whose first look is `first`, made by the request itself
    /// after `watch` subscribed ([`Hold::watch`]): `look` is called only
    /// after a wake-up. A ready `first` answers at once.
    pub async fn run_from<T, E, F, Fut>(
        &self,
        watch: Watch,
        first: Look<T>,
        signals: &Signals,
        clock: &dyn Clock,
        sleeper: &dyn Sleeper,
        look: F,
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Look<T>, E>>,
    {
        self.perform(Some((watch, first)), signals, clock, sleeper, look)
            .await
    }

    async fn perform<T, E, F, Fut>(
        &self,
        mut start: Option<(Watch, Look<T>)>,
        signals: &Signals,
        clock: &dyn Clock,
        sleeper: &dyn Sleeper,
        mut look: F,
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Look<T>, E>>,
    {
        let budget = self.until.since(clock.now());
        let mut slept = Duration::ZERO;
        let mut notified = false;
        loop {
            // Subscribe before looking: a change in between is not lost.
            let (watch, seen) = match start.take() {
                Some(started) => started,
                None => {
                    let watch = self.watch(signals);
                    (watch, look().await?)
                }
            };
            let subscriptions = watch.subscriptions;
            let changed = async move {
                if subscriptions.is_empty() {
                    // Nothing to wait on but time.
                    std::future::pending::<()>().await;
                } else {
                    futures::future::select_all(subscriptions).await;
                }
            };
            let now = clock.now();
            let answer = match seen {
                Look::Ready(answer) => return Ok(answer),
                Look::NotYet(answer)
                    if (notified && self.answer_on_notify)
                        || now >= self.until
                        || slept >= budget
                        || signals.is_closed() =>
                {
                    return Ok(answer);
                }
                Look::NotYet(answer) => answer,
            };
            let pause = self
                .until
                .since(now)
                .min(budget.saturating_sub(slept))
                .min(self.recheck.max(Duration::from_millis(10)));
            match futures::future::select(std::pin::pin!(changed), sleeper.sleep(pause)).await {
                futures::future::Either::Left(_) => notified = true,
                futures::future::Either::Right(_) => {
                    slept += pause;
                    let deadline = clock.now() >= self.until || slept >= budget;
                    if self.answer_on_notify && deadline {
                        return Ok(answer);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::executor::block_on;

    use super::*;
    use crate::ids::CommandId;
    use crate::time::{ManualClock, ThreadSleeper};

    fn topic() -> Topic {
        Topic::Command(CommandId::from_uuid(uuid::Uuid::from_u128(9)))
    }

    fn hold(clock: &ManualClock, wait_ms: u64, answer_on_notify: bool) -> Hold {
        Hold {
            topics: vec![topic()],
            until: clock.now().plus(Duration::from_millis(wait_ms)),
            recheck: Duration::from_millis(wait_ms),
            answer_on_notify,
        }
    }

    #[test]
    fn a_ready_look_answers_at_once() {
        let (signals, clock) = (Signals::new(), ManualClock::new(Timestamp(0)));
        let looks = AtomicUsize::new(0);
        let answer: Result<u32, ()> =
            block_on(
                hold(&clock, 60_000, true).run(&signals, &clock, &ThreadSleeper, || async {
                    looks.fetch_add(1, Ordering::SeqCst);
                    Ok(Look::Ready(7))
                }),
            );
        assert_eq!((answer, looks.into_inner()), (Ok(7), 1));
    }

    #[test]
    fn a_notification_answers_or_looks_again_as_the_hold_says() {
        for answer_on_notify in [true, false] {
            let (signals, clock) = (Signals::new(), ManualClock::new(Timestamp(0)));
            let looks = AtomicUsize::new(0);
            let rule = hold(&clock, 60_000, answer_on_notify);
            let held = rule.run(&signals, &clock, &ThreadSleeper, || async {
                let n = looks.fetch_add(1, Ordering::SeqCst);
                // The third look is the first ready one.
                Ok::<_, ()>(if n >= 2 {
                    Look::Ready(n)
                } else {
                    Look::NotYet(n)
                })
            });
            // Notifies whenever the hold waits, until the hold answers.
            let notifier = async {
                loop {
                    while signals.waiting() == 0 {
                        ThreadSleeper.sleep(Duration::from_millis(1)).await;
                    }
                    signals.notify(&topic());
                    ThreadSleeper.sleep(Duration::from_millis(5)).await;
                }
            };
            let answer = match block_on(futures::future::select(
                std::pin::pin!(held),
                std::pin::pin!(notifier),
            )) {
                futures::future::Either::Left((answer, _)) => answer,
                futures::future::Either::Right(((), _)) => unreachable!("the notifier never ends"),
            };
            let expected = if answer_on_notify { 1 } else { 2 };
            assert_eq!(answer, Ok(expected), "answer_on_notify {answer_on_notify}");
        }
    }

    #[test]
    fn the_hold_ends_at_its_deadline_even_on_a_clock_that_does_not_move() {
        let (signals, clock) = (Signals::new(), ManualClock::new(Timestamp(0)));
        let started = std::time::Instant::now();
        let answer = block_on(hold(&clock, 30, false).run(
            &signals,
            &clock,
            &ThreadSleeper,
            || async { Ok::<_, ()>(Look::NotYet("what it saw")) },
        ));
        assert_eq!(answer, Ok("what it saw"));
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn a_relay_hold_answers_its_deadline_with_its_last_look_and_a_wait_looks_again() {
        for answer_on_notify in [true, false] {
            let (signals, clock) = (Signals::new(), ManualClock::new(Timestamp(0)));
            let looks = AtomicUsize::new(0);
            let answer = block_on(hold(&clock, 30, answer_on_notify).run(
                &signals,
                &clock,
                &ThreadSleeper,
                || async { Ok::<_, ()>(Look::NotYet(looks.fetch_add(1, Ordering::SeqCst))) },
            ));
            let (expected, looked) = if answer_on_notify { (0, 1) } else { (1, 2) };
            assert_eq!(answer, Ok(expected), "answer_on_notify {answer_on_notify}");
            assert_eq!(looks.into_inner(), looked);
        }
    }

    #[test]
    fn a_relay_hold_still_looks_at_each_recheck_before_its_deadline() {
        let (signals, clock) = (Signals::new(), ManualClock::new(Timestamp(0)));
        let mut rule = hold(&clock, 60, true);
        rule.recheck = Duration::from_millis(20);
        let looks = AtomicUsize::new(0);
        let answer = block_on(rule.run(&signals, &clock, &ThreadSleeper, || async {
            Ok::<_, ()>(Look::NotYet(looks.fetch_add(1, Ordering::SeqCst)))
        }));
        // Looks at 0, 20 and 40 ms; the deadline at 60 ms answers with the
        // look at 40 ms.
        assert_eq!(answer, Ok(2));
        assert_eq!(looks.into_inner(), 3);
    }

    #[test]
    fn a_hold_run_from_a_look_starts_with_it_and_keeps_what_was_notified_since() {
        let (signals, clock) = (Signals::new(), ManualClock::new(Timestamp(0)));
        let rule = hold(&clock, 60_000, true);
        let looks = AtomicUsize::new(0);
        let look =
            || async { Ok::<_, ()>(Look::NotYet(10 + looks.fetch_add(1, Ordering::SeqCst))) };
        // A ready first look answers without another.
        let watch = rule.watch(&signals);
        let answer = block_on(rule.run_from(
            watch,
            Look::Ready(1),
            &signals,
            &clock,
            &ThreadSleeper,
            look,
        ));
        assert_eq!((answer, looks.load(Ordering::SeqCst)), (Ok(1), 0));
        // A notification after the watch and before the hold parks wakes
        // it: one look, then the answer (a relay hold answers on notify).
        let watch = rule.watch(&signals);
        signals.notify(&topic());
        let started = std::time::Instant::now();
        let answer = block_on(rule.run_from(
            watch,
            Look::NotYet(2),
            &signals,
            &clock,
            &ThreadSleeper,
            look,
        ));
        assert_eq!((answer, looks.load(Ordering::SeqCst)), (Ok(10), 1));
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn a_closed_registry_ends_every_hold_with_what_it_sees() {
        let (signals, clock) = (Signals::new(), ManualClock::new(Timestamp(0)));
        signals.close();
        let started = std::time::Instant::now();
        let answer = block_on(hold(&clock, 60_000, false).run(
            &signals,
            &clock,
            &ThreadSleeper,
            || async { Ok::<_, ()>(Look::NotYet(3)) },
        ));
        assert_eq!(answer, Ok(3));
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
