//! The one place that maps a sink kind to its backends: the sink a
//! pipeline commits into, the state store that keeps checkpoints for a sink
//! that keeps none (stdout, at-least-once Kafka), the module store, the
//! lineage reader and the dead-letter reader. Everything above it (the run,
//! replay, redrive, the control plane, version following) holds the core's
//! traits.
//!
//! Where state lives: the SQL sinks keep modules and lineage in their own
//! database, the Redis sink under its prefix in Redis, the exactly-once
//! Kafka sink its lineage in its lineage topic and its modules in
//! `[state]` (a local SQLite file by default); `[state]` moves the module
//! store to another database or Redis. Lineage always stays where the
//! batch commits: it is written in the sink's batch transaction.
//!
//! It must not read or write a batch, state or lineage itself: it opens.

use crate::config::{Guarantee, PipelineConfig, SinkConfig, StdoutFormat};
use crate::sink::kafka::{KafkaAtLeastOnce, KafkaProducer, KafkaSink};
use crate::sink::stdout::StdoutSink;
use crate::sink::{Sink, SinkError, SinkKind, mysql, postgres, sqlite};
use sluice_core::dead_letters::Redrive;
use sluice_core::store::{LineageStore, ModuleStore, StoreError};
use sluice_kafka_sink::KafkaLineage;
use sluice_redis::{RedisLineage, RedisModuleStore};
use sluice_sql::{SqlDeadLetters, SqlLineage, SqlModuleStore};
use std::sync::Arc;

/// What to do with the sink, whichever backend it is (the sinks are
/// different types, so the caller's work is handed to the opened one).
pub(crate) trait WithSink {
    type Output;
    async fn with<S: Sink>(self, sink: S) -> Self::Output;
}

/// What to do with a SQL sink, which alone can redrive dead letters.
pub(crate) trait WithSqlSink {
    type Output;
    async fn with<S: Sink + Redrive>(self, sink: S) -> Self::Output;
}

/// Opens the sink `config`'s pipeline commits into and hands it to
/// `work`: a SQL, Redis or exactly-once Kafka sink as it is; stdout and
/// at-least-once Kafka over the `[state]` store that keeps their
/// checkpoints and lineage.
pub(crate) async fn with_sink<W: WithSink>(
    config: &PipelineConfig,
    work: W,
) -> Result<W::Output, SinkError> {
    match config.sink.kind()? {
        SinkKind::Sqlite | SinkKind::Postgres | SinkKind::Mysql | SinkKind::Redis => {
            with_store_sink(&config.sink, work).await
        }
        SinkKind::Stdout => {
            let printing = Printing(config.sink.format.unwrap_or_default());
            with_state_under(config, printing, work).await
        }
        SinkKind::Kafka if config.sink.guarantee == Guarantee::AtLeastOnce => {
            let producer = tokio::task::block_in_place(|| KafkaProducer::open(config))?;
            with_state_under(config, producer, work).await
        }
        SinkKind::Kafka => {
            let sink = KafkaSink::open(config).await?;
            tracing::info!(
                "kafka sink: exactly-once (one transaction per batch and partition holds its \
                 records, dead letters, lineage and the group's offsets)"
            );
            Ok(work.with(sink).await)
        }
    }
}

/// Opens the SQL sink of `config`'s pipeline (which brings its tables up
/// to this version's columns) and hands it to `work`; other kinds are
/// refused, since only SQL sinks keep dead letters that can be redriven.
pub(crate) async fn with_sql_sink<W: WithSqlSink>(
    config: &PipelineConfig,
    work: W,
) -> Result<W::Output, SinkError> {
    Ok(match sql_kind(config)? {
        SinkKind::Sqlite => work.with(sqlite::open(&config.sink).await?).await,
        SinkKind::Postgres => work.with(postgres::open(&config.sink).await?).await,
        _ => work.with(mysql::open(&config.sink).await?).await,
    })
}

/// The stored dead letters of `config`'s pipeline (SQL sinks only), read
/// after the sink brought its tables up to this version's columns.
pub(crate) async fn dead_letters(config: &PipelineConfig) -> Result<SqlDeadLetters, SinkError> {
    match sql_kind(config)? {
        SinkKind::Sqlite => drop(sqlite::open(&config.sink).await?),
        SinkKind::Postgres => drop(postgres::open(&config.sink).await?),
        _ => drop(mysql::open(&config.sink).await?),
    }
    SqlDeadLetters::open(&config.sink).await
}

fn sql_kind(config: &PipelineConfig) -> Result<SinkKind, SinkError> {
    let kind = config.sink.kind()?;
    if !kind.is_sql() {
        return Err(SinkError::Config(format!(
            "dead letters are listed and redriven in SQL sinks only; this pipeline's sink is {}",
            kind.as_str()
        )));
    }
    Ok(kind)
}

/// Opens a sink that keeps its own checkpoints (SQL or Redis) from
/// `sink`'s settings and hands it to `work`.
async fn with_store_sink<W: WithSink>(sink: &SinkConfig, work: W) -> Result<W::Output, SinkError> {
    Ok(match sink.kind()? {
        SinkKind::Sqlite => work.with(sqlite::open(sink).await?).await,
        SinkKind::Postgres => work.with(postgres::open(sink).await?).await,
        SinkKind::Mysql => work.with(mysql::open(sink).await?).await,
        SinkKind::Redis => work.with(crate::sink::redis::open(sink).await?).await,
        kind @ (SinkKind::Stdout | SinkKind::Kafka) => {
            return Err(SinkError::Config(format!(
                "a {} `[state]` keeps no state",
                kind.as_str()
            )));
        }
    })
}

/// Opens the `[state]` store and hands `work` the sink `over` builds on it.
async fn with_state_under<O: OverState, W: WithSink>(
    config: &PipelineConfig,
    over: O,
    work: W,
) -> Result<W::Output, SinkError> {
    let state = state_sink(config)?;
    tracing::info!(state = %crate::sink::redact_url(&state.url), "{}", O::GUARANTEE);
    with_store_sink(&state, Over { over, work }).await
}

/// A sink whose checkpoints and lineage are committed in `[state]`, built
/// over whichever store that is.
trait OverState {
    /// The delivery guarantee, as the log says it at start.
    const GUARANTEE: &str;
    type Over<S: Sink>: Sink;
    fn over<S: Sink>(self, state: S) -> Self::Over<S>;
}

/// The stdout sink, printing in its format.
struct Printing(StdoutFormat);

impl OverState for Printing {
    const GUARANTEE: &str = "stdout sink: at-least-once (rows are printed, then the offsets move \
                             in the state store; a crash in between prints that one batch again)";
    type Over<S: Sink> = StdoutSink<S>;
    fn over<S: Sink>(self, state: S) -> Self::Over<S> {
        StdoutSink::new(state, self.0)
    }
}

impl OverState for KafkaProducer {
    const GUARANTEE: &str = "kafka sink: at-least-once (an idempotent producer sends a batch's \
                             records, then its offsets and lineage move in the state store; a \
                             crash in between sends that batch again)";
    type Over<S: Sink> = KafkaAtLeastOnce<S>;
    fn over<S: Sink>(self, state: S) -> Self::Over<S> {
        KafkaProducer::over(self, state)
    }
}

/// `work` handed the sink `over` builds on the state store it is given.
struct Over<O, W> {
    over: O,
    work: W,
}

impl<O: OverState, W: WithSink> WithSink for Over<O, W> {
    type Output = W::Output;
    async fn with<S: Sink>(self, state: S) -> W::Output {
        self.work.with(self.over.over(state)).await
    }
}

/// The module store of the pipeline: in `[state]` if configured, else in
/// the sink's database.
pub async fn module_store(config: &PipelineConfig) -> Result<Arc<dyn ModuleStore>, StoreError> {
    let own;
    let sink = match &config.state {
        Some(state) => {
            own = state.as_sink(&config.sink);
            &own
        }
        None => &config.sink,
    };
    match sink.kind().map_err(StoreError::Settings)? {
        SinkKind::Sqlite | SinkKind::Postgres | SinkKind::Mysql => {
            Ok(Arc::new(SqlModuleStore::open(sink).await?))
        }
        SinkKind::Redis => Ok(Arc::new(RedisModuleStore::open(sink).await?)),
        kind @ (SinkKind::Stdout | SinkKind::Kafka) => Err(StoreError::Config(format!(
            "{} keeps no modules: give the pipeline a `[state]`",
            kind.as_str()
        ))),
    }
}

/// Where the pipeline's checkpoints and lineage are committed: the sink,
/// or `[state]` for a sink that keeps no state (stdout).
pub fn state_sink(config: &PipelineConfig) -> Result<SinkConfig, SinkError> {
    if config.sink.kind()?.keeps_state() {
        return Ok(config.sink.clone());
    }
    match &config.state {
        Some(state) => Ok(state.as_sink(&config.sink)),
        None => Err(SinkError::Config(format!(
            "a {} sink keeps its checkpoints in `[state]`, which is missing",
            config.sink.kind()?.as_str()
        ))),
    }
}

/// The lineage of `config`'s pipeline (an exactly-once Kafka sink's: its
/// lineage topic).
pub async fn lineage(config: &PipelineConfig) -> Result<Arc<dyn LineageStore>, SinkError> {
    if config.sink.kind()? == SinkKind::Kafka && config.sink.guarantee == Guarantee::ExactlyOnce {
        return Ok(Arc::new(KafkaLineage::open(config)?));
    }
    let sink = state_sink(config)?;
    match sink.kind()? {
        SinkKind::Sqlite | SinkKind::Postgres | SinkKind::Mysql => {
            Ok(Arc::new(SqlLineage::open(&sink).await?))
        }
        SinkKind::Redis => Ok(Arc::new(RedisLineage::open(&sink).await?)),
        kind @ (SinkKind::Stdout | SinkKind::Kafka) => Err(SinkError::Config(format!(
            "{} keeps no lineage",
            kind.as_str()
        ))),
    }
}
