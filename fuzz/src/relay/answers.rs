//! The steps of the world: the answers the relay gets, and what the
//! desktop, the agent and the owner do meanwhile.

use super::*;

impl RelayFuzz {
    /// The sync in flight gets its answer (or is lost on the way).
    pub(super) fn answer_sync(&mut self, commands: Vec<(u8, u8, bool)>, failure: u8) {
        let Self {
            relay,
            server,
            flight,
            now,
            ..
        } = self;
        let now = *now;
        let Some((project, sessions, restarted, running)) = flight.sync.take() else {
            return;
        };
        // 1: lost before the server; 2: refused; 3: reached the
        // server, answer lost; else answered.
        let arrived = !matches!(failure % 4, 1 | 2);
        if arrived {
            if sessions.is_empty() {
                server.shares.remove(&project);
            } else {
                server.shares.insert(project.clone());
            }
            if restarted {
                server.close_running_after_restart(running, now);
            }
        }
        let answer = match failure % 4 {
            1 | 3 => Err(SyncFailure::Network("down".into())),
            2 => Err(SyncFailure::Refused("403".into())),
            _ => {
                let mut handed = Vec::new();
                for (id, n, renamed) in commands.into_iter().take(6) {
                    let id = command_id(id);
                    let c = server
                        .offered
                        .get(&id)
                        .cloned()
                        .unwrap_or_else(|| RelayCommand {
                            id,
                            project: project.clone(),
                            graph_session_id: GraphSessionId::clone(&session(n).graph_session_id),
                            arguments: Default::default(),
                            slug: if renamed {
                                "renamed".into()
                            } else {
                                session(n).slug.to_string()
                            },
                            agent: None,
                        });
                    // Only this project's queued commands, each once.
                    if c.project != project || handed.iter().any(|h: &RelayCommand| h.id == id) {
                        continue;
                    }
                    match server.state(&id, now) {
                        None | Some(ServerState::Queued) => {}
                        _ => continue,
                    }
                    server.offered.entry(id).or_insert_with(|| c.clone());
                    // A queued run of a session this sync does not share
                    // (under its slug) ends here with the re-check error.
                    let still = sessions
                        .iter()
                        .any(|s| s.graph_session_id == c.graph_session_id && *s.slug == *c.slug);
                    if still {
                        server.commands.insert(id, ServerState::Queued);
                        handed.push(c);
                    } else {
                        server
                            .commands
                            .insert(id, ServerState::Closed(Closed::BeforeStart));
                    }
                }
                Ok(handed)
            }
        };
        relay.handle_sync_response(answer, now);
    }

    /// The claim in flight gets its answer.
    pub(super) fn answer_claim(&mut self, o: u8) {
        let Self {
            relay,
            server,
            flight,
            now,
            ..
        } = self;
        let now = *now;
        let Some((command, execution)) = flight.claim.take() else {
            return;
        };
        let state = server.state(&command, now);
        let outcome = match (o % 4, state) {
            (3, _) => ClaimOutcome::Network("timeout".into()),
            (1, Some(ServerState::Queued)) => {
                // The agent cancelled it meanwhile.
                server
                    .commands
                    .insert(command, ServerState::Closed(Closed::BeforeStart));
                ClaimOutcome::Refused("cancelled".into())
            }
            (_, Some(ServerState::Queued)) => {
                server.commands.insert(
                    command,
                    ServerState::Running {
                        execution: execution.clone(),
                        lease_until: now.plus(server.lease),
                        cancel: false,
                    },
                );
                ClaimOutcome::Granted
            }
            (_, Some(ServerState::Running { execution: e, .. })) if e == execution => {
                ClaimOutcome::Granted
            }
            _ => ClaimOutcome::Refused("start_refused".into()),
        };
        relay.handle_claim_response(command, outcome, now);
    }

    /// The oldest control request in flight gets its answer; a running command's lease is renewed.
    pub(super) fn answer_control(&mut self, o: u8) {
        let Self {
            relay,
            server,
            flight,
            seen,
            now,
            ..
        } = self;
        let now = *now;
        if flight.controls.is_empty() {
            return;
        }
        let command = flight.controls.remove(0);
        let answer = if o % 3 == 2 {
            Err(graph_relay_core::relay::Refusal::no_answer("timeout"))
        } else {
            let state = server.state(&command, now);
            let lease = server.lease;
            match server.commands.get_mut(&command) {
                // The request renews the lease of a running command.
                Some(ServerState::Running {
                    lease_until,
                    cancel,
                    ..
                }) => {
                    *lease_until = now.plus(lease);
                    *cancel |= o % 3 == 1;
                    Ok(graph_relay_core::queue::ControlAnswer {
                        cancel_requested: *cancel,
                        status: graph_relay_core::command::CommandStatus::Running,
                    })
                }
                _ => Ok(graph_relay_core::queue::ControlAnswer {
                    cancel_requested: false,
                    status: match state {
                        Some(ServerState::Queued) | None => {
                            graph_relay_core::command::CommandStatus::Queued
                        }
                        _ => graph_relay_core::command::CommandStatus::Failed,
                    },
                }),
            }
        };
        if let Ok(a) = &answer
            && a.status.is_terminal()
            && seen.running.as_ref().is_some_and(|(c, _)| *c == command)
        {
            seen.told_closed.insert(command);
        }
        relay.handle_control_response(command, answer, now);
    }

    /// The agent cancels the command running on the server.
    pub(super) fn agent_cancels(&mut self) {
        let Self { server, seen, .. } = self;
        if let Some((command, _)) = &seen.running
            && let Some(ServerState::Running { cancel, .. }) = server.commands.get_mut(command)
        {
            *cancel = true;
        }
    }

    /// The running execution ends.
    pub(super) fn finish(&mut self, o: u8) {
        let Self {
            relay, seen, now, ..
        } = self;
        let now = *now;
        let Some((command, _)) = seen.running.take() else {
            return;
        };
        let status = [
            None,
            Some(FinishStatus::Completed),
            Some(FinishStatus::Failed),
            Some(FinishStatus::Cancelled),
        ][usize::from(o % 4)];
        relay.handle_execution_finished(
            command,
            ExecutionOutcome {
                status,
                result: json!(o),
                ..Default::default()
            },
            now,
        );
    }

    /// The report being stored is on disk.
    pub(super) fn stored(&mut self) {
        let Self {
            relay, flight, now, ..
        } = self;
        let now = *now;
        if let Some(command) = flight.store.take() {
            relay.handle_report_stored(command, now);
        }
    }

    /// The oldest report post in flight gets its answer.
    pub(super) fn answer_post(&mut self, o: u8) {
        let Self {
            relay,
            server,
            flight,
            seen,
            now,
            ..
        } = self;
        let now = *now;
        if flight.posts.is_empty() {
            return;
        }
        let item = flight.posts.remove(0);
        let command = item.command;
        let state = server.state(&command, now);
        let outcome = match (&item.report, state) {
            _ if o % 3 == 2 => PostOutcome::Retry("timeout".into()),
            (RelayReport::Declined, Some(ServerState::Queued) | None) => {
                server
                    .commands
                    .insert(command, ServerState::Closed(Closed::BeforeStart));
                PostOutcome::Acknowledged
            }
            (RelayReport::Declined, Some(ServerState::Closed(_))) => PostOutcome::Acknowledged,
            (
                RelayReport::Completion { envelope },
                Some(ServerState::Running { execution, .. }),
            ) if envelope.execution_id == execution => {
                server
                    .commands
                    .insert(command, ServerState::Closed(Closed::Reported));
                PostOutcome::Acknowledged
            }
            (RelayReport::Completion { .. }, Some(ServerState::Closed(Closed::Reported)))
                if o.is_multiple_of(3) =>
            {
                // The same completion, recorded before: a duplicate.
                PostOutcome::Acknowledged
            }
            // Lapsed, closed after a restart, never started, another
            // execution, a running command declined: final.
            _ => PostOutcome::Rejected("409 run_closed".into()),
        };
        if let PostOutcome::Rejected(_) = &outcome {
            seen.refused.push(item.clone());
        }
        seen.may_remove
            .insert(command, !matches!(outcome, PostOutcome::Retry(_)));
        relay.handle_report_posted(command, outcome, now);
    }

    /// The outbox the relay asked for is loaded.
    pub(super) fn loaded(&mut self) {
        let Self {
            relay,
            desktop,
            flight,
            now,
            ..
        } = self;
        let now = *now;
        if !std::mem::take(&mut flight.load) {
            return;
        }
        let mut items: Vec<_> = desktop.outbox.values().map(|(_, i)| i.clone()).collect();
        items.sort_by_key(|i| (i.stored_at, i.command));
        relay.handle_outbox_loaded(items, now);
    }

    /// The desktop process dies and a new one starts on the same disk (one
    /// time in 16).
    pub(super) fn restart(&mut self, r: u8) {
        if !r.is_multiple_of(16) {
            return;
        }
        // The process dies: its requests' answers are lost, its
        // execution is gone; the disk (outbox, projects) stays.
        self.epoch += 1;
        self.flight = InFlight::default();
        self.seen = Seen::default();
        // A new process draws new execution ids.
        let fresh = RelayConfig {
            seed: self.config.seed ^ self.epoch,
            ..self.config.clone()
        };
        self.relay = Relay::new(fresh, self.shared.clone(), self.now);
        self.relay
            .remember_synced(self.desktop.remembered.iter().cloned());
        self.relay.handle_timeout(self.now);
    }

    /// The executor reports progress.
    pub(super) fn progress(&mut self, p: u8) {
        let Self {
            relay, seen, now, ..
        } = self;
        let now = *now;
        let Some((command, execution)) = seen.running.clone() else {
            return;
        };
        let report = ProgressReport {
            message: Some(format!("step {p}")),
            percent: Some(f64::from(p % 128)),
        };
        let taken = relay.handle_progress(command, &execution, report.clone(), now);
        assert_eq!(taken.is_ok(), p % 128 <= 100, "{taken:?}");
        if taken.is_ok() && !seen.told_closed.contains(&command) {
            seen.latest_progress.insert(command, report);
        }
    }

    /// The owner answers the question about the waiting run.
    pub(super) fn approve(&mut self, o: u8) {
        let Self {
            relay, seen, now, ..
        } = self;
        let now = *now;
        let Some((command, _)) = seen.asking.take() else {
            return;
        };
        let decision = if o.is_multiple_of(2) {
            seen.approved.insert(command);
            ApprovalDecision::Approved
        } else {
            ApprovalDecision::Denied((o % 4 == 1).then(|| "not now".to_owned()))
        };
        relay.handle_approval(command, decision, now);
    }

    /// The owner cancels the current run on the desktop.
    pub(super) fn owner_cancels(&mut self) {
        let Self {
            relay, seen, now, ..
        } = self;
        let now = *now;
        let Some((command, _)) = seen.running.clone().or_else(|| seen.asking.clone()) else {
            return;
        };
        if relay.handle_local_cancel(command, now) {
            seen.owner_cancelled.insert(command);
        }
    }

    /// The oldest progress post in flight gets its answer.
    pub(super) fn answer_progress(&mut self, o: u8) {
        let Self {
            relay,
            server,
            flight,
            now,
            ..
        } = self;
        let now = *now;
        if flight.progress.is_empty() {
            return;
        }
        let (command, execution) = flight.progress.remove(0);
        let outcome = match server.state(&command, now) {
            _ if o % 3 == 2 => PostOutcome::Retry("timeout".into()),
            Some(ServerState::Running { execution: e, .. }) if e == execution => {
                PostOutcome::Acknowledged
            }
            _ => PostOutcome::Rejected("409 progress_refused".into()),
        };
        relay.handle_progress_posted(command, outcome, now);
    }
}
