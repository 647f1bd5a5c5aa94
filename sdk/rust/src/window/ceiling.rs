//! What a batch knows of each input partition's watermark without asking
//! the host: a ceiling, the higher of the watermark the host told for one
//! of the partition's records and the event times of its records since. A
//! partition's watermark is its highest event time so far minus a lateness
//! that is never negative, and never falls, so it is at most its ceiling:
//! a window whose last millisecond is past the ceiling is open for sure,
//! and only a record one of whose windows may have closed asks the host
//! (`time.watermark`). On in-order input that is one host call a
//! partition a batch instead of one a record.
//!
//! It must not decide that a window has closed: only the host's watermark
//! says that.

use crate::{Record, Time};
use std::cell::Cell;

/// The partitions a batch's records came from, each with its ceiling.
#[derive(Default)]
pub(super) struct Ceilings<'b> {
    partitions: Vec<Ceiling<'b>>,
}

struct Ceiling<'b> {
    topic: &'b str,
    partition: i32,
    /// At least the partition's watermark before its next record; `None`
    /// until the host has told it.
    at_most: Option<Option<i64>>,
}

impl<'b> Ceilings<'b> {
    /// Where `record`'s partition is among the batch's (its slot).
    pub(super) fn slot(&mut self, record: &Record<'b>) -> usize {
        let found = (self.partitions.iter())
            .rposition(|c| c.partition == record.partition && c.topic == record.topic);
        found.unwrap_or_else(|| {
            self.partitions.push(Ceiling {
                topic: record.topic,
                partition: record.partition,
                at_most: None,
            });
            self.partitions.len() - 1
        })
    }

    /// The watermark just before `record`, of the partition in `slot`.
    pub(super) fn before(&self, slot: usize, record: &Record<'_>) -> Watermark {
        Watermark {
            time: record.time(),
            at_most: self.partitions[slot].at_most,
            told: Cell::new(None),
        }
    }

    /// Moves the ceiling of the partition in `slot` past a record at
    /// `time_ms` (its event time) whose watermark was `before`.
    pub(super) fn passed(&mut self, slot: usize, before: &Watermark, time_ms: i64) {
        let ceiling = &mut self.partitions[slot].at_most;
        *ceiling = before.known().map(|w| w.max(Some(time_ms)));
    }
}

/// A partition's watermark just before a record, asked of the host only
/// when a window's fate depends on it.
pub(super) struct Watermark {
    time: Time,
    at_most: Option<Option<i64>>,
    /// What the host said, once asked.
    told: Cell<Option<Option<i64>>>,
}

impl Watermark {
    /// The watermark (`None`: the partition has none yet).
    pub(super) fn get(&self) -> Option<i64> {
        if let Some(told) = self.told.get() {
            return told;
        }
        let told = self.time.watermark();
        self.told.set(Some(told));
        told
    }

    /// Whether the watermark has reached `at_ms` (a window's last
    /// millisecond): the window has closed.
    pub(super) fn reached(&self, at_ms: i64) -> bool {
        if let Some(ceiling) = self.at_most
            && ceiling.is_none_or(|c| at_ms > c)
        {
            return false;
        }
        self.get().is_some_and(|w| at_ms <= w)
    }

    /// The watermark if the host told it, else its ceiling if there is
    /// one.
    fn known(&self) -> Option<Option<i64>> {
        self.told.get().or(self.at_most)
    }
}
