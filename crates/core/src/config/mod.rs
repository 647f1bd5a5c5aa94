//! The pipeline configuration (TOML): what a user writes, validated up front.
//!
//! Owns parsing, defaults and the checks that need no network: the
//! pipeline, its source, module and control plane here; the limits in
//! [`limits`]; the sink's common part and `[state]` in [`sink`]; the trait
//! by which each sink kind's crate reads and checks its own fields in
//! [`section`]. Every field's `///` comment is the user documentation; the
//! README's config reference is checked against these structs by a test
//! (`host/src/config_reference.rs`). It must not connect to anything, and
//! must not know any sink kind's own fields.

mod bounded;
mod event_time;
mod interpolate;
mod limits;
pub mod section;
mod sink;

pub use bounded::Bounded;
pub use event_time::EventTimeConfig;
pub use limits::{
    LimitsConfig, MAX_STACK_KIB, MIN_STACK_KIB, OnPoison, TRANSFORM_THREAD_STACK_BYTES,
};
pub use section::{KindSection, Place};
pub use sink::{
    ColumnType, Guarantee, SinkConfig, StateConfig, StoreConnection, TargetConfig, Writes,
};

use crate::sink::{SinkError, SinkKind};
use serde::Deserialize;
use sink::default_prefix;
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
    /// A field of `[sink]` or a target that the sink kind does not have;
    /// `owner` names the kinds that have it, where one does.
    #[error("invalid config: {}", foreign(.place, .field, .kind, .owner))]
    Foreign {
        place: Place,
        field: String,
        /// The sink kind that refused it, as [`KindSection::FOR`] says.
        kind: &'static str,
        owner: Option<&'static str>,
    },
}

fn foreign(place: &Place, field: &str, kind: &str, owner: &Option<&'static str>) -> String {
    match (owner, place) {
        (Some(owner), _) => format!("{} is for {owner}, not {kind}", place.name(field)),
        (None, Place::Sink) => {
            format!("unknown field `{field}` in `[sink]`: not a field of {kind}")
        }
        (None, Place::Target(target)) => {
            format!("unknown field `{field}` in target `{target}`: not a field of {kind}")
        }
    }
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
    /// Event time: how far watermarks stay behind record times.
    #[serde(default)]
    pub event_time: EventTimeConfig,
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
    pub max_connections: Bounded<1>,
    /// Longest a request may take, upload and validation included, in
    /// milliseconds; past it the answer is 408.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: Bounded<100>,
}

fn default_max_connections() -> Bounded<1> {
    Bounded::at(256)
}

fn default_request_timeout_ms() -> Bounded<100> {
    Bounded::at(60_000)
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
    pub max_records_per_partition: Bounded<1, { u32::MAX as u64 }>,
    /// Upper bound of a batch across all its partitions, in offsets,
    /// shared fairly between them. Default: none (each partition up to
    /// `max_records_per_partition`), except on Redis, where a batch is one
    /// script and Redis serves no other client while it runs: 50000 there.
    #[serde(default)]
    pub max_records_per_batch: Option<Bounded<1, { u32::MAX as u64 }>>,
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
    /// Whether a stopping instance leaves the consumer group (Kafka's
    /// LeaveGroup), so the others take its partitions over at once; when
    /// false, the group notices after `session.timeout.ms` (10 s by
    /// default) instead, as for an instance that crashed. Only dynamic
    /// members leave: a static one (`instance_id`) never does, as Kafka
    /// has it. Set it to false on Tansu (v0.6.0) with several dynamic
    /// instances: a group's leader that leaves while the group rebalances
    /// wedges the group there for good (docs/operations.md, "Leaving the
    /// group on shutdown"). With `assign` it does not apply: a statically
    /// assigned instance is no member of a group. Default: true.
    #[serde(default = "default_leave_group_on_shutdown")]
    pub leave_group_on_shutdown: bool,
}

fn default_leave_group_on_shutdown() -> bool {
    true
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
    /// config file. It keeps at most 2 GiB (the least recently used go
    /// first); removing it is safe at any time (a module is compiled again).
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
}

impl PipelineConfig {
    /// Reads, parses and validates a config file; relative paths in it are
    /// resolved against the file's directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut config = Self::parse_in(&text, base).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })?;
        config.resolve_paths(base);
        Ok(config)
    }

    /// Parses and validates config text (`${file:...}` secrets relative to
    /// the working directory).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::parse_in(text, Path::new("."))
    }

    /// Parses config text, replacing `${NAME}` and `${file:PATH}` (read
    /// from `base`) in its values ([`interpolate`]), and validates it.
    fn parse_in(text: &str, base: &Path) -> Result<Self, ConfigError> {
        let parse_error = |e: toml::de::Error| ConfigError::Parse {
            path: PathBuf::from("<text>"),
            message: e.to_string(),
        };
        // Without references the text is read as it is, so errors keep
        // their line and column.
        let config: PipelineConfig = match text.contains("${") {
            false => toml::from_str(text).map_err(parse_error)?,
            true => {
                let mut table: toml::Table = toml::from_str(text).map_err(parse_error)?;
                interpolate::interpolate(&mut table, base)?;
                table.try_into().map_err(parse_error)?
            }
        };
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
    /// defaults to what the sink kind bounds a batch by
    /// ([`SinkKind::default_max_records_per_batch`]).
    pub fn effective_source(&self) -> SourceConfig {
        let mut source = self.source.clone();
        if source.max_records_per_batch.is_none() {
            source.max_records_per_batch = self
                .sink
                .kind()
                .ok()
                .and_then(SinkKind::default_max_records_per_batch)
                .map(|cap| Bounded::at(cap.into()));
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

    /// The module parameters as the JSON text `init` receives.
    pub fn params_json(&self) -> String {
        serde_json::to_string(&self.module.params).expect("TOML values are valid JSON")
    }

    /// The checks that need no backend: each section's own, then the
    /// sink kind and `[state]`. A sink kind's own fields are checked by its
    /// crate ([`KindSection::check`]).
    fn validate(&self) -> Result<(), ConfigError> {
        if self.pipeline.trim().is_empty() {
            return Err(ConfigError::Invalid("`pipeline` must not be empty".into()));
        }
        self.source.validate()?;
        if let Some(control) = &self.control {
            control.validate()?;
        }
        self.limits.validate()?;
        self.event_time.validate()?;
        self.sink.validate()?;
        self.sink
            .kind()
            .map_err(|e| ConfigError::Invalid(config_message(e)))?;
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        match self.state.as_ref().map(|s| SinkKind::of_url(&s.url)) {
            Some(Err(e)) => invalid(format!("`state.url`: {}", config_message(e))),
            Some(Ok(k)) if !k.keeps_state() => {
                invalid(format!("`state.url`: {} keeps no state", k.as_str()))
            }
            _ => Ok(()),
        }
    }
}

impl SourceConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.topics.is_empty() {
            return invalid("`source.topics` must name at least one topic".into());
        }
        for (topic, partitions) in self.assign.iter().flatten() {
            if !self.topics.contains(topic) {
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
        if let Some(cap) = self.max_records_per_batch {
            cap.check("source.max_records_per_batch")?;
        }
        self.max_records_per_partition
            .check("source.max_records_per_partition")?;
        if let Some(key) = self
            .properties
            .keys()
            .find(|k| RESERVED_PROPERTIES.contains(&k.as_str()))
        {
            return invalid(format!(
                "`source.properties.\"{key}\"` is set by sluice for exactly-once and cannot be overridden"
            ));
        }
        Ok(())
    }
}

impl ControlConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return invalid(format!(
                "`control.listen` = {:?} is not an address like 127.0.0.1:7878",
                self.listen
            ));
        }
        self.max_connections.check("control.max_connections")?;
        self.request_timeout_ms.check("control.request_timeout_ms")
    }
}

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

fn default_max_records() -> Bounded<1, { u32::MAX as u64 }> {
    Bounded::at(10_000)
}

fn default_batch_interval() -> u64 {
    200
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
pipeline = "p"
[source]
brokers = "127.0.0.1:1"
topics = ["in"]
[module]
path = "m.wasm"
[limits]
[sink]
url = "sqlite://x.db"
[[sink.targets]]
name = "out"
columns = { n = "integer" }
"#;

    /// The good config with `line` added at the start of its `[section]`.
    fn with(section: &str, line: &str) -> String {
        let header = format!("[{section}]\n");
        match GOOD.contains(&header) {
            true => GOOD.replacen(&header, &format!("{header}{line}\n"), 1),
            false => format!("{GOOD}\n{header}{line}\n"),
        }
    }

    #[test]
    fn each_rule_refuses_what_it_names() {
        let cases = [
            (
                GOOD.replace("pipeline = \"p\"", "pipeline = \" \""),
                "`pipeline` must not be empty",
            ),
            (
                GOOD.replace("topics = [\"in\"]", "topics = []"),
                "must name at least one topic",
            ),
            (
                with("source", "assign = { other = [0] }"),
                "`source.assign` names topic `other`",
            ),
            (
                with("source", "assign = { in = [-1] }"),
                "must list partition numbers",
            ),
            (
                with("source", "max_records_per_batch = 0"),
                "`source.max_records_per_batch` must be at least 1",
            ),
            (
                with("source", "max_records_per_partition = 0"),
                "`source.max_records_per_partition` must be at least 1",
            ),
            (
                with("source.properties", "\"group.id\" = \"g\""),
                "`source.properties.\"group.id\"` is set by sluice",
            ),
            (
                with("control", "listen = \"nowhere\""),
                "is not an address like 127.0.0.1:7878",
            ),
            (
                with("control", "listen = \"127.0.0.1:0\"\nmax_connections = 0"),
                "`control.max_connections` must be at least 1",
            ),
            (
                with(
                    "control",
                    "listen = \"127.0.0.1:0\"\nrequest_timeout_ms = 99",
                ),
                "`control.request_timeout_ms` must be at least 100",
            ),
            (
                with("limits", "fuel_per_batch = 0"),
                "`limits.fuel_per_batch` must be at least 1 (it is 0)",
            ),
            (
                with("limits", "max_memory_mib = 0"),
                "`limits.max_memory_mib` must be at least 1 (it is 0)",
            ),
            (
                with("limits", "max_stack_kib = 63"),
                "`limits.max_stack_kib` = 63 is outside 64..=8192",
            ),
            (
                with("limits", "max_output_mib = 0"),
                "`limits.max_output_mib` must be at least 1 (it is 0)",
            ),
            (
                with("limits", "max_state_partition_mib = 0"),
                "`limits.max_state_partition_mib` = 0 is outside 1..=1048576",
            ),
            (
                with("limits", "max_state_partition_mib = 1048577"),
                "`limits.max_state_partition_mib` = 1048577 is outside 1..=1048576",
            ),
            (
                with("limits", "compile_timeout_ms = 99"),
                "`limits.compile_timeout_ms` = 99 is outside",
            ),
            (
                with("limits", "compile_memory_mib = 127"),
                "`limits.compile_memory_mib` = 127 is outside",
            ),
            (
                with("limits", "isolation_budget = 1001"),
                "`limits.isolation_budget` = 1001 is outside 1..=1000",
            ),
            (
                with("limits", "max_poison_share = 0.0"),
                "`limits.max_poison_share` = 0 must be over 0",
            ),
            (with("limits", "colour = 1"), "unknown field `colour`"),
            (
                with("sink", "lock_timeout_ms = 99"),
                "`sink.lock_timeout_ms` = 99 is outside 100..=3600000",
            ),
            (
                with("sink", "kind = \"redis\""),
                "`sink.kind` is `redis` but `sink.url` is a sqlite URL",
            ),
            (
                GOOD.replace("sqlite://x.db", "ftp://x"),
                "unsupported sink URL",
            ),
            (
                with("state", "url = \"stdout://\""),
                "`state.url`: stdout keeps no state",
            ),
            (
                with("state", "url = \"sqlite://s.db\"\nschema = \"s\""),
                "unknown field `schema`",
            ),
            (
                GOOD.replace(
                    "[[sink.targets]]\nname = \"out\"\ncolumns = { n = \"integer\" }\n",
                    "",
                ),
                "missing field `targets`",
            ),
            (
                format!(
                    "{GOOD}[[sink.targets]]\nname = \"out\"\ncolumns = {{ n = \"integer\" }}\n"
                ),
                "target `out` is declared twice",
            ),
            (
                GOOD.replace("columns = { n = \"integer\" }", "columns = {}"),
                "target `out` declares no columns",
            ),
            (
                GOOD.replace("\"integer\"", "\"decimal\""),
                "unknown variant `decimal`",
            ),
        ];
        for (text, says) in cases {
            let said = match PipelineConfig::parse(&text) {
                Ok(_) => panic!("accepted, expected {says:?}:\n{text}"),
                Err(e) => e.to_string(),
            };
            assert!(said.contains(says), "expected {says:?}, got: {said}");
        }
        assert!(PipelineConfig::parse(GOOD).is_ok());
    }

    #[test]
    fn a_kinds_own_fields_are_left_to_its_crate() {
        let text = with("sink", "schema = \"s\"\nformat = \"table\"");
        let config = PipelineConfig::parse(&text).unwrap();
        let own: Vec<&String> = config.sink.settings.keys().collect();
        assert_eq!(own, ["format", "schema"]);
        let text = GOOD.replace("columns = {", "table = \"t\"\ncolumns = {");
        let config = PipelineConfig::parse(&text).unwrap();
        assert!(config.sink.targets[0].settings.contains_key("table"));
    }

    #[test]
    fn the_common_fields_are_the_structs_own() {
        // Flattened structs hide their field names from serde, so they are
        // listed by hand: each listed name must be taken by the struct, not
        // left to the kind.
        let text = GOOD.replace(
            "url = \"sqlite://x.db\"",
            "kind = \"sqlite\"\nurl = \"sqlite://x.db\"\ntable_prefix = \"s_\"\n\
             guarantee = \"exactly-once\"\nlock_timeout_ms = 1000",
        );
        let config = PipelineConfig::parse(&text).unwrap();
        assert!(config.sink.settings.is_empty());
        assert!(config.sink.targets[0].settings.is_empty());
        let given: Vec<&str> = text
            .lines()
            .skip_while(|l| *l != "[sink]")
            .filter_map(|l| l.split_once(" = ").map(|(k, _)| k))
            .collect();
        assert_eq!(
            given,
            [
                "kind",
                "url",
                "table_prefix",
                "guarantee",
                "lock_timeout_ms",
                "name",
                "columns"
            ]
        );
        assert_eq!(SinkConfig::COMMON.len(), 6, "the five above and `targets`");
        assert_eq!(TargetConfig::COMMON, ["name", "columns"]);
    }

    #[test]
    fn defaults_follow_the_sink_kind() {
        let redis = GOOD.replace("sqlite://x.db", "redis://127.0.0.1/0");
        let config = PipelineConfig::parse(&redis).unwrap();
        assert_eq!(
            config.effective_source().max_records_per_batch,
            Some(Bounded::at(50_000))
        );
        let config = PipelineConfig::parse(GOOD).unwrap();
        assert_eq!(config.effective_source().max_records_per_batch, None);
        assert_eq!(config.group_id(), "sluice-p");
    }
}
