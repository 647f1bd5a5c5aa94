//! The keyed state of the partitions this instance owns, kept in memory for
//! the module's runs: each partition's committed state (read whole from the
//! sink's state store the first time a batch asks, if it fits the budget,
//! `limits.state_cache_mib`; else key by key as asked), plus the writes of
//! batches handed to the sink and not yet landed (the batch read ahead
//! while one commits builds on that one's writes).
//!
//! Delivery: state is committed by the sink, in the same atomic unit as
//! the batch's rows and offsets, never here. This cache only answers reads,
//! and only with what the sink committed or what a batch being committed
//! wrote. That holds because batches commit in order, a batch read ahead
//! is dropped whenever the one before it does not land, and a partition's
//! cache is dropped whenever its offsets may have moved elsewhere (fenced,
//! revoked, restarted): it is read again from the sink.
//!
//! It must not write state anywhere, and must not judge what a run reads
//! as expired (the run does, by batch time). It only names the expired
//! keys a batch may remove besides its module's changes
//! ([`StateBase::expired`]): keys it holds whose committed value expired
//! and that no batch in flight changes.

use crate::metrics::SinkRead;
use sluice_core::batch::Records;
use sluice_core::batch::TopicPartition;
use sluice_core::state::{
    KeyTable, NoState, PartitionTables, StateBase, StateError, StateMap, StateStore, StateValue,
};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// What a cached key costs besides its bytes, roughly (map entry, vectors).
const ENTRY_OVERHEAD: usize = 64;
/// How often, in batch time, a partition's cached keys are searched for
/// expired ones, at most (a search reads them all).
const SWEEP_EVERY_MS: i64 = 1_000;
/// Most expired keys a batch removes per partition: the rest go with the
/// next batches, so one batch's commit stays short.
const MAX_EXPIRED_PER_BATCH: usize = 10_000;

/// The pipeline's keyed state cache.
pub(crate) struct KeptState {
    pipeline: String,
    store: Option<Arc<dyn StateStore>>,
    /// What a state call gets when the sink keeps no state.
    unsupported: String,
    budget: usize,
    handle: tokio::runtime::Handle,
    kept: Mutex<Kept>,
    metrics: crate::Metrics,
    /// Whether the module reads state by record key, as far as the last
    /// key the cache could not answer tells: then a batch's record keys
    /// are read ahead before it runs (see [`BatchKeys`]).
    record_keyed: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Kept {
    partitions: HashMap<TopicPartition, Cached, foldhash::fast::RandomState>,
    /// Writes of batches handed to the sink, not yet landed, oldest first
    /// (hashed: every read of a batch prepared meanwhile looks here first).
    pending: VecDeque<(String, PartitionTables)>,
    /// Bytes all partitions' cached keys take.
    bytes: usize,
}

/// One partition's committed state, as far as it is cached.
#[derive(Default)]
struct Cached {
    keys: KeyTable,
    /// Every key of the partition is here: a key not here is absent.
    complete: bool,
    bytes: usize,
    /// Keys with a value (not known absent), and their keys' and values'
    /// bytes: the partition's stored state, when `complete`.
    stored: StoredSize,
    /// No cached value expires before this (`None`: none expires).
    earliest_expiry: Option<i64>,
    /// The batch time of the last search for expired keys.
    swept_at: Option<i64>,
}

/// How much state a partition keeps: keys with a value, and the bytes of
/// those keys and values.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoredSize {
    pub keys: usize,
    pub bytes: usize,
}

impl StoredSize {
    fn count(&mut self, key_len: usize, value: &Option<StateValue>, sign: isize) {
        if let Some(v) = value {
            self.keys = (self.keys as isize + sign) as usize;
            self.bytes = (self.bytes as isize + sign * (key_len + v.value.len()) as isize) as usize;
        }
    }
}

fn entry_size(key_len: usize, value: &Option<StateValue>) -> usize {
    key_len + value.as_ref().map_or(0, StateValue::size) + ENTRY_OVERHEAD
}

impl Cached {
    /// Caches `value` under `key` (in a complete partition an absent key
    /// is simply not kept); returns how many bytes the cache grew by.
    fn put(&mut self, key: Vec<u8>, value: Option<StateValue>) -> isize {
        let key_len = key.len();
        if let Some(at) = value.as_ref().and_then(|v| v.expires_at_ms) {
            self.earliest_expiry = Some(self.earliest_expiry.map_or(at, |e| e.min(at)));
        }
        let (old, added) = match (value, self.complete) {
            (None, true) => (self.keys.remove(&key), 0),
            (value, _) => {
                let added = entry_size(key_len, &value) as isize;
                self.stored.count(key_len, &value, 1);
                (self.keys.insert(key, value), added)
            }
        };
        let removed = match old {
            Some(old) => {
                self.stored.count(key_len, &old, -1);
                entry_size(key_len, &old) as isize
            }
            None => 0,
        };
        self.bytes = (self.bytes as isize + added - removed) as usize;
        added - removed
    }

    /// Up to [`MAX_EXPIRED_PER_BATCH`] keys cached with a value expired at
    /// `batch_time_ms`, leaving out those `changed` says another change is
    /// on its way for; none if no value can have expired yet or the last
    /// search was less than [`SWEEP_EVERY_MS`] of batch time ago.
    fn expired(&mut self, batch_time_ms: i64, changed: impl Fn(&[u8]) -> bool) -> Vec<Vec<u8>> {
        let can_have = self.earliest_expiry.is_some_and(|at| at <= batch_time_ms);
        let searched_lately = self
            .swept_at
            .is_some_and(|at| batch_time_ms.saturating_sub(at) < SWEEP_EVERY_MS);
        if !can_have || searched_lately {
            return Vec::new();
        }
        let mut found = Vec::new();
        let mut earliest = None;
        for (key, value) in &self.keys {
            let Some(at) = value.as_ref().and_then(|v| v.expires_at_ms) else {
                continue;
            };
            if at <= batch_time_ms && found.len() < MAX_EXPIRED_PER_BATCH && !changed(key) {
                found.push(key.clone());
            } else {
                earliest = Some(earliest.map_or(at, |e: i64| e.min(at)));
            }
        }
        self.earliest_expiry = earliest;
        // A full take: the next batch searches again.
        self.swept_at = (found.len() < MAX_EXPIRED_PER_BATCH).then_some(batch_time_ms);
        found
    }
}

impl KeptState {
    /// The cache over `store` (`None`: the sink keeps no state), within
    /// `budget` bytes. Must be created inside the Tokio runtime the store
    /// uses.
    pub(crate) fn new(
        pipeline: &str,
        store: Option<Arc<dyn StateStore>>,
        budget: usize,
        metrics: crate::Metrics,
    ) -> Arc<KeptState> {
        Arc::new(KeptState {
            pipeline: pipeline.to_string(),
            store,
            unsupported: "the module keeps keyed state, which this sink does not keep: use a \
                          SQL sink (sqlite, postgres, mysql), redis or Kafka for a stateful \
                          module"
                .to_string(),
            budget,
            handle: tokio::runtime::Handle::current(),
            kept: Mutex::default(),
            metrics,
            record_keyed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes what the cache holds, and the stored size of each
    /// partition it holds whole.
    fn measured(&self, kept: &Kept) {
        self.metrics.state_cache_bytes(kept.bytes);
        let whole: Vec<(&TopicPartition, StoredSize)> = kept
            .partitions
            .iter()
            .filter(|(_, c)| c.complete)
            .map(|(tp, c)| (tp, c.stored))
            .collect();
        self.metrics.state_partitions(&whole);
    }

    /// What the next batch's runs read its start state from.
    pub(crate) fn base(self: &Arc<Self>) -> Arc<dyn StateBase> {
        match self.store {
            Some(_) => Arc::new(Live {
                kept: Arc::clone(self),
                batch: std::sync::OnceLock::new(),
            }),
            None => Arc::new(NoState(self.unsupported.clone())),
        }
    }

    /// Batch `batch_id` goes to the sink with `writes`: batches prepared
    /// from now on build on them.
    pub(crate) fn committing(&self, batch_id: &str, writes: &StateMap) {
        if !writes.is_empty() {
            let hashed: PartitionTables = writes
                .0
                .iter()
                .map(|(tp, keys)| {
                    let keys: KeyTable = keys.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                    (tp.clone(), keys)
                })
                .collect();
            self.kept()
                .pending
                .push_back((batch_id.to_string(), hashed));
        }
    }

    /// The keys of `partitions` a batch at `batch_time_ms` that writes
    /// `written` removes as expired (see [`StateBase::expired`]): cached
    /// keys whose committed value has expired and that neither it nor a
    /// batch not yet landed changes. Keys the cache does not hold are
    /// left where they are until a batch writes them.
    fn expired(
        &self,
        partitions: &[TopicPartition],
        batch_time_ms: i64,
        written: &StateMap,
    ) -> StateMap {
        let mut expired = StateMap::default();
        let mut kept = self.kept();
        let Kept {
            partitions: cached,
            pending,
            ..
        } = &mut *kept;
        for tp in partitions {
            let Some(cached) = cached.get_mut(tp) else {
                continue;
            };
            let changed = |key: &[u8]| {
                written.lookup(tp, key).is_some()
                    || pending
                        .iter()
                        .any(|(_, w)| w.get(tp).is_some_and(|keys| keys.contains_key(key)))
            };
            for key in cached.expired(batch_time_ms, changed) {
                expired.insert(tp, key, None);
            }
        }
        expired
    }

    /// Batch `batch_id` landed: its writes are committed state now.
    pub(crate) fn landed(&self, batch_id: &str) {
        let mut kept = self.kept();
        let Some(at) = kept.pending.iter().position(|(id, _)| id == batch_id) else {
            return;
        };
        let (_, writes) = kept.pending.remove(at).expect("found");
        for (tp, keys) in writes {
            kept.cache(&tp, keys);
        }
        kept.fit_budget(self.budget);
        self.measured(&kept);
    }

    /// Batch `batch_id` did not land (fenced): its writes are dropped, and
    /// so is the cache of `partitions`, read again from the sink when next
    /// asked.
    pub(crate) fn abandoned(&self, batch_id: &str, partitions: &[TopicPartition]) {
        self.kept().pending.retain(|(id, _)| id != batch_id);
        self.forget(partitions);
    }

    /// `partitions` may have been committed elsewhere (revoked, restarted
    /// from their checkpoints): their cache and pending writes go.
    pub(crate) fn forget(&self, partitions: &[TopicPartition]) {
        let mut kept = self.kept();
        for tp in partitions {
            if let Some(cached) = kept.partitions.remove(tp) {
                kept.bytes -= cached.bytes;
            }
            for (_, writes) in kept.pending.iter_mut() {
                writes.remove(tp);
            }
        }
        self.measured(&kept);
    }

    /// The start-state value of `key` in `tp` for a batch prepared now,
    /// whose record keys are `batch` (read ahead in one round trip the first
    /// time a key of `tp` is not cached).
    fn get(
        &self,
        tp: &TopicPartition,
        key: &[u8],
        batch: Option<&BatchKeys>,
    ) -> Result<Option<StateValue>, StateError> {
        let store = self.store.as_ref().expect("a live base has a store");
        {
            let kept = self.kept();
            if let Some(known) = kept.known(tp, key) {
                return Ok(known);
            }
            if !kept.partitions.contains_key(tp) {
                let room = self.budget.saturating_sub(kept.bytes);
                drop(kept);
                let started = Instant::now();
                let loaded = self.handle.block_on(store.load(&self.pipeline, tp, room))?;
                self.metrics
                    .state_sink_read(SinkRead::Partition, started.elapsed());
                let mut kept = self.kept();
                kept.cache_partition(tp, loaded);
                self.measured(&kept);
                if let Some(known) = kept.known(tp, key) {
                    return Ok(known);
                }
            }
        }
        if let Some(keys) = batch.and_then(|b| b.take(tp)) {
            // Read ahead only for a module that reads by record key (this
            // key is one); else the record keys would only crowd the cache.
            let record_keyed = keys.contains(&key);
            self.record_keyed
                .store(record_keyed, std::sync::atomic::Ordering::Relaxed);
            if record_keyed {
                self.read_ahead(tp, keys);
                if let Some(known) = self.kept().known(tp, key) {
                    return Ok(known);
                }
            }
        }
        let started = Instant::now();
        let value = self.handle.block_on(store.get(&self.pipeline, tp, key))?;
        self.metrics
            .state_sink_read(SinkRead::Key, started.elapsed());
        let mut kept = self.kept();
        if kept.cache(tp, [(key.to_vec(), value.clone())]) {
            kept.fit_budget(self.budget);
            self.measured(&kept);
        }
        Ok(value)
    }
}

impl KeptState {
    /// Reads those of `keys` (a batch's record keys in `tp`) the cache
    /// cannot answer in one round trip and caches them, making room first
    /// (what is read is dropped if it alone is over the budget).
    /// Keys written by a batch not yet landed are left out (its writes
    /// answer them), so what is cached is committed state, as `get` caches
    /// it. A failed read is left to the module's own reads, which retry
    /// through the batch's usual error path.
    fn read_ahead(&self, tp: &TopicPartition, keys: Vec<&[u8]>) {
        let Some(store) = self.store.as_ref() else {
            return;
        };
        let unknown: Vec<&[u8]> = {
            let kept = self.kept();
            match kept.partitions.get(tp) {
                Some(cached) if !cached.complete => keys
                    .into_iter()
                    .filter(|key| kept.known(tp, key).is_none())
                    .collect(),
                _ => return,
            }
        };
        if unknown.is_empty() {
            return;
        }
        let started = Instant::now();
        let read = self
            .handle
            .block_on(store.get_many(&self.pipeline, tp, &unknown));
        self.metrics
            .state_sink_read(SinkRead::RecordKeys, started.elapsed());
        let Ok(values) = read else { return };
        let incoming: usize = unknown
            .iter()
            .zip(&values)
            .map(|(key, value)| entry_size(key.len(), value))
            .sum();
        if incoming > self.budget {
            return;
        }
        let mut kept = self.kept();
        kept.fit_budget(self.budget - incoming);
        let Some(cached) = kept.partitions.get(tp) else {
            return;
        };
        let fresh: Vec<(Vec<u8>, Option<StateValue>)> = unknown
            .into_iter()
            .zip(values)
            .filter(|(key, _)| !cached.keys.contains_key(*key))
            .map(|(key, value)| (key.to_vec(), value))
            .collect();
        kept.cache(tp, fresh);
        self.measured(&kept);
    }

    /// Whether `tp`'s state is cached in part (too large for the budget).
    fn partly_cached(&self, tp: &TopicPartition) -> bool {
        self.kept()
            .partitions
            .get(tp)
            .is_some_and(|cached| !cached.complete)
    }
}

/// A batch's record keys, copied before it runs, for a partition whose
/// state is larger than the cache: read in one round trip at the batch's
/// first key of the partition the cache cannot answer, if that key is one
/// of them (the module reads state by record key); and then, for the
/// batches after, before they run.
struct BatchKeys {
    slices: Vec<(TopicPartition, std::ops::Range<usize>)>,
    key_lengths: Vec<i32>,
    keys: Vec<u8>,
    /// Partitions whose keys were read ahead already.
    taken: Mutex<Vec<TopicPartition>>,
}

impl BatchKeys {
    fn of(records: &Records) -> BatchKeys {
        BatchKeys {
            slices: records
                .slices
                .iter()
                .map(|s| {
                    let first = s.first as usize;
                    (s.topic_partition(), first..first + s.count as usize)
                })
                .collect(),
            key_lengths: records.key_lengths.clone(),
            keys: records.keys.clone(),
            taken: Mutex::default(),
        }
    }

    /// `tp`'s distinct record keys, the first time they are asked for.
    fn take(&self, tp: &TopicPartition) -> Option<Vec<&[u8]>> {
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        if taken.contains(tp) {
            return None;
        }
        taken.push(tp.clone());
        drop(taken);
        let mut seen = std::collections::HashSet::<&[u8], foldhash::fast::RandomState>::default();
        let mut at = 0usize;
        let mut keys = Vec::new();
        for (slice, records) in &self.slices {
            for i in records.clone() {
                let len = self.key_lengths[i];
                if len < 0 {
                    continue;
                }
                let key = &self.keys[at..at + len as usize];
                at += len as usize;
                if slice == tp && seen.insert(key) {
                    keys.push(key);
                }
            }
        }
        Some(keys)
    }
}

impl Kept {
    /// Puts `entries` into `tp`'s cache, counting their bytes; false (and
    /// nothing kept) if `tp` is not cached.
    fn cache(
        &mut self,
        tp: &TopicPartition,
        entries: impl IntoIterator<Item = (Vec<u8>, Option<StateValue>)>,
    ) -> bool {
        let Some(cached) = self.partitions.get_mut(tp) else {
            return false;
        };
        let grew: isize = entries
            .into_iter()
            .map(|(key, value)| cached.put(key, value))
            .sum();
        self.bytes = (self.bytes as isize + grew) as usize;
        true
    }

    /// What is known of `key` in `tp` without asking the sink: a pending
    /// write (newest first), a cached value, or absent from a complete
    /// partition.
    fn known(&self, tp: &TopicPartition, key: &[u8]) -> Option<Option<StateValue>> {
        for (_, writes) in self.pending.iter().rev() {
            if let Some(value) = writes.get(tp).and_then(|keys| keys.get(key)) {
                return Some(value.clone());
            }
        }
        let cached = self.partitions.get(tp)?;
        match cached.keys.get(key) {
            Some(value) => Some(value.clone()),
            None => cached.complete.then_some(None),
        }
    }

    /// Caches what loading `tp` gave: all its keys, or (too large) none yet.
    fn cache_partition(&mut self, tp: &TopicPartition, loaded: Option<Vec<(Vec<u8>, StateValue)>>) {
        if self.partitions.contains_key(tp) {
            return;
        }
        let mut cached = Cached::default();
        if let Some(entries) = loaded {
            cached.complete = true;
            for (key, value) in entries {
                cached.put(key, Some(value));
            }
        }
        self.bytes += cached.bytes;
        self.partitions.insert(tp.clone(), cached);
    }

    /// Over `budget`, the largest partitions' caches are emptied (they are
    /// read key by key from then on) until it fits.
    fn fit_budget(&mut self, budget: usize) {
        while self.bytes > budget {
            let Some(largest) = self
                .partitions
                .values_mut()
                .filter(|c| c.bytes > 0)
                .max_by_key(|c| c.bytes)
            else {
                return;
            };
            self.bytes -= largest.bytes;
            *largest = Cached::default();
        }
    }
}

/// The base a batch prepared now reads through.
struct Live {
    kept: Arc<KeptState>,
    /// The batch's record keys (set by `prefetch`, before it runs).
    batch: std::sync::OnceLock<BatchKeys>,
}

impl StateBase for Live {
    fn get(&self, tp: &TopicPartition, key: &[u8]) -> Result<Option<StateValue>, StateError> {
        self.kept.get(tp, key, self.batch.get())
    }

    fn expired(
        &self,
        partitions: &[TopicPartition],
        batch_time_ms: i64,
        written: &StateMap,
    ) -> StateMap {
        self.kept.expired(partitions, batch_time_ms, written)
    }

    fn prefetch(&self, records: &Records) {
        // No partition's state asked for yet: a stateless module (or a
        // first batch, which loads what it reads) copies nothing.
        if self.kept.kept().partitions.is_empty() {
            return;
        }
        let batch = self.batch.get_or_init(|| BatchKeys::of(records));
        if !self
            .kept
            .record_keyed
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        for (tp, _) in &batch.slices {
            if self.kept.partly_cached(tp)
                && let Some(keys) = batch.take(tp)
            {
                self.kept.read_ahead(tp, keys);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::batch::OwnedRecord;

    /// Record keys per partition, each once, in batch order, and only the
    /// first time; records without a key have none to read ahead.
    #[test]
    fn record_keys_are_taken_once_distinct_per_partition() {
        let rec = |offset: i64, key: Option<&str>| OwnedRecord {
            offset,
            timestamp: 0,
            key: key.map(|k| k.as_bytes().to_vec()),
            value: None,
            headers: Vec::new(),
        };
        let mut records = Records::default();
        records.push_slice(
            "t",
            0,
            &[rec(0, Some("b")), rec(1, None), rec(2, Some("a"))],
        );
        records.push_slice("t", 1, &[rec(0, Some("c")), rec(1, Some("c"))]);
        let batch = BatchKeys::of(&records);
        let tp = |partition| TopicPartition {
            topic: "t".into(),
            partition,
        };
        assert_eq!(batch.take(&tp(1)), Some(vec![&b"c"[..]]));
        assert_eq!(batch.take(&tp(1)), None, "once");
        assert_eq!(batch.take(&tp(0)), Some(vec![&b"b"[..], &b"a"[..]]));
    }

    /// Expired keys are found once their expiry passed, not while another
    /// change to them is on its way, at most once per [`SWEEP_EVERY_MS`]
    /// of batch time; once removed from a complete partition they are not
    /// kept as absent.
    #[test]
    fn expired_keys_are_found_by_batch_time_and_removed_from_the_cache() {
        let value = |expires_at_ms| {
            Some(StateValue {
                value: b"v".to_vec(),
                expires_at_ms,
            })
        };
        let mut cached = Cached {
            complete: true,
            ..Cached::default()
        };
        cached.put(b"never".to_vec(), value(None));
        cached.put(b"at10".to_vec(), value(Some(10)));
        cached.put(b"at20".to_vec(), value(Some(20)));
        cached.put(b"at5000".to_vec(), value(Some(5_000)));
        let nothing_changed = |_: &[u8]| false;
        assert!(cached.expired(9, nothing_changed).is_empty(), "none yet");
        let mut found = cached.expired(20, |key: &[u8]| key == b"at20");
        assert_eq!(found, vec![b"at10".to_vec()], "at20 is being changed");
        // The batch that removes at10 lands.
        assert!(cached.put(b"at10".to_vec(), None) < 0);
        assert_eq!((cached.keys.len(), cached.stored.keys), (3, 3));
        assert!(cached.expired(999, nothing_changed).is_empty(), "too soon");
        found = cached.expired(1_020, nothing_changed);
        assert_eq!(found, vec![b"at20".to_vec()]);
        assert_eq!(cached.earliest_expiry, Some(5_000));
        cached.put(b"at20".to_vec(), None);
        assert!(cached.expired(2_100, nothing_changed).is_empty());
        assert_eq!(cached.expired(5_000, nothing_changed), vec![b"at5000".to_vec()]);
    }
}
