//! One partition's records read and not yet in a committed batch, kept
//! column by column (the module's layout) in chunks: a record read is
//! copied once into the open chunk, a batch copies runs of records out of
//! the chunks, and what a commit leaves behind frees whole chunks. Nothing
//! is allocated per record (a profile of the windowed benchmark had the
//! reading thread at 0.67 µs a record, most of it allocating and freeing
//! each record's key, value and headers).
//!
//! It must not decide which records are kept or where a range starts: the
//! cursor does, and hands records over in offset order.

use crate::batch::Records;
use std::collections::VecDeque;
use std::ops::Range;

/// Records a chunk holds at most (a fetch hands over a few thousand).
const CHUNK_RECORDS: usize = 4096;

/// The buffered records of one partition, in offset order.
#[derive(Debug, Default)]
pub(crate) struct ReadBuffer {
    chunks: VecDeque<Records>,
    /// Records at the front of the first chunk that a commit already took.
    taken: usize,
    /// A chunk emptied by a commit, kept for the next reads (its columns
    /// keep their allocations).
    spare: Option<Records>,
}

impl ReadBuffer {
    /// No record waits (a chunk whose records were all taken is dropped at
    /// once, and one is opened only for a record).
    pub(crate) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Drops every record (a seek).
    pub(crate) fn clear(&mut self) {
        while let Some(chunk) = self.chunks.pop_front() {
            self.recycle(chunk);
        }
        self.taken = 0;
    }

    /// The chunk the next record goes into.
    pub(crate) fn open(&mut self) -> &mut Records {
        if self.chunks.back().is_none_or(|c| c.len() >= CHUNK_RECORDS) {
            let chunk = self.spare.take().unwrap_or_default();
            self.chunks.push_back(chunk);
        }
        self.chunks.back_mut().expect("pushed above")
    }

    /// Runs of the buffered records whose offsets are in `from..until`, in
    /// offset order: each a chunk and the records of it.
    pub(crate) fn runs(
        &self,
        from: i64,
        until: i64,
    ) -> impl Iterator<Item = (&Records, Range<usize>)> {
        self.chunks
            .iter()
            .enumerate()
            .filter_map(move |(at, chunk)| {
                let skip = if at == 0 { self.taken } else { 0 };
                let offsets = &chunk.offsets[skip..];
                let start = skip + offsets.partition_point(|&o| o < from);
                let end = skip + offsets.partition_point(|&o| o < until);
                (start < end).then_some((chunk, start..end))
            })
    }

    /// Drops the records below `until` (committed): a chunk all of whose
    /// records are below goes (the one still filling too: the next read
    /// opens another).
    pub(crate) fn drop_below(&mut self, until: i64) {
        while let Some(front) = self.chunks.front() {
            let below = front.offsets.partition_point(|&o| o < until);
            if below < front.len() {
                self.taken = self.taken.max(below);
                return;
            }
            let chunk = self.chunks.pop_front().expect("front");
            self.recycle(chunk);
            self.taken = 0;
        }
    }

    fn recycle(&mut self, mut chunk: Records) {
        chunk.clear();
        self.spare = Some(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer_of(offsets: impl IntoIterator<Item = i64>) -> ReadBuffer {
        let mut buffer = ReadBuffer::default();
        for o in offsets {
            let key = format!("k{o}");
            let headers = [("h", Some(key.as_bytes()))];
            (buffer.open()).push_record(o, o * 10, Some(key.as_bytes()), None, headers);
        }
        buffer
    }

    fn taken(buffer: &ReadBuffer, from: i64, until: i64) -> Records {
        let mut records = Records::default();
        records.push_slice_from("t", 0, buffer.runs(from, until));
        records
    }

    /// What the module sees of a range: the records whose offsets are in
    /// it, keys, values and headers whole, across chunk boundaries.
    #[test]
    fn a_range_copies_its_records_across_chunks() {
        let n = CHUNK_RECORDS as i64 * 2 + 10;
        // Offsets with gaps (markers, aborted records).
        let buffer = buffer_of((0..n).map(|i| i * 2));
        let (from, until) = (CHUNK_RECORDS as i64 * 2 - 6, CHUNK_RECORDS as i64 * 4 + 7);
        let records = taken(&buffer, from, until);
        let expected: Vec<i64> = (0..n)
            .map(|i| i * 2)
            .filter(|o| (from..until).contains(o))
            .collect();
        assert_eq!(records.offsets, expected);
        assert_eq!(records.slices[0].count as usize, expected.len());
        let keys: Vec<String> = records
            .iter()
            .map(|r| String::from_utf8(r.key.expect("key").to_vec()).expect("utf8"))
            .collect();
        let expected_keys: Vec<String> = expected.iter().map(|o| format!("k{o}")).collect();
        assert_eq!(keys, expected_keys);
        assert!(records.iter().all(|r| r.value.is_none()));
        assert_eq!(records.header_counts, vec![1; expected.len()]);
        let header_values: Vec<u8> = expected_keys.concat().into_bytes();
        assert_eq!(records.header_values, header_values);
        assert_eq!(
            records.header_names,
            "h".repeat(expected.len()).into_bytes()
        );
    }

    /// A commit drops what it covers, whole chunks freed, and later ranges
    /// still find their records; once all is taken the buffer is empty.
    #[test]
    fn committed_records_leave_and_the_rest_stay() {
        let n = CHUNK_RECORDS as i64 + 100;
        let mut buffer = buffer_of(0..n);
        buffer.drop_below(50);
        assert!(!buffer.is_empty());
        assert_eq!(taken(&buffer, 0, 60).offsets, (50..60).collect::<Vec<_>>());
        buffer.drop_below(CHUNK_RECORDS as i64 + 10);
        assert_eq!(buffer.chunks.len(), 1, "the first chunk is freed");
        assert_eq!(
            taken(&buffer, 0, n).offsets,
            (CHUNK_RECORDS as i64 + 10..n).collect::<Vec<_>>()
        );
        buffer.drop_below(n);
        assert!(buffer.is_empty());
        // Reading on after everything was taken starts a fresh chunk.
        buffer.open().push_record(n, 0, None, None, []);
        assert_eq!(taken(&buffer, n, n + 1).offsets, vec![n]);
        buffer.clear();
        assert!(buffer.is_empty());
        assert!(taken(&buffer, 0, n + 1).is_empty());
    }
}
