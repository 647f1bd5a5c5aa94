//! The pipeline configuration (TOML): what a user writes, validated up front.
//!
//! Owns parsing, defaults and the checks that need no network. Every field's
//! `///` comment is the user documentation (the README's config reference
//! says the same, shorter, and must be kept in step with it by hand). It
//! must not connect to anything.

use crate::sink::{SinkError, SinkKind};
use crate::template::Template;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A configuration error a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// One pipeline: a Kafka source, a Wasm transform and a sink.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Name of the pipeline. Checkpoints, lineage and dead letters are stored
    /// under this name, so renaming a pipeline starts it from scratch.
    pub pipeline: String,
    /// Where records come from.
    pub source: SourceConfig,
    /// The Wasm transform.
    pub module: ModuleConfig,
    /// Per-batch sandbox limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Where results and offsets are committed.
    pub sink: SinkConfig,
    /// The control plane (HTTP API for deploy, activate, rollback, status).
    /// Absent: not served; versions can still be managed through another
    /// instance of the pipeline that serves it.
    #[serde(default)]
    pub control: Option<ControlConfig>,
    /// Where the module store (components and activations) lives, if not
    /// in the sink's own database. Lineage and dead letters stay with the
    /// sink whatever this says: they commit in the sink's batch
    /// transaction. The stdout sink keeps everything here (checkpoints
    /// too); without `[state]` it uses `.sluice-state.db` next to the
    /// config.
    #[serde(default)]
    pub state: Option<StateConfig>,
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

impl StateConfig {
    /// The connection settings of this store, in the shape the SQL
    /// backends open (no targets: nothing but state is written there).
    pub fn as_sink(&self, sink: &SinkConfig) -> SinkConfig {
        SinkConfig {
            kind: None,
            url: self.url.clone(),
            table_prefix: self.table_prefix.clone(),
            schema: None,
            guarantee: Guarantee::ExactlyOnce,
            lock_timeout_ms: sink.lock_timeout_ms,
            lineage_keep: None,
            format: None,
            dead_letter_topic: None,
            lineage_topic: None,
            targets: Vec::new(),
        }
    }
}

/// The control plane's HTTP API, served by `sluice run`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// Address to listen on, e.g. `127.0.0.1:7878`. Port 0 picks a free
    /// port (logged at start).
    pub listen: String,
    /// Bearer token every write (deploy, activate, rollback) must carry.
    /// Prefer the `SLUICE_CONTROL_TOKEN` environment variable, which wins
    /// over this field. With neither set, every write is refused.
    #[serde(default)]
    pub token: Option<String>,
    /// Largest component accepted by a deploy, in bytes.
    #[serde(default = "default_max_module_bytes")]
    pub max_module_bytes: usize,
    /// Most connections the API keeps open at once; one more is closed at
    /// once. Idle connections, and clients that take over 10 s to send a
    /// request's headers, are closed.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Longest a request may take, upload and validation included, in
    /// milliseconds; past it the answer is 408.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_max_connections() -> usize {
    256
}

fn default_request_timeout_ms() -> u64 {
    60_000
}

fn default_max_module_bytes() -> usize {
    32 * 1024 * 1024
}

impl ControlConfig {
    /// The write token: `SLUICE_CONTROL_TOKEN`, else `token`; empty = none.
    pub fn effective_token(&self) -> Option<String> {
        std::env::var("SLUICE_CONTROL_TOKEN")
            .ok()
            .or_else(|| self.token.clone())
            .filter(|t| !t.is_empty())
    }
}

/// The Kafka source.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Bootstrap brokers, comma separated (`host:port,host:port`).
    pub brokers: String,
    /// Topics to read.
    pub topics: Vec<String>,
    /// Consumer group used to share partitions between instances of this
    /// pipeline. Its committed offsets are never used as the checkpoint.
    /// Default: `sluice-<pipeline>`.
    #[serde(default)]
    pub group_id: Option<String>,
    /// Upper bound of a batch, in offsets per partition.
    #[serde(default = "default_max_records")]
    pub max_records_per_partition: u32,
    /// Upper bound of a batch across all its partitions, in offsets,
    /// shared fairly between them. Default: none (each partition up to
    /// `max_records_per_partition`), except on Redis, where a batch is one
    /// script and Redis serves no other client while it runs: 50000 there.
    #[serde(default)]
    pub max_records_per_batch: Option<u32>,
    /// How long to gather records before cutting a batch, in milliseconds.
    #[serde(default = "default_batch_interval")]
    pub batch_interval_ms: u64,
    /// Where a partition without a checkpoint starts: `earliest` or `latest`.
    #[serde(default)]
    pub start: StartPosition,
    /// Extra librdkafka properties, passed through as given (for example
    /// `"security.protocol" = "ssl"`). sluice defaults `session.timeout.ms`
    /// to 10000, `heartbeat.interval.ms` to 1000, `max.partition.fetch.bytes`
    /// to 8388608, `fetch.queue.backoff.ms` to 10 and `fetch.wait.max.ms` to
    /// `batch_interval_ms` within 10..=100 (how long the broker may hold a
    /// fetch that finds nothing new); all may be set here.
    /// Properties sluice relies on for exactly-once (see
    /// [`RESERVED_PROPERTIES`]) are refused.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Static assignment, topic -> partitions, instead of the consumer
    /// group: the instance reads exactly these partitions whatever other
    /// instances do. Two instances given the same partition race for every
    /// range; the sink's offset compare-and-set lets one of them commit it
    /// and fences the other. Meant for tests and manual recovery, not for
    /// scaling (use the group for that).
    #[serde(default)]
    pub assign: Option<BTreeMap<String, Vec<i32>>>,
    /// Static membership in the consumer group (Kafka's
    /// `group.instance.id`): a stable name for this instance, unique among
    /// the pipeline's instances (say, the host name). An instance restarted
    /// under the same name takes its partitions back at once instead of
    /// after its old session times out and the group rebalances. The
    /// environment variable `SLUICE_INSTANCE_ID` wins over this field, so
    /// one config file can serve several instances. Default: none (dynamic
    /// membership).
    #[serde(default)]
    pub instance_id: Option<String>,
}

impl SourceConfig {
    /// The static member name: `SLUICE_INSTANCE_ID`, else `instance_id`;
    /// empty = none.
    pub fn effective_instance_id(&self) -> Option<String> {
        std::env::var("SLUICE_INSTANCE_ID")
            .ok()
            .or_else(|| self.instance_id.clone())
            .filter(|id| !id.is_empty())
    }
}

/// Where a partition without a checkpoint starts.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StartPosition {
    /// The oldest record still in the log.
    #[default]
    Earliest,
    /// Only records produced after the partition is first assigned.
    Latest,
}

/// The Wasm transform and its parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleConfig {
    /// Path of the component (`.wasm`), relative to the config file.
    pub path: PathBuf,
    /// Parameters handed to the module's `init`, as a table (sent as JSON).
    #[serde(default)]
    pub params: toml::Table,
    /// Directory for compiled modules. Default: `.sluice-cache` next to the
    /// config file.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
}

/// Sandbox limits, applied to every batch.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Fuel per batch (roughly one unit per Wasm instruction). Running out is
    /// deterministic: the same batch fails the same way on every retry.
    #[serde(default = "default_fuel")]
    pub fuel_per_batch: u64,
    /// Wall-clock backstop per batch, in milliseconds. Hitting it is treated
    /// as retryable (the machine may have been slow), never as output.
    #[serde(default = "default_timeout")]
    pub batch_timeout_ms: u64,
    /// Linear memory cap per instance, in MiB.
    #[serde(default = "default_memory")]
    pub max_memory_mib: u64,
    /// Wasm stack size, in KiB (64 to 8192); a module that recurses deeper
    /// traps.
    #[serde(default = "default_stack")]
    pub max_stack_kib: u64,
    /// What to do with a record that fails the module on its own: one that
    /// makes it trap (twice), run out of fuel, pass the memory cap, hit the
    /// deadline (twice), write a non-finite float, more than
    /// `max_output_mib` or output that breaks the contract (text that is
    /// not UTF-8, a wrong number of values, a target or column the sink
    /// does not declare, a type that does not fit). `dead-letter`: find it
    /// by bisecting the batch, store it as a dead letter of that kind
    /// (`trap`, `fuel`, `memory`, `deadline`, `non-finite`, `output`,
    /// `contract`) and commit the rest, within `isolation_budget` and
    /// `max_poison_share`; `fail`: stop the pipeline. (`on_trap`, its
    /// former name, is still accepted.)
    #[serde(default, alias = "on_trap")]
    pub on_poison: OnPoison,
    /// Most output one batch may hand the host, in MiB (values, lengths,
    /// null flags, rejection reasons); defaults to `max_memory_mib`. More
    /// fails the run before the sink copies it: bisected like a poison, a
    /// record whose output alone is larger becomes an `output` dead letter;
    /// a batch whose records are each fine but together too large fails,
    /// saying to lower `source.max_records_per_partition`.
    #[serde(default)]
    pub max_output_mib: Option<u64>,
    /// Wall-clock budget for compiling a module, in milliseconds (100 to
    /// 3600000). The `sluice` binary compiles in a child process of lower
    /// priority that is killed past it, so a module made to compile slowly
    /// costs a host's cores at most this long, and is refused.
    #[serde(default = "default_compile_timeout")]
    pub compile_timeout_ms: u64,
    /// Memory budget for compiling a module, in MiB (128 to 65536): the
    /// compiling child's address-space limit. A module that needs more is
    /// refused.
    #[serde(default = "default_compile_memory")]
    pub compile_memory_mib: u64,
    /// How much isolating one batch's poison records may cost before the
    /// host decides the module, not the records, is at fault (1 to 1000).
    /// Counted in isolations of a record that exhausts a limit on its own
    /// (fuel, memory or the deadline): in a batch of n records that takes
    /// about log2(n) + 2 runs, each spending a whole batch budget; a run
    /// that ends otherwise (passes, traps, breaks the output contract)
    /// counts the share of `batch_timeout_ms` it took. Past the budget the
    /// batch is not committed and the pipeline stalls (see
    /// `max_poison_share`).
    #[serde(default = "default_isolation_budget")]
    pub isolation_budget: u32,
    /// Most of a batch's records that may be isolated as poison, as a share
    /// (over 0, at most 1; never fewer than 8 records). A batch where more
    /// of the records fail on their own is not committed: the module is at
    /// fault. A running pipeline
    /// then stalls (nothing of the batch is committed; `status`, the status
    /// page and `sluice_stalled` say why, naming the version) until another
    /// version is activated (`sluice rollback`); `run --until-caught-up`
    /// exits with the reason. 1 never decides by share.
    #[serde(default = "default_max_poison_share")]
    pub max_poison_share: f64,
}

/// What to do with records that fail the module on their own.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum OnPoison {
    #[default]
    DeadLetter,
    Fail,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            fuel_per_batch: default_fuel(),
            batch_timeout_ms: default_timeout(),
            max_memory_mib: default_memory(),
            max_stack_kib: default_stack(),
            on_poison: OnPoison::default(),
            max_output_mib: None,
            compile_timeout_ms: default_compile_timeout(),
            compile_memory_mib: default_compile_memory(),
            isolation_budget: default_isolation_budget(),
            max_poison_share: default_max_poison_share(),
        }
    }
}

/// The sink: where outputs, dead letters, lineage and offsets are committed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Schema (Postgres) or database (MySQL) holding sluice's tables and the
    /// targets' tables; created if missing. Default: the connection's
    /// current schema/database. SQLite has none.
    #[serde(default)]
    pub schema: Option<String>,
    /// `exactly-once` (default): rows, dead letters, lineage and offsets in
    /// one transaction (on Redis: one script; on Kafka: one producer
    /// transaction). `at-least-once`: rows first, offsets in a second
    /// transaction (a crash in between writes rows twice); on SQL for
    /// comparison, on Redis (alias `idempotent`) for idempotent commands
    /// only, whose replay writes the same values; on Kafka an idempotent
    /// producer without transactions, offsets and lineage in `[state]`.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// How long, in milliseconds, one of this pipeline's transactions may
    /// wait for a lock, or sit open while its process is silent (frozen,
    /// paused, cut off), before the database ends it. Bounds how long a
    /// stalled instance can stop the others: its locks are released and,
    /// when it wakes, its commit fails and is resolved from the checkpoint.
    /// Postgres: `lock_timeout` and `idle_in_transaction_session_timeout`;
    /// MariaDB: `innodb_lock_wait_timeout` and `idle_transaction_timeout`
    /// (whole seconds, at least 1; MySQL: `wait_timeout`); SQLite:
    /// `busy_timeout` (a frozen writer blocks the file until it wakes: SQLite
    /// is for one host); Redis: the longest wait for a reply, after which
    /// a batch's outcome is read back from the checkpoints.
    #[serde(default = "default_lock_timeout_ms")]
    pub lock_timeout_ms: u64,
    /// stdout: `json` (default: one JSON object per row and line) or
    /// `table` (aligned columns per batch, for a terminal).
    #[serde(default)]
    pub format: Option<StdoutFormat>,
    /// Redis: how many batches' lineage entries are kept per pipeline
    /// (the oldest are trimmed in the commit that adds one; `verify` and
    /// `shadow` see only these). Default 100000. SQL sinks keep all.
    #[serde(default)]
    pub lineage_keep: Option<u64>,
    /// Kafka: the topic dead letters go to, in the batch's transaction
    /// (the record's own key and value, the cause in `sluice.*` headers).
    /// Default: `<pipeline>.dead-letters`. It must exist.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Kafka: the topic lineage goes to, one JSON entry per batch keyed by
    /// the pipeline, in the batch's transaction. Keep it time- or
    /// size-retained (`cleanup.policy=delete`), not compacted: compaction
    /// by pipeline would keep only the newest batch; `verify` and `shadow`
    /// see what retention keeps. Default: `<pipeline>.lineage`. It must
    /// exist.
    #[serde(default)]
    pub lineage_topic: Option<String>,
    /// The targets a module may write to.
    pub targets: Vec<TargetConfig>,
}

/// How the stdout sink prints rows.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StdoutFormat {
    /// One JSON object per row and line.
    #[default]
    Json,
    /// A header per batch, then each target's rows in aligned columns.
    Table,
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

/// One named output target of the module, mapped to a table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Target name the module emits rows for.
    pub name: String,
    /// Table the rows go to. Default: the target name.
    #[serde(default)]
    pub table: Option<String>,
    /// How rows are applied.
    #[serde(default)]
    pub mode: WriteMode,
    /// Key columns (required for `upsert`, `accumulate` and `delete`).
    #[serde(default)]
    pub key: Vec<String>,
    /// Columns and their SQL types (`integer`, `real`, `text`, `blob`,
    /// `boolean`). The module's rows must carry exactly these columns.
    pub columns: BTreeMap<String, ColumnType>,
    /// Create the table if it does not exist (SQL sinks).
    #[serde(default = "yes")]
    pub create: bool,
    /// Redis sinks: the commands every row of this target runs, in order
    /// (`[[sink.targets.redis]]`, at least one). SQL sinks refuse it.
    #[serde(default)]
    pub redis: Vec<RedisCommandConfig>,
    /// Kafka sinks: the topic and record layout of this target's rows
    /// (`[sink.targets.kafka]`; default: the target name as topic, the row
    /// as a JSON object as value, no key). Other sinks refuse it.
    #[serde(default)]
    pub kafka: Option<KafkaTargetConfig>,
}

/// How a Kafka target's rows become records. Records are partitioned by
/// key (librdkafka's `murmur2_random`, as the Java client does: one key,
/// one partition; a null key spreads).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaTargetConfig {
    /// The topic the rows go to. Default: the target name. It must exist.
    #[serde(default)]
    pub topic: Option<String>,
    /// The column whose cell is the record key: text and blob as their
    /// bytes, integers in decimal. Default: none (a null key).
    #[serde(default)]
    pub key: Option<String>,
    /// `"json"` (default): the row as one JSON object of its columns; or
    /// a column (text or blob) whose bytes are the value as they are.
    #[serde(default)]
    pub value: Option<String>,
    /// Columns written as record headers (name = column, value = the cell
    /// as the key is written; a null cell is a null header).
    #[serde(default)]
    pub headers: Vec<String>,
}

/// What a Kafka record's value is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KafkaValue<'a> {
    /// The row as one JSON object.
    Json,
    /// One column's bytes.
    Column(&'a str),
}

impl KafkaTargetConfig {
    /// The value layout `value` names.
    pub fn value(&self) -> KafkaValue<'_> {
        match self.value.as_deref() {
            None | Some("json") => KafkaValue::Json,
            Some(column) => KafkaValue::Column(column),
        }
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
    pub ttl_s: Option<u64>,
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

    fn validate(&self, target: &TargetConfig, guarantee: Guarantee) -> Result<(), String> {
        let command = self.command.as_str();
        let columns = target.columns.keys();
        Template::parse(&self.key, columns.clone()).map_err(|e| format!("`key`: {e}"))?;
        let needed = self.command.arguments();
        let given = [
            ("field", self.field.is_some()),
            ("value", self.value.is_some()),
            ("member", self.member.is_some()),
            ("score", self.score.is_some()),
            ("by", self.by.is_some()),
            ("ttl_s", self.ttl_s.is_some()),
            ("fields", self.fields.is_some()),
        ];
        let allowed_extra: &[&str] = match self.command {
            RedisCommand::Set => &["ttl_s"],
            RedisCommand::Xadd => &["fields"],
            _ => &[],
        };
        for (name, is_given) in given {
            if is_given && !needed.contains(&name) && !allowed_extra.contains(&name) {
                return Err(format!("`{command}` takes no `{name}`"));
            }
        }
        for name in needed {
            let template = self
                .argument(name)
                .ok_or_else(|| format!("`{command}` needs `{name}`"))?;
            let parsed = Template::parse(&template, columns.clone())
                .map_err(|e| format!("`{name}`: {e}"))?;
            if let Some(text) = parsed.literal() {
                let number_ok = match (*name, self.command) {
                    ("by", RedisCommand::Zincrby) | ("score", _) => text.parse::<f64>().is_ok(),
                    ("by", _) => text.parse::<i64>().is_ok(),
                    _ => true,
                };
                if !number_ok {
                    return Err(format!("`{name}` = {text:?} is not a number"));
                }
            }
        }
        if self.ttl_s == Some(0) {
            return Err("`ttl_s` must be at least 1".into());
        }
        if let Some(fields) = &self.fields {
            if fields.is_empty() {
                return Err("`fields` must name at least one column".into());
            }
            if let Some(f) = fields.iter().find(|f| !target.columns.contains_key(*f)) {
                return Err(format!(
                    "`fields` names `{f}`, which the target does not declare"
                ));
            }
        }
        if guarantee == Guarantee::AtLeastOnce && !self.command.is_idempotent() {
            return Err(format!(
                "`{command}` is not idempotent, and `guarantee = \"at-least-once\"` may run a \
                 batch's commands twice after a crash: use `guarantee = \"exactly-once\"` (the \
                 default) or an idempotent command (set, hset, sadd, pfadd, zadd, del)"
            ));
        }
        Ok(())
    }
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

fn default_lock_timeout_ms() -> u64 {
    10_000
}

fn default_max_records() -> u32 {
    10_000
}
fn default_batch_interval() -> u64 {
    200
}
fn default_fuel() -> u64 {
    20_000_000_000
}
fn default_timeout() -> u64 {
    30_000
}
fn default_memory() -> u64 {
    256
}
fn default_compile_timeout() -> u64 {
    60_000
}

fn default_compile_memory() -> u64 {
    2048
}

fn default_stack() -> u64 {
    1024
}
fn default_isolation_budget() -> u32 {
    4
}
fn default_max_poison_share() -> f64 {
    0.5
}
fn default_prefix() -> String {
    "sluice_".to_string()
}
fn yes() -> bool {
    true
}

impl PipelineConfig {
    /// Reads, parses and validates a config file; relative paths in it are
    /// resolved against the file's directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.resolve_paths(base);
        Ok(config)
    }

    /// Parses and validates config text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let config: PipelineConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<text>"),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    fn resolve_paths(&mut self, base: &Path) {
        if self.module.path.is_relative() {
            self.module.path = base.join(&self.module.path);
        }
        let cache = self
            .module
            .cache_dir
            .take()
            .unwrap_or_else(|| PathBuf::from(".sluice-cache"));
        self.module.cache_dir = Some(if cache.is_relative() {
            base.join(cache)
        } else {
            cache
        });
        resolve_sqlite_path(&mut self.sink.url, base);
        if self.state.is_none() && self.sink.kind().is_ok_and(|k| !k.keeps_state()) {
            // The stdout sink's checkpoints, lineage and modules: a local
            // SQLite file next to the config unless `[state]` says otherwise.
            self.state = Some(StateConfig {
                url: format!("sqlite://{DEFAULT_STATE_FILE}"),
                table_prefix: default_prefix(),
            });
        }
        if let Some(state) = &mut self.state {
            resolve_sqlite_path(&mut state.url, base);
        }
    }

    /// The source settings as the source runs them: `max_records_per_batch`
    /// defaults to [`REDIS_MAX_RECORDS_PER_BATCH`] on a Redis sink.
    pub fn effective_source(&self) -> SourceConfig {
        let mut source = self.source.clone();
        if source.max_records_per_batch.is_none()
            && self.sink.kind().is_ok_and(|k| k == SinkKind::Redis)
        {
            source.max_records_per_batch = Some(REDIS_MAX_RECORDS_PER_BATCH);
        }
        source
    }

    /// The consumer group this pipeline's instances share.
    pub fn group_id(&self) -> String {
        self.source
            .group_id
            .clone()
            .unwrap_or_else(|| format!("sluice-{}", self.pipeline))
    }

    /// The Kafka sink's dead-letter topic.
    pub fn dead_letter_topic(&self) -> String {
        self.sink
            .dead_letter_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dead-letters", self.pipeline))
    }

    /// The Kafka sink's lineage topic.
    pub fn lineage_topic(&self) -> String {
        self.sink
            .lineage_topic
            .clone()
            .unwrap_or_else(|| format!("{}.lineage", self.pipeline))
    }

    /// The module parameters as the JSON text `init` receives.
    pub fn params_json(&self) -> String {
        serde_json::to_string(&self.module.params).expect("TOML values are valid JSON")
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.pipeline.trim().is_empty() {
            return invalid("`pipeline` must not be empty".into());
        }
        if self.source.topics.is_empty() {
            return invalid("`source.topics` must name at least one topic".into());
        }
        if let Some(assign) = &self.source.assign {
            for (topic, partitions) in assign {
                if !self.source.topics.contains(topic) {
                    return invalid(format!(
                        "`source.assign` names topic `{topic}`, which is not in `source.topics`"
                    ));
                }
                if partitions.is_empty() || partitions.iter().any(|p| *p < 0) {
                    return invalid(format!(
                        "`source.assign.{topic}` must list partition numbers (0 or more)"
                    ));
                }
            }
        }
        if let Some(control) = &self.control
            && control.listen.parse::<std::net::SocketAddr>().is_err()
        {
            return invalid(format!(
                "`control.listen` = {:?} is not an address like 127.0.0.1:7878",
                control.listen
            ));
        }
        if let Some(control) = &self.control {
            if control.max_connections == 0 {
                return invalid("`control.max_connections` must be at least 1".into());
            }
            if control.request_timeout_ms < 100 {
                return invalid("`control.request_timeout_ms` must be at least 100".into());
            }
        }
        if !(100..=3_600_000).contains(&self.sink.lock_timeout_ms) {
            return invalid(format!(
                "`sink.lock_timeout_ms` = {} is outside 100..=3600000 (0.1 s to 1 h)",
                self.sink.lock_timeout_ms
            ));
        }
        if self.source.max_records_per_batch == Some(0) {
            return invalid("`source.max_records_per_batch` must be at least 1".into());
        }
        if self.source.max_records_per_partition == 0 {
            return invalid("`source.max_records_per_partition` must be at least 1".into());
        }
        for key in self.source.properties.keys() {
            if RESERVED_PROPERTIES.contains(&key.as_str()) {
                return invalid(format!(
                    "`source.properties.\"{key}\"` is set by sluice for exactly-once and cannot be overridden"
                ));
            }
        }
        if self.limits.fuel_per_batch == 0 || self.limits.max_memory_mib == 0 {
            return invalid("`limits` must be positive".into());
        }
        if !(MIN_STACK_KIB..=MAX_STACK_KIB).contains(&self.limits.max_stack_kib) {
            return invalid(format!(
                "`limits.max_stack_kib` = {} is outside {MIN_STACK_KIB}..={MAX_STACK_KIB}",
                self.limits.max_stack_kib
            ));
        }
        if self.limits.max_output_mib == Some(0) {
            return invalid("`limits.max_output_mib` must be positive".into());
        }
        if !(100..=3_600_000).contains(&self.limits.compile_timeout_ms) {
            return invalid(format!(
                "`limits.compile_timeout_ms` = {} is outside 100..=3600000",
                self.limits.compile_timeout_ms
            ));
        }
        if !(128..=65_536).contains(&self.limits.compile_memory_mib) {
            return invalid(format!(
                "`limits.compile_memory_mib` = {} is outside 128..=65536",
                self.limits.compile_memory_mib
            ));
        }
        if !(1..=1000).contains(&self.limits.isolation_budget) {
            return invalid(format!(
                "`limits.isolation_budget` = {} is outside 1..=1000",
                self.limits.isolation_budget
            ));
        }
        let share = self.limits.max_poison_share;
        if !(share > 0.0 && share <= 1.0) {
            return invalid(format!(
                "`limits.max_poison_share` = {share} must be over 0 and at most 1"
            ));
        }
        let kind = self
            .sink
            .kind()
            .map_err(|e| ConfigError::Invalid(config_message(e)))?;
        match self.state.as_ref().map(|s| SinkKind::of_url(&s.url)) {
            Some(Err(e)) => return invalid(format!("`state.url`: {}", config_message(e))),
            Some(Ok(k)) if !k.keeps_state() => {
                return invalid(format!("`state.url`: {} keeps no state", k.as_str()));
            }
            _ => {}
        }
        if self.sink.targets.is_empty() {
            return invalid("`sink.targets` must declare at least one target".into());
        }
        if self.sink.format.is_some() && kind != SinkKind::Stdout {
            return invalid("`sink.format` is for the stdout sink".into());
        }
        let kafka_topics = [
            ("dead_letter_topic", self.sink.dead_letter_topic.is_some()),
            ("lineage_topic", self.sink.lineage_topic.is_some()),
        ];
        if let Some((field, _)) = kafka_topics.iter().find(|(_, set)| *set)
            && kind != SinkKind::Kafka
        {
            return invalid(format!("`sink.{field}` is for Kafka sinks"));
        }
        if kind == SinkKind::Kafka {
            if self.sink.guarantee == Guarantee::AtLeastOnce && self.sink.lineage_topic.is_some() {
                return invalid(
                    "`sink.lineage_topic` is for an exactly-once Kafka sink: at-least-once keeps \
                     lineage in `[state]`, with the offsets"
                        .into(),
                );
            }
            for topic in [self.dead_letter_topic(), self.lineage_topic()] {
                check_topic_name(&topic)?;
            }
        }
        match self.sink.lineage_keep {
            Some(_) if kind.is_sql() => {
                return invalid(format!(
                    "`sink.lineage_keep` is for Redis sinks; a {} sink keeps all lineage",
                    kind.as_str()
                ));
            }
            Some(_) if kind == SinkKind::Kafka => {
                return invalid(
                    "`sink.lineage_keep` is for Redis sinks; a Kafka sink's lineage is kept as \
                     long as its lineage topic's retention (at-least-once: `[state]`) keeps it"
                        .into(),
                );
            }
            Some(0) => return invalid("`sink.lineage_keep` must be at least 1".into()),
            _ => {}
        }
        let mut names = std::collections::BTreeSet::new();
        for t in &self.sink.targets {
            if !names.insert(&t.name) {
                return invalid(format!("target `{}` is declared twice", t.name));
            }
            t.validate()?;
            t.validate_for(kind, self.sink.guarantee)?;
        }
        Ok(())
    }
}

/// Bounds of `limits.max_stack_kib`. Transforms run on threads whose
/// stack holds the largest Wasm stack plus the host's own frames (see
/// [`TRANSFORM_THREAD_STACK_BYTES`]), so any value in range traps cleanly
/// when a module recurses too deep, instead of overflowing the host thread.
pub const MIN_STACK_KIB: u64 = 64;
pub const MAX_STACK_KIB: u64 = 8 * 1024;

/// Stack size of every thread that may run a transform: the largest Wasm
/// stack allowed plus room for the host's frames under it (wasmtime,
/// lifting, the batch loop).
pub const TRANSFORM_THREAD_STACK_BYTES: usize = (MAX_STACK_KIB as usize + 4 * 1024) * 1024;

/// `source.max_records_per_batch` on a Redis sink when unset: a batch is
/// one script, and Redis serves no other client while it runs (how long a
/// script of 10,000 rows takes: BENCHMARKS.md, "Redis sink").
pub const REDIS_MAX_RECORDS_PER_BATCH: u32 = 50_000;

/// The state store of a sink that keeps none (stdout) when `[state]` is
/// absent: this SQLite file next to the config.
pub const DEFAULT_STATE_FILE: &str = ".sluice-state.db";

/// librdkafka properties sluice sets itself.
pub const RESERVED_PROPERTIES: &[&str] = &[
    "isolation.level",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "group.id",
    "enable.partition.eof",
    "bootstrap.servers",
];

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`, not `.`
/// or `..`.
fn check_topic_name(topic: &str) -> Result<(), ConfigError> {
    let valid = (1..=249).contains(&topic.len())
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if valid {
        return Ok(());
    }
    Err(ConfigError::Invalid(format!(
        "`{topic}` is not a Kafka topic name (1 to 249 of a-z, A-Z, 0-9, `.`, `_`, `-`)"
    )))
}

/// What a sink's configuration error says, without the sink's own prefix
/// (the config error adds its own).
fn config_message(e: SinkError) -> String {
    match e {
        SinkError::Config(message) => message,
        other => other.to_string(),
    }
}

/// A relative `sqlite://` path is relative to the config file.
fn resolve_sqlite_path(url: &mut String, base: &Path) {
    if let Some(rest) = url.strip_prefix("sqlite://") {
        let file = Path::new(rest.split('?').next().unwrap_or(rest));
        if file.is_relative() && !rest.starts_with(":memory:") {
            *url = format!("sqlite://{}", base.join(rest).display());
        }
    }
}

impl SinkConfig {
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
}

impl TargetConfig {
    /// The checks that depend on the sink kind: SQL targets write tables
    /// and take no Redis commands; Redis targets run commands and take no
    /// table settings.
    fn validate_for(&self, kind: SinkKind, guarantee: Guarantee) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(format!("target `{}`: {m}", self.name)));
        if self.kafka.is_some() && kind != SinkKind::Kafka {
            return invalid(format!(
                "`kafka` is for a Kafka sink, but the sink is {}",
                kind.as_str()
            ));
        }
        if !self.redis.is_empty() && kind != SinkKind::Redis {
            return invalid(format!(
                "`redis` commands are for a Redis sink, but the sink is {}",
                kind.as_str()
            ));
        }
        if kind.is_sql() {
            return Ok(());
        }
        if kind == SinkKind::Redis && self.redis.is_empty() {
            return invalid(
                "a Redis target needs at least one `[[sink.targets.redis]]` command".into(),
            );
        }
        let sql_only = [
            ("table", self.table.is_some()),
            ("mode", self.mode != WriteMode::Append),
            ("key", !self.key.is_empty()),
        ];
        if let Some((field, _)) = sql_only.iter().find(|(_, set)| *set) {
            return invalid(format!(
                "`{field}` is for SQL sinks; {}",
                match kind {
                    SinkKind::Redis =>
                        "a Redis target says what it writes in its \
                                        `[[sink.targets.redis]]` commands",
                    SinkKind::Kafka =>
                        "a Kafka target says what it writes in `[sink.targets.kafka]`",
                    _ => "the stdout sink prints every row",
                }
            ));
        }
        for (i, command) in self.redis.iter().enumerate() {
            if let Err(e) = command.validate(self, guarantee) {
                return invalid(format!(
                    "redis command {} (`{}`): {e}",
                    i + 1,
                    command.command.as_str()
                ));
            }
        }
        if kind == SinkKind::Kafka {
            self.validate_kafka()
                .or_else(|m| invalid(format!("`kafka`: {m}")))?;
        }
        Ok(())
    }

    /// The topic this target's rows go to (Kafka sinks).
    pub fn topic(&self) -> &str {
        self.kafka
            .as_ref()
            .and_then(|k| k.topic.as_deref())
            .unwrap_or(&self.name)
    }

    /// A Kafka target's layout names declared columns of fitting types.
    fn validate_kafka(&self) -> Result<(), String> {
        check_topic_name(self.topic()).map_err(|e| e.to_string())?;
        let layout = self.kafka.clone().unwrap_or_default();
        let column = |role: &str, name: &str, allowed: &[ColumnType]| match self.columns.get(name) {
            None => Err(format!(
                "{role} column `{name}` is not one of the target's columns"
            )),
            Some(t) if !allowed.contains(t) => {
                let names: Vec<String> = allowed
                    .iter()
                    .map(|a| format!("{a:?}").to_lowercase())
                    .collect();
                Err(format!(
                    "{role} column `{name}` is {}; it must be {}",
                    format!("{t:?}").to_lowercase(),
                    names.join(" or ")
                ))
            }
            Some(_) => Ok(()),
        };
        let plain = [ColumnType::Text, ColumnType::Blob, ColumnType::Integer];
        if let Some(key) = &layout.key {
            column("key", key, &plain)?;
        }
        if let KafkaValue::Column(value) = layout.value() {
            column("value", value, &[ColumnType::Text, ColumnType::Blob])?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for h in &layout.headers {
            if !seen.insert(h) {
                return Err(format!("header `{h}` is named twice"));
            }
            column("header", h, &plain)?;
        }
        Ok(())
    }

    /// The table rows of this target go to.
    pub fn table(&self) -> &str {
        self.table.as_deref().unwrap_or(&self.name)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.columns.is_empty() {
            return invalid(format!("target `{}` declares no columns", self.name));
        }
        for k in &self.key {
            if !self.columns.contains_key(k) {
                return invalid(format!(
                    "target `{}`: key column `{k}` is not among its columns",
                    self.name
                ));
            }
        }
        if self.mode != WriteMode::Append && self.key.is_empty() {
            return invalid(format!(
                "target `{}`: mode {:?} needs `key` columns",
                self.name, self.mode
            ));
        }
        if self.mode == WriteMode::Accumulate {
            for (name, ty) in &self.columns {
                let numeric = matches!(ty, ColumnType::Integer | ColumnType::Real);
                if !self.key.contains(name) && !numeric {
                    return invalid(format!(
                        "target `{}`: accumulate adds non-key columns, but `{name}` is {ty:?}",
                        self.name
                    ));
                }
            }
        }
        Ok(())
    }
}
