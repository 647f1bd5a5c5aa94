//! Compiling a component under a budget of time and memory.
//!
//! Owns where compilation runs. The `sluice` binary registers itself with
//! [`compile_in_child_processes`]; from then on every compile runs in a
//! child process (`sluice compile-worker`) at lower priority, with an
//! address-space limit, killed past its wall-clock budget: a module made to
//! compile slowly or hugely costs the host at most the budget and is
//! refused with a message naming it. Without registration (library use, unit tests) it
//! compiles in this process, unbudgeted.
//!
//! It must not deserialize anything but the artifact its own child wrote
//! from the bytes it was handed, with this engine's configuration.

use super::module::ModuleError;
use sluice_core::limits::Limits;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The subcommand the binary answers as a compile worker.
pub const WORKER_SUBCOMMAND: &str = "compile-worker";

/// Exit status of a worker that was handed bytes it cannot compile.
const EXIT_NOT_COMPILABLE: i32 = 3;

/// Most of a worker's stderr kept for the message.
const MAX_WORKER_STDERR: u64 = 16 * 1024;

/// How often the parent looks whether the worker has finished.
const POLL: Duration = Duration::from_millis(5);

static WORKER_EXE: OnceLock<PathBuf> = OnceLock::new();

/// Makes every later compile in this process run in a child process of
/// `exe` (which must answer [`WORKER_SUBCOMMAND`] with [`worker_main`]).
pub fn compile_in_child_processes(exe: PathBuf) {
    let _ = WORKER_EXE.set(exe);
}

/// Compiles `bytes` for `engine`: in a budgeted child when registered,
/// else here.
pub fn compile(engine: &Engine, limits: &Limits, bytes: &[u8]) -> Result<Component, ModuleError> {
    match WORKER_EXE.get() {
        Some(exe) => compile_in_child(exe, engine, limits, bytes),
        None => compile_here(engine, bytes),
    }
}

fn compile_here(engine: &Engine, bytes: &[u8]) -> Result<Component, ModuleError> {
    Component::from_binary(engine, bytes).map_err(|e| ModuleError::NotAComponent(format!("{e:#}")))
}

fn compile_in_child(
    exe: &PathBuf,
    engine: &Engine,
    limits: &Limits,
    bytes: &[u8],
) -> Result<Component, ModuleError> {
    let engine_err = |what: &str, e: &dyn std::fmt::Display| {
        ModuleError::Engine(format!("compile worker: {what}: {e}"))
    };
    let mut command = Command::new(exe);
    command
        .arg(WORKER_SUBCOMMAND)
        .arg(limits.max_stack_kib().to_string())
        .arg(limits.max_memory_mib().to_string())
        // Fewer malloc arenas: the address-space limit is for the
        // compiler's memory, not for per-thread heaps reserved, never used.
        .env("MALLOC_ARENA_MAX", "2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // RLIMIT_AS counts every mapping (RLIMIT_DATA misses some: a worker
    // limited to 128 MiB of data was measured at 399 MiB resident). A
    // worker compiling a small module needs under 128 MiB of it.
    let memory_limit = limits.compile_memory_mib << 20;
    let cpu_seconds = limits.compile_timeout.as_secs() + 2;
    // SAFETY: the closure runs in the forked child before exec and only
    // makes async-signal-safe system calls (setrlimit, prctl, setpriority).
    unsafe {
        command.pre_exec(move || restrict_worker(memory_limit, cpu_seconds));
    }
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| engine_err("cannot start", &e))?;
    let mut stdin = child.stdin.take().expect("piped");
    let mut stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    // The pipes are drained on threads of their own so that neither side
    // blocks the other, whatever the sizes.
    let input = bytes.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let reader = std::thread::spawn(move || {
        let mut artifact = Vec::new();
        stdout.read_to_end(&mut artifact).map(|_| artifact)
    });
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.take(MAX_WORKER_STDERR).read_to_string(&mut text);
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| engine_err("wait", &e))? {
            break Some(status);
        }
        if started.elapsed() >= limits.compile_timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(POLL);
    };
    let _ = feeder.join();
    let artifact = reader.join().expect("reader thread");
    let stderr = errors.join().expect("stderr thread");
    let Some(status) = status else {
        return Err(ModuleError::CompileBudget(format!(
            "compiling took longer than {} ms (`limits.compile_timeout_ms`)",
            limits.compile_timeout.as_millis()
        )));
    };
    if status.success() {
        let artifact = artifact.map_err(|e| engine_err("reading the artifact", &e))?;
        // SAFETY: the artifact is what our own worker wrote on this pipe:
        // `Component::serialize` of the bytes we sent, compiled with this
        // engine's configuration; wasmtime also checks its header.
        return unsafe { Component::deserialize(engine, &artifact) }
            .map_err(|e| engine_err("loading the artifact", &format!("{e:#}")));
    }
    Err(worker_failure(status, stderr.trim(), limits))
}

/// Names why a worker failed: the module's fault, the memory budget, or
/// the worker itself.
fn worker_failure(status: std::process::ExitStatus, stderr: &str, limits: &Limits) -> ModuleError {
    if status.code() == Some(EXIT_NOT_COMPILABLE) {
        return ModuleError::NotAComponent(stderr.to_string());
    }
    // Past the address-space limit an allocation fails and the worker
    // aborts (or reports ENOMEM); past
    // the CPU limit (only if the parent could not kill it) it gets SIGXCPU.
    let out_of_memory = stderr.contains("memory allocation of")
        || stderr.contains("os error 12")
        || stderr.contains("Cannot allocate memory")
        || matches!(
            status.signal(),
            Some(libc::SIGABRT | libc::SIGSEGV | libc::SIGBUS)
        );
    if out_of_memory {
        return ModuleError::CompileBudget(format!(
            "compiling needed more than {} MiB (`limits.compile_memory_mib`)",
            limits.compile_memory_mib
        ));
    }
    if status.signal() == Some(libc::SIGXCPU) {
        return ModuleError::CompileBudget(format!(
            "compiling took longer than {} ms (`limits.compile_timeout_ms`)",
            limits.compile_timeout.as_millis()
        ));
    }
    ModuleError::Engine(format!("compile worker failed ({status}): {stderr}"))
}

/// In the forked worker before exec: its address-space limit, a CPU-time
/// backstop (should the parent die before killing it), death with the
/// parent, and a lower priority than the batches the parent serves.
fn restrict_worker(memory_bytes: u64, cpu_seconds: u64) -> std::io::Result<()> {
    let set = |resource, limit: u64| {
        let r = libc::rlimit {
            rlim_cur: limit,
            rlim_max: limit,
        };
        // SAFETY: setrlimit with a valid pointer to a live struct.
        match unsafe { libc::setrlimit(resource, &r) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    set(libc::RLIMIT_AS, memory_bytes)?;
    set(libc::RLIMIT_CPU, cpu_seconds)?;
    // SAFETY: plain system calls with constant arguments.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
    Ok(())
}

/// The worker: reads a component from stdin, compiles it with the engine
/// configuration of the given limits, writes the artifact to stdout.
/// Returns the process's exit status.
pub fn worker_main(args: &[String]) -> i32 {
    let parse = |i: usize| args.get(i).and_then(|a| a.parse::<u64>().ok());
    let (Some(stack_kib), Some(memory_mib)) = (parse(0), parse(1)) else {
        eprintln!("usage: sluice {WORKER_SUBCOMMAND} MAX_STACK_KIB MAX_MEMORY_MIB < component");
        return 2;
    };
    let limits = Limits::for_compiling(stack_kib, memory_mib);
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut bytes) {
        eprintln!("reading the component: {e}");
        return 2;
    }
    let engine = match Engine::new(&super::engine_config(&limits, super::Allocation::OnDemand)) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("wasm engine: {e:#}");
            return 2;
        }
    };
    let artifact = match compile_here(&engine, &bytes).and_then(|c| {
        c.serialize()
            .map_err(|e| ModuleError::Engine(format!("{e:#}")))
    }) {
        Ok(artifact) => artifact,
        Err(ModuleError::NotAComponent(message)) => {
            eprintln!("{message}");
            return EXIT_NOT_COMPILABLE;
        }
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    match std::io::stdout().lock().write_all(&artifact) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("writing the artifact: {e}");
            2
        }
    }
}
