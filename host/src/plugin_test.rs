//! `sluice test`: runs a module on sample records from a JSON-lines file,
//! locally, with no broker and no sink, under the same limits, poison
//! policy and deterministic WASI as a pipeline, and reports its rows,
//! rejections, dead letters, logs and output digest.
//!
//! Owns the sample format and the report. It must not connect to anything
//! or write anywhere but the report: it is how a plugin author tries a
//! module before a pipeline exists.

use crate::batch::{OffsetRange, OwnedRecord, Plan, Records};
use crate::config::OnPoison;
use crate::pipeline::{PipelineError, Preparer};
use crate::runtime::{Limits, LogLine};
use crate::sink::stdout::StdoutFormat;
use crate::sink::{Commit, DeadLetter};
use crate::state_view::StateLine;
use serde_json::{Value as Json, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `sluice test` runs.
pub struct SampleRun {
    /// The component (.wasm).
    pub module: PathBuf,
    /// JSON lines, one record each (see [`parse_sample`]).
    pub input: PathBuf,
    /// Params for the module's `init`, JSON.
    pub params: String,
    /// A pipeline config whose targets the rows are checked against, and
    /// whose limits, poison policy and name are used.
    pub pipeline: Option<PathBuf>,
    /// The batch time the module sees (its wall clock).
    pub batch_time_ms: i64,
}

/// Why a sample could not be run.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Sample {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("--params is not JSON: {0}")]
    ParamsNotJson(#[source] serde_json::Error),
    /// The module cannot be read, compiled or refuses the params.
    #[error(transparent)]
    Module(#[from] crate::app::AppError),
    #[error("pipeline config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error(transparent)]
    Run(#[from] PipelineError),
    #[error("{0}")]
    Contract(String),
}

/// The result of a sample run.
pub struct SampleReport {
    pub plan: Plan,
    pub records: Records,
    pub batch: crate::pipeline::Batch,
    pub logs: Vec<LogLine>,
    /// Rows that break the pipeline's declared targets, if one was given.
    pub contract_errors: Vec<String>,
}

/// Runs the sample and returns the report.
pub fn run(sample: &SampleRun) -> Result<SampleReport, SampleError> {
    // Compiled modules are cached where a pipeline would cache them: the
    // config's `module.cache_dir`, else `.sluice-cache` next to the module.
    let mut cache_dir = sample
        .module
        .parent()
        .unwrap_or(Path::new("."))
        .join(".sluice-cache");
    let (name, limits, on_poison, targets) = match &sample.pipeline {
        Some(path) => {
            let config = crate::backends::load(path).map_err(|e| SampleError::Config {
                path: path.clone(),
                message: format!("{e:#}"),
            })?;
            if let Some(dir) = &config.module.cache_dir {
                cache_dir = dir.clone();
            }
            (
                config.pipeline.clone(),
                Limits::from_config(&config.limits),
                config.limits.on_poison,
                Some(config.sink.targets.clone()),
            )
        }
        None => (
            "sample".to_string(),
            Limits::from_config(&Default::default()),
            OnPoison::DeadLetter,
            None,
        ),
    };
    // As a pipeline's params are: JSON, or refused before the module runs.
    serde_json::from_str::<Json>(&sample.params).map_err(SampleError::ParamsNotJson)?;
    let text = std::fs::read_to_string(&sample.input).map_err(|source| SampleError::Read {
        path: sample.input.clone(),
        source,
    })?;
    let partitions = parse_sample(&text).map_err(|(line, message)| SampleError::Sample {
        path: sample.input.clone(),
        line,
        message,
    })?;
    let transform = crate::app::load_module_transform(
        &sample.module,
        limits,
        sample.params.clone(),
        &cache_dir,
    )?;
    let runtime = Arc::clone(transform.runtime());
    let (ranges, records) = batch_of(&partitions);
    let params_digest = crate::batch::sha256_hex(sample.params.as_bytes());
    let digest = sluice_core::transform::Transform::module_digest(&transform).to_string();
    let plan = Plan::new(&name, ranges, &digest, &params_digest, sample.batch_time_ms);
    let preparer = Preparer::new(name, on_poison, transform);
    // A sample runs as one batch from empty state.
    let state = Arc::new(sluice_core::state::EmptyState);
    let batch = preparer.transform_planned(plan.clone(), records.clone(), 0, state)?;
    let contract_errors = match targets {
        Some(targets) => check_targets(&targets, &batch.output),
        None => Vec::new(),
    };
    Ok(SampleReport {
        plan: batch.plan.clone(),
        records,
        logs: runtime.recent_logs(),
        batch,
        contract_errors,
    })
}

/// Sample records by (topic, partition), each partition's in file order.
type Partitions = BTreeMap<(String, i32), Vec<OwnedRecord>>;

/// Parses the sample: one JSON object per line (blank lines and lines
/// starting with `#` are skipped) with the optional fields
/// - `value` / `key`: a string is taken as UTF-8 bytes, any other JSON
///   (object, array, number, boolean) as its compact JSON text, `null` or
///   absent as null; `value_hex` / `key_hex` give raw bytes instead;
/// - `topic` (default `sample`), `partition` (default 0), `offset` (default:
///   one past the partition's previous record, from 0; must increase),
///   `timestamp` (ms, default 0), `headers` (an object of string or null).
///
/// Returns the line number and message of the first bad line.
pub fn parse_sample(text: &str) -> Result<Partitions, (usize, String)> {
    let mut partitions = Partitions::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let record = parse_line(trimmed, &partitions).map_err(|m| (line_no, m))?;
        let (key, record) = record;
        partitions.entry(key).or_default().push(record);
    }
    if partitions.is_empty() {
        return Err((0, "the sample has no records".into()));
    }
    Ok(partitions)
}

const FIELDS: &[&str] = &[
    "topic",
    "partition",
    "offset",
    "timestamp",
    "key",
    "key_hex",
    "value",
    "value_hex",
    "headers",
];

fn parse_line(line: &str, seen: &Partitions) -> Result<((String, i32), OwnedRecord), String> {
    let json: Json = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let Json::Object(fields) = json else {
        return Err("a sample line must be a JSON object, like {\"value\": \"...\"}".into());
    };
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown field `{unknown}` (known: {})",
            FIELDS.join(", ")
        ));
    }
    let topic = match fields.get("topic") {
        None => "sample".to_string(),
        Some(Json::String(t)) if !t.is_empty() => t.clone(),
        Some(other) => return Err(format!("`topic` must be a non-empty string, not {other}")),
    };
    let partition = integer(&fields, "partition")?.unwrap_or(0);
    let partition = i32::try_from(partition)
        .ok()
        .filter(|p| *p >= 0)
        .ok_or_else(|| format!("`partition` {partition} is out of range"))?;
    let previous = seen
        .get(&(topic.clone(), partition))
        .and_then(|r| r.last())
        .map(|r| r.offset);
    let offset = match integer(&fields, "offset")? {
        Some(o) if o < 0 => return Err(format!("`offset` {o} is negative")),
        Some(o) if previous.is_some_and(|p| o <= p) => {
            return Err(format!(
                "`offset` {o} does not increase within {topic}:{partition}"
            ));
        }
        Some(o) => o,
        None => previous.map_or(0, |p| p + 1),
    };
    let record = OwnedRecord {
        offset,
        timestamp: integer(&fields, "timestamp")?.unwrap_or(0),
        key: bytes(&fields, "key")?,
        value: bytes(&fields, "value")?,
        headers: headers(&fields)?,
    };
    Ok(((topic, partition), record))
}

fn integer(fields: &serde_json::Map<String, Json>, name: &str) -> Result<Option<i64>, String> {
    match fields.get(name) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| format!("`{name}` must be an integer, not {v}")),
    }
}

fn bytes(fields: &serde_json::Map<String, Json>, name: &str) -> Result<Option<Vec<u8>>, String> {
    let hex_name = format!("{name}_hex");
    match (fields.get(name), fields.get(&hex_name)) {
        (Some(_), Some(_)) => Err(format!("give `{name}` or `{hex_name}`, not both")),
        (_, Some(Json::String(h))) => hex::decode(h)
            .map(Some)
            .map_err(|e| format!("`{hex_name}` is not hex: {e}")),
        (_, Some(other)) => Err(format!("`{hex_name}` must be a hex string, not {other}")),
        (None | Some(Json::Null), None) => Ok(None),
        (Some(Json::String(s)), None) => Ok(Some(s.as_bytes().to_vec())),
        (Some(other), None) => Ok(Some(other.to_string().into_bytes())),
    }
}

/// A record's headers: (name, value or null).
type Headers = Vec<(String, Option<Vec<u8>>)>;

fn headers(fields: &serde_json::Map<String, Json>) -> Result<Headers, String> {
    match fields.get("headers") {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Object(h)) => h
            .iter()
            .map(|(name, v)| match v {
                Json::Null => Ok((name.clone(), None)),
                Json::String(s) => Ok((name.clone(), Some(s.as_bytes().to_vec()))),
                other => Err(format!(
                    "header `{name}` must be a string or null, not {other}"
                )),
            })
            .collect(),
        Some(other) => Err(format!("`headers` must be an object, not {other}")),
    }
}

/// One batch holding every partition's records, a slice per partition.
fn batch_of(partitions: &Partitions) -> (Vec<OffsetRange>, Records) {
    let mut records = Records::default();
    let mut ranges = Vec::new();
    for ((topic, partition), owned) in partitions {
        records.push_slice(topic, *partition, owned);
        ranges.push(OffsetRange {
            topic: topic.clone(),
            partition: *partition,
            from: owned[0].offset,
            until: owned[owned.len() - 1].offset + 1,
        });
    }
    (ranges, records)
}

/// Each target's rows checked against the pipeline's declared targets.
fn check_targets(
    targets: &[crate::config::TargetConfig],
    output: &crate::output::Output,
) -> Vec<String> {
    output
        .targets
        .iter()
        .filter_map(
            |rows| match targets.iter().find(|t| t.name == rows.target) {
                None => Some(format!(
                    "module wrote target `{}`, which the pipeline does not declare (declared: {})",
                    rows.target,
                    targets
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                Some(target) => sluice_core::contract::declared_columns(target, rows)
                    .err()
                    .map(|e| e.to_string()),
            },
        )
        .collect()
}

impl SampleReport {
    fn commit(&self) -> Commit<'_> {
        Commit {
            plan: &self.plan,
            records: &self.records,
            output: &self.batch.output,
            dead_letters: &self.batch.dead_letters,
            output_digest: &self.batch.output_digest,
            state_reads: &self.batch.state_reads,
        }
    }

    /// Rows (aligned tables), then dead letters, logs and the summary.
    pub fn table(&self) -> String {
        let commit = self.commit();
        let mut text = crate::sink::stdout::render_rows(&commit, StdoutFormat::Table);
        if !self.batch.dead_letters.is_empty() {
            text.push_str("dead letters:\n");
            for d in &self.batch.dead_letters {
                text.push_str(&format!("  {}\n", self.dead_letter_line(d)));
            }
        }
        if !self.logs.is_empty() {
            text.push_str("logs:\n");
            for line in &self.logs {
                text.push_str(&format!("  {:<5}  {}\n", line.level.as_str(), line.message));
            }
        }
        for error in &self.contract_errors {
            text.push_str(&format!("contract: {error}\n"));
        }
        if !self.batch.output.state.is_empty() {
            text.push_str("state written:\n");
            for change in self.state_changes() {
                text.push_str(&format!("  {}\n", change.line("deleted")));
            }
        }
        text.push_str(&format!("output digest: {}\n", self.batch.output_digest));
        text
    }

    /// What the batch wrote to state, key by key, in partition then key order.
    fn state_changes(&self) -> Vec<StateLine<'_>> {
        let state = &self.batch.output.state.0;
        state
            .iter()
            .flat_map(|(tp, keys)| {
                keys.iter()
                    .map(move |(key, value)| StateLine::of(tp, key, value.as_ref()))
            })
            .collect()
    }

    fn dead_letter_line(&self, d: &DeadLetter) -> String {
        let offset = self.records.offsets[d.index];
        let slice = self
            .records
            .slices
            .iter()
            .find(|s| (s.first as usize..(s.first + s.count) as usize).contains(&d.index))
            .expect("every record is in a slice");
        format!(
            "{}:{}@{} [{}] {}",
            slice.topic,
            slice.partition,
            offset,
            d.kind.as_str(),
            d.reason
        )
    }

    /// JSON lines: one per row (as the stdout sink's), per dead letter, per
    /// log line, and a last `summary` line.
    pub fn json_lines(&self) -> String {
        let commit = self.commit();
        let mut text = crate::sink::stdout::render_rows(&commit, StdoutFormat::Json);
        text.push_str(&crate::sink::stdout::render_dead_letters(&commit));
        for line in &self.logs {
            let log = json!({ "log": { "level": line.level.as_str(), "message": line.message } });
            text.push_str(&format!("{log}\n"));
        }
        for change in self.state_changes() {
            text.push_str(&format!("{}\n", json!({ "state": change.json() })));
        }
        let summary = json!({ "summary": {
            "records": self.records.len(),
            "rows": self.batch.output.row_count(),
            "rejections": self.batch.output.rejections.len(),
            "dead_letters": self.batch.dead_letters.len(),
            "state_keys_written": self.batch.output.state.len(),
            "contract_errors": self.contract_errors,
            "output_digest": self.batch.output_digest,
        }});
        text.push_str(&format!("{summary}\n"));
        text
    }
}

#[cfg(test)]
mod tests {
    use super::parse_sample;

    #[test]
    fn sample_lines_become_records_by_partition() {
        let text = r#"
# a comment
{"value": "a"}
{"value": {"n": 1}, "key_hex": "00ff", "partition": 1, "offset": 7}
{"value": null, "headers": {"h": "v", "n": null}}
"#;
        let p = parse_sample(text).unwrap();
        let zero = &p[&("sample".to_string(), 0)];
        assert_eq!(zero.len(), 2);
        assert_eq!(zero[0].value.as_deref(), Some(&b"a"[..]));
        assert_eq!((zero[0].offset, zero[1].offset), (0, 1));
        assert_eq!(zero[1].value, None);
        assert_eq!(zero[1].headers.len(), 2);
        let one = &p[&("sample".to_string(), 1)];
        assert_eq!(one[0].offset, 7);
        assert_eq!(one[0].key.as_deref(), Some(&[0u8, 255][..]));
        assert_eq!(one[0].value.as_deref(), Some(&br#"{"n":1}"#[..]));
    }

    #[test]
    fn bad_sample_lines_are_named() {
        for (text, expected) in [
            ("[1]", "must be a JSON object"),
            (r#"{"valeu": "x"}"#, "unknown field `valeu`"),
            (
                r#"{"offset": 5}
{"offset": 5}"#,
                "does not increase",
            ),
            (r#"{"key_hex": "zz"}"#, "not hex"),
            (r#"{"key": "a", "key_hex": "00"}"#, "not both"),
            (r#"{"partition": -1}"#, "out of range"),
            ("", "no records"),
        ] {
            let (_, message) = parse_sample(text).unwrap_err();
            assert!(message.contains(expected), "{text}: {message}");
        }
    }
}
