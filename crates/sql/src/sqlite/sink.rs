//! The SQLite backend of the SQL sink: connections, statements in SQLite's
//! dialect and its row path (multi-row INSERTs; DELETEs by key, up to 512
//! keys a statement: `multidelete.rs`).
//!
//! Delivery guarantee: see the crate root, `lib.rs` (one `BEGIN IMMEDIATE` transaction
//! per batch). It must never write a batch whose commit outcome is unknown
//! without the checkpoint being read back first (the pipeline does that on
//! [`SinkError::CommitUnknown`]).

use super::config::SqliteConfig;
use crate::config::{SinkConfig, StoreConnection, Writes};
use crate::section::WriteMode;
use crate::sink::SinkError;
use crate::{
    MultiRowDelete, MultiRowInsert, Param, SqlBackend, SqlSink, SqlTx, Target, TypedColumn,
};
use sluice_core::backoff::{GiveUp, RetryPolicy};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions};
use sqlx::{Connection, Row, Sqlite, SqlitePool};
use std::time::Duration;

/// Most bound parameters per statement (SQLite's limit is 32766).
const MAX_PARAMS: usize = 30_000;

/// The SQLite sink.
pub type SqliteSink = SqlSink<SqliteBackend>;

/// Opens the sink `sink` configures: sluice's tables and its targets'.
pub async fn open(sink: &SinkConfig) -> Result<SqliteSink, SinkError> {
    open_with(&sink.store(), sink.writes()).await
}

/// Opens the database named by `store.url` and prepares sluice's tables
/// and those `writes` names ([`Writes::NOTHING`] as another sink's
/// `[state]`).
pub async fn open_with(
    store: &StoreConnection,
    writes: Writes<'_>,
) -> Result<SqliteSink, SinkError> {
    let options = SqliteConfig::from_url(&store.url, store.lock_timeout_ms)?.options;
    let pool = connect(options, store)
        .await
        .map_err(|e| SinkError::unavailable(format!("cannot open {}", store.url), e))?;
    SqlSink::open(SqliteBackend { pool }, store, writes).await
}

/// Connects the one writer (SQLite serializes writes anyway, and one
/// connection keeps `BEGIN IMMEDIATE` ... `COMMIT` on the same handle).
///
/// Two hosts opening one new file at once race to switch it to WAL, and
/// SQLite answers the loser "database is locked" at once, busy timeout or
/// not: that is retried, through the one backoff policy, for as long as
/// the lock timeout allows.
async fn connect(
    options: SqliteConnectOptions,
    store: &StoreConnection,
) -> sqlx::Result<SqlitePool> {
    let mut backoff = RetryPolicy {
        first: Duration::from_millis(10),
        max: Duration::from_millis(200),
        give_up: GiveUp::After(Duration::from_millis(store.lock_timeout_ms)),
    }
    .start();
    loop {
        let tried = crate::pool::pool_options::<sqlx::Sqlite>(1)
            .connect_with(options.clone())
            .await;
        match tried {
            Err(e) => match backoff.next_wait_if(is_locked(&e)) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => return Err(e),
            },
            pool => return pool,
        }
    }
}

fn is_locked(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.message().contains("database is locked"))
}

pub struct SqliteBackend {
    pub(super) pool: SqlitePool,
}

/// A target's statements.
pub struct Statements {
    insert: MultiRowInsert,
    /// Deletes by key, many keys a statement (`None`: no key).
    delete: Option<MultiRowDelete>,
}

/// A batch transaction on the one connection.
pub struct SqliteTx {
    conn: PoolConnection<Sqlite>,
}

fn db_err(e: sqlx::Error) -> SinkError {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            SinkError::unavailable("", e)
        }
        ref locked if is_locked(locked) => SinkError::unavailable("", e),
        other => SinkError::database("", other),
    }
}

crate::glue::statements_on!(sqlx::Sqlite, db_err);
crate::glue::cells_on!(sqlx::Sqlite);

impl SqlBackend for SqliteBackend {
    type Statements = Statements;
    type Tx = SqliteTx;

    fn dialect(&self) -> &'static crate::Dialect {
        &crate::SQLITE
    }

    async fn begin(&self) -> Result<SqliteTx, SinkError> {
        let mut conn = self.pool.acquire().await.map_err(db_err)?;
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .map_err(db_err)?;
        Ok(SqliteTx { conn })
    }

    async fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, SinkError> {
        execute_on(&self.pool, sql, params).await
    }

    async fn query_i64(&self, sql: &str, params: &[Param<'_>]) -> Result<Option<i64>, SinkError> {
        query_i64_on(&self.pool, sql, params).await
    }

    async fn table_columns(
        &self,
        _schema: Option<&str>,
        table: &str,
    ) -> Result<Vec<String>, SinkError> {
        let rows = sqlx::query("SELECT name FROM pragma_table_info(?)")
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(db_err)?;
        Ok(rows.iter().map(|r| r.get::<String, _>(0)).collect())
    }

    async fn statements(&self, target: &Target) -> Result<Statements, SinkError> {
        let keys = target.quoted_keys().join(", ");
        let non_keys = target.quoted_non_keys();
        let table = &target.table;
        let tail = match target.mode {
            WriteMode::Append | WriteMode::Delete => String::new(),
            _ if non_keys.is_empty() => format!(" ON CONFLICT ({keys}) DO NOTHING"),
            WriteMode::Upsert => {
                format!(
                    " ON CONFLICT ({keys}) DO UPDATE SET {}",
                    target.assignments(|c| format!("excluded.{c}"))
                )
            }
            WriteMode::Accumulate => format!(
                " ON CONFLICT ({keys}) DO UPDATE SET {}",
                target.assignments(|c| format!(
                    "coalesce({table}.{c}, 0) + coalesce(excluded.{c}, 0)"
                ))
            ),
        };
        Ok(Statements {
            insert: MultiRowInsert::for_target(target, tail, MAX_PARAMS),
            delete: MultiRowDelete::for_target(target),
        })
    }
}

impl SqlTx<Statements> for SqliteTx {
    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, SinkError> {
        execute_on(&mut *self.conn, sql, params).await
    }

    async fn query_i64(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<i64>, SinkError> {
        query_i64_on(&mut *self.conn, sql, params).await
    }

    async fn query_i64s(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<Vec<i64>>, SinkError> {
        query_i64s_on(&mut *self.conn, sql, params).await
    }

    async fn query_blobs(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Vec<Vec<u8>>>, SinkError> {
        query_blobs_on(&mut *self.conn, sql, params).await
    }

    async fn write_rows(
        &mut self,
        target: &Target,
        statements: &Statements,
        columns: &[TypedColumn<'_>],
        rows: usize,
    ) -> Result<(), SinkError> {
        if target.mode == WriteMode::Delete {
            let delete = statements.delete.as_ref().ok_or_else(|| {
                SinkError::Config(format!("{} deletes by key but has no key", target.table))
            })?;
            let keys: Vec<&TypedColumn> = target.keys.iter().map(|&k| &columns[k]).collect();
            for chunk in delete.chunks(&keys, rows, usize::MAX) {
                let mut args = SqliteArguments::default();
                for cell in chunk.cells(&keys) {
                    bind(&mut args, cell)?;
                }
                sqlx::query_with(&chunk.sql, args)
                    .execute(&mut *self.conn)
                    .await
                    .map_err(db_err)?;
            }
            return Ok(());
        }
        for chunk in statements.insert.chunks(columns, rows, usize::MAX) {
            let sql = statements.insert.sql(chunk.len());
            let mut args = SqliteArguments::default();
            for row in chunk {
                for column in columns {
                    bind(&mut args, column.cell(row))?;
                }
            }
            sqlx::query_with(&sql, args)
                .execute(&mut *self.conn)
                .await
                .map_err(db_err)?;
        }
        Ok(())
    }

    async fn commit(mut self) -> Result<(), SinkError> {
        match sqlx::raw_sql("COMMIT").execute(&mut *self.conn).await {
            Ok(_) => Ok(()),
            Err(e) => {
                // The connection may be unusable; drop it rather than reuse.
                let _ = self.conn.detach().close().await;
                Err(SinkError::commit_unknown("", e))
            }
        }
    }

    async fn rollback(mut self) {
        if sqlx::raw_sql("ROLLBACK")
            .execute(&mut *self.conn)
            .await
            .is_err()
        {
            let _ = self.conn.detach().close().await;
        }
    }
}
