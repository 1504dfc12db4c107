//! Decoded command records, remembered with the exact JSON they stand for.
//!
//! Decoding a record's JSON is the largest single cost of a read (more than
//! the query), and the same record is read several times in a row: a sync
//! hands out the command just queued, `start` and `complete` read it back,
//! the agent polls it. A [`RecordCache`] keeps the records this store wrote
//! or decoded last, each with its JSON text. A read still runs its query
//! (the database is the only truth, and another process may have written),
//! and takes the cached record only if the stored body JSON is byte for
//! byte the one the cached record was written as or decoded from, and the
//! columns a transition writes (status, revision, `finished_at`, lease)
//! agree with it; otherwise it decodes and remembers the result. Every
//! transition bumps the revision, so a row that changed never passes.
//!
//! The cache is bounded: two generations of at most [`GENERATION_ENTRIES`]
//! records and [`GENERATION_BYTES`] of JSON each; when the current one is
//! full it becomes the previous one and the old previous one is dropped
//! (a hit in the previous generation moves the entry to the current one).
//! Records whose JSON is longer than [`MAX_ENTRY_BYTES`] are not kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use graph_relay_core::command::CommandRecord;
use graph_relay_core::ids::CommandId;
use graph_relay_core::session::SessionMeta;

use crate::database::DbError;

/// Most records in one generation.
const GENERATION_ENTRIES: usize = 2048;
/// Most bytes of JSON in one generation.
const GENERATION_BYTES: usize = 4 << 20;
/// Longer records are decoded at every read instead.
const MAX_ENTRY_BYTES: usize = 64 << 10;

/// A record and the JSON it is stored as.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The `record` column: the record's body.
    pub(crate) json: String,
    /// What `json` decodes to.
    pub(crate) record: CommandRecord,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct RecordCache {
    state: Mutex<Generations>,
}

#[derive(Debug, Default)]
struct Generations {
    current: HashMap<CommandId, Arc<Entry>>,
    /// Bytes of JSON in `current`.
    current_bytes: usize,
    previous: HashMap<CommandId, Arc<Entry>>,
}

impl RecordCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Generations> {
        // Every change below leaves the maps consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached record of `id` if it was stored as exactly `json`.
    pub(crate) fn get(&self, id: &CommandId, json: &[u8]) -> Option<Arc<Entry>> {
        let mut state = self.lock();
        if let Some(entry) = state.current.get(id) {
            return (entry.json.as_bytes() == json).then(|| Arc::clone(entry));
        }
        let entry = state.previous.remove(id)?;
        if entry.json.as_bytes() != json {
            return None;
        }
        state.put(*id, Arc::clone(&entry));
        Some(entry)
    }

    /// Remembers that `entry.json` decodes to `entry.record` (the record of
    /// `id`).
    pub(crate) fn put(&self, id: CommandId, entry: Arc<Entry>) {
        if entry.json.len() <= MAX_ENTRY_BYTES {
            self.lock().put(id, entry);
        }
    }
}

impl Generations {
    fn put(&mut self, id: CommandId, entry: Arc<Entry>) {
        let len = entry.json.len();
        if self.current.len() >= GENERATION_ENTRIES || self.current_bytes + len > GENERATION_BYTES {
            self.previous = std::mem::take(&mut self.current);
            self.current_bytes = 0;
        }
        self.current_bytes += len;
        if let Some(old) = self.current.insert(id, entry) {
            self.current_bytes -= old.json.len();
        }
    }
}

/// Most entries of a [`MetaCache`]; it starts over when full.
const MAX_METAS: usize = 1024;

/// Session metadata by the JSON it was decoded from: a desktop shares the
/// same few sessions at every sync, and every run looks its session up.
#[derive(Debug, Default)]
pub(crate) struct MetaCache {
    decoded: Mutex<HashMap<Box<str>, SessionMeta>>,
}

impl MetaCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, SessionMeta>> {
        self.decoded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What `json` (a `shared_sessions.meta` column) decodes to.
    pub(crate) fn get_or_decode(&self, json: &str) -> Result<SessionMeta, DbError> {
        if let Some(meta) = self.lock().get(json) {
            return Ok(meta.clone());
        }
        let meta: SessionMeta = serde_json::from_str(json)
            .map_err(|e| DbError::Corrupt(format!("shared_sessions.meta: {e}")))?;
        if json.len() <= MAX_ENTRY_BYTES {
            let mut decoded = self.lock();
            if decoded.len() >= MAX_METAS {
                decoded.clear();
            }
            decoded.insert(json.into(), meta.clone());
        }
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use graph_relay_core::testkit::World;

    fn entry(record: &CommandRecord) -> Arc<Entry> {
        Arc::new(Entry {
            json: serde_json::to_string(record).unwrap(),
            record: record.clone(),
        })
    }

    fn template() -> CommandRecord {
        let w = World::new(Arc::new(graph_relay_store_memory::MemoryStore::new()));
        w.sync_template(0)
    }

    #[test]
    fn a_record_is_served_only_for_the_exact_json_it_was_stored_as() {
        let cache = RecordCache::default();
        let mut record = template();
        let first = entry(&record);
        cache.put(record.id, Arc::clone(&first));
        let hit = cache.get(&record.id, first.json.as_bytes()).expect("hit");
        assert_eq!(hit.record, record);
        record.revision += 1;
        let second = entry(&record);
        assert!(cache.get(&record.id, second.json.as_bytes()).is_none());
        let mut other = record.clone();
        other.id = graph_relay_core::ids::CommandId::from_uuid(uuid::Uuid::from_u128(7));
        assert!(cache.get(&other.id, second.json.as_bytes()).is_none());
    }

    #[test]
    fn the_cache_stays_bounded_and_keeps_the_latest_records() {
        let cache = RecordCache::default();
        let record = template();
        let mut last = None;
        for n in 0..(3 * GENERATION_ENTRIES as u128) {
            let mut r = record.clone();
            r.id = graph_relay_core::ids::CommandId::from_uuid(uuid::Uuid::from_u128(n));
            let e = entry(&r);
            cache.put(r.id, Arc::clone(&e));
            last = Some((r.id, e));
        }
        let state = cache.lock();
        assert!(state.current.len() <= GENERATION_ENTRIES);
        assert!(state.previous.len() <= GENERATION_ENTRIES);
        drop(state);
        let (id, e) = last.expect("some");
        assert!(cache.get(&id, e.json.as_bytes()).is_some());
        let first = graph_relay_core::ids::CommandId::from_uuid(uuid::Uuid::from_u128(0));
        assert!(cache.get(&first, e.json.as_bytes()).is_none());
    }
}
