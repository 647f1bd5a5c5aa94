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
use crate::timer_index::TimerIndex;
use sluice_core::batch::Records;
use sluice_core::batch::TopicPartition;
use sluice_core::event_time;
use sluice_core::state::{
    KeyTable, NoState, PartitionTables, StateBase, StateError, StateMap, StateSize, StateStore,
    StateValue,
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
    /// `limits.max_state_partition_mib`, in bytes.
    max_partition_bytes: Option<usize>,
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
    pending: VecDeque<Pending>,
    /// Bytes all partitions' cached keys take.
    bytes: usize,
    /// With a partition limit, the committed state bytes of partitions
    /// the cache does not hold whole, measured in the sink once and kept
    /// up with each landed batch's growth.
    measured: HashMap<TopicPartition, usize, foldhash::fast::RandomState>,
    /// Per partition, its earliest committed timers (bounded: see
    /// [`TimerIndex`]): read from the sink the first time a batch asks
    /// which are due, then kept up with each landed batch.
    timers: HashMap<TopicPartition, TimerIndex, foldhash::fast::RandomState>,
    /// Per partition, bumped whenever its committed state changes here (a
    /// batch of it landed, it was forgotten): a timer index read from the
    /// sink meanwhile may miss the change, and is read again.
    generations: HashMap<TopicPartition, u64, foldhash::fast::RandomState>,
}

/// A batch handed to the sink, not landed yet.
struct Pending {
    batch_id: String,
    writes: PartitionTables,
    /// With a partition limit, the bytes its writes add to each partition
    /// they change (negative: remove).
    growth: HashMap<TopicPartition, isize>,
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
    stored: StateSize,
    /// No cached value expires before this (`None`: none expires).
    earliest_expiry: Option<i64>,
    /// The batch time of the last search for expired keys.
    swept_at: Option<i64>,
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
    /// `budget` bytes, refusing batches that take a partition past
    /// `max_partition_bytes`. Must be created inside the Tokio runtime the
    /// store uses.
    pub(crate) fn new(
        pipeline: &str,
        store: Option<Arc<dyn StateStore>>,
        budget: usize,
        max_partition_bytes: Option<usize>,
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
            max_partition_bytes,
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
        let whole: Vec<(&TopicPartition, StateSize)> = kept
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
    /// from now on build on them. With a partition limit, writes that take
    /// a partition past it are refused ([`StateError::PartitionFull`]),
    /// and the batch must not be committed.
    pub(crate) async fn committing(
        &self,
        batch_id: &str,
        writes: &StateMap,
    ) -> Result<(), StateError> {
        if writes.is_empty() {
            return Ok(());
        }
        let growth = match (self.max_partition_bytes, &self.store) {
            (Some(limit), Some(store)) => self.growth_within(store.as_ref(), writes, limit).await?,
            _ => HashMap::new(),
        };
        let hashed: PartitionTables = writes
            .0
            .iter()
            .map(|(tp, keys)| {
                let keys: KeyTable = keys.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                (tp.clone(), keys)
            })
            .collect();
        self.kept().pending.push_back(Pending {
            batch_id: batch_id.to_string(),
            writes: hashed,
            growth,
        });
        Ok(())
    }

    /// The bytes `writes` add to each partition they change, if none goes
    /// past `limit` with them (its committed state, plus what batches not
    /// yet landed add, plus this). A batch that does not grow a partition
    /// passes even over the limit (it may be what brings it back under).
    /// Old values the cache cannot give are read from the sink in one
    /// round trip per partition; a partition not held whole is measured
    /// in the sink the first time.
    async fn growth_within(
        &self,
        store: &dyn StateStore,
        writes: &StateMap,
        limit: usize,
    ) -> Result<HashMap<TopicPartition, isize>, StateError> {
        let stored =
            |key: &[u8], value: &Option<StateValue>| StateSize::bytes_of(key.len(), value) as isize;
        let mut growth = HashMap::new();
        for (tp, keys) in &writes.0 {
            let mut delta: isize = keys.iter().map(|(k, v)| stored(k, v)).sum();
            let mut unknown = Vec::new();
            let (committed, in_flight) = {
                let kept = self.kept();
                for key in keys.keys() {
                    match kept.known(tp, key) {
                        Some(old) => delta -= stored(key, &old),
                        None => unknown.push(key.as_slice()),
                    }
                }
                let in_flight: isize = (kept.pending.iter()).filter_map(|p| p.growth.get(tp)).sum();
                (kept.committed_bytes(tp), in_flight)
            };
            if !unknown.is_empty() {
                let olds = store.get_many(&self.pipeline, tp, &unknown).await?;
                delta -= unknown
                    .iter()
                    .zip(&olds)
                    .map(|(k, old)| stored(k, old))
                    .sum::<isize>();
            }
            let committed = match committed {
                Some(bytes) => bytes,
                None => {
                    let bytes = store.size(&self.pipeline, tp).await?.bytes;
                    self.kept().measured.insert(tp.clone(), bytes);
                    bytes
                }
            };
            let after = committed as isize + in_flight + delta;
            if delta > 0 && after > limit as isize {
                return Err(StateError::PartitionFull {
                    partition: tp.to_string(),
                    bytes: after as usize,
                    limit,
                });
            }
            growth.insert(tp.clone(), delta);
        }
        Ok(growth)
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
                        .any(|p| p.writes.get(tp).is_some_and(|keys| keys.contains_key(key)))
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
        let Some(at) = kept.pending.iter().position(|p| p.batch_id == batch_id) else {
            return;
        };
        let landed = kept.pending.remove(at).expect("found");
        for (tp, keys) in landed.writes {
            *kept.generations.entry(tp.clone()).or_default() += 1;
            if let Some(timers) = kept.timers.get_mut(&tp) {
                timers.landed(keys.iter());
            }
            kept.cache(&tp, keys);
        }
        for (tp, delta) in landed.growth {
            if let Some(bytes) = kept.measured.get_mut(&tp) {
                *bytes = bytes.saturating_add_signed(delta);
            }
        }
        kept.fit_budget(self.budget);
        self.measured(&kept);
    }

    /// Batch `batch_id` did not land (fenced): its writes are dropped, and
    /// so is the cache of `partitions`, read again from the sink when next
    /// asked.
    pub(crate) fn abandoned(&self, batch_id: &str, partitions: &[TopicPartition]) {
        self.kept().pending.retain(|p| p.batch_id != batch_id);
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
            kept.measured.remove(tp);
            kept.timers.remove(tp);
            *kept.generations.entry(tp.clone()).or_default() += 1;
            for pending in kept.pending.iter_mut() {
                pending.writes.remove(tp);
                pending.growth.remove(tp);
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
    /// The timers of `tp` due by `watermark` for a batch prepared now (its
    /// committed ones, changed by the batches not landed yet; at most what
    /// a [`TimerIndex`] holds, the rest in later batches), as the value of
    /// [`event_time::due_key`]: `None` if none.
    fn due(&self, tp: &TopicPartition, watermark: i64) -> Result<Option<StateValue>, StateError> {
        loop {
            let (after, generation) = {
                let kept = self.kept();
                let after = match kept.timers.get(tp) {
                    None => None,
                    Some(index) if index.wants_refill(watermark) => index.refill_from(),
                    Some(_) => break,
                };
                (after, kept.generations.get(tp).copied())
            };
            let store = self.store.as_ref().expect("a live base has a store");
            let started = Instant::now();
            let read = TimerIndex::read(store.as_ref(), &self.pipeline, tp, after);
            let refill = self.handle.block_on(read)?;
            self.metrics
                .state_sink_read(SinkRead::Partition, started.elapsed());
            let mut kept = self.kept();
            // A batch that landed while the sink was read may be missing
            // from what was read (and is no longer pending): read again.
            if kept.generations.get(tp).copied() == generation {
                kept.timers.entry(tp.clone()).or_default().refilled(refill);
                break;
            }
        }
        let kept = self.kept();
        let pending = (kept.pending.iter()).filter_map(|p| p.writes.get(tp));
        let due = kept
            .timers
            .get(tp)
            .expect("read above")
            .due(watermark, pending);
        if due.is_empty() {
            return Ok(None);
        }
        Ok(Some(StateValue {
            value: event_time::encode_timers(&due),
            expires_at_ms: None,
        }))
    }

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
        for pending in self.pending.iter().rev() {
            if let Some(value) = pending.writes.get(tp).and_then(|keys| keys.get(key)) {
                return Some(value.clone());
            }
        }
        let cached = self.partitions.get(tp)?;
        match cached.keys.get(key) {
            Some(value) => Some(value.clone()),
            None => cached.complete.then_some(None),
        }
    }

    /// The committed state bytes of `tp`, if known: held whole, or
    /// measured.
    fn committed_bytes(&self, tp: &TopicPartition) -> Option<usize> {
        match self.partitions.get(tp) {
            Some(cached) if cached.complete => Some(cached.stored.bytes),
            _ => self.measured.get(tp).copied(),
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
        match event_time::parse_due_key(key) {
            Some(watermark) => self.kept.due(tp, watermark),
            None => self.kept.get(tp, key, self.batch.get()),
        }
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
        assert_eq!(
            cached.expired(5_000, nothing_changed),
            vec![b"at5000".to_vec()]
        );
    }
}
