//! `[limits]`: the sandbox limits every batch runs under, their defaults
//! and their bounds.
//!
//! It must not enforce them: the runtime and the preparer do.

use super::{Bounded, ConfigError};
use serde::{Deserialize, Serialize};

/// Sandbox limits, applied to every batch.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Fuel per batch (roughly one unit per Wasm instruction). Running out is
    /// deterministic: the same batch fails the same way on every retry.
    #[serde(default = "default_fuel")]
    pub fuel_per_batch: Bounded<1>,
    /// Wall-clock backstop per batch, in milliseconds. Hitting it is treated
    /// as retryable (the machine may have been slow), never as output.
    #[serde(default = "default_timeout")]
    pub batch_timeout_ms: u64,
    /// Linear memory cap per instance, in MiB.
    #[serde(default = "default_memory")]
    pub max_memory_mib: Bounded<1>,
    /// Wasm stack size, in KiB (64 to 8192); a module that recurses deeper
    /// traps.
    #[serde(default = "default_stack")]
    pub max_stack_kib: Bounded<MIN_STACK_KIB, MAX_STACK_KIB>,
    /// What to do with a record that fails the module on its own: one that
    /// makes it trap (twice), run out of fuel, pass the memory cap, hit the
    /// deadline (twice), write a non-finite float, more than
    /// `max_output_mib` or output that breaks the contract (text that is
    /// not UTF-8, a wrong number of values, a target or column the sink
    /// does not declare, a type that does not fit). `dead-letter`: find it
    /// by bisecting the batch, store it as a dead letter of that kind
    /// (`trap`, `fuel`, `memory`, `deadline`, `non-finite`, `output`,
    /// `contract`) and commit the rest, within `isolation_budget` and
    /// `max_poison_share`; `fail`: stop the pipeline. (`on_trap`, its
    /// former name, is still accepted.)
    #[serde(default, alias = "on_trap")]
    pub on_poison: OnPoison,
    /// Most output one batch may hand the host, in MiB (values, lengths,
    /// null flags, rejection reasons); defaults to `max_memory_mib`. More
    /// fails the run before the sink copies it: bisected like a poison, a
    /// record whose output alone is larger becomes an `output` dead letter;
    /// a batch whose records are each fine but together too large fails,
    /// saying to lower `source.max_records_per_partition`. A batch's keyed
    /// state changes count (keys and values, timers' values among them),
    /// and are held to it as the module writes them: the write that would
    /// take them alone past it stops the run then, not after the host has
    /// held more.
    #[serde(default)]
    pub max_output_mib: Option<Bounded<1>>,
    /// Wall-clock budget for compiling a module, in milliseconds (100 to
    /// 3600000). The `sluice` binary compiles in a child process of lower
    /// priority that is killed past it, so a module made to compile slowly
    /// costs a host's cores at most this long, and is refused.
    #[serde(default = "default_compile_timeout")]
    pub compile_timeout_ms: Bounded<100, 3_600_000>,
    /// Memory budget for compiling a module, in MiB (128 to 65536): the
    /// compiling child's address-space limit. A module that needs more is
    /// refused.
    #[serde(default = "default_compile_memory")]
    pub compile_memory_mib: Bounded<128, 65_536>,
    /// How much isolating one batch's poison records may cost before the
    /// host decides the module, not the records, is at fault (1 to 1000).
    /// Counted in isolations of a record that exhausts a limit on its own
    /// (fuel, memory or the deadline): in a batch of n records that takes
    /// about log2(n) + 2 runs, each spending a whole batch budget; a run
    /// that ends otherwise (passes, traps, breaks the output contract)
    /// counts the share of `batch_timeout_ms` it took. Past the budget the
    /// batch is not committed and the pipeline stalls (see
    /// `max_poison_share`).
    #[serde(default = "default_isolation_budget")]
    pub isolation_budget: Bounded<1, 1000>,
    /// Most of a batch's records that may be isolated as poison, as a share
    /// (over 0, at most 1; never fewer than 8 records). A batch where more
    /// of the records fail on their own is not committed: the module is at
    /// fault. A running pipeline
    /// then stalls (nothing of the batch is committed; `status`, the status
    /// page and `sluice_stalled` say why, naming the version) until another
    /// version is activated (`sluice rollback`); `run --until-caught-up`
    /// exits with the reason. 1 never decides by share.
    #[serde(default = "default_max_poison_share")]
    pub max_poison_share: f64,
    /// Largest value a module may keep under one state key, in KiB (1 to
    /// 65536). A `set` past it traps, and the record it was made for
    /// becomes a `contract` dead letter. Recorded with each batch: it can
    /// change a result.
    #[serde(default = "default_max_state_value_kib")]
    pub max_state_value_kib: Bounded<1, 65_536>,
    /// Most distinct state keys one batch may write or delete, over all
    /// its partitions (1 to 100000000). The write of one key more traps,
    /// and the record it was made for becomes a `contract` dead letter
    /// naming this limit (the other records commit, as for any poison
    /// record). Bounds what a batch holds and commits besides its rows.
    /// Recorded with each batch: it can change a result.
    #[serde(default = "default_max_state_keys_per_batch")]
    pub max_state_keys_per_batch: Bounded<1, 100_000_000>,
    /// Memory for the host's cache of keyed state, in MiB (1 to 65536),
    /// over all partitions this instance owns. A partition whose whole
    /// state fits is read once when it is assigned and never again; past
    /// the budget the cache keeps what it can and reads the rest from the
    /// sink as the module asks for it (slower, same result).
    #[serde(default = "default_state_cache_mib")]
    pub state_cache_mib: Bounded<1, 65_536>,
    /// Most keyed state one input partition may keep, in MiB (1 to
    /// 1048576; its keys' and values' bytes, as
    /// `sluice_state_partition_bytes` counts them; unset: no limit). A batch that would take a partition past it is
    /// not committed and the pipeline stops, naming the partition: raise
    /// the limit, or have the module expire or delete keys, and start it
    /// again. Nothing is lost or dead-lettered: which record tips a
    /// partition over depends on every earlier one, not on the record.
    #[serde(default)]
    pub max_state_partition_mib: Option<Bounded<1, 1_048_576>>,
}

/// What to do with records that fail the module on their own.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum OnPoison {
    #[default]
    DeadLetter,
    Fail,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            fuel_per_batch: default_fuel(),
            batch_timeout_ms: default_timeout(),
            max_memory_mib: default_memory(),
            max_stack_kib: default_stack(),
            on_poison: OnPoison::default(),
            max_output_mib: None,
            compile_timeout_ms: default_compile_timeout(),
            compile_memory_mib: default_compile_memory(),
            isolation_budget: default_isolation_budget(),
            max_poison_share: default_max_poison_share(),
            max_state_value_kib: default_max_state_value_kib(),
            max_state_keys_per_batch: default_max_state_keys_per_batch(),
            state_cache_mib: default_state_cache_mib(),
            max_state_partition_mib: None,
        }
    }
}

impl LimitsConfig {
    /// Refuses a value out of its range, naming the field: a pipeline's
    /// config is checked so when it loads; a tool that changes limits
    /// (`sluice test --fuel`) checks them again.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.fuel_per_batch.check("limits.fuel_per_batch")?;
        self.max_memory_mib.check("limits.max_memory_mib")?;
        self.max_stack_kib.check("limits.max_stack_kib")?;
        if let Some(output) = self.max_output_mib {
            output.check("limits.max_output_mib")?;
        }
        self.compile_timeout_ms.check("limits.compile_timeout_ms")?;
        self.compile_memory_mib.check("limits.compile_memory_mib")?;
        self.isolation_budget.check("limits.isolation_budget")?;
        self.max_state_value_kib
            .check("limits.max_state_value_kib")?;
        self.max_state_keys_per_batch
            .check("limits.max_state_keys_per_batch")?;
        self.state_cache_mib.check("limits.state_cache_mib")?;
        if let Some(partition) = self.max_state_partition_mib {
            partition.check("limits.max_state_partition_mib")?;
        }
        let share = self.max_poison_share;
        if !(share > 0.0 && share <= 1.0) {
            return Err(ConfigError::Invalid(format!(
                "`limits.max_poison_share` = {share} must be over 0 and at most 1"
            )));
        }
        Ok(())
    }
}

/// Bounds of `limits.max_stack_kib`. Transforms run on threads whose
/// stack holds the largest Wasm stack plus the host's own frames (see
/// [`TRANSFORM_THREAD_STACK_BYTES`]), so any value in range traps cleanly
/// when a module recurses too deep, instead of overflowing the host thread.
pub const MIN_STACK_KIB: u64 = 64;
pub const MAX_STACK_KIB: u64 = 8 * 1024;

/// Stack size of every thread that may run a transform: the largest Wasm
/// stack allowed plus room for the host's frames under it (wasmtime,
/// lifting, the batch loop).
pub const TRANSFORM_THREAD_STACK_BYTES: usize = (MAX_STACK_KIB as usize + 4 * 1024) * 1024;

fn default_fuel() -> Bounded<1> {
    Bounded::at(20_000_000_000)
}

fn default_timeout() -> u64 {
    30_000
}

fn default_memory() -> Bounded<1> {
    Bounded::at(256)
}

fn default_compile_timeout() -> Bounded<100, 3_600_000> {
    Bounded::at(60_000)
}

fn default_compile_memory() -> Bounded<128, 65_536> {
    Bounded::at(2048)
}

fn default_stack() -> Bounded<MIN_STACK_KIB, MAX_STACK_KIB> {
    Bounded::at(1024)
}

fn default_isolation_budget() -> Bounded<1, 1000> {
    Bounded::at(4)
}

fn default_max_poison_share() -> f64 {
    0.5
}

fn default_max_state_value_kib() -> Bounded<1, 65_536> {
    Bounded::at(1024)
}

fn default_max_state_keys_per_batch() -> Bounded<1, 100_000_000> {
    Bounded::at(1_000_000)
}

fn default_state_cache_mib() -> Bounded<1, 65_536> {
    Bounded::at(256)
}
