//! The server side: each relay request answered by the real queue, and
//! the long polls it holds.

use super::*;

impl World {
    /// The server side of each relay request: the real queue.
    pub(super) fn serve(&mut self, epoch: u64, request: Request) {
        let reply_at = self.after_latency();
        let device = self.device.clone();
        match request {
            Request::Sync(request) => {
                // A long poll subscribes before the look, as the queue's hold
                // does; a request that is never held needs no subscription.
                let held = request.long_poll.then(|| {
                    let hold = self.queue.sync_hold(&device);
                    let subscriptions = self.subscribe(&hold);
                    (hold, subscriptions)
                });
                let answer = match (block_on(self.queue.sync(&device, &request)), held) {
                    (Ok(response), Some((hold, subscriptions))) if response.commands.is_empty() => {
                        self.hold(epoch, HeldKind::Sync(request.project), subscriptions, &hold);
                        return;
                    }
                    (Ok(response), _) => {
                        Ok(response.commands.iter().map(RelayCommand::from).collect())
                    }
                    (Err(e), _) => Err(Refusal::new(Some(e.is_retryable()), e.to_string()).into()),
                };
                self.schedule(reply_at, Event::Answer(epoch, Answer::Sync(answer)));
            }
            Request::Claim { command, execution } => {
                let outcome = block_on(self.desk(&device).claim(&command, &execution));
                self.schedule(
                    reply_at,
                    Event::Answer(epoch, Answer::Claim(command, outcome)),
                );
            }
            Request::Control { command, long_poll } => {
                // A long poll subscribes before the look, as the queue's hold
                // does; how long it holds follows the lease the look reports.
                let subscriptions = long_poll.then(|| {
                    let lease = self.queue.config().lease_long_poll;
                    self.subscribe(&self.queue.control_hold(&command, lease))
                });
                let answer = match (
                    block_on(self.queue.control_renewing(&device, &command)),
                    subscriptions,
                ) {
                    (Ok((a, lease)), Some(subscriptions)) if !a.is_settled() => {
                        let hold = self.queue.control_hold(&command, lease);
                        self.hold(epoch, HeldKind::Control(command), subscriptions, &hold);
                        return;
                    }
                    (Ok((a, _)), _) => Ok(a),
                    (Err(e), _) => Err(Refusal::new(Some(e.is_retryable()), e.to_string())),
                };
                self.schedule(
                    reply_at,
                    Event::Answer(epoch, Answer::Control(command, answer)),
                );
            }
            Request::Progress {
                command,
                execution,
                report,
            } => {
                let outcome = block_on(
                    self.desk(&device)
                        .post_progress(&command, &execution, &report),
                );
                self.schedule(
                    reply_at,
                    Event::Answer(epoch, Answer::ProgressPosted(command, outcome)),
                );
            }
            Request::Post(item) => {
                let outcome = block_on(self.desk(&device).post_report(&item));
                self.schedule(
                    reply_at,
                    Event::Answer(epoch, Answer::Posted(item.command, outcome)),
                );
            }
        }
    }

    /// The in-process relay transport over the real queue: the simulated
    /// server answers claims, reports and progress exactly as an embedded
    /// desktop is answered (its held requests are scheduled here instead).
    fn desk(&self, device: &Device) -> QueueTransport {
        let sleeper = Arc::new(graph_relay_core::time::ThreadSleeper);
        QueueTransport::new(Arc::new(self.queue.clone()), device.clone(), sleeper)
    }

    /// Subscriptions to every topic of `hold`.
    fn subscribe(&self, hold: &Hold) -> Vec<Subscription> {
        let signals = self.queue.signals();
        hold.topics
            .iter()
            .map(|t| signals.subscribe(t.clone()))
            .collect()
    }

    /// Parks a request under `hold` until a topic fires or `hold.until`.
    fn hold(&mut self, epoch: u64, kind: HeldKind, subscriptions: Vec<Subscription>, hold: &Hold) {
        debug_assert!(hold.answer_on_notify, "relay holds answer on notify");
        self.hold_generation += 1;
        let generation = self.hold_generation;
        self.held.push(Held {
            epoch,
            kind,
            subscriptions,
            generation,
        });
        self.schedule(hold.until, Event::HoldExpired { generation });
    }

    /// Answers held requests whose topic was notified.
    pub(super) fn wake_held(&mut self) {
        let mut index = 0;
        while index < self.held.len() {
            let notified = self.held[index]
                .subscriptions
                .iter_mut()
                .any(|s| s.now_or_never().is_some());
            if notified {
                let held = self.held.remove(index);
                self.answer_held(held);
            } else {
                index += 1;
            }
        }
    }

    pub(super) fn answer_held(&mut self, held: Held) {
        let reply_at = self.after_latency();
        let device = self.device.clone();
        let epoch = held.epoch;
        match held.kind {
            HeldKind::Sync(project) => {
                let answer = block_on(self.queue.queued_for(&device, &project))
                    .map(|cs| cs.iter().map(RelayCommand::from).collect())
                    .map_err(|e| SyncFailure::Network(e.to_string()));
                self.schedule(reply_at, Event::Answer(epoch, Answer::Sync(answer)));
            }
            HeldKind::Control(command) => {
                // As the HTTP server does: the held request renewed the lease
                // when it arrived; its answer only looks.
                let answer = block_on(self.queue.peek_control(&device, &command))
                    .map_err(|e| Refusal::new(Some(e.is_retryable()), e.to_string()));
                self.schedule(
                    reply_at,
                    Event::Answer(epoch, Answer::Control(command, answer)),
                );
            }
        }
    }
}
