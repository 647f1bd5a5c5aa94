//! The SQL sinks (`sluice-sql`): SQLite (the embedded default), Postgres
//! and MySQL/MariaDB, one directory each (`sqlite/`, `postgres/`, `mysql/`:
//! connections, error kinds, bulk row path), and the state store they keep
//! in their own database (`store`: modules and activations; `lineage`:
//! reading committed batches back; `dead_letters`: reading stored dead
//! letters back). This file holds what they share: the batch
//! transaction, sluice's own tables (checkpoints, lineage, dead letters) and
//! the checks of a module's rows against the configured targets. Keyed
//! state (`state`) is written in the same transaction as the offsets.
//!
//! A backend supplies its dialect, its connections and its bulk row path
//! through [`SqlBackend`] and [`SqlTx`]; everything else is written once
//! here. This file must not hold one dialect's row statements, backends
//! never import each other, and no name from configuration is ever pasted
//! into SQL unquoted.
//!
//! # Delivery guarantee
//!
//! With `guarantee = "exactly-once"` (the default) each batch is one
//! database transaction holding the target rows, the dead letters, the
//! lineage rows and, per partition, the offset move `from -> until` done as
//! a compare-and-set on the checkpoint row. Zero rows moved means another
//! owner committed first: the transaction is rolled back and the pipeline
//! re-plans. An error from `COMMIT` itself that is not the server's answer
//! (connection lost) is reported as [`SinkError::CommitUnknown`]: the
//! pipeline reads the checkpoint back and never writes the batch again
//! blindly. This depends on (1) the source replaying the same records for
//! the same range (Kafka, `read_committed`), (2) the module being
//! deterministic, and (3) the database's atomic, durable commit.
//!
//! With `guarantee = "at-least-once"` the rows and dead letters are
//! committed first and the offsets and lineage in a second transaction: a
//! crash between the two replays the batch, so rows may be written twice
//! (append rows come again, accumulate adds again; upserts and deletes land
//! the same). Dead letters are written so that a replay keeps the stored
//! one instead of failing on its key. It exists to measure what
//! exactly-once costs.

mod any;
mod dead_letters;
mod dialect;
mod glue;
mod journal;
mod lineage;
mod multidelete;
mod multirow;
pub mod mysql;
mod own_tables;
pub mod pool;
pub mod postgres;
pub mod reset;
#[cfg(test)]
pub(crate) mod scenarios;
pub mod section;
pub mod sqlite;
mod state;
mod store;
#[cfg(test)]
mod store_tests;
mod target;

pub use dead_letters::SqlDeadLetters;
pub use lineage::SqlLineage;
pub use state::SqlStateStore;
pub use store::SqlModuleStore;

pub use any::{connect_any, text_at};
pub use dialect::{Dialect, InsertIgnore, MYSQL, POSTGRES, SQLITE};
pub use multidelete::MultiRowDelete;
pub use multirow::MultiRowInsert;
pub use target::{Cell, Target, TypedColumn};

use sluice_core::{batch, config, output, sink};

use crate::batch::TopicPartition;
use crate::config::{Guarantee, StoreConnection, Writes};
use crate::sink::{Commit, CommitOutcome, SinkError};
use own_tables::OwnTables;
use section::{SqlSinkFields, SqlTargetFields};
use sluice_core::backoff::{GiveUp, RetryPolicy};
use sluice_core::dead_letters::{RecordKey, Redrive, RedriveOutcome, StoredDeadLetter};
use std::collections::HashMap;

/// A statement parameter for sluice's own tables.
#[derive(Debug, Clone, Copy)]
pub enum Param<'a> {
    Int(i64),
    Text(&'a str),
    Bytes(Option<&'a [u8]>),
}

/// One database: connections, its dialect and its row statements.
#[allow(async_fn_in_trait)]
pub trait SqlBackend {
    /// A target's write statements, prepared as text once at start.
    type Statements;
    /// One open batch transaction.
    type Tx: SqlTx<Self::Statements>;

    fn dialect(&self) -> &'static Dialect;
    /// Starts a batch transaction.
    async fn begin(&self) -> Result<Self::Tx, SinkError>;
    /// Runs one statement on its own (DDL, reads); returns rows affected.
    async fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, SinkError>;
    /// The first column of the first row, if any.
    async fn query_i64(&self, sql: &str, params: &[Param<'_>]) -> Result<Option<i64>, SinkError>;
    /// The column names of `table` (empty if it does not exist).
    async fn table_columns(
        &self,
        schema: Option<&str>,
        table: &str,
    ) -> Result<Vec<String>, SinkError>;
    /// Builds a target's write statements (may look at the table).
    async fn statements(&self, target: &Target) -> Result<Self::Statements, SinkError>;
}

/// A batch transaction.
#[allow(async_fn_in_trait)]
pub trait SqlTx<S> {
    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, SinkError>;
    async fn query_i64(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<i64>, SinkError>;
    /// Every column of the first row, as integers (`None`: no row).
    async fn query_i64s(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<Vec<i64>>, SinkError>;
    /// Every row, each column as bytes.
    async fn query_blobs(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Vec<Vec<u8>>>, SinkError>;
    /// Applies `rows` rows of a target (its mode decides how).
    async fn write_rows(
        &mut self,
        target: &Target,
        statements: &S,
        columns: &[TypedColumn<'_>],
        rows: usize,
    ) -> Result<(), SinkError>;
    /// Commits. A lost connection here must come back as
    /// [`SinkError::CommitUnknown`]; an answer from the server as any other
    /// error.
    async fn commit(self) -> Result<(), SinkError>;
    /// Rolls back (or drops the connection if that fails).
    async fn rollback(self);
}

/// Commits a sqlx transaction as [`SqlTx::commit`] must: an error the
/// server answered with goes through the backend's `db_err` (the
/// transaction did not commit); any other (the connection lost before the
/// reply) is [`SinkError::CommitUnknown`].
async fn commit_sqlx<DB: sqlx::Database>(
    tx: sqlx::Transaction<'static, DB>,
    db_err: fn(sqlx::Error) -> SinkError,
) -> Result<(), SinkError> {
    tx.commit().await.map_err(|e| match e {
        sqlx::Error::Database(_) => db_err(e),
        other => SinkError::commit_unknown("", other),
    })
}

/// A batch to commit, with the scope numbers its state changes are
/// written under.
struct Batch<'a> {
    commit: &'a Commit<'a>,
    scopes: state::ScopeNumbers,
}

/// Which writes of a batch one transaction holds.
#[derive(Debug, Clone, Copy)]
enum Part {
    Everything,
    Outputs,
    Offsets,
}

/// A SQL sink over one backend.
pub struct SqlSink<B: SqlBackend> {
    backend: B,
    own: OwnTables,
    /// The keyed state tables and their statements.
    state: state::StateTables<B::Statements>,
    /// Reads keyed state back for the pipeline's cache.
    state_store: std::sync::Arc<SqlStateStore>,
    targets: HashMap<String, (Target, B::Statements)>,
    guarantee: Guarantee,
}

impl<B: SqlBackend> SqlSink<B> {
    /// Creates sluice's tables and the targets' tables (where `create` is
    /// set) and checks every target's columns exist.
    pub async fn open(
        backend: B,
        store: &StoreConnection,
        writes: Writes<'_>,
    ) -> Result<Self, SinkError> {
        let dialect = backend.dialect();
        let fields = SqlSinkFields::of(store)?;
        let schema = fields.schema.as_deref();
        if let Some(s) = schema {
            create(&backend, &dialect.create_schema(s)?).await?;
        }
        let own = OwnTables::new(dialect, schema, &store.table_prefix)?;
        for ddl in own.ddl(dialect)? {
            create(&backend, &ddl).await?;
        }
        for (table, column, alter) in own.added_columns(dialect) {
            let table = format!("{}{table}", store.table_prefix);
            add_column(&backend, schema, &table, column, &alter).await?;
        }
        let state = state::StateTables::open(
            &backend,
            schema,
            &store.table_prefix,
            fields.state_journal_batches.get(),
        )
        .await?;
        let state_store = std::sync::Arc::new(SqlStateStore::open(store).await?);
        let mut targets = HashMap::new();
        for t in writes.targets {
            let fields = SqlTargetFields::of(t)?;
            let creates_table = fields.create;
            let target = Target::new(t, fields, dialect, schema)?;
            if creates_table {
                create(&backend, &target.create_ddl(dialect)).await?;
            }
            target.check_table(&backend.table_columns(schema, &target.table_name).await?)?;
            let statements = backend.statements(&target).await?;
            targets.insert(t.name.clone(), (target, statements));
        }
        Ok(SqlSink {
            backend,
            own,
            state,
            state_store,
            targets,
            guarantee: writes.guarantee,
        })
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The stored next offsets of `partitions` (absent = never committed).
    pub async fn checkpoints(
        &self,
        pipeline: &str,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError> {
        let mut found = HashMap::new();
        for tp in partitions {
            let params = [
                Param::Text(pipeline),
                Param::Text(&tp.topic),
                Param::Int(tp.partition as i64),
            ];
            if let Some(next) = self
                .backend
                .query_i64(&self.own.select_checkpoint, &params)
                .await?
            {
                found.insert(tp.clone(), next);
            }
        }
        Ok(found)
    }

    /// Commits one batch, or reports it fenced (see the module header).
    pub async fn commit(&self, c: &Commit<'_>) -> Result<CommitOutcome, SinkError> {
        let scopes = self.state.scopes(&self.backend, c).await?;
        let c = &Batch { commit: c, scopes };
        match self.guarantee {
            Guarantee::ExactlyOnce => self.in_transaction(c, Part::Everything).await,
            Guarantee::AtLeastOnce => {
                // A lost reply here only risks writing the rows twice, which
                // this guarantee allows: retry like any outage.
                self.in_transaction(c, Part::Outputs)
                    .await
                    .map_err(|e| match e {
                        SinkError::CommitUnknown { context, cause } => {
                            SinkError::Unavailable { context, cause }
                        }
                        other => other,
                    })?;
                self.in_transaction(c, Part::Offsets).await
            }
        }
    }

    /// Writes `part` of the batch in one transaction; commits it unless
    /// fenced or failed.
    async fn in_transaction(&self, c: &Batch<'_>, part: Part) -> Result<CommitOutcome, SinkError> {
        let mut tx = self.backend.begin().await?;
        let written = match part {
            Part::Everything => self.write_everything(&mut tx, c).await,
            Part::Outputs => self.write_outputs(&mut tx, c.commit).await,
            Part::Offsets => self.write_offsets(&mut tx, c).await,
        };
        match written {
            Ok(CommitOutcome::Committed) => {
                tx.commit().await?;
                Ok(CommitOutcome::Committed)
            }
            other => {
                tx.rollback().await;
                other
            }
        }
    }

    async fn write_everything(
        &self,
        tx: &mut B::Tx,
        c: &Batch<'_>,
    ) -> Result<CommitOutcome, SinkError> {
        if let fenced @ CommitOutcome::Fenced { .. } = self.write_offsets(tx, c).await? {
            return Ok(fenced);
        }
        self.write_outputs(tx, c.commit).await
    }

    /// The offset compare-and-sets, then the lineage rows and the keyed
    /// state (which moves with the offsets under either guarantee).
    async fn write_offsets(
        &self,
        tx: &mut B::Tx,
        batch: &Batch<'_>,
    ) -> Result<CommitOutcome, SinkError> {
        let c = batch.commit;
        for range in &c.plan.ranges {
            if let Some(fenced) = self.own.move_offset(tx, &c.plan.pipeline, range).await? {
                return Ok(fenced);
            }
        }
        self.own.write_lineage(tx, c).await?;
        self.state.write(tx, c, &batch.scopes).await?;
        Ok(CommitOutcome::Committed)
    }

    /// The target rows and the dead letters.
    async fn write_outputs(
        &self,
        tx: &mut B::Tx,
        c: &Commit<'_>,
    ) -> Result<CommitOutcome, SinkError> {
        for rows in &c.output.targets {
            let (target, statements) = self.targets.get(&rows.target).ok_or_else(|| {
                SinkError::Config(format!(
                    "module wrote to target `{}`, which the sink does not declare",
                    rows.target
                ))
            })?;
            let columns = target.columns_of(rows)?;
            tx.write_rows(target, statements, &columns, rows.rows as usize)
                .await?;
        }
        let replayable = self.guarantee == Guarantee::AtLeastOnce;
        self.own.write_dead_letters(tx, c, replayable).await?;
        Ok(CommitOutcome::Committed)
    }
}

impl<B: SqlBackend> SqlSink<B> {
    /// Commits a redrive: deletes every dead letter of `taken` that batch
    /// `stored_by` stored (all must be), writes the outputs and new dead
    /// letters and the lineage row, in one transaction (see
    /// `sluice_core::dead_letters`).
    pub async fn redrive(
        &self,
        c: &Commit<'_>,
        stored_by: &str,
        taken: &[RecordKey],
    ) -> Result<RedriveOutcome, SinkError> {
        let mut tx = self.backend.begin().await?;
        match self.write_redrive(&mut tx, c, stored_by, taken).await {
            Ok(RedriveOutcome::Committed) => {
                tx.commit().await?;
                Ok(RedriveOutcome::Committed)
            }
            other => {
                tx.rollback().await;
                other
            }
        }
    }

    async fn write_redrive(
        &self,
        tx: &mut B::Tx,
        c: &Commit<'_>,
        stored_by: &str,
        taken: &[RecordKey],
    ) -> Result<RedriveOutcome, SinkError> {
        // The deletes come first: a record failing again is stored again
        // under the same key (by this redrive's batch id).
        for key in taken {
            if !self
                .own
                .delete_dead_letter(tx, &c.plan.pipeline, key, stored_by)
                .await?
            {
                return Ok(RedriveOutcome::Gone(key.clone()));
            }
        }
        self.write_outputs(tx, c).await?;
        self.own.write_lineage(tx, c).await?;
        Ok(RedriveOutcome::Committed)
    }

    /// How many of `taken` are stored as dead letters of `pipeline` by
    /// batch `stored_by`.
    pub async fn still_stored(
        &self,
        pipeline: &str,
        stored_by: &str,
        taken: &[RecordKey],
    ) -> Result<usize, SinkError> {
        let mut stored = 0;
        for key in taken {
            let params = [
                Param::Text(pipeline),
                Param::Text(&key.topic),
                Param::Int(key.partition as i64),
                Param::Int(key.offset),
                Param::Text(stored_by),
            ];
            let count = self
                .backend
                .query_i64(&self.own.count_dead_letter, &params)
                .await?;
            stored += usize::from(count.unwrap_or(0) > 0);
        }
        Ok(stored)
    }
}

impl<B: SqlBackend> Redrive for SqlSink<B> {
    async fn redrive(
        &self,
        commit: &Commit<'_>,
        stored_by: &str,
        taken: &[StoredDeadLetter],
    ) -> Result<RedriveOutcome, SinkError> {
        let keys: Vec<RecordKey> = taken.iter().map(StoredDeadLetter::key).collect();
        SqlSink::redrive(self, commit, stored_by, &keys).await
    }

    async fn still_stored(
        &self,
        pipeline: &str,
        stored_by: &str,
        taken: &[StoredDeadLetter],
    ) -> Result<usize, SinkError> {
        let keys: Vec<RecordKey> = taken.iter().map(StoredDeadLetter::key).collect();
        SqlSink::still_stored(self, pipeline, stored_by, &keys).await
    }
}

impl<B: SqlBackend> sluice_core::sink::Sink for SqlSink<B> {
    async fn checkpoints(
        &self,
        pipeline: &str,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError> {
        SqlSink::checkpoints(self, pipeline, partitions).await
    }

    async fn commit(&self, commit: &Commit<'_>) -> Result<CommitOutcome, SinkError> {
        SqlSink::commit(self, commit).await
    }

    fn state_store(&self) -> Option<std::sync::Arc<dyn sluice_core::state::StateStore>> {
        Some(self.state_store.clone())
    }
}

/// Adds `column` to a table an older version created without it.
/// Instances starting together may both try: the loser finds it added.
async fn add_column<B: SqlBackend>(
    backend: &B,
    schema: Option<&str>,
    table: &str,
    column: &str,
    alter: &str,
) -> Result<(), SinkError> {
    let has_column = |columns: Vec<String>| columns.iter().any(|c| c.eq_ignore_ascii_case(column));
    if has_column(backend.table_columns(schema, table).await?) {
        return Ok(());
    }
    tracing::info!("adding column {column} to {table}");
    match backend.execute(alter, &[]).await {
        Ok(_) => Ok(()),
        Err(_) if has_column(backend.table_columns(schema, table).await?) => Ok(()),
        Err(e) => Err(e),
    }
}

/// sluice's own table `name` in `store`: prefixed, in the store's schema,
/// quoted.
fn own_table(d: &Dialect, store: &StoreConnection, name: &str) -> Result<String, SinkError> {
    let schema = SqlSinkFields::of(store)?.schema;
    d.qualified(schema.as_deref(), &format!("{}{name}", store.table_prefix))
}

/// Runs a `CREATE ... IF NOT EXISTS`. Instances starting together race on
/// it (Postgres may then fail one of them with a unique violation in its
/// catalog); a second try sees the object and passes.
async fn create<B: SqlBackend>(backend: &B, ddl: &str) -> Result<(), SinkError> {
    create_racing(ddl, || async { backend.execute(ddl, &[]).await.map(drop) }).await
}

/// Runs `ddl` through `run` under [`CREATE_RETRY`]: the one retry loop of
/// every `CREATE ... IF NOT EXISTS`, whatever error type its caller has.
pub(crate) async fn create_racing<E, Run, Ran>(ddl: &str, mut run: Run) -> Result<(), E>
where
    E: std::fmt::Display,
    Run: FnMut() -> Ran,
    Ran: std::future::Future<Output = Result<(), E>>,
{
    let mut backoff = CREATE_RETRY.start();
    loop {
        let e = match run().await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let Some(wait) = backoff.next_wait() else {
            return Err(e);
        };
        tracing::debug!("{ddl}: {e}; trying again");
        tokio::time::sleep(wait).await;
    }
}

/// How a `CREATE ... IF NOT EXISTS` that lost a race is tried again: 4
/// tries, 200 ms apart.
const CREATE_RETRY: RetryPolicy = RetryPolicy {
    first: std::time::Duration::from_millis(200),
    max: std::time::Duration::from_millis(200),
    give_up: GiveUp::AfterTries(4),
};
