//! The Redis sink's own fields: `lineage_keep` and `dead_letters_keep` in `[sink]`, and in each
//! target the commands its rows run (`[[sink.targets.redis]]`). Read here;
//! the rules over them are checked where the commands are compiled, once
//! (`render.rs`), so what the config check accepts is what the sink runs.
//!
//! It must not talk to Redis.

use crate::render::CompiledTarget;
use serde::Deserialize;
use sluice_core::config::section::read;
use sluice_core::config::{
    Bounded, ConfigError, KindSection, PipelineConfig, Place, StoreConnection,
};

/// The Redis sink (`redis://`, `rediss://`).
pub struct RedisSection;

/// The Redis sink's own fields of `[sink]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSinkFields {
    /// How many batches' lineage entries are kept per pipeline (the oldest
    /// are trimmed in the commit that adds one; `verify` and `shadow` see
    /// only these). Default 100000, at least 1. SQL sinks keep all.
    #[serde(default)]
    pub lineage_keep: Option<Bounded<1>>,
    /// How many dead letters are kept per pipeline (the oldest are trimmed
    /// in the commit that adds one, so a module that fails every record
    /// cannot fill the server). Default 100000, at least 1. SQL sinks keep
    /// all.
    #[serde(default)]
    pub dead_letters_keep: Option<Bounded<1>>,
}

/// A Redis target's own fields.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTargetFields {
    /// The commands every row of this target runs, in order
    /// (`[[sink.targets.redis]]`, at least one).
    #[serde(default)]
    pub redis: Vec<RedisCommandConfig>,
}

/// Lineage entries kept per pipeline when `sink.lineage_keep` is unset.
pub const DEFAULT_LINEAGE_KEEP: u64 = 100_000;

/// Dead letters kept per pipeline when `sink.dead_letters_keep` is unset.
pub const DEFAULT_DEAD_LETTERS_KEEP: u64 = 100_000;

impl KindSection for RedisSection {
    const FOR: &'static str = "Redis sinks";
    type Sink = RedisSinkFields;
    type Target = RedisTargetFields;

    fn check(config: &PipelineConfig) -> Result<(), ConfigError> {
        RedisSinkFields::of(&config.sink.store())?;
        for target in &config.sink.targets {
            CompiledTarget::new(target, &Self::target(target)?, config.sink.guarantee())?;
        }
        Ok(())
    }
}

impl RedisSinkFields {
    /// The fields of the store: `[sink]`'s, or none for `[state]`.
    pub fn of(store: &StoreConnection) -> Result<RedisSinkFields, ConfigError> {
        let fields: RedisSinkFields = read(&store.settings, &Place::Sink, RedisSection::FOR)?;
        if let Some(keep) = fields.lineage_keep {
            keep.check("sink.lineage_keep")?;
        }
        if let Some(keep) = fields.dead_letters_keep {
            keep.check("sink.dead_letters_keep")?;
        }
        Ok(fields)
    }

    /// Lineage entries kept per pipeline.
    pub fn lineage_keep(&self) -> u64 {
        self.lineage_keep
            .map_or(DEFAULT_LINEAGE_KEEP, |keep| keep.get())
    }

    /// Dead letters kept per pipeline.
    pub fn dead_letters_keep(&self) -> u64 {
        self.dead_letters_keep
            .map_or(DEFAULT_DEAD_LETTERS_KEEP, |keep| keep.get())
    }
}

/// One Redis command a target's rows run. Keys, fields, members and values
/// are templates: text with `{column}` placeholders (`{{`/`}}` for a
/// literal brace), checked against the target's columns at start. A value
/// is written as text: integers and floats in decimal, booleans as `1`/`0`,
/// blobs as their bytes; a null in a placeholder fails the batch.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisCommandConfig {
    /// `set`, `hset`, `hincrby`, `incrby`, `sadd`, `pfadd`, `zadd`,
    /// `zincrby`, `xadd` or `del`.
    pub command: RedisCommand,
    /// The key the command writes, e.g. `"seen:{day}"`. Must not render
    /// empty.
    pub key: String,
    /// The hash field (`hset`, `hincrby`).
    #[serde(default)]
    pub field: Option<String>,
    /// The value (`set`, `hset`).
    #[serde(default)]
    pub value: Option<String>,
    /// The member (`sadd`, `pfadd`, `zadd`, `zincrby`).
    #[serde(default)]
    pub member: Option<String>,
    /// The score (`zadd`): must render as a number.
    #[serde(default)]
    pub score: Option<String>,
    /// The increment (`hincrby`, `incrby`: an integer; `zincrby`: a
    /// number). Default: `"1"`.
    #[serde(default)]
    pub by: Option<String>,
    /// `set` only: expire the key this many seconds after the write.
    #[serde(default)]
    pub ttl_s: Option<Bounded<1>>,
    /// `xadd` only: the columns written as the entry's fields. Default:
    /// every column of the target.
    #[serde(default)]
    pub fields: Option<Vec<String>>,
}

/// The Redis commands a target may run.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum RedisCommand {
    Set,
    Hset,
    Hincrby,
    Incrby,
    Sadd,
    Pfadd,
    Zadd,
    Zincrby,
    Xadd,
    Del,
}

impl RedisCommand {
    pub fn as_str(self) -> &'static str {
        match self {
            RedisCommand::Set => "set",
            RedisCommand::Hset => "hset",
            RedisCommand::Hincrby => "hincrby",
            RedisCommand::Incrby => "incrby",
            RedisCommand::Sadd => "sadd",
            RedisCommand::Pfadd => "pfadd",
            RedisCommand::Zadd => "zadd",
            RedisCommand::Zincrby => "zincrby",
            RedisCommand::Xadd => "xadd",
            RedisCommand::Del => "del",
        }
    }

    /// True if running it twice leaves what running it once does: the
    /// only commands `at-least-once` (which may replay a batch) allows.
    pub fn is_idempotent(self) -> bool {
        !matches!(
            self,
            RedisCommand::Hincrby
                | RedisCommand::Incrby
                | RedisCommand::Zincrby
                | RedisCommand::Xadd
        )
    }

    /// The Redis type of the key it writes (as `TYPE` names it); `None`
    /// for `del`, which takes any.
    pub fn key_type(self) -> Option<&'static str> {
        match self {
            RedisCommand::Set | RedisCommand::Incrby => Some("string"),
            RedisCommand::Hset | RedisCommand::Hincrby => Some("hash"),
            RedisCommand::Sadd => Some("set"),
            // A HyperLogLog is a string to `TYPE`.
            RedisCommand::Pfadd => Some("string"),
            RedisCommand::Zadd | RedisCommand::Zincrby => Some("zset"),
            RedisCommand::Xadd => Some("stream"),
            RedisCommand::Del => None,
        }
    }

    /// The template arguments it needs, in order, by config field name.
    pub fn arguments(self) -> &'static [&'static str] {
        match self {
            RedisCommand::Set => &["value"],
            RedisCommand::Hset => &["field", "value"],
            RedisCommand::Hincrby => &["field", "by"],
            RedisCommand::Incrby => &["by"],
            RedisCommand::Sadd | RedisCommand::Pfadd => &["member"],
            RedisCommand::Zadd => &["score", "member"],
            RedisCommand::Zincrby => &["by", "member"],
            RedisCommand::Xadd | RedisCommand::Del => &[],
        }
    }
}

impl RedisCommandConfig {
    /// The template given for argument `name` (`by` defaults to `"1"`).
    pub fn argument(&self, name: &str) -> Option<String> {
        match name {
            "field" => self.field.clone(),
            "value" => self.value.clone(),
            "member" => self.member.clone(),
            "score" => self.score.clone(),
            "by" => Some(self.by.clone().unwrap_or_else(|| "1".into())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Redis pipeline whose one target has `target` (its commands), with
    /// `sink` added to `[sink]`.
    fn check(sink: &str, target: &str) -> Result<(), String> {
        let sink = format!("url = \"redis://127.0.0.1/0\"\n{sink}");
        let columns = "{ partition = \"integer\", key = \"blob\", n = \"real\" }";
        let config = sluice_core::testing::sink_config(&sink, "records", columns, target)
            .map_err(|e| e.to_string())?;
        RedisSection::check(&config).map_err(|e| e.to_string())
    }

    fn command(lines: &str) -> String {
        format!("[[sink.targets.redis]]\n{lines}\n")
    }

    #[test]
    fn each_command_rule_refuses_what_it_names() {
        let cases = [
            (
                "",
                command("command = \"sadd\"\nkey = \"k:{partition}\"\nmember = \"{key}\""),
                None,
            ),
            (
                "",
                command("command = \"set\"\nkey = \"k\"\nvalue = \"{n}\"\nttl_s = 5"),
                None,
            ),
            (
                "",
                command("command = \"xadd\"\nkey = \"s\"\nfields = [\"n\"]"),
                None,
            ),
            (
                "",
                command("command = \"zadd\"\nkey = \"z\"\nscore = \"2.5\"\nmember = \"{key}\""),
                None,
            ),
            (
                "lineage_keep = 5",
                command("command = \"del\"\nkey = \"k\""),
                None,
            ),
            (
                "dead_letters_keep = 5",
                command("command = \"del\"\nkey = \"k\""),
                None,
            ),
            (
                "",
                command("command = \"lpush\"\nkey = \"k\""),
                Some("unknown variant `lpush`"),
            ),
            (
                "",
                command("command = \"sadd\"\nkey = \"k:{part}\"\nmember = \"{key}\""),
                Some("names column `part`"),
            ),
            (
                "",
                command("command = \"sadd\"\nkey = \"\"\nmember = \"{key}\""),
                Some("must not be empty"),
            ),
            (
                "",
                command("command = \"sadd\"\nkey = \"k\""),
                Some("redis command 1 (`sadd`): `sadd` needs `member`"),
            ),
            (
                "",
                command("command = \"del\"\nkey = \"k\"\nvalue = \"v\""),
                Some("`del` takes no `value`"),
            ),
            (
                "",
                command("command = \"incrby\"\nkey = \"k\"\nby = \"two\""),
                Some("`by` = \"two\" is not a number"),
            ),
            (
                "",
                command("command = \"zadd\"\nkey = \"z\"\nscore = \"x\"\nmember = \"m\""),
                Some("`score` = \"x\" is not a number"),
            ),
            (
                "",
                command("command = \"set\"\nkey = \"k\"\nvalue = \"v\"\nttl_s = 0"),
                Some("`ttl_s` must be at least 1"),
            ),
            (
                "",
                command("command = \"xadd\"\nkey = \"s\"\nfields = []"),
                Some("`fields` must name at least one column"),
            ),
            (
                "",
                command("command = \"xadd\"\nkey = \"s\"\nfields = [\"x\"]"),
                Some("`fields` names `x`"),
            ),
            (
                "guarantee = \"at-least-once\"",
                command("command = \"hincrby\"\nkey = \"k\"\nfield = \"{partition}\""),
                Some("`hincrby` is not idempotent"),
            ),
            (
                "",
                String::new(),
                Some("needs at least one `[[sink.targets.redis]]` command"),
            ),
            (
                "lineage_keep = 0",
                command("command = \"del\"\nkey = \"k\""),
                Some("`sink.lineage_keep` must be at least 1"),
            ),
            (
                "dead_letters_keep = 0",
                command("command = \"del\"\nkey = \"k\""),
                Some("`sink.dead_letters_keep` must be at least 1"),
            ),
            (
                "",
                format!(
                    "mode = \"upsert\"\n{}",
                    command("command = \"del\"\nkey = \"k\"")
                ),
                Some("unknown field `mode` in target `records`: not a field of Redis sinks"),
            ),
        ];
        for (sink, target, refused) in cases {
            match (check(sink, &target), refused) {
                (Ok(()), None) => {}
                (Err(said), Some(says)) => assert!(said.contains(says), "{target}: {said}"),
                (got, expected) => panic!("{sink} / {target}: {got:?}, expected {expected:?}"),
            }
        }
    }
}
