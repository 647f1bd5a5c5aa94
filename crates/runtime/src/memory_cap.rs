//! The memory cap of one instance: wasmtime's resource limiter, so a
//! module that grows past `limits.max_memory_mib` traps. It must not decide
//! what the cap is (that is `Limits`, in the core crate).

/// Stops a module that grows its memory past the cap: the `memory.grow`
/// traps (it does not return -1, which a module could observe and act on,
/// making its output depend on the cap), and the cap remembers it was hit,
/// so the trap is reported as "memory exceeded". A module's output is thus
/// the same under every cap it fits in.
pub struct MemoryCap {
    max_bytes: usize,
    hit: bool,
    /// Linear memory granted so far, over every memory of the instance
    /// (memories never shrink: this is the run's peak).
    granted: usize,
}

impl MemoryCap {
    pub fn new(max_bytes: usize) -> Self {
        MemoryCap {
            max_bytes,
            hit: false,
            granted: 0,
        }
    }

    pub fn hit_cap(&self) -> bool {
        self.hit
    }

    /// The most linear memory the instance has held.
    pub fn peak_bytes(&self) -> usize {
        self.granted
    }
}

impl wasmtime::ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.hit = true;
            wasmtime::bail!("memory limit of {} MiB reached", self.max_bytes >> 20);
        }
        self.granted += desired.saturating_sub(current);
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
