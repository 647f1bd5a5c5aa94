//! What one batch sends: its rows as records laid out by their target's
//! `[sink.targets.kafka]`, its dead letters (the record's own key and value,
//! where it came from and why in `sluice.*` headers) and its lineage entry.
//!
//! Owns the byte layout of every record the sink writes. It must not talk
//! to a broker: `sink` sends what this builds.

use serde_json::{Map, Value as Json};
use sluice_core::batch::RecordRef;
use sluice_core::config::{KafkaTargetConfig, KafkaValue, TargetConfig};
use sluice_core::contract::declared_columns;
use sluice_core::output::{TargetRows, Value};
use sluice_core::sink::{Commit, DeadLetter, SinkError};
use sluice_core::store::LineageEntry;
use std::collections::HashMap;

/// One record to send, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutRecord {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// (name, value); a `None` value is a null header.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// Where and how a pipeline's batches are laid out as records: each
/// target's layout and the dead-letter topic.
pub struct BatchLayout {
    targets: HashMap<String, TargetLayout>,
    dead_letter_topic: String,
}

impl BatchLayout {
    pub fn new(targets: &[TargetConfig], dead_letter_topic: String) -> BatchLayout {
        BatchLayout {
            targets: targets
                .iter()
                .map(|t| (t.name.clone(), TargetLayout::new(t.clone())))
                .collect(),
            dead_letter_topic,
        }
    }

    /// The topics rows and dead letters go to.
    pub fn topics(&self) -> Vec<&str> {
        let mut topics: Vec<&str> = self.targets.values().map(TargetLayout::topic).collect();
        topics.push(&self.dead_letter_topic);
        topics
    }

    /// Everything `c` sends, in order: rows, dead letters, and its lineage
    /// entry if a `lineage_topic` is given.
    pub fn records(
        &self,
        c: &Commit<'_>,
        lineage_topic: Option<&str>,
    ) -> Result<Vec<OutRecord>, SinkError> {
        let mut out = Vec::with_capacity(c.output.row_count() as usize + 1);
        for rows in &c.output.targets {
            let layout = self.targets.get(&rows.target).ok_or_else(|| {
                SinkError::Config(format!(
                    "module wrote to target `{}`, which the sink does not declare",
                    rows.target
                ))
            })?;
            out.extend(layout.records(rows)?);
        }
        out.extend(dead_letters(c, &self.dead_letter_topic));
        out.extend(lineage_topic.map(|topic| lineage(c, topic)));
        Ok(out)
    }
}

/// The layout of one target's records, checked against its columns.
#[derive(Debug, Clone)]
struct TargetLayout {
    config: TargetConfig,
    layout: KafkaTargetConfig,
}

impl TargetLayout {
    pub fn new(config: TargetConfig) -> TargetLayout {
        let layout = config.kafka.clone().unwrap_or_default();
        TargetLayout { config, layout }
    }

    pub fn topic(&self) -> &str {
        self.config.topic()
    }

    /// The records of `rows`, one per row, in row order.
    pub fn records(&self, rows: &TargetRows) -> Result<Vec<OutRecord>, SinkError> {
        // The declared columns in name order, each checked against the target.
        let columns: Vec<(&str, Vec<Value<'_>>)> = declared_columns(&self.config, rows)?
            .into_iter()
            .map(|(c, _)| (c.name.as_str(), c.values().collect()))
            .collect();
        let cell = |name: &str, row: usize| {
            columns
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(Value::Null, |(_, cells)| cells[row])
        };
        Ok((0..rows.rows as usize)
            .map(|row| OutRecord {
                topic: self.topic().to_string(),
                key: self
                    .layout
                    .key
                    .as_deref()
                    .and_then(|k| cell_bytes(cell(k, row))),
                value: match self.layout.value() {
                    KafkaValue::Json => Some(row_json(columns.iter().map(|(n, c)| (*n, c[row])))),
                    KafkaValue::Column(c) => cell_bytes(cell(c, row)),
                },
                headers: self
                    .layout
                    .headers
                    .iter()
                    .map(|h| (h.clone(), cell_bytes(cell(h, row))))
                    .collect(),
            })
            .collect())
    }
}

/// A cell as record bytes: text and blobs as they are, numbers in
/// decimal, booleans as `true`/`false`; null is none.
fn cell_bytes(v: Value<'_>) -> Option<Vec<u8>> {
    match v {
        Value::Null => None,
        Value::Int(i) => Some(i.to_string().into_bytes()),
        Value::Float(f) => Some(f.to_string().into_bytes()),
        Value::Text(t) => Some(t.as_bytes().to_vec()),
        Value::Bytes(b) => Some(b.to_vec()),
        Value::Bool(b) => Some(b.to_string().into_bytes()),
    }
}

/// The row as one JSON object of `cells`, which come in name order (as
/// `declared_columns` gives them), so the text is the same whether or not
/// serde_json keeps insertion order.
fn row_json<'a>(cells: impl Iterator<Item = (&'a str, Value<'a>)>) -> Vec<u8> {
    let object: Map<String, Json> = cells.map(|(n, v)| (n.to_string(), v.to_json())).collect();
    serde_json::to_vec(&object).expect("JSON values serialize")
}

/// The dead letters of a batch, to `topic`: each the failed record's own
/// key and value, with headers saying where it came from and why
/// (`sluice.topic`, `sluice.partition`, `sluice.offset`, `sluice.kind`,
/// `sluice.reason`, `sluice.batch`, `sluice.pipeline`).
fn dead_letters(c: &Commit<'_>, topic: &str) -> Vec<OutRecord> {
    if c.dead_letters.is_empty() {
        return Vec::new();
    }
    let records: Vec<RecordRef<'_>> = c.records.iter().collect();
    c.dead_letters
        .iter()
        .filter_map(|d| Some(dead_letter(c, d, records.get(d.index)?, topic)))
        .collect()
}

fn dead_letter(c: &Commit<'_>, d: &DeadLetter, r: &RecordRef<'_>, topic: &str) -> OutRecord {
    let text = |name: &str, value: String| (name.to_string(), Some(value.into_bytes()));
    let headers = vec![
        text("sluice.pipeline", c.plan.pipeline.clone()),
        text("sluice.batch", c.plan.batch_id.clone()),
        text("sluice.topic", r.topic.to_string()),
        text("sluice.partition", r.partition.to_string()),
        text("sluice.offset", r.offset.to_string()),
        text("sluice.kind", d.kind.as_str().to_string()),
        text("sluice.reason", d.reason.clone()),
    ];
    OutRecord {
        topic: topic.to_string(),
        key: r.key.map(<[u8]>::to_vec),
        value: r.value.map(<[u8]>::to_vec),
        headers,
    }
}

/// The batch's lineage entry, to `topic`, keyed by the pipeline so one
/// partition holds a pipeline's lineage in commit order.
fn lineage(c: &Commit<'_>, topic: &str) -> OutRecord {
    OutRecord {
        topic: topic.to_string(),
        key: Some(c.plan.pipeline.as_bytes().to_vec()),
        value: Some(LineageEntry::of(c).to_json().into_bytes()),
        headers: Vec::new(),
    }
}
