//! The conformance scenario of [`Store::insert_command_if_shared`]: a run
//! queued on the share its session resolved to last time lands exactly
//! where a fresh look-up would put it, whatever changed in between (the
//! share gone, moved to another device or project, a smaller device id
//! sharing it too, a new slug), and a retried key still gets its ticket.
//! The first run of a session this queue saw a sync upload needs no
//! look-up; a sync's guess the store refuses costs one.

use std::sync::Arc;

use serde_json::json;

use super::{StoreCalls, World, meta, p1, p2, run_args};
use crate::command::CommandRecord;
use crate::ids::{CommandId, IdempotencyKey, ProjectId};
use crate::principal::Device;
use crate::queue::{RunError, SyncRequest};
use crate::session::SessionMeta;
use crate::store::{GuardedInsert, IdempotencyRecord, LayeredStore, Store};
use crate::time::Clock;

/// `device` shares exactly `sessions` to `project`.
async fn share(w: &World, device: &Device, project: ProjectId, sessions: Vec<SessionMeta>) {
    let request = SyncRequest {
        project,
        sessions,
        long_poll: false,
        restarted: false,
        running: None,
    };
    w.queue.sync(device, &request).await.expect("sync");
}

/// The agent runs session 1 with `key`; checks the stored copy is the
/// answer.
async fn run(w: &World, key: &str) -> CommandRecord {
    let command = w.run(&w.agent, 1, key).await;
    let stored = w
        .queue
        .get_graph_run(&w.agent, &command.id)
        .await
        .expect("get")
        .command;
    assert_eq!(
        (&stored.project, &stored.device, &stored.slug),
        (&command.project, &command.device, &command.slug),
        "the ticket is what was stored"
    );
    command
}

/// See the module docs.
pub async fn guessed_shares(store: Arc<dyn Store>) {
    let counted = Arc::new(LayeredStore::new(
        store,
        StoreCalls::of("find_shared_session"),
    ));
    let lookups = || counted.layer().count();
    let w = World::new(counted.clone());
    let (desktop, laptop) = (&w.device, &w.other_device);
    share(&w, desktop, p1(), vec![meta(1)]).await;
    let first = run(&w, "guess-01").await;
    assert_eq!((&first.project, &first.device), (&p1(), &desktop.id));
    assert_eq!(lookups(), 0, "the sync's share is the guess");
    // The same share again: the queue's guess holds.
    let again = run(&w, "guess-02").await;
    assert_eq!((&again.device, &*again.slug), (&desktop.id, "graph-1"));

    // Shared again under another slug: the run carries the new one.
    let renamed = SessionMeta {
        slug: "graph-1-renamed".into(),
        ..meta(1)
    };
    share(&w, desktop, p1(), vec![renamed]).await;
    assert_eq!(&*run(&w, "guess-03").await.slug, "graph-1-renamed");

    // Moved to the laptop: the run follows it.
    share(&w, desktop, p1(), vec![]).await;
    share(&w, laptop, p1(), vec![meta(1)]).await;
    let moved = run(&w, "guess-04").await;
    assert_eq!((&moved.device, &*moved.slug), (&laptop.id, "graph-1"));

    // The desktop shares it too: the smaller device id wins again.
    share(&w, desktop, p1(), vec![meta(1)]).await;
    assert_eq!(run(&w, "guess-05").await.device, desktop.id);
    assert_eq!(lookups(), 0, "every guess so far came from a sync");

    // The laptop's sync comes last (a new one: it shares a second
    // session), but the desktop's share still comes first: the store
    // refuses the sync's guess and the run looks it up, once; the next run
    // takes what it found.
    share(&w, laptop, p1(), vec![meta(1), meta(2)]).await;
    assert_eq!(run(&w, "guess-05b").await.device, desktop.id);
    assert_eq!(lookups(), 1, "one look-up after the refused guess");
    assert_eq!(run(&w, "guess-05c").await.device, desktop.id);
    assert_eq!(lookups(), 1, "then the look-up's answer is the guess");

    // Only in the agent's second project: found there; then back in the
    // first, which comes first.
    share(&w, desktop, p1(), vec![]).await;
    share(&w, laptop, p1(), vec![]).await;
    share(&w, laptop, p2(), vec![meta(1)]).await;
    let second = run(&w, "guess-06").await;
    assert_eq!((&second.project, &second.device), (&p2(), &laptop.id));
    share(&w, desktop, p1(), vec![meta(1)]).await;
    let first_again = run(&w, "guess-07").await;
    assert_eq!(
        (&first_again.project, &first_again.device),
        (&p1(), &desktop.id)
    );

    // A retried key on a guessed share gets its first ticket.
    let retried = w
        .queue
        .run_graph_session(&w.agent, run_args(1, "guess-07", json!({"q": "guess-07"})))
        .await
        .expect("retry");
    assert!(retried.replayed);
    assert_eq!(retried.command.id, first_again.id);

    // Shared nowhere: a new key finds nothing, a retried one its ticket.
    share(&w, desktop, p1(), vec![]).await;
    share(&w, laptop, p2(), vec![]).await;
    let gone = w
        .queue
        .run_graph_session(&w.agent, run_args(1, "guess-08", json!({"q": "guess-08"})))
        .await;
    assert!(matches!(gone, Err(RunError::SessionNotFound)), "{gone:?}");
    let retried = w
        .queue
        .run_graph_session(&w.agent, run_args(1, "guess-06", json!({"q": "guess-06"})))
        .await
        .expect("retry after un-sharing");
    assert!(retried.replayed);
    assert_eq!(retried.command.id, second.id);

    // Straight at the store: a command built for a share that is gone
    // writes nothing.
    share(&w, desktop, p1(), vec![meta(1)]).await;
    let stale = run(&w, "guess-09").await;
    share(&w, desktop, p1(), vec![]).await;
    let mut command = stale.clone();
    command.id = CommandId::from_uuid(uuid::Uuid::from_u128(9));
    let key = IdempotencyRecord {
        owner: command.owner.clone(),
        agent: command.agent.clone(),
        key: IdempotencyKey::parse("guess-10").expect("key"),
        command: command.id,
        fingerprint: "f".into(),
        expires_at: w.clock.now().plus(std::time::Duration::from_secs(60)),
    };
    let projects = [p1(), p2()];
    let outcome = w
        .queue
        .store()
        .insert_command_if_shared(&command, &key, &projects, w.clock.now())
        .await
        .expect("insert");
    assert_eq!(outcome, GuardedInsert::SessionChanged);
    let written = w
        .queue
        .store()
        .command_for_owner(&command.owner, &command.id)
        .await
        .expect("read");
    assert!(written.is_none(), "nothing was written");
}
