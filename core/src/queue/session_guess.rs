//! The shared sessions this queue looked up for runs, so that the next run
//! of a session can skip the look-up.
//!
//! A run is queued on the session its agent names: the store looks it up
//! ([`Store::find_shared_session`]), then the command built from it is
//! inserted, two round trips on a networked store. An agent usually runs
//! the same session again and again, and it nearly always resolves to the
//! same share. The queue keeps the last answer for (owner, session) with
//! the projects it was asked for; the next run builds its command from it
//! and inserts it with [`Store::insert_command_if_shared`], which writes
//! only if the store still answers the same share, in the same step.
//!
//! The first run of a session has no such answer yet, but the queue has
//! usually seen the share itself: the sync that uploaded the session. Each
//! sync this queue writes leaves its sessions as guesses too, good for any
//! agent whose projects include the sync's project. An agent's own answer
//! comes first: it was found for the agent's projects, in their order.
//!
//! The guess is never an answer: a store that finds the share changed
//! (un-shared, shared first by another project or device, or under another
//! slug) writes nothing, and the run looks the session up afresh, as
//! without a guess. Two [`Memo`]s bound them: [`MAX_SESSION_GUESSES`]
//! sessions as agents found them, [`MAX_SYNCED_GUESSES`] as syncs uploaded
//! them, so desktops sharing many sessions never push out what agents run.
//! Each keeps only what a command takes from its share (project, device,
//! slug) and, for an agent's answer, the projects it was asked for: a few
//! hundred bytes.
//!
//! [`Store::find_shared_session`]: crate::store::Store::find_shared_session
//! [`Store::insert_command_if_shared`]: crate::store::Store::insert_command_if_shared

use std::sync::Arc;

use super::memo::Memo;
use crate::ids::{DeviceId, GraphSessionId, OwnerId, ProjectId};
use crate::session::{SessionMeta, SharedSession};

/// Most sessions guessed at once from agents' look-ups.
pub(crate) const MAX_SESSION_GUESSES: usize = 4096;

/// Most sessions guessed at once from the syncs this queue wrote: room for
/// a session on each of 10,000 desktops and more.
pub(crate) const MAX_SYNCED_GUESSES: usize = 16_384;

/// What a command takes from the share its session resolved to.
#[derive(Debug, Clone)]
pub(crate) struct Share {
    pub(crate) project: ProjectId,
    pub(crate) device: DeviceId,
    pub(crate) slug: Arc<str>,
}

impl From<SharedSession> for Share {
    fn from(shared: SharedSession) -> Self {
        Self {
            project: shared.project,
            device: shared.device,
            slug: shared.meta.slug,
        }
    }
}

/// See the module docs.
pub(crate) struct SessionGuesses {
    /// What agents' look-ups found, with the projects they asked for.
    memo: Memo<(OwnerId, GraphSessionId), (Vec<ProjectId>, Share)>,
    /// What the syncs this queue wrote uploaded.
    synced: Memo<(OwnerId, GraphSessionId), Share>,
}

impl Default for SessionGuesses {
    fn default() -> Self {
        Self {
            memo: Memo::new(MAX_SESSION_GUESSES),
            synced: Memo::new(MAX_SYNCED_GUESSES),
        }
    }
}

impl SessionGuesses {
    /// The share last found for `id` of `owner` when asked for `projects`
    /// (in that order: the order decides which share is found), else the
    /// share a sync last uploaded it to, if that project is among them.
    pub(crate) fn get(
        &self,
        owner: &OwnerId,
        id: &GraphSessionId,
        projects: &[ProjectId],
    ) -> Option<Share> {
        let key = (owner.clone(), id.clone());
        let found = self
            .memo
            .lock()
            .get(&key)
            .filter(|(asked, _)| asked.as_slice() == projects)
            .map(|(_, share)| share.clone());
        found.or_else(|| {
            self.synced
                .lock()
                .get(&key)
                .filter(|share| projects.contains(&share.project))
                .cloned()
        })
    }

    /// Remembers the sessions a sync of `device` of `owner` uploaded to
    /// `project`, as written to the store.
    pub(crate) fn put_synced(
        &self,
        owner: &OwnerId,
        device: &DeviceId,
        project: &ProjectId,
        sessions: &[SessionMeta],
    ) {
        let mut synced = self.synced.lock();
        for session in sessions {
            synced.insert(
                (owner.clone(), session.graph_session_id.clone()),
                Share {
                    project: project.clone(),
                    device: device.clone(),
                    slug: Arc::clone(&session.slug),
                },
            );
        }
    }

    /// Remembers that `id` of `owner`, asked for `projects`, was `share`.
    pub(crate) fn put(
        &self,
        owner: &OwnerId,
        id: &GraphSessionId,
        projects: &[ProjectId],
        share: &Share,
    ) {
        self.memo.lock().insert(
            (owner.clone(), id.clone()),
            (projects.to_vec(), share.clone()),
        );
    }

    /// Forgets `id` of `owner` (the store found its share changed).
    pub(crate) fn forget(&self, owner: &OwnerId, id: &GraphSessionId) {
        let key = (owner.clone(), id.clone());
        self.memo.lock().remove(&key);
        self.synced.lock().remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> OwnerId {
        OwnerId::parse("alice").expect("owner")
    }

    fn project(name: &str) -> ProjectId {
        ProjectId::parse(name).expect("project")
    }

    fn device(name: &str) -> DeviceId {
        DeviceId::parse(name).expect("device")
    }

    fn session() -> GraphSessionId {
        GraphSessionId::parse(&format!("gs_{:032x}", 7)).expect("session")
    }

    fn synced(guesses: &SessionGuesses, to: &str, on: &str) {
        let meta = SessionMeta::new(session(), "Graph", "graph");
        guesses.put_synced(&owner(), &device(on), &project(to), &[meta]);
    }

    fn guess(guesses: &SessionGuesses, projects: &[&str]) -> Option<(String, String)> {
        let projects: Vec<ProjectId> = projects.iter().map(|p| project(p)).collect();
        guesses
            .get(&owner(), &session(), &projects)
            .map(|share| (share.project.to_string(), share.device.to_string()))
    }

    #[test]
    fn a_synced_session_is_guessed_for_agents_whose_projects_include_its_project() {
        let guesses = SessionGuesses::default();
        assert_eq!(guess(&guesses, &["p1"]), None);
        synced(&guesses, "p2", "laptop");
        let on_laptop = Some(("p2".to_owned(), "laptop".to_owned()));
        assert_eq!(guess(&guesses, &["p1", "p2"]), on_laptop);
        assert_eq!(guess(&guesses, &["p2"]), on_laptop);
        assert_eq!(guess(&guesses, &["p1"]), None, "not the agent's project");
        // A later sync of the same session moves the guess.
        synced(&guesses, "p1", "desktop");
        assert_eq!(
            guess(&guesses, &["p1", "p2"]),
            Some(("p1".to_owned(), "desktop".to_owned()))
        );
    }

    #[test]
    fn an_agents_own_answer_comes_before_a_syncs_and_forgetting_drops_both() {
        let guesses = SessionGuesses::default();
        synced(&guesses, "p1", "laptop");
        let found = Share {
            project: project("p1"),
            device: device("desktop"),
            slug: "graph".into(),
        };
        guesses.put(&owner(), &session(), &[project("p1")], &found);
        assert_eq!(
            guess(&guesses, &["p1"]),
            Some(("p1".to_owned(), "desktop".to_owned()))
        );
        // Asked for other projects, the agent's answer does not hold; the
        // sync's does.
        assert_eq!(
            guess(&guesses, &["p2", "p1"]),
            Some(("p1".to_owned(), "laptop".to_owned()))
        );
        guesses.forget(&owner(), &session());
        assert_eq!(guess(&guesses, &["p1"]), None);
        assert_eq!(guess(&guesses, &["p2", "p1"]), None);
    }
}
