//! The Kafka sink's own fields: `dead_letter_topic` and `lineage_topic` in
//! `[sink]`, and each target's record layout (`[sink.targets.kafka]`).
//! Read and checked here, once.
//!
//! It must not talk to the brokers: whether the topics exist is checked
//! when the sink opens.

use serde::Deserialize;
use sluice_core::config::{
    ColumnType, ConfigError, Guarantee, KindSection, PipelineConfig, TargetConfig,
};

/// The Kafka sink (`kafka://`).
pub struct KafkaSection;

/// The Kafka sink's own fields of `[sink]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkFields {
    /// The topic dead letters go to, in the batch's transaction (the
    /// record's own key and value, the cause in `sluice.*` headers).
    /// Default: `<pipeline>.dead-letters`. It must exist.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// The topic lineage goes to, one JSON entry per batch keyed by the
    /// pipeline, in the batch's transaction. Keep it time- or
    /// size-retained (`cleanup.policy=delete`), not compacted: compaction
    /// by pipeline would keep only the newest batch; `verify` and `shadow`
    /// see what retention keeps. Default: `<pipeline>.lineage`. It must
    /// exist. An at-least-once Kafka sink keeps lineage in `[state]`.
    #[serde(default)]
    pub lineage_topic: Option<String>,
    /// The changelog topic keyed state goes to, in the batch's
    /// transaction (docs/state.md): partition `p` keeps input partition
    /// `p`'s state, so it needs at least as many partitions as the input
    /// topic; make it compacted (`cleanup.policy=compact`). A pipeline
    /// reading several topics keeps topic `T`'s state in `<state_topic>.T`.
    /// Default: `<pipeline>.state`. Needed only by a stateful module; an
    /// at-least-once Kafka sink keeps state in `[state]`.
    #[serde(default)]
    pub state_topic: Option<String>,
    /// librdkafka properties every client of the sink gets (its
    /// producers, and the readers of its offsets, lineage and changelog),
    /// passed through as given: TLS (`"security.protocol" = "ssl"`,
    /// `"ssl.ca.location"`), SASL. `source.properties` does not carry over
    /// (the sink may write to other brokers). Properties sluice sets for
    /// exactly-once (`transactional.id`, `enable.idempotence`,
    /// `isolation.level`, `group.id`, `bootstrap.servers`, ...) are refused.
    #[serde(default)]
    pub properties: std::collections::BTreeMap<String, String>,
}

/// librdkafka properties the Kafka sink sets on its producers, beyond
/// those every sluice consumer sets ([`sluice_core::config::RESERVED_PROPERTIES`]).
const PRODUCER_PROPERTIES: &[&str] = &["transactional.id", "enable.idempotence", "partitioner"];

/// A Kafka target's own fields.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaTargetFields {
    /// The topic and record layout of this target's rows
    /// (`[sink.targets.kafka]`; default: the target name as topic, the row
    /// as a JSON object as value, no key).
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

impl KindSection for KafkaSection {
    const FOR: &'static str = "Kafka sinks";
    type Sink = KafkaSinkFields;
    type Target = KafkaTargetFields;

    fn check(config: &PipelineConfig) -> Result<(), ConfigError> {
        let fields = Self::sink(&config.sink)?;
        if config.sink.guarantee() == Guarantee::AtLeastOnce {
            for (field, given) in [
                ("lineage_topic", fields.lineage_topic.is_some()),
                ("state_topic", fields.state_topic.is_some()),
            ] {
                if given {
                    return Err(ConfigError::Invalid(format!(
                        "`sink.{field}` is for an exactly-once Kafka sink: at-least-once keeps \
                         lineage and state in `[state]`, with the offsets"
                    )));
                }
            }
        }
        let changelogs = config
            .source
            .topics
            .iter()
            .map(|t| fields.changelog_topic(config, t));
        for topic in [
            fields.dead_letter_topic(&config.pipeline),
            fields.lineage_topic(&config.pipeline),
        ]
        .into_iter()
        .chain(changelogs)
        {
            check_topic_name(&topic).map_err(ConfigError::Invalid)?;
        }
        if let Some(key) = fields.properties.keys().find(|k| {
            let k = k.as_str();
            sluice_core::config::RESERVED_PROPERTIES.contains(&k)
                || PRODUCER_PROPERTIES.contains(&k)
        }) {
            return Err(ConfigError::Invalid(format!(
                "`sink.properties.\"{key}\"` is set by sluice's Kafka sink and cannot be overridden"
            )));
        }
        for target in &config.sink.targets {
            KafkaTargetConfig::of(target)?;
        }
        Ok(())
    }
}

impl KafkaSinkFields {
    /// The dead-letter topic.
    pub fn dead_letter_topic(&self, pipeline: &str) -> String {
        self.dead_letter_topic
            .clone()
            .unwrap_or_else(|| format!("{pipeline}.dead-letters"))
    }

    /// The lineage topic.
    pub fn lineage_topic(&self, pipeline: &str) -> String {
        self.lineage_topic
            .clone()
            .unwrap_or_else(|| format!("{pipeline}.lineage"))
    }

    /// The changelog topic keeping the state of input topic `input`.
    pub fn changelog_topic(&self, config: &PipelineConfig, input: &str) -> String {
        let base = self
            .state_topic
            .clone()
            .unwrap_or_else(|| format!("{}.state", config.pipeline));
        match config.source.topics.len() {
            1 => base,
            _ => format!("{base}.{input}"),
        }
    }
}

impl KafkaTargetConfig {
    /// `target`'s layout (the default one if it gives none), checked.
    pub fn of(target: &TargetConfig) -> Result<KafkaTargetConfig, ConfigError> {
        let layout = KafkaSection::target(target)?.kafka.unwrap_or_default();
        layout
            .check(target)
            .map_err(|m| ConfigError::Invalid(format!("target `{}`: `kafka`: {m}", target.name)))?;
        Ok(layout)
    }

    /// The topic `target`'s rows go to.
    pub fn topic<'a>(&'a self, target: &'a TargetConfig) -> &'a str {
        self.topic.as_deref().unwrap_or(&target.name)
    }

    /// The topic is a topic name; the key, value and headers name declared
    /// columns of fitting types.
    fn check(&self, target: &TargetConfig) -> Result<(), String> {
        check_topic_name(self.topic(target))?;
        let column = |role: &str, name: &str, allowed: &[ColumnType]| match target.columns.get(name)
        {
            None => Err(format!(
                "{role} column `{name}` is not one of the target's columns"
            )),
            Some(t) if !allowed.contains(t) => {
                let names: Vec<&str> = allowed.iter().map(|a| a.as_str()).collect();
                Err(format!(
                    "{role} column `{name}` is {}; it must be {}",
                    t.as_str(),
                    names.join(" or ")
                ))
            }
            Some(_) => Ok(()),
        };
        let plain = [ColumnType::Text, ColumnType::Blob, ColumnType::Integer];
        if let Some(key) = &self.key {
            column("key", key, &plain)?;
        }
        if let KafkaValue::Column(value) = self.value() {
            column("value", value, &[ColumnType::Text, ColumnType::Blob])?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for h in &self.headers {
            if !seen.insert(h) {
                return Err(format!("header `{h}` is named twice"));
            }
            column("header", h, &plain)?;
        }
        Ok(())
    }
}

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`, not `.`
/// or `..`.
fn check_topic_name(topic: &str) -> Result<(), String> {
    let valid = (1..=249).contains(&topic.len())
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if valid {
        return Ok(());
    }
    Err(format!(
        "`{topic}` is not a Kafka topic name (1 to 249 of a-z, A-Z, 0-9, `.`, `_`, `-`)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: &str =
        "[sink.targets.kafka]\ntopic = \"out\"\nkey = \"key\"\nvalue = \"value\"\n";

    fn check(sink: &str, layout: &str) -> Result<(), String> {
        let sink = format!("url = \"kafka://127.0.0.1:1\"\n{sink}");
        let columns = "{ key = \"text\", value = \"blob\", offset = \"integer\", n = \"real\" }";
        let config = sluice_core::testing::sink_config(&sink, "records", columns, layout)
            .map_err(|e| e.to_string())?;
        KafkaSection::check(&config).map_err(|e| e.to_string())
    }

    #[test]
    fn each_layout_and_topic_rule_refuses_what_it_names() {
        let layout = |from: &str, to: &str| LAYOUT.replace(from, to);
        let cases = [
            (String::new(), LAYOUT.to_string(), None),
            (String::new(), String::new(), None),
            (
                "dead_letter_topic = \"d\"\nlineage_topic = \"l\"".into(),
                LAYOUT.into(),
                None,
            ),
            (
                String::new(),
                layout("key = \"key\"", "key = \"nope\""),
                Some("key column `nope` is not one of the target's columns"),
            ),
            (
                String::new(),
                layout("value = \"value\"", "value = \"offset\""),
                Some("value column `offset` is integer; it must be text or blob"),
            ),
            (
                String::new(),
                layout("key = \"key\"", "key = \"n\""),
                Some("key column `n` is real"),
            ),
            (
                String::new(),
                format!("{LAYOUT}headers = [\"key\", \"key\"]\n"),
                Some("header `key` is named twice"),
            ),
            (
                String::new(),
                layout("topic = \"out\"", "topic = \"bad topic\""),
                Some("`bad topic` is not a Kafka topic name"),
            ),
            (
                "dead_letter_topic = \"..\"".into(),
                LAYOUT.into(),
                Some("`..` is not a Kafka topic name"),
            ),
            (
                "guarantee = \"at-least-once\"\nlineage_topic = \"l\"".into(),
                LAYOUT.into(),
                Some("`sink.lineage_topic` is for an exactly-once Kafka sink"),
            ),
            (
                "guarantee = \"at-least-once\"\nstate_topic = \"s\"".into(),
                LAYOUT.into(),
                Some("`sink.state_topic` is for an exactly-once Kafka sink"),
            ),
            (
                "properties = { \"security.protocol\" = \"ssl\", \"linger.ms\" = \"20\" }".into(),
                LAYOUT.into(),
                None,
            ),
            (
                "properties = { \"transactional.id\" = \"mine\" }".into(),
                LAYOUT.into(),
                Some("`sink.properties.\"transactional.id\"` is set by sluice's Kafka sink"),
            ),
            (
                "state_topic = \"a b\"".into(),
                LAYOUT.into(),
                Some("`a b` is not a Kafka topic name"),
            ),
            (
                String::new(),
                format!("{LAYOUT}partition = 1\n"),
                Some("unknown field `partition`"),
            ),
            (
                "schema = \"s\"".into(),
                LAYOUT.into(),
                Some("unknown field `schema` in `[sink]`: not a field of Kafka sinks"),
            ),
        ];
        for (sink, layout, refused) in cases {
            match (check(&sink, &layout), refused) {
                (Ok(()), None) => {}
                (Err(said), Some(says)) => assert!(said.contains(says), "{layout}: {said}"),
                (got, expected) => panic!("{sink} / {layout}: {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn topics_default_to_the_pipelines_and_the_targets_names() {
        let fields = KafkaSinkFields::default();
        assert_eq!(fields.dead_letter_topic("p"), "p.dead-letters");
        assert_eq!(fields.lineage_topic("p"), "p.lineage");
        let target = TargetConfig {
            name: "records".into(),
            columns: Default::default(),
            settings: Default::default(),
        };
        assert_eq!(KafkaTargetConfig::default().topic(&target), "records");
    }
}
