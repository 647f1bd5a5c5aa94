//! Reading given offset ranges again (for `verify` and `shadow`): assigns
//! the partitions at each range's `from` with the same `read_committed`
//! settings as the pipeline and collects records until the consumer's
//! position has passed each range's `until`.
//!
//! It must not join the pipeline's consumer group or commit anything: it is
//! a read-only replay beside a running pipeline.

use super::{BROKER_TIMEOUT, SourceError, client_config, owned};
use crate::batch::{OffsetRange, OwnedRecord, Records, TopicPartition};
use crate::config::SourceConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long one batch's ranges may take to read back.
const READ_LIMIT: Duration = Duration::from_secs(60);

/// A consumer for replaying committed ranges.
pub struct RangeReader {
    consumer: BaseConsumer,
}

impl RangeReader {
    pub fn connect(config: &SourceConfig, pipeline: &str) -> Result<RangeReader, SourceError> {
        // Never subscribed, so the group is only a name; it is not the
        // pipeline's group and nothing is ever committed under it.
        let consumer: BaseConsumer = client_config(config, &format!("sluice-{pipeline}-replay"))
            .create()
            .map_err(|e| SourceError::kafka("", e))?;
        consumer
            .fetch_metadata(None, BROKER_TIMEOUT)
            .map_err(|e| SourceError::Unreachable {
                brokers: config.brokers.clone(),
                message: e.to_string(),
            })?;
        Ok(RangeReader { consumer })
    }

    /// The records of `ranges` (in that order), as the pipeline read them.
    pub fn read(&self, ranges: &[OffsetRange]) -> Result<Records, SourceError> {
        let mut tpl = TopicPartitionList::new();
        for r in ranges {
            tpl.add_partition_offset(&r.topic, r.partition, Offset::Offset(r.from))
                .map_err(|e| SourceError::kafka("", e))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| SourceError::kafka("", e))?;
        let mut read: BTreeMap<TopicPartition, Vec<OwnedRecord>> = BTreeMap::new();
        let deadline = Instant::now() + READ_LIMIT;
        while !self.all_read(ranges)? {
            if Instant::now() > deadline {
                return Err(SourceError::kafka_says(format!(
                    "could not read back {} within {READ_LIMIT:?}",
                    crate::batch::describe(ranges)
                )));
            }
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    let tp = TopicPartition {
                        topic: m.topic().to_string(),
                        partition: m.partition(),
                    };
                    read.entry(tp).or_default().push(owned(&m));
                }
                Some(Err(e)) => return Err(SourceError::kafka("", e)),
                None => {}
            }
        }
        let mut records = Records::default();
        for r in ranges {
            let chosen = read
                .get(&r.topic_partition())
                .into_iter()
                .flatten()
                .filter(|m| m.offset >= r.from && m.offset < r.until);
            records.push_slice(&r.topic, r.partition, chosen);
        }
        Ok(records)
    }

    /// True once the consumer's position is at or past every `until`.
    fn all_read(&self, ranges: &[OffsetRange]) -> Result<bool, SourceError> {
        let positions = self
            .consumer
            .position()
            .map_err(|e| SourceError::kafka("", e))?;
        Ok(ranges.iter().all(|r| {
            positions
                .find_partition(&r.topic, r.partition)
                .and_then(|e| e.offset().to_raw())
                .is_some_and(|p| p >= r.until)
        }))
    }
}
