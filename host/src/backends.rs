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
//! It is also where each kind's own config fields are registered
//! ([`check`]): a new sink kind adds its crate's `KindSection` here.
//!
//! It must not read or write a batch, state or lineage itself: it opens.

use crate::config::{
    ConfigError, Guarantee, KindSection, PipelineConfig, Place, StoreConnection, Writes,
};
use crate::sink::kafka::{KafkaAtLeastOnce, KafkaProducer, KafkaSection, KafkaSink};
use crate::sink::redis::RedisSection;
use crate::sink::sql::section::{SqlSection, SqlTargetFields};
use crate::sink::stdout::{StdoutFormat, StdoutSection, StdoutSink};
use crate::sink::{Sink, SinkError, SinkKind, mysql, postgres, redis, sqlite};
use sluice_core::dead_letters::{DeadLetterReader, Redrive};
use sluice_core::state::StateStore;
use sluice_core::store::{LineageStore, ModuleStore, StoreError};
use sluice_kafka_sink::{KafkaDeadLetters, KafkaLineage, KafkaStateStore};
use sluice_redis::{RedisDeadLetters, RedisLineage, RedisModuleStore, RedisStateStore};
use sluice_sql::{SqlDeadLetters, SqlLineage, SqlModuleStore, SqlStateStore};
use std::collections::HashMap;
use std::sync::Arc;

/// Checks the sink kind's own fields of `config` (the core checked the
/// rest when it parsed it); a field that belongs to another kind is named
/// with the kind it is for.
pub fn check(config: &PipelineConfig) -> Result<(), ConfigError> {
    let kind = config
        .sink
        .kind()
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    let checked = match kind {
        SinkKind::Sqlite | SinkKind::Postgres | SinkKind::Mysql => SqlSection::check(config),
        SinkKind::Redis => RedisSection::check(config),
        SinkKind::Kafka => KafkaSection::check(config),
        SinkKind::Stdout => StdoutSection::check(config),
    };
    checked.map_err(|e| match e {
        ConfigError::Foreign {
            place,
            field,
            kind,
            owner: None,
        } => {
            let owner = owner_of(&place, &field);
            ConfigError::Foreign {
                place,
                field,
                kind,
                owner,
            }
        }
        other => other,
    })
}

/// A kind's fields at a place, as its section names them.
pub(crate) type FieldsAt = fn(&Place) -> &'static [&'static str];

/// Every kind's section: who its fields are for, and their names.
pub(crate) const SECTIONS: [(&str, FieldsAt); 4] = [
    (SqlSection::FOR, SqlSection::fields),
    (RedisSection::FOR, RedisSection::fields),
    (KafkaSection::FOR, KafkaSection::fields),
    (StdoutSection::FOR, StdoutSection::fields),
];

/// Which kinds have `field` at `place`, as their sections name them.
fn owner_of(place: &Place, field: &str) -> Option<&'static str> {
    SECTIONS
        .into_iter()
        .find(|(_, fields)| fields(place).contains(&field))
        .map(|(owner, _)| owner)
}

/// Reads, parses and checks a pipeline config: the core's checks and
/// the sink kind's own.
pub fn load(path: &std::path::Path) -> Result<PipelineConfig, ConfigError> {
    let mut config = PipelineConfig::load(path)?;
    tolerate_sql_fields(&mut config);
    check(&config)?;
    Ok(config)
}

/// SQL fields that other sink kinds accepted and ignored before each kind
/// read its own fields: `schema`, and on a target `create`, `mode =
/// "append"` and `key = []` (the defaults; other values were refused).
/// A config that worked then still does: they are dropped here, with a
/// warning that says so.
fn tolerate_sql_fields(config: &mut PipelineConfig) {
    if config.sink.kind().is_ok_and(SinkKind::is_sql) {
        return;
    }
    let ignored = |field: &str, at: &str| {
        tracing::warn!("`{field}` in {at} is for SQL sinks: ignored (remove it)");
    };
    if config.sink.settings.remove("schema").is_some() {
        ignored("schema", "`[sink]`");
    }
    for target in &mut config.sink.targets {
        let at = format!("target `{}`", target.name);
        let settings = &mut target.settings;
        let defaults = [
            (
                "create",
                settings.get("create").is_some_and(toml::Value::is_bool),
            ),
            (
                "mode",
                settings.get("mode").and_then(toml::Value::as_str) == Some("append"),
            ),
            (
                "key",
                settings
                    .get("key")
                    .and_then(toml::Value::as_array)
                    .is_some_and(Vec::is_empty),
            ),
        ];
        for (field, tolerated) in defaults {
            if tolerated {
                settings.remove(field);
                ignored(field, &at);
            }
        }
    }
}

/// The key columns that identify each target's rows, by target (SQL
/// targets with a `key`; none elsewhere): how `shadow` pairs rows.
pub fn target_keys(config: &PipelineConfig) -> Result<HashMap<String, Vec<String>>, SinkError> {
    let sql = config.sink.kind()?.is_sql();
    config
        .sink
        .targets
        .iter()
        .map(|t| {
            let key = match sql {
                true => SqlTargetFields::of(t)?.key,
                false => Vec::new(),
            };
            Ok((t.name.clone(), key))
        })
        .collect()
}

/// What to do with the sink, whichever backend it is (the sinks are
/// different types, so the caller's work is handed to the opened one).
pub(crate) trait WithSink {
    type Output;
    async fn with<S: Sink>(self, sink: S) -> Self::Output;
}

/// What to do with a sink that can redrive dead letters (SQL, Redis,
/// exactly-once Kafka).
pub(crate) trait WithRedriveSink {
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
            with_store_sink(&config.sink.store(), config.sink.writes(), work).await
        }
        SinkKind::Stdout => {
            let printing = Printing(StdoutSection::sink(&config.sink)?.format);
            with_state_under(config, printing, work).await
        }
        SinkKind::Kafka if config.sink.guarantee() == Guarantee::AtLeastOnce => {
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

/// Opens the sink of `config`'s pipeline (a SQL sink brings its tables up
/// to this version's columns) and hands it to `work`; kinds that keep no
/// dead letters sluice can redrive are refused.
pub(crate) async fn with_redrive_sink<W: WithRedriveSink>(
    config: &PipelineConfig,
    work: W,
) -> Result<W::Output, SinkError> {
    Ok(match keeping_dead_letters(config)? {
        SinkKind::Sqlite => work.with(sqlite::open(&config.sink).await?).await,
        SinkKind::Postgres => work.with(postgres::open(&config.sink).await?).await,
        SinkKind::Mysql => work.with(mysql::open(&config.sink).await?).await,
        SinkKind::Redis => work.with(redis::open(&config.sink).await?).await,
        _ => work.with(KafkaSink::open(config).await?).await,
    })
}

/// The stored dead letters of `config`'s pipeline, read after the sink
/// brought its tables up to this version's columns: a SQL or Redis sink's,
/// the exactly-once Kafka sink's dead-letter topic, or `[state]`'s (stdout,
/// at-least-once Kafka).
pub(crate) async fn dead_letters(
    config: &PipelineConfig,
) -> Result<Box<dyn DeadLetterReader>, SinkError> {
    if exactly_once_kafka(config)? {
        return Ok(Box::new(KafkaDeadLetters::open(config)?));
    }
    let kind = config.sink.kind()?;
    if !kind.keeps_state() {
        let store = state_sink(config)?;
        return Ok(match store.kind()? {
            SinkKind::Redis => Box::new(RedisDeadLetters::open(&store).await?),
            _ => Box::new(SqlDeadLetters::open(&store).await?),
        });
    }
    match keeping_dead_letters(config)? {
        SinkKind::Sqlite => drop(sqlite::open(&config.sink).await?),
        SinkKind::Postgres => drop(postgres::open(&config.sink).await?),
        SinkKind::Mysql => drop(mysql::open(&config.sink).await?),
        _ => {
            let store = config.sink.store();
            return Ok(Box::new(RedisDeadLetters::open(&store).await?));
        }
    }
    Ok(Box::new(SqlDeadLetters::open(&config.sink.store()).await?))
}

/// The sink's kind if it keeps dead letters sluice can redrive (SQL,
/// Redis, exactly-once Kafka).
fn keeping_dead_letters(config: &PipelineConfig) -> Result<SinkKind, SinkError> {
    let kind = config.sink.kind()?;
    if !kind.keeps_state() && !exactly_once_kafka(config)? {
        return Err(SinkError::Config(format!(
            "dead letters are redriven into SQL, Redis and exactly-once Kafka sinks only \
             (listed in every sink that keeps them); this pipeline's sink is {}{}",
            kind.as_str(),
            match kind {
                SinkKind::Kafka => " (at-least-once)",
                _ => "",
            }
        )));
    }
    Ok(kind)
}

/// Opens a sink that keeps its own checkpoints (SQL or Redis) in `store`,
/// writing `writes`, and hands it to `work`.
async fn with_store_sink<W: WithSink>(
    store: &StoreConnection,
    writes: Writes<'_>,
    work: W,
) -> Result<W::Output, SinkError> {
    Ok(match store.kind()? {
        SinkKind::Sqlite => work.with(sqlite::open_with(store, writes).await?).await,
        SinkKind::Postgres => work.with(postgres::open_with(store, writes).await?).await,
        SinkKind::Mysql => work.with(mysql::open_with(store, writes).await?).await,
        SinkKind::Redis => work.with(redis::open_with(store, writes).await?).await,
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
    with_store_sink(&state, Writes::NOTHING, Over { over, work }).await
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
    let store = match &config.state {
        Some(state) => state.store(&config.sink),
        None => config.sink.store(),
    };
    match store.kind().map_err(StoreError::Settings)? {
        SinkKind::Sqlite | SinkKind::Postgres | SinkKind::Mysql => {
            Ok(Arc::new(SqlModuleStore::open(&store).await?))
        }
        SinkKind::Redis => Ok(Arc::new(RedisModuleStore::open(&store).await?)),
        kind @ (SinkKind::Stdout | SinkKind::Kafka) => Err(StoreError::Config(format!(
            "{} keeps no modules: give the pipeline a `[state]`",
            kind.as_str()
        ))),
    }
}

/// Where the pipeline's checkpoints and lineage are committed: the sink,
/// or `[state]` for a sink that keeps no state (stdout).
pub fn state_sink(config: &PipelineConfig) -> Result<StoreConnection, SinkError> {
    if config.sink.kind()?.keeps_state() {
        return Ok(config.sink.store());
    }
    match &config.state {
        Some(state) => Ok(state.store(&config.sink)),
        None => Err(SinkError::Config(format!(
            "a {} sink keeps its checkpoints in `[state]`, which is missing",
            config.sink.kind()?.as_str()
        ))),
    }
}

/// Whether `config`'s sink is Kafka with `guarantee = "exactly-once"`: the
/// one sink that keeps its checkpoints and lineage in Kafka itself (the
/// group's offsets, the lineage topic), not in a store of sluice's.
pub(crate) fn exactly_once_kafka(config: &PipelineConfig) -> Result<bool, SinkError> {
    Ok(config.sink.kind()? == SinkKind::Kafka && config.sink.guarantee() == Guarantee::ExactlyOnce)
}

/// Where `config`'s pipeline keeps its keyed state, to read it
/// (`sluice state`); the pipeline itself reads it through its sink.
pub async fn state_store(config: &PipelineConfig) -> Result<Arc<dyn StateStore>, SinkError> {
    if exactly_once_kafka(config)? {
        return Ok(Arc::new(KafkaStateStore::open(config)?));
    }
    // A sink without state of its own (stdout, at-least-once Kafka) keeps
    // it in `[state]`.
    let store = state_sink(config)?;
    match store.kind()? {
        SinkKind::Sqlite | SinkKind::Postgres | SinkKind::Mysql => {
            Ok(Arc::new(SqlStateStore::open(&store).await?))
        }
        SinkKind::Redis => Ok(Arc::new(RedisStateStore::open(&store).await?)),
        kind @ (SinkKind::Stdout | SinkKind::Kafka) => Err(SinkError::Config(format!(
            "a {} `[state]` keeps no keyed state",
            kind.as_str()
        ))),
    }
}

/// The lineage of `config`'s pipeline (an exactly-once Kafka sink's: its
/// lineage topic).
pub async fn lineage(config: &PipelineConfig) -> Result<Arc<dyn LineageStore>, SinkError> {
    if exactly_once_kafka(config)? {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn check_text(url: &str, sink: &str, target: &str) -> Result<(), String> {
        let sink = format!("url = \"{url}\"\n{sink}");
        let columns = "{ n = \"integer\" }";
        let config = sluice_core::testing::sink_config(&sink, "out", columns, target)
            .map_err(|e| e.to_string())?;
        check(&config).map_err(|e| e.to_string())
    }

    #[test]
    fn a_field_of_another_kind_names_the_kind_it_is_for() {
        let redis = "[[sink.targets.redis]]\ncommand = \"del\"\nkey = \"k\"";
        let cases = [
            (
                "sqlite://x.db",
                "format = \"table\"",
                "",
                "`sink.format` is for the stdout sink, not SQL sinks",
            ),
            (
                "kafka://b:1",
                "lineage_keep = 5",
                "",
                "`sink.lineage_keep` is for Redis sinks, not Kafka sinks",
            ),
            (
                "redis://h/0",
                "schema = \"s\"",
                redis,
                "`sink.schema` is for SQL sinks, not Redis sinks",
            ),
            (
                "stdout://",
                "dead_letter_topic = \"d\"",
                "",
                "`sink.dead_letter_topic` is for Kafka sinks, not the stdout sink",
            ),
            (
                "postgres://u@h/db",
                "",
                "[sink.targets.kafka]\ntopic = \"o\"",
                "target `out`: `kafka` is for Kafka sinks, not SQL sinks",
            ),
            (
                "kafka://b:1",
                "",
                "create = false",
                "target `out`: `create` is for SQL sinks, not Kafka sinks",
            ),
            (
                "stdout://",
                "",
                redis,
                "target `out`: `redis` is for Redis sinks, not the stdout sink",
            ),
            (
                "sqlite://x.db",
                "colour = 1",
                "",
                "unknown field `colour` in `[sink]`: not a field of SQL sinks",
            ),
        ];
        for (url, sink, target, says) in cases {
            match check_text(url, sink, target) {
                Ok(()) => panic!("{url} accepted {sink} / {target}"),
                Err(said) => assert!(said.contains(says), "{url}: {said}"),
            }
        }
        for url in ["sqlite://x.db", "stdout://", "kafka://b:1"] {
            assert_eq!(check_text(url, "", ""), Ok(()), "{url}");
        }
        assert_eq!(check_text("redis://h/0", "", redis), Ok(()));
    }

    #[test]
    fn sql_defaults_other_kinds_ignored_before_still_load() {
        let dir = std::env::temp_dir().join(format!("sluice-tolerate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, sink: &str, target: &str| {
            let text = format!(
                "pipeline = \"p\"\n[source]\nbrokers = \"b\"\ntopics = [\"t\"]\n[module]\n\
                 path = \"m.wasm\"\n[sink]\nurl = \"kafka://b:1\"\n{sink}\n[[sink.targets]]\n\
                 name = \"out\"\ncolumns = {{ n = \"integer\" }}\n{target}\n"
            );
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let old = write(
            "old.toml",
            "schema = \"s\"",
            "create = false\nmode = \"append\"\nkey = []",
        );
        let config = load(&old).unwrap();
        assert!(config.sink.settings.is_empty());
        assert!(config.sink.targets[0].settings.is_empty());
        // What was refused before still is.
        let upsert = write("upsert.toml", "", "mode = \"upsert\"\nkey = [\"n\"]");
        let said = load(&upsert).unwrap_err().to_string();
        assert!(
            said.contains("`key` is for SQL sinks, not Kafka sinks"),
            "{said}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
