//! The Wasm runtime (`sluice-runtime`): one deterministic wasmtime `Engine` and one `Linker` per
//! process, components loaded once (validated, compiled, cached) and
//! pre-instantiated, and a fresh `Store` per batch with fuel, an epoch
//! deadline and a memory cap.
//!
//! It owns the sandbox and the classification of failures (a transform's
//! declared error is never confused with a trap). It must not know about
//! Kafka, sinks or offsets: it maps (params, batch) to output, nothing more.
//! Beside the sandbox it holds what needs one: validating an upload
//! (`validate`) and following the active version (`follow`, over the core's
//! `ModuleStore` trait, whatever backend keeps it).

mod bindings;
mod cache;
mod compile;
mod follow;
mod logs;
mod memory_cap;
mod module;
mod trap;
mod validate;
mod wasi;

pub use bindings::LogLevel;
pub use compile::{WORKER_SUBCOMMAND, compile_in_child_processes, worker_main};
pub use follow::StoreVersions;
pub use logs::{KEPT_LOG_LINES, LogLine, LogPage};
pub use module::{LoadedModule, ModuleError};
pub use sluice_core::limits::{ENGINE, Limits, ReplaySettings};
pub use sluice_core::transform::RunError;
pub use validate::{Rejected, validate};

use sluice_core::{batch, output};

use crate::batch::{Plan, Records};
use crate::output::Output;
use bindings::{BatchState, sluice::plugin::types as wit};
use sluice_core::state::{EmptyState, RunState, StateBase, StateCallError};
use sluice_core::transform::BatchUsage;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime::component::Linker;
use wasmtime::{Config, Engine, Store, Trap, UpdateDeadline};

/// Linear memory kept resident between instances (zeroed, not unmapped).
const KEEP_RESIDENT: usize = 64 << 20;

/// How often the epoch ticks; the batch deadline is counted in ticks.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The process-wide runtime: one Engine, one Linker, the epoch ticker.
pub struct Runtime {
    engine: Engine,
    linker: Linker<BatchState>,
    limits: Limits,
    stop_ticker: Arc<AtomicBool>,
    logs: logs::ModuleLogs,
    /// Fuel used per batch id, summed over its runs until it settles, and
    /// the most memory one of its runs held.
    usage: Mutex<HashMap<String, Used>>,
    /// Set once the host shuts down: every run stops at its next epoch
    /// tick, and none starts.
    interrupted: Arc<AtomicBool>,
}

/// Why a run's epoch callback stopped it: the host is shutting down.
#[derive(Debug, thiserror::Error)]
#[error("stopped: the host is shutting down")]
struct ShuttingDown;

/// Batches whose usage is counted at once; beyond, the count starts over
/// (a caller that never settles cannot grow it).
const MAX_USAGE_COUNTS: usize = 64;

/// What a batch's runs have used so far.
#[derive(Default)]
struct Used {
    fuel: u64,
    peak_memory_bytes: u64,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::Relaxed);
    }
}

impl Runtime {
    /// Builds the deterministic engine and linker for the given limits.
    pub fn new(limits: Limits) -> Result<Runtime, ModuleError> {
        let engine = Engine::new(&engine_config(&limits, Allocation::Pooling))
            .map_err(|e| ModuleError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        bindings::add_to_linker(&mut linker).map_err(|e| ModuleError::Engine(format!("{e:#}")))?;
        let stop_ticker = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.clone(), stop_ticker.clone());
        Ok(Runtime {
            engine,
            linker,
            limits,
            stop_ticker,
            logs: logs::ModuleLogs::default(),
            usage: Mutex::default(),
            interrupted: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Stops every run in progress within one epoch tick (10 ms) and fails
    /// every later one with [`RunError::Interrupted`]: the host is shutting
    /// down. For good.
    pub fn interrupt(&self) {
        self.interrupted.store(true, Ordering::Relaxed);
    }

    /// The limits every batch of this runtime runs under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Loads a component from `bytes`: validates its world and imports,
    /// compiles it (or reuses the cached artifact in `cache_dir`).
    pub fn load(
        &self,
        bytes: &[u8],
        cache_dir: Option<&std::path::Path>,
    ) -> Result<LoadedModule, ModuleError> {
        module::load(&self.engine, &self.linker, &self.limits, bytes, cache_dir)
    }

    /// Runs `init(params)` alone, to check a module accepts its parameters.
    pub fn check_params(&self, module: &LoadedModule, params: &str) -> Result<(), RunError> {
        // No batch yet: WASI reads the epoch and a zero seed, the same on
        // every check.
        let mut store = self.new_store(wasi::BatchInputs::default(), None);
        let instance = self.instantiate(module, &mut store)?;
        self.init(&mut store, &instance, params)
    }

    /// A fresh instance; a module whose initial memory is over the cap is
    /// refused as such (not as a want of pool slots, which is retried).
    fn instantiate(
        &self,
        module: &LoadedModule,
        store: &mut Store<BatchState>,
    ) -> Result<bindings::Transform, RunError> {
        module
            .instantiate(store)
            .map_err(|e| match store.data().limiter.hit_cap() {
                true => RunError::MemoryExceeded(self.limits.max_memory_mib()),
                false => e,
            })
    }

    /// Runs one batch in a fresh instance: `init(params)`, then `process`,
    /// with every state key absent at the start (a batch of a stateless
    /// module, a test).
    pub fn run(
        &self,
        module: &LoadedModule,
        params: &str,
        plan: &Plan,
        records: &Records,
    ) -> Result<Output, RunError> {
        self.run_with_state(module, params, plan, records, Arc::new(EmptyState))
    }

    /// Runs one batch in a fresh instance: `init(params)`, then `process`,
    /// its state calls reading `state`; what it wrote comes back in the
    /// output.
    pub fn run_with_state(
        &self,
        module: &LoadedModule,
        params: &str,
        plan: &Plan,
        records: &Records,
        state: Arc<dyn StateBase>,
    ) -> Result<Output, RunError> {
        if self.interrupted.load(Ordering::Relaxed) {
            return Err(RunError::Interrupted);
        }
        let run_state = RunState::new(state, records, plan.batch_time_ms, self.limits.state());
        let mut store = self.new_store(
            wasi::BatchInputs {
                batch_time_ms: plan.batch_time_ms,
                seed: plan.seed(),
            },
            Some(run_state),
        );
        let instance = self.instantiate(module, &mut store)?;
        self.init(&mut store, &instance, params)?;
        let ctx = wit::BatchContext {
            pipeline: &plan.pipeline,
            batch_id: &plan.batch_id,
            batch_time_ms: plan.batch_time_ms,
            seed: plan.seed(),
        };
        let slices = bindings::slices(records);
        let batch = bindings::record_batch(records, &slices);
        let result = instance.call_process(&mut store, ctx, batch);
        store.data_mut().collect_stdio();
        self.count_usage(&plan.batch_id, &store);
        let logs = std::mem::take(&mut store.data_mut().logs);
        let writes = store.data_mut().state.take().map(RunState::finish);
        let outcome = match result {
            Ok(Ok(out)) => bindings::into_output(out, records.len()).and_then(|mut output| {
                let writes = writes.unwrap_or_default();
                output.state = writes.state;
                output.late = (writes.late.into_iter())
                    .map(|l| sluice_core::output::Rejection {
                        index: l.index,
                        reason: l.reason,
                    })
                    .collect();
                self.limits.check_output(&output)?;
                Ok(output)
            }),
            Ok(Err(e)) => Err(RunError::Declared {
                message: e.message,
                retryable: e.retryable,
            }),
            Err(e) => Err(trap::with_panic_message(self.classify(&store, e), &logs)),
        };
        self.logs
            .run(&plan.batch_id, records, logs, outcome.is_ok());
        outcome
    }

    /// Batch `batch_id` will not run again (committed, dead-lettered or
    /// failed for good): the lines of its last failed run are kept too.
    /// Returns the fuel its runs used and the most memory one held.
    pub fn settle(&self, batch_id: &str) -> BatchUsage {
        self.logs.settle(batch_id);
        self.usage_counts()
            .remove(batch_id)
            .map_or_else(BatchUsage::default, |used| BatchUsage {
                fuel: Some(used.fuel),
                peak_memory_bytes: Some(used.peak_memory_bytes),
            })
    }

    fn usage_counts(&self) -> std::sync::MutexGuard<'_, HashMap<String, Used>> {
        self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds what a run used of its store's fuel to its batch's count, and
    /// its instance's memory to the batch's peak.
    fn count_usage(&self, batch_id: &str, store: &Store<BatchState>) {
        let left = store.get_fuel().unwrap_or(0);
        let used = self.limits.fuel_per_batch.saturating_sub(left);
        let peak = store.data().limiter.peak_bytes() as u64;
        let mut counts = self.usage_counts();
        if counts.len() >= MAX_USAGE_COUNTS && !counts.contains_key(batch_id) {
            counts.clear();
        }
        let batch = counts.entry(batch_id.to_string()).or_default();
        batch.fuel += used;
        batch.peak_memory_bytes = batch.peak_memory_bytes.max(peak);
    }

    /// The newest module log lines (up to 10,000), oldest first.
    pub fn recent_logs(&self) -> Vec<LogLine> {
        self.logs.recent()
    }

    /// Up to `limit` kept lines after line `after` (0: from the oldest
    /// kept), of batch `batch` if given, oldest first.
    pub fn logs_after(&self, after: u64, batch: Option<&str>, limit: usize) -> LogPage {
        self.logs.after(after, batch, limit)
    }

    fn init(
        &self,
        store: &mut Store<BatchState>,
        instance: &bindings::Transform,
        params: &str,
    ) -> Result<(), RunError> {
        match instance.call_init(&mut *store, params) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(RunError::ParamsRejected(message)),
            Err(e) => Err(self.classify(store, e)),
        }
    }

    fn new_store(&self, inputs: wasi::BatchInputs, state: Option<RunState>) -> Store<BatchState> {
        let mut store = Store::new(
            &self.engine,
            BatchState::new(self.limits.max_memory_bytes(), inputs, state),
        );
        store.limiter(|s| &mut s.limiter);
        store
            .set_fuel(self.limits.fuel_per_batch)
            .expect("fuel is enabled");
        // Every tick asks whether the host is shutting down; the deadline
        // is counted down in ticks.
        let ticks = self.limits.batch_timeout.as_millis() / EPOCH_TICK.as_millis();
        let mut ticks_left = ticks.max(1) as u64;
        let interrupted = Arc::clone(&self.interrupted);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if interrupted.load(Ordering::Relaxed) {
                return Err(wasmtime::Error::new(ShuttingDown));
            }
            ticks_left -= 1;
            Ok(match ticks_left {
                0 => UpdateDeadline::Interrupt,
                _ => UpdateDeadline::Continue(1),
            })
        });
        store
    }

    /// Turns a wasmtime error into the variant callers act on.
    fn classify(&self, store: &Store<BatchState>, e: wasmtime::Error) -> RunError {
        if store.data().limiter.hit_cap() {
            return RunError::MemoryExceeded(self.limits.max_memory_mib());
        }
        if e.downcast_ref::<ShuttingDown>().is_some() {
            return RunError::Interrupted;
        }
        if let Some(bindings::StateCallFailed(failed)) = e.downcast_ref() {
            return match failed {
                // The record the call was made for is at fault.
                StateCallError::Misuse(m) => RunError::BadOutput(m.to_string()),
                // Caught as the module writes, before the host holds it.
                StateCallError::OverOutput { bytes, limit } => RunError::OutputTooLarge {
                    mib: bytes.div_ceil(1 << 20) as u64,
                    limit_mib: (limit >> 20) as u64,
                },
                StateCallError::Base(b) => RunError::State(b.clone()),
            };
        }
        if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
            return RunError::Trap(format!("module called exit({})", exit.0));
        }
        match e.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => RunError::OutOfFuel(self.limits.fuel_per_batch),
            Some(Trap::Interrupt) => {
                RunError::Timeout(self.limits.batch_timeout.as_millis() as u64)
            }
            // wasmtime's own text already starts with "wasm trap: ".
            Some(trap) => RunError::Trap(
                trap.to_string()
                    .trim_start_matches("wasm trap: ")
                    .to_string(),
            ),
            None => RunError::Trap(
                format!("{e:#}")
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            ),
        }
    }
}

/// How instances get their memory: serving engines pool it; a compile
/// worker instantiates nothing and must not reserve the pool's address
/// space. Compiled code is the same under both.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Allocation {
    Pooling,
    OnDemand,
}

fn engine_config(limits: &Limits, allocation: Allocation) -> Config {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .cranelift_nan_canonicalization(true)
        .relaxed_simd_deterministic(true)
        .shared_memory(false)
        .consume_fuel(true)
        .epoch_interruption(true)
        .max_wasm_stack(limits.max_stack_bytes())
        // Unused (no async), but wasmtime refuses a Wasm stack larger than it.
        .async_stack_size(limits.max_stack_bytes() + (1 << 20))
        .parallel_compilation(true);
    let mut pool = wasmtime::PoolingAllocationConfig::default();
    pool.total_component_instances(64)
        .total_core_instances(256)
        .total_memories(128)
        .total_tables(256)
        .max_memories_per_component(8)
        .max_memory_size(limits.max_memory_bytes())
        // A fresh instance per batch would otherwise page-fault its whole
        // working set back in every time (measured: ~250 ns/record); keeping
        // it resident and zeroing it with memset is several times cheaper.
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(1 << 16)
        // Where the kernel can tell (Linux 6.7+), reset only the pages a batch
        // dirtied instead of memsetting the whole resident prefix.
        .pagemap_scan(wasmtime::Enabled::Auto);
    if allocation == Allocation::Pooling {
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

fn spawn_epoch_ticker(engine: Engine, stop: Arc<AtomicBool>) {
    std::thread::Builder::new()
        .name("sluice-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                engine.increment_epoch();
            }
        })
        .expect("spawn epoch ticker");
}

/// A loaded module with its parameters: what the pipeline runs per batch.
pub struct WasmTransform {
    runtime: Arc<Runtime>,
    module: LoadedModule,
    params: String,
}

impl WasmTransform {
    /// Binds `module` to `params`, checking `init` accepts them.
    pub fn new(
        runtime: Arc<Runtime>,
        module: LoadedModule,
        params: String,
    ) -> Result<Self, RunError> {
        runtime.check_params(&module, &params)?;
        Ok(WasmTransform {
            runtime,
            module,
            params,
        })
    }
}

impl WasmTransform {
    /// The runtime it runs in (its recent module logs, its limits).
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The loaded module it runs.
    pub fn module(&self) -> &LoadedModule {
        &self.module
    }
}

impl sluice_core::transform::Transform for WasmTransform {
    fn module_digest(&self) -> &str {
        &self.module.digest
    }

    fn limits(&self) -> &Limits {
        self.runtime.limits()
    }

    fn params(&self) -> &str {
        &self.params
    }

    fn run(
        &self,
        plan: &Plan,
        records: &Records,
        state: Arc<dyn StateBase>,
    ) -> Result<Output, RunError> {
        self.runtime
            .run_with_state(&self.module, &self.params, plan, records, state)
    }

    fn settle(&self, batch_id: &str) -> BatchUsage {
        self.runtime.settle(batch_id)
    }

    fn interrupt(&self) {
        self.runtime.interrupt();
    }
}
