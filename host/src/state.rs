//! Opening a pipeline's state store: the module store and the lineage
//! reader of the backend its sink kind keeps them in. The SQL sinks keep
//! both in their own database, the Redis sink under its prefix in Redis,
//! the Kafka sink its lineage in its lineage topic (at-least-once: in
//! `[state]`) and its modules in `[state]` (a local SQLite file by default);
//! `[state]` moves the module store to another database or Redis. Lineage always stays where the sink commits: it is written in the
//! sink's batch transaction.
//!
//! The one place that picks a state backend; everything above it (the
//! control plane, replay, version following) holds the core's traits. It
//! must not read or write state itself.

use crate::config::{Guarantee, PipelineConfig, SinkConfig};
use sluice_core::sink::{SinkError, SinkKind};
use sluice_core::store::{LineageStore, ModuleStore, StoreError};
use sluice_kafka_sink::KafkaLineage;
use sluice_redis::{RedisLineage, RedisModuleStore};
use sluice_sql::{SqlLineage, SqlModuleStore};
use std::sync::Arc;

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
    match sink.kind().map_err(|e| StoreError::Config(e.to_string()))? {
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
