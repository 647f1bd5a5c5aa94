//! `sluice test`: runs a module on sample records from a JSON-lines file,
//! locally, with no broker and no sink, under the same limits, poison
//! policy and deterministic WASI as a pipeline, and reports its rows,
//! rejections, dead letters, logs and output digest.
//!
//! Owns the sample format and the report. It must not connect to anything
//! or write anywhere but the report: it is how a plugin author tries a
//! module before a pipeline exists.

use crate::batch::{OffsetRange, OwnedRecord, Plan, Records, TopicPartition};
use crate::config::{Bounded, ConfigError, LimitsConfig, OnPoison};
use crate::pipeline::{PipelineError, Preparer};
use crate::runtime::{Limits, LogLine};
use crate::sample;
use crate::sink::stdout::StdoutFormat;
use crate::sink::{Commit, DeadLetter};
use crate::state_view::StateLine;
use serde_json::{Value as Json, json};
use sluice_core::event_time::{self, Timer};
use sluice_core::state::{StateBase, StateError, StateMap, StateValue};
use sluice_core::transform::BatchUsage;
use std::collections::BTreeMap;
use std::num::NonZeroUsize;
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
    /// Limits given as flags, over the pipeline's or the defaults.
    pub limits: LimitFlags,
    /// At most this many records per partition in a batch: the sample runs
    /// as several batches, each starting from the keyed state the ones
    /// before it left. `None`: one batch.
    pub batch_size: Option<NonZeroUsize>,
}

/// Limits set by `sluice test`'s flags; each replaces the pipeline's (or
/// the default) and is checked as the config's field would be.
#[derive(Debug, Default)]
pub struct LimitFlags {
    /// `limits.fuel_per_batch`.
    pub fuel_per_batch: Option<u64>,
    /// `limits.max_memory_mib`.
    pub max_memory_mib: Option<u64>,
    /// `limits.batch_timeout_ms`.
    pub batch_timeout_ms: Option<u64>,
}

impl LimitFlags {
    fn apply(&self, limits: &mut LimitsConfig) -> Result<(), ConfigError> {
        if let Some(fuel) = self.fuel_per_batch {
            limits.fuel_per_batch = Bounded::given(fuel);
        }
        if let Some(mib) = self.max_memory_mib {
            limits.max_memory_mib = Bounded::given(mib);
        }
        if let Some(ms) = self.batch_timeout_ms {
            limits.batch_timeout_ms = ms;
        }
        limits.validate()
    }
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
    /// A limit given as a flag is out of its range.
    #[error(transparent)]
    Limits(#[from] ConfigError),
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
    /// The batches, in the order they ran.
    pub batches: Vec<BatchRun>,
    pub logs: Vec<LogLine>,
    /// Rows that break the pipeline's declared targets, if one was given.
    pub contract_errors: Vec<String>,
    /// The limits the batches ran under.
    pub limits: Limits,
}

/// One batch of a sample run.
pub struct BatchRun {
    pub records: Records,
    pub batch: crate::pipeline::Batch,
}

/// What a sample runs under: from the pipeline config if one is given.
struct Setup {
    name: String,
    limits: LimitsConfig,
    event_time: crate::config::EventTimeConfig,
    on_poison: OnPoison,
    targets: Option<Vec<crate::config::TargetConfig>>,
    cache_dir: PathBuf,
}

impl Setup {
    fn of(sample: &SampleRun) -> Result<Setup, SampleError> {
        // Compiled modules are cached where a pipeline would cache them: the
        // config's `module.cache_dir`, else `.sluice-cache` next to the module.
        let cache_dir = sample
            .module
            .parent()
            .unwrap_or(Path::new("."))
            .join(".sluice-cache");
        let mut setup = match &sample.pipeline {
            Some(path) => {
                let config = crate::backends::load(path).map_err(|e| SampleError::Config {
                    path: path.clone(),
                    message: format!("{e:#}"),
                })?;
                Setup {
                    name: config.pipeline.clone(),
                    event_time: config.event_time,
                    on_poison: config.limits.on_poison,
                    limits: config.limits,
                    targets: Some(config.sink.targets),
                    cache_dir: config.module.cache_dir.unwrap_or(cache_dir),
                }
            }
            None => Setup {
                name: "sample".to_string(),
                limits: LimitsConfig::default(),
                event_time: Default::default(),
                on_poison: OnPoison::DeadLetter,
                targets: None,
                cache_dir,
            },
        };
        sample.limits.apply(&mut setup.limits)?;
        Ok(setup)
    }
}

/// Runs the sample and returns the report.
pub fn run(sample: &SampleRun) -> Result<SampleReport, SampleError> {
    let setup = Setup::of(sample)?;
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
    let limits = Limits::from_config(&setup.limits).with_event_time(&setup.event_time);
    let transform = crate::app::load_module_transform(
        &sample.module,
        limits.clone(),
        sample.params.clone(),
        &setup.cache_dir,
    )?;
    let runtime = Arc::clone(transform.runtime());
    let params_digest = crate::batch::sha256_hex(sample.params.as_bytes());
    let digest = sluice_core::transform::Transform::module_digest(&transform).to_string();
    let preparer = Preparer::new(setup.name.clone(), setup.on_poison, transform);
    // The first batch starts from empty state; each next one from what the
    // ones before it wrote.
    let mut state = StateMap::default();
    let mut batches = Vec::new();
    for (ranges, records) in batches_of(&partitions, sample.batch_size) {
        let plan = Plan::new(
            &setup.name,
            ranges,
            &digest,
            &params_digest,
            sample.batch_time_ms,
        );
        let base = Arc::new(Carried(state.clone()));
        let batch = preparer.transform_planned(plan, records.clone(), 0, base)?;
        state.overlay(batch.output.state.clone());
        batches.push(BatchRun { records, batch });
    }
    let contract_errors = match &setup.targets {
        Some(targets) => batches
            .iter()
            .flat_map(|b| check_targets(targets, &b.batch.output))
            .collect(),
        None => Vec::new(),
    };
    Ok(SampleReport {
        batches,
        logs: runtime.recent_logs(),
        contract_errors,
        limits,
    })
}

/// Keyed state carried from one batch of a sample to the next: a key the
/// batches before never wrote is absent. The timers they set come due as
/// a pipeline's do (the due list a run asks for under a due key).
struct Carried(StateMap);

impl StateBase for Carried {
    fn get(&self, tp: &TopicPartition, key: &[u8]) -> Result<Option<StateValue>, StateError> {
        if let Some(watermark) = event_time::parse_due_key(key) {
            return Ok(self.due(tp, watermark));
        }
        Ok(self.0.lookup(tp, key).flatten().cloned())
    }
}

impl Carried {
    /// The timers of `tp` set (and not deleted) at or before `watermark`.
    fn due(&self, tp: &TopicPartition, watermark: i64) -> Option<StateValue> {
        let keys = self.0.0.get(tp)?;
        let due: Vec<Timer> = keys
            .range(event_time::timer_prefix().to_vec()..)
            .take_while(|(key, _)| key.starts_with(event_time::timer_prefix()))
            .filter(|(_, value)| value.is_some())
            .filter_map(|(key, _)| Timer::from_state_key(key))
            .take_while(|timer| timer.at_ms <= watermark)
            .collect();
        (!due.is_empty()).then(|| StateValue {
            value: event_time::encode_timers(&due),
            expires_at_ms: None,
        })
    }
}

/// Sample records by (topic, partition), each partition's in file order.
type Partitions = BTreeMap<(String, i32), Vec<OwnedRecord>>;

/// Parses the sample ([`crate::sample`]) into records by partition: a line
/// without `topic` is in `sample`, without `partition` in 0, without
/// `offset` one past its partition's previous record (from 0; offsets must
/// increase), without `timestamp` at 0.
///
/// Returns the line number and message of the first bad line.
pub fn parse_sample(text: &str) -> Result<Partitions, (usize, String)> {
    let mut partitions = Partitions::new();
    for (line_no, line) in sample::lines(text)? {
        let topic = line.topic.unwrap_or_else(|| "sample".to_string());
        let partition = line.partition.unwrap_or(0);
        let records = partitions.entry((topic.clone(), partition)).or_default();
        let previous = records.last().map(|r| r.offset);
        let offset = match line.offset {
            Some(o) if previous.is_some_and(|p| o <= p) => {
                return Err((
                    line_no,
                    format!("`offset` {o} does not increase within {topic}:{partition}"),
                ));
            }
            Some(o) => o,
            None => previous.map_or(0, |p| p + 1),
        };
        records.push(OwnedRecord {
            offset,
            timestamp: line.timestamp.unwrap_or(0),
            key: line.key,
            value: line.value,
            headers: line.headers,
        });
    }
    if partitions.is_empty() {
        return Err((0, "the sample has no records".into()));
    }
    Ok(partitions)
}

/// The sample's batches: each holds up to `size` records of every
/// partition (all of them with no size), a slice per partition.
fn batches_of(
    partitions: &Partitions,
    size: Option<NonZeroUsize>,
) -> Vec<(Vec<OffsetRange>, Records)> {
    let size = size.map_or(usize::MAX, NonZeroUsize::get);
    let longest = partitions.values().map(Vec::len).max().unwrap_or(0);
    (0..longest.div_ceil(size))
        .map(|n| {
            let mut records = Records::default();
            let mut ranges = Vec::new();
            for ((topic, partition), owned) in partitions {
                let start = (n * size).min(owned.len());
                let part = &owned[start..(start.saturating_add(size)).min(owned.len())];
                let (Some(first), Some(last)) = (part.first(), part.last()) else {
                    continue;
                };
                records.push_slice(topic, *partition, part);
                ranges.push(OffsetRange {
                    topic: topic.clone(),
                    partition: *partition,
                    from: first.offset,
                    until: last.offset + 1,
                });
            }
            (ranges, records)
        })
        .collect()
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

impl BatchRun {
    fn commit(&self) -> Commit<'_> {
        Commit {
            plan: &self.batch.plan,
            records: &self.records,
            output: &self.batch.output,
            dead_letters: &self.batch.dead_letters,
            output_digest: &self.batch.output_digest,
            state_reads: &self.batch.state_reads,
        }
    }

    /// Its ranges, as `topic:partition from..until`, comma-separated.
    fn ranges(&self) -> String {
        let ranges = self.batch.plan.ranges.iter();
        ranges
            .map(|r| format!("{}:{} {}..{}", r.topic, r.partition, r.from, r.until))
            .collect::<Vec<_>>()
            .join(", ")
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

    /// Rows (aligned tables), dead letters and the state written.
    fn table(&self) -> String {
        let mut text = crate::sink::stdout::render_rows(&self.commit(), StdoutFormat::Table);
        if !self.batch.dead_letters.is_empty() {
            text.push_str("dead letters:\n");
            for d in &self.batch.dead_letters {
                text.push_str(&format!("  {}\n", self.dead_letter_line(d)));
            }
        }
        if !self.batch.output.state.is_empty() {
            text.push_str("state written:\n");
            for change in self.state_changes() {
                text.push_str(&format!("  {}\n", change.line("deleted")));
            }
        }
        text
    }

    /// JSON lines: one per row (as the stdout sink's), per dead letter and
    /// per state key written.
    fn json_lines(&self) -> String {
        let commit = self.commit();
        let mut text = crate::sink::stdout::render_rows(&commit, StdoutFormat::Json);
        text.push_str(&crate::sink::stdout::render_dead_letters(&commit));
        for change in self.state_changes() {
            text.push_str(&format!("{}\n", json!({ "state": change.json() })));
        }
        text
    }

    fn summary(&self) -> Json {
        let usage = self.batch.usage;
        json!({
            "ranges": self.ranges(),
            "records": self.records.len(),
            "rows": self.batch.output.row_count(),
            "dead_letters": self.batch.dead_letters.len(),
            "state_keys_written": self.batch.output.state.len(),
            "output_digest": self.batch.output_digest,
            "fuel_used": usage.fuel,
            "peak_memory_bytes": usage.peak_memory_bytes,
        })
    }
}

impl SampleReport {
    /// The run's digest: its batch's output digest; over several batches,
    /// the SHA-256 of theirs, one per line, in order.
    pub fn output_digest(&self) -> String {
        match self.batches.as_slice() {
            [one] => one.batch.output_digest.clone(),
            several => {
                let lines: Vec<&str> = several
                    .iter()
                    .map(|b| b.batch.output_digest.as_str())
                    .collect();
                crate::batch::sha256_hex(lines.join("\n").as_bytes())
            }
        }
    }

    /// The fuel all batches used, and the most memory one held.
    fn usage(&self) -> BatchUsage {
        let each = self.batches.iter().map(|b| b.batch.usage);
        each.fold(BatchUsage::default(), |all, one| BatchUsage {
            fuel: Some(all.fuel.unwrap_or(0) + one.fuel.unwrap_or(0)),
            peak_memory_bytes: all.peak_memory_bytes.max(one.peak_memory_bytes),
        })
    }

    /// Each batch's rows (aligned tables), dead letters and state written;
    /// then logs, the digest and what the batches used of their limits.
    pub fn table(&self) -> String {
        let mut text = String::new();
        for (n, batch) in self.batches.iter().enumerate() {
            if self.batches.len() > 1 {
                text.push_str(&format!("batch {}: {}\n", n + 1, batch.ranges()));
            }
            text.push_str(&batch.table());
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
        text.push_str(&format!("output digest: {}\n", self.output_digest()));
        let usage = self.usage();
        text.push_str(&format!(
            "used: fuel {} (limits.fuel_per_batch {}), peak memory {} KiB (limits.max_memory_mib {})\n",
            usage.fuel.unwrap_or(0),
            self.limits.fuel_per_batch,
            usage.peak_memory_bytes.unwrap_or(0) >> 10,
            self.limits.max_memory_mib(),
        ));
        text
    }

    /// JSON lines: each batch's rows (as the stdout sink's), dead letters
    /// and state keys written; then log lines, and a last `summary` line.
    pub fn json_lines(&self) -> String {
        let mut text: String = self.batches.iter().map(BatchRun::json_lines).collect();
        for line in &self.logs {
            let log = json!({ "log": { "level": line.level.as_str(), "message": line.message } });
            text.push_str(&format!("{log}\n"));
        }
        let sum = |count: fn(&BatchRun) -> u64| self.batches.iter().map(count).sum::<u64>();
        let usage = self.usage();
        let summary = json!({ "summary": {
            "records": sum(|b| b.records.len() as u64),
            "rows": sum(|b| b.batch.output.row_count()),
            "rejections": sum(|b| b.batch.output.rejections.len() as u64),
            "dead_letters": sum(|b| b.batch.dead_letters.len() as u64),
            "state_keys_written": sum(|b| b.batch.output.state.len() as u64),
            "contract_errors": self.contract_errors,
            "output_digest": self.output_digest(),
            "fuel_used": usage.fuel,
            "peak_memory_bytes": usage.peak_memory_bytes,
            "limits": {
                "fuel_per_batch": self.limits.fuel_per_batch,
                "max_memory_mib": self.limits.max_memory_mib(),
                "batch_timeout_ms": self.limits.batch_timeout.as_millis() as u64,
            },
            "batches": self.batches.iter().map(BatchRun::summary).collect::<Vec<_>>(),
        }});
        text.push_str(&format!("{summary}\n"));
        text
    }

    /// How this run's result differs from `expected`, the `--json` output of
    /// an earlier run: its rows, dead letters, state written and output
    /// digest (log lines and the rest of the summary are not compared).
    /// Empty when they agree.
    pub fn differences(&self, expected: &str) -> Result<Vec<String>, String> {
        let results = |text: &str| -> Result<(Vec<String>, Option<String>), String> {
            let mut lines = Vec::new();
            let mut digest = None;
            for (n, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                let json: Json = serde_json::from_str(line)
                    .map_err(|e| format!("line {}: not JSON ({e})", n + 1))?;
                if let Some(summary) = json.get("summary") {
                    digest = summary["output_digest"].as_str().map(str::to_string);
                } else if json.get("log").is_none() {
                    lines.push(json.to_string());
                }
            }
            Ok((lines, digest))
        };
        let (want, want_digest) = results(expected)?;
        let (got, got_digest) = results(&self.json_lines()).expect("our own JSON lines");
        let mut said = Vec::new();
        for line in only_in(&want, &got).into_iter().take(MAX_SAID) {
            said.push(format!("- {line}"));
        }
        for line in only_in(&got, &want).into_iter().take(MAX_SAID) {
            said.push(format!("+ {line}"));
        }
        if want_digest != got_digest {
            said.push(format!(
                "output digest: expected {}, got {}",
                want_digest.as_deref().unwrap_or("none"),
                got_digest.as_deref().unwrap_or("none")
            ));
        }
        Ok(said)
    }
}

/// Lines of each kind `--expect` says at most.
const MAX_SAID: usize = 20;

/// The lines of `a` that `b` does not have (as many times as `a` has them
/// more), in `a`'s order.
fn only_in<'a>(a: &'a [String], b: &[String]) -> Vec<&'a str> {
    let mut left: BTreeMap<&str, usize> = BTreeMap::new();
    for line in b {
        *left.entry(line).or_default() += 1;
    }
    a.iter()
        .filter(|line| match left.get_mut(line.as_str()) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .map(String::as_str)
        .collect()
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
        // What a line may hold is `sample`'s (and its tests'); these are
        // the batch's own rules.
        for (text, expected) in [
            ("[1]", "must be a JSON object"),
            (
                r#"{"offset": 5}
{"offset": 5}"#,
                "does not increase",
            ),
            ("", "no records"),
        ] {
            let (_, message) = parse_sample(text).unwrap_err();
            assert!(message.contains(expected), "{text}: {message}");
        }
    }
}
