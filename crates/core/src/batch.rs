//! The batch: its plan (which offsets, which module version) and its records
//! in the columnar layout the module receives.
//!
//! Owns the plain data every layer passes around and the deterministic ids
//! and seeds derived from a plan. It must not talk to Kafka, Wasm or a sink.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One partition of one topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.topic, self.partition)
    }
}

/// A planned offset range `[from, until)` of one partition. Offsets are not
/// dense: the range may hold fewer than `until - from` records, even none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetRange {
    pub topic: String,
    pub partition: i32,
    pub from: i64,
    pub until: i64,
}

impl OffsetRange {
    pub fn topic_partition(&self) -> TopicPartition {
        TopicPartition {
            topic: self.topic.clone(),
            partition: self.partition,
        }
    }
}

/// Everything that determines a batch's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub pipeline: String,
    pub batch_id: String,
    /// Sorted by (topic, partition).
    pub ranges: Vec<OffsetRange>,
    /// Module version: sha256 of the component + engine compatibility hash.
    pub module_digest: String,
    pub params_digest: String,
    /// Milliseconds since the Unix epoch, fixed when the batch was planned.
    pub batch_time_ms: i64,
    /// What else shaped the batch's result (engine, limits, poison
    /// policy), as recorded in lineage; empty until the preparer sets it.
    /// Not part of the batch id.
    pub settings: String,
}

impl Plan {
    /// The partitions the plan reads, in its ranges' order.
    pub fn partitions(&self) -> Vec<TopicPartition> {
        self.ranges
            .iter()
            .map(OffsetRange::topic_partition)
            .collect()
    }

    /// Builds a plan; the batch id is derived from the pipeline and ranges, so
    /// the same ranges always get the same id.
    pub fn new(
        pipeline: &str,
        mut ranges: Vec<OffsetRange>,
        module_digest: &str,
        params_digest: &str,
        batch_time_ms: i64,
    ) -> Plan {
        ranges.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        let mut h = Sha256::new();
        h.update(pipeline.as_bytes());
        for r in &ranges {
            h.update(format!(
                "\0{}\0{}\0{}\0{}",
                r.topic, r.partition, r.from, r.until
            ));
        }
        let batch_id = hex::encode(&h.finalize()[..12]);
        Plan {
            pipeline: pipeline.to_string(),
            batch_id,
            ranges,
            module_digest: module_digest.to_string(),
            params_digest: params_digest.to_string(),
            batch_time_ms,
            settings: String::new(),
        }
    }

    /// The seed a module gets for randomness: pipeline, first partition and
    /// its `from`, so a replay sees the same seed.
    pub fn seed(&self) -> u64 {
        let mut h = Sha256::new();
        h.update(self.pipeline.as_bytes());
        if let Some(r) = self.ranges.first() {
            h.update(format!("\0{}\0{}\0{}", r.topic, r.partition, r.from));
        }
        u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
    }
}

/// Milliseconds since the Unix epoch (wall clock: plan times, `*_at_ms`
/// columns).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// sha256 of bytes, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A run of records from one partition inside [`Records`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub topic: String,
    pub partition: i32,
    pub first: u32,
    pub count: u32,
}

impl Slice {
    pub fn topic_partition(&self) -> TopicPartition {
        TopicPartition {
            topic: self.topic.clone(),
            partition: self.partition,
        }
    }
}

/// The records of a batch, column by column (the module's layout). Record
/// `i`'s key is the next `key_lengths[i]` bytes of `keys` (-1 = null), and
/// likewise for values and headers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Records {
    pub slices: Vec<Slice>,
    pub offsets: Vec<i64>,
    pub timestamps: Vec<i64>,
    pub key_lengths: Vec<i32>,
    pub keys: Vec<u8>,
    pub value_lengths: Vec<i32>,
    pub values: Vec<u8>,
    pub header_counts: Vec<u32>,
    pub header_name_lengths: Vec<u32>,
    pub header_names: Vec<u8>,
    pub header_value_lengths: Vec<i32>,
    pub header_values: Vec<u8>,
}

/// One record, owned, as the source buffers it.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedRecord {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// A record borrowed from [`Records`] (for dead letters and bisection).
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    /// Ms since the epoch.
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

fn push_bytes(lengths: &mut Vec<i32>, buf: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        Some(b) => {
            lengths.push(b.len() as i32);
            buf.extend_from_slice(b);
        }
        None => lengths.push(-1),
    }
}

/// One batch of `records` (offsets increasing) from partition 0 of
/// `topic`, planned for pipeline `pipeline` at `batch_time_ms` with
/// placeholder module and params digests: for tests and benchmarks that
/// run a transform without a source.
pub fn single_partition_batch(
    pipeline: &str,
    topic: &str,
    records: &[OwnedRecord],
    batch_time_ms: i64,
) -> (Plan, Records) {
    let mut batch = Records::default();
    batch.push_slice(topic, 0, records);
    let range = OffsetRange {
        topic: topic.to_string(),
        partition: 0,
        from: records.first().map_or(0, |r| r.offset),
        until: records.last().map_or(0, |r| r.offset + 1),
    };
    let plan = Plan::new(pipeline, vec![range], "m", "params", batch_time_ms);
    (plan, batch)
}

impl Records {
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Appends one partition's records as a new slice.
    pub fn push_slice<'a>(
        &mut self,
        topic: &str,
        partition: i32,
        records: impl IntoIterator<Item = &'a OwnedRecord>,
    ) {
        self.slice(topic, partition, |batch| {
            for r in records {
                batch.push_owned(r);
            }
        });
    }

    /// Appends what `fill` pushes as one slice of `topic`'s `partition`.
    fn slice(&mut self, topic: &str, partition: i32, fill: impl FnOnce(&mut Records)) {
        let first = self.offsets.len() as u32;
        fill(self);
        let count = self.offsets.len() as u32 - first;
        self.slices.push(Slice {
            topic: topic.to_string(),
            partition,
            first,
            count,
        });
    }

    /// Appends `r` outside any slice (see [`Records::push_record`]).
    pub fn push_owned(&mut self, r: &OwnedRecord) {
        let headers = r.headers.iter().map(|(n, v)| (n.as_str(), v.as_deref()));
        self.push_record(
            r.offset,
            r.timestamp,
            r.key.as_deref(),
            r.value.as_deref(),
            headers,
        );
    }

    /// Appends one record outside any slice (a source's read buffer keeps
    /// its records this way; [`Records::push_slice_from`] makes a batch
    /// of them).
    pub fn push_record<'a>(
        &mut self,
        offset: i64,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
    ) {
        self.offsets.push(offset);
        self.timestamps.push(timestamp);
        push_bytes(&mut self.key_lengths, &mut self.keys, key);
        push_bytes(&mut self.value_lengths, &mut self.values, value);
        let mut count = 0;
        for (name, value) in headers {
            count += 1;
            self.header_name_lengths.push(name.len() as u32);
            self.header_names.extend_from_slice(name.as_bytes());
            push_bytes(
                &mut self.header_value_lengths,
                &mut self.header_values,
                value,
            );
        }
        self.header_counts.push(count);
    }

    /// Appends one partition's records as a new slice: records `range` of
    /// each of `runs` in turn, copied column by column.
    pub fn push_slice_from<'a>(
        &mut self,
        topic: &str,
        partition: i32,
        runs: impl IntoIterator<Item = (&'a Records, std::ops::Range<usize>)>,
    ) {
        self.slice(topic, partition, |batch| {
            for (from, range) in runs {
                batch.copy_run(from, range);
            }
        });
    }

    /// Appends records `range` of `from`.
    fn copy_run(&mut self, from: &Records, range: std::ops::Range<usize>) {
        let (i, j) = (range.start, range.end);
        self.offsets.extend_from_slice(&from.offsets[i..j]);
        self.timestamps.extend_from_slice(&from.timestamps[i..j]);
        copy_bytes(
            &mut self.key_lengths,
            &mut self.keys,
            &from.key_lengths,
            &from.keys,
            i..j,
        );
        copy_bytes(
            &mut self.value_lengths,
            &mut self.values,
            &from.value_lengths,
            &from.values,
            i..j,
        );
        self.header_counts
            .extend_from_slice(&from.header_counts[i..j]);
        let count = |counts: &[u32]| counts.iter().map(|&c| c as usize).sum::<usize>();
        let headers = count(&from.header_counts[..i])..count(&from.header_counts[..j]);
        let names = count(&from.header_name_lengths[..headers.start])
            ..count(&from.header_name_lengths[..headers.end]);
        self.header_name_lengths
            .extend_from_slice(&from.header_name_lengths[headers.clone()]);
        self.header_names
            .extend_from_slice(&from.header_names[names]);
        copy_bytes(
            &mut self.header_value_lengths,
            &mut self.header_values,
            &from.header_value_lengths,
            &from.header_values,
            headers,
        );
    }

    /// Empties every column, keeping what they have allocated.
    pub fn clear(&mut self) {
        self.slices.clear();
        self.offsets.clear();
        self.timestamps.clear();
        self.key_lengths.clear();
        self.keys.clear();
        self.value_lengths.clear();
        self.values.clear();
        self.header_counts.clear();
        self.header_name_lengths.clear();
        self.header_names.clear();
        self.header_value_lengths.clear();
        self.header_values.clear();
    }

    /// All records in batch order, borrowed.
    pub fn iter(&self) -> impl Iterator<Item = RecordRef<'_>> + '_ {
        let (mut key_at, mut value_at) = (0usize, 0usize);
        self.slices
            .iter()
            .flat_map(|s| (s.first as usize..(s.first + s.count) as usize).map(move |i| (s, i)))
            .map(move |(s, i)| {
                let key = take(&self.keys, &mut key_at, self.key_lengths[i]);
                let value = take(&self.values, &mut value_at, self.value_lengths[i]);
                RecordRef {
                    topic: &s.topic,
                    partition: s.partition,
                    offset: self.offsets[i],
                    timestamp: self.timestamps[i],
                    key,
                    value,
                }
            })
    }

    /// A new batch holding only the records whose batch index is in `keep`
    /// (sorted), with their headers; used to bisect a batch that traps.
    pub fn select(&self, keep: &[usize]) -> (Records, Vec<usize>) {
        let owned = self.to_owned_records();
        let mut out = Records::default();
        let mut index_map = Vec::with_capacity(keep.len());
        for s in &self.slices {
            let range = s.first as usize..(s.first + s.count) as usize;
            let chosen: Vec<usize> = keep.iter().copied().filter(|i| range.contains(i)).collect();
            if chosen.is_empty() {
                continue;
            }
            out.push_slice(&s.topic, s.partition, chosen.iter().map(|&i| &owned[i]));
            index_map.extend(chosen);
        }
        (out, index_map)
    }

    fn to_owned_records(&self) -> Vec<OwnedRecord> {
        let (mut key_at, mut value_at) = (0usize, 0usize);
        let (mut header_at, mut name_at, mut hvalue_at) = (0usize, 0usize, 0usize);
        (0..self.len())
            .map(|i| {
                let key = take(&self.keys, &mut key_at, self.key_lengths[i]).map(<[u8]>::to_vec);
                let value =
                    take(&self.values, &mut value_at, self.value_lengths[i]).map(<[u8]>::to_vec);
                let headers = (header_at..header_at + self.header_counts[i] as usize)
                    .map(|h| {
                        let len = self.header_name_lengths[h] as usize;
                        let name =
                            String::from_utf8_lossy(&self.header_names[name_at..name_at + len])
                                .into_owned();
                        name_at += len;
                        let v = take(
                            &self.header_values,
                            &mut hvalue_at,
                            self.header_value_lengths[h],
                        );
                        (name, v.map(<[u8]>::to_vec))
                    })
                    .collect();
                header_at += self.header_counts[i] as usize;
                OwnedRecord {
                    offset: self.offsets[i],
                    timestamp: self.timestamps[i],
                    key,
                    value,
                    headers,
                }
            })
            .collect()
    }
}

/// Appends entries `range` of a column of byte strings (`lengths`, -1 for
/// none, over `bytes`) to another (`to_lengths` over `to_bytes`).
fn copy_bytes(
    to_lengths: &mut Vec<i32>,
    to_bytes: &mut Vec<u8>,
    lengths: &[i32],
    bytes: &[u8],
    range: std::ops::Range<usize>,
) {
    let end_of = |n: usize| -> usize { lengths[..n].iter().map(|&l| l.max(0) as usize).sum() };
    to_lengths.extend_from_slice(&lengths[range.clone()]);
    to_bytes.extend_from_slice(&bytes[end_of(range.start)..end_of(range.end)]);
}

fn take<'a>(buf: &'a [u8], at: &mut usize, len: i32) -> Option<&'a [u8]> {
    if len < 0 {
        return None;
    }
    let start = *at;
    *at += len as usize;
    Some(&buf[start..*at])
}

/// Renders ranges for logs and errors.
pub fn describe(ranges: &[OffsetRange]) -> String {
    ranges
        .iter()
        .map(|r| format!("{}[{}] {}..{}", r.topic, r.partition, r.from, r.until))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(offset: i64, value: &str) -> OwnedRecord {
        OwnedRecord {
            offset,
            timestamp: 0,
            key: None,
            value: Some(value.as_bytes().to_vec()),
            headers: vec![("h".into(), Some(b"x".to_vec()))],
        }
    }

    #[test]
    fn batch_id_depends_only_on_ranges() {
        let r = |from| {
            vec![OffsetRange {
                topic: "t".into(),
                partition: 0,
                from,
                until: from + 5,
            }]
        };
        let a = Plan::new("p", r(0), "m1", "p1", 1);
        let b = Plan::new("p", r(0), "m2", "p2", 2);
        let c = Plan::new("p", r(5), "m1", "p1", 1);
        assert_eq!(a.batch_id, b.batch_id);
        assert_ne!(a.batch_id, c.batch_id);
        assert_eq!(a.seed(), b.seed());
        assert_ne!(a.seed(), c.seed());
    }

    #[test]
    fn select_keeps_chosen_records_and_headers() {
        let mut records = Records::default();
        let p0 = [rec(0, "a"), rec(1, "b")];
        let p1 = [rec(7, "c")];
        records.push_slice("t", 0, &p0);
        records.push_slice("t", 1, &p1);
        let (sub, map) = records.select(&[1, 2]);
        assert_eq!(map, vec![1, 2]);
        let values: Vec<_> = sub
            .iter()
            .map(|r| (r.partition, r.offset, r.value.unwrap()))
            .collect();
        assert_eq!(values, vec![(0, 1, &b"b"[..]), (1, 7, &b"c"[..])]);
        assert_eq!(sub.header_counts, vec![1, 1]);
        assert_eq!(sub.header_values, b"xx");
    }
}
