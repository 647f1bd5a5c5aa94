//! Lineage on Kafka: read back from the lineage topic, for `verify` and
//! `shadow`. Entries are the JSON of the core's `LineageEntry`, keyed by
//! pipeline (so one partition holds a pipeline's lineage in commit order),
//! written only inside the batch transactions; this reads with
//! `read_committed`, so aborted batches are never seen. What it sees is
//! what the topic's retention keeps.
//!
//! It must not write: entries are written only by the sink's commit.

use crate::client::Cluster;
use crate::section::KafkaSection;
use crate::to_end::{EndReadError, EndReader};
use rdkafka::message::Message;
use sluice_core::config::KindSection;
use sluice_core::config::PipelineConfig;
use sluice_core::sink::SinkError;
use sluice_core::state::StateMap;
use sluice_core::store::{
    CommittedBatch, LineageStore, Selection, entry_state_reads, select_entries,
};
use std::time::Duration;

/// How long reading the whole lineage topic may take.
const READ_FOR: Duration = Duration::from_secs(120);

/// Reads a pipeline's lineage from its Kafka lineage topic.
pub struct KafkaLineage {
    cluster: Cluster,
    topic: String,
    /// The entries last read: a replay asks for each batch's state reads
    /// in turn, and each read of the topic reads it whole.
    read: tokio::sync::Mutex<Vec<Vec<u8>>>,
}

impl KafkaLineage {
    pub fn open(config: &PipelineConfig) -> Result<KafkaLineage, SinkError> {
        Ok(KafkaLineage {
            cluster: Cluster::of(config)?,
            topic: KafkaSection::sink(&config.sink)?.lineage_topic(&config.pipeline),
            read: tokio::sync::Mutex::default(),
        })
    }

    /// Every committed entry of `pipeline`, read now.
    async fn entries(&self, pipeline: &str) -> Result<Vec<Vec<u8>>, SinkError> {
        let (cluster, topic, pipeline) = (
            self.cluster.clone(),
            self.topic.clone(),
            pipeline.to_string(),
        );
        tokio::task::spawn_blocking(move || read_entries(&cluster, &topic, &pipeline))
            .await
            .map_err(|e| SinkError::database("reading lineage", e))?
    }
}

#[async_trait::async_trait]
impl LineageStore for KafkaLineage {
    async fn batches(
        &self,
        pipeline: &str,
        selection: &Selection,
    ) -> Result<Vec<CommittedBatch>, SinkError> {
        let entries = self.entries(pipeline).await?;
        let batches = select_entries(&entries, selection);
        *self.read.lock().await = entries;
        batches
    }

    /// From the entries last read if the batch is among them (read again
    /// if not).
    async fn state_reads(&self, pipeline: &str, batch_id: &str) -> Result<StateMap, SinkError> {
        let mut read = self.read.lock().await;
        if let Some(reads) = entry_state_reads(read.iter(), batch_id)? {
            return Ok(reads);
        }
        *read = self.entries(pipeline).await?;
        Ok(entry_state_reads(read.iter(), batch_id)?.unwrap_or_default())
    }
}

/// Every committed entry of `pipeline` in `topic`, in commit order: read
/// from the start of each partition to its end.
pub(crate) fn read_entries(
    cluster: &Cluster,
    topic: &str,
    pipeline: &str,
) -> Result<Vec<Vec<u8>>, SinkError> {
    let failed = |e: EndReadError| match e {
        EndReadError::NoTopic(_) => {
            SinkError::Config(format!("lineage topic `{topic}` does not exist"))
        }
        e => SinkError::unavailable(format!("reading lineage topic `{topic}`"), e),
    };
    let group = format!("sluice-lineage-reader-{pipeline}");
    let reader = EndReader::open(cluster.client(), &group, topic).map_err(failed)?;
    let mut entries = Vec::new();
    reader
        .read(reader.partitions(), READ_FOR, |m| {
            if m.key() == Some(pipeline.as_bytes())
                && let Some(value) = m.payload()
            {
                entries.push(value.to_vec());
            }
            true
        })
        .map_err(failed)?;
    Ok(entries)
}
