//! `[sink]`, its targets and `[state]`: the part every sink kind shares
//! (where it connects, its prefix, its guarantee and lock timeout, the
//! targets' names and columns), and each kind's own fields, kept as a table
//! for the backend crate that owns the kind to read (see
//! [`section`](super::section)).
//!
//! It must not know any kind's own fields or rules: a new sink kind is a
//! [`SinkKind`] variant, never a field here.

use super::{Bounded, ConfigError};
use crate::sink::{SinkError, SinkKind};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// The sink: where outputs, dead letters, lineage and offsets are committed.
/// Unknown fields are refused by the sink kind that reads its own.
#[derive(Debug, Clone, Deserialize)]
pub struct SinkConfig {
    /// The sink kind: `sqlite`, `postgres`, `mysql` (`mariadb` is the
    /// same), `redis`, `kafka` or `stdout`. Default: the kind the URL's
    /// scheme names; if both are given they must agree.
    #[serde(default)]
    pub kind: Option<SinkKind>,
    /// Database URL: `sqlite://PATH` (relative to the config file; created
    /// if missing) is the embedded default; `postgres://user@host:port/db`
    /// or `mysql://user:password@host:port/db` (MariaDB too);
    /// `redis://[:password@]host:port/db` for Redis;
    /// `kafka://host:port[,host:port]` for Kafka topics (docs/kafka.md);
    /// `stdout://` prints rows (at-least-once, see `format`). A password may also come from
    /// the URL's usual environment (`PGPASSWORD`).
    pub url: String,
    /// Prefix of sluice's own tables (checkpoints, batches, ranges, dead
    /// letters), or on Redis of its own keys (`<prefix>checkpoints:<pipeline>`
    /// and so on).
    #[serde(default = "default_prefix")]
    pub table_prefix: String,
    /// `exactly-once` (default): rows, dead letters, lineage and offsets in
    /// one transaction (on Redis: one script; on Kafka: one producer
    /// transaction). `at-least-once`: rows first, offsets in a second
    /// transaction (a crash in between writes rows twice); on SQL for
    /// comparison, on Redis (alias `idempotent`) for idempotent commands
    /// only, whose replay writes the same values; on Kafka an idempotent
    /// producer without transactions, offsets and lineage in `[state]`.
    /// The stdout sink is at-least-once, its default and only guarantee.
    /// Read it with [`SinkConfig::guarantee`].
    #[serde(default, rename = "guarantee")]
    pub given_guarantee: Option<Guarantee>,
    /// How long, in milliseconds, one of this pipeline's transactions may
    /// wait for a lock, or sit open while its process is silent (frozen,
    /// paused, cut off), before the database ends it (100 to 3600000).
    /// Bounds how long a stalled instance can stop the others: its locks
    /// are released and, when it wakes, its commit fails and is resolved
    /// from the checkpoint. Postgres: `lock_timeout` and
    /// `idle_in_transaction_session_timeout`; MariaDB:
    /// `innodb_lock_wait_timeout` and `idle_transaction_timeout` (whole
    /// seconds, at least 1; MySQL: `wait_timeout`); SQLite: `busy_timeout`
    /// (a frozen writer blocks the file until it wakes: SQLite is for one
    /// host); Redis: the longest wait for a reply, after which a batch's
    /// outcome is read back from the checkpoints.
    #[serde(default = "default_lock_timeout_ms")]
    pub lock_timeout_ms: Bounded<100, 3_600_000>,
    /// The targets a module may write to.
    pub targets: Vec<TargetConfig>,
    /// The sink kind's own fields (SQL: `schema`; Redis: `lineage_keep`;
    /// Kafka: `dead_letter_topic`, `lineage_topic`; stdout: `format`),
    /// read and checked by the crate that owns the kind.
    #[serde(flatten)]
    pub settings: toml::Table,
}

/// One named output target of the module. What a row of it becomes (a
/// table's row, Redis commands, a Kafka record, a printed line) is the
/// sink kind's own part of the target, read by its crate.
#[derive(Debug, Clone, Deserialize)]
pub struct TargetConfig {
    /// Target name the module emits rows for.
    pub name: String,
    /// Columns and their types (`integer`, `real`, `text`, `blob`,
    /// `boolean`). The module's rows must carry exactly these columns.
    pub columns: BTreeMap<String, ColumnType>,
    /// The sink kind's own fields of the target (SQL: `table`, `mode`,
    /// `key`, `create`; Redis: `redis`; Kafka: `kafka`).
    #[serde(flatten)]
    pub settings: toml::Table,
}

/// Column types a target may declare.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    Integer,
    Real,
    Text,
    Blob,
    Boolean,
}

impl ColumnType {
    /// The name the config gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            ColumnType::Integer => "integer",
            ColumnType::Real => "real",
            ColumnType::Text => "text",
            ColumnType::Blob => "blob",
            ColumnType::Boolean => "boolean",
        }
    }
}

/// The delivery guarantee of a sink.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Guarantee {
    /// Outputs and offsets commit together.
    #[default]
    ExactlyOnce,
    /// Outputs commit before offsets; a crash between them duplicates.
    /// (`idempotent` is the same: on Redis it allows only idempotent
    /// commands, so a replay writes the same values again.)
    #[serde(alias = "idempotent")]
    AtLeastOnce,
}

/// A state store apart from the sink (`[state]`): say, one database every
/// pipeline's modules and activations live in.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// `sqlite://PATH` (relative to the config file; created if missing),
    /// `postgres://user@host:port/db`, `mysql://user@host:port/db` or
    /// `redis://host:port/db`.
    pub url: String,
    /// Prefix of the store's tables (`<prefix>modules`, `<prefix>versions`).
    #[serde(default = "default_prefix")]
    pub table_prefix: String,
}

/// Where a store lives and how it is reached: what a backend opens to keep
/// modules, lineage or checkpoints, in the sink's database or in `[state]`.
#[derive(Debug, Clone)]
pub struct StoreConnection {
    /// The store's URL; its scheme names the kind.
    pub url: String,
    /// Prefix of sluice's tables (Redis: keys) in it.
    pub table_prefix: String,
    /// How long a transaction may wait for a lock or a reply (`[sink]`'s).
    pub lock_timeout_ms: u64,
    /// The kind's own fields where they place the store (SQL: `schema`):
    /// the sink's for the sink's database, none for `[state]`.
    pub settings: toml::Table,
}

impl StoreConnection {
    /// The kind of store the URL names.
    pub fn kind(&self) -> Result<SinkKind, SinkError> {
        SinkKind::of_url(&self.url)
    }
}

/// What a sink that keeps its own checkpoints writes besides them: the
/// targets, under a guarantee. A store serving another sink as its
/// `[state]` writes [`Writes::NOTHING`].
#[derive(Debug, Clone, Copy)]
pub struct Writes<'a> {
    pub guarantee: Guarantee,
    pub targets: &'a [TargetConfig],
}

impl Writes<'_> {
    /// No targets: the store keeps checkpoints and lineage only.
    pub const NOTHING: Writes<'static> = Writes {
        guarantee: Guarantee::ExactlyOnce,
        targets: &[],
    };
}

impl SinkConfig {
    /// The fields every kind shares; the rest of `[sink]` is the kind's own
    /// (`settings`).
    pub const COMMON: &'static [&'static str] = &[
        "kind",
        "url",
        "table_prefix",
        "guarantee",
        "lock_timeout_ms",
        "targets",
    ];

    /// The sink kind: `kind` if set (it must agree with the URL's scheme),
    /// else the one the URL names.
    pub fn kind(&self) -> Result<SinkKind, SinkError> {
        let of_url = SinkKind::of_url(&self.url)?;
        match self.kind {
            Some(kind) if kind != of_url => Err(SinkError::Config(format!(
                "`sink.kind` is `{}` but `sink.url` is a {} URL (`{}`)",
                kind.as_str(),
                of_url.as_str(),
                crate::sink::redact_url(&self.url)
            ))),
            _ => Ok(of_url),
        }
    }

    /// The sink's database as a store.
    pub fn store(&self) -> StoreConnection {
        StoreConnection {
            url: self.url.clone(),
            table_prefix: self.table_prefix.clone(),
            lock_timeout_ms: self.lock_timeout_ms.get(),
            settings: self.settings.clone(),
        }
    }

    /// The guarantee: as given, else the kind's default (at-least-once for
    /// the stdout sink, which can give no other; exactly-once for the rest).
    pub fn guarantee(&self) -> Guarantee {
        match (self.given_guarantee, self.kind()) {
            (Some(given), _) => given,
            (None, Ok(SinkKind::Stdout)) => Guarantee::AtLeastOnce,
            (None, _) => Guarantee::ExactlyOnce,
        }
    }

    /// What the sink writes: its targets, under its guarantee.
    pub fn writes(&self) -> Writes<'_> {
        Writes {
            guarantee: self.guarantee(),
            targets: &self.targets,
        }
    }

    /// The checks every kind shares: the lock timeout's bounds, at least
    /// one target, names unique, columns declared.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        self.lock_timeout_ms.check("sink.lock_timeout_ms")?;
        if self.targets.is_empty() {
            return invalid("`sink.targets` must declare at least one target".into());
        }
        let mut names = BTreeSet::new();
        for t in &self.targets {
            if !names.insert(&t.name) {
                return invalid(format!("target `{}` is declared twice", t.name));
            }
            if t.columns.is_empty() {
                return invalid(format!("target `{}` declares no columns", t.name));
            }
        }
        Ok(())
    }
}

impl TargetConfig {
    /// The fields every kind's targets share; the rest is the kind's own
    /// (`settings`).
    pub const COMMON: &'static [&'static str] = &["name", "columns"];
}

impl StateConfig {
    /// The `[state]` database as a store; a transaction there waits as
    /// long as the sink's do.
    pub fn store(&self, sink: &SinkConfig) -> StoreConnection {
        StoreConnection {
            url: self.url.clone(),
            table_prefix: self.table_prefix.clone(),
            lock_timeout_ms: sink.lock_timeout_ms.get(),
            settings: toml::Table::new(),
        }
    }
}

fn default_lock_timeout_ms() -> Bounded<100, 3_600_000> {
    Bounded::at(10_000)
}

pub(super) fn default_prefix() -> String {
    "sluice_".to_string()
}
