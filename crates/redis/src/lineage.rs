//! Lineage on Redis: one JSON entry per committed batch, appended to the
//! list `<prefix>lineage:<pipeline>` by the commit script and trimmed there
//! to the newest `sink.lineage_keep` entries (by count, not age: a count
//! bounds the memory whatever the batch rate). Read back for `verify` and
//! `shadow`, with the keyed state each batch read (for its replay).
//!
//! It must not write: entries are written only by the commit script.

use crate::connect::{StateKeys, connect, sink_err, whole_list};
use redis::aio::ConnectionManager;
use sluice_core::config::StoreConnection;
use sluice_core::sink::SinkError;
use sluice_core::store::{
    CommittedBatch, LineageStore, Selection, entry_state_reads, select_entries,
};
use std::time::Duration;

/// Reads a pipeline's lineage from a Redis sink.
pub struct RedisLineage {
    conn: ConnectionManager,
    prefix: String,
}

impl RedisLineage {
    pub async fn open(sink: &StoreConnection) -> Result<RedisLineage, SinkError> {
        let conn = connect(&sink.url, Duration::from_millis(sink.lock_timeout_ms)).await?;
        Ok(RedisLineage::on(conn, sink))
    }

    /// Reads `sink`'s lineage through `conn`.
    pub(crate) fn on(conn: ConnectionManager, sink: &StoreConnection) -> RedisLineage {
        RedisLineage {
            conn,
            prefix: sink.table_prefix.clone(),
        }
    }

    /// Every lineage entry of `pipeline`, oldest first.
    async fn entries(&self, pipeline: &str) -> Result<Vec<String>, SinkError> {
        let keys = StateKeys::new(&self.prefix, pipeline);
        whole_list(&self.conn, &keys.lineage)
            .await
            .map_err(|e| sink_err("reading lineage", e))
    }
}

#[async_trait::async_trait]
impl LineageStore for RedisLineage {
    async fn batches(
        &self,
        pipeline: &str,
        selection: &Selection,
    ) -> Result<Vec<CommittedBatch>, SinkError> {
        select_entries(self.entries(pipeline).await?, selection)
    }

    async fn state_reads(
        &self,
        pipeline: &str,
        batch_id: &str,
    ) -> Result<sluice_core::state::StateMap, SinkError> {
        Ok(entry_state_reads(self.entries(pipeline).await?, batch_id)?.unwrap_or_default())
    }
}
