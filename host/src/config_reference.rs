//! The README's configuration reference, checked against the config
//! structs (whose `///` comments are the field docs): every field of every
//! table, the sink kinds' own included, is shown there, and every key shown
//! there is a field. Test-only.
//!
//! It must not check values: the reference shows examples, not defaults.

use crate::backends::SECTIONS;
use crate::config::section::fields_of;
use crate::config::{
    ControlConfig, EventTimeConfig, LimitsConfig, ModuleConfig, PipelineConfig, Place, SinkConfig,
    SourceConfig, StateConfig, TargetConfig,
};
use crate::sink::kafka::section::KafkaTargetConfig;
use crate::sink::redis::section::RedisCommandConfig;
use std::collections::{BTreeMap, BTreeSet};

/// Tables whose keys are the user's own (passed through), not fields.
const FREE_FORM: &[&str] = &["source.properties", "sink.properties"];

/// Fields' former names, still accepted (serde aliases): the reference
/// names them in the field's comment, not as keys of their own.
const FORMER_NAMES: &[&str] = &["limits.on_trap"];

/// Every table of a pipeline config and the fields it takes.
fn tables() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    let own = |place: &Place| -> Vec<&'static str> {
        SECTIONS
            .iter()
            .flat_map(|(_, fields)| fields(place).iter().copied())
            .collect()
    };
    let sink_own = own(&Place::Sink);
    let target_own = own(&Place::Target(String::new()));
    BTreeMap::from([
        ("", fields_of::<PipelineConfig>().iter().copied().collect()),
        (
            "source",
            fields_of::<SourceConfig>().iter().copied().collect(),
        ),
        (
            "module",
            fields_of::<ModuleConfig>().iter().copied().collect(),
        ),
        (
            "limits",
            fields_of::<LimitsConfig>().iter().copied().collect(),
        ),
        (
            "event_time",
            fields_of::<EventTimeConfig>().iter().copied().collect(),
        ),
        (
            "control",
            fields_of::<ControlConfig>().iter().copied().collect(),
        ),
        (
            "state",
            fields_of::<StateConfig>().iter().copied().collect(),
        ),
        (
            "sink",
            SinkConfig::COMMON.iter().copied().chain(sink_own).collect(),
        ),
        (
            "sink.targets",
            TargetConfig::COMMON
                .iter()
                .copied()
                .chain(target_own)
                .collect(),
        ),
        (
            "sink.targets.redis",
            fields_of::<RedisCommandConfig>().iter().copied().collect(),
        ),
        (
            "sink.targets.kafka",
            fields_of::<KafkaTargetConfig>().iter().copied().collect(),
        ),
    ])
}

/// The keys the README's reference shows, by table (commented-out ones
/// included).
fn shown() -> BTreeMap<String, BTreeSet<String>> {
    let readme = include_str!("../../README.md");
    let start = readme
        .find("## Configuration reference")
        .expect("the README has a configuration reference");
    let block = &readme[start..];
    let block = &block[block.find("```toml").expect("a toml block") + 7..];
    let block = &block[..block.find("```").expect("the block ends")];
    let mut shown: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut table = String::new();
    for line in block.lines() {
        // Keys and headers start the line (`# ` when commented out);
        // indented lines are the comments' continuations.
        let text = line.strip_prefix("# ").unwrap_or(line);
        if line.starts_with(' ') || text.is_empty() {
            continue;
        }
        let code = text.split(" #").next().unwrap_or(text).trim();
        if let Some(header) = code.strip_prefix('[') {
            table = header.trim_matches(|c| c == '[' || c == ']').to_string();
            let (parent, name) = table.rsplit_once('.').unwrap_or(("", &table));
            shown
                .entry(parent.to_string())
                .or_default()
                .insert(name.to_string());
            continue;
        }
        let Some((key, _)) = code.split_once(" = ") else {
            continue;
        };
        if !FREE_FORM.contains(&table.as_str()) {
            shown
                .entry(table.clone())
                .or_default()
                .insert(key.trim().to_string());
        }
    }
    shown
}

#[test]
fn the_readme_reference_shows_every_field_and_only_fields() {
    let shown = shown();
    let tables = tables();
    let mut problems = Vec::new();
    for (table, fields) in &tables {
        let here = shown.get(*table).cloned().unwrap_or_default();
        for field in fields {
            let dotted = format!("{table}.{field}");
            if FORMER_NAMES.contains(&dotted.as_str()) {
                let readme = include_str!("../../README.md");
                if !readme.contains(&format!("`{field}`")) {
                    problems.push(format!("the former name `{dotted}` is not in the README"));
                }
                continue;
            }
            if !here.contains(*field) {
                problems.push(format!(
                    "`{table}.{field}` is not in the README's reference"
                ));
            }
        }
        for key in &here {
            if !fields.contains(key.as_str()) {
                problems.push(format!(
                    "the README shows `{table}.{key}`, which is no field"
                ));
            }
        }
    }
    for table in shown.keys() {
        if !tables.contains_key(table.as_str()) && !FREE_FORM.contains(&table.as_str()) {
            problems.push(format!(
                "the README shows a table `[{table}]` no struct reads"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
