//! sluice's own tables in a SQL sink: checkpoints (the offset
//! compare-and-set), lineage (`batches`, `batch_ranges`) and dead letters.
//!
//! Owns their DDL and statements in every dialect. It must not commit: it
//! only writes into the transaction it is handed.

use super::dialect::Dialect;
use super::{Param, SqlTx};
use crate::batch::{OffsetRange, now_ms};
use crate::sink::{Commit, CommitOutcome, SinkError};
use sluice_core::dead_letters::RecordKey;

/// The statements on sluice's own tables, quoted once.
pub(super) struct OwnTables {
    checkpoints: String,
    batches: String,
    ranges: String,
    dead_letters: String,
    cas_update: String,
    cas_insert: String,
    pub(super) select_checkpoint: String,
    insert_batch: String,
    insert_range: String,
    insert_dead_letter: String,
    /// The same, ignoring a dead letter already stored (at-least-once
    /// replays write a batch's dead letters again).
    insert_dead_letter_again: String,
    /// Removes one dead letter (a redrive takes it): by record and the
    /// batch that stored it, as a redrive listed it.
    delete_dead_letter: String,
    pub(super) count_dead_letter: String,
}

impl OwnTables {
    pub(super) fn new(d: &Dialect, schema: Option<&str>, prefix: &str) -> Result<Self, SinkError> {
        let table = |name: &str| d.qualified(schema, &format!("{prefix}{name}"));
        let checkpoints = table("checkpoints")?;
        let batches = table("batches")?;
        let ranges = table("batch_ranges")?;
        let dead_letters = table("dead_letters")?;
        let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
        let next = c("next_offset");
        let key = |first: usize| d.partition_is(first);
        let insert_into = |table: &str, cols: &[&str]| {
            let quoted: Vec<String> = cols.iter().map(|n| c(n)).collect();
            format!(
                "INSERT INTO {table} ({}) VALUES ({})",
                quoted.join(", "),
                d.params(1, cols.len())
            )
        };
        let cas_insert = insert_into(
            &checkpoints,
            &[
                "pipeline",
                "topic",
                "partition",
                "next_offset",
                "updated_at_ms",
            ],
        );
        let ignoring_conflicts = |insert: String| d.ignoring_conflicts(insert);
        let cas_insert = ignoring_conflicts(cas_insert);
        let insert_dead_letter = insert_into(
            &dead_letters,
            &[
                "pipeline",
                "batch_id",
                "topic",
                "partition",
                "offset",
                "record_key",
                "record_value",
                "kind",
                "reason",
                "record_timestamp",
            ],
        );
        let dead_letter_key = format!(
            "{} AND {} = {} AND {} = {}",
            key(1),
            c("offset"),
            d.param(4),
            c("batch_id"),
            d.param(5)
        );
        Ok(OwnTables {
            delete_dead_letter: format!("DELETE FROM {dead_letters} WHERE {dead_letter_key}"),
            count_dead_letter: format!(
                "SELECT COUNT(*) FROM {dead_letters} WHERE {dead_letter_key}"
            ),
            cas_update: format!(
                "UPDATE {checkpoints} SET {next} = {}, {} = {} WHERE {} AND {next} = {}",
                d.param(1),
                c("updated_at_ms"),
                d.param(2),
                key(3),
                d.param(6)
            ),
            cas_insert,
            select_checkpoint: format!("SELECT {next} FROM {checkpoints} WHERE {}", key(1)),
            insert_batch: insert_into(
                &batches,
                &[
                    "pipeline",
                    "batch_id",
                    "module_digest",
                    "params_digest",
                    "batch_time_ms",
                    "records_in",
                    "rows_out",
                    "dead_letters",
                    "output_digest",
                    "committed_at_ms",
                    "settings",
                ],
            ),
            insert_range: insert_into(
                &ranges,
                &[
                    "pipeline",
                    "batch_id",
                    "topic",
                    "partition",
                    "from_offset",
                    "until_offset",
                    "records",
                ],
            ),
            insert_dead_letter_again: ignoring_conflicts(insert_dead_letter.clone()),
            insert_dead_letter,
            checkpoints,
            batches,
            ranges,
            dead_letters,
        })
    }

    /// `CREATE TABLE IF NOT EXISTS` for the four tables.
    pub(super) fn ddl(&self, d: &Dialect) -> Result<Vec<String>, SinkError> {
        let t = &d.types;
        let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
        // Every column is NOT NULL but a dead letter's record key and value.
        let table = |name: &str, cols: &[(&str, &str)], key: &[&str]| {
            let mut parts: Vec<String> = cols
                .iter()
                .map(|(n, ty)| {
                    let nullable = matches!(*n, "record_key" | "record_value");
                    let not_null = if nullable { "" } else { " NOT NULL" };
                    format!("{} {ty}{not_null}", c(n))
                })
                .collect();
            let key: Vec<String> = key.iter().map(|k| c(k)).collect();
            parts.push(format!("PRIMARY KEY ({})", key.join(", ")));
            format!("CREATE TABLE IF NOT EXISTS {name} ({})", parts.join(", "))
        };
        let dead_letters = table(
            &self.dead_letters,
            &[
                ("pipeline", t.key_text),
                ("batch_id", t.key_text),
                ("topic", t.key_text),
                ("partition", t.bigint),
                ("offset", t.bigint),
                ("record_key", t.blob),
                ("record_value", t.blob),
                ("kind", t.key_text),
                ("reason", t.text),
                ("record_timestamp", t.bigint),
            ],
            &["pipeline", "topic", "partition", "offset"],
        );
        Ok(vec![
            table(
                &self.checkpoints,
                &[
                    ("pipeline", t.key_text),
                    ("topic", t.key_text),
                    ("partition", t.bigint),
                    ("next_offset", t.bigint),
                    ("updated_at_ms", t.bigint),
                ],
                &["pipeline", "topic", "partition"],
            ),
            table(
                &self.batches,
                &[
                    ("pipeline", t.key_text),
                    ("batch_id", t.key_text),
                    ("module_digest", t.key_text),
                    ("params_digest", t.key_text),
                    ("batch_time_ms", t.bigint),
                    ("records_in", t.bigint),
                    ("rows_out", t.bigint),
                    ("dead_letters", t.bigint),
                    ("output_digest", t.key_text),
                    ("committed_at_ms", t.bigint),
                    ("settings", t.text),
                ],
                &["pipeline", "batch_id"],
            ),
            table(
                &self.ranges,
                &[
                    ("pipeline", t.key_text),
                    ("batch_id", t.key_text),
                    ("topic", t.key_text),
                    ("partition", t.bigint),
                    ("from_offset", t.bigint),
                    ("until_offset", t.bigint),
                    ("records", t.bigint),
                ],
                &["pipeline", "topic", "partition", "from_offset"],
            ),
            dead_letters,
        ])
    }

    /// Columns added to sluice's tables since their first version: (table
    /// without prefix, column, the `ALTER TABLE` that adds it to a table an
    /// older version created). Rows written before get the default.
    pub(super) fn added_columns(&self, d: &Dialect) -> Vec<(&'static str, &'static str, String)> {
        let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
        let add = |table: &str, column: &str, ty: &str, default: &str| {
            format!(
                "ALTER TABLE {table} ADD COLUMN {} {ty} NOT NULL DEFAULT {default}",
                c(column)
            )
        };
        vec![
            (
                "batches",
                "settings",
                add(&self.batches, "settings", d.types.text, "''"),
            ),
            (
                "dead_letters",
                "record_timestamp",
                add(&self.dead_letters, "record_timestamp", d.types.bigint, "-1"),
            ),
        ]
    }

    /// The compare-and-set: moves `from -> until` only if the stored offset
    /// still equals `from` (or no offset is stored yet). `Some(Fenced)` if
    /// another owner moved it first.
    pub(super) async fn move_offset<S>(
        &self,
        tx: &mut impl SqlTx<S>,
        pipeline: &str,
        r: &OffsetRange,
    ) -> Result<Option<CommitOutcome>, SinkError> {
        let partition = Param::Int(r.partition as i64);
        let moved = tx
            .execute(
                &self.cas_update,
                &[
                    Param::Int(r.until),
                    Param::Int(now_ms()),
                    Param::Text(pipeline),
                    Param::Text(&r.topic),
                    partition,
                    Param::Int(r.from),
                ],
            )
            .await?;
        if moved == 1 {
            return Ok(None);
        }
        let inserted = tx
            .execute(
                &self.cas_insert,
                &[
                    Param::Text(pipeline),
                    Param::Text(&r.topic),
                    partition,
                    Param::Int(r.until),
                    Param::Int(now_ms()),
                ],
            )
            .await?;
        if inserted == 1 {
            return Ok(None);
        }
        let found = tx
            .query_i64(
                &self.select_checkpoint,
                &[Param::Text(pipeline), Param::Text(&r.topic), partition],
            )
            .await?;
        Ok(Some(CommitOutcome::Fenced {
            partition: r.topic_partition().to_string(),
            expected: r.from,
            found,
        }))
    }

    /// Stores the batch's dead letters; `again`: one already stored (by an
    /// earlier attempt of an at-least-once batch) is kept as it is.
    pub(super) async fn write_dead_letters<S>(
        &self,
        tx: &mut impl SqlTx<S>,
        c: &Commit<'_>,
        again: bool,
    ) -> Result<(), SinkError> {
        if c.dead_letters.is_empty() {
            return Ok(());
        }
        let insert = match again {
            true => &self.insert_dead_letter_again,
            false => &self.insert_dead_letter,
        };
        let records: Vec<_> = c.records.iter().collect();
        for d in c.dead_letters {
            let r = records[d.index];
            tx.execute(
                insert,
                &[
                    Param::Text(&c.plan.pipeline),
                    Param::Text(&c.plan.batch_id),
                    Param::Text(r.topic),
                    Param::Int(r.partition as i64),
                    Param::Int(r.offset),
                    Param::Bytes(r.key),
                    Param::Bytes(r.value),
                    Param::Text(d.kind.as_str()),
                    Param::Text(&d.reason),
                    Param::Int(r.timestamp),
                ],
            )
            .await?;
        }
        Ok(())
    }

    /// Removes the dead letter of `key` that batch `stored_by` stored;
    /// false if it is not stored (or stored by another batch since).
    pub(super) async fn delete_dead_letter<S>(
        &self,
        tx: &mut impl SqlTx<S>,
        pipeline: &str,
        key: &RecordKey,
        stored_by: &str,
    ) -> Result<bool, SinkError> {
        let deleted = tx
            .execute(
                &self.delete_dead_letter,
                &[
                    Param::Text(pipeline),
                    Param::Text(&key.topic),
                    Param::Int(key.partition as i64),
                    Param::Int(key.offset),
                    Param::Text(stored_by),
                ],
            )
            .await?;
        Ok(deleted == 1)
    }

    /// The batch's lineage rows: the batch and one row per offset range
    /// (a redrive has none).
    pub(super) async fn write_lineage<S>(
        &self,
        tx: &mut impl SqlTx<S>,
        c: &Commit<'_>,
    ) -> Result<(), SinkError> {
        let plan = c.plan;
        tx.execute(
            &self.insert_batch,
            &[
                Param::Text(&plan.pipeline),
                Param::Text(&plan.batch_id),
                Param::Text(&plan.module_digest),
                Param::Text(&plan.params_digest),
                Param::Int(plan.batch_time_ms),
                Param::Int(c.records.len() as i64),
                Param::Int(c.output.row_count() as i64),
                Param::Int(c.dead_letters.len() as i64),
                Param::Text(c.output_digest),
                Param::Int(now_ms()),
                Param::Text(&plan.settings),
            ],
        )
        .await?;
        for r in &plan.ranges {
            let count = c
                .records
                .slices
                .iter()
                .filter(|s| s.topic == r.topic && s.partition == r.partition)
                .map(|s| s.count as i64)
                .sum::<i64>();
            tx.execute(
                &self.insert_range,
                &[
                    Param::Text(&plan.pipeline),
                    Param::Text(&plan.batch_id),
                    Param::Text(&r.topic),
                    Param::Int(r.partition as i64),
                    Param::Int(r.from),
                    Param::Int(r.until),
                    Param::Int(count),
                ],
            )
            .await?;
        }
        Ok(())
    }
}
