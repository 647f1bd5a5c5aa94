//! Lineage on Kafka: read back from the lineage topic, for `verify` and
//! `shadow`. Entries are the JSON of the core's `LineageEntry`, keyed by
//! pipeline (so one partition holds a pipeline's lineage in commit order),
//! written only inside the batch transactions; this reads with
//! `read_committed`, so aborted batches are never seen. What it sees is
//! what the topic's retention keeps.
//!
//! It must not write: entries are written only by the sink's commit.

use crate::client::{EndIsNotAnError, brokers_of};
use crate::section::KafkaSection;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice_core::config::KindSection;
use sluice_core::config::PipelineConfig;
use sluice_core::sink::SinkError;
use sluice_core::store::{CommittedBatch, LineageStore, Selection, select_entries};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// How long reading the whole lineage topic may take.
const READ_FOR: Duration = Duration::from_secs(120);

/// Reads a pipeline's lineage from its Kafka lineage topic.
pub struct KafkaLineage {
    brokers: String,
    topic: String,
}

impl KafkaLineage {
    pub fn open(config: &PipelineConfig) -> Result<KafkaLineage, SinkError> {
        Ok(KafkaLineage {
            brokers: brokers_of(&config.sink.url)?,
            topic: KafkaSection::sink(&config.sink)?.lineage_topic(&config.pipeline),
        })
    }
}

#[async_trait::async_trait]
impl LineageStore for KafkaLineage {
    async fn batches(
        &self,
        pipeline: &str,
        selection: &Selection,
    ) -> Result<Vec<CommittedBatch>, SinkError> {
        let (brokers, topic, pipeline) = (
            self.brokers.clone(),
            self.topic.clone(),
            pipeline.to_string(),
        );
        let entries =
            tokio::task::spawn_blocking(move || read_entries(&brokers, &topic, &pipeline))
                .await
                .map_err(|e| SinkError::database("reading lineage", e))??;
        select_entries(entries, selection)
    }
}

/// Every committed entry of `pipeline` in `topic`, in commit order: read
/// from the start of each partition to its end (the end a fetch reports:
/// some brokers answer ListOffsets wrong, none a fetch).
fn read_entries(brokers: &str, topic: &str, pipeline: &str) -> Result<Vec<Vec<u8>>, SinkError> {
    let unavailable =
        |e: KafkaError| SinkError::unavailable(format!("reading lineage topic `{topic}`"), e);
    let consumer: BaseConsumer<EndIsNotAnError> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("sluice-lineage-reader-{pipeline}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "50")
        .create_with_context(EndIsNotAnError)
        .map_err(unavailable)?;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(15))
        .map_err(unavailable)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(SinkError::Config(format!(
            "lineage topic `{topic}` does not exist"
        )));
    }
    let mut list = TopicPartitionList::new();
    for &p in &partitions {
        list.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(unavailable)?;
    }
    consumer.assign(&list).map_err(unavailable)?;
    let mut at_end: BTreeSet<i32> = BTreeSet::new();
    let mut entries = Vec::new();
    let started = Instant::now();
    while at_end.len() < partitions.len() {
        if started.elapsed() > READ_FOR {
            return Err(SinkError::Unavailable {
                context: format!("reading lineage topic `{topic}` took over {READ_FOR:?}"),
                cause: None,
            });
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(unavailable(e)),
            Some(Ok(m)) => {
                if m.key() == Some(pipeline.as_bytes())
                    && let Some(value) = m.payload()
                {
                    entries.push(value.to_vec());
                }
            }
        }
    }
    Ok(entries)
}
