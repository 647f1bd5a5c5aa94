//! Per-batch sandbox limits and the memory limiter that enforces the cap.
//!
//! Owns the numbers (from the pipeline config) and the `ResourceLimiter`. It
//! must not decide what a hit limit means for the pipeline: `RunError` does.

use crate::config::LimitsConfig;
use std::time::Duration;

/// The sandbox limits applied to every batch.
#[derive(Debug, Clone)]
pub struct Limits {
    pub fuel_per_batch: u64,
    pub batch_timeout: Duration,
    max_memory_mib: u64,
    max_stack_kib: u64,
}

impl Limits {
    pub fn from_config(c: &LimitsConfig) -> Limits {
        Limits {
            fuel_per_batch: c.fuel_per_batch,
            batch_timeout: Duration::from_millis(c.batch_timeout_ms),
            max_memory_mib: c.max_memory_mib,
            max_stack_kib: c.max_stack_kib,
        }
    }

    pub fn max_memory_mib(&self) -> u64 {
        self.max_memory_mib
    }

    pub fn max_memory_bytes(&self) -> usize {
        (self.max_memory_mib as usize) << 20
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

/// Refuses memory growth past the cap and remembers that it did, so a trap
/// that follows is reported as "memory exceeded" rather than a plain trap.
pub struct MemoryCap {
    max_bytes: usize,
    hit: bool,
}

impl MemoryCap {
    pub fn new(max_bytes: usize) -> Self {
        MemoryCap {
            max_bytes,
            hit: false,
        }
    }

    pub fn hit_cap(&self) -> bool {
        self.hit
    }
}

impl wasmtime::ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}
