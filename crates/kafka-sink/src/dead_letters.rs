//! Dead letters on the exactly-once Kafka sink: read back from the
//! dead-letter topic for `sluice dead-letters list|show`. Each is the
//! failed record's key and value with `sluice.*` headers saying where it
//! came from and why (`records`); its batch's times come from the lineage
//! topic while retention keeps them.
//!
//! Read with `read_committed`, so a batch's aborted attempts are not seen
//! on a broker that hides them; one that shows them (the Tansu build the
//! tests use) shows a retried batch's attempts twice, and a dead letter is
//! therefore counted once per batch and record. The record's own time is
//! its `sluice.timestamp` header (the dead letter's Kafka timestamp is
//! when it was produced).
//!
//! Dead letters below the redrive's position (`redrive`) are redriven and
//! left out.
//!
//! It must not write: dead letters are written only by the batch and
//! redrive transactions.

use crate::client::{BROKER_TIMEOUT, Cluster};
use crate::lineage::KafkaLineage;
use crate::section::KafkaSection;
use crate::to_end::{EndReadError, EndReader};
use rdkafka::consumer::Consumer;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sluice_core::config::{KindSection, PipelineConfig};
use sluice_core::dead_letters::{
    DeadLetterFilter, DeadLetterReader, StoredAt, StoredDeadLetter, with_batch_times,
};
use sluice_core::sink::SinkError;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// How long reading the whole dead-letter topic may take.
const READ_FOR: Duration = Duration::from_secs(120);

/// Reads a pipeline's dead letters from its Kafka dead-letter topic.
pub struct KafkaDeadLetters {
    cluster: Cluster,
    topic: String,
    /// The pipeline's consumer group, which keeps the redrive's positions.
    group: String,
    lineage: KafkaLineage,
}

impl KafkaDeadLetters {
    pub fn open(config: &PipelineConfig) -> Result<KafkaDeadLetters, SinkError> {
        Ok(KafkaDeadLetters {
            cluster: Cluster::of(config)?,
            topic: KafkaSection::sink(&config.sink)?.dead_letter_topic(&config.pipeline),
            group: config.group_id(),
            lineage: KafkaLineage::open(config)?,
        })
    }

    /// Every dead letter of `pipeline` in the topic not yet redriven (at
    /// or past the redrive's position), once per batch and record.
    fn read(&self, pipeline: &str) -> Result<Vec<StoredDeadLetter>, SinkError> {
        let failed = |e: EndReadError| match e {
            EndReadError::NoTopic(_) => {
                SinkError::Config(format!("dead-letter topic `{}` does not exist", self.topic))
            }
            e => SinkError::unavailable(format!("reading dead-letter topic `{}`", self.topic), e),
        };
        let reader =
            EndReader::open(self.cluster.client(), &self.group, &self.topic).map_err(failed)?;
        let positions = positions(&reader, &self.topic)?;
        let mut letters = BTreeMap::new();
        let mut foreign = None;
        reader
            .read(reader.partitions(), READ_FOR, |m| {
                match parse(m) {
                    Ok(Some((of, d)))
                        if of == pipeline
                            && m.offset()
                                >= positions.get(&m.partition()).copied().unwrap_or(0) =>
                    {
                        letters.insert((d.batch_id.clone(), d.key()), d);
                    }
                    Ok(_) => {}
                    Err(why) => foreign = Some(why),
                }
                foreign.is_none()
            })
            .map_err(failed)?;
        if let Some(why) = foreign {
            return Err(SinkError::Database {
                context: format!(
                    "a record in dead-letter topic `{}` is not one sluice wrote: {why}",
                    self.topic
                ),
                cause: None,
            });
        }
        Ok(letters.into_values().collect())
    }
}

#[async_trait::async_trait]
impl DeadLetterReader for KafkaDeadLetters {
    async fn list(
        &self,
        pipeline: &str,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<StoredDeadLetter>, SinkError> {
        let letters = tokio::task::block_in_place(|| self.read(pipeline))?;
        with_batch_times(letters, &self.lineage, pipeline, filter).await
    }
}

/// The redrive's position per partition of `topic` (dead letters below
/// it are redriven): the group's stable committed offsets.
fn positions(reader: &EndReader, topic: &str) -> Result<HashMap<i32, i64>, SinkError> {
    let mut list = TopicPartitionList::new();
    for &p in reader.partitions() {
        list.add_partition(topic, p);
    }
    let committed = reader
        .consumer()
        .committed_offsets(list, BROKER_TIMEOUT)
        .map_err(|e| SinkError::unavailable("reading the redrive's positions", e))?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// The pipeline a dead-letter record is of, and the dead letter; `None`
/// for a record without sluice's headers.
fn parse(m: &BorrowedMessage<'_>) -> Result<Option<(String, StoredDeadLetter)>, String> {
    let mut headers: HashMap<&str, String> = HashMap::new();
    if let Some(hs) = m.headers() {
        for h in hs.iter() {
            if let Some(value) = h.value {
                headers.insert(h.key, String::from_utf8_lossy(value).into_owned());
            }
        }
    }
    let Some(pipeline) = headers.get("sluice.pipeline").cloned() else {
        return Ok(None);
    };
    let text = |name: &str| {
        headers
            .get(name)
            .cloned()
            .ok_or_else(|| format!("no `{name}` header"))
    };
    let int = |name: &str| -> Result<i64, String> {
        text(name)?
            .parse()
            .map_err(|e| format!("header `{name}`: {e}"))
    };
    let letter = StoredDeadLetter {
        batch_id: text("sluice.batch")?,
        topic: text("sluice.topic")?,
        partition: i32::try_from(int("sluice.partition")?).map_err(|e| e.to_string())?,
        offset: int("sluice.offset")?,
        // Dead letters stored before sluice kept the record's time: -1.
        timestamp: headers
            .get("sluice.timestamp")
            .and_then(|t| t.parse().ok())
            .unwrap_or(-1),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        kind: text("sluice.kind")?,
        reason: text("sluice.reason")?,
        batch_time_ms: None,
        committed_at_ms: None,
        stored_at: Some(StoredAt {
            partition: m.partition(),
            offset: m.offset(),
        }),
    };
    Ok(Some((pipeline, letter)))
}
