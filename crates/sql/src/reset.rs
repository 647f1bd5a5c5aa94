//! Moving a pipeline's checkpoints on purpose (`sluice reset`), in one
//! transaction with the lineage it makes stale.
//!
//! # Delivery guarantee
//!
//! A reset changes stored checkpoints, so every batch planned from the old
//! ones fails the offset compare-and-set: a running instance is fenced at
//! its next commit, re-reads the checkpoint and continues from the new one.
//! The checkpoint rows are updated first, so a batch commit waiting on them
//! sees the new offset; lineage and dead letters committed before the reset
//! are seen and moved. Re-processed records land again in the targets:
//! append rows come again, upsert/delete targets converge, accumulate
//! targets add again (the caller warns).
//!
//! The batches whose ranges the re-run covers again, and the dead letters
//! of re-run offsets, are kept but moved out of the pipeline's name into
//! `PIPELINE@reset-N` (N counting this pipeline's resets), so the new run's
//! lineage starts clean and the old run stays readable. It must not touch
//! target tables.
//!
//! Keyed state is the state after the checkpoint's batch; a moved
//! checkpoint would leave it disagreeing. A partition that keeps state is
//! therefore only moved with [`OnState::Clear`], which deletes its state
//! (its state table rows and its state journal) in the same transaction
//! (the re-run starts from empty state); else the reset is refused, saying
//! so, and nothing moves.

use super::{Dialect, connect_any, text_at};
use crate::batch::{TopicPartition, now_ms};
use crate::config::StoreConnection;
use crate::sink::SinkError;
use crate::state::partition_query;
use sqlx::{Any, Transaction};

pub use sluice_core::reset::{OnState, PartitionMove, ResetDone};

/// The state journal's name and its read of a partition's changes, in
/// order (placeholders 1 to 3).
struct JournalNames {
    table: String,
    changes: String,
}

/// sluice's tables and columns, quoted for one dialect.
struct Names {
    checkpoints: String,
    batches: String,
    ranges: String,
    dead_letters: String,
    state: String,
    /// The state journal, if the database has one (an earlier sluice's
    /// has not).
    journal: Option<JournalNames>,
    /// The state rows of one partition (placeholders 1 to 3).
    scope_is: String,
    batch_state: String,
    d: &'static Dialect,
}

impl Names {
    fn new(d: &'static Dialect, sink: &StoreConnection) -> Result<Self, SinkError> {
        let table = |t: &str| crate::own_table(d, sink, t);
        Ok(Names {
            checkpoints: table("checkpoints")?,
            batches: table("batches")?,
            ranges: table("batch_ranges")?,
            dead_letters: table("dead_letters")?,
            state: table(crate::state::STATE_TABLE)?,
            journal: Some(JournalNames {
                table: table(crate::journal::JOURNAL_TABLE)?,
                changes: crate::journal::select_changes(
                    d,
                    &table(crate::journal::JOURNAL_TABLE)?,
                    &crate::state::scope_is(d, &table(crate::state::SCOPES_TABLE)?),
                ),
            }),
            scope_is: crate::state::scope_is(d, &table(crate::state::SCOPES_TABLE)?),
            batch_state: table("batch_state")?,
            d,
        })
    }

    fn c(&self, column: &str) -> String {
        self.d
            .ident(column)
            .expect("sluice's own column names are valid")
    }

    fn p(&self, i: usize) -> String {
        self.d.param(i)
    }

    /// `pipeline = $a AND topic = $b AND partition = $c`, from placeholder `a`.
    fn partition_key(&self, a: usize) -> String {
        self.d.partition_is(a)
    }
}

fn db_err(e: sqlx::Error) -> SinkError {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => SinkError::unavailable("", e),
        other => SinkError::database("reset", other),
    }
}

/// Moves `pipeline`'s checkpoints of the given partitions to their offsets,
/// archiving the lineage and dead letters the move makes stale; with
/// `dry_run`, reports and rolls back.
pub async fn reset(
    sink: &StoreConnection,
    pipeline: &str,
    targets: &[(TopicPartition, i64)],
    on_state: OnState,
    dry_run: bool,
) -> Result<ResetDone, SinkError> {
    let (pool, d) = connect_any(sink).await?;
    let mut n = Names::new(d, sink)?;
    // Asked outside the transaction: a database from before keyed state
    // has no state table (nor one from before the journal a journal), and
    // a failed statement would abort it.
    let exists = |table: &str| {
        let sql = format!("SELECT 1 FROM {table} WHERE 1 = 0");
        let pool = &pool;
        async move { sqlx::query(&sql).fetch_all(pool).await.is_ok() }
    };
    let state_table = exists(&n.state).await;
    if let Some(journal) = &n.journal
        && !exists(&journal.table).await
    {
        n.journal = None;
    }
    let mut tx = pool.begin().await.map_err(db_err)?;
    let mut moves = Vec::new();
    for (tp, to) in targets {
        let from = move_checkpoint(&mut tx, &n, pipeline, tp, *to).await?;
        moves.push(PartitionMove {
            partition: tp.clone(),
            from,
            to: *to,
        });
    }
    let archived_as = format!(
        "{pipeline}@reset-{}",
        resets_so_far(&mut tx, &n, pipeline).await? + 1
    );
    let mut stale = Vec::new();
    for (tp, to) in targets {
        for id in batches_covering(&mut tx, &n, pipeline, tp, *to).await? {
            if !stale.contains(&id) {
                stale.push(id);
            }
        }
    }
    // A batch's recorded state reads go with its lineage rows.
    let lineage_tables: Vec<&String> = match state_table {
        true => vec![&n.batches, &n.ranges, &n.batch_state],
        false => vec![&n.batches, &n.ranges],
    };
    for id in &stale {
        archive_batch(&mut tx, &n, &lineage_tables, pipeline, &archived_as, id).await?;
    }
    let mut dead_letters_archived = 0;
    for (tp, to) in targets {
        dead_letters_archived +=
            archive_dead_letters(&mut tx, &n, pipeline, &archived_as, tp, *to).await?;
    }
    let mut state_keys_cleared = 0;
    if state_table {
        for (tp, _) in targets {
            state_keys_cleared += settle_state(&mut tx, &n, pipeline, tp, on_state).await?;
        }
    }
    match dry_run {
        true => tx.rollback().await.map_err(db_err)?,
        false => tx.commit().await.map_err(db_err)?,
    }
    Ok(ResetDone {
        archived_as,
        moves,
        batches_archived: stale.len(),
        dead_letters_archived,
        state_keys_cleared,
    })
}

/// Deletes `tp`'s keyed state, its table rows and its journal
/// ([`OnState::Clear`]), or refuses to move a partition that keeps some;
/// returns the keys deleted.
async fn settle_state(
    tx: &mut Transaction<'_, Any>,
    n: &Names,
    pipeline: &str,
    tp: &TopicPartition,
    on_state: OnState,
) -> Result<u64, SinkError> {
    let keys = state_keys(tx, n, pipeline, tp).await?;
    match on_state {
        OnState::Clear => {
            let journal = n.journal.as_ref().map(|j| &j.table);
            for table in std::iter::once(&n.state).chain(journal) {
                let sql = format!("DELETE FROM {table} WHERE {}", n.scope_is);
                partition_query(&sql, pipeline, tp)
                    .execute(&mut **tx)
                    .await
                    .map_err(db_err)?;
            }
            Ok(keys)
        }
        OnState::Refuse if keys == 0 => Ok(0),
        OnState::Refuse => Err(SinkError::Config(sluice_core::reset::keeps_state(
            tp,
            Some(keys as i64),
        ))),
    }
}

/// How many keys `tp` keeps: the table's rows with the journal laid over
/// them.
async fn state_keys(
    tx: &mut Transaction<'_, Any>,
    n: &Names,
    pipeline: &str,
    tp: &TopicPartition,
) -> Result<u64, SinkError> {
    let sql = format!("SELECT COUNT(*) FROM {} WHERE {}", n.state, n.scope_is);
    let row = partition_query(&sql, pipeline, tp)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_err)?;
    let in_table = sqlx::Row::try_get::<i64, _>(&row, 0).map_err(db_err)?;
    let Some(journal) = &n.journal else {
        return Ok(in_table as u64);
    };
    let rows = partition_query(&journal.changes, pipeline, tp)
        .fetch_all(&mut **tx)
        .await
        .map_err(db_err)?;
    let changes = rows
        .iter()
        .map(|row| sqlx::Row::try_get::<Vec<u8>, _>(row, 0))
        .collect::<Result<Vec<_>, _>>()
        .map_err(db_err)?;
    let overlay = crate::journal::overlay(&changes)
        .map_err(|e| SinkError::database(format!("the state journal of {tp}"), e))?;
    let mut keys = in_table;
    let listed: Vec<&Vec<u8>> = overlay.keys().collect();
    for chunk in listed.chunks(crate::state::GET_MANY_CHUNK) {
        let sql = format!(
            "SELECT COUNT(*) FROM {} WHERE {} AND {} IN ({})",
            n.state,
            n.scope_is,
            n.c("state_key"),
            n.d.params(4, chunk.len())
        );
        let mut query = partition_query(&sql, pipeline, tp);
        for key in chunk {
            query = query.bind(key.to_vec());
        }
        let row = query.fetch_one(&mut **tx).await.map_err(db_err)?;
        keys -= sqlx::Row::try_get::<i64, _>(&row, 0).map_err(db_err)?;
    }
    keys += overlay.values().filter(|v| v.is_some()).count() as i64;
    Ok(keys.max(0) as u64)
}

/// Sets the checkpoint (inserting it if the partition never committed);
/// returns the one it replaced.
async fn move_checkpoint(
    tx: &mut Transaction<'_, Any>,
    n: &Names,
    pipeline: &str,
    tp: &TopicPartition,
    to: i64,
) -> Result<Option<i64>, SinkError> {
    let next = n.c("next_offset");
    let from: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT {next} FROM {} WHERE {}",
        n.checkpoints,
        n.partition_key(1)
    ))
    .bind(pipeline)
    .bind(&tp.topic)
    .bind(tp.partition as i64)
    .fetch_optional(&mut **tx)
    .await
    .map_err(db_err)?;
    let now = now_ms();
    match from {
        Some(_) => {
            sqlx::query(&format!(
                "UPDATE {} SET {next} = {}, {} = {} WHERE {}",
                n.checkpoints,
                n.p(1),
                n.c("updated_at_ms"),
                n.p(2),
                n.partition_key(3)
            ))
            .bind(to)
            .bind(now)
            .bind(pipeline)
            .bind(&tp.topic)
            .bind(tp.partition as i64)
            .execute(&mut **tx)
            .await
            .map_err(db_err)?;
        }
        None => {
            sqlx::query(&format!(
                "INSERT INTO {} ({}, {}, {}, {next}, {}) VALUES ({})",
                n.checkpoints,
                n.c("pipeline"),
                n.c("topic"),
                n.c("partition"),
                n.c("updated_at_ms"),
                n.d.params(1, 5)
            ))
            .bind(pipeline)
            .bind(&tp.topic)
            .bind(tp.partition as i64)
            .bind(to)
            .bind(now)
            .execute(&mut **tx)
            .await
            .map_err(db_err)?;
        }
    }
    Ok(from)
}

/// How many resets moved this pipeline's lineage aside before.
async fn resets_so_far(
    tx: &mut Transaction<'_, Any>,
    n: &Names,
    pipeline: &str,
) -> Result<u64, SinkError> {
    let prefix = format!("{pipeline}@reset-");
    let mut most = 0;
    for table in [&n.batches, &n.dead_letters] {
        let rows = sqlx::query(&format!("SELECT DISTINCT {} FROM {table}", n.c("pipeline")))
            .fetch_all(&mut **tx)
            .await
            .map_err(db_err)?;
        for row in rows {
            let name = text_at(&row, 0).map_err(db_err)?;
            if let Some(k) = name
                .strip_prefix(&prefix)
                .and_then(|k| k.parse::<u64>().ok())
            {
                most = most.max(k);
            }
        }
    }
    Ok(most)
}

/// Batches with a range of `tp` that ends after `to`: the re-run covers
/// (part of) them again.
async fn batches_covering(
    tx: &mut Transaction<'_, Any>,
    n: &Names,
    pipeline: &str,
    tp: &TopicPartition,
    to: i64,
) -> Result<Vec<String>, SinkError> {
    let rows = sqlx::query(&format!(
        "SELECT DISTINCT {} FROM {} WHERE {} AND {} > {}",
        n.c("batch_id"),
        n.ranges,
        n.partition_key(1),
        n.c("until_offset"),
        n.p(4)
    ))
    .bind(pipeline)
    .bind(&tp.topic)
    .bind(tp.partition as i64)
    .bind(to)
    .fetch_all(&mut **tx)
    .await
    .map_err(db_err)?;
    rows.iter().map(|r| text_at(r, 0).map_err(db_err)).collect()
}

/// Moves one batch's lineage rows (in `tables`: the batch, all its ranges,
/// its recorded state reads) to `archived_as`.
async fn archive_batch(
    tx: &mut Transaction<'_, Any>,
    n: &Names,
    tables: &[&String],
    pipeline: &str,
    archived_as: &str,
    batch_id: &str,
) -> Result<(), SinkError> {
    for table in tables {
        sqlx::query(&format!(
            "UPDATE {table} SET {pl} = {} WHERE {pl} = {} AND {} = {}",
            n.p(1),
            n.p(2),
            n.c("batch_id"),
            n.p(3),
            pl = n.c("pipeline"),
        ))
        .bind(archived_as)
        .bind(pipeline)
        .bind(batch_id)
        .execute(&mut **tx)
        .await
        .map_err(db_err)?;
    }
    Ok(())
}

/// Moves the dead letters of `tp` at or after `to` to `archived_as`.
async fn archive_dead_letters(
    tx: &mut Transaction<'_, Any>,
    n: &Names,
    pipeline: &str,
    archived_as: &str,
    tp: &TopicPartition,
    to: i64,
) -> Result<u64, SinkError> {
    let moved = sqlx::query(&format!(
        "UPDATE {} SET {} = {} WHERE {} AND {} >= {}",
        n.dead_letters,
        n.c("pipeline"),
        n.p(1),
        n.partition_key(2),
        n.c("offset"),
        n.p(5)
    ))
    .bind(archived_as)
    .bind(pipeline)
    .bind(&tp.topic)
    .bind(tp.partition as i64)
    .bind(to)
    .execute(&mut **tx)
    .await
    .map_err(db_err)?;
    Ok(moved.rows_affected())
}
