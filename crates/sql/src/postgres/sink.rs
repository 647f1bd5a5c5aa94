//! The Postgres backend of the SQL sink: connections, error kinds, and the
//! bulk row paths: append streams the rows with `COPY ... FROM STDIN` into
//! the target inside the batch transaction (binary format when the table's
//! columns have exactly sluice's types, text otherwise); upsert, accumulate
//! and delete run one statement per target and batch, the columns bound as
//! arrays and expanded by `UNNEST` (prepared once, reused by every batch).
//! A statement of the batch transaction that times out on a lock first has
//! `stalled.rs` end the frozen sessions that may hold it.
//!
//! Delivery guarantee: see the module header in `mod.rs`. It must never
//! report a lost `COMMIT` reply as anything but
//! [`SinkError::CommitUnknown`], so the batch is resolved from the
//! checkpoint and not written twice.

use super::config::PostgresConfig;
use super::stalled;
use crate::config::{ColumnType, SinkConfig, StoreConnection, Writes};
use crate::section::WriteMode;
use crate::sink::{SinkError, redact_url};
use crate::{Cell, Dialect, POSTGRES, Param, SqlBackend, SqlSink, SqlTx, Target, TypedColumn};
use sqlx::postgres::{PgArguments, PgPool};
use sqlx::{Arguments, Postgres, Row, Transaction};
use std::time::Duration;

/// The Postgres sink.
pub type PostgresSink = SqlSink<PostgresBackend>;

/// Opens the sink `sink` configures: sluice's tables and its targets'.
pub async fn open(sink: &SinkConfig) -> Result<PostgresSink, SinkError> {
    open_with(&sink.store(), sink.writes()).await
}

/// Connects to the database named by `store.url` and prepares sluice's
/// tables and those `writes` names ([`Writes::NOTHING`] as another sink's
/// `[state]`).
pub async fn open_with(
    store: &StoreConnection,
    writes: Writes<'_>,
) -> Result<PostgresSink, SinkError> {
    let PostgresConfig { options, pool } =
        PostgresConfig::from_url(&store.url, store.lock_timeout_ms)?;
    let pool = pool
        .connect_with(options)
        .await
        .map_err(|e| SinkError::connecting(&redact_url(&store.url), e))?;
    let stalled_after = Duration::from_millis(store.lock_timeout_ms);
    let backend = PostgresBackend {
        pool,
        stalled_after,
    };
    SqlSink::open(backend, store, writes).await
}

pub struct PostgresBackend {
    pub(super) pool: PgPool,
    /// How long a session of sluice's may wait on its client inside a
    /// statement before a blocked instance ends it (`lock_timeout_ms`; see
    /// `stalled.rs`).
    stalled_after: Duration,
}

/// A target's statement (one per target: the mode decides its shape).
pub enum Statements {
    /// `COPY t (cols) FROM STDIN` (append), in the binary format when the
    /// table's column types are exactly the ones sluice writes (always for
    /// tables it created), else in the text format, which the server
    /// converts to the table's types.
    Copy { sql: String, binary: bool },
    /// An `UNNEST` statement binding the columns at `bound` as arrays.
    Unnest {
        sql: String,
        /// Which columns are bound, in placeholder order.
        bound: Vec<usize>,
    },
}

/// Bytes per CopyData message.
const COPY_CHUNK: usize = 1 << 20;

pub struct PostgresTx {
    tx: Transaction<'static, Postgres>,
    /// The backend's pool (another connection than `tx`'s), to end the
    /// stalled sessions that hold this transaction up.
    pool: PgPool,
    /// The backend's `stalled_after`.
    stalled_after: Duration,
}

/// Connection trouble, server shutdown, serialization failures and
/// deadlocks are worth retrying; everything else is not.
fn db_err(e: sqlx::Error) -> SinkError {
    match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => SinkError::unavailable("", e),
        sqlx::Error::Database(d) => {
            let code = d.code().unwrap_or_default();
            // 25P03: the server ended a session left idle inside a
            // transaction for `sink.lock_timeout_ms` (this process was
            // frozen); the transaction is gone, the batch is re-planned.
            let retriable = code.starts_with("08")
                || code.starts_with("57P")
                || matches!(&*code, "40001" | "40P01" | "53300" | "55P03" | "25P03");
            if retriable {
                SinkError::unavailable("", e)
            } else {
                SinkError::database("", e)
            }
        }
        _ => SinkError::database("", e),
    }
}

crate::glue::statements_on!(sqlx::Postgres, db_err);

fn array_type(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Integer => "bigint[]",
        ColumnType::Real => "double precision[]",
        ColumnType::Text => "text[]",
        ColumnType::Blob => "bytea[]",
        ColumnType::Boolean => "boolean[]",
    }
}

/// Binds a whole column as one array parameter.
fn bind_array(args: &mut PgArguments, column: &TypedColumn<'_>) -> Result<(), SinkError> {
    match column {
        TypedColumn::Integer(v) => args.add(v.as_slice()),
        TypedColumn::Real(v) => args.add(v.as_slice()),
        TypedColumn::Text(v) => args.add(v.as_slice()),
        TypedColumn::Blob(v) => args.add(v.as_slice()),
        TypedColumn::Boolean(v) => args.add(v.as_slice()),
    }
    .map_err(|e| SinkError::database("cannot bind column", e))
}

/// `UNNEST($1::bigint[], $2::text[])` over the columns at `bound`.
fn unnest(target: &Target, bound: &[usize]) -> String {
    let arrays: Vec<String> = bound
        .iter()
        .enumerate()
        .map(|(i, &c)| format!("${}::{}", i + 1, array_type(target.types[c])))
        .collect();
    format!("UNNEST({})", arrays.join(", "))
}

fn statement(target: &Target) -> Statements {
    let table = &target.table;
    let cols = target.quoted.join(", ");
    let keys = target.quoted_keys().join(", ");
    let non_keys = target.quoted_non_keys();
    let all: Vec<usize> = (0..target.columns.len()).collect();
    let conflict = |set: &dyn Fn(&str) -> String| {
        if non_keys.is_empty() {
            return format!(" ON CONFLICT ({keys}) DO NOTHING");
        }
        format!(
            " ON CONFLICT ({keys}) DO UPDATE SET {}",
            target.assignments(set)
        )
    };
    let sql = match target.mode {
        WriteMode::Append => {
            return Statements::Copy {
                sql: format!("COPY {table} ({cols}) FROM STDIN"),
                binary: false,
            };
        }
        // A key may come several times in one batch; ON CONFLICT may touch
        // a row only once per statement, so the batch is folded first: the
        // last row per key wins.
        WriteMode::Upsert => format!(
            "INSERT INTO {table} AS sluice_t ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {} \
             WITH ORDINALITY AS u({cols}, sluice_ord) ORDER BY {keys}, sluice_ord DESC{}",
            unnest(target, &all),
            conflict(&|c| format!("EXCLUDED.{c}"))
        ),
        // ... and for accumulate the rows per key are summed. Both take row
        // locks in key order, so two instances writing overlapping keys at
        // once wait for each other instead of deadlocking.
        WriteMode::Accumulate => {
            let select: Vec<String> = (0..target.columns.len())
                .map(|i| {
                    let c = &target.quoted[i];
                    if target.keys.contains(&i) {
                        c.clone()
                    } else {
                        format!("sum({c})")
                    }
                })
                .collect();
            format!(
                "INSERT INTO {table} AS sluice_t ({cols}) SELECT {} FROM {} AS u({cols}) \
                 GROUP BY {keys} ORDER BY {keys}{}",
                select.join(", "),
                unnest(target, &all),
                conflict(&|c| format!("coalesce(sluice_t.{c}, 0) + coalesce(EXCLUDED.{c}, 0)"))
            )
        }
        WriteMode::Delete => {
            return Statements::Unnest {
                sql: format!(
                    "DELETE FROM {table} WHERE ({keys}) IN (SELECT * FROM {})",
                    unnest(target, &target.keys)
                ),
                bound: target.keys.clone(),
            };
        }
    };
    Statements::Unnest { sql, bound: all }
}

/// The rows in COPY's text format: tab-separated, `\N` for null,
/// backslash escapes in text, `\x` hex for bytea.
fn copy_text(columns: &[TypedColumn<'_>], rows: usize) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::with_capacity(rows * columns.len() * 12);
    for row in 0..rows {
        for (i, column) in columns.iter().enumerate() {
            if i > 0 {
                out.push(b'\t');
            }
            match column.cell(row) {
                Cell::Integer(Some(x)) => {
                    let _ = write!(out, "{x}");
                }
                Cell::Real(Some(x)) if x.is_nan() => out.extend_from_slice(b"NaN"),
                Cell::Real(Some(x)) if x.is_infinite() => {
                    let text: &[u8] = if x > 0.0 { b"Infinity" } else { b"-Infinity" };
                    out.extend_from_slice(text)
                }
                Cell::Real(Some(x)) => {
                    let _ = write!(out, "{x:?}");
                }
                Cell::Text(Some(s)) => escape_text(&mut out, s.as_bytes()),
                Cell::Blob(Some(b)) => {
                    out.extend_from_slice(b"\\\\x");
                    out.extend(
                        b.iter().flat_map(|&byte| {
                            [HEX[(byte >> 4) as usize], HEX[(byte & 15) as usize]]
                        }),
                    );
                }
                Cell::Boolean(Some(b)) => out.push(if b { b't' } else { b'f' }),
                _ => out.extend_from_slice(b"\\N"),
            }
        }
        out.push(b'\n');
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether a column of catalog type `data_type` takes sluice's binary
/// encoding of `ty` as is.
fn binary_compatible(ty: ColumnType, data_type: &str) -> bool {
    matches!(
        (ty, data_type),
        (ColumnType::Integer, "bigint")
            | (ColumnType::Real, "double precision")
            | (ColumnType::Text, "text" | "character varying")
            | (ColumnType::Blob, "bytea")
            | (ColumnType::Boolean, "boolean")
    )
}

/// The rows in COPY's binary format: a header, per row the field count and
/// per field its length (-1 = null) and big-endian value, a trailer.
fn copy_binary(columns: &[TypedColumn<'_>], rows: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(19 + rows * (2 + columns.len() * 16));
    out.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
    out.extend_from_slice(&0i32.to_be_bytes()); // flags
    out.extend_from_slice(&0i32.to_be_bytes()); // header extension length
    let field = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
        out.extend_from_slice(bytes);
    };
    for row in 0..rows {
        out.extend_from_slice(&(columns.len() as i16).to_be_bytes());
        for column in columns {
            match column.cell(row) {
                Cell::Integer(Some(x)) => field(&mut out, &x.to_be_bytes()),
                Cell::Real(Some(x)) => field(&mut out, &x.to_bits().to_be_bytes()),
                Cell::Text(Some(s)) => field(&mut out, s.as_bytes()),
                Cell::Blob(Some(b)) => field(&mut out, b),
                Cell::Boolean(Some(b)) => field(&mut out, &[b as u8]),
                _ => out.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
    }
    out.extend_from_slice(&(-1i16).to_be_bytes());
    out
}

fn escape_text(out: &mut Vec<u8>, text: &[u8]) {
    if !text
        .iter()
        .any(|b| matches!(b, b'\\' | b'\t' | b'\n' | b'\r'))
    {
        out.extend_from_slice(text);
        return;
    }
    for &byte in text {
        match byte {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            other => out.push(other),
        }
    }
}

impl PostgresBackend {
    /// (column name, `information_schema` data type) of a table; empty if
    /// it does not exist.
    async fn catalog(
        &self,
        schema: Option<&str>,
        table: &str,
    ) -> Result<Vec<(String, String)>, SinkError> {
        let rows = sqlx::query(
            "SELECT column_name::text, data_type::text FROM information_schema.columns \
             WHERE table_schema = coalesce($1, current_schema()) AND table_name = $2",
        )
        .bind(schema)
        .bind(table)
        .fetch_all(&self.pool)
        .await
        .map_err(db_err)?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<String, _>(0), r.get::<String, _>(1)))
            .collect())
    }
}

impl SqlBackend for PostgresBackend {
    type Statements = Statements;
    type Tx = PostgresTx;

    fn dialect(&self) -> &'static Dialect {
        &POSTGRES
    }

    async fn begin(&self) -> Result<PostgresTx, SinkError> {
        Ok(PostgresTx {
            tx: self.pool.begin().await.map_err(db_err)?,
            pool: self.pool.clone(),
            stalled_after: self.stalled_after,
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
        let catalog = self.catalog(schema, table).await?;
        Ok(catalog.into_iter().map(|(name, _)| name).collect())
    }

    async fn statements(&self, target: &Target) -> Result<Statements, SinkError> {
        let statements = statement(target);
        if let Statements::Copy { sql, .. } = statements {
            let catalog = self
                .catalog(target.schema.as_deref(), &target.table_name)
                .await?;
            let binary = target.columns.iter().zip(&target.types).all(|(c, &ty)| {
                catalog
                    .iter()
                    .any(|(name, data_type)| name == c && binary_compatible(ty, data_type))
            });
            return Ok(Statements::Copy { sql, binary });
        }
        Ok(statements)
    }
}

impl SqlTx<Statements> for PostgresTx {
    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, SinkError> {
        match execute_on(&mut *self.tx, sql, params).await {
            Err(e) => Err(self.failed(e).await),
            done => done,
        }
    }

    async fn query_i64(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<i64>, SinkError> {
        match query_i64_on(&mut *self.tx, sql, params).await {
            Err(e) => Err(self.failed(e).await),
            found => found,
        }
    }

    async fn query_i64s(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<Vec<i64>>, SinkError> {
        match query_i64s_on(&mut *self.tx, sql, params).await {
            Err(e) => Err(self.failed(e).await),
            found => found,
        }
    }

    async fn query_blobs(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Vec<Vec<u8>>>, SinkError> {
        match query_blobs_on(&mut *self.tx, sql, params).await {
            Err(e) => Err(self.failed(e).await),
            found => found,
        }
    }

    async fn write_rows(
        &mut self,
        _target: &Target,
        statements: &Statements,
        columns: &[TypedColumn<'_>],
        rows: usize,
    ) -> Result<(), SinkError> {
        match self.write(statements, columns, rows).await {
            Err(e) => Err(self.failed(e).await),
            done => done,
        }
    }

    async fn commit(self) -> Result<(), SinkError> {
        crate::commit_sqlx(self.tx, db_err).await
    }

    async fn rollback(self) {
        // A broken connection is closed by the pool; the server rolls back.
        let _ = self.tx.rollback().await;
    }
}

impl PostgresTx {
    /// Passes a failed statement's error on; first, if it waited
    /// `lock_timeout` for a lock, ends the stalled sluice sessions that may
    /// hold it (a frozen instance inside a COPY), so the retry gets it.
    async fn failed(&self, e: SinkError) -> SinkError {
        if stalled::timed_out_on_a_lock(&e) {
            stalled::end_stalled_sessions(&self.pool, self.stalled_after).await;
        }
        e
    }

    /// A target's rows: streamed by COPY (append) or bound as arrays.
    async fn write(
        &mut self,
        statements: &Statements,
        columns: &[TypedColumn<'_>],
        rows: usize,
    ) -> Result<(), SinkError> {
        if rows == 0 {
            return Ok(());
        }
        match statements {
            Statements::Copy { sql, binary } => {
                let (sql, data) = match binary {
                    true => (format!("{sql} (FORMAT binary)"), copy_binary(columns, rows)),
                    false => (sql.clone(), copy_text(columns, rows)),
                };
                let mut copy = self.tx.copy_in_raw(&sql).await.map_err(db_err)?;
                for chunk in data.chunks(COPY_CHUNK) {
                    if let Err(e) = copy.send(chunk).await {
                        let _ = copy.abort("sluice: send failed").await;
                        return Err(db_err(e));
                    }
                }
                copy.finish().await.map_err(db_err)?;
            }
            Statements::Unnest { sql, bound } => {
                let mut args = PgArguments::default();
                for &c in bound {
                    bind_array(&mut args, &columns[c])?;
                }
                sqlx::query_with(sql, args)
                    .execute(&mut *self.tx)
                    .await
                    .map_err(db_err)?;
            }
        }
        Ok(())
    }
}
