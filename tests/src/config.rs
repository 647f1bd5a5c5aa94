//! Pipeline configs for tests, built as typed values and written as TOML:
//! one place knows how a pipeline file is laid out, and a test states only
//! what it changes (a cap, an assignment, a sink field) instead of editing
//! a template's text.
//!
//! It must not judge a config: a test that wants a bad one builds it with
//! the same calls, and `sluice check` / `sluice run` say what is wrong.

use std::fmt;
use std::path::Path;
use toml::{Table, Value};

/// A pipeline's config file, section by section.
#[derive(Debug, Clone)]
pub struct PipelineToml {
    root: Table,
}

/// One `[[sink.targets]]` table.
#[derive(Debug, Clone)]
pub struct Target {
    table: Table,
}

impl Target {
    /// A target `name` with no columns yet.
    pub fn new(name: &str) -> Target {
        let mut table = Table::new();
        table.insert("name".into(), name.into());
        table.insert("columns".into(), Table::new().into());
        Target { table }
    }

    /// The identity plugin's output: `records` (partition, offset, key,
    /// value).
    pub fn records() -> Target {
        Target::new("records")
            .column("partition", "integer")
            .column("offset", "integer")
            .column("key", "blob")
            .column("value", "blob")
    }

    /// The word-count plugin's output: counts added by word (accumulate).
    pub fn word_counts() -> Target {
        Target::new("word_counts")
            .column("word", "text")
            .column("n", "integer")
            .field("mode", "accumulate")
            .field("key", vec!["word"])
    }

    /// Adds column `name` of SQL-ish `kind`.
    pub fn column(mut self, name: &str, kind: &str) -> Target {
        table_at(&mut self.table, "columns").insert(name.into(), kind.into());
        self
    }

    /// Sets any other field of the target (`mode`, `key`, `create`...).
    pub fn field(mut self, key: &str, value: impl Into<Value>) -> Target {
        self.table.insert(key.into(), value.into());
        self
    }

    /// The Kafka layout (`[sink.targets.kafka]`): `topic`, `key`, `value`,
    /// `headers`.
    pub fn kafka(self, topic: &str, key: &str, value: &str, headers: &[&str]) -> Target {
        let mut layout = Table::new();
        layout.insert("topic".into(), topic.into());
        layout.insert("key".into(), key.into());
        layout.insert("value".into(), value.into());
        layout.insert("headers".into(), headers.to_vec().into());
        self.field("kafka", layout)
    }

    /// A Kafka layout naming only the `topic` (the rest defaulted).
    pub fn kafka_topic(self, topic: &str) -> Target {
        let mut layout = Table::new();
        layout.insert("topic".into(), topic.into());
        self.field("kafka", layout)
    }

    /// Appends one Redis command (`[[sink.targets.redis]]`) given as its
    /// fields.
    pub fn redis(mut self, command: &[(&str, Value)]) -> Target {
        let table: Table = command
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        array_at(&mut self.table, "redis").push(table.into());
        self
    }
}

impl PipelineToml {
    /// Pipeline `pipeline` reading `topics` from `brokers` through
    /// `module`; no sink yet.
    pub fn new(pipeline: &str, brokers: &str, topics: &[&str], module: &Path) -> PipelineToml {
        let mut config = PipelineToml { root: Table::new() };
        config.root.insert("pipeline".into(), pipeline.into());
        config = config
            .source("brokers", brokers)
            .source("topics", topics.to_vec());
        config.section("module").insert(
            "path".into(),
            module.to_str().expect("module path is UTF-8").into(),
        );
        config
    }

    /// The config in the file at `path` (an example's), to be changed.
    pub fn read(path: &Path) -> PipelineToml {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let root = text
            .parse()
            .unwrap_or_else(|e| panic!("{} is not TOML: {e}", path.display()));
        PipelineToml { root }
    }

    /// The pipeline's name.
    pub fn name(&self) -> &str {
        self.root["pipeline"]
            .as_str()
            .expect("`pipeline` is a string")
    }

    /// The same config under another pipeline name.
    pub fn renamed(mut self, pipeline: &str) -> PipelineToml {
        self.root.insert("pipeline".into(), pipeline.into());
        self
    }

    /// The string at `key` of `section`, if set.
    pub fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.root.get(section)?.get(key)?.as_str()
    }

    /// The identity plugin reading `topic`, at most `max_records` offsets
    /// per partition a batch, a batch every 100 ms, a short session timeout
    /// (crashed members leave the group in seconds), into the `records`
    /// target; the sink's connection is still to be set.
    pub fn identity(pipeline: &str, brokers: &str, topic: &str, max_records: u32) -> PipelineToml {
        PipelineToml::new(pipeline, brokers, &[topic], &crate::plugin("identity"))
            .max_records_per_partition(max_records)
            .batch_interval_ms(100)
            .short_session()
            .target(Target::records())
    }

    /// At most `n` offsets of a partition in one batch.
    pub fn max_records_per_partition(self, n: u32) -> PipelineToml {
        self.source("max_records_per_partition", i64::from(n))
    }

    /// A batch cut at least every `ms` milliseconds.
    pub fn batch_interval_ms(self, ms: u64) -> PipelineToml {
        self.source("batch_interval_ms", ms as i64)
    }

    /// A session timeout of 6 s, heartbeats every 500 ms.
    pub fn short_session(self) -> PipelineToml {
        self.source_property("session.timeout.ms", "6000")
            .source_property("heartbeat.interval.ms", "500")
    }

    /// No librdkafka properties at all (the defaults).
    pub fn default_session(mut self) -> PipelineToml {
        self.section("source").remove("properties");
        self
    }

    /// Reads `partitions` of `topic` by static assignment (no group).
    pub fn assign(mut self, topic: &str, partitions: &[i32]) -> PipelineToml {
        let partitions: Vec<i64> = partitions.iter().map(|&p| i64::from(p)).collect();
        table_at(self.section("source"), "assign").insert(topic.into(), partitions.into());
        self
    }

    /// One librdkafka property of the source's consumer.
    pub fn source_property(mut self, key: &str, value: &str) -> PipelineToml {
        table_at(self.section("source"), "properties").insert(key.into(), value.into());
        self
    }

    /// One librdkafka property of the Kafka sink's clients.
    pub fn sink_property(mut self, key: &str, value: &str) -> PipelineToml {
        table_at(self.section("sink"), "properties").insert(key.into(), value.into());
        self
    }

    /// Any field of `[source]`.
    pub fn source(self, key: &str, value: impl Into<Value>) -> PipelineToml {
        self.field("source", key, value)
    }

    /// The module `path`.
    pub fn module_path(self, path: &Path) -> PipelineToml {
        self.field("module", "path", path.to_str().expect("UTF-8 path"))
    }

    /// One of the module's `params`.
    pub fn module_param(mut self, key: &str, value: impl Into<Value>) -> PipelineToml {
        table_at(self.section("module"), "params").insert(key.into(), value.into());
        self
    }

    /// The topics read.
    pub fn topics(self, topics: &[&str]) -> PipelineToml {
        self.source("topics", topics.to_vec())
    }

    /// The sink's `url`.
    pub fn sink_url(self, url: &str) -> PipelineToml {
        self.sink("url", url)
    }

    /// Any field of `[sink]`.
    pub fn sink(self, key: &str, value: impl Into<Value>) -> PipelineToml {
        self.field("sink", key, value)
    }

    /// Appends a `[[sink.targets]]` table.
    pub fn target(mut self, target: Target) -> PipelineToml {
        array_at(self.section("sink"), "targets").push(target.table.into());
        self
    }

    /// Changes every target with `f` (adds Redis commands, a Kafka
    /// layout...).
    pub fn targets(mut self, f: impl Fn(Target) -> Target) -> PipelineToml {
        for slot in array_at(self.section("sink"), "targets") {
            let Value::Table(table) = slot else {
                panic!("a target is not a table");
            };
            *table = f(Target {
                table: std::mem::take(table),
            })
            .table;
        }
        self
    }

    /// The control API on `127.0.0.1:port`, taking modules of up to
    /// `max_module_bytes`.
    pub fn control(self, port: u16, max_module_bytes: usize) -> PipelineToml {
        self.field("control", "listen", format!("127.0.0.1:{port}"))
            .field("control", "max_module_bytes", max_module_bytes as i64)
    }

    /// Adds `fields` (TOML `key = value` lines) to `[limits]`.
    pub fn limits(mut self, fields: &str) -> PipelineToml {
        let fields: Table = fields.parse().expect("limits are TOML lines");
        self.section("limits").extend(fields);
        self
    }

    /// Sets `key` of the top-level table `section` (`[limits]`,
    /// `[control]`, `[state]`, ...), creating the table.
    pub fn field(mut self, section: &str, key: &str, value: impl Into<Value>) -> PipelineToml {
        self.section(section).insert(key.into(), value.into());
        self
    }

    /// Removes `key` from `section`.
    pub fn without(mut self, section: &str, key: &str) -> PipelineToml {
        self.section(section).remove(key);
        self
    }

    /// Writes the config as `pipeline.toml` in `dir`.
    pub fn write(&self, dir: &Path) -> std::path::PathBuf {
        crate::write_config(dir, self.to_string())
    }

    fn section(&mut self, name: &str) -> &mut Table {
        table_at(&mut self.root, name)
    }
}

impl fmt::Display for PipelineToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = toml::to_string(&self.root).map_err(|_| fmt::Error)?;
        f.write_str(&text)
    }
}

/// The table at `key` of `table`, created empty if missing.
fn table_at<'t>(table: &'t mut Table, key: &str) -> &'t mut Table {
    match table.entry(key).or_insert_with(|| Table::new().into()) {
        Value::Table(inner) => inner,
        other => panic!("`{key}` is {other}, not a table"),
    }
}

/// The array at `key` of `table`, created empty if missing.
fn array_at<'t>(table: &'t mut Table, key: &str) -> &'t mut Vec<Value> {
    match table
        .entry(key)
        .or_insert_with(|| Vec::<Value>::new().into())
    {
        Value::Array(inner) => inner,
        other => panic!("`{key}` is {other}, not an array"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_pipeline_reads_back_as_the_fields_set() {
        let text = PipelineToml::identity("p", "b:1", "t", 100)
            .assign("t", &[0, 1])
            .sink_url("sqlite://x.db")
            .sink("schema", "s")
            .to_string();
        let back: Table = text.parse().expect("valid TOML");
        assert_eq!(back["pipeline"].as_str(), Some("p"));
        let source = back["source"].as_table().unwrap();
        assert_eq!(source["max_records_per_partition"].as_integer(), Some(100));
        assert_eq!(source["assign"]["t"].as_array().unwrap().len(), 2);
        assert_eq!(
            source["properties"]["session.timeout.ms"].as_str(),
            Some("6000")
        );
        let sink = back["sink"].as_table().unwrap();
        assert_eq!(sink["url"].as_str(), Some("sqlite://x.db"));
        let targets = sink["targets"].as_array().unwrap();
        assert_eq!(targets[0]["name"].as_str(), Some("records"));
        assert_eq!(targets[0]["columns"]["key"].as_str(), Some("blob"));
    }
}
