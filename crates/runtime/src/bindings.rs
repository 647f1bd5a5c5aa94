//! The host side of the `sluice:plugin` world: generated bindings, the log
//! import, and conversions between the host's batch/output types and the WIT
//! types.
//!
//! Owns the WIT boundary only. It must not apply policy (retries, limits).

use super::RunError;
use super::memory_cap::MemoryCap;
use super::wasi::{BatchInputs, BatchWasi, HasBatchWasi};
use crate::batch::Records;
use crate::output as host;
use sluice_core::event_time::FiredValues;
use sluice_core::state::{RunState, StateCallError};

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "transform",
    // Parameters borrow from the host's own batch: no copy before lowering.
    ownership: Borrowing {
        duplicate_if_necessary: true
    },
    // A state call that fails (a limit, an unreachable store) stops the
    // run: the module cannot go on as if it had been answered.
    imports: { "sluice:plugin/state": trappable, "sluice:plugin/time": trappable },
});

use self::sluice::plugin::types as wit;

/// Most log lines a module may write per batch; more are dropped.
const MAX_LOG_LINES: usize = 1000;
/// Longest log line kept, in bytes.
const MAX_LOG_LINE: usize = 4096;

/// A line the module wrote through the `log` import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleLog {
    pub level: LogLevel,
    pub message: String,
}

/// The level a module logged at (stdout lines are `Info`, stderr `Warn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// The data of one batch's `Store`.
pub struct BatchState {
    pub limiter: MemoryCap,
    pub logs: Vec<ModuleLog>,
    pub wasi: BatchWasi,
    /// The run's keyed state; none where no batch runs (`init` alone).
    pub state: Option<RunState>,
}

impl BatchState {
    pub fn new(max_memory_bytes: usize, inputs: BatchInputs, state: Option<RunState>) -> Self {
        BatchState {
            limiter: MemoryCap::new(max_memory_bytes),
            logs: Vec::new(),
            wasi: BatchWasi::new(inputs),
            state,
        }
    }

    /// The run's state, or the error a call from `init` gets.
    fn run_state(&mut self) -> Result<&mut RunState, StateCallFailed> {
        // Made only when it fails: this runs on every state and time call.
        self.state.as_mut().ok_or_else(|| {
            StateCallFailed(StateCallError::Base(
                sluice_core::state::StateError::Unsupported(
                    "state is only there while a batch runs (in `process`), not in `init`".into(),
                ),
            ))
        })
    }

    /// Appends what the module printed to stdout (as info) and stderr (as
    /// warnings) to its log, after the lines it logged itself.
    pub fn collect_stdio(&mut self) {
        let [stdout, stderr] = self.wasi.take_output();
        for ((text, dropped), level, name) in [
            (stdout, LogLevel::Info, "stdout"),
            (stderr, LogLevel::Warn, "stderr"),
        ] {
            for line in text.lines().filter(|l| !l.is_empty()) {
                self.push_log(level, line.to_string());
            }
            if dropped > 0 {
                self.push_log(
                    LogLevel::Warn,
                    format!("{dropped} more bytes of {name} dropped (limit per batch)"),
                );
            }
        }
    }

    /// Keeps a line, cut to [`MAX_LOG_LINE`] bytes. A cut line is copied
    /// out of the lifted one: a 100 MiB message must not stay 100 MiB of
    /// the host's memory behind a 4 KiB line (a run keeps at most
    /// [`MAX_LOG_LINES`] x [`MAX_LOG_LINE`] bytes).
    fn push_log(&mut self, level: LogLevel, message: String) {
        if self.logs.len() >= MAX_LOG_LINES {
            return;
        }
        let message = match message.len() > MAX_LOG_LINE {
            true => {
                let mut cut = MAX_LOG_LINE;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message[..cut].to_string()
            }
            false => message,
        };
        self.logs.push(ModuleLog { level, message });
    }
}

impl HasBatchWasi for BatchState {
    fn batch_wasi(&mut self) -> &mut BatchWasi {
        &mut self.wasi
    }
}

impl wasmtime_wasi::WasiView for BatchState {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        self.wasi.view()
    }
}

impl self::sluice::plugin::log::Host for BatchState {
    fn write(&mut self, level: self::sluice::plugin::log::Level, message: String) {
        use self::sluice::plugin::log::Level;
        let level = match level {
            Level::Debug => LogLevel::Debug,
            Level::Info => LogLevel::Info,
            Level::Warn => LogLevel::Warn,
            Level::Error => LogLevel::Error,
        };
        self.push_log(level, message);
    }
}

impl self::sluice::plugin::types::Host for BatchState {}

/// A failed state call, as the trap that stops the run carries it (the
/// runtime classifies it back out of the trap).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct StateCallFailed(pub StateCallError);

impl self::sluice::plugin::state::Host for BatchState {
    fn get(&mut self, index: u32, key: Vec<u8>) -> wasmtime::Result<Option<Vec<u8>>> {
        let state = self.run_state()?;
        Ok(state.get(index, &key).map_err(StateCallFailed)?)
    }

    fn set(
        &mut self,
        index: u32,
        key: Vec<u8>,
        value: Vec<u8>,
        expires_at_ms: Option<i64>,
    ) -> wasmtime::Result<()> {
        let state = self.run_state()?;
        Ok(state
            .set(index, key, value, expires_at_ms)
            .map_err(StateCallFailed)?)
    }

    fn delete(&mut self, index: u32, key: Vec<u8>) -> wasmtime::Result<()> {
        let state = self.run_state()?;
        Ok(state.delete(index, key).map_err(StateCallFailed)?)
    }
}

impl self::sluice::plugin::time::Host for BatchState {
    fn watermark(&mut self, index: u32) -> wasmtime::Result<Option<i64>> {
        let state = self.run_state()?;
        Ok(state.watermark(index).map_err(StateCallFailed)?)
    }

    fn set_record_time(&mut self, index: u32, time_ms: Option<i64>) -> wasmtime::Result<()> {
        let state = self.run_state()?;
        Ok(state
            .set_record_time(index, time_ms)
            .map_err(StateCallFailed)?)
    }

    fn set_timer(&mut self, index: u32, key: Vec<u8>, at_ms: i64) -> wasmtime::Result<()> {
        let state = self.run_state()?;
        Ok(state
            .set_timer(index, key, at_ms, Vec::new())
            .map_err(StateCallFailed)?)
    }

    fn set_timer_value(
        &mut self,
        index: u32,
        key: Vec<u8>,
        at_ms: i64,
        value: Vec<u8>,
    ) -> wasmtime::Result<()> {
        let state = self.run_state()?;
        Ok(state
            .set_timer(index, key, at_ms, value)
            .map_err(StateCallFailed)?)
    }

    fn timer_value(
        &mut self,
        index: u32,
        key: Vec<u8>,
        at_ms: i64,
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        let state = self.run_state()?;
        Ok(state
            .timer_value(index, key, at_ms)
            .map_err(StateCallFailed)?)
    }

    fn delete_timer(&mut self, index: u32, key: Vec<u8>, at_ms: i64) -> wasmtime::Result<()> {
        let state = self.run_state()?;
        Ok(state
            .delete_timer(index, key, at_ms)
            .map_err(StateCallFailed)?)
    }

    fn due_timers(&mut self) -> wasmtime::Result<Vec<self::sluice::plugin::time::FiredTimer>> {
        let state = self.run_state()?;
        let fired = (state.due_timers(FiredValues::Leave)).map_err(StateCallFailed)?;
        Ok(fired
            .into_iter()
            .map(|f| self::sluice::plugin::time::FiredTimer {
                index: f.index,
                key: f.timer.key,
                at_ms: f.timer.at_ms,
            })
            .collect())
    }

    fn due_timers_with_values(
        &mut self,
    ) -> wasmtime::Result<Vec<self::sluice::plugin::time::FiredTimerValue>> {
        let state = self.run_state()?;
        let fired = (state.due_timers(FiredValues::Read)).map_err(StateCallFailed)?;
        Ok(fired
            .into_iter()
            .map(|f| self::sluice::plugin::time::FiredTimerValue {
                index: f.index,
                key: f.timer.key,
                at_ms: f.timer.at_ms,
                value: f.value,
            })
            .collect())
    }

    fn late(&mut self, index: u32, reason: String) -> wasmtime::Result<()> {
        let state = self.run_state()?;
        Ok(state.late(index, reason).map_err(StateCallFailed)?)
    }
}

/// Adds the world's imports and deterministic WASI to the linker (which
/// WASI interfaces a module may import is checked when it is loaded).
pub fn add_to_linker(linker: &mut wasmtime::component::Linker<BatchState>) -> wasmtime::Result<()> {
    Transform::add_to_linker::<_, wasmtime::component::HasSelf<_>>(linker, |s| s)?;
    super::wasi::add_to_linker(linker)
}

/// The batch in WIT form, borrowing the host's columns (the canonical ABI
/// copies them into the instance once, when lowering).
pub fn record_batch<'a>(
    r: &'a Records,
    slices: &'a [wit::PartitionSlice<'a>],
) -> wit::RecordBatch<'a> {
    wit::RecordBatch {
        slices,
        offsets: &r.offsets,
        timestamps: &r.timestamps,
        key_lengths: &r.key_lengths,
        keys: &r.keys,
        value_lengths: &r.value_lengths,
        values: &r.values,
        header_counts: &r.header_counts,
        header_name_lengths: &r.header_name_lengths,
        header_names: &r.header_names,
        header_value_lengths: &r.header_value_lengths,
        header_values: &r.header_values,
    }
}

/// The batch's partition slices in WIT form.
pub fn slices(r: &Records) -> Vec<wit::PartitionSlice<'_>> {
    r.slices
        .iter()
        .map(|s| wit::PartitionSlice {
            topic: &s.topic,
            partition: s.partition,
            first: s.first,
            count: s.count,
        })
        .collect()
}

/// Converts and checks the module's output against the contract: its
/// shape (a breach fails the batch), and finite floats (a NaN or infinity
/// is a poison: the records that produce it are isolated). -0.0 becomes 0.0.
pub fn into_output(out: wit::Output, batch_len: usize) -> Result<host::Output, RunError> {
    let targets = out
        .targets
        .into_iter()
        .map(|t| host::TargetRows {
            target: t.target,
            rows: t.rows,
            columns: t
                .columns
                .into_iter()
                .map(|c| host::Column {
                    name: c.name,
                    nulls: c.nulls,
                    data: match c.data {
                        wit::ColumnData::Int64(v) => host::ColumnData::Int64(v),
                        wit::ColumnData::Float64(v) => host::ColumnData::Float64(v),
                        wit::ColumnData::Text(v) => host::ColumnData::Text {
                            lengths: v.lengths,
                            data: v.data,
                        },
                        wit::ColumnData::Bytes(v) => host::ColumnData::Bytes {
                            lengths: v.lengths,
                            data: v.data,
                        },
                        wit::ColumnData::Boolean(v) => host::ColumnData::Bool(v),
                    },
                })
                .collect(),
        })
        .collect();
    let rejections = out
        .rejections
        .into_iter()
        .map(|r| host::Rejection {
            index: r.index,
            reason: r.reason,
        })
        .collect();
    let mut output = host::Output {
        targets,
        rejections,
        late: Vec::new(),
        state: Default::default(),
    };
    output.check(batch_len).map_err(RunError::BadOutput)?;
    if let Some(cell) = output.first_non_finite() {
        return Err(RunError::NonFinite(cell));
    }
    output.normalize_zeros();
    Ok(output)
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}
