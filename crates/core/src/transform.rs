//! The transform contract as the batch loop sees it: the `Transform` trait
//! (implemented by the Wasm runtime) and `RunError`, why a batch produced no
//! output.
//!
//! It must not know how a transform runs: no engine, no sandbox here, only
//! what the loop acts on (retry, bisect, dead-letter, stop).

use crate::batch::{Plan, Records};
use crate::limits::Limits;
use crate::output::Output;
use crate::state::{StateBase, StateError};
use std::sync::Arc;

/// What a batch's runs used, summed over its retries and bisection; `None`
/// where the transform does not count it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchUsage {
    /// Fuel (Wasm instructions, roughly) of all its runs.
    pub fuel: Option<u64>,
    /// The most linear memory one of its runs' instances held, in bytes.
    pub peak_memory_bytes: Option<u64>,
}

/// The transform the pipeline runs; implemented by the Wasm runtime. It is
/// shared with the thread that prepares the next batch, hence `Send + Sync`.
pub trait Transform: Send + Sync + 'static {
    /// Module version recorded in plans and lineage.
    fn module_digest(&self) -> &str;
    /// The parameters as `init` receives them.
    fn params(&self) -> &str;
    /// The sandbox limits every batch runs under.
    fn limits(&self) -> &Limits;
    /// Runs one whole batch in a fresh instance; its state calls read
    /// `state` (the state as the batch started), and what it wrote comes
    /// back as [`Output::state`].
    fn run(
        &self,
        plan: &Plan,
        records: &Records,
        state: Arc<dyn StateBase>,
    ) -> Result<Output, RunError>;
    /// Batch `batch_id` will not run again (its result is settled, or it
    /// failed for good): a transform that holds something per batch (the
    /// Wasm runtime holds a failed run's log lines until it knows whether
    /// a retry repeats them) lets go of it now. Returns what the batch's
    /// runs used in all (retries and bisection included), as far as the
    /// transform counts it.
    fn settle(&self, _batch_id: &str) -> BatchUsage {
        BatchUsage::default()
    }
    /// The host is shutting down: every run of this transform in progress
    /// stops at once and every later one fails, with
    /// [`RunError::Interrupted`]. For good: a batch being prepared is
    /// abandoned (its ranges were never committed, so whoever owns them
    /// next reads them again).
    fn interrupt(&self) {}
}

/// Why a batch did not produce output. Callers act on the variant.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RunError {
    /// The transform returned its own batch error.
    #[error("transform failed the batch: {message}")]
    Declared { message: String, retryable: bool },
    /// The transform rejected its parameters in `init`.
    #[error("transform rejected its params: {0}")]
    ParamsRejected(String),
    /// The module trapped (a bug or a poison record): retried, then bisected.
    #[error("transform trapped: {0}")]
    Trap(String),
    /// Fuel ran out: deterministic, the same batch fails the same way again.
    #[error("transform ran out of fuel ({0} units per batch)")]
    OutOfFuel(u64),
    /// The memory cap was hit: deterministic.
    #[error("transform exceeded the memory limit of {0} MiB")]
    MemoryExceeded(u64),
    /// The wall-clock backstop fired: retryable, never recorded as output.
    #[error("transform exceeded the batch deadline of {0} ms")]
    Timeout(u64),
    /// The module returned rows that break the contract.
    #[error("transform returned invalid output: {0}")]
    BadOutput(String),
    /// The output is larger than `limits.max_output_mib`: deterministic,
    /// and isolated like a poison (a smaller batch may fit).
    #[error(
        "transform returned {mib} MiB of output, over the limit of {limit_mib} MiB (`limits.max_output_mib`)"
    )]
    OutputTooLarge { mib: u64, limit_mib: u64 },
    /// The parts of a bisected batch each fit the output budget but not
    /// together: no record is at fault, the batch is too large.
    #[error(
        "the batch's records each fit `limits.max_output_mib` ({limit_mib} MiB) but together return {mib} MiB: lower `source.max_records_per_partition` or raise the limit"
    )]
    BatchOutputTooLarge { mib: u64, limit_mib: u64 },
    /// The module returned a NaN or infinite float: deterministic, and
    /// isolated to the records that produce it.
    #[error("transform returned a float no sink stores: {0}")]
    NonFinite(String),
    /// The host could not instantiate the module.
    #[error("cannot instantiate module: {0}")]
    Instantiate(String),
    /// The host is shutting down and stopped the run: the batch is
    /// abandoned, never committed or recorded.
    #[error("stopped: the host is shutting down")]
    Interrupted,
    /// The module's keyed state could not be read (the store is down, the
    /// sink keeps none, a replay's recorded reads lack a key).
    #[error(transparent)]
    State(StateError),
    /// Isolating the batch's poison records was given up: the module, not
    /// the records, is at fault. Nothing of the batch is committed.
    #[error(transparent)]
    ModuleAtFault(Box<ModuleAtFault>),
}

/// Why the host decided a batch's failures are the module's.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "module {module} is at fault, not the records: {why}; {isolated} of {records} records \
     failed on their own after {runs} runs, the last as `{kind}`: {last}. Nothing of the batch \
     is committed: roll back (`sluice rollback`) or activate a fixed version"
)]
pub struct ModuleAtFault {
    /// The version's module digest.
    pub module: String,
    pub why: GaveUp,
    /// Records isolated as poison when it gave up.
    pub isolated: usize,
    /// Records in the batch.
    pub records: usize,
    /// Runs of the isolation.
    pub runs: u32,
    /// The dead-letter kind of the last failure (`trap`, `fuel`, ...).
    pub kind: String,
    /// The last failure.
    pub last: String,
}

/// Which bound isolating a batch passed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum GaveUp {
    #[error(
        "more than {max_poison} of the batch's records fail on their own (`limits.max_poison_share`)"
    )]
    Share { max_poison: usize },
    #[error(
        "isolating its poison records cost over {budgets} batch budgets (`limits.isolation_budget` = {records})"
    )]
    Budget { budgets: u64, records: u32 },
}

impl RunError {
    /// True if running the same batch again may succeed: a deadline (the
    /// machine may have been slow), an instance the pool could not give
    /// (slots come free), a declared retryable error.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            RunError::Timeout(_)
                | RunError::Instantiate(_)
                | RunError::State(StateError::Unavailable(_))
                | RunError::Declared {
                    retryable: true,
                    ..
                }
        )
    }
}
