//! Keyed state in a SQL sink: the `keyed_state` table (one row per scope
//! and key: the value and when it expires), `state_scopes` (the number each
//! pipeline's input partition keeps its state under) and `batch_state`
//! (per batch, the state its runs read as it started, for replay), their
//! DDL and writes into the batch transaction (each partition's changes
//! through the state journal, `journal.rs`, which says when they reach
//! the table), and [`SqlStateStore`], which reads the state back for the
//! pipeline's cache on a connection of its own: the table with the
//! partition's journal rows laid over it, both in one snapshot.
//!
//! A state row is keyed by (scope, key), not by (pipeline, topic,
//! partition, key): two narrow columns make the primary-key index about
//! half as wide, and a batch's state writes (one index entry per key) about
//! twice as fast on Postgres.
//!
//! # Delivery guarantee
//!
//! A batch's state changes and its recorded reads are written inside the
//! batch transaction, after the offset compare-and-set (also under
//! `guarantee = "at-least-once"`, where they go with the offsets, not the
//! rows): they land exactly when the checkpoint moves, so the stored state
//! is always the state after the checkpoint's batch, and a fenced zombie's
//! changes roll back with its offsets. That depends on the same three
//! conditions as the rows (see the crate's header). Scope numbers are the
//! exception: each is committed on its own before the first batch that
//! needs it (a number without state is harmless) and never changes or
//! goes, so a number read once may be kept.
//!
//! It must not commit a batch: it only writes into the transaction it is
//! handed. Reads never write: an expired key is left where it is (it reads
//! as absent by batch time) until a batch writes or deletes it (the host
//! has batches delete the expired keys it finds, as any other change).

use super::dialect::Dialect;
use super::journal::{self, Journal, JournalRow, Route};
use super::{Param, SqlBackend, SqlTx, Target, TypedColumn};
use crate::batch::TopicPartition;
use crate::config::{ColumnType, StoreConnection, TargetConfig};
use crate::section::{SqlTargetFields, WriteMode};
use crate::sink::{Commit, SinkError};
use sluice_core::state::{Keys, ScanPage, StateError, StateMap, StateSize, StateStore, StateValue};
use sqlx::{AnyPool, Row};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

/// The state table's name after the table prefix.
pub(crate) const STATE_TABLE: &str = "keyed_state";
/// The scope numbers' table's name after the table prefix.
pub(crate) const SCOPES_TABLE: &str = "state_scopes";
/// The table of the layout before scopes (pipeline, topic, partition and
/// key in every row's key), refused when it still holds state.
const OLD_STATE_TABLE: &str = "state";

/// The state table's columns, as the internal targets declare them.
const COLUMNS: [(&str, ColumnType); 4] = [
    ("expires_at_ms", ColumnType::Integer),
    ("scope", ColumnType::Integer),
    ("state_key", ColumnType::Blob),
    ("value", ColumnType::Blob),
];
const KEY: [&str; 2] = ["scope", "state_key"];

/// The state tables of one sink, quoted once, with the write statements of
/// its backend.
pub(super) struct StateTables<S> {
    /// Sets: mode upsert, or (see [`SetsBy`]) append after a delete.
    sets: (Target, S),
    sets_by: SetsBy,
    /// Deletes (mode delete) of the state table.
    delete: (Target, S),
    insert_reads: String,
    scopes: Scopes,
    /// The journal the changes go through on their way to the table.
    journal: Journal,
}

/// How a dialect writes a batch's sets fastest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SetsBy {
    /// One upsert of the set keys (SQLite, MySQL: a multi-row insert with
    /// its conflict clause).
    Upsert,
    /// Every changed key deleted, then the sets inserted (Postgres: an
    /// `ON CONFLICT DO UPDATE` costs ~10 µs a row in its speculative
    /// insertion; a delete by key and a COPY cost ~4 µs together).
    DeleteThenInsert,
}

/// The scope number of each partition a batch changes state in.
pub(super) type ScopeNumbers = HashMap<TopicPartition, i64>;

/// Numbers a pipeline's input partitions in `state_scopes`, and keeps the
/// numbers it has seen.
struct Scopes {
    select: String,
    insert: String,
    known: Mutex<HashMap<(String, TopicPartition), i64>>,
}

impl Scopes {
    fn new(d: &Dialect, table: &str) -> Scopes {
        let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
        let (pipeline, topic, partition) = (c("pipeline"), c("topic"), c("partition"));
        let insert = format!(
            "INSERT INTO {table} ({pipeline}, {topic}, {partition}) VALUES ({})",
            d.params(1, 3)
        );
        Scopes {
            select: format!(
                "SELECT {} FROM {table} WHERE {}",
                c("scope"),
                d.partition_is(1)
            ),
            insert: d.ignoring_conflicts(insert),
            known: Mutex::default(),
        }
    }

    /// The number of every partition `state` changes, numbering those that
    /// have none yet (each in a statement of its own, committed at once).
    async fn of<B: SqlBackend>(
        &self,
        backend: &B,
        pipeline: &str,
        state: &StateMap,
    ) -> Result<ScopeNumbers, SinkError> {
        let mut numbers = ScopeNumbers::new();
        for (tp, keys) in &state.0 {
            if keys.is_empty() {
                continue;
            }
            let known = (pipeline.to_string(), tp.clone());
            let cached = self
                .known
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&known)
                .copied();
            let number = match cached {
                Some(number) => number,
                None => {
                    let number = self.number(backend, pipeline, tp).await?;
                    self.known
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(known, number);
                    number
                }
            };
            numbers.insert(tp.clone(), number);
        }
        Ok(numbers)
    }

    async fn number<B: SqlBackend>(
        &self,
        backend: &B,
        pipeline: &str,
        tp: &TopicPartition,
    ) -> Result<i64, SinkError> {
        let params = [
            Param::Text(pipeline),
            Param::Text(&tp.topic),
            Param::Int(tp.partition as i64),
        ];
        if let Some(number) = backend.query_i64(&self.select, &params).await? {
            return Ok(number);
        }
        backend.execute(&self.insert, &params).await?;
        backend
            .query_i64(&self.select, &params)
            .await?
            .ok_or_else(|| {
                SinkError::database(
                    "numbering a partition's keyed state",
                    format!("no row in state_scopes for {tp} after inserting it"),
                )
            })
    }
}

/// `scope = (the scope of $1, $2, $3)`: the rows of one pipeline's input
/// partition in the state table (none if it was never numbered).
pub(crate) fn scope_is(d: &Dialect, scopes: &str) -> String {
    let scope = d
        .ident("scope")
        .expect("sluice's own column names are valid");
    format!(
        "{scope} = (SELECT {scope} FROM {scopes} WHERE {})",
        d.partition_is(1)
    )
}

fn internal_target(
    d: &Dialect,
    schema: Option<&str>,
    table: &str,
    mode: WriteMode,
) -> Result<Target, SinkError> {
    let config = TargetConfig {
        name: format!("sluice {table}"),
        columns: COLUMNS.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
        settings: Default::default(),
    };
    let fields = SqlTargetFields {
        table: Some(table.to_string()),
        mode,
        key: KEY.iter().map(|k| k.to_string()).collect(),
        create: true,
    };
    Target::new(&config, fields, d, schema)
}

impl<S> StateTables<S> {
    /// Creates the tables if missing and prepares the statements; refuses
    /// a database whose state is still in the layout before scopes.
    pub(super) async fn open<B: SqlBackend<Statements = S>>(
        backend: &B,
        schema: Option<&str>,
        prefix: &str,
        journal_batches: u64,
    ) -> Result<Self, SinkError> {
        let d = backend.dialect();
        let table = format!("{prefix}{STATE_TABLE}");
        let sets_by = match std::ptr::eq(d, &super::POSTGRES) {
            true => SetsBy::DeleteThenInsert,
            false => SetsBy::Upsert,
        };
        let sets_mode = match sets_by {
            SetsBy::Upsert => WriteMode::Upsert,
            SetsBy::DeleteThenInsert => WriteMode::Append,
        };
        let sets = internal_target(d, schema, &table, sets_mode)?;
        let delete = internal_target(d, schema, &table, WriteMode::Delete)?;
        let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
        let t = &d.types;
        let scopes = d.qualified(schema, &format!("{prefix}{SCOPES_TABLE}"))?;
        super::create(
            backend,
            &format!(
                "CREATE TABLE IF NOT EXISTS {scopes} ({} {}, {} {} NOT NULL, {} {} NOT NULL, \
                 {} {} NOT NULL, UNIQUE ({}, {}, {}))",
                c("scope"),
                t.serial_key,
                c("pipeline"),
                t.key_text,
                c("topic"),
                t.key_text,
                c("partition"),
                t.bigint,
                c("pipeline"),
                c("topic"),
                c("partition"),
            ),
        )
        .await?;
        super::create(
            backend,
            &format!("{}{}", sets.create_ddl(d), d.keyed_table_options),
        )
        .await?;
        let reads = d.qualified(schema, &format!("{prefix}batch_state"))?;
        super::create(
            backend,
            &format!(
                "CREATE TABLE IF NOT EXISTS {reads} ({} {} NOT NULL, {} {} NOT NULL, {} {} NOT NULL, \
                 PRIMARY KEY ({}, {}))",
                c("pipeline"),
                t.key_text,
                c("batch_id"),
                t.key_text,
                c("reads"),
                t.blob,
                c("pipeline"),
                c("batch_id"),
            ),
        )
        .await?;
        let journal = Journal::open(backend, schema, prefix, journal_batches).await?;
        // After the creates: the refusal leaves the new tables for the move.
        refuse_old_layout(backend, schema, prefix).await?;
        let (sets_statements, delete_statements) = (
            backend.statements(&sets).await?,
            backend.statements(&delete).await?,
        );
        Ok(StateTables {
            sets: (sets, sets_statements),
            sets_by,
            delete: (delete, delete_statements),
            insert_reads: format!(
                "INSERT INTO {reads} ({}, {}, {}) VALUES ({})",
                c("pipeline"),
                c("batch_id"),
                c("reads"),
                d.params(1, 3)
            ),
            scopes: Scopes::new(d, &scopes),
            journal,
        })
    }

    /// The scope numbers batch `c`'s state changes are written under
    /// (asked before its transaction: see the module's header).
    pub(super) async fn scopes<B: SqlBackend<Statements = S>>(
        &self,
        backend: &B,
        c: &Commit<'_>,
    ) -> Result<ScopeNumbers, SinkError> {
        self.scopes
            .of(backend, &c.plan.pipeline, &c.output.state)
            .await
    }

    /// Writes the batch's state changes (under `scopes`, from
    /// [`StateTables::scopes`]), each partition's into the journal or the
    /// table (see `journal.rs`), and the reads a replay needs.
    pub(super) async fn write(
        &self,
        tx: &mut impl SqlTx<S>,
        c: &Commit<'_>,
        scopes: &ScopeNumbers,
    ) -> Result<(), SinkError> {
        let pipeline = c.plan.pipeline.as_str();
        let mut to_table = Vec::new();
        for (tp, keys) in &c.output.state.0 {
            if keys.is_empty() {
                continue;
            }
            let reads = c.state_reads.0.get(tp);
            let scope = scope_of(scopes, tp)?;
            let row = JournalRow::of(keys, reads);
            let seq = c.plan.ranges.iter().find(|r| r.topic_partition() == *tp);
            let route = match seq {
                Some(_) => self.journal.route(tx, scope, row.changes.len()).await?,
                // No range of the partition in the batch (never so): no
                // sequence number to journal it under.
                None => Route::Merge,
            };
            match (route, seq) {
                (Route::Append, Some(range)) => {
                    self.journal.append(tx, scope, range.until, &row).await?;
                }
                (Route::Table, _) => to_table.push(TableWrite {
                    tp,
                    keys: Cow::Borrowed(keys),
                    absent: reads.map(Cow::Borrowed),
                }),
                (Route::Merge | Route::Append, _) => {
                    let mut merged = self.journal.take(tx, scope).await?;
                    merged.add_batch(keys, reads);
                    self.journal.merged(scope, &merged);
                    let merged = merged.into_keys();
                    to_table.push(TableWrite {
                        tp,
                        keys: Cow::Owned(merged.changes),
                        absent: Some(Cow::Owned(merged.absent_in_table)),
                    });
                }
            }
        }
        let (sets, deletes) = Changes::split(&to_table, self.sets_by);
        // Deletes first: with `SetsBy::DeleteThenInsert` they make room.
        for (changes, (target, statements)) in [(deletes, &self.delete), (sets, &self.sets)] {
            let rows = changes.rows;
            if rows > 0 {
                let columns = changes.columns(scopes)?;
                tx.write_rows(target, statements, &columns, rows).await?;
            }
        }
        if !c.state_reads.is_empty() {
            let reads = c.state_reads.encode();
            tx.execute(
                &self.insert_reads,
                &[
                    Param::Text(pipeline),
                    Param::Text(&c.plan.batch_id),
                    Param::Bytes(Some(&reads)),
                ],
            )
            .await?;
        }
        Ok(())
    }
}

/// `tp`'s scope number, which [`StateTables::scopes`] found.
fn scope_of(scopes: &ScopeNumbers, tp: &TopicPartition) -> Result<i64, SinkError> {
    scopes.get(tp).copied().ok_or_else(|| {
        SinkError::Config(format!("no state scope number for {tp} (a sluice defect)"))
    })
}

/// One partition's changes on their way into the state table, with the
/// keys known to have no row there (`None` each): what the batch read as
/// absent, or what a journal merge found so.
struct TableWrite<'a> {
    tp: &'a TopicPartition,
    keys: Cow<'a, Keys>,
    absent: Option<Cow<'a, Keys>>,
}

/// Refuses to start on state kept in the layout before scopes (table
/// `state`, keyed by pipeline, topic, partition and key) while it holds
/// rows: the new tables would start empty and the state would be lost.
/// docs/state.md gives the statements that move it into the new tables.
async fn refuse_old_layout<B: SqlBackend>(
    backend: &B,
    schema: Option<&str>,
    prefix: &str,
) -> Result<(), SinkError> {
    let old = format!("{prefix}{OLD_STATE_TABLE}");
    let columns = backend.table_columns(schema, &old).await?;
    if !columns.iter().any(|c| c == "state_key") || columns.iter().any(|c| c == "scope") {
        return Ok(());
    }
    let quoted = backend.dialect().qualified(schema, &old)?;
    let held = backend
        .query_i64(&format!("SELECT 1 FROM {quoted} LIMIT 1"), &[])
        .await?;
    match held {
        None => Ok(()),
        Some(_) => Err(SinkError::Config(format!(
            "table {quoted} holds keyed state in the layout of an earlier sluice; this one keeps \
             it in {prefix}{STATE_TABLE} and {prefix}{SCOPES_TABLE}: stop every instance and move \
             it with the statements in docs/state.md (\"Upgrading from the first state layout\"), \
             or drop {quoted} if that state may be lost"
        ))),
    }
}

/// One kind of change (sets or deletes), row by row.
#[derive(Default)]
struct Changes<'a> {
    rows: usize,
    partitions: Vec<&'a TopicPartition>,
    keys: Vec<Option<&'a [u8]>>,
    values: Vec<Option<&'a [u8]>>,
    expires: Vec<Option<i64>>,
}

impl<'a> Changes<'a> {
    /// The sets and the deletes (with [`SetsBy::DeleteThenInsert`], every
    /// changed key is deleted first), leaving out the deletes of keys
    /// known to have no row: a key the batch read as absent (`reads` is
    /// the stored state at the batch's start, expired rows included: they
    /// read as a value; the offset compare-and-set before these writes
    /// proves the table still holds exactly that), or one the journal
    /// found so (a dedupe's writes, all first sightings, delete nothing).
    fn split(writes: &'a [TableWrite<'a>], sets_by: SetsBy) -> (Changes<'a>, Changes<'a>) {
        let (mut sets, mut deletes) = (Changes::default(), Changes::default());
        for write in writes {
            let absent = write.absent.as_deref();
            for (key, value) in write.keys.iter() {
                let absent_at_start = matches!(absent.and_then(|r| r.get(key)), Some(None));
                let to_delete = value.is_none() || sets_by == SetsBy::DeleteThenInsert;
                if to_delete && !absent_at_start {
                    deletes.push(write.tp, key, None);
                }
                if let Some(v) = value {
                    sets.push(write.tp, key, Some(v));
                }
            }
        }
        (sets, deletes)
    }

    fn push(&mut self, tp: &'a TopicPartition, key: &'a [u8], value: Option<&'a StateValue>) {
        self.rows += 1;
        self.partitions.push(tp);
        self.keys.push(Some(key));
        self.values.push(value.map(|v| v.value.as_slice()));
        self.expires.push(value.and_then(|v| v.expires_at_ms));
    }

    /// The columns in the targets' order (by name).
    fn columns(self, scopes: &ScopeNumbers) -> Result<Vec<TypedColumn<'a>>, SinkError> {
        let mut numbers = Vec::with_capacity(self.rows);
        let mut last: Option<(&TopicPartition, i64)> = None;
        for tp in self.partitions {
            let number = match last {
                Some((seen, number)) if seen == tp => number,
                _ => scope_of(scopes, tp)?,
            };
            last = Some((tp, number));
            numbers.push(Some(number));
        }
        Ok(vec![
            TypedColumn::Integer(self.expires),
            TypedColumn::Integer(numbers),
            TypedColumn::Blob(self.keys),
            TypedColumn::Blob(self.values),
        ])
    }
}

/// Reads a SQL sink's keyed state (and the reads recorded for replay) on a
/// pool of its own: the state table with the partition's journal laid
/// over it, both read in one snapshot.
pub struct SqlStateStore {
    pool: AnyPool,
    d: &'static Dialect,
    load: String,
    get: String,
    /// `get` of many keys: this, then `IN (` and one placeholder a key
    /// from the fourth.
    get_in: String,
    /// A page from a key on (`>=` the prefix), in key order.
    scan_from: String,
    /// The same, past a key (`>` the page before's last).
    scan_after: String,
    /// A partition's keys and their keys' and values' bytes.
    size: String,
    /// A partition's journal rows' changes, in order.
    journal: String,
    /// The statement that begins a read of one snapshot (`None`: the
    /// dialect's plain `BEGIN` does).
    begin_snapshot: Option<&'static str>,
    reads: String,
}

/// One read's transaction: every statement in it sees the same commits.
type Snapshot = sqlx::Transaction<'static, sqlx::Any>;

impl SqlStateStore {
    /// Opens a pool of its own on `store`'s database.
    pub async fn open(store: &StoreConnection) -> Result<SqlStateStore, SinkError> {
        let (pool, d) = super::connect_any(store).await?;
        Self::on(pool, d, store)
    }

    /// Reads `store`'s state through `pool`.
    pub(crate) fn on(
        pool: AnyPool,
        d: &'static Dialect,
        store: &StoreConnection,
    ) -> Result<SqlStateStore, SinkError> {
        let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
        let state = super::own_table(d, store, STATE_TABLE)?;
        let partition_is = scope_is(d, &super::own_table(d, store, SCOPES_TABLE)?);
        // Keys come back as hex text: MySQL reports a VARBINARY column to
        // the `Any` driver as text, which would not hold bytes that are
        // not UTF-8.
        let key_hex = match std::ptr::eq(d, &super::POSTGRES) {
            true => format!("encode({}, 'hex')", c("state_key")),
            false => format!("hex({})", c("state_key")),
        };
        let listed = format!("{key_hex}, {}, {}", c("value"), c("expires_at_ms"));
        let page = |bound: &str| {
            format!(
                "SELECT {listed} FROM {state} WHERE {partition_is} AND {key} {bound} {} \
                 ORDER BY {key} LIMIT {}",
                d.param(4),
                d.param(5),
                key = c("state_key"),
            )
        };
        // Sums as 64-bit integers on every database (MariaDB's are decimal).
        let integer = d.types.cast_bigint;
        let size = format!(
            "SELECT CAST(COUNT(*) AS {integer}), \
             CAST(COALESCE(SUM(LENGTH({}) + LENGTH({})), 0) AS {integer}) \
             FROM {state} WHERE {partition_is}",
            c("state_key"),
            c("value"),
        );
        // MySQL's snapshot is REPEATABLE READ's, which `connect_any` sets
        // on every connection; SQLite's `BEGIN` reads one snapshot.
        let begin_snapshot = match d {
            d if std::ptr::eq(d, &super::POSTGRES) => {
                Some("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            }
            d if std::ptr::eq(d, &super::MYSQL) => {
                Some("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            }
            _ => None,
        };
        Ok(SqlStateStore {
            size,
            scan_from: page(">="),
            scan_after: page(">"),
            load: format!("SELECT {listed} FROM {state} WHERE {partition_is}"),
            get: format!(
                "SELECT {listed} FROM {state} WHERE {partition_is} AND {} = {}",
                c("state_key"),
                d.param(4)
            ),
            get_in: format!(
                "SELECT {listed} FROM {state} WHERE {partition_is} AND {} IN",
                c("state_key"),
            ),
            journal: journal::select_changes(
                d,
                &super::own_table(d, store, journal::JOURNAL_TABLE)?,
                &partition_is,
            ),
            begin_snapshot,
            d,
            reads: format!(
                "SELECT {} FROM {} WHERE {} = {} AND {} = {}",
                c("reads"),
                super::own_table(d, store, "batch_state")?,
                c("pipeline"),
                d.param(1),
                c("batch_id"),
                d.param(2)
            ),
            pool,
        })
    }

    /// The state batch `batch_id`'s runs read as it started (empty if it
    /// read none).
    pub async fn reads(&self, pipeline: &str, batch_id: &str) -> Result<StateMap, SinkError> {
        let row = sqlx::query(&self.reads)
            .bind(pipeline.to_string())
            .bind(batch_id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| SinkError::database("reading a batch's recorded state", e))?;
        match row {
            None => Ok(StateMap::default()),
            Some(row) => {
                let bytes: Vec<u8> = row
                    .try_get(0)
                    .map_err(|e| SinkError::database("reading a batch's recorded state", e))?;
                StateMap::decode(&bytes)
                    .map_err(|e| SinkError::database(format!("batch {batch_id}"), e))
            }
        }
    }

    /// Begins a read of one snapshot.
    async fn snapshot(&self) -> Result<Snapshot, StateError> {
        match self.begin_snapshot {
            Some(begin) => self.pool.begin_with(begin).await,
            None => self.pool.begin().await,
        }
        .map_err(StateError::unreadable)
    }

    /// `tp`'s journal, its rows laid over each other: what the table does
    /// not hold yet.
    async fn journal(
        &self,
        tx: &mut Snapshot,
        pipeline: &str,
        tp: &TopicPartition,
    ) -> Result<Keys, StateError> {
        let rows = partition_query(&self.journal, pipeline, tp)
            .fetch_all(&mut **tx)
            .await
            .map_err(StateError::unreadable)?;
        let changes = rows
            .iter()
            .map(|row| row.try_get::<Vec<u8>, _>(0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(StateError::unreadable)?;
        journal::overlay(&changes)
    }

    /// The state table's rows of `keys` in `tp` (the journal aside), one
    /// query per [`GET_MANY_CHUNK`] keys.
    async fn table_rows(
        &self,
        tx: &mut Snapshot,
        pipeline: &str,
        tp: &TopicPartition,
        keys: &[&[u8]],
    ) -> Result<HashMap<Vec<u8>, StateValue>, StateError> {
        let mut found: HashMap<Vec<u8>, StateValue> = HashMap::with_capacity(keys.len());
        for chunk in keys.chunks(GET_MANY_CHUNK) {
            let sql = format!("{} ({})", self.get_in, self.d.params(4, chunk.len()));
            // Not a prepared statement kept for reuse: Postgres plans a kept
            // one generically after five runs, and its generic plan filters
            // the whole partition's rows against the key list (~0.4 s for
            // 500 keys of 25,000) instead of looking each key up.
            let mut query = partition_query(&sql, pipeline, tp).persistent(false);
            for key in chunk {
                query = query.bind(key.to_vec());
            }
            let rows = query
                .fetch_all(&mut **tx)
                .await
                .map_err(StateError::unreadable)?;
            for row in &rows {
                let (key, value) = state_row(row)?;
                found.insert(key, value);
            }
        }
        Ok(found)
    }
}

/// `sql` with the partition bound to its first three placeholders.
pub(crate) fn partition_query<'q>(
    sql: &'q str,
    pipeline: &str,
    tp: &TopicPartition,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    sqlx::query(sql)
        .bind(pipeline.to_string())
        .bind(tp.topic.clone())
        .bind(tp.partition as i64)
}

/// Ends a read (it wrote nothing: committing only ends the snapshot).
async fn finish(tx: Snapshot) -> Result<(), StateError> {
    tx.commit().await.map_err(StateError::unreadable)
}

/// Keys one `get_many` query asks for (placeholders stay well under every
/// database's limit).
pub(crate) const GET_MANY_CHUNK: usize = 500;

fn state_row(row: &sqlx::any::AnyRow) -> Result<(Vec<u8>, StateValue), StateError> {
    let corrupt = |e: sqlx::Error| StateError::Corrupt(format!("a state row: {e}"));
    let key = super::text_at(row, 0).map_err(corrupt)?;
    let key = hex::decode(&key)
        .map_err(|e| StateError::Corrupt(format!("a state key read as {key:?}: {e}")))?;
    Ok((
        key,
        StateValue {
            value: row.try_get::<Vec<u8>, _>(1).map_err(corrupt)?,
            expires_at_ms: row.try_get::<Option<i64>, _>(2).map_err(corrupt)?,
        },
    ))
}

#[async_trait::async_trait]
impl StateStore for SqlStateStore {
    async fn load(
        &self,
        pipeline: &str,
        tp: &TopicPartition,
        max_bytes: usize,
    ) -> Result<Option<Vec<(Vec<u8>, StateValue)>>, StateError> {
        use futures_util::TryStreamExt;
        let mut tx = self.snapshot().await?;
        let overlay = self.journal(&mut tx, pipeline, tp).await?;
        let (mut entries, mut bytes) = (Vec::new(), 0usize);
        {
            let mut rows = partition_query(&self.load, pipeline, tp).fetch(&mut *tx);
            while let Some(row) = rows.try_next().await.map_err(StateError::unreadable)? {
                let (key, value) = state_row(&row)?;
                if overlay.contains_key(&key) {
                    continue;
                }
                bytes += key.len() + value.size();
                if bytes > max_bytes {
                    return Ok(None);
                }
                entries.push((key, value));
            }
        }
        finish(tx).await?;
        for (key, value) in overlay {
            if let Some(value) = value {
                bytes += key.len() + value.size();
                if bytes > max_bytes {
                    return Ok(None);
                }
                entries.push((key, value));
            }
        }
        Ok(Some(entries))
    }

    /// One aggregate query, corrected by the journal's keys.
    async fn size(&self, pipeline: &str, tp: &TopicPartition) -> Result<StateSize, StateError> {
        let mut tx = self.snapshot().await?;
        let overlay = self.journal(&mut tx, pipeline, tp).await?;
        let row = partition_query(&self.size, pipeline, tp)
            .fetch_one(&mut *tx)
            .await
            .map_err(StateError::unreadable)?;
        let at = |i: usize| -> Result<usize, StateError> {
            let n: i64 = row.try_get(i).map_err(StateError::unreadable)?;
            Ok(n as usize)
        };
        let mut size = StateSize {
            keys: at(0)?,
            bytes: at(1)?,
        };
        let keys: Vec<&[u8]> = overlay.keys().map(Vec::as_slice).collect();
        let stored = self.table_rows(&mut tx, pipeline, tp, &keys).await?;
        finish(tx).await?;
        for (key, value) in &overlay {
            if let Some(old) = stored.get(key) {
                size.keys = size.keys.saturating_sub(1);
                size.bytes = (size.bytes).saturating_sub(key.len() + old.value.len());
            }
            if value.is_some() {
                size.keys += 1;
                size.bytes += StateSize::bytes_of(key.len(), value);
            }
        }
        Ok(size)
    }

    async fn get(
        &self,
        pipeline: &str,
        tp: &TopicPartition,
        key: &[u8],
    ) -> Result<Option<StateValue>, StateError> {
        let mut tx = self.snapshot().await?;
        let mut overlay = self.journal(&mut tx, pipeline, tp).await?;
        if let Some(value) = overlay.remove(key) {
            finish(tx).await?;
            return Ok(value);
        }
        let row = partition_query(&self.get, pipeline, tp)
            .bind(key.to_vec())
            .fetch_optional(&mut *tx)
            .await
            .map_err(StateError::unreadable)?;
        finish(tx).await?;
        row.map(|row| state_row(&row).map(|(_, v)| v)).transpose()
    }

    /// The journal once, then one query per [`GET_MANY_CHUNK`] keys it
    /// does not hold.
    async fn get_many(
        &self,
        pipeline: &str,
        tp: &TopicPartition,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<StateValue>>, StateError> {
        let mut tx = self.snapshot().await?;
        let overlay = self.journal(&mut tx, pipeline, tp).await?;
        let in_table: Vec<&[u8]> = keys
            .iter()
            .copied()
            .filter(|key| !overlay.contains_key(*key))
            .collect();
        let found = self.table_rows(&mut tx, pipeline, tp, &in_table).await?;
        finish(tx).await?;
        Ok(keys
            .iter()
            .map(|key| match overlay.get(*key) {
                Some(value) => value.clone(),
                None => found.get(*key).cloned(),
            })
            .collect())
    }

    /// Reads the page alone, in key order (bytes compare as bytes in all
    /// three databases): from the prefix or past the last key shown, up to
    /// the limit, cut where the prefix ends; the journal's keys in the
    /// page's range laid over it.
    async fn scan(
        &self,
        pipeline: &str,
        tp: &TopicPartition,
        page: &ScanPage,
    ) -> Result<Vec<(Vec<u8>, StateValue)>, StateError> {
        let mut tx = self.snapshot().await?;
        let overlay = self.journal(&mut tx, pipeline, tp).await?;
        let overlaid: Keys = overlay
            .into_iter()
            .filter(|(key, _)| page.holds(key))
            .collect();
        // Each journal key may hide one table row of the page: read that
        // many more, so the page still fills.
        let limit = page.limit.saturating_add(overlaid.len());
        let (query, bound) = match &page.after {
            Some(after) if after.as_slice() >= page.prefix.as_slice() => (&self.scan_after, after),
            _ => (&self.scan_from, &page.prefix),
        };
        let rows = partition_query(query, pipeline, tp)
            .bind(bound.clone())
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .map_err(StateError::unreadable)?;
        finish(tx).await?;
        let mut full = rows.len() >= limit;
        let mut keys = Keys::new();
        for row in &rows {
            let (key, value) = state_row(row)?;
            if !key.starts_with(&page.prefix) {
                full = false;
                break;
            }
            keys.insert(key, Some(value));
        }
        // Past the last row read, the table may hold keys not read: a
        // journal key there could come before them, so it waits for the
        // next page.
        let last = keys.keys().next_back().cloned();
        for (key, value) in overlaid {
            if full && last.as_ref().is_some_and(|last| key > *last) {
                continue;
            }
            keys.insert(key, value);
        }
        Ok(keys
            .into_iter()
            .filter_map(|(key, value)| value.map(|v| (key, v)))
            .take(page.limit)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(changes: &Changes<'_>) -> Vec<String> {
        let key = |k: &Option<&[u8]>| String::from_utf8(k.unwrap().to_vec()).unwrap();
        changes.keys.iter().map(key).collect()
    }

    /// A key the batch read as absent has no row to make room for or to
    /// delete; one read with a value, or not read at all, may have one.
    #[test]
    fn keys_read_as_absent_are_not_deleted() {
        let tp = TopicPartition {
            topic: "t".into(),
            partition: 0,
        };
        let value = |v: &str| {
            Some(StateValue {
                value: v.as_bytes().to_vec(),
                expires_at_ms: None,
            })
        };
        let (mut reads, mut state) = (StateMap::default(), StateMap::default());
        for (key, read) in [
            ("a", None),
            ("b", value("old")),
            ("d", None),
            ("e", value("old")),
        ] {
            reads.insert(&tp, key.as_bytes().to_vec(), read);
        }
        for (key, write) in [
            ("a", value("1")),
            ("b", value("2")),
            ("c", value("3")),
            ("d", None),
            ("e", None),
        ] {
            state.insert(&tp, key.as_bytes().to_vec(), write);
        }
        let writes = [TableWrite {
            tp: &tp,
            keys: Cow::Borrowed(&state.0[&tp]),
            absent: Some(Cow::Borrowed(&reads.0[&tp])),
        }];
        let (sets, deletes) = Changes::split(&writes, SetsBy::DeleteThenInsert);
        assert_eq!(keys(&sets), ["a", "b", "c"]);
        assert_eq!(keys(&deletes), ["b", "c", "e"]);
        let (sets, deletes) = Changes::split(&writes, SetsBy::Upsert);
        assert_eq!(keys(&sets), ["a", "b", "c"]);
        assert_eq!(keys(&deletes), ["e"]);
    }
}
