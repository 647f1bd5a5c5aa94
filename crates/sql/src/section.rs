//! The SQL sinks' own fields: `schema` and `state_journal_batches` in
//! `[sink]`; `table`, `mode`, `key` and `create` in each target. Read here and checked here, once, for
//! SQLite, Postgres and MySQL alike.
//!
//! It must not connect: what needs the database (the table's columns, the
//! schema's existence) is checked when the sink opens.

use crate::config::section::read;
use crate::config::{
    Bounded, ColumnType, ConfigError, KindSection, PipelineConfig, Place, StoreConnection,
    TargetConfig,
};
use serde::Deserialize;

/// The SQL sinks (`sqlite`, `postgres`, `mysql`).
pub struct SqlSection;

/// A SQL sink's own fields of `[sink]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlSinkFields {
    /// Schema (Postgres) or database (MySQL) holding sluice's tables and the
    /// targets' tables; created if missing. Default: the connection's
    /// current schema/database. SQLite has none.
    #[serde(default)]
    pub schema: Option<String>,
    /// How many batches' keyed-state changes a partition keeps in the state
    /// journal (`<prefix>state_journal`, one row a batch) before they are
    /// merged into the state table in one write: a key rewritten in every
    /// batch (a window's aggregate) reaches the table once a merge instead
    /// of once a batch. A partition whose merges find few keys rewritten (a
    /// dedupe's first sightings) writes the table directly for a while.
    /// Every read of a partition's state from the sink reads its journal
    /// too, so it suits state that fits `limits.state_cache_mib` (read
    /// once, when a partition is taken). 1 to 1000; default 1: the state
    /// table in every batch, no journal. 8 for windows (docs/state.md).
    #[serde(default = "default_state_journal_batches")]
    pub state_journal_batches: Bounded<1, 1000>,
}

impl Default for SqlSinkFields {
    fn default() -> Self {
        SqlSinkFields {
            schema: None,
            state_journal_batches: default_state_journal_batches(),
        }
    }
}

fn default_state_journal_batches() -> Bounded<1, 1000> {
    Bounded::at(1)
}

/// A SQL target's own fields: which table its rows go to, and how.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlTargetFields {
    /// Table the rows go to. Default: the target name.
    #[serde(default)]
    pub table: Option<String>,
    /// How rows are applied.
    #[serde(default)]
    pub mode: WriteMode,
    /// Key columns (required for `upsert`, `accumulate` and `delete`).
    #[serde(default)]
    pub key: Vec<String>,
    /// Create the table if it does not exist.
    #[serde(default = "yes")]
    pub create: bool,
}

/// How rows of a target are applied to its table.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum WriteMode {
    /// Insert every row.
    #[default]
    Append,
    /// Insert, or replace the non-key columns of the row with the same key.
    Upsert,
    /// Insert, or add the non-key (numeric) columns to the row with the same key.
    Accumulate,
    /// Delete the rows with these keys.
    Delete,
}

fn yes() -> bool {
    true
}

impl KindSection for SqlSection {
    const FOR: &'static str = "SQL sinks";
    type Sink = SqlSinkFields;
    type Target = SqlTargetFields;

    fn check(config: &PipelineConfig) -> Result<(), ConfigError> {
        Self::sink(&config.sink)?
            .state_journal_batches
            .check("sink.state_journal_batches")?;
        for target in &config.sink.targets {
            Self::target(target)?.check(target)?;
        }
        Ok(())
    }
}

impl SqlSinkFields {
    /// The fields of the store's database: `[sink]`'s, or none for
    /// `[state]`.
    pub fn of(store: &StoreConnection) -> Result<SqlSinkFields, ConfigError> {
        let fields: SqlSinkFields = read(&store.settings, &Place::Sink, SqlSection::FOR)?;
        fields
            .state_journal_batches
            .check("sink.state_journal_batches")?;
        Ok(fields)
    }
}

impl SqlTargetFields {
    /// `target`'s fields, read and checked.
    pub fn of(target: &TargetConfig) -> Result<SqlTargetFields, ConfigError> {
        let fields = SqlSection::target(target)?;
        fields.check(target)?;
        Ok(fields)
    }

    /// The table rows of `target` go to.
    pub fn table<'a>(&'a self, target: &'a TargetConfig) -> &'a str {
        self.table.as_deref().unwrap_or(&target.name)
    }

    /// The key is among the columns; a mode that finds rows by key has
    /// one; `accumulate` adds numbers only.
    fn check(&self, target: &TargetConfig) -> Result<(), ConfigError> {
        let invalid = |m: String| {
            Err(ConfigError::Invalid(format!(
                "target `{}`: {m}",
                target.name
            )))
        };
        if let Some(k) = self.key.iter().find(|k| !target.columns.contains_key(*k)) {
            return invalid(format!("key column `{k}` is not among its columns"));
        }
        if self.mode != WriteMode::Append && self.key.is_empty() {
            return invalid(format!("mode {:?} needs `key` columns", self.mode));
        }
        if self.mode == WriteMode::Accumulate {
            let numeric = |ty: &ColumnType| matches!(ty, ColumnType::Integer | ColumnType::Real);
            if let Some((name, ty)) = target
                .columns
                .iter()
                .find(|(name, ty)| !self.key.contains(name) && !numeric(ty))
            {
                return invalid(format!(
                    "accumulate adds non-key columns, but `{name}` is {ty:?}"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COLUMNS: &str = "{ word = \"text\", n = \"integer\" }";

    fn config(sink: &str, target: &str) -> Result<PipelineConfig, String> {
        let sink = format!("url = \"sqlite://x.db\"\n{sink}");
        sluice_core::testing::sink_config(&sink, "out", COLUMNS, target).map_err(|e| e.to_string())
    }

    fn check(sink: &str, target: &str) -> Result<(), String> {
        SqlSection::check(&config(sink, target)?).map_err(|e| e.to_string())
    }

    #[test]
    fn sql_rules_each_refuse_what_they_name() {
        let cases = [
            ("", "", None),
            (
                "schema = \"s\"",
                "mode = \"upsert\"\nkey = [\"word\"]",
                None,
            ),
            ("", "mode = \"accumulate\"\nkey = [\"word\"]", None),
            ("", "table = \"t\"\ncreate = false", None),
            (
                "",
                "key = [\"nope\"]",
                Some("key column `nope` is not among its columns"),
            ),
            (
                "",
                "mode = \"upsert\"",
                Some("mode Upsert needs `key` columns"),
            ),
            (
                "",
                "mode = \"delete\"",
                Some("mode Delete needs `key` columns"),
            ),
            (
                "",
                "mode = \"accumulate\"\nkey = [\"n\"]",
                Some("accumulate adds non-key columns, but `word` is Text"),
            ),
            ("", "mode = \"merge\"", Some("unknown variant `merge`")),
            (
                "colour = 1",
                "",
                Some("unknown field `colour` in `[sink]`: not a field of SQL sinks"),
            ),
            (
                "",
                "colour = 1",
                Some("unknown field `colour` in target `out`: not a field of SQL sinks"),
            ),
        ];
        for (sink, target, refused) in cases {
            match (check(sink, target), refused) {
                (Ok(()), None) => {}
                (Err(said), Some(says)) => assert!(said.contains(says), "{target}: {said}"),
                (got, expected) => panic!("{sink} / {target}: {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn the_table_defaults_to_the_target_name_and_state_has_no_schema() {
        let config = config("schema = \"s\"", "").unwrap();
        let target = &config.sink.targets[0];
        let fields = SqlTargetFields::of(target).unwrap();
        assert_eq!((fields.table(target), fields.create), ("out", true));
        let schema = SqlSinkFields::of(&config.sink.store()).unwrap().schema;
        assert_eq!(schema.as_deref(), Some("s"));
        let state = crate::config::StateConfig {
            url: "sqlite://state.db".into(),
            table_prefix: "p_".into(),
        };
        let schema = SqlSinkFields::of(&state.store(&config.sink))
            .unwrap()
            .schema;
        assert_eq!(schema, None);
    }
}
