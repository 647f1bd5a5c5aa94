//! Deterministic WASI 0.2 for guests whose toolchain imports it (Python,
//! JavaScript, Go, C with wasi-libc): the imports are provided by
//! `wasmtime-wasi`, configured per batch so that the same batch through the
//! same module behaves the same on every run, in `verify` and in `shadow`.
//!
//! - wall clock: the batch time from the plan, fixed for the whole batch;
//! - monotonic clock: virtual, starts at 1 s and moves only when the module
//!   waits (a sleep returns at once, the clock jumps by its length), so a
//!   module that sleeps for a year costs nothing and blocks no thread;
//! - random (secure and insecure): a ChaCha generator seeded from the
//!   plan's seed; the insecure seed is derived from it too;
//! - no environment, no arguments, stdin closed, no preopened directory
//!   (so no file can be opened), every socket use denied;
//! - stdout and stderr are captured (bounded) into the module's log.
//!
//! It must not give a module anything that differs between two runs of the
//! same batch, nor any host resource (file, socket, real clock).
//! Which WASI interfaces a module may import at all is `module.rs`'s list.

use rand::SeedableRng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

/// Bytes of stdout (and, separately, of stderr) kept per batch; the rest is
/// dropped and counted, never an error for the module.
const MAX_STDIO_BYTES: usize = 256 << 10;

/// Resources (pollables, streams) a module may hold at once: a module that
/// makes them in a loop gets an error, not the host's memory.
const MAX_RESOURCES: usize = 10_000;

/// Largest `get-random-bytes` request served (more traps).
const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// What a batch's WASI context is made from: the plan's time and seed.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchInputs {
    pub batch_time_ms: i64,
    pub seed: u64,
}

/// One batch's WASI state, built on the module's first WASI call (a Rust
/// plugin without WASI imports never pays for it).
pub struct BatchWasi {
    inputs: BatchInputs,
    ctx: Option<WasiCtx>,
    table: ResourceTable,
    clock: VirtualClock,
    stdout: CapturedOutput,
    stderr: CapturedOutput,
}

impl BatchWasi {
    pub fn new(inputs: BatchInputs) -> Self {
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        BatchWasi {
            inputs,
            ctx: None,
            table,
            clock: VirtualClock::default(),
            stdout: CapturedOutput::default(),
            stderr: CapturedOutput::default(),
        }
    }

    /// What the module wrote to stdout and stderr, as (text, dropped bytes).
    pub fn take_output(&self) -> [(String, usize); 2] {
        [self.stdout.take(), self.stderr.take()]
    }

    /// The context wasmtime-wasi's host functions work on.
    pub fn view(&mut self) -> WasiCtxView<'_> {
        let BatchWasi {
            inputs,
            ctx,
            table,
            clock,
            stdout,
            stderr,
        } = self;
        let ctx = ctx.get_or_insert_with(|| build_ctx(*inputs, clock, stdout, stderr));
        WasiCtxView { ctx, table }
    }
}

fn build_ctx(
    inputs: BatchInputs,
    clock: &VirtualClock,
    stdout: &CapturedOutput,
    stderr: &CapturedOutput,
) -> WasiCtx {
    // Two independent streams from one seed: a module reading both sees
    // unrelated sequences, and each is the same on every run.
    let secure = rand::rngs::StdRng::seed_from_u64(inputs.seed);
    let insecure = rand::rngs::StdRng::seed_from_u64(inputs.seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut builder = WasiCtx::builder();
    builder
        .wall_clock(BatchClock(inputs.batch_time_ms))
        .monotonic_clock(clock.clone())
        .secure_random(secure)
        .insecure_random(insecure)
        .insecure_random_seed(u128::from(inputs.seed) << 64 | u128::from(!inputs.seed))
        .max_random_size(MAX_RANDOM_BYTES)
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    builder.build()
}

/// Something that holds a batch's WASI state.
pub trait HasBatchWasi: Send {
    fn batch_wasi(&mut self) -> &mut BatchWasi;
}

/// Adds the WASI 0.2 interfaces (synchronous) to the linker, the monotonic
/// clock replaced by the virtual one.
pub fn add_to_linker<T: HasBatchWasi + WasiView + 'static>(
    linker: &mut Linker<T>,
) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    linker.allow_shadowing(true);
    monotonic_clock::add_to_linker::<T, VirtualClocks>(linker, |state| {
        let wasi = state.batch_wasi();
        VirtualClockView {
            clock: wasi.clock.clone(),
            table: &mut wasi.table,
        }
    })?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The wall clock: the batch time, whenever it is read.
struct BatchClock(i64);

impl HostWallClock for BatchClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }

    fn now(&self) -> Duration {
        // A batch time before 1970 (never planned) reads as the epoch.
        Duration::from_millis(u64::try_from(self.0).unwrap_or(0))
    }
}

/// A monotonic clock that moves only when the module waits on it. It
/// starts at [`VirtualClock::START`], not 0: Go's runtime refuses to start
/// on a monotonic clock that reads 0 (`nanotime returning zero`).
#[derive(Clone)]
struct VirtualClock(Arc<AtomicU64>);

impl Default for VirtualClock {
    fn default() -> Self {
        VirtualClock(Arc::new(AtomicU64::new(Self::START)))
    }
}

impl VirtualClock {
    /// Where every batch's monotonic clock starts: one second.
    const START: u64 = 1_000_000_000;

    fn now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn advance_to(&self, instant: u64) {
        self.0.fetch_max(instant, Ordering::Relaxed);
    }
}

impl HostMonotonicClock for VirtualClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        VirtualClock::now(self)
    }
}

struct VirtualClocks;

impl wasmtime::component::HasData for VirtualClocks {
    type Data<'a> = VirtualClockView<'a>;
}

struct VirtualClockView<'a> {
    clock: VirtualClock,
    table: &'a mut ResourceTable,
}

impl VirtualClockView<'_> {
    fn deadline(&mut self, instant: u64) -> wasmtime::Result<Resource<DynPollable>> {
        let deadline = self.table.push(Deadline {
            clock: self.clock.clone(),
            instant,
        })?;
        wasmtime_wasi::p2::subscribe(self.table, deadline)
    }
}

impl monotonic_clock::Host for VirtualClockView<'_> {
    fn now(&mut self) -> wasmtime::Result<u64> {
        Ok(self.clock.now())
    }

    fn resolution(&mut self) -> wasmtime::Result<u64> {
        Ok(1)
    }

    fn subscribe_instant(&mut self, when: u64) -> wasmtime::Result<Resource<DynPollable>> {
        self.deadline(when)
    }

    fn subscribe_duration(&mut self, duration: u64) -> wasmtime::Result<Resource<DynPollable>> {
        let when = self.clock.now().saturating_add(duration);
        self.deadline(when)
    }
}

/// A wait on the virtual clock: ready at once, and being waited on moves
/// the clock to its instant.
struct Deadline {
    clock: VirtualClock,
    instant: u64,
}

#[wasmtime_wasi::async_trait]
impl Pollable for Deadline {
    async fn ready(&mut self) {
        self.clock.advance_to(self.instant);
    }
}

/// stdout or stderr of one batch: kept up to `MAX_STDIO_BYTES`, the rest
/// counted and dropped (a module printing in a loop loses lines, not the
/// host's memory, and never fails for it).
#[derive(Clone, Default)]
struct CapturedOutput(Arc<Mutex<Captured>>);

#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: usize,
}

impl CapturedOutput {
    fn append(&self, data: &[u8]) {
        let mut captured = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let room = MAX_STDIO_BYTES.saturating_sub(captured.bytes.len());
        let kept = data.len().min(room);
        captured.bytes.extend_from_slice(&data[..kept]);
        captured.dropped += data.len() - kept;
    }

    fn take(&self) -> (String, usize) {
        let mut captured = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = std::mem::take(&mut captured.bytes);
        let dropped = std::mem::take(&mut captured.dropped);
        (String::from_utf8_lossy(&bytes).into_owned(), dropped)
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for CapturedOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Always room: what does not fit is dropped, not refused.
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for CapturedOutput {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.append(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_cap_is_dropped_and_counted() {
        let out = CapturedOutput::default();
        out.append(&vec![b'x'; MAX_STDIO_BYTES - 1]);
        out.append(b"abc");
        let (text, dropped) = out.take();
        assert_eq!(text.len(), MAX_STDIO_BYTES);
        assert_eq!(dropped, 2);
        assert_eq!(out.take(), (String::new(), 0));
    }

    #[test]
    fn the_virtual_clock_moves_only_forward_and_only_when_waited_on() {
        let clock = VirtualClock::default();
        let start = VirtualClock::START;
        assert_eq!(clock.now(), start);
        clock.advance_to(start + 5_000);
        clock.advance_to(start + 1_000);
        assert_eq!(clock.now(), start + 5_000);
    }
}
