//! Preparing a batch: plan its ranges, take their records from the source's
//! buffers and run the transform under the retry and poison policy: retry
//! what may pass on another try (a deadline, a retryable declared error, a
//! trap once), then bisect down to the records that fail the module on
//! their own (trap, fuel, memory, deadline) and dead-letter them. The
//! pipeline runs this on a blocking thread while the previous batch commits.
//!
//! It must not commit, mark ranges committed or seek: a prepared batch is
//! only a proposal until the sink's offset compare-and-set accepts it.

use super::PipelineError;
use crate::batch::{OffsetRange, Plan, Records, describe, now_ms, sha256_hex};
use crate::config::OnPoison;
use sluice_core::output::Output;
use sluice_core::sink::{DeadLetter, DeadLetterKind, digest};
use sluice_core::source::Source;
use sluice_core::transform::{RunError, Transform};
use std::time::Instant;

/// Times a retryable transform failure (timeout, retryable declared error)
/// is retried before the pipeline stops.
const TRANSFORM_RETRIES: u32 = 3;

/// Wait before retrying a batch whose instance could not be made, times the
/// attempt.
const INSTANTIATE_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// A planned and transformed batch, ready to commit.
pub struct Batch {
    pub plan: Plan,
    pub records: Records,
    pub output: Output,
    pub dead_letters: Vec<DeadLetter>,
    pub output_digest: String,
    /// Time spent taking the records from the source's buffers.
    pub read_ms: u64,
    /// Time spent in the transform (retries and bisection included).
    pub transform_ms: u64,
    /// Fuel the transform's runs used (retries and bisection included), if
    /// it counts fuel.
    pub fuel_used: Option<u64>,
}

/// Plans and transforms batches of one pipeline.
pub struct Preparer<T: Transform> {
    pipeline: String,
    on_poison: OnPoison,
    transform: T,
    params_digest: String,
    /// [`Plan::settings`] of every batch prepared here.
    settings: String,
}

impl<T: Transform> Preparer<T> {
    pub fn new(pipeline: String, on_poison: OnPoison, transform: T) -> Self {
        let params_digest = sha256_hex(transform.params().as_bytes());
        let settings = transform.limits().replay_settings(on_poison).to_json();
        Preparer {
            pipeline,
            on_poison,
            transform,
            params_digest,
            settings,
        }
    }

    /// The transform batches are prepared with.
    pub fn transform(&self) -> &T {
        &self.transform
    }

    /// Plans `ranges` as the next batch, reads their records from `source`
    /// and transforms them.
    pub fn prepare(
        &self,
        source: &impl Source,
        ranges: Vec<OffsetRange>,
    ) -> Result<Batch, PipelineError> {
        let started = Instant::now();
        let plan = Plan::new(
            &self.pipeline,
            ranges,
            self.transform.module_digest(),
            &self.params_digest,
            now_ms(),
        );
        let records = source.records(&plan.ranges);
        let read_ms = started.elapsed().as_millis() as u64;
        self.transform_planned(plan, records, read_ms)
    }

    /// Transforms `records` under `plan` (a new one, or a replay of a
    /// committed batch's for `verify` and `shadow`), recording this
    /// preparer's settings in it.
    pub fn transform_planned(
        &self,
        mut plan: Plan,
        records: Records,
        read_ms: u64,
    ) -> Result<Batch, PipelineError> {
        plan.settings = self.settings.clone();
        let transforming = Instant::now();
        let transformed = self.transform_batch(&plan, &records);
        // Every run of the batch is done: each record's log lines once.
        let fuel_used = self.transform.settle(&plan.batch_id);
        let (output, dead_letters) = transformed?;
        let output_digest = digest(&output, &dead_letters);
        Ok(Batch {
            plan,
            records,
            output,
            dead_letters,
            output_digest,
            read_ms,
            transform_ms: transforming.elapsed().as_millis() as u64,
            fuel_used,
        })
    }

    /// sha256 of the params batches are prepared with.
    pub fn params_digest(&self) -> &str {
        &self.params_digest
    }

    /// Runs the transform with the retry and poison policy; returns the
    /// output and the dead letters (rejections and isolated poison records).
    fn transform_batch(
        &self,
        plan: &Plan,
        records: &Records,
    ) -> Result<(Output, Vec<DeadLetter>), PipelineError> {
        let fail = |error| PipelineError::Transform {
            batch_id: plan.batch_id.clone(),
            ranges: describe(&plan.ranges),
            error,
        };
        let (output, mut dead) = match self.run_with_retries(plan, records) {
            Ok(output) => (output, Vec::new()),
            Err(e) if poison_kind(&e).is_some() && self.on_poison == OnPoison::DeadLetter => {
                tracing::warn!(batch = %plan.batch_id, "{e}; bisecting the batch to isolate the records that cause it");
                self.bisect(plan, records).map_err(fail)?
            }
            Err(e) => return Err(fail(e)),
        };
        dead.extend(output.rejections.iter().map(|r| DeadLetter {
            index: r.index as usize,
            reason: r.reason.clone(),
            kind: DeadLetterKind::Rejected,
        }));
        // One dead letter per record (a module may reject a record twice).
        dead.sort_by_key(|d| d.index);
        dead.dedup_by_key(|d| d.index);
        Ok((output, dead))
    }

    /// Runs `records` once, again on what may pass another time: a deadline
    /// or a retryable declared error up to [`TRANSFORM_RETRIES`] times, a
    /// trap once (a module may trap on a host hiccup it cannot see).
    fn run_with_retries(&self, plan: &Plan, records: &Records) -> Result<Output, RunError> {
        let mut attempt = 0;
        let mut trapped_once = false;
        loop {
            attempt += 1;
            match self.transform.run(plan, records) {
                Ok(output) => return Ok(output),
                Err(e) if e.is_retryable() && attempt <= TRANSFORM_RETRIES => {
                    tracing::warn!(batch = %plan.batch_id, records = records.len(), "{e}; retrying");
                    if let RunError::Instantiate(_) = e {
                        // Give the pool time to free a slot.
                        std::thread::sleep(INSTANTIATE_BACKOFF * attempt);
                    }
                }
                Err(RunError::Trap(msg)) if !trapped_once => {
                    tracing::warn!(batch = %plan.batch_id, records = records.len(), "transform trapped, retrying once: {msg}");
                    trapped_once = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Splits the batch in halves, depth first and in record order, until
    /// every part either runs or is one record that fails on its own, which
    /// becomes a dead letter of its kind. Iterative, so a batch of any size
    /// needs no deeper stack; each record is in at most log2(n) + 1 runs. A
    /// failure that is not a record's (a declared error, bad output) stops
    /// it. A batch of no records that fails has nothing to isolate and is
    /// committed empty.
    fn bisect(
        &self,
        plan: &Plan,
        records: &Records,
    ) -> Result<(Output, Vec<DeadLetter>), RunError> {
        let mut output = Output::default();
        let mut dead = Vec::new();
        let mut parts: Vec<Vec<usize>> = vec![(0..records.len()).collect()];
        while let Some(indices) = parts.pop() {
            if indices.is_empty() {
                tracing::warn!(batch = %plan.batch_id, "the module fails on a batch without records; committing it empty");
                continue;
            }
            let (sub, map) = records.select(&indices);
            let error = match self.run_with_retries(plan, &sub) {
                Ok(o) => {
                    output.absorb(o, &map);
                    self.check_merged_output(&output)?;
                    continue;
                }
                Err(e) => e,
            };
            match poison_kind(&error) {
                Some(kind) if indices.len() == 1 => dead.push(DeadLetter {
                    index: indices[0],
                    reason: error.to_string(),
                    kind,
                }),
                Some(_) => {
                    let mut left = indices;
                    let right = left.split_off(left.len() / 2);
                    // The stack pops the left half first: record order.
                    parts.push(right);
                    parts.push(left);
                }
                None => return Err(error),
            }
        }
        Ok((output, dead))
    }

    /// The parts of a bisected batch each fit the output budget; together
    /// they may not, and no record is at fault: the batch is too large.
    fn check_merged_output(&self, output: &Output) -> Result<(), RunError> {
        match self.transform.limits().check_output(output) {
            Err(RunError::OutputTooLarge { mib, limit_mib }) => {
                Err(RunError::BatchOutputTooLarge { mib, limit_mib })
            }
            other => other,
        }
    }
}

/// The dead-letter kind of a failure one record can cause on its own.
fn poison_kind(error: &RunError) -> Option<DeadLetterKind> {
    match error {
        RunError::Trap(_) => Some(DeadLetterKind::Trap),
        RunError::OutOfFuel(_) => Some(DeadLetterKind::Fuel),
        RunError::MemoryExceeded(_) => Some(DeadLetterKind::Memory),
        RunError::Timeout(_) => Some(DeadLetterKind::Deadline),
        RunError::NonFinite(_) => Some(DeadLetterKind::NonFinite),
        RunError::OutputTooLarge { .. } => Some(DeadLetterKind::Output),
        _ => None,
    }
}
