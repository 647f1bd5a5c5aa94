//! Partition cursors: where each owned partition stands between the sink's
//! checkpoint and what has been read, and the ranges a batch is cut from.
//! Every source keeps its offsets here, so the loop's tests run the same
//! bookkeeping as Kafka does.
//!
//! Owns, per partition: the next range's start (the checkpoint), the read
//! position, the records read but not yet batched, the log end first
//! reached; and the caps a batch is cut to. It must not read, seek or
//! decide a starting offset: the source reads and says where a partition
//! starts, and `from` always comes from the caller (the sink's checkpoint).
//!
//! A range ends by read position, not by counting records: offsets are not
//! dense (transaction markers, aborted records, compaction), so a range may
//! hold fewer records than offsets, or none.

use crate::batch::{OffsetRange, Records, TopicPartition};
use crate::read_buffer::ReadBuffer;
use crate::source::PartitionProgress;
use std::collections::BTreeMap;

/// How many offsets a batch may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// At most this many offsets of one partition.
    pub per_partition: i64,
    /// At most this many offsets across the batch's partitions, shared
    /// fairly (see [`share_cap`]).
    pub per_batch: Option<i64>,
}

/// Read state of one owned partition.
#[derive(Debug, Default)]
pub struct Cursor {
    /// Start of the next range: the committed checkpoint. `None` until the
    /// source has been told where to start.
    next: Option<i64>,
    /// Every offset below this has been delivered (records buffered, or
    /// skipped by the broker as markers and aborted records).
    position: i64,
    /// Records read but not yet in a committed batch, in offset order.
    buffer: ReadBuffer,
    /// The log end the first time it was reached (for `--until-caught-up`).
    end_at_start: Option<i64>,
}

impl Cursor {
    /// Where the next range starts; `None` until started.
    pub fn next(&self) -> Option<i64> {
        self.next
    }

    /// Every offset below this has been read.
    pub fn position(&self) -> i64 {
        self.position
    }

    /// True if records wait in the buffer.
    pub fn has_buffered(&self) -> bool {
        !self.buffer.is_empty()
    }

    /// The checkpoint, if the partition started and nothing has been read
    /// past it yet.
    pub fn idle_at(&self) -> Option<i64> {
        self.next
            .filter(|&next| self.buffer.is_empty() && self.position == next)
    }

    /// Offsets read but not batched yet.
    fn waiting(&self) -> i64 {
        self.next.map_or(0, |n| (self.position - n).max(0))
    }
}

/// What [`Cursors::read`] did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// Buffered: the first record read since the partition's checkpoint.
    FirstSinceCheckpoint,
    /// Buffered behind others.
    Kept,
    /// Not buffered: the partition is not owned or not started, or the
    /// offset is below its position.
    Ignored,
}

/// The cursors of every owned partition, and the caps batches are cut to.
#[derive(Debug)]
pub struct Cursors {
    partitions: BTreeMap<TopicPartition, Cursor>,
    caps: Caps,
    /// True once ownership was settled at least once (possibly to nothing).
    assigned_once: bool,
}

impl Cursors {
    pub fn new(caps: Caps) -> Cursors {
        Cursors {
            partitions: BTreeMap::new(),
            caps,
            assigned_once: false,
        }
    }

    /// Takes ownership of `partitions` (unstarted until [`Cursors::start`]);
    /// a partition already owned keeps its cursor.
    pub fn assign(&mut self, partitions: impl IntoIterator<Item = TopicPartition>) {
        self.assigned_once = true;
        for tp in partitions {
            self.partitions.entry(tp).or_default();
        }
    }

    /// Drops `partitions` and everything read of them.
    pub fn revoke<'a>(&mut self, partitions: impl IntoIterator<Item = &'a TopicPartition>) {
        for tp in partitions {
            self.partitions.remove(tp);
        }
    }

    /// True once ownership was settled at least once (possibly to nothing).
    pub fn assigned_once(&self) -> bool {
        self.assigned_once
    }

    pub fn owns(&self, tp: &TopicPartition) -> bool {
        self.partitions.contains_key(tp)
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<&Cursor> {
        self.partitions.get(tp)
    }

    /// Every owned partition, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&TopicPartition, &Cursor)> {
        self.partitions.iter()
    }

    /// The owned partitions that have started.
    pub fn started(&self) -> impl Iterator<Item = (&TopicPartition, &Cursor)> {
        self.partitions.iter().filter(|(_, c)| c.next.is_some())
    }

    /// Whether some owned partition has not been told where to start.
    pub fn any_unstarted(&self) -> bool {
        self.partitions.values().any(|c| c.next.is_none())
    }

    /// Owned partitions that have not been told where to start.
    pub fn unstarted(&self) -> Vec<TopicPartition> {
        self.partitions
            .iter()
            .filter(|(_, c)| c.next.is_none())
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    /// (Re)starts `tp` at `from`: the next range starts there and anything
    /// buffered is dropped. False if `tp` is not owned.
    pub fn start(&mut self, tp: &TopicPartition, from: i64) -> bool {
        let Some(cursor) = self.partitions.get_mut(tp) else {
            return false;
        };
        cursor.next = Some(from);
        cursor.position = from;
        cursor.buffer.clear();
        true
    }

    /// Buffers a record read at `offset` of `tp`: `record` appends it
    /// (offset `offset`, one record) to the records it is given, only if it
    /// is kept. Ignored for a partition not owned or not started, and for
    /// an offset below the position (the buffer stays in offset order).
    pub fn read(
        &mut self,
        tp: &TopicPartition,
        offset: i64,
        record: impl FnOnce(&mut Records),
    ) -> Read {
        let Some(cursor) = self.partitions.get_mut(tp) else {
            return Read::Ignored;
        };
        if cursor.next.is_none() || offset < cursor.position {
            return Read::Ignored;
        }
        let first = cursor.idle_at().is_some();
        let chunk = cursor.buffer.open();
        let before = chunk.len();
        record(chunk);
        debug_assert_eq!(chunk.len(), before + 1, "one record read");
        debug_assert_eq!(chunk.offsets.last(), Some(&offset));
        cursor.position = offset + 1;
        match first {
            true => Read::FirstSinceCheckpoint,
            false => Read::Kept,
        }
    }

    /// Moves `tp`'s position up to `position` (never back): the source has
    /// been delivered everything below it, markers included.
    pub fn advance(&mut self, tp: &TopicPartition, position: i64) {
        if let Some(cursor) = self.partitions.get_mut(tp) {
            cursor.position = cursor.position.max(position);
        }
    }

    /// Notes the log end `high` of `tp` if it is reached for the first time.
    pub fn reached(&mut self, tp: &TopicPartition, high: i64) {
        if let Some(cursor) = self.partitions.get_mut(tp)
            && cursor.end_at_start.is_none()
            && cursor.position >= high
        {
            cursor.end_at_start = Some(high);
        }
    }

    /// True if some partition has read a full batch, or all of them
    /// together have read the batch cap.
    pub fn some_batch_full(&self) -> bool {
        let waiting = || self.partitions.values().map(Cursor::waiting);
        waiting().any(|w| w >= self.caps.per_partition)
            || self
                .caps
                .per_batch
                .is_some_and(|cap| waiting().sum::<i64>() >= cap)
    }

    /// The ranges of the next batch: per started partition, from its
    /// checkpoint up to what has been read, at most `per_partition` offsets,
    /// and at most `per_batch` in all (shared fairly). Partitions with
    /// nothing new are left out.
    pub fn plan_ranges(&self) -> Vec<OffsetRange> {
        let mut ranges: Vec<OffsetRange> = self
            .partitions
            .iter()
            .filter_map(|(tp, c)| {
                let from = c.next?;
                let until = c.position.min(from + self.caps.per_partition);
                (until > from).then(|| OffsetRange {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    from,
                    until,
                })
            })
            .collect();
        if let Some(cap) = self.caps.per_batch {
            share_cap(&mut ranges, cap);
        }
        ranges
    }

    /// The buffered records of `ranges`, in the module's layout. They stay
    /// buffered until [`Cursors::committed`], so a failed commit can re-run
    /// the same batch.
    pub fn records(&self, ranges: &[OffsetRange]) -> Records {
        let mut records = Records::default();
        for r in ranges {
            let Some(cursor) = self.partitions.get(&r.topic_partition()) else {
                continue;
            };
            let runs = cursor.buffer.runs(r.from, r.until);
            records.push_slice_from(&r.topic, r.partition, runs);
        }
        records
    }

    /// Marks `ranges` committed: their records leave the buffers and the
    /// next ranges start at their `until`.
    pub fn committed(&mut self, ranges: &[OffsetRange]) {
        for r in ranges {
            if let Some(cursor) = self.partitions.get_mut(&r.topic_partition()) {
                cursor.buffer.drop_below(r.until);
                cursor.next = Some(r.until);
            }
        }
    }

    /// True once ownership was settled and every owned partition has
    /// committed up to the log end seen when it was first reached, with
    /// nothing left buffered.
    pub fn caught_up(&self) -> bool {
        self.assigned_once
            && self
                .partitions
                .values()
                .all(|c| match (c.next, c.end_at_start) {
                    (Some(next), Some(end)) => next >= end && c.buffer.is_empty(),
                    _ => false,
                })
    }

    /// Where each owned partition stands; `log_end` says where its log ends
    /// as last seen.
    pub fn progress(
        &self,
        log_end: impl Fn(&TopicPartition) -> Option<i64>,
    ) -> Vec<PartitionProgress> {
        self.partitions
            .iter()
            .map(|(tp, c)| PartitionProgress {
                topic: tp.topic.clone(),
                partition: tp.partition,
                next_offset: c.next,
                log_end: log_end(tp),
            })
            .collect()
    }
}

/// Shortens `ranges` so they hold at most `cap` offsets together: each
/// gets an equal share, and what a short range leaves is handed on in
/// order. Every range keeps at least one offset, so none starves.
fn share_cap(ranges: &mut [OffsetRange], cap: i64) {
    let mut left = cap.max(ranges.len() as i64);
    let mut sorted: Vec<usize> = (0..ranges.len()).collect();
    sorted.sort_by_key(|&i| ranges[i].until - ranges[i].from);
    for (done, &i) in sorted.iter().enumerate() {
        let share = (left / (ranges.len() - done) as i64).max(1);
        let r = &mut ranges[i];
        r.until = r.until.min(r.from + share);
        left -= r.until - r.from;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(partition: i32) -> TopicPartition {
        TopicPartition {
            topic: "t".into(),
            partition,
        }
    }

    fn range(p: i32, len: i64) -> OffsetRange {
        OffsetRange {
            topic: "t".into(),
            partition: p,
            from: 100,
            until: 100 + len,
        }
    }

    /// Reads the record at `offset` (its value the offset in digits).
    fn record(offset: i64) -> impl FnOnce(&mut Records) {
        move |records| {
            let value = offset.to_string();
            records.push_record(offset, 0, None, Some(value.as_bytes()), []);
        }
    }

    fn lens(ranges: &[OffsetRange]) -> Vec<i64> {
        ranges.iter().map(|r| r.until - r.from).collect()
    }

    #[test]
    fn a_batch_cap_is_shared_fairly_and_short_ranges_hand_on_their_rest() {
        let mut ranges = vec![range(0, 1000), range(1, 10), range(2, 1000)];
        share_cap(&mut ranges, 300);
        assert_eq!(lens(&ranges), [145, 10, 145]);
        let mut tiny = vec![range(0, 5), range(1, 5), range(2, 5)];
        share_cap(&mut tiny, 2);
        assert!(tiny.iter().all(|r| r.until - r.from == 1), "none starves");
    }

    #[test]
    fn ranges_run_from_the_checkpoint_to_the_position_markers_included() {
        let mut cursors = Cursors::new(Caps {
            per_partition: 100,
            per_batch: None,
        });
        cursors.assign([tp(0), tp(1)]);
        assert_eq!(cursors.unstarted(), [tp(0), tp(1)]);
        assert!(cursors.plan_ranges().is_empty(), "nothing before a start");
        assert_eq!(
            cursors.read(&tp(0), 5, record(5)),
            Read::Ignored,
            "not started"
        );
        cursors.start(&tp(0), 5);
        let read: Vec<Read> = [5, 6, 8]
            .into_iter()
            .map(|offset| cursors.read(&tp(0), offset, record(offset)))
            .collect();
        assert_eq!(read, [Read::FirstSinceCheckpoint, Read::Kept, Read::Kept]);
        assert_eq!(
            cursors.read(&tp(0), 6, record(6)),
            Read::Ignored,
            "below the position"
        );
        // A marker at 9 was skipped by the broker: the position moves past it.
        cursors.advance(&tp(0), 10);
        cursors.advance(&tp(0), 7);
        let ranges = cursors.plan_ranges();
        assert_eq!((ranges.len(), ranges[0].from, ranges[0].until), (1, 5, 10));
        let records = cursors.records(&ranges);
        assert_eq!(records.len(), 3);
        assert_eq!(cursors.unstarted(), [tp(1)]);
        cursors.committed(&ranges);
        assert!(cursors.plan_ranges().is_empty());
        assert_eq!(cursors.get(&tp(0)).and_then(Cursor::idle_at), Some(10));
    }

    #[test]
    fn caps_cut_a_partition_and_a_batch() {
        let mut cursors = Cursors::new(Caps {
            per_partition: 4,
            per_batch: Some(6),
        });
        cursors.assign([tp(0), tp(1)]);
        for p in [0, 1] {
            cursors.start(&tp(p), 0);
            for offset in 0..10 {
                cursors.read(&tp(p), offset, record(offset));
            }
        }
        assert!(cursors.some_batch_full());
        assert_eq!(lens(&cursors.plan_ranges()), [3, 3]);
        let mut uncapped = Cursors::new(Caps {
            per_partition: 4,
            per_batch: None,
        });
        uncapped.assign([tp(0)]);
        uncapped.start(&tp(0), 0);
        assert!(!uncapped.some_batch_full());
        for offset in 0..10 {
            uncapped.read(&tp(0), offset, record(offset));
        }
        assert_eq!(lens(&uncapped.plan_ranges()), [4]);
    }

    #[test]
    fn caught_up_once_every_partition_committed_to_the_end_first_reached() {
        let mut cursors = Cursors::new(Caps {
            per_partition: 100,
            per_batch: None,
        });
        assert!(!cursors.caught_up(), "not before an assignment");
        cursors.assign([]);
        assert!(cursors.caught_up(), "owning nothing, nothing to read");
        cursors.assign([tp(0)]);
        cursors.start(&tp(0), 0);
        cursors.reached(&tp(0), 3);
        assert!(!cursors.caught_up(), "the end is not reached yet");
        for offset in 0..3 {
            cursors.read(&tp(0), offset, record(offset));
        }
        cursors.reached(&tp(0), 3);
        assert!(!cursors.caught_up(), "read but not committed");
        let ranges = cursors.plan_ranges();
        cursors.committed(&ranges);
        assert!(cursors.caught_up());
        // The end first reached counts, not a later one.
        cursors.reached(&tp(0), 50);
        assert!(cursors.caught_up());
        cursors.revoke([&tp(0)]);
        assert!(cursors.get(&tp(0)).is_none());
    }
}
