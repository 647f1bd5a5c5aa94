//! The SQLite sink: one transaction per batch with the offset compare-and-set.
//!
//! Delivery guarantee: exactly-once, see the module header in `mod.rs`.
//! Owns sluice's own tables (checkpoints, batches, batch ranges, dead
//! letters) and the target tables' statements. It must never paste a name
//! from configuration into SQL unquoted, and never write a batch whose commit
//! outcome is unknown without reading the checkpoint back first.

use super::config::SqliteConfig;
use crate::batch::{OffsetRange, Plan, TopicPartition};
use crate::config::{ColumnType, SinkConfig, TargetConfig, WriteMode};
use crate::output::{ColumnData, TargetRows, Value};
use crate::sink::{Commit, CommitOutcome, SinkError, quote_ident};
use sqlx::sqlite::{SqliteArguments, SqliteConnection};
use sqlx::{Arguments, Connection, Row, SqlitePool};
use std::collections::HashMap;

/// Most bound parameters per statement (SQLite's limit is 32766).
const MAX_PARAMS: usize = 30_000;
/// Most rows per multi-row INSERT.
const MAX_ROWS_PER_STATEMENT: usize = 500;

/// A target with its statements prepared as text (identifiers quoted once).
struct Target {
    config: TargetConfig,
    /// Column names in the order of `config.columns`.
    columns: Vec<String>,
    /// `INSERT INTO "t" ("a","b") VALUES `
    insert_head: String,
    /// ` ON CONFLICT ... ` or empty.
    conflict_tail: String,
    /// `DELETE FROM "t" WHERE "k1" = ? AND ...`
    delete: String,
}

/// sluice's own table names, quoted.
struct Tables {
    checkpoints: String,
    batches: String,
    ranges: String,
    dead_letters: String,
}

pub struct SqliteSink {
    pub(super) pool: SqlitePool,
    tables: Tables,
    targets: HashMap<String, Target>,
}

fn db_err(e: sqlx::Error) -> SinkError {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            SinkError::Unavailable(e.to_string())
        }
        sqlx::Error::Database(ref d) if d.message().contains("database is locked") => {
            SinkError::Unavailable(e.to_string())
        }
        other => SinkError::Database(other.to_string()),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl SqliteSink {
    /// Opens the database and creates sluice's tables and the targets'
    /// tables (where `create` is set); checks every target's columns exist.
    pub async fn open(config: &SinkConfig) -> Result<SqliteSink, SinkError> {
        let options = SqliteConfig::from_url(&config.url)?.options;
        // One writer: SQLite serializes writes anyway, and one connection keeps
        // `BEGIN IMMEDIATE` ... `COMMIT` on the same handle.
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(|e| SinkError::Unavailable(format!("cannot open {}: {e}", config.url)))?;
        let p = &config.table_prefix;
        let tables = Tables {
            checkpoints: quote_ident(&format!("{p}checkpoints"))?,
            batches: quote_ident(&format!("{p}batches"))?,
            ranges: quote_ident(&format!("{p}batch_ranges"))?,
            dead_letters: quote_ident(&format!("{p}dead_letters"))?,
        };
        let mut sink = SqliteSink {
            pool,
            tables,
            targets: HashMap::new(),
        };
        sink.create_own_tables().await?;
        for t in &config.targets {
            let target = Target::new(t)?;
            sink.prepare_table(&target).await?;
            sink.targets.insert(t.name.clone(), target);
        }
        Ok(sink)
    }

    async fn create_own_tables(&self) -> Result<(), SinkError> {
        let t = &self.tables;
        let ddl = [
            format!(
                "CREATE TABLE IF NOT EXISTS {} (pipeline TEXT NOT NULL, topic TEXT NOT NULL, \
                 partition INTEGER NOT NULL, next_offset INTEGER NOT NULL, \
                 updated_at_ms INTEGER NOT NULL, PRIMARY KEY (pipeline, topic, partition))",
                t.checkpoints
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (pipeline TEXT NOT NULL, batch_id TEXT NOT NULL, \
                 module_digest TEXT NOT NULL, params_digest TEXT NOT NULL, \
                 batch_time_ms INTEGER NOT NULL, records_in INTEGER NOT NULL, \
                 rows_out INTEGER NOT NULL, dead_letters INTEGER NOT NULL, \
                 output_digest TEXT NOT NULL, committed_at_ms INTEGER NOT NULL, \
                 PRIMARY KEY (pipeline, batch_id))",
                t.batches
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (pipeline TEXT NOT NULL, batch_id TEXT NOT NULL, \
                 topic TEXT NOT NULL, partition INTEGER NOT NULL, from_offset INTEGER NOT NULL, \
                 until_offset INTEGER NOT NULL, records INTEGER NOT NULL, \
                 PRIMARY KEY (pipeline, topic, partition, from_offset))",
                t.ranges
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (pipeline TEXT NOT NULL, batch_id TEXT NOT NULL, \
                 topic TEXT NOT NULL, partition INTEGER NOT NULL, \"offset\" INTEGER NOT NULL, \
                 record_key BLOB, record_value BLOB, kind TEXT NOT NULL, reason TEXT NOT NULL, \
                 PRIMARY KEY (pipeline, topic, partition, \"offset\"))",
                t.dead_letters
            ),
        ];
        for statement in ddl {
            sqlx::query(&statement)
                .execute(&self.pool)
                .await
                .map_err(db_err)?;
        }
        Ok(())
    }

    async fn prepare_table(&self, target: &Target) -> Result<(), SinkError> {
        let table = quote_ident(target.config.table())?;
        if target.config.create {
            let mut cols: Vec<String> = Vec::new();
            for (name, ty) in &target.config.columns {
                cols.push(format!("{} {}", quote_ident(name)?, sql_type(*ty)));
            }
            if !target.config.key.is_empty() {
                let keys: Result<Vec<_>, _> =
                    target.config.key.iter().map(|k| quote_ident(k)).collect();
                cols.push(format!("PRIMARY KEY ({})", keys?.join(", ")));
            }
            let ddl = format!("CREATE TABLE IF NOT EXISTS {table} ({})", cols.join(", "));
            sqlx::query(&ddl)
                .execute(&self.pool)
                .await
                .map_err(db_err)?;
        }
        let info = sqlx::query("SELECT name FROM pragma_table_info(?)")
            .bind(target.config.table())
            .fetch_all(&self.pool)
            .await
            .map_err(db_err)?;
        let existing: Vec<String> = info.iter().map(|r| r.get::<String, _>(0)).collect();
        if existing.is_empty() {
            return Err(SinkError::Config(format!(
                "table {table} for target `{}` does not exist (set `create = true` or create it)",
                target.config.name
            )));
        }
        if let Some(missing) = target.columns.iter().find(|c| !existing.contains(c)) {
            return Err(SinkError::Config(format!(
                "table {table} has no column `{missing}` (target `{}`)",
                target.config.name
            )));
        }
        Ok(())
    }

    /// The stored next offsets of `partitions` (absent = never committed).
    pub async fn checkpoints(
        &self,
        pipeline: &str,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError> {
        let sql = format!(
            "SELECT next_offset FROM {} WHERE pipeline = ? AND topic = ? AND partition = ?",
            self.tables.checkpoints
        );
        let mut found = HashMap::new();
        for tp in partitions {
            let row = sqlx::query(&sql)
                .bind(pipeline)
                .bind(&tp.topic)
                .bind(tp.partition)
                .fetch_optional(&self.pool)
                .await
                .map_err(db_err)?;
            if let Some(row) = row {
                found.insert(tp.clone(), row.get::<i64, _>(0));
            }
        }
        Ok(found)
    }

    /// Commits one batch atomically, or reports it fenced. An error from
    /// `COMMIT` itself comes back as [`SinkError::CommitUnknown`].
    pub async fn commit(&self, c: &Commit<'_>) -> Result<CommitOutcome, SinkError> {
        let mut conn = self.pool.acquire().await.map_err(db_err)?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .map_err(db_err)?;
        match self.write_batch(&mut conn, c).await {
            Ok(CommitOutcome::Committed) => {}
            other => {
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                return other;
            }
        }
        match sqlx::query("COMMIT").execute(&mut *conn).await {
            Ok(_) => Ok(CommitOutcome::Committed),
            Err(e) => {
                // The connection may be unusable; drop it rather than reuse.
                let _ = conn.detach().close().await;
                Err(SinkError::CommitUnknown(e.to_string()))
            }
        }
    }

    async fn write_batch(
        &self,
        conn: &mut SqliteConnection,
        c: &Commit<'_>,
    ) -> Result<CommitOutcome, SinkError> {
        for range in &c.plan.ranges {
            if let Some(fenced) = self.move_offset(conn, &c.plan.pipeline, range).await? {
                return Ok(fenced);
            }
        }
        for rows in &c.output.targets {
            self.write_target(conn, rows).await?;
        }
        self.write_dead_letters(conn, c).await?;
        self.write_lineage(conn, c).await?;
        Ok(CommitOutcome::Committed)
    }

    /// The compare-and-set: moves `from -> until` only if the stored offset
    /// still equals `from` (or no offset is stored yet).
    async fn move_offset(
        &self,
        conn: &mut SqliteConnection,
        pipeline: &str,
        r: &OffsetRange,
    ) -> Result<Option<CommitOutcome>, SinkError> {
        let t = &self.tables.checkpoints;
        let updated = sqlx::query(&format!(
            "UPDATE {t} SET next_offset = ?, updated_at_ms = ? \
             WHERE pipeline = ? AND topic = ? AND partition = ? AND next_offset = ?"
        ))
        .bind(r.until)
        .bind(now_ms())
        .bind(pipeline)
        .bind(&r.topic)
        .bind(r.partition)
        .bind(r.from)
        .execute(&mut *conn)
        .await
        .map_err(db_err)?
        .rows_affected();
        if updated == 1 {
            return Ok(None);
        }
        let inserted = sqlx::query(&format!(
            "INSERT INTO {t} (pipeline, topic, partition, next_offset, updated_at_ms) \
             VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
        ))
        .bind(pipeline)
        .bind(&r.topic)
        .bind(r.partition)
        .bind(r.until)
        .bind(now_ms())
        .execute(&mut *conn)
        .await
        .map_err(db_err)?
        .rows_affected();
        if inserted == 1 {
            return Ok(None);
        }
        let found = sqlx::query(&format!(
            "SELECT next_offset FROM {t} WHERE pipeline = ? AND topic = ? AND partition = ?"
        ))
        .bind(pipeline)
        .bind(&r.topic)
        .bind(r.partition)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db_err)?
        .map(|row| row.get::<i64, _>(0));
        Ok(Some(CommitOutcome::Fenced {
            partition: r.topic_partition().to_string(),
            expected: r.from,
            found,
        }))
    }

    async fn write_target(
        &self,
        conn: &mut SqliteConnection,
        rows: &TargetRows,
    ) -> Result<(), SinkError> {
        let target = self.targets.get(&rows.target).ok_or_else(|| {
            SinkError::Config(format!(
                "module wrote to target `{}`, which the sink does not declare",
                rows.target
            ))
        })?;
        let cells = target.columns_of(rows)?;
        let n = rows.rows as usize;
        if target.config.mode == WriteMode::Delete {
            let keys: Vec<usize> = target
                .config
                .key
                .iter()
                .map(|k| {
                    target
                        .columns
                        .iter()
                        .position(|c| c == k)
                        .expect("validated")
                })
                .collect();
            for row in 0..n {
                let mut args = SqliteArguments::default();
                for &k in &keys {
                    bind(&mut args, cells[k][row])?;
                }
                sqlx::query_with(&target.delete, args)
                    .execute(&mut *conn)
                    .await
                    .map_err(db_err)?;
            }
            return Ok(());
        }
        let width = target.columns.len();
        let chunk = (MAX_PARAMS / width).clamp(1, MAX_ROWS_PER_STATEMENT);
        let placeholder = format!("({})", vec!["?"; width].join(","));
        let mut start = 0;
        while start < n {
            let end = (start + chunk).min(n);
            let mut sql = target.insert_head.clone();
            sql.push_str(&vec![placeholder.as_str(); end - start].join(","));
            sql.push_str(&target.conflict_tail);
            let mut args = SqliteArguments::default();
            for row in start..end {
                for col in &cells {
                    bind(&mut args, col[row])?;
                }
            }
            sqlx::query_with(&sql, args)
                .execute(&mut *conn)
                .await
                .map_err(db_err)?;
            start = end;
        }
        Ok(())
    }

    async fn write_dead_letters(
        &self,
        conn: &mut SqliteConnection,
        c: &Commit<'_>,
    ) -> Result<(), SinkError> {
        if c.dead_letters.is_empty() {
            return Ok(());
        }
        let records: Vec<_> = c.records.iter().collect();
        let sql = format!(
            "INSERT INTO {} (pipeline, batch_id, topic, partition, \"offset\", record_key, \
             record_value, kind, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            self.tables.dead_letters
        );
        for d in c.dead_letters {
            let r = records[d.index];
            sqlx::query(&sql)
                .bind(&c.plan.pipeline)
                .bind(&c.plan.batch_id)
                .bind(r.topic)
                .bind(r.partition)
                .bind(r.offset)
                .bind(r.key)
                .bind(r.value)
                .bind(d.kind.as_str())
                .bind(&d.reason)
                .execute(&mut *conn)
                .await
                .map_err(db_err)?;
        }
        Ok(())
    }

    async fn write_lineage(
        &self,
        conn: &mut SqliteConnection,
        c: &Commit<'_>,
    ) -> Result<(), SinkError> {
        let plan: &Plan = c.plan;
        sqlx::query(&format!(
            "INSERT INTO {} (pipeline, batch_id, module_digest, params_digest, batch_time_ms, \
             records_in, rows_out, dead_letters, output_digest, committed_at_ms) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            self.tables.batches
        ))
        .bind(&plan.pipeline)
        .bind(&plan.batch_id)
        .bind(&plan.module_digest)
        .bind(&plan.params_digest)
        .bind(plan.batch_time_ms)
        .bind(c.records.len() as i64)
        .bind(c.output.row_count() as i64)
        .bind(c.dead_letters.len() as i64)
        .bind(c.output_digest)
        .bind(now_ms())
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
        let sql = format!(
            "INSERT INTO {} (pipeline, batch_id, topic, partition, from_offset, until_offset, \
             records) VALUES (?, ?, ?, ?, ?, ?, ?)",
            self.tables.ranges
        );
        for r in &plan.ranges {
            let count = c
                .records
                .slices
                .iter()
                .filter(|s| s.topic == r.topic && s.partition == r.partition)
                .map(|s| s.count as i64)
                .sum::<i64>();
            sqlx::query(&sql)
                .bind(&plan.pipeline)
                .bind(&plan.batch_id)
                .bind(&r.topic)
                .bind(r.partition)
                .bind(r.from)
                .bind(r.until)
                .bind(count)
                .execute(&mut *conn)
                .await
                .map_err(db_err)?;
        }
        Ok(())
    }
}

impl Target {
    fn new(config: &TargetConfig) -> Result<Target, SinkError> {
        let table = quote_ident(config.table())?;
        let columns: Vec<String> = config.columns.keys().cloned().collect();
        let quoted: Vec<String> = columns
            .iter()
            .map(|c| quote_ident(c))
            .collect::<Result<_, _>>()?;
        let keys: Vec<String> = config
            .key
            .iter()
            .map(|k| quote_ident(k))
            .collect::<Result<_, _>>()?;
        let non_keys: Vec<&String> = columns
            .iter()
            .zip(&quoted)
            .filter(|(c, _)| !config.key.contains(c))
            .map(|(_, q)| q)
            .collect();
        let conflict_tail = match config.mode {
            WriteMode::Append | WriteMode::Delete => String::new(),
            _ if non_keys.is_empty() => format!(" ON CONFLICT ({}) DO NOTHING", keys.join(", ")),
            WriteMode::Upsert => format!(
                " ON CONFLICT ({}) DO UPDATE SET {}",
                keys.join(", "),
                non_keys
                    .iter()
                    .map(|c| format!("{c} = excluded.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            WriteMode::Accumulate => format!(
                " ON CONFLICT ({}) DO UPDATE SET {}",
                keys.join(", "),
                non_keys
                    .iter()
                    .map(|c| format!("{c} = coalesce({table}.{c}, 0) + coalesce(excluded.{c}, 0)"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        Ok(Target {
            config: config.clone(),
            insert_head: format!("INSERT INTO {table} ({}) VALUES ", quoted.join(", ")),
            conflict_tail,
            delete: format!(
                "DELETE FROM {table} WHERE {}",
                keys.iter()
                    .map(|k| format!("{k} = ?"))
                    .collect::<Vec<_>>()
                    .join(" AND ")
            ),
            columns,
        })
    }

    /// The output's cells in this target's column order, after checking the
    /// module's columns match the declared ones in name and type.
    fn columns_of<'a>(&self, rows: &'a TargetRows) -> Result<Vec<Vec<Value<'a>>>, SinkError> {
        let name = &self.config.name;
        if let Some(extra) = rows
            .columns
            .iter()
            .find(|c| !self.config.columns.contains_key(&c.name))
        {
            return Err(SinkError::Config(format!(
                "module wrote column `{}` to target `{name}`, which declares only {:?}",
                extra.name, self.columns
            )));
        }
        self.config
            .columns
            .iter()
            .map(|(col, ty)| {
                let c = rows
                    .columns
                    .iter()
                    .find(|c| &c.name == col)
                    .ok_or_else(|| {
                        SinkError::Config(format!(
                            "module wrote no column `{col}` for target `{name}`"
                        ))
                    })?;
                if !compatible(*ty, &c.data) {
                    return Err(SinkError::Config(format!(
                        "target `{name}` column `{col}` is {ty:?} but the module wrote {}",
                        c.data.kind()
                    )));
                }
                Ok(c.values())
            })
            .collect()
    }
}

fn compatible(ty: ColumnType, data: &ColumnData) -> bool {
    matches!(
        (ty, data),
        (
            ColumnType::Integer,
            ColumnData::Int64(_) | ColumnData::Bool(_)
        ) | (
            ColumnType::Real,
            ColumnData::Float64(_) | ColumnData::Int64(_)
        ) | (ColumnType::Text, ColumnData::Text { .. })
            | (
                ColumnType::Blob,
                ColumnData::Bytes { .. } | ColumnData::Text { .. }
            )
            | (
                ColumnType::Boolean,
                ColumnData::Bool(_) | ColumnData::Int64(_)
            )
    )
}

fn sql_type(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Integer | ColumnType::Boolean => "INTEGER",
        ColumnType::Real => "REAL",
        ColumnType::Text => "TEXT",
        ColumnType::Blob => "BLOB",
    }
}

fn bind<'a>(args: &mut SqliteArguments<'a>, v: Value<'a>) -> Result<(), SinkError> {
    let r = match v {
        Value::Null => args.add(None::<i64>),
        Value::Int(x) => args.add(x),
        Value::Float(x) => args.add(x),
        Value::Text(s) => args.add(s),
        Value::Bytes(b) => args.add(b),
        Value::Bool(b) => args.add(b),
    };
    r.map_err(|e| SinkError::Database(format!("cannot bind value: {e}")))
}

impl crate::pipeline::Sink for SqliteSink {
    async fn checkpoints(
        &self,
        pipeline: &str,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError> {
        SqliteSink::checkpoints(self, pipeline, partitions).await
    }

    async fn commit(&self, commit: &Commit<'_>) -> Result<CommitOutcome, SinkError> {
        SqliteSink::commit(self, commit).await
    }
}
