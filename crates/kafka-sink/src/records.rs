//! What one batch sends: its rows as records laid out by their target's
//! `[sink.targets.kafka]`, its dead letters (the record's own key and value,
//! where it came from and why in `sluice.*` headers) and its lineage entry.
//!
//! Owns the byte layout of every record the sink writes. It must not talk
//! to a broker (`sink` and `at_least_once` send what this lays out), nor
//! hold a batch's records all at once.

use crate::section::{KafkaTargetConfig, KafkaValue};
use serde_json::{Map, Value as Json};
use sluice_core::batch::RecordRef;
use sluice_core::config::TargetConfig;
use sluice_core::contract::declared_columns;
use sluice_core::output::{Column, TargetRows, Value};
use sluice_core::sink::{Commit, DeadLetter, SinkError};
use sluice_core::store::LineageEntry;
use std::borrow::Cow;
use std::collections::HashMap;

/// One record to send, borrowing what it can from the batch and the
/// layout (librdkafka copies it when it is queued).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutRecord<'a> {
    pub topic: &'a str,
    /// The partition, if not the key's (the changelog's is the input's).
    pub partition: Option<i32>,
    pub key: Option<Cow<'a, [u8]>>,
    pub value: Option<Cow<'a, [u8]>>,
    /// (name, value); a `None` value is a null header.
    pub headers: Vec<(&'a str, Option<Cow<'a, [u8]>>)>,
}

/// Where and how a pipeline's batches are laid out as records: each
/// target's layout and the dead-letter topic.
pub struct BatchLayout {
    targets: HashMap<String, TargetLayout>,
    dead_letter_topic: String,
}

impl BatchLayout {
    /// The layouts of `targets`, and the dead-letter topic.
    pub fn new(
        targets: &[TargetConfig],
        dead_letter_topic: String,
    ) -> Result<BatchLayout, SinkError> {
        let targets = targets
            .iter()
            .map(|t| Ok((t.name.clone(), TargetLayout::new(t.clone())?)))
            .collect::<Result<_, SinkError>>()?;
        Ok(BatchLayout {
            targets,
            dead_letter_topic,
        })
    }

    /// The topics rows and dead letters go to.
    pub fn topics(&self) -> Vec<&str> {
        let mut topics: Vec<&str> = self.targets.values().map(TargetLayout::topic).collect();
        topics.push(&self.dead_letter_topic);
        topics
    }

    /// Everything `c` sends, in order: rows, dead letters, and its lineage
    /// entry if a `lineage_topic` is given; checked against the layouts
    /// here, laid out one record at a time by [`BatchRecords::send_each`].
    pub fn records<'a>(
        &'a self,
        c: &'a Commit<'a>,
        lineage_topic: Option<&'a str>,
    ) -> Result<BatchRecords<'a>, SinkError> {
        let targets = c
            .output
            .targets
            .iter()
            .map(|rows| {
                let layout = self.targets.get(&rows.target).ok_or_else(|| {
                    SinkError::Config(format!(
                        "module wrote to target `{}`, which the sink does not declare",
                        rows.target
                    ))
                })?;
                layout.rows(rows)
            })
            .collect::<Result<_, SinkError>>()?;
        Ok(BatchRecords {
            commit: c,
            targets,
            dead_letter_topic: &self.dead_letter_topic,
            lineage_topic,
        })
    }
}

/// A batch's records, checked, to be laid out and sent one at a time: a
/// batch's output is never held a second time as records (a module that
/// floods its output costs the host its typed columns, not a copy per row).
pub struct BatchRecords<'a> {
    commit: &'a Commit<'a>,
    targets: Vec<TargetRecords<'a>>,
    dead_letter_topic: &'a str,
    lineage_topic: Option<&'a str>,
}

impl BatchRecords<'_> {
    /// Calls `send` with each record in order, stopping at its first error.
    pub fn send_each<E>(
        &self,
        mut send: impl FnMut(&OutRecord<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        for target in &self.targets {
            target.send_each(&mut send)?;
        }
        for record in dead_letters(self.commit, self.dead_letter_topic) {
            send(&record)?;
        }
        match self.lineage_topic {
            Some(topic) => send(&lineage(self.commit, topic)),
            None => Ok(()),
        }
    }
}

/// One target's rows with where each part of a record comes from.
struct TargetRecords<'a> {
    topic: &'a str,
    rows: &'a TargetRows,
    /// The declared columns in name order, checked against the target.
    columns: Vec<(&'a str, &'a Column)>,
    /// Where each part comes from: the index of its column in `columns`
    /// (`None`: the column is not in this batch's rows, so null).
    key: Option<usize>,
    value: ValueFrom,
    headers: Vec<(&'a str, Option<usize>)>,
}

/// Where a target's record values come from.
enum ValueFrom {
    /// The whole row as a JSON object.
    Json,
    /// One column (`None`: not in this batch's rows, so null).
    Column(Option<usize>),
}

impl TargetRecords<'_> {
    /// Lays out one row at a time (the columns are walked in step) and
    /// calls `send` with it.
    fn send_each<E>(
        &self,
        send: &mut impl FnMut(&OutRecord<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut cells: Vec<_> = self.columns.iter().map(|(_, c)| c.values()).collect();
        let mut row: Vec<Value<'_>> = Vec::with_capacity(cells.len());
        fn at<'v>(row: &[Value<'v>], i: Option<usize>) -> Value<'v> {
            i.map_or(Value::Null, |i| row[i])
        }
        for _ in 0..self.rows.rows {
            row.clear();
            row.extend(cells.iter_mut().map(|c| c.next().unwrap_or(Value::Null)));
            let record = OutRecord {
                topic: self.topic,
                partition: None,
                key: cell_bytes(at(&row, self.key)),
                value: match self.value {
                    ValueFrom::Json => Some(Cow::Owned(row_json(
                        self.columns.iter().zip(&row).map(|((n, _), v)| (*n, *v)),
                    ))),
                    ValueFrom::Column(i) => cell_bytes(at(&row, i)),
                },
                headers: self
                    .headers
                    .iter()
                    .map(|&(name, i)| (name, cell_bytes(at(&row, i))))
                    .collect(),
            };
            send(&record)?;
        }
        Ok(())
    }
}

/// The layout of one target's records, checked against its columns.
#[derive(Debug, Clone)]
struct TargetLayout {
    config: TargetConfig,
    layout: KafkaTargetConfig,
}

impl TargetLayout {
    pub fn new(config: TargetConfig) -> Result<TargetLayout, SinkError> {
        let layout = KafkaTargetConfig::of(&config)?;
        Ok(TargetLayout { config, layout })
    }

    pub fn topic(&self) -> &str {
        self.layout.topic(&self.config)
    }

    /// `rows` checked against this target's columns, ready to lay out.
    fn rows<'a>(&'a self, rows: &'a TargetRows) -> Result<TargetRecords<'a>, SinkError> {
        let columns: Vec<(&str, &Column)> = declared_columns(&self.config, rows)?
            .into_iter()
            .map(|(c, _)| (c.name.as_str(), c))
            .collect();
        let index = |name: &str| columns.iter().position(|(n, _)| *n == name);
        Ok(TargetRecords {
            topic: self.topic(),
            rows,
            key: self.layout.key.as_deref().and_then(index),
            value: match self.layout.value() {
                KafkaValue::Json => ValueFrom::Json,
                KafkaValue::Column(c) => ValueFrom::Column(index(c)),
            },
            headers: self
                .layout
                .headers
                .iter()
                .map(|h| (h.as_str(), index(h)))
                .collect(),
            columns,
        })
    }
}

/// A cell as record bytes: text and blobs as they are, numbers in
/// decimal, booleans as `true`/`false`; null is none.
fn cell_bytes(v: Value<'_>) -> Option<Cow<'_, [u8]>> {
    let owned = |s: String| Some(Cow::Owned(s.into_bytes()));
    match v {
        Value::Null => None,
        Value::Int(i) => owned(i.to_string()),
        Value::Float(f) => owned(f.to_string()),
        Value::Text(t) => Some(Cow::Borrowed(t.as_bytes())),
        Value::Bytes(b) => Some(Cow::Borrowed(b)),
        Value::Bool(b) => owned(b.to_string()),
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
/// (`sluice.topic`, `sluice.partition`, `sluice.offset`, `sluice.timestamp`
/// (the record's time), `sluice.kind`, `sluice.reason`, `sluice.batch`,
/// `sluice.pipeline`).
fn dead_letters<'a>(c: &'a Commit<'a>, topic: &'a str) -> Vec<OutRecord<'a>> {
    if c.dead_letters.is_empty() {
        return Vec::new();
    }
    let records: Vec<RecordRef<'a>> = c.records.iter().collect();
    c.dead_letters
        .iter()
        .filter_map(|d| Some(dead_letter(c, d, records.get(d.index)?, topic)))
        .collect()
}

fn dead_letter<'a>(
    c: &'a Commit<'a>,
    d: &DeadLetter,
    r: &RecordRef<'a>,
    topic: &'a str,
) -> OutRecord<'a> {
    let text = |name: &'a str, value: String| (name, Some(Cow::Owned(value.into_bytes())));
    let headers = vec![
        text("sluice.pipeline", c.plan.pipeline.clone()),
        text("sluice.batch", c.plan.batch_id.clone()),
        text("sluice.topic", r.topic.to_string()),
        text("sluice.partition", r.partition.to_string()),
        text("sluice.offset", r.offset.to_string()),
        text("sluice.timestamp", r.timestamp.to_string()),
        text("sluice.kind", d.kind.as_str().to_string()),
        text("sluice.reason", d.reason.clone()),
    ];
    OutRecord {
        topic,
        partition: None,
        key: r.key.map(Cow::Borrowed),
        value: r.value.map(Cow::Borrowed),
        headers,
    }
}

/// The batch's lineage entry, to `topic`, keyed by the pipeline so one
/// partition holds a pipeline's lineage in commit order.
fn lineage<'a>(c: &'a Commit<'a>, topic: &'a str) -> OutRecord<'a> {
    OutRecord {
        topic,
        partition: None,
        key: Some(Cow::Borrowed(c.plan.pipeline.as_bytes())),
        value: Some(Cow::Owned(LineageEntry::of(c).to_json().into_bytes())),
        headers: Vec::new(),
    }
}
