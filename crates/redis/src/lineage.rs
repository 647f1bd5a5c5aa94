//! Lineage on Redis: one JSON entry per committed batch, appended to the
//! list `<prefix>lineage:<pipeline>` by the commit script and trimmed there
//! to the newest `sink.lineage_keep` entries (by count, not age: a count
//! bounds the memory whatever the batch rate). Read back for `verify` and
//! `shadow`.
//!
//! It must not write: entries are written only by the commit script.

use crate::connect::{StateKeys, connect, sink_err};
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use sluice_core::batch::{OffsetRange, now_ms};
use sluice_core::config::SinkConfig;
use sluice_core::sink::{Commit, SinkError};
use sluice_core::store::{CommittedBatch, LineageStore, Selection};
use std::time::Duration;

/// One committed batch, as stored.
#[derive(Debug, Serialize, Deserialize)]
pub struct LineageEntry {
    pub batch_id: String,
    pub module_digest: String,
    pub params_digest: String,
    pub batch_time_ms: i64,
    pub records: u64,
    pub rows: u64,
    pub dead_letters: u64,
    pub output_digest: String,
    pub committed_at_ms: i64,
    pub settings: String,
    pub ranges: Vec<OffsetRange>,
}

impl LineageEntry {
    pub fn of(c: &Commit<'_>) -> LineageEntry {
        LineageEntry {
            batch_id: c.plan.batch_id.clone(),
            module_digest: c.plan.module_digest.clone(),
            params_digest: c.plan.params_digest.clone(),
            batch_time_ms: c.plan.batch_time_ms,
            records: c.records.len() as u64,
            rows: c.output.row_count(),
            dead_letters: c.dead_letters.len() as u64,
            output_digest: c.output_digest.to_string(),
            committed_at_ms: now_ms(),
            settings: c.plan.settings.clone(),
            ranges: c.plan.ranges.clone(),
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("lineage entries serialize")
    }

    fn into_batch(self) -> CommittedBatch {
        CommittedBatch {
            batch_id: self.batch_id,
            module_digest: self.module_digest,
            params_digest: self.params_digest,
            batch_time_ms: self.batch_time_ms,
            output_digest: self.output_digest,
            committed_at_ms: self.committed_at_ms,
            settings: self.settings,
            ranges: self.ranges,
        }
    }
}

/// Reads a pipeline's lineage from a Redis sink.
pub struct RedisLineage {
    conn: ConnectionManager,
    prefix: String,
}

impl RedisLineage {
    pub async fn open(sink: &SinkConfig) -> Result<RedisLineage, SinkError> {
        Ok(RedisLineage {
            conn: connect(&sink.url, Duration::from_millis(sink.lock_timeout_ms)).await?,
            prefix: sink.table_prefix.clone(),
        })
    }
}

#[async_trait::async_trait]
impl LineageStore for RedisLineage {
    async fn batches(
        &self,
        pipeline: &str,
        selection: &Selection,
    ) -> Result<Vec<CommittedBatch>, SinkError> {
        let keys = StateKeys::new(&self.prefix, pipeline);
        let mut conn = self.conn.clone();
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg(&keys.lineage)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .map_err(|e| sink_err("reading lineage", e))?;
        let mut batches = Vec::with_capacity(entries.len());
        for text in entries {
            let entry: LineageEntry = serde_json::from_str(&text)
                .map_err(|e| SinkError::database("a lineage entry is not sluice's JSON", e))?;
            let batch = entry.into_batch();
            if selection.keeps(&batch) {
                batches.push(batch);
            }
        }
        selection.keep_last(&mut batches);
        Ok(batches)
    }
}
