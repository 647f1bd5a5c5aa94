//! Per-batch sandbox limits, and the settings a batch's result depends on
//! (recorded with its lineage for replay).
//!
//! Owns the numbers (from the pipeline config). It must not enforce them
//! (the Wasm runtime does) nor decide what a hit limit means for the
//! pipeline: `RunError` does.

use crate::config::{LimitsConfig, OnPoison};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The engine that runs modules, as recorded in lineage (wasmtime is
/// pinned to this exact version in the workspace's Cargo.toml).
pub const ENGINE: &str = concat!("sluice ", env!("CARGO_PKG_VERSION"), ", wasmtime 48.0.8");

/// Everything besides the module, its params and the records that can
/// change a batch's result: which records end as fuel, memory or stack
/// dead letters, and the engine that ran it. Recorded with every batch's
/// lineage (as JSON) and what `verify` and `shadow` replay under. The
/// batch deadline is not here: a deadline is never part of a result.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReplaySettings {
    pub engine: String,
    pub fuel_per_batch: u64,
    pub max_memory_mib: u64,
    pub max_stack_kib: u64,
    pub max_output_mib: u64,
    pub on_poison: OnPoison,
    /// `limits.max_state_value_kib` (batches recorded before state existed
    /// read as the default: they kept none).
    #[serde(default = "default_state_value_kib")]
    pub max_state_value_kib: u64,
    /// `limits.max_state_keys_per_batch` (batches recorded before it
    /// existed read as the default: none reached it).
    #[serde(default = "default_state_keys_per_batch")]
    pub max_state_keys_per_batch: u64,
    /// `event_time.allowed_lateness_ms` (batches recorded before event
    /// time existed read as 0: none moved a watermark).
    #[serde(default)]
    pub allowed_lateness_ms: i64,
}

fn default_state_value_kib() -> u64 {
    LimitsConfig::default().max_state_value_kib.get()
}

fn default_state_keys_per_batch() -> u64 {
    LimitsConfig::default().max_state_keys_per_batch.get()
}

impl ReplaySettings {
    /// The JSON text stored in lineage.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain fields serialize")
    }

    /// Reads what lineage stored; `None` for a batch committed before
    /// settings were recorded (empty) or unreadable text.
    pub fn from_json(text: &str) -> Option<ReplaySettings> {
        serde_json::from_str(text).ok()
    }

    /// These settings' limits, with the deadline and compile budget of
    /// `current` (neither shapes a result).
    pub fn limits(&self, current: &Limits) -> Limits {
        Limits {
            fuel_per_batch: self.fuel_per_batch,
            max_memory_mib: self.max_memory_mib,
            max_stack_kib: self.max_stack_kib,
            max_output_bytes: (self.max_output_mib as usize) << 20,
            max_state_value_bytes: (self.max_state_value_kib as usize) << 10,
            max_state_keys_per_batch: self.max_state_keys_per_batch as usize,
            event_time: crate::event_time::EventTimeSettings {
                allowed_lateness_ms: self.allowed_lateness_ms,
            },
            ..current.clone()
        }
    }
}

/// The sandbox limits applied to every batch.
#[derive(Debug, Clone)]
pub struct Limits {
    pub fuel_per_batch: u64,
    pub batch_timeout: Duration,
    max_memory_mib: u64,
    max_stack_kib: u64,
    /// Most output bytes one run may return.
    pub max_output_bytes: usize,
    /// Wall-clock budget for compiling a module in a child process.
    pub compile_timeout: Duration,
    /// Address-space budget of that child, in MiB.
    pub compile_memory_mib: u64,
    /// What isolating one batch's poison records may cost.
    pub isolation: IsolationBudget,
    /// Largest value under one state key, in bytes.
    pub max_state_value_bytes: usize,
    /// Most distinct state keys one batch may write.
    pub max_state_keys_per_batch: usize,
    /// The host's keyed-state cache budget, in bytes.
    pub state_cache_bytes: usize,
    /// Most keyed state one input partition may keep, in bytes (`None`:
    /// no limit).
    pub max_state_partition_bytes: Option<usize>,
    /// How event time is judged (`[event_time]`).
    pub event_time: crate::event_time::EventTimeSettings,
}

/// Poison records a batch may always have, whatever its size: a batch of
/// a few records that all fail says little against the module.
pub const ALWAYS_ISOLATED: usize = 8;

/// How far the host goes isolating a batch's poison records before it
/// decides the module, not the records, is at fault
/// (`limits.isolation_budget`, `limits.max_poison_share`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IsolationBudget {
    /// In isolations of a record that exhausts a limit on its own.
    pub records: u32,
    /// Most of a batch's records that may be poison.
    pub max_poison_share: f64,
}

impl IsolationBudget {
    /// The budget for a batch of `records`, in batch budgets (runs that
    /// spend a whole batch's fuel, memory or deadline): `records` times
    /// what isolating one such record takes, log2(n) rounded up plus 2.
    pub fn batch_budgets(&self, records: usize) -> f64 {
        let depth = usize::BITS - records.saturating_sub(1).leading_zeros();
        f64::from(self.records) * f64::from(depth + 2)
    }

    /// Most records of a batch of `records` that may be isolated: its
    /// share, but never fewer than [`ALWAYS_ISOLATED`].
    pub fn max_poison(&self, records: usize) -> usize {
        ((records as f64 * self.max_poison_share).floor() as usize).max(ALWAYS_ISOLATED)
    }
}

impl Limits {
    pub fn from_config(c: &LimitsConfig) -> Limits {
        Limits {
            fuel_per_batch: c.fuel_per_batch.get(),
            batch_timeout: Duration::from_millis(c.batch_timeout_ms),
            max_memory_mib: c.max_memory_mib.get(),
            max_stack_kib: c.max_stack_kib.get(),
            max_output_bytes: (c.max_output_mib.unwrap_or(c.max_memory_mib).get() as usize) << 20,
            compile_timeout: Duration::from_millis(c.compile_timeout_ms.get()),
            compile_memory_mib: c.compile_memory_mib.get(),
            isolation: IsolationBudget {
                records: c.isolation_budget.get() as u32,
                max_poison_share: c.max_poison_share,
            },
            max_state_value_bytes: (c.max_state_value_kib.get() as usize) << 10,
            max_state_keys_per_batch: c.max_state_keys_per_batch.get() as usize,
            state_cache_bytes: (c.state_cache_mib.get() as usize) << 20,
            max_state_partition_bytes: c
                .max_state_partition_mib
                .map(|mib| (mib.get() as usize) << 20),
            event_time: Default::default(),
        }
    }

    /// These limits, with event time judged as `config` says.
    pub fn with_event_time(self, config: &crate::config::EventTimeConfig) -> Limits {
        Limits {
            event_time: crate::event_time::EventTimeSettings {
                allowed_lateness_ms: config.allowed_lateness_ms.get() as i64,
            },
            ..self
        }
    }

    /// The limits a compile worker needs to build the same engine
    /// configuration as its parent (the rest does not shape compiled code).
    pub fn for_compiling(max_stack_kib: u64, max_memory_mib: u64) -> Limits {
        Limits {
            max_stack_kib,
            max_memory_mib,
            ..Limits::default()
        }
    }

    /// The settings batches run under these limits are recorded with.
    pub fn replay_settings(&self, on_poison: OnPoison) -> ReplaySettings {
        ReplaySettings {
            engine: ENGINE.to_string(),
            fuel_per_batch: self.fuel_per_batch,
            max_memory_mib: self.max_memory_mib,
            max_stack_kib: self.max_stack_kib,
            max_output_mib: (self.max_output_bytes >> 20) as u64,
            on_poison,
            max_state_value_kib: (self.max_state_value_bytes >> 10) as u64,
            max_state_keys_per_batch: self.max_state_keys_per_batch as u64,
            allowed_lateness_ms: self.event_time.allowed_lateness_ms,
        }
    }

    /// Fails an output over the output budget.
    pub fn check_output(
        &self,
        output: &crate::output::Output,
    ) -> Result<(), crate::transform::RunError> {
        let size = output.byte_size();
        match size > self.max_output_bytes {
            true => Err(crate::transform::RunError::OutputTooLarge {
                mib: size.div_ceil(1 << 20) as u64,
                limit_mib: (self.max_output_bytes >> 20) as u64,
            }),
            false => Ok(()),
        }
    }

    /// What a module may keep per state call.
    pub fn state(&self) -> crate::state::StateLimits {
        crate::state::StateLimits {
            max_value_bytes: self.max_state_value_bytes,
            max_keys_per_batch: self.max_state_keys_per_batch,
            max_write_bytes: self.max_output_bytes,
            max_fired_value_bytes: self.max_memory_bytes() / 4,
            event_time: self.event_time,
        }
    }

    pub fn max_memory_mib(&self) -> u64 {
        self.max_memory_mib
    }

    pub fn max_memory_bytes(&self) -> usize {
        (self.max_memory_mib as usize) << 20
    }

    pub fn max_stack_kib(&self) -> u64 {
        self.max_stack_kib
    }

    pub fn max_stack_bytes(&self) -> usize {
        (self.max_stack_kib as usize) << 10
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::from_config(&LimitsConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::IsolationBudget;

    #[test]
    fn the_isolation_budget_grows_with_the_depth_of_the_bisection() {
        let budget = IsolationBudget {
            records: 4,
            max_poison_share: 0.5,
        };
        // log2 rounded up, plus the leaf's confirmation and slack.
        assert_eq!(budget.batch_budgets(1), 8.0);
        assert_eq!(budget.batch_budgets(2), 12.0);
        assert_eq!(budget.batch_budgets(2_000), 4.0 * 13.0);
        assert_eq!(budget.batch_budgets(2_048), 4.0 * 13.0);
        assert_eq!(budget.batch_budgets(2_049), 4.0 * 14.0);
        assert_eq!(budget.max_poison(5_000), 2_500);
        assert_eq!(budget.max_poison(1), super::ALWAYS_ISOLATED);
    }
}
