//! Reading given offset ranges again (for `verify` and `shadow`): assigns
//! the partitions with the same `read_committed` settings as the pipeline
//! and collects records until the consumer's position has passed each
//! range's `until`.
//!
//! Committed batches follow each other per partition (one's `until` is the
//! next one's `from`), so the reader reads forward: a partition is sought
//! only when a range does not start where the last one read ended, and
//! what was read beyond a range is kept for the next. It reads ahead: a
//! partition read past the range asked for goes on being fetched until it
//! holds [`READ_AHEAD_BYTES`] (shared between the partitions read) beyond
//! it, then is paused, and resumed once the batches read have taken it
//! below half of that. So replaying small batches does not wait for a fetch
//! per batch (it did: ~20 ms a batch of 1,000 records per partition).
//!
//! It must not join the pipeline's consumer group or commit anything: it is
//! a read-only replay beside a running pipeline.

use super::{BROKER_TIMEOUT, SourceError, client_config, owned, wake_fetcher};
use crate::batch::{OffsetRange, OwnedRecord, Records, TopicPartition};
use crate::config::SourceConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// How long one batch's ranges may take to read back.
const READ_LIMIT: Duration = Duration::from_secs(60);

/// How long the broker may hold a fetch that finds nothing new.
const REPLAY_FETCH_WAIT_MS: &str = "10";

/// How long reading may make no progress before the lagging partitions
/// are sought again.
const STALL_AFTER: Duration = Duration::from_secs(5);

/// How long one poll waits when librdkafka has nothing queued.
const POLL_WAIT: Duration = Duration::from_millis(100);

/// Messages taken from librdkafka's queue between two looks at whether the
/// ranges are read.
const DRAIN_PER_CHECK: usize = 512;

/// How much the reader may keep read ahead of the ranges asked for, over
/// all its partitions (each gets an equal share, at least
/// [`READ_AHEAD_MIN_BYTES`]).
const READ_AHEAD_BYTES: usize = 64 << 20;
const READ_AHEAD_MIN_BYTES: usize = 1 << 20;

/// Where the reader stands in one assigned partition.
#[derive(Debug)]
struct Cursor {
    /// Every offset below this has been delivered (records, or markers and
    /// aborted records the consumer skipped).
    position: i64,
    /// Every record in `[kept_from, position)`, in offset order.
    kept_from: i64,
    buffer: VecDeque<OwnedRecord>,
    /// The buffer's size (keys, values and headers).
    bytes: usize,
    paused: bool,
}

impl Cursor {
    fn at(offset: i64) -> Cursor {
        Cursor {
            position: offset,
            kept_from: offset,
            buffer: VecDeque::new(),
            bytes: 0,
            paused: false,
        }
    }

    /// Keeps `record`, read at the position.
    fn push(&mut self, record: OwnedRecord) {
        self.position = record.offset + 1;
        self.bytes += size(&record);
        self.buffer.push_back(record);
    }

    /// True if what was read covers a range starting at `from`.
    fn covers(&self, from: i64) -> bool {
        self.kept_from <= from && from <= self.position
    }

    /// Forgets the records below `offset`.
    fn drop_below(&mut self, offset: i64) {
        while self.buffer.front().is_some_and(|m| m.offset < offset) {
            let dropped = self.buffer.pop_front().expect("a front record");
            self.bytes -= size(&dropped);
        }
        self.kept_from = self.kept_from.max(offset);
    }
}

/// A consumer for replaying committed ranges.
pub struct RangeReader {
    consumer: BaseConsumer,
    cursors: BTreeMap<TopicPartition, Cursor>,
    /// The last ranges read and their records: `shadow` reads each batch
    /// twice (recorded and candidate version).
    last: Option<(Vec<OffsetRange>, Records)>,
}

impl RangeReader {
    pub fn connect(config: &SourceConfig, pipeline: &str) -> Result<RangeReader, SourceError> {
        // Never subscribed, so the group is only a name; it is not the
        // pipeline's group and nothing is ever committed under it.
        let consumer: BaseConsumer = client_config(config, &format!("sluice-{pipeline}-replay"))
            // librdkafka keeps one fetch in flight per broker. A partition
            // read to its log end, or paused, makes that fetch a long poll,
            // and a partition resumed meanwhile waits for it: 0.5 s per
            // batch with the default wait (measured: 460 of 490 ms per
            // batch). A replay reads what is there, so it waits briefly.
            .set("fetch.wait.max.ms", REPLAY_FETCH_WAIT_MS)
            .create()
            .map_err(|e| SourceError::kafka("", e))?;
        consumer
            .fetch_metadata(None, BROKER_TIMEOUT)
            .map_err(|e| SourceError::unreachable(config.brokers.clone(), e))?;
        Ok(RangeReader {
            consumer,
            cursors: BTreeMap::new(),
            last: None,
        })
    }

    /// The records of `ranges` (in that order), as the pipeline read them.
    pub fn read(&mut self, ranges: &[OffsetRange]) -> Result<Records, SourceError> {
        if let Some((last, records)) = &self.last
            && last == ranges
        {
            return Ok(records.clone());
        }
        self.position_at(ranges)?;
        self.read_until(ranges)?;
        let mut records = Records::default();
        for r in ranges {
            let cursor = self.cursors.get(&r.topic_partition()).expect("positioned");
            // The buffer starts at `r.from` (see `position_at`).
            let chosen = cursor.buffer.iter().take_while(|m| m.offset < r.until);
            records.push_slice(&r.topic, r.partition, chosen);
        }
        for r in ranges {
            let cursor = self
                .cursors
                .get_mut(&r.topic_partition())
                .expect("positioned");
            cursor.drop_below(r.until);
        }
        self.resume_drained()?;
        self.last = Some((ranges.to_vec(), records.clone()));
        Ok(records)
    }

    /// What each partition may hold read ahead.
    fn ahead_share(&self) -> usize {
        (READ_AHEAD_BYTES / self.cursors.len().max(1)).max(READ_AHEAD_MIN_BYTES)
    }

    /// Resumes the partitions paused for holding their share read ahead
    /// once they hold less than half of it.
    fn resume_drained(&mut self) -> Result<(), SourceError> {
        let low = self.ahead_share() / 2;
        let mut resume = TopicPartitionList::new();
        for (tp, c) in self.cursors.iter_mut() {
            if c.paused && c.bytes < low {
                c.paused = false;
                resume.add_partition(&tp.topic, tp.partition);
            }
        }
        self.resume(&resume)
    }

    /// Resumes `partitions` and wakes the fetcher for them.
    fn resume(&self, partitions: &TopicPartitionList) -> Result<(), SourceError> {
        if partitions.count() > 0 {
            self.consumer
                .resume(partitions)
                .map_err(|e| SourceError::kafka("", e))?;
            wake_fetcher(&self.consumer, partitions);
        }
        Ok(())
    }

    /// Makes every range's partition read from its `from`: kept as it is
    /// where what was read covers it, assigned or sought where not.
    fn position_at(&mut self, ranges: &[OffsetRange]) -> Result<(), SourceError> {
        let kafka = |e: KafkaError| SourceError::kafka("", e);
        let cursors = &mut self.cursors;
        let mut seeks = TopicPartitionList::new();
        let mut new = false;
        for r in ranges {
            let tp = r.topic_partition();
            match cursors.get_mut(&tp) {
                Some(c) if c.covers(r.from) => c.drop_below(r.from),
                Some(c) => {
                    // A partition read past an earlier range is paused in
                    // the consumer, and a seek does not resume it: the
                    // cursor starts over but keeps saying so, for the
                    // resume below (it used to forget, and the read of a
                    // range before one already read stalled until the
                    // read limit).
                    let paused = c.paused;
                    *c = Cursor::at(r.from);
                    c.paused = paused;
                    seeks
                        .add_partition_offset(&r.topic, r.partition, Offset::Offset(r.from))
                        .map_err(kafka)?;
                }
                None => {
                    cursors.insert(tp, Cursor::at(r.from));
                    new = true;
                }
            }
        }
        if new {
            // Assigning again moves every partition to where its cursor
            // stands, so what was kept stays contiguous.
            let mut all = TopicPartitionList::new();
            for (tp, c) in cursors.iter_mut() {
                all.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(c.position))
                    .map_err(kafka)?;
                c.paused = false;
            }
            self.consumer.assign(&all).map_err(kafka)?;
            // Pausing outlives an assignment in librdkafka.
            self.consumer.resume(&all).map_err(kafka)?;
        } else if seeks.count() > 0 {
            self.consumer
                .seek_partitions(seeks, BROKER_TIMEOUT)
                .map_err(|e| SourceError::kafka("seek to a batch's ranges", e))?;
        }
        let mut resume = TopicPartitionList::new();
        for r in ranges {
            let c = cursors
                .get_mut(&r.topic_partition())
                .expect("inserted above");
            if c.paused && c.position < r.until {
                c.paused = false;
                resume.add_partition(&r.topic, r.partition);
            }
        }
        self.resume(&resume)
    }

    /// Polls until every range's partition has been read past its `until`.
    fn read_until(&mut self, ranges: &[OffsetRange]) -> Result<(), SourceError> {
        let deadline = Instant::now() + READ_LIMIT;
        let mut progress = (self.read_so_far(), Instant::now());
        while !self.all_read(ranges)? {
            if Instant::now() > deadline {
                return Err(SourceError::kafka_says(format!(
                    "could not read back {} within {READ_LIMIT:?}",
                    crate::batch::describe(ranges)
                )));
            }
            let read = self.read_so_far();
            if read != progress.0 {
                progress = (read, Instant::now());
            } else if progress.1.elapsed() > STALL_AFTER {
                self.seek_lagging(ranges)?;
                progress.1 = Instant::now();
            }
            let mut wait = POLL_WAIT;
            'drain: loop {
                for _ in 0..DRAIN_PER_CHECK {
                    match self.consumer.poll(wait) {
                        Some(Ok(m)) => keep(&mut self.cursors, &m),
                        Some(Err(e)) => return Err(SourceError::kafka("", e)),
                        None => break 'drain,
                    }
                    wait = Duration::ZERO;
                }
                if self.all_read_by_records(ranges) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// How far every cursor has read, summed: it moves while reading works.
    fn read_so_far(&self) -> i64 {
        self.cursors.values().map(|c| c.position).sum()
    }

    /// Seeks every partition not yet read past its range to where its
    /// cursor stands. Under a loaded broker a replay consumer was seen
    /// reading nothing more for a minute (once in ~10 runs of the Kafka
    /// sink tests, each sharing one broker); a seek restarts the
    /// partition's fetching from a known state and loses nothing (the
    /// cursor keeps what was read, and older offsets are dropped).
    fn seek_lagging(&mut self, ranges: &[OffsetRange]) -> Result<(), SourceError> {
        let mut lagging = TopicPartitionList::new();
        for r in ranges {
            let c = &self.cursors[&r.topic_partition()];
            if c.position < r.until {
                lagging
                    .add_partition_offset(&r.topic, r.partition, Offset::Offset(c.position))
                    .map_err(|e| SourceError::kafka("", e))?;
            }
        }
        if lagging.count() == 0 {
            return Ok(());
        }
        tracing::warn!(
            "replay: nothing read for {STALL_AFTER:?} from {}; seeking there again",
            crate::batch::describe(ranges)
        );
        self.consumer
            .seek_partitions(lagging.clone(), BROKER_TIMEOUT)
            .map_err(|e| SourceError::kafka("seek to a batch's ranges", e))?;
        wake_fetcher(&self.consumer, &lagging);
        Ok(())
    }

    /// True once every range's records have arrived, by their offsets alone
    /// (cheap: checked per message; a range ending in markers needs
    /// [`RangeReader::all_read`]).
    fn all_read_by_records(&self, ranges: &[OffsetRange]) -> bool {
        ranges.iter().all(|r| {
            self.cursors
                .iter()
                .find(|(tp, _)| tp.partition == r.partition && tp.topic == r.topic)
                .is_some_and(|(_, c)| c.position >= r.until)
        })
    }

    /// Folds in the consumer's positions (which pass transaction markers
    /// and aborted records), pauses the partitions read past their range
    /// (or in none) that hold their share read ahead, and says whether
    /// every range is read.
    fn all_read(&mut self, ranges: &[OffsetRange]) -> Result<bool, SourceError> {
        let positions = self
            .consumer
            .position()
            .map_err(|e| SourceError::kafka("", e))?;
        for (tp, c) in self.cursors.iter_mut() {
            let reported = positions
                .find_partition(&tp.topic, tp.partition)
                .and_then(|e| e.offset().to_raw());
            if let Some(p) = reported.filter(|&p| p >= 0) {
                c.position = c.position.max(p);
            }
        }
        let mut pause = TopicPartitionList::new();
        let mut done = true;
        let share = self.ahead_share();
        for (tp, c) in self.cursors.iter_mut() {
            let until = ranges
                .iter()
                .find(|r| r.partition == tp.partition && r.topic == tp.topic)
                .map(|r| r.until);
            if until.is_some_and(|until| c.position < until) {
                done = false;
            } else if !c.paused && c.bytes >= share {
                c.paused = true;
                pause.add_partition(&tp.topic, tp.partition);
            }
        }
        if pause.count() > 0 {
            self.consumer
                .pause(&pause)
                .map_err(|e| SourceError::kafka("", e))?;
        }
        Ok(done)
    }
}

/// Buffers a fetched record in its partition's cursor.
fn keep(cursors: &mut BTreeMap<TopicPartition, Cursor>, m: &rdkafka::message::BorrowedMessage<'_>) {
    let tp = TopicPartition {
        topic: m.topic().to_string(),
        partition: m.partition(),
    };
    let Some(c) = cursors.get_mut(&tp) else {
        return;
    };
    // Fetched before a seek: librdkafka drops those, this only guards the
    // buffer's order.
    if m.offset() < c.position {
        return;
    }
    c.push(owned(m));
}

/// What a kept record weighs against [`READ_AHEAD_BYTES`]: its bytes and
/// [`RECORD_OVERHEAD`] (a topic of tiny records must not hold millions).
fn size(r: &OwnedRecord) -> usize {
    let bytes = |b: &Option<Vec<u8>>| b.as_ref().map_or(0, Vec::len);
    let headers: usize = r.headers.iter().map(|(k, v)| k.len() + bytes(v)).sum();
    RECORD_OVERHEAD + bytes(&r.key) + bytes(&r.value) + headers
}

/// A kept record's cost beyond its bytes: the struct and its allocations.
const RECORD_OVERHEAD: usize = std::mem::size_of::<OwnedRecord>() + 48;
