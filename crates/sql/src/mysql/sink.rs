//! The MySQL/MariaDB backend of the SQL sink: connections, error kinds, and
//! the bulk row path: multi-row prepared INSERTs sized to the server's
//! `max_allowed_packet` and the 65,535-placeholder limit, in power-of-two
//! row counts so the prepared statements are reused across batches, and
//! DELETEs by key, up to 512 keys a statement (`multidelete.rs`).
//!
//! Delivery guarantee: see the module header in `mod.rs`. It must never
//! report a lost `COMMIT` reply as anything but
//! [`SinkError::CommitUnknown`].

use super::config::MysqlConfig;
use crate::config::{SinkConfig, StoreConnection, Writes};
use crate::section::WriteMode;
use crate::sink::{SinkError, redact_url};
use crate::{
    Dialect, MYSQL, MultiRowDelete, MultiRowInsert, Param, SqlBackend, SqlSink, SqlTx, Target,
    TypedColumn,
};
use sqlx::mysql::{MySqlArguments, MySqlDatabaseError, MySqlPool};
use sqlx::{MySql, Row, Transaction};

/// The protocol's limit on placeholders per prepared statement.
const MAX_PARAMS: usize = 65_535;

/// The MySQL sink.
pub type MysqlSink = SqlSink<MysqlBackend>;

/// Opens the sink `sink` configures: sluice's tables and its targets'.
pub async fn open(sink: &SinkConfig) -> Result<MysqlSink, SinkError> {
    open_with(&sink.store(), sink.writes()).await
}

/// Connects to the database named by `store.url` and prepares sluice's
/// tables and those `writes` names ([`Writes::NOTHING`] as another sink's
/// `[state]`).
pub async fn open_with(
    store: &StoreConnection,
    writes: Writes<'_>,
) -> Result<MysqlSink, SinkError> {
    let MysqlConfig { options, pool } = MysqlConfig::from_url(&store.url, store.lock_timeout_ms)?;
    let pool = pool
        .connect_with(options)
        .await
        .map_err(|e| SinkError::connecting(&redact_url(&store.url), e))?;
    let packet: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)")
        .fetch_one(&pool)
        .await
        .map_err(db_err)?;
    // Leave room for the statement text and the protocol's own framing.
    let max_statement_bytes = (packet as usize).saturating_sub(64 * 1024).max(64 * 1024) * 9 / 10;
    SqlSink::open(
        MysqlBackend {
            pool,
            max_statement_bytes,
        },
        store,
        writes,
    )
    .await
}

pub struct MysqlBackend {
    pub(super) pool: MySqlPool,
    /// Budget for one statement's parameters, from `max_allowed_packet`.
    max_statement_bytes: usize,
}

/// A target's statements.
pub struct Statements {
    insert: MultiRowInsert,
    /// Deletes by key, many keys a statement (`None`: no key).
    delete: Option<MultiRowDelete>,
    max_statement_bytes: usize,
}

pub struct MysqlTx {
    tx: Transaction<'static, MySql>,
}

/// Server error numbers worth retrying: lock wait timeout, deadlock, too
/// many connections, server shutdown, server gone, lost connection,
/// connection killed, query interrupted, idle timeout.
const RETRIABLE: &[u16] = &[1205, 1213, 1040, 1053, 2006, 2013, 1927, 1317, 4031];

fn db_err(e: sqlx::Error) -> SinkError {
    match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => SinkError::unavailable("", e),
        sqlx::Error::Database(d) => {
            let number = d
                .try_downcast_ref::<MySqlDatabaseError>()
                .map(|m| m.number());
            if number.is_some_and(|n| RETRIABLE.contains(&n)) {
                SinkError::unavailable("", e)
            } else {
                SinkError::database("", e)
            }
        }
        _ => SinkError::database("", e),
    }
}

crate::glue::statements_on!(sqlx::MySql, db_err);
crate::glue::cells_on!(sqlx::MySql);

impl SqlBackend for MysqlBackend {
    type Statements = Statements;
    type Tx = MysqlTx;

    fn dialect(&self) -> &'static Dialect {
        &MYSQL
    }

    async fn begin(&self) -> Result<MysqlTx, SinkError> {
        Ok(MysqlTx {
            tx: self.pool.begin().await.map_err(db_err)?,
        })
    }

    async fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, SinkError> {
        execute_on(&self.pool, sql, params).await
    }

    async fn query_i64(&self, sql: &str, params: &[Param<'_>]) -> Result<Option<i64>, SinkError> {
        query_i64_on(&self.pool, sql, params).await
    }

    async fn table_columns(
        &self,
        schema: Option<&str>,
        table: &str,
    ) -> Result<Vec<String>, SinkError> {
        let in_schema = if schema.is_some() { "?" } else { "DATABASE()" };
        let sql = format!(
            "SELECT CAST(column_name AS CHAR) FROM information_schema.columns \
             WHERE table_schema = {in_schema} AND table_name = ?"
        );
        let mut query = sqlx::query(&sql);
        if let Some(s) = schema {
            query = query.bind(s);
        }
        let rows = query
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(db_err)?;
        Ok(rows.iter().map(|r| r.get::<String, _>(0)).collect())
    }

    async fn statements(&self, target: &Target) -> Result<Statements, SinkError> {
        let keys = target.quoted_keys();
        let non_keys = target.quoted_non_keys();
        let tail = match target.mode {
            WriteMode::Append | WriteMode::Delete => String::new(),
            // Nothing to update: keep the row (a no-op assignment, not
            // INSERT IGNORE, which would also swallow real errors).
            _ if non_keys.is_empty() => format!(" ON DUPLICATE KEY UPDATE {0} = {0}", keys[0]),
            WriteMode::Upsert => format!(
                " ON DUPLICATE KEY UPDATE {}",
                target.assignments(|c| format!("VALUES({c})"))
            ),
            WriteMode::Accumulate => format!(
                " ON DUPLICATE KEY UPDATE {}",
                target.assignments(|c| format!("COALESCE({c}, 0) + COALESCE(VALUES({c}), 0)"))
            ),
        };
        Ok(Statements {
            insert: MultiRowInsert::for_target(target, tail, MAX_PARAMS),
            delete: MultiRowDelete::for_target(target),
            max_statement_bytes: self.max_statement_bytes,
        })
    }
}

impl SqlTx<Statements> for MysqlTx {
    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, SinkError> {
        execute_on(&mut *self.tx, sql, params).await
    }

    async fn query_i64(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<i64>, SinkError> {
        query_i64_on(&mut *self.tx, sql, params).await
    }

    async fn query_i64s(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<Vec<i64>>, SinkError> {
        query_i64s_on(&mut *self.tx, sql, params).await
    }

    async fn query_blobs(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Vec<Vec<u8>>>, SinkError> {
        query_blobs_on(&mut *self.tx, sql, params).await
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
            for chunk in delete.chunks(&keys, rows, statements.max_statement_bytes) {
                let mut args = MySqlArguments::default();
                for cell in chunk.cells(&keys) {
                    bind(&mut args, cell)?;
                }
                sqlx::query_with(&chunk.sql, args)
                    .execute(&mut *self.tx)
                    .await
                    .map_err(db_err)?;
            }
            return Ok(());
        }
        let insert = &statements.insert;
        for chunk in insert.chunks(columns, rows, statements.max_statement_bytes) {
            let sql = insert.sql(chunk.len());
            let mut args = MySqlArguments::default();
            for row in chunk {
                for column in columns {
                    bind(&mut args, column.cell(row))?;
                }
            }
            sqlx::query_with(&sql, args)
                .execute(&mut *self.tx)
                .await
                .map_err(db_err)?;
        }
        Ok(())
    }

    async fn commit(self) -> Result<(), SinkError> {
        crate::commit_sqlx(self.tx, db_err).await
    }

    async fn rollback(self) {
        // A broken connection is closed by the pool; the server rolls back.
        let _ = self.tx.rollback().await;
    }
}
