//! Preparing a batch: plan its ranges, take their records from the source's
//! buffers and run the transform under the retry and poison policy: retry
//! what may pass on another try (a retryable declared error; a deadline or
//! a trap once), then bisect down to the records that fail the module on
//! their own (trap, fuel, memory, deadline, output size or contract) and
//! dead-letter them, within a bound: past `limits.max_poison_share` or
//! `limits.isolation_budget` the module, not the records, is at fault.
//! The pipeline runs this on a blocking thread while the previous batch
//! commits; shutdown interrupts it at once.
//!
//! It must not commit, mark ranges committed or seek: a prepared batch is
//! only a proposal until the sink's offset compare-and-set accepts it.

use super::PipelineError;
use crate::batch::{OffsetRange, Plan, Records, describe, now_ms, sha256_hex};
use crate::config::OnPoison;
use sluice_core::backoff::{GiveUp, RetryPolicy};
use sluice_core::contract::OutputContract;
use sluice_core::output::Output;
use sluice_core::sink::{DeadLetter, DeadLetterKind, digest};
use sluice_core::source::Source;
use sluice_core::state::{BatchBase, StateBase, StateMap};
use sluice_core::transform::{BatchUsage, GaveUp, ModuleAtFault, RunError, Transform};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How a retryable failure that is not a record's (an instance the pool
/// could not give, a retryable declared error) is retried before the
/// pipeline stops: 3 more tries; an instance waits (the pool frees a slot)
/// 100 ms, then 200, then 400.
const TRANSFORM_RETRY: RetryPolicy = RetryPolicy {
    first: Duration::from_millis(100),
    max: Duration::from_secs(1),
    give_up: GiveUp::AfterTries(4),
};

/// A planned and transformed batch, ready to commit.
pub struct Batch {
    pub plan: Plan,
    pub records: Records,
    pub output: Output,
    pub dead_letters: Vec<DeadLetter>,
    pub output_digest: String,
    /// The keyed state the batch's runs read, as the batch started: what
    /// a replay of it needs (empty for a module that keeps no state).
    pub state_reads: StateMap,
    /// How many of the deletions in `output.state` are not the module's
    /// but expired keys the batch removes (see [`sweep`]).
    pub state_expired: usize,
    /// Time spent taking the records from the source's buffers.
    pub read_ms: u64,
    /// Time spent in the transform (retries and bisection included).
    pub transform_ms: u64,
    /// What the transform's runs used (retries and bisection included).
    pub usage: BatchUsage,
}

/// Adds to `output`'s state changes the deletion of the keys in the
/// batch's partitions that `state` finds expired at the batch time and the
/// module left alone, after the digest: they are not part of the batch's
/// result (an expired key reads as absent either way), only what keeps
/// expired state from staying stored. Returns how many.
fn sweep(plan: &Plan, state: &dyn StateBase, output: &mut Output) -> usize {
    let expired = state.expired(&plan.partitions(), plan.batch_time_ms, &output.state);
    let count = expired.len();
    output.state.overlay(expired);
    count
}

/// Plans and transforms batches of one pipeline.
pub struct Preparer<T: Transform> {
    pipeline: String,
    on_poison: OnPoison,
    transform: T,
    params_digest: String,
    /// [`Plan::settings`] of every batch prepared here.
    settings: String,
    /// The sink's targets every run's output must fit.
    contract: OutputContract,
    /// Set by [`Preparer::interrupt`]: no run starts any more.
    interrupted: AtomicBool,
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
            contract: OutputContract::any(),
            interrupted: AtomicBool::new(false),
        }
    }

    /// Checks every run's output against `contract` (the sink's targets),
    /// so a record whose rows break it is isolated as a `contract` poison.
    pub fn with_contract(mut self, contract: OutputContract) -> Self {
        self.contract = contract;
        self
    }

    /// Stops the run in progress at once and every later one: the batch
    /// being prepared fails with [`RunError::Interrupted`] (shutdown).
    pub fn interrupt(&self) {
        self.interrupted.store(true, Ordering::Relaxed);
        self.transform.interrupt();
    }

    /// The transform batches are prepared with.
    pub fn transform(&self) -> &T {
        &self.transform
    }

    /// Plans `ranges` as the next batch, reads their records from `source`
    /// and transforms them from `state`.
    pub fn prepare(
        &self,
        source: &impl Source,
        ranges: Vec<OffsetRange>,
        state: Arc<dyn StateBase>,
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
        self.transform_planned(plan, records, read_ms, state)
    }

    /// Transforms `records` under `plan` (a new one, or a replay of a
    /// committed batch's for `verify` and `shadow`) from `state` (the
    /// keyed state as the batch started), recording this preparer's
    /// settings in it.
    pub fn transform_planned(
        &self,
        mut plan: Plan,
        records: Records,
        read_ms: u64,
        state: Arc<dyn StateBase>,
    ) -> Result<Batch, PipelineError> {
        plan.settings = self.settings.clone();
        let transforming = Instant::now();
        state.prefetch(&records);
        let base = BatchBase::new(Arc::clone(&state));
        let transformed = self.transform_batch(&plan, &records, &base);
        // Every run of the batch is done: each record's log lines once.
        let usage = self.transform.settle(&plan.batch_id);
        let (mut output, dead_letters) = transformed?;
        let output_digest = digest(&output, &dead_letters);
        let state_expired = sweep(&plan, state.as_ref(), &mut output);
        Ok(Batch {
            plan,
            records,
            output,
            dead_letters,
            output_digest,
            state_reads: base.take_reads(),
            state_expired,
            read_ms,
            transform_ms: transforming.elapsed().as_millis() as u64,
            usage,
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
        base: &Arc<BatchBase>,
    ) -> Result<(Output, Vec<DeadLetter>), PipelineError> {
        let fail = |error| PipelineError::Transform {
            batch_id: plan.batch_id.clone(),
            ranges: describe(&plan.ranges),
            error,
        };
        let mut spent = Spent::default();
        let first = self.run_with_retries(plan, records, Confirm::Once, &mut spent, base);
        let (output, mut dead) = match first {
            Ok(output) => (output, Vec::new()),
            Err(e) if poison_kind(&e).is_some() && self.on_poison == OnPoison::DeadLetter => {
                tracing::warn!(batch = %plan.batch_id, "{e}; bisecting the batch to isolate the records that cause it");
                let isolated = self.isolate(plan, records, e, &mut spent, base);
                let isolated = isolated.and_then(|(output, dead)| {
                    self.without_poison(plan, records, output, dead, &mut spent, base)
                });
                isolated.map_err(fail)?
            }
            Err(e) => return Err(fail(e)),
        };
        let refused = (output.rejections.iter()).map(|r| (r, DeadLetterKind::Rejected));
        let late = output.late.iter().map(|r| (r, DeadLetterKind::Late));
        dead.extend(refused.chain(late).map(|(r, kind)| DeadLetter {
            index: r.index as usize,
            reason: r.reason.clone(),
            kind,
        }));
        // One dead letter per record (a module may reject a record twice).
        dead.sort_by_key(|d| d.index);
        dead.dedup_by_key(|d| d.index);
        Ok((output, dead))
    }

    /// The result of a batch whose poison records were isolated, for a
    /// module that keeps state: one run of all the other records, in
    /// order, from the batch's start state. (The parts a bisection ran
    /// each started from that state too, without the writes of the parts
    /// before them; joining their outputs would not be the batch without
    /// its poison.) When that run fails too (a record fails only after
    /// the writes of those before it, or the batch as a whole breaks a
    /// limit such as the keys a batch may write, which no part does), the
    /// record at fault is the last of the shortest failing prefix
    /// ([`Self::first_failing`]); it becomes a dead letter and the rest run
    /// again, each round one record more, within the isolation's bound.
    /// A stateless batch keeps the joined outputs of its parts.
    fn without_poison(
        &self,
        plan: &Plan,
        records: &Records,
        output: Output,
        mut dead: Vec<DeadLetter>,
        spent: &mut Spent,
        base: &Arc<BatchBase>,
    ) -> Result<(Output, Vec<DeadLetter>), RunError> {
        let stateful = !output.state.is_empty() || base.has_reads();
        if !stateful {
            return Ok((output, dead));
        }
        let bound = self.bound(records.len());
        loop {
            let poison: std::collections::HashSet<usize> = dead.iter().map(|d| d.index).collect();
            let live: Vec<usize> = (0..records.len()).filter(|i| !poison.contains(i)).collect();
            let failed = match self.run_indices(plan, records, &live, spent, base) {
                Ok(output) => {
                    dead.sort_by_key(|d| d.index);
                    return Ok((output, dead));
                }
                Err(e) if poison_kind(&e).is_some() => e,
                Err(e) => return Err(e),
            };
            let (at, error) = self.first_failing(plan, records, &live, failed, spent, base)?;
            let kind = poison_kind(&error).expect("only poison is isolated");
            dead.push(DeadLetter {
                index: live[at],
                reason: error.to_string(),
                kind,
            });
            if let Some(why) = bound.passed(spent, dead.len()) {
                return Err(self.at_fault(why, spent, dead.len(), records.len(), &error));
            }
        }
    }

    /// Where in `live` (record indices, in order; run whole it failed with
    /// `failed`) the record at fault is for a stateful module: the last of
    /// the shortest prefix that fails, found by halving (a record sees the
    /// writes of every record before it, so the prefix, not the record
    /// alone, is what fails). Returns its position and the failure of
    /// that prefix. It takes at most log2(n) + 1 runs, charged to `spent`
    /// (the caller checks the isolation's bound after each record).
    fn first_failing(
        &self,
        plan: &Plan,
        records: &Records,
        live: &[usize],
        failed: RunError,
        spent: &mut Spent,
        base: &Arc<BatchBase>,
    ) -> Result<(usize, RunError), RunError> {
        let (mut passes, mut fails, mut error) = (0, live.len(), failed);
        while fails - passes > 1 {
            let mid = passes + (fails - passes) / 2;
            match self.run_indices(plan, records, &live[..mid], spent, base) {
                Ok(_) => passes = mid,
                Err(e) if poison_kind(&e).is_some() => (fails, error) = (mid, e),
                Err(e) => return Err(e),
            }
        }
        Ok((fails - 1, error))
    }

    /// One run of the records at `indices` of `records`, its output
    /// indexed as in `records`.
    fn run_indices(
        &self,
        plan: &Plan,
        records: &Records,
        indices: &[usize],
        spent: &mut Spent,
        base: &Arc<BatchBase>,
    ) -> Result<Output, RunError> {
        let (sub, map) = records.select(indices);
        let ran = self.run_with_retries(plan, &sub, Confirm::No, spent, base)?;
        let mut output = Output::default();
        output.absorb(ran, &map);
        Ok(output)
    }

    /// One run of `records`: the transform's, then the sink's output
    /// contract; stopped before it starts once interrupted.
    fn run_once(
        &self,
        plan: &Plan,
        records: &Records,
        base: &Arc<BatchBase>,
    ) -> Result<Output, RunError> {
        if self.interrupted.load(Ordering::Relaxed) {
            return Err(RunError::Interrupted);
        }
        let output = self.transform.run(plan, records, base.clone())?;
        self.contract
            .check(&output)
            .map_err(|e| RunError::BadOutput(e.to_string()))?;
        Ok(output)
    }

    /// Runs `records`, again on what may pass another time: an instance
    /// the pool could not give or a retryable declared error as
    /// [`TRANSFORM_RETRY`] says; with [`Confirm::Once`] a trap or a
    /// deadline once more (a module may trap on a host hiccup it cannot
    /// see, a machine may be slow). Every attempt is charged to `spent`.
    fn run_with_retries(
        &self,
        plan: &Plan,
        records: &Records,
        confirm: Confirm,
        spent: &mut Spent,
        base: &Arc<BatchBase>,
    ) -> Result<Output, RunError> {
        let mut backoff = TRANSFORM_RETRY.start();
        let mut confirmed = confirm == Confirm::No;
        loop {
            let started = Instant::now();
            let result = self.run_once(plan, records, base);
            spent.charge(&result, started.elapsed(), self.transform.limits());
            let error = match result {
                Ok(output) => return Ok(output),
                Err(e) => e,
            };
            match error {
                e @ (RunError::Instantiate(_)
                | RunError::State(sluice_core::state::StateError::Unavailable(_))
                | RunError::Declared {
                    retryable: true, ..
                }) => {
                    let Some(wait) = backoff.next_wait() else {
                        return Err(e);
                    };
                    tracing::warn!(batch = %plan.batch_id, records = records.len(), "{e}; retrying");
                    if let RunError::Instantiate(_) = e {
                        // Give the pool time to free a slot.
                        std::thread::sleep(wait);
                    }
                }
                e @ (RunError::Trap(_) | RunError::Timeout(_)) if !confirmed => {
                    tracing::warn!(batch = %plan.batch_id, records = records.len(), "{e}; trying once more");
                    confirmed = true;
                }
                e => return Err(e),
            }
        }
    }

    /// Isolates the records that fail the module on their own, after the
    /// whole batch failed with `first`: splits failed parts in halves,
    /// depth first and in record order, until every part either runs or
    /// is one record that fails on its own (twice, for a trap or a
    /// deadline), which becomes a dead letter of its kind. Iterative, so a
    /// batch of any size needs no deeper stack; each record is in at most
    /// log2(n) + 1 runs. A failure that is not a record's (a declared
    /// error, an interruption) stops it. So does the isolation's bound:
    /// more poison than `limits.max_poison_share`, or a cost over
    /// `limits.isolation_budget` is the module's fault
    /// ([`RunError::ModuleAtFault`]). A batch of no records that fails has
    /// nothing to isolate and is committed empty.
    fn isolate(
        &self,
        plan: &Plan,
        records: &Records,
        first: RunError,
        spent: &mut Spent,
        base: &Arc<BatchBase>,
    ) -> Result<(Output, Vec<DeadLetter>), RunError> {
        let bound = self.bound(records.len());
        let mut output = Output::default();
        let mut dead = Vec::new();
        let mut parts: Vec<Vec<usize>> = Vec::new();
        // The newest failure, named when isolating is given up.
        let mut last = first.clone();
        let mut failed = Some(((0..records.len()).collect::<Vec<_>>(), first));
        let mut said = Instant::now();
        loop {
            if let Some((indices, error)) = failed.take() {
                let kind = poison_kind(&error).expect("only poison is isolated");
                match indices.len() {
                    0 => {
                        tracing::warn!(batch = %plan.batch_id, "the module fails on a batch without records; committing it empty")
                    }
                    1 => dead.push(DeadLetter {
                        index: indices[0],
                        reason: error.to_string(),
                        kind,
                    }),
                    _ => {
                        let mut left = indices;
                        let right = left.split_off(left.len() / 2);
                        // The stack pops the left half first: record order.
                        parts.push(right);
                        parts.push(left);
                    }
                }
                last = error;
            }
            if let Some(why) = bound.passed(spent, dead.len()) {
                return Err(self.at_fault(why, spent, dead.len(), records.len(), &last));
            }
            let Some(indices) = parts.pop() else {
                break;
            };
            if said.elapsed() >= ISOLATION_PROGRESS_EVERY {
                said = Instant::now();
                tracing::warn!(
                    batch = %plan.batch_id, runs = spent.runs, isolated = dead.len(),
                    "still isolating poison records: {:.1} of {} batch budgets spent",
                    spent.budgets, bound.budgets
                );
            }
            let (sub, map) = records.select(&indices);
            let confirm = match indices.len() {
                1 => Confirm::Once,
                _ => Confirm::No,
            };
            match self.run_with_retries(plan, &sub, confirm, spent, base) {
                Ok(o) => {
                    output.absorb(o, &map);
                    self.check_merged_output(&output)?;
                }
                Err(e) if poison_kind(&e).is_some() => failed = Some((indices, e)),
                Err(e) => return Err(e),
            }
        }
        Ok((output, dead))
    }

    /// How far isolating the poison of a batch of `records` may go.
    fn bound(&self, records: usize) -> Bound {
        let limits = self.transform.limits();
        Bound {
            budgets: limits.isolation.batch_budgets(records),
            max_poison: limits.isolation.max_poison(records),
            setting: limits.isolation.records,
        }
    }

    /// The error that gives up isolating: the module is at fault; `last`
    /// is the newest failure (a poison kind).
    fn at_fault(
        &self,
        why: GaveUp,
        spent: &Spent,
        isolated: usize,
        records: usize,
        last: &RunError,
    ) -> RunError {
        let kind = poison_kind(last).expect("only poison is isolated");
        RunError::ModuleAtFault(Box::new(ModuleAtFault {
            module: self.transform.module_digest().to_string(),
            why,
            isolated,
            records,
            runs: spent.runs,
            kind: kind.as_str().to_string(),
            last: last.to_string(),
        }))
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

/// Whether a failed trap or deadline is tried once more before it counts:
/// for the whole batch and for a single record, whose failure decides
/// something (bisecting, a dead letter); not for the parts between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Confirm {
    Once,
    No,
}

/// How often a long isolation says how far it is.
const ISOLATION_PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// What a batch's runs have cost so far.
#[derive(Debug, Default)]
struct Spent {
    runs: u32,
    /// In batch budgets: a run that ran out of fuel, passed the memory
    /// cap or the deadline spent one; any other its share of the deadline.
    budgets: f64,
}

impl Spent {
    fn charge(
        &mut self,
        result: &Result<Output, RunError>,
        took: std::time::Duration,
        limits: &sluice_core::limits::Limits,
    ) {
        self.runs += 1;
        self.budgets += match result {
            Err(RunError::OutOfFuel(_) | RunError::MemoryExceeded(_) | RunError::Timeout(_)) => 1.0,
            _ => took.as_secs_f64() / limits.batch_timeout.as_secs_f64().max(f64::MIN_POSITIVE),
        };
    }
}

/// Where isolating a batch stops being the records' fault.
struct Bound {
    budgets: f64,
    max_poison: usize,
    /// `limits.isolation_budget`, to name in the error.
    setting: u32,
}

impl Bound {
    fn passed(&self, spent: &Spent, isolated: usize) -> Option<GaveUp> {
        if isolated > self.max_poison {
            return Some(GaveUp::Share {
                max_poison: self.max_poison,
            });
        }
        (spent.budgets > self.budgets).then_some(GaveUp::Budget {
            budgets: self.budgets as u64,
            records: self.setting,
        })
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
        RunError::BadOutput(_) => Some(DeadLetterKind::Contract),
        _ => None,
    }
}
