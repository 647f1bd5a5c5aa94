//! Where a partition's log stands, for `sluice reset`: its partitions, its
//! start and end (from a fetch response: ListOffsets(latest) is wrong on
//! some brokers), and the first offset at or after a time.
//!
//! It must not join the pipeline's consumer group, read records or commit
//! anything: it only asks the brokers.

use super::{BROKER_TIMEOUT, SourceError, cached_watermarks, client_config};
use crate::batch::TopicPartition;
use crate::config::SourceConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// How long to wait for a fetch response's watermarks.
const FETCH_BOUNDS_FOR: Duration = Duration::from_secs(10);

/// Where a reset moves a partition's checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTo {
    /// This offset (it must lie within the log).
    Offset(i64),
    /// The first offset whose record time is at or after this (ms since
    /// the epoch); the log end if there is none.
    Time(i64),
    /// The oldest offset still in the log.
    Earliest,
    /// The end of the log: skip everything there is now.
    Latest,
}

/// Asks the brokers about the logs of one source.
pub struct LogPositions {
    consumer: BaseConsumer,
    brokers: String,
}

impl LogPositions {
    pub fn connect(config: &SourceConfig, pipeline: &str) -> Result<LogPositions, SourceError> {
        // Never subscribed: the group id is only a name.
        let consumer: BaseConsumer = client_config(config, &format!("sluice-{pipeline}-reset"))
            .create()
            .map_err(|e| SourceError::kafka("", e))?;
        Ok(LogPositions {
            consumer,
            brokers: config.brokers.clone(),
        })
    }

    /// Every partition of `topics`.
    pub fn partitions(&self, topics: &[String]) -> Result<Vec<TopicPartition>, SourceError> {
        let metadata = self
            .consumer
            .fetch_metadata(None, BROKER_TIMEOUT)
            .map_err(|e| self.unreachable(e))?;
        let mut all = Vec::new();
        for topic in topics {
            let known = metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .filter(|t| !t.partitions().is_empty())
                .ok_or_else(|| SourceError::UnknownTopic(topic.clone()))?;
            all.extend(known.partitions().iter().map(|p| TopicPartition {
                topic: topic.clone(),
                partition: p.id(),
            }));
        }
        Ok(all)
    }

    /// The log's start and end as a fetch response reports them (right on
    /// every broker; ListOffsets(latest) is not on some), or ListOffsets'
    /// answer if no fetch answers in time.
    fn bounds(&self, tp: &TopicPartition) -> Result<(i64, i64), SourceError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Beginning)
            .map_err(|e| SourceError::kafka("", e))?;
        self.consumer
            .assign(&tpl)
            .map_err(|e| SourceError::kafka("", e))?;
        let deadline = Instant::now() + FETCH_BOUNDS_FOR;
        while Instant::now() < deadline {
            // Records are not wanted, only the watermarks their fetch carries.
            let _ = self.consumer.poll(Duration::from_millis(50));
            if let Some(bounds) = cached_watermarks(&self.consumer, tp) {
                return Ok(bounds);
            }
        }
        self.consumer
            .fetch_watermarks(&tp.topic, tp.partition, BROKER_TIMEOUT)
            .map_err(|e| self.unreachable(e))
    }

    /// The offset `to` names in `tp`'s log.
    pub fn resolve(&self, tp: &TopicPartition, to: ResetTo) -> Result<i64, SourceError> {
        let (low, high) = self.bounds(tp)?;
        match to {
            ResetTo::Earliest => Ok(low),
            ResetTo::Latest => Ok(high),
            ResetTo::Offset(offset) if (low..=high).contains(&offset) => Ok(offset),
            ResetTo::Offset(offset) => Err(SourceError::kafka_says(format!(
                "partition {tp}: offset {offset} is not in the log (it holds {low}..{high})"
            ))),
            ResetTo::Time(ms) => {
                let mut query = TopicPartitionList::new();
                query
                    .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(ms))
                    .map_err(|e| SourceError::kafka("", e))?;
                let found = self
                    .consumer
                    .offsets_for_times(query, BROKER_TIMEOUT)
                    .map_err(|e| SourceError::kafka(format!("offsets for time {ms}"), e))?;
                let offset = found
                    .find_partition(&tp.topic, tp.partition)
                    .map(|e| e.offset());
                match offset {
                    Some(Offset::Offset(o)) => Ok(o.clamp(low, high)),
                    // No record at or after the time: the end.
                    _ => Ok(high),
                }
            }
        }
    }

    fn unreachable(&self, e: rdkafka::error::KafkaError) -> SourceError {
        SourceError::unreachable(self.brokers.clone(), e)
    }
}
