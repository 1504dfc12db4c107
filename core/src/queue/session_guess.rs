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
//! The guess is never an answer: a store that finds the share changed
//! (un-shared, shared first by another project or device, or under another
//! slug) writes nothing, and the run looks the session up afresh, as
//! without a guess. A [`Memo`] of [`MAX_SESSION_GUESSES`] sessions bounds
//! it; each keeps only what a command takes from its share (project,
//! device, slug) and the projects it was asked for: a few hundred bytes.
//!
//! [`Store::find_shared_session`]: crate::store::Store::find_shared_session
//! [`Store::insert_command_if_shared`]: crate::store::Store::insert_command_if_shared

use std::sync::Arc;

use super::memo::Memo;
use crate::ids::{DeviceId, GraphSessionId, OwnerId, ProjectId};
use crate::session::SharedSession;

/// Most sessions guessed at once.
pub(crate) const MAX_SESSION_GUESSES: usize = 4096;

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
    memo: Memo<(OwnerId, GraphSessionId), (Vec<ProjectId>, Share)>,
}

impl Default for SessionGuesses {
    fn default() -> Self {
        Self {
            memo: Memo::new(MAX_SESSION_GUESSES),
        }
    }
}

impl SessionGuesses {
    /// The share last found for `id` of `owner` when asked for `projects`
    /// (in that order: the order decides which share is found).
    pub(crate) fn get(
        &self,
        owner: &OwnerId,
        id: &GraphSessionId,
        projects: &[ProjectId],
    ) -> Option<Share> {
        let entries = self.memo.lock();
        let (asked, share) = entries.get(&(owner.clone(), id.clone()))?;
        (asked.as_slice() == projects).then(|| share.clone())
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
        self.memo.lock().remove(&(owner.clone(), id.clone()));
    }
}
