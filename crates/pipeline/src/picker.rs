//! Which of the ranges a source offers go into the next batch: all of
//! them, or, for a sink that fences owners per partition, one partition's
//! in turn. It must not change a range: it only chooses among them.

use sluice_core::batch::{OffsetRange, TopicPartition};

/// Picks the ranges of the next batch from those the source offers: all
/// of them, or, for a sink that fences owners per partition, one
/// partition's, the partitions taken in turn so none waits behind a busy
/// one.
#[derive(Debug)]
pub(crate) struct RangePicker {
    one_partition: bool,
    last: std::sync::Mutex<Option<TopicPartition>>,
}

impl RangePicker {
    pub(crate) fn new(one_partition: bool) -> RangePicker {
        RangePicker {
            one_partition,
            last: std::sync::Mutex::new(None),
        }
    }

    pub(crate) fn pick(&self, mut ranges: Vec<OffsetRange>) -> Vec<OffsetRange> {
        if !self.one_partition || ranges.len() <= 1 {
            return ranges;
        }
        let mut last = self.last.lock().expect("picker lock");
        let after_last = |r: &OffsetRange| last.as_ref().is_none_or(|l| r.topic_partition() > *l);
        let next = ranges.iter().position(after_last).unwrap_or(0);
        let chosen = ranges.swap_remove(next);
        *last = Some(chosen.topic_partition());
        vec![chosen]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(partitions: &[i32]) -> Vec<OffsetRange> {
        partitions
            .iter()
            .map(|&partition| OffsetRange {
                topic: "t".into(),
                partition,
                from: 0,
                until: 10,
            })
            .collect()
    }

    fn picked(picker: &RangePicker, partitions: &[i32]) -> Vec<i32> {
        picker
            .pick(ranges(partitions))
            .iter()
            .map(|r| r.partition)
            .collect()
    }

    #[test]
    fn a_per_partition_sink_gets_the_partitions_in_turn() {
        let picker = RangePicker::new(true);
        assert_eq!(picked(&picker, &[0, 1, 2]), [0]);
        assert_eq!(picked(&picker, &[0, 1, 2]), [1]);
        // Partition 2 has nothing waiting: the turn wraps to 0.
        assert_eq!(picked(&picker, &[0, 1]), [0]);
        assert_eq!(picked(&picker, &[0, 1, 2]), [1]);
        assert_eq!(picked(&picker, &[0, 1, 2]), [2]);
        assert_eq!(picked(&picker, &[0, 1, 2]), [0]);
    }

    #[test]
    fn other_sinks_get_every_range() {
        assert_eq!(picked(&RangePicker::new(false), &[0, 1, 2]), [0, 1, 2]);
    }
}
