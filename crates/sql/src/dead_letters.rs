//! Reading stored dead letters back from a SQL sink's `dead_letters`
//! table, with the planned time and commit time of the batch that stored
//! each (from `batches`, while its lineage row is there), for `sluice
//! dead-letters list|show` and the records a redrive runs again.
//!
//! It must not write: dead letters are written and removed only in a
//! batch or redrive transaction (`SqlSink::commit`, `SqlSink::redrive`).

use crate::config::StoreConnection;
use crate::sink::SinkError;
use crate::{Dialect, connect_any, text_at};
use sluice_core::dead_letters::{DeadLetterFilter, DeadLetterReader, StoredDeadLetter};
use sqlx::any::AnyRow;
use sqlx::{AnyPool, Row};

/// Reads a pipeline's dead letters from a SQL sink's database.
pub struct SqlDeadLetters {
    pool: AnyPool,
    select: String,
}

fn db_err(e: sqlx::Error) -> SinkError {
    SinkError::database("reading dead letters", e)
}

impl SqlDeadLetters {
    /// Opens the reader; the sink must have been opened once by this
    /// version (its tables have every column read here).
    pub async fn open(sink: &StoreConnection) -> Result<SqlDeadLetters, SinkError> {
        let (pool, d) = connect_any(sink).await?;
        Ok(SqlDeadLetters {
            pool,
            select: select(d, sink)?,
        })
    }
}

#[async_trait::async_trait]
impl DeadLetterReader for SqlDeadLetters {
    async fn list(
        &self,
        pipeline: &str,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<StoredDeadLetter>, SinkError> {
        let rows = sqlx::query(&self.select)
            .bind(pipeline.to_string())
            .fetch_all(&self.pool)
            .await
            .map_err(db_err)?;
        let mut kept = Vec::new();
        for row in rows {
            let d = stored(&row).map_err(db_err)?;
            if filter.keeps(&d) {
                kept.push(d);
            }
        }
        Ok(kept)
    }
}

fn stored(row: &AnyRow) -> Result<StoredDeadLetter, sqlx::Error> {
    Ok(StoredDeadLetter {
        batch_id: text_at(row, 0)?,
        topic: text_at(row, 1)?,
        partition: row.try_get::<i64, _>(2)? as i32,
        offset: row.try_get(3)?,
        timestamp: row.try_get(4)?,
        key: row.try_get(5)?,
        value: row.try_get(6)?,
        kind: text_at(row, 7)?,
        reason: text_at(row, 8)?,
        batch_time_ms: row.try_get(9)?,
        committed_at_ms: row.try_get(10)?,
        stored_at: None,
    })
}

fn select(d: &Dialect, sink: &StoreConnection) -> Result<String, SinkError> {
    let table = |name: &str| crate::own_table(d, sink, name);
    let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
    let of_dead = |cols: &[&str]| {
        cols.iter()
            .map(|n| format!("dl.{}", c(n)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Ok(format!(
        "SELECT {}, b.{}, b.{} FROM {} dl LEFT JOIN {} b ON b.{pl} = dl.{pl} AND b.{id} = dl.{id} \
         WHERE dl.{pl} = {} ORDER BY dl.{}, dl.{}, dl.{}",
        of_dead(&[
            "batch_id",
            "topic",
            "partition",
            "offset",
            "record_timestamp",
            "record_key",
            "record_value",
            "kind",
            "reason",
        ]),
        c("batch_time_ms"),
        c("committed_at_ms"),
        table("dead_letters")?,
        table("batches")?,
        d.param(1),
        c("topic"),
        c("partition"),
        c("offset"),
        pl = c("pipeline"),
        id = c("batch_id"),
    ))
}
