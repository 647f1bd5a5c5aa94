//! Keyed state as the batch loop sees it: what a batch wrote (a
//! [`StateMap`] in `Output::state`, part of its result and its digest), what
//! its runs read of the state it started from ([`Recorded`], kept with its lineage
//! so a replay can serve the same), the [`StateBase`] a run reads through,
//! and one run's view ([`RunState`]: the base plus the run's own writes).
//!
//! State is scoped to an input partition: a key of partition 3 is not a key
//! of partition 4. A value may expire at a time the module sets; expiry is
//! judged against the batch plan's time, never the host's clock.
//!
//! It must not know where state is kept (a sink's table, a cache): the
//! pipeline implements [`StateBase`] over its cache and sink, the replay
//! over recorded reads.

use crate::batch::{Records, TopicPartition};
use crate::event_time::{
    self, EventTimeSettings, FiredTimer, FiredValues, HOST_KEY_BYTE, LateRecord,
    MAX_TIMER_KEY_BYTES, PartitionClock, RunClock, Timer, WATERMARK_KEY,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Longest state key, in bytes (the key column of MariaDB's state table is
/// `VARBINARY(255)`; every sink keeps the same bound so a module runs the
/// same on any).
pub const MAX_KEY_BYTES: usize = 255;

/// A stored value and when it expires (ms since the Unix epoch), if ever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateValue {
    pub value: Vec<u8>,
    pub expires_at_ms: Option<i64>,
}

impl StateValue {
    /// True if a batch whose batch time is `batch_time_ms` reads it as absent.
    pub fn expired_at(&self, batch_time_ms: i64) -> bool {
        self.expires_at_ms.is_some_and(|at| at <= batch_time_ms)
    }

    /// Bytes it takes in memory, roughly (for the cache's budget).
    pub fn size(&self) -> usize {
        self.value.len() + 16
    }

    /// The bytes a store keeps for it where a value is one blob (a Redis
    /// hash field, a changelog record): tag byte `1` then the value, or
    /// `2`, the expiry (i64, big-endian ms since the epoch) and the value.
    pub fn to_stored(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.value.len() + 9);
        match self.expires_at_ms {
            None => out.push(1),
            Some(at) => {
                out.push(2);
                out.extend_from_slice(&at.to_be_bytes());
            }
        }
        out.extend_from_slice(&self.value);
        out
    }

    /// Reads back what [`StateValue::to_stored`] wrote.
    pub fn from_stored(bytes: &[u8]) -> Result<StateValue, StateError> {
        match bytes.split_first() {
            Some((1, value)) => Ok(StateValue {
                value: value.to_vec(),
                expires_at_ms: None,
            }),
            Some((2, rest)) if rest.len() >= 8 => {
                let (at, value) = rest.split_at(8);
                Ok(StateValue {
                    value: value.to_vec(),
                    expires_at_ms: Some(i64::from_be_bytes(at.try_into().expect("8 bytes"))),
                })
            }
            _ => Err(StateError::Corrupt(
                "a stored state value without sluice's tag byte".into(),
            )),
        }
    }
}

/// Keys of one partition and what is known of each: a value, or `None` for
/// absent (deleted, never written).
pub type Keys = BTreeMap<Vec<u8>, Option<StateValue>>;

/// The same, hashed: what is looked up per record while a batch runs
/// (a [`Keys`] is built from it, in key order, once the runs are done).
pub type KeyTable =
    std::collections::HashMap<Vec<u8>, Option<StateValue>, foldhash::fast::RandomState>;

/// Per partition, a [`KeyTable`].
pub type PartitionTables =
    std::collections::HashMap<TopicPartition, KeyTable, foldhash::fast::RandomState>;

/// Per partition, keys and their values: the shape of both what a batch
/// wrote and what it read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateMap(pub BTreeMap<TopicPartition, Keys>);

impl StateMap {
    pub fn is_empty(&self) -> bool {
        self.0.values().all(BTreeMap::is_empty)
    }

    /// Number of keys over all partitions.
    pub fn len(&self) -> usize {
        self.0.values().map(BTreeMap::len).sum()
    }

    /// What is known of `key` in `tp`: `None` if nothing, `Some(None)` if
    /// known absent.
    pub fn lookup(&self, tp: &TopicPartition, key: &[u8]) -> Option<Option<&StateValue>> {
        self.0.get(tp)?.get(key).map(Option::as_ref)
    }

    pub fn insert(&mut self, tp: &TopicPartition, key: Vec<u8>, value: Option<StateValue>) {
        match self.0.get_mut(tp) {
            Some(keys) => {
                keys.insert(key, value);
            }
            None => {
                self.0.insert(tp.clone(), Keys::from([(key, value)]));
            }
        }
    }

    /// The tables of `tables`, in partition and key order.
    pub fn from_tables(tables: PartitionTables) -> StateMap {
        StateMap(
            tables
                .into_iter()
                .filter(|(_, keys)| !keys.is_empty())
                .map(|(tp, keys)| (tp, keys.into_iter().collect()))
                .collect(),
        )
    }

    /// Takes `later`'s value of every key it has: a later part's or a later
    /// batch's writes over these.
    pub fn overlay(&mut self, later: StateMap) {
        for (tp, keys) in later.0 {
            self.0.entry(tp).or_default().extend(keys);
        }
    }

    /// Canonical bytes: partitions and keys in order, each value with its
    /// expiry. What the output digest hashes and lineage stores.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_len(&mut out, self.0.len());
        for (tp, keys) in &self.0 {
            put_bytes(&mut out, tp.topic.as_bytes());
            out.extend_from_slice(&tp.partition.to_be_bytes());
            put_keys(&mut out, keys);
        }
        out
    }

    /// Reads back what [`StateMap::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<StateMap, StateError> {
        let mut r = Reader(bytes);
        let mut map = StateMap::default();
        for _ in 0..r.len()? {
            let topic = String::from_utf8(r.bytes()?.to_vec())
                .map_err(|_| StateError::Corrupt("a topic is not UTF-8".into()))?;
            let partition = i32::from_be_bytes(r.array()?);
            map.0.insert(TopicPartition { topic, partition }, r.keys()?);
        }
        r.end()?;
        Ok(map)
    }
}

/// One partition's keys in [`StateMap::encode`]'s bytes (what follows the
/// partition there): the state journal's rows hold these.
pub fn encode_keys(keys: &Keys) -> Vec<u8> {
    let mut out = Vec::new();
    put_keys(&mut out, keys);
    out
}

/// The keys [`encode_keys`] wrote.
pub fn decode_keys(bytes: &[u8]) -> Result<Keys, StateError> {
    let mut r = Reader(bytes);
    let keys = r.keys()?;
    r.end()?;
    Ok(keys)
}

fn put_keys(out: &mut Vec<u8>, keys: &Keys) {
    put_len(out, keys.len());
    for (key, value) in keys {
        put_bytes(out, key);
        match value {
            None => out.push(0),
            Some(v) => {
                match v.expires_at_ms {
                    None => out.push(1),
                    Some(at) => {
                        out.push(2);
                        out.extend_from_slice(&at.to_be_bytes());
                    }
                }
                put_bytes(out, &v.value);
            }
        }
    }
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u32).to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_len(out, b.len());
    out.extend_from_slice(b);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StateError> {
        if self.0.len() < n {
            return Err(StateError::Corrupt("cut short".into()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], StateError> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }
    fn byte(&mut self) -> Result<u8, StateError> {
        Ok(self.take(1)?[0])
    }
    fn len(&mut self) -> Result<usize, StateError> {
        Ok(u32::from_be_bytes(self.array()?) as usize)
    }
    fn keys(&mut self) -> Result<Keys, StateError> {
        // Gathered, then built at once: the keys were written in order, so
        // the map is built without a search per key.
        let count = self.len()?;
        // A key takes 5 bytes at least: a corrupt count reserves no more.
        let mut keys = Vec::with_capacity(count.min(self.0.len() / 5));
        for _ in 0..count {
            let key = self.bytes()?.to_vec();
            let value = match self.byte()? {
                0 => None,
                tag @ (1 | 2) => {
                    let expires_at_ms = (tag == 2).then(|| self.array()).transpose()?;
                    Some(StateValue {
                        expires_at_ms: expires_at_ms.map(i64::from_be_bytes),
                        value: self.bytes()?.to_vec(),
                    })
                }
                other => return Err(StateError::Corrupt(format!("value tag {other}"))),
            };
            keys.push((key, value));
        }
        Ok(Keys::from_iter(keys))
    }
    fn end(&self) -> Result<(), StateError> {
        match self.0.is_empty() {
            true => Ok(()),
            false => Err(StateError::Corrupt("bytes after the end".into())),
        }
    }
    fn bytes(&mut self) -> Result<&'a [u8], StateError> {
        let n = self.len()?;
        self.take(n)
    }
}

/// Why state could not be read or kept.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    /// The store could not be reached: the batch may pass on another try.
    #[error("state store unavailable: {0}")]
    Unavailable(String),
    /// The sink keeps no keyed state: fatal, pick a sink that does.
    #[error("{0}")]
    Unsupported(String),
    /// A replay asked for a key its batch's original runs never read: the
    /// module does not read the same state for the same records.
    #[error(
        "the replay read state key {key} of {partition}, which the batch's original runs never read"
    )]
    NotRecorded { partition: String, key: String },
    /// Recorded state bytes do not decode.
    #[error("recorded state does not decode: {0}")]
    Corrupt(String),
    /// A scan of a store that reads a partition whole met one too large.
    #[error(
        "the state of {partition} is over {max_mib} MiB and this sink's store reads a partition \
         whole to scan it: look keys up one by one (`sluice state get`)"
    )]
    TooLargeToScan { partition: String, max_mib: usize },
    /// A batch would take a partition's state past
    /// `limits.max_state_partition_mib`: fatal, it is not committed.
    #[error(
        "a batch would take the keyed state of {partition} to {bytes} bytes, over \
         `limits.max_state_partition_mib` ({limit} bytes); nothing of it was committed. Raise \
         the limit, or have the module expire or delete keys, and start the pipeline again"
    )]
    PartitionFull {
        partition: String,
        bytes: usize,
        limit: usize,
    },
}

impl StateError {
    /// The store could not be read; `cause` says why.
    pub fn unreadable(cause: impl std::fmt::Display) -> Self {
        StateError::Unavailable(format!("reading keyed state: {cause}"))
    }
}

/// Where a run reads the state its batch started from.
pub trait StateBase: Send + Sync {
    /// The value of `key` in `tp` as the batch started (expired or not:
    /// the run judges expiry), or `None` if absent.
    fn get(&self, tp: &TopicPartition, key: &[u8]) -> Result<Option<StateValue>, StateError>;
    /// Whether what a run writes can be kept: a sink without keyed state
    /// refuses the first write, so state is never dropped silently.
    fn writable(&self) -> Result<(), StateError> {
        Ok(())
    }
    /// A hint before the batch `records` runs: a base that reads keys from
    /// a store one by one may read the records' own keys (what most
    /// stateful modules key state by) in one round trip per partition.
    /// It must not change what any read returns.
    fn prefetch(&self, _records: &Records) {}
    /// Keys of `partitions` stored with a value expired at `batch_time_ms`
    /// that the batch, writing `written`, leaves alone: the batch deletes
    /// them with its own changes, so expired state does not stay stored.
    /// Which expired keys a batch takes (any, all or none) changes no
    /// read: an expired key reads as absent. So it is not part of the
    /// batch's result or digest, and a replay takes none (the default).
    fn expired(
        &self,
        _partitions: &[TopicPartition],
        _batch_time_ms: i64,
        _written: &StateMap,
    ) -> StateMap {
        StateMap::default()
    }
}

/// A base for a sink that keeps no keyed state: every state call fails,
/// saying so.
pub struct NoState(pub String);

impl StateBase for NoState {
    fn get(&self, _: &TopicPartition, _: &[u8]) -> Result<Option<StateValue>, StateError> {
        Err(StateError::Unsupported(self.0.clone()))
    }

    fn writable(&self) -> Result<(), StateError> {
        Err(StateError::Unsupported(self.0.clone()))
    }
}

/// Where a sink keeps the keyed state it commits with its batches: what
/// the pipeline's cache reads it from. Writes are not here: they land in
/// the sink's commit, with the rows and offsets.
#[async_trait::async_trait]
pub trait StateStore: Send + Sync {
    /// Every key of `tp` (expired ones too), if they take at most
    /// `max_bytes` ([`StateValue::size`] plus the key); `None` if more.
    async fn load(
        &self,
        pipeline: &str,
        tp: &TopicPartition,
        max_bytes: usize,
    ) -> Result<Option<Vec<(Vec<u8>, StateValue)>>, StateError>;
    /// The value under `key` in `tp`, if any.
    async fn get(
        &self,
        pipeline: &str,
        tp: &TopicPartition,
        key: &[u8],
    ) -> Result<Option<StateValue>, StateError>;
    /// The values of `keys` in `tp`, in their order (`None`: absent). This
    /// default asks [`StateStore::get`] key by key; a store that can
    /// answer many keys in one round trip does.
    async fn get_many(
        &self,
        pipeline: &str,
        tp: &TopicPartition,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<StateValue>>, StateError> {
        let mut values = Vec::with_capacity(keys.len());
        for key in keys {
            values.push(self.get(pipeline, tp, key).await?);
        }
        Ok(values)
    }
    /// One page of `tp`'s keys in key order (expired ones too): at most
    /// `page.limit` keys starting with `page.prefix`, after `page.after`.
    /// This default loads the partition whole, up to [`SCAN_MAX_BYTES`]
    /// (a store that cannot read in key order); a store that can reads
    /// just the page.
    async fn scan(
        &self,
        pipeline: &str,
        tp: &TopicPartition,
        page: &ScanPage,
    ) -> Result<Vec<(Vec<u8>, StateValue)>, StateError> {
        let mut keys = self
            .load(pipeline, tp, SCAN_MAX_BYTES)
            .await?
            .ok_or_else(|| StateError::TooLargeToScan {
                partition: tp.to_string(),
                max_mib: SCAN_MAX_BYTES >> 20,
            })?;
        keys.retain(|(key, _)| page.holds(key));
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        keys.truncate(page.limit);
        Ok(keys)
    }
    /// How much state `tp` keeps (expired keys too). This default loads
    /// the partition whole; a store that can count where it keeps the
    /// state does.
    async fn size(&self, pipeline: &str, tp: &TopicPartition) -> Result<StateSize, StateError> {
        let keys = self.load(pipeline, tp, usize::MAX).await?;
        let mut size = StateSize::default();
        for (key, value) in keys.unwrap_or_default() {
            size.count(key.len(), &Some(value), 1);
        }
        Ok(size)
    }
}

/// How much state a partition keeps: keys with a value, and the bytes of
/// those keys and values (what `limits.max_state_partition_mib` bounds).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StateSize {
    pub keys: usize,
    pub bytes: usize,
}

impl StateSize {
    /// The bytes `value` under a key of `key_len` bytes counts for (0 if
    /// absent): the key's and the value's, not its expiry.
    pub fn bytes_of(key_len: usize, value: &Option<StateValue>) -> usize {
        value.as_ref().map_or(0, |v| key_len + v.value.len())
    }

    /// Counts `value` under a key of `key_len` bytes in (`sign` 1) or out
    /// (`sign` -1); an absent value counts nothing.
    pub fn count(&mut self, key_len: usize, value: &Option<StateValue>, sign: isize) {
        if value.is_some() {
            self.keys = self.keys.saturating_add_signed(sign);
            self.bytes = self
                .bytes
                .saturating_add_signed(sign * Self::bytes_of(key_len, value) as isize);
        }
    }
}

/// The most a store without key-ordered reads loads of one partition to
/// answer a [`StateStore::scan`].
pub const SCAN_MAX_BYTES: usize = 256 << 20;

/// Which keys a [`StateStore::scan`] returns.
#[derive(Debug, Clone, Default)]
pub struct ScanPage {
    /// Only keys starting with these bytes.
    pub prefix: Vec<u8>,
    /// Only keys after this one (the last key of the page before).
    pub after: Option<Vec<u8>>,
    /// At most this many keys.
    pub limit: usize,
}

impl ScanPage {
    /// Whether `key` belongs to the page's range (the limit aside).
    pub fn holds(&self, key: &[u8]) -> bool {
        key.starts_with(&self.prefix) && self.after.as_deref().is_none_or(|after| key > after)
    }
}

/// An empty base: every key absent (`sluice test`, a first batch).
pub struct EmptyState;

impl StateBase for EmptyState {
    fn get(&self, _: &TopicPartition, _: &[u8]) -> Result<Option<StateValue>, StateError> {
        Ok(None)
    }
}

/// A recorded read set as a base: a replay serves what the original runs
/// read, and fails on a key they never read.
pub struct Recorded(pub StateMap);

impl StateBase for Recorded {
    fn get(&self, tp: &TopicPartition, key: &[u8]) -> Result<Option<StateValue>, StateError> {
        match self.0.lookup(tp, key) {
            Some(value) => Ok(value.cloned()),
            None => Err(StateError::NotRecorded {
                partition: tp.to_string(),
                key: String::from_utf8_lossy(key).into_owned(),
            }),
        }
    }
}

/// A batch's base, remembering every key any of its runs read (a retry, a
/// bisection's parts, the final run): all runs of a batch start from the
/// same state, and a replay makes the same runs, so what they read is what
/// a replay needs.
pub struct BatchBase {
    base: Arc<dyn StateBase>,
    reads: Mutex<PartitionTables>,
}

impl BatchBase {
    pub fn new(base: Arc<dyn StateBase>) -> Arc<BatchBase> {
        Arc::new(BatchBase {
            base,
            reads: Mutex::default(),
        })
    }

    fn read_so_far(&self) -> std::sync::MutexGuard<'_, PartitionTables> {
        self.reads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Everything read, in order; the reads are taken (the batch's runs
    /// are done).
    pub fn take_reads(&self) -> StateMap {
        StateMap::from_tables(std::mem::take(&mut *self.read_so_far()))
    }

    /// Whether any run has read a key yet (without copying the reads).
    pub fn has_reads(&self) -> bool {
        self.read_so_far().values().any(|keys| !keys.is_empty())
    }
}

impl StateBase for BatchBase {
    fn get(&self, tp: &TopicPartition, key: &[u8]) -> Result<Option<StateValue>, StateError> {
        let mut reads = self.read_so_far();
        if let Some(known) = reads.get(tp).and_then(|keys| keys.get(key)) {
            return Ok(known.clone());
        }
        let value = self.base.get(tp, key)?;
        match reads.get_mut(tp) {
            Some(keys) => {
                keys.insert(key.to_vec(), value.clone());
            }
            None => {
                let keys = KeyTable::from_iter([(key.to_vec(), value.clone())]);
                reads.insert(tp.clone(), keys);
            }
        }
        Ok(value)
    }

    fn writable(&self) -> Result<(), StateError> {
        self.base.writable()
    }
}

/// Limits on what a module may keep, from `[limits]`.
#[derive(Debug, Clone, Copy)]
pub struct StateLimits {
    /// Largest value, in bytes.
    pub max_value_bytes: usize,
    /// Most distinct keys one run may write or delete.
    pub max_keys_per_batch: usize,
    /// Most bytes one run's state changes may hold (keys and values,
    /// timers' values among them): `limits.max_output_mib`.
    pub max_write_bytes: usize,
    /// Most bytes of timer values one run's due timers hand out; the rest
    /// stay due for the next batch (a quarter of the module's memory, so
    /// the module can take them).
    pub max_fired_value_bytes: usize,
    /// How event time is judged.
    pub event_time: EventTimeSettings,
}

/// A state call that breaks the limits: the record it was made for is at
/// fault (a `contract` dead letter).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StateMisuse {
    #[error("state key of {0} bytes is over the limit of {MAX_KEY_BYTES} bytes")]
    KeyTooLong(usize),
    #[error(
        "state value of {bytes} bytes is over the limit of {limit} bytes (`limits.max_state_value_kib`)"
    )]
    ValueTooLarge { bytes: usize, limit: usize },
    #[error(
        "a state write to one key more than the limit of {limit} keys per batch (`limits.max_state_keys_per_batch`)"
    )]
    TooManyKeys { limit: usize },
    #[error("state call for record {index}, but the batch has {records} records")]
    NoSuchRecord { index: u32, records: usize },
    #[error("state keys starting with the byte 0xFF are the host's (watermarks, timers)")]
    HostKey,
    #[error("timer key of {0} bytes is over the limit of {MAX_TIMER_KEY_BYTES} bytes")]
    TimerKeyTooLong(usize),
}

/// Why a state call failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StateCallError {
    #[error(transparent)]
    Misuse(#[from] StateMisuse),
    /// The run's state changes would hold more than `max_write_bytes`:
    /// its output is too large (isolated as such, not as a misuse).
    #[error(
        "the batch's state changes would hold {bytes} bytes, over the limit of {limit} bytes (`limits.max_output_mib`)"
    )]
    OverOutput { bytes: usize, limit: usize },
    #[error(transparent)]
    Base(#[from] StateError),
}

/// One run's view of state: the batch's base plus the run's own writes.
pub struct RunState {
    base: Arc<dyn StateBase>,
    batch_time_ms: i64,
    limits: StateLimits,
    /// Where each slice of the run's records starts, and the index of its
    /// partition in `partitions`.
    slices: Vec<(u32, usize)>,
    partitions: Vec<TopicPartition>,
    records: usize,
    /// Per partition (as `partitions`), what the run wrote: the last
    /// change of each key.
    writes: Vec<KeyTable>,
    /// Keys in `writes`, over all partitions.
    keys_written: usize,
    /// What `writes` holds, in [`written_bytes`].
    bytes_written: usize,
    /// The records' Kafka timestamps: their event times unless the module
    /// sets others.
    timestamps: Vec<i64>,
    /// Event time, from the run's first `time` call on.
    clock: Option<RunClock>,
}

/// What a run leaves besides its output rows: its state changes (the
/// watermarks it moved and the timers it fired among them) and the
/// records it found late.
#[derive(Debug, Default)]
pub struct RunWrites {
    pub state: StateMap,
    pub late: Vec<LateRecord>,
}

/// What a change of a key of `key_len` bytes holds, as the write budget
/// counts it: the key and the value (a delete, the key).
fn written_bytes(key_len: usize, value: &Option<StateValue>) -> usize {
    key_len + value.as_ref().map_or(0, |v| v.value.len())
}

impl RunState {
    pub fn new(
        base: Arc<dyn StateBase>,
        records: &Records,
        batch_time_ms: i64,
        limits: StateLimits,
    ) -> RunState {
        let mut partitions: Vec<TopicPartition> = Vec::new();
        let mut slices = Vec::with_capacity(records.slices.len());
        for s in &records.slices {
            let tp = s.topic_partition();
            let at = match partitions.iter().position(|p| *p == tp) {
                Some(at) => at,
                None => {
                    partitions.push(tp);
                    partitions.len() - 1
                }
            };
            slices.push((s.first, at));
        }
        RunState {
            base,
            batch_time_ms,
            limits,
            slices,
            writes: vec![KeyTable::default(); partitions.len()],
            partitions,
            records: records.len(),
            keys_written: 0,
            bytes_written: 0,
            timestamps: records.timestamps.clone(),
            clock: None,
        }
    }

    /// The index (in `partitions`) of record `index`'s partition.
    fn partition(&self, index: u32) -> Result<usize, StateMisuse> {
        if index as usize >= self.records {
            return Err(StateMisuse::NoSuchRecord {
                index,
                records: self.records,
            });
        }
        let at = self.slices.partition_point(|(first, _)| *first <= index);
        Ok(self.slices[at - 1].1)
    }

    fn check_key(key: &[u8]) -> Result<(), StateMisuse> {
        match key {
            _ if key.len() > MAX_KEY_BYTES => Err(StateMisuse::KeyTooLong(key.len())),
            [HOST_KEY_BYTE, ..] => Err(StateMisuse::HostKey),
            _ => Ok(()),
        }
    }

    pub fn get(&self, index: u32, key: &[u8]) -> Result<Option<Vec<u8>>, StateCallError> {
        Self::check_key(key)?;
        let p = self.partition(index)?;
        let value = match self.writes[p].get(key) {
            Some(written) => written.clone(),
            None => self.base.get(&self.partitions[p], key)?,
        };
        Ok(value
            .filter(|v| !v.expired_at(self.batch_time_ms))
            .map(|v| v.value))
    }

    pub fn set(
        &mut self,
        index: u32,
        key: Vec<u8>,
        value: Vec<u8>,
        expires_at_ms: Option<i64>,
    ) -> Result<(), StateCallError> {
        Self::check_key(&key)?;
        if value.len() > self.limits.max_value_bytes {
            return Err(StateMisuse::ValueTooLarge {
                bytes: value.len(),
                limit: self.limits.max_value_bytes,
            }
            .into());
        }
        let p = self.partition(index)?;
        self.write(
            p,
            key,
            Some(StateValue {
                value,
                expires_at_ms,
            }),
        )
    }

    pub fn delete(&mut self, index: u32, key: Vec<u8>) -> Result<(), StateCallError> {
        Self::check_key(&key)?;
        let p = self.partition(index)?;
        self.write(p, key, None)
    }

    /// Keeps a change of `key` in partition `p`, refusing a key the run has
    /// not written yet once it has written `max_keys_per_batch` keys (a key
    /// written again is free), and a change that takes what the run's
    /// changes hold past `max_write_bytes` (one that holds no more than
    /// the key's last change is free).
    fn write(
        &mut self,
        p: usize,
        key: Vec<u8>,
        value: Option<StateValue>,
    ) -> Result<(), StateCallError> {
        let before = self.writes[p]
            .get(&key)
            .map(|v| written_bytes(key.len(), v));
        if before.is_none() && self.keys_written >= self.limits.max_keys_per_batch {
            return Err(StateMisuse::TooManyKeys {
                limit: self.limits.max_keys_per_batch,
            }
            .into());
        }
        let after = written_bytes(key.len(), &value);
        let held = self.bytes_written - before.unwrap_or(0) + after;
        if after > before.unwrap_or(0) && held > self.limits.max_write_bytes {
            return Err(StateCallError::OverOutput {
                bytes: held,
                limit: self.limits.max_write_bytes,
            });
        }
        self.base.writable()?;
        self.keep(p, key, value);
        Ok(())
    }

    /// Puts a change into `writes`, counting its key and bytes.
    fn keep(&mut self, p: usize, key: Vec<u8>, value: Option<StateValue>) {
        let key_len = key.len();
        let added = written_bytes(key_len, &value);
        match self.writes[p].insert(key, value) {
            None => self.keys_written += 1,
            Some(before) => self.bytes_written -= written_bytes(key_len, &before),
        }
        self.bytes_written += added;
    }

    /// What the run wrote, one change per key (the last), with the
    /// watermarks it moved; and the records it found late.
    pub fn finish(mut self) -> RunWrites {
        let mut late = Vec::new();
        if let Some(clock) = self.clock.take() {
            for (p, partition) in clock.partitions.iter().enumerate() {
                let moved = partition.moved(self.highest(&clock, p), self.limits.event_time);
                if let Some(watermark) = moved.filter(|_| moved != partition.started) {
                    let value = event_time::encode_watermark(watermark);
                    self.host_write(p, WATERMARK_KEY.to_vec(), Some(value));
                }
            }
            late = clock.late;
        }
        RunWrites {
            state: StateMap::from_tables(self.partitions.into_iter().zip(self.writes).collect()),
            late,
        }
    }

    /// A change the host makes (a watermark, a fired timer's removal): no
    /// limit of the module's applies.
    fn host_write(&mut self, p: usize, key: Vec<u8>, value: Option<Vec<u8>>) {
        let value = value.map(|value| StateValue {
            value,
            expires_at_ms: None,
        });
        self.keep(p, key, value);
    }

    /// The run's event time, made at the first call that needs it: the
    /// starting watermark of every partition of the run is read then.
    fn clock(&mut self) -> Result<&mut RunClock, StateCallError> {
        if self.clock.is_none() {
            let mut partitions = Vec::with_capacity(self.partitions.len());
            for (p, tp) in self.partitions.iter().enumerate() {
                let stored = self.base.get(tp, WATERMARK_KEY)?;
                let started = stored
                    .map(|v| event_time::decode_watermark(&v.value))
                    .transpose()?;
                let index = self
                    .slices
                    .iter()
                    .find(|(_, at)| *at == p)
                    .expect("a slice")
                    .0;
                partitions.push(PartitionClock {
                    started,
                    index,
                    running: None,
                    before: 0,
                });
            }
            self.clock = Some(RunClock {
                partitions,
                times: std::mem::take(&mut self.timestamps),
                late: Vec::new(),
            });
        }
        Ok(self.clock.as_mut().expect("made above"))
    }

    /// The highest event time of the run's records of partition `p`.
    fn highest(&self, clock: &RunClock, p: usize) -> Option<i64> {
        let ends = self.slices.iter().skip(1).map(|(first, _)| *first);
        let ends = ends.chain([self.records as u32]);
        (self.slices.iter().zip(ends))
            .filter(|((_, at), _)| *at == p)
            .flat_map(|((first, _), end)| clock.times[*first as usize..end as usize].iter())
            .copied()
            .filter(|t| *t != event_time::NO_TIME)
            .max()
    }

    /// The watermark of record `index`'s partition just before it: as
    /// the batch started, moved by the partition's records before it in
    /// the batch. So which records are late does not depend on where
    /// batches begin and end. Cheap when asked in record order.
    pub fn watermark(&mut self, index: u32) -> Result<Option<i64>, StateCallError> {
        let p = self.partition(index)?;
        let settings = self.limits.event_time;
        self.clock()?;
        let mut clock = self.clock.take().expect("made above");
        let partition = &mut clock.partitions[p];
        if index < partition.before {
            (partition.running, partition.before) = (None, 0);
        }
        for j in partition.before..index {
            let time = clock.times[j as usize];
            if time != event_time::NO_TIME && self.partition(j).is_ok_and(|at| at == p) {
                partition.running = partition.running.max(Some(time));
            }
        }
        partition.before = index;
        let watermark = partition.moved(partition.running, settings);
        self.clock = Some(clock);
        Ok(watermark)
    }

    /// Sets record `index`'s event time; `None` leaves it out of the
    /// watermark.
    pub fn set_record_time(
        &mut self,
        index: u32,
        time_ms: Option<i64>,
    ) -> Result<(), StateCallError> {
        self.partition(index)?;
        self.clock()?.times[index as usize] = time_ms.unwrap_or(event_time::NO_TIME);
        Ok(())
    }

    fn check_timer_key(key: &[u8]) -> Result<(), StateMisuse> {
        match key.len() > MAX_TIMER_KEY_BYTES {
            true => Err(StateMisuse::TimerKeyTooLong(key.len())),
            false => Ok(()),
        }
    }

    /// Sets the timer (`key`, `at_ms`) on record `index`'s partition,
    /// keeping `value` with it (empty: none), bounded like a state value.
    pub fn set_timer(
        &mut self,
        index: u32,
        key: Vec<u8>,
        at_ms: i64,
        value: Vec<u8>,
    ) -> Result<(), StateCallError> {
        if value.len() > self.limits.max_value_bytes {
            return Err(StateMisuse::ValueTooLarge {
                bytes: value.len(),
                limit: self.limits.max_value_bytes,
            }
            .into());
        }
        let set = StateValue {
            value,
            expires_at_ms: None,
        };
        self.timer(index, Timer { at_ms, key }, Some(set))
    }

    /// The value kept with the timer (`key`, `at_ms`) of record `index`'s
    /// partition; `None` if there is no such timer (never set, deleted,
    /// fired). A stored one is read through the base (recorded).
    pub fn timer_value(
        &self,
        index: u32,
        key: Vec<u8>,
        at_ms: i64,
    ) -> Result<Option<Vec<u8>>, StateCallError> {
        Self::check_timer_key(&key)?;
        let p = self.partition(index)?;
        self.timer_value_at(p, &Timer { at_ms, key }.state_key())
    }

    /// The value under timer state key `key` of partition `p`: the run's
    /// own change, else the base's (recorded).
    fn timer_value_at(&self, p: usize, key: &[u8]) -> Result<Option<Vec<u8>>, StateCallError> {
        let value = match self.writes[p].get(key) {
            Some(written) => written.clone(),
            None => self.base.get(&self.partitions[p], key)?,
        };
        Ok(value.map(|v| v.value))
    }

    /// Removes the timer (`key`, `at_ms`) of record `index`'s partition.
    pub fn delete_timer(
        &mut self,
        index: u32,
        key: Vec<u8>,
        at_ms: i64,
    ) -> Result<(), StateCallError> {
        self.timer(index, Timer { at_ms, key }, None)
    }

    /// Writes `timer`'s state key (set: an empty value; deleted: none).
    fn timer(
        &mut self,
        index: u32,
        timer: Timer,
        value: Option<StateValue>,
    ) -> Result<(), StateCallError> {
        Self::check_timer_key(&timer.key)?;
        let p = self.partition(index)?;
        self.clock()?;
        self.write(p, timer.state_key(), value)
    }

    /// Makes record `index` a `late` dead letter.
    pub fn late(&mut self, index: u32, reason: String) -> Result<(), StateCallError> {
        self.partition(index)?;
        self.clock()?.late.push(LateRecord { index, reason });
        Ok(())
    }

    /// The timers due by the watermark each partition's records move it
    /// to, oldest first, removed as they are returned: those stored (read
    /// through the base under a due key, so a replay is served the same)
    /// that the run has not changed, and those the run set.
    /// With [`FiredValues::Read`], each with the value kept with it, as
    /// many as `max_fired_value_bytes` of values take (at least one): the
    /// rest stay, due, for the partition's next batch.
    pub fn due_timers(&mut self, values: FiredValues) -> Result<Vec<FiredTimer>, StateCallError> {
        let settings = self.limits.event_time;
        self.clock()?;
        let clock = self.clock.take().expect("made above");
        let fired = self.due_in(&clock, settings, values);
        self.clock = Some(clock);
        fired
    }

    fn due_in(
        &mut self,
        clock: &RunClock,
        settings: EventTimeSettings,
        values: FiredValues,
    ) -> Result<Vec<FiredTimer>, StateCallError> {
        let mut fired = Vec::new();
        let mut value_bytes = 0usize;
        'partitions: for p in 0..self.partitions.len() {
            let highest = self.highest(clock, p);
            let Some(watermark) = clock.partitions[p].moved(highest, settings) else {
                continue;
            };
            let due_key = event_time::due_key(watermark);
            let stored = match self.base.get(&self.partitions[p], &due_key)? {
                Some(list) => event_time::decode_timers(&list.value)?,
                None => Vec::new(),
            };
            let writes = &self.writes[p];
            let mut due: std::collections::BTreeSet<Timer> = stored
                .into_iter()
                .filter(|t| !writes.contains_key(&t.state_key()))
                .collect();
            due.extend(
                (writes.iter())
                    .filter(|(key, value)| {
                        value.is_some()
                            && Timer::time_of_state_key(key).is_some_and(|at| at <= watermark)
                    })
                    .filter_map(|(key, _)| Timer::from_state_key(key)),
            );
            let index = clock.partitions[p].index;
            for timer in due {
                let key = timer.state_key();
                let value = match values {
                    FiredValues::Leave => None,
                    FiredValues::Read => self.timer_value_at(p, &key)?,
                };
                let size = value.as_ref().map_or(0, Vec::len);
                if value_bytes > 0 && value_bytes + size > self.limits.max_fired_value_bytes {
                    break 'partitions;
                }
                value_bytes += size;
                self.host_write(p, key, None);
                fired.push(FiredTimer {
                    index,
                    timer,
                    value: value.unwrap_or_default(),
                });
            }
        }
        fired.sort_by_key(|f| (f.timer.at_ms, f.index));
        Ok(fired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{OwnedRecord, Records};

    fn tp(p: i32) -> TopicPartition {
        TopicPartition {
            topic: "t".into(),
            partition: p,
        }
    }

    fn records() -> Records {
        let rec = |offset: i64| OwnedRecord {
            offset,
            timestamp: 0,
            key: None,
            value: Some(b"v".to_vec()),
            headers: Vec::new(),
        };
        let mut r = Records::default();
        r.push_slice("t", 0, &[rec(0), rec(1)]);
        r.push_slice("t", 1, &[rec(0)]);
        r
    }

    #[test]
    fn encoding_round_trips() {
        let mut m = StateMap::default();
        m.insert(&tp(0), b"a".to_vec(), None);
        m.insert(
            &tp(0),
            b"b".to_vec(),
            Some(StateValue {
                value: b"1".to_vec(),
                expires_at_ms: Some(-5),
            }),
        );
        m.insert(
            &tp(2),
            Vec::new(),
            Some(StateValue {
                value: Vec::new(),
                expires_at_ms: None,
            }),
        );
        assert_eq!(StateMap::decode(&m.encode()).unwrap(), m);
        assert!(StateMap::decode(&m.encode()[..7]).is_err());
        for v in m.0.values().flat_map(|k| k.values().flatten()) {
            assert_eq!(&StateValue::from_stored(&v.to_stored()).unwrap(), v);
        }
        assert!(StateValue::from_stored(b"").is_err());
        assert!(StateValue::from_stored(b"\x02short").is_err());
    }

    #[test]
    fn a_run_sees_its_writes_per_partition_and_expiry_by_batch_time() {
        let recs = records();
        let base = BatchBase::new(Arc::new(EmptyState));
        let limits = StateLimits {
            max_value_bytes: 4,
            max_keys_per_batch: 2,
            max_write_bytes: 1 << 20,
            max_fired_value_bytes: 1 << 20,
            event_time: EventTimeSettings::default(),
        };
        let mut run = RunState::new(base.clone(), &recs, 100, limits);
        run.set(0, b"k".to_vec(), b"x".to_vec(), None).unwrap();
        assert_eq!(run.get(1, b"k").unwrap(), Some(b"x".to_vec()));
        // Record 2 is partition 1: another key space.
        assert_eq!(run.get(2, b"k").unwrap(), None);
        run.set(1, b"e".to_vec(), b"y".to_vec(), Some(100)).unwrap();
        assert_eq!(run.get(1, b"e").unwrap(), None);
        assert!(matches!(
            run.set(0, b"k".to_vec(), b"12345".to_vec(), None),
            Err(StateCallError::Misuse(StateMisuse::ValueTooLarge { .. }))
        ));
        assert!(run.get(3, b"k").is_err());
        // Two keys written (`k` and `e`): a third is refused, `k` again is not.
        assert_eq!(
            run.set(0, b"z".to_vec(), b"z".to_vec(), None),
            Err(StateCallError::Misuse(StateMisuse::TooManyKeys {
                limit: 2
            }))
        );
        assert!(run.delete(2, b"k".to_vec()).is_err());
        run.delete(0, b"k".to_vec()).unwrap();
        assert_eq!(run.get(0, b"k").unwrap(), None);
        let writes = run.finish().state;
        assert_eq!(writes.len(), 2);
        // Only the read of partition 1's `k` reached the base.
        let reads = base.take_reads();
        assert_eq!(reads.len(), 1);
        assert_eq!(reads.lookup(&tp(1), b"k"), Some(None));
    }

    /// A base holding one partition's stored watermark and due list.
    struct Timed {
        watermark: i64,
        stored: Vec<Timer>,
    }

    impl StateBase for Timed {
        fn get(&self, _: &TopicPartition, key: &[u8]) -> Result<Option<StateValue>, StateError> {
            let value = |value| {
                Some(StateValue {
                    value,
                    expires_at_ms: None,
                })
            };
            Ok(match event_time::parse_due_key(key) {
                Some(up_to) => {
                    let due: Vec<Timer> = (self.stored.iter())
                        .filter(|t| t.at_ms <= up_to)
                        .cloned()
                        .collect();
                    value(event_time::encode_timers(&due))
                }
                None if key == WATERMARK_KEY => value(event_time::encode_watermark(self.watermark)),
                // A stored timer's state key: the value kept with it.
                None => Timer::from_state_key(key)
                    .filter(|t| self.stored.contains(t))
                    .and_then(|_| value(b"kept".to_vec())),
            })
        }
    }

    /// Records of partition 0 of `t`, with these Kafka timestamps.
    fn timed(timestamps: &[i64]) -> Records {
        let records: Vec<OwnedRecord> = (timestamps.iter().enumerate())
            .map(|(offset, &timestamp)| OwnedRecord {
                offset: offset as i64,
                timestamp,
                key: None,
                value: None,
                headers: Vec::new(),
            })
            .collect();
        let mut recs = Records::default();
        recs.push_slice("t", 0, &records);
        recs
    }

    /// The watermark a record sees moves with the records before it in
    /// its partition; due timers are the stored ones the run left alone
    /// plus those it set, each once; the run's end writes the watermark.
    #[test]
    fn event_time_moves_per_record_and_fires_each_due_timer_once() {
        let recs = timed(&[100, 50, 300]);
        let timer = |at_ms, key: &[u8]| Timer {
            at_ms,
            key: key.to_vec(),
        };
        let stored = vec![timer(80, b"old"), timer(150, b"gone"), timer(900, b"later")];
        let base = BatchBase::new(Arc::new(Timed {
            watermark: 70,
            stored,
        }));
        let limits = StateLimits {
            max_value_bytes: 64,
            max_keys_per_batch: 100,
            max_write_bytes: 1 << 20,
            max_fired_value_bytes: 1 << 20,
            event_time: EventTimeSettings {
                allowed_lateness_ms: 10,
            },
        };
        let mut run = RunState::new(base.clone(), &recs, 0, limits);
        assert_eq!(run.watermark(0).unwrap(), Some(70));
        assert_eq!(
            run.watermark(1).unwrap(),
            Some(90),
            "after the record at 100"
        );
        run.set_record_time(1, Some(250)).unwrap();
        assert_eq!(run.watermark(2).unwrap(), Some(240));
        run.delete_timer(0, b"gone".to_vec(), 150).unwrap();
        run.set_timer(2, b"new".to_vec(), 200, Vec::new()).unwrap();
        run.set_timer(2, b"next".to_vec(), 295, Vec::new()).unwrap();
        assert_eq!(
            run.set(0, b"\xFFw".to_vec(), b"x".to_vec(), None),
            Err(StateCallError::Misuse(StateMisuse::HostKey))
        );
        let fired: Vec<(i64, Vec<u8>)> = (run.due_timers(FiredValues::Leave).unwrap().into_iter())
            .map(|f| (f.timer.at_ms, f.timer.key))
            .collect();
        assert_eq!(fired, vec![(80, b"old".to_vec()), (200, b"new".to_vec())]);
        assert!(
            run.due_timers(FiredValues::Leave).unwrap().is_empty(),
            "each once"
        );
        run.late(1, "behind".into()).unwrap();
        let writes = run.finish();
        assert_eq!(writes.late.len(), 1);
        let tp = tp(0);
        let watermark = writes.state.lookup(&tp, WATERMARK_KEY).flatten().unwrap();
        assert_eq!(event_time::decode_watermark(&watermark.value).unwrap(), 290);
        for (at_ms, key) in [(80, &b"old"[..]), (200, b"new"), (150, b"gone")] {
            let key = timer(at_ms, key).state_key();
            assert_eq!(writes.state.lookup(&tp, &key), Some(None), "removed");
        }
        assert!(
            writes
                .state
                .lookup(&tp, &timer(295, b"next").state_key())
                .flatten()
                .is_some()
        );
        // The watermark and the due list were read through the base: a
        // replay is served them from the record.
        let reads = base.take_reads();
        assert!(reads.lookup(&tp, WATERMARK_KEY).is_some());
        assert!(reads.lookup(&tp, &event_time::due_key(290)).is_some());
    }

    /// A timer keeps its value until it fires: read back and replaced
    /// while set, handed out with it (a stored one's read through the
    /// base, so a replay is served it), none once fired.
    #[test]
    fn timers_keep_values_until_they_fire() {
        let recs = timed(&[100, 300]);
        let old = Timer {
            at_ms: 80,
            key: b"old".to_vec(),
        };
        let base = BatchBase::new(Arc::new(Timed {
            watermark: 0,
            stored: vec![old.clone()],
        }));
        let limits = StateLimits {
            max_value_bytes: 4,
            max_keys_per_batch: 100,
            max_write_bytes: 1 << 20,
            max_fired_value_bytes: 1 << 20,
            event_time: EventTimeSettings::default(),
        };
        let mut run = RunState::new(base.clone(), &recs, 0, limits);
        let value = |run: &RunState, key: &[u8], at| run.timer_value(0, key.to_vec(), at).unwrap();
        assert_eq!(value(&run, b"new", 200), None, "never set");
        run.set_timer(0, b"new".to_vec(), 200, b"v1".to_vec())
            .unwrap();
        assert_eq!(value(&run, b"new", 200), Some(b"v1".to_vec()));
        run.set_timer(1, b"new".to_vec(), 200, b"v2".to_vec())
            .unwrap();
        assert_eq!(value(&run, b"old", 80), Some(b"kept".to_vec()));
        run.set_timer(0, b"plain".to_vec(), 900, Vec::new())
            .unwrap();
        assert_eq!(value(&run, b"plain", 900), Some(Vec::new()));
        assert!(matches!(
            run.set_timer(0, b"big".to_vec(), 1, b"12345".to_vec()),
            Err(StateCallError::Misuse(StateMisuse::ValueTooLarge { .. }))
        ));
        let fired: Vec<(i64, Vec<u8>, Vec<u8>)> = (run.due_timers(FiredValues::Read).unwrap())
            .into_iter()
            .map(|f| (f.timer.at_ms, f.timer.key, f.value))
            .collect();
        assert_eq!(
            fired,
            vec![
                (80, b"old".to_vec(), b"kept".to_vec()),
                (200, b"new".to_vec(), b"v2".to_vec())
            ]
        );
        assert_eq!(value(&run, b"new", 200), None, "fired");
        assert_eq!(value(&run, b"old", 80), None, "fired");
        let reads = base.take_reads();
        assert!(reads.lookup(&tp(0), &old.state_key()).is_some(), "recorded");
    }

    fn budgets(max_write_bytes: usize, max_fired_value_bytes: usize) -> StateLimits {
        StateLimits {
            max_value_bytes: 64,
            max_keys_per_batch: 100,
            max_write_bytes,
            max_fired_value_bytes,
            event_time: EventTimeSettings::default(),
        }
    }

    /// A run's changes hold at most `max_write_bytes` (keys and values): a
    /// change past it is refused, one that holds no more than the key's
    /// last change never is, a refused change leaves the run as it was.
    #[test]
    fn a_runs_state_changes_are_held_to_the_write_budget() {
        let base = BatchBase::new(Arc::new(EmptyState));
        let mut run = RunState::new(base, &records(), 0, budgets(20, 0));
        let set = |run: &mut RunState, key: &[u8], len: usize| {
            run.set(0, key.to_vec(), vec![7; len], None)
        };
        let refused = |r: Result<(), StateCallError>| {
            matches!(r, Err(StateCallError::OverOutput { limit: 20, .. }))
        };
        set(&mut run, b"k1", 10).unwrap(); // 12
        assert!(refused(set(&mut run, b"k2", 10)), "24 bytes");
        assert_eq!(run.get(0, b"k2").unwrap(), None, "nothing kept");
        set(&mut run, b"k1", 5).unwrap(); // 7
        set(&mut run, b"k2", 10).unwrap(); // 19
        assert!(refused(set(&mut run, b"k1", 10)), "24 bytes");
        run.delete(0, b"k1".to_vec()).unwrap(); // 14
        assert!(refused(set(&mut run, b"k3", 5)), "21 bytes");
        assert!(
            refused(run.set_timer(0, b"t".to_vec(), 1, vec![0; 16])),
            "a timer's value counts"
        );
        let writes = run.finish().state;
        let change = |key: &[u8]| writes.lookup(&tp(0), key).map(|v| v.map(|v| v.value.len()));
        assert_eq!(
            (change(b"k1"), change(b"k2"), change(b"k3")),
            (Some(None), Some(Some(10)), None)
        );
    }

    /// Due timers hand out as many values as `max_fired_value_bytes`
    /// takes, oldest first, at least one; the rest stay due.
    #[test]
    fn due_timers_hand_out_values_up_to_their_budget() {
        let recs = timed(&[100]);
        let base = BatchBase::new(Arc::new(EmptyState));
        let mut run = RunState::new(base, &recs, 0, budgets(1 << 20, 10));
        for (key, at, len) in [(b"a", 1, 12), (b"b", 2, 6), (b"c", 3, 4), (b"d", 4, 0)] {
            run.set_timer(0, key.to_vec(), at, vec![1; len]).unwrap();
        }
        let due = |run: &mut RunState| -> Vec<Vec<u8>> {
            (run.due_timers(FiredValues::Read).unwrap())
                .into_iter()
                .map(|f| f.timer.key)
                .collect()
        };
        assert_eq!(due(&mut run), [b"a".to_vec()], "alone over the budget");
        assert_eq!(due(&mut run), [b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]);
        assert!(due(&mut run).is_empty());
    }
}
