//! Reading lineage back: the committed batches of a pipeline (module and
//! params digests, batch time, output digest) with their offset ranges,
//! from the sink's `batches` and `batch_ranges` tables, selected by batch
//! id, commit time or offset range; and the keyed state a batch read, for
//! its replay.
//!
//! It must not write: lineage is written only in the batch transaction.

use crate::batch::OffsetRange;
use crate::config::StoreConnection;
use crate::sink::SinkError;
use crate::{Dialect, connect_any, text_at};
use sluice_core::store::{CommittedBatch, LineageStore, Selection};
use sqlx::{AnyPool, Row};
use std::collections::HashMap;

/// Reads a pipeline's lineage from a SQL sink's database.
pub struct SqlLineage {
    pool: AnyPool,
    select_batches: String,
    select_ranges: String,
    /// The batches' recorded state reads.
    state: crate::SqlStateStore,
}

fn db_err(e: sqlx::Error) -> SinkError {
    SinkError::database("reading lineage", e)
}

impl SqlLineage {
    pub async fn open(sink: &StoreConnection) -> Result<SqlLineage, SinkError> {
        let (pool, d) = connect_any(sink).await?;
        let (select_batches, select_ranges) = statements(d, sink)?;
        Ok(SqlLineage {
            state: crate::SqlStateStore::on(pool.clone(), d, sink)?,
            pool,
            select_batches,
            select_ranges,
        })
    }
}

#[async_trait::async_trait]
impl LineageStore for SqlLineage {
    async fn batches(
        &self,
        pipeline: &str,
        selection: &Selection,
    ) -> Result<Vec<CommittedBatch>, SinkError> {
        let mut ranges: HashMap<String, Vec<OffsetRange>> = HashMap::new();
        for row in sqlx::query(&self.select_ranges)
            .bind(pipeline.to_string())
            .fetch_all(&self.pool)
            .await
            .map_err(db_err)?
        {
            let id = text_at(&row, 0).map_err(db_err)?;
            ranges.entry(id).or_default().push(OffsetRange {
                topic: text_at(&row, 1).map_err(db_err)?,
                partition: row.try_get::<i64, _>(2).map_err(db_err)? as i32,
                from: row.try_get(3).map_err(db_err)?,
                until: row.try_get(4).map_err(db_err)?,
            });
        }
        let mut batches = Vec::new();
        for row in sqlx::query(&self.select_batches)
            .bind(pipeline.to_string())
            .fetch_all(&self.pool)
            .await
            .map_err(db_err)?
        {
            let batch_id = text_at(&row, 0).map_err(db_err)?;
            let batch = CommittedBatch {
                ranges: ranges.remove(&batch_id).unwrap_or_default(),
                batch_id,
                module_digest: text_at(&row, 1).map_err(db_err)?,
                params_digest: text_at(&row, 2).map_err(db_err)?,
                batch_time_ms: row.try_get(3).map_err(db_err)?,
                output_digest: text_at(&row, 4).map_err(db_err)?,
                committed_at_ms: row.try_get(5).map_err(db_err)?,
                settings: text_at(&row, 6).map_err(db_err)?,
            };
            if selection.keeps(&batch) {
                batches.push(batch);
            }
        }
        selection.keep_last(&mut batches);
        Ok(batches)
    }

    async fn state_reads(
        &self,
        pipeline: &str,
        batch_id: &str,
    ) -> Result<sluice_core::state::StateMap, SinkError> {
        self.state.reads(pipeline, batch_id).await
    }
}

fn statements(d: &Dialect, sink: &StoreConnection) -> Result<(String, String), SinkError> {
    let table = |name: &str| crate::own_table(d, sink, name);
    let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
    let listed = |cols: &[&str]| cols.iter().map(|n| c(n)).collect::<Vec<_>>().join(", ");
    let batches = format!(
        "SELECT {} FROM {} WHERE {} = {} ORDER BY {}, {}",
        listed(&[
            "batch_id",
            "module_digest",
            "params_digest",
            "batch_time_ms",
            "output_digest",
            "committed_at_ms",
            "settings"
        ]),
        table("batches")?,
        c("pipeline"),
        d.param(1),
        c("committed_at_ms"),
        c("batch_id"),
    );
    let ranges = format!(
        "SELECT {} FROM {} WHERE {} = {} ORDER BY {}, {}, {}",
        listed(&[
            "batch_id",
            "topic",
            "partition",
            "from_offset",
            "until_offset"
        ]),
        table("batch_ranges")?,
        c("pipeline"),
        d.param(1),
        c("topic"),
        c("partition"),
        c("from_offset"),
    );
    Ok((batches, ranges))
}
