//! JavaScript builds' pre-initializer: what componentize-js runs as its
//! `wizer` (it snapshots the engine after the transform's top level ran),
//! done so that the same sources give the same bytes. componentize-js's
//! own wizer gives the engine the host's randomness and clocks (hash
//! seeds and time end up in the snapshot) and the engine sees the build's
//! random work directory in its arguments: two builds of one source never
//! matched. Here, run as this binary under the name [`PRE_INIT_NAME`]:
//!
//! - random (secure and insecure) from fixed seeds, a wall clock fixed at
//!   the epoch, a monotonic clock that moves 1 µs per reading;
//! - file times read as zero, devices and inodes numbered in the order the
//!   engine first sees them (`stable_file_stats`): the build writes the
//!   files it reads just before, so theirs are new every time;
//! - the work directory componentize-js made (`--dir`) is seen by the
//!   engine as `/sluice-js/sources`, the project's stage (`--mapdir /::`)
//!   as `/`, and the arguments on stdin say those paths instead of the
//!   host's;
//! - only the variables componentize-js sets reach the engine
//!   (`--inherit-env`), in name order.
//!
//! It must not read anything but the files componentize-js names, and
//! must not be used to run a transform: it exists for the build step only.

use rand::SeedableRng;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use wasmtime::{Config, Engine, Instance, Linker, Module, Store};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, HostMonotonicClock, HostWallClock, WasiCtx};
use wasmtime_wizer::{InstanceState, SnapshotVal, ValType, Wizer};

/// The file name this binary answers to as componentize-js's `wizer` (a
/// link to it in the build's stage).
pub const PRE_INIT_NAME: &str = "sluice-js-pre-init";

/// Where the engine sees componentize-js's work directory.
const GUEST_SOURCES: &str = "/sluice-js/sources";

/// The variables componentize-js passes its wizer (by prefix); any other
/// (a shell's `PWD`, say) would put the machine into the snapshot.
const PASSED_VARIABLES: &[&str] = &["DEBUG", "SOURCE_NAME", "EXPORT", "IMPORT", "FEATURE_"];

/// Whether `argv0` names the pre-initializer (this binary under that name).
pub fn is_pre_init(argv0: &str) -> bool {
    std::path::Path::new(argv0).file_name() == Some(std::ffi::OsStr::new(PRE_INIT_NAME))
}

/// Runs a pre-initialization as componentize-js asks for it (`args` after
/// the program name); the exit status.
pub fn pre_init_main(args: &[String]) -> i32 {
    let outcome = Request::parse(args).and_then(|request| request.run());
    match outcome {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:?}");
            1
        }
    }
}

/// What componentize-js asked for.
#[derive(Debug, Default)]
struct Request {
    init_func: String,
    /// `--dir=PATH`: seen by the engine under [`GUEST_SOURCES`].
    dirs: Vec<PathBuf>,
    /// `--mapdir=GUEST::HOST`.
    mapped: Vec<(String, PathBuf)>,
    inherit_env: bool,
    output: PathBuf,
    input: PathBuf,
}

impl Request {
    fn parse(args: &[String]) -> wasmtime::Result<Request> {
        let mut request = Request::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let (flag, value) = match arg.split_once('=') {
                Some((flag, value)) => (flag, Some(value.to_string())),
                None => (arg.as_str(), None),
            };
            let mut value = || {
                value
                    .clone()
                    .or_else(|| args.next().cloned())
                    .ok_or_else(|| wasmtime::format_err!("{flag} needs a value"))
            };
            match flag {
                "--allow-wasi" | "--wasm-bulk-memory" => {}
                "--init-func" | "-f" => request.init_func = value()?,
                "--dir" => request.dirs.push(value()?.into()),
                "--mapdir" => {
                    let spec = value()?;
                    let (guest, host) = spec
                        .split_once("::")
                        .ok_or_else(|| wasmtime::format_err!("--mapdir {spec}: not GUEST::HOST"))?;
                    request.mapped.push((guest.to_string(), host.into()));
                }
                "--inherit-env" => request.inherit_env = value()? == "true",
                "-o" | "--output" => request.output = value()?.into(),
                other if !other.starts_with('-') => request.input = other.into(),
                other => wasmtime::bail!("{other}: not an option sluice's pre-initializer knows"),
            }
        }
        if request.init_func.is_empty() || request.output.as_os_str().is_empty() {
            wasmtime::bail!("usage: {PRE_INIT_NAME} --init-func NAME -o OUT IN.wasm");
        }
        Ok(request)
    }

    /// The engine's arguments (stdin) with the host's paths replaced by the
    /// engine's.
    fn guest_arguments(&self, stdin: String) -> String {
        let mut renamed: Vec<(String, String)> = Vec::new();
        for dir in &self.dirs {
            renamed.push((dir.display().to_string(), GUEST_SOURCES.to_string()));
        }
        for (guest, host) in &self.mapped {
            let host = host.display().to_string();
            let guest = guest.trim_end_matches('/');
            renamed.push((
                format!("{}/", host.trim_end_matches('/')),
                format!("{guest}/"),
            ));
        }
        // Longest first: a directory inside another is renamed as itself.
        renamed.sort_by_key(|(host, _)| std::cmp::Reverse(host.len()));
        renamed
            .iter()
            .fold(stdin, |text, (host, guest)| text.replace(host, guest))
    }

    fn wasi(&self, stdin: String) -> wasmtime::Result<WasiP1Ctx> {
        let mut builder = WasiCtx::builder();
        builder
            .stdin(MemoryInputPipe::new(self.guest_arguments(stdin)))
            .inherit_stdout()
            .inherit_stderr()
            .wall_clock(EpochClock)
            .monotonic_clock(CountingClock::default())
            .secure_random(rand::rngs::StdRng::seed_from_u64(1))
            .insecure_random(rand::rngs::StdRng::seed_from_u64(2))
            .insecure_random_seed(3);
        if self.inherit_env {
            let mut vars: Vec<(String, String)> = std::env::vars()
                .filter(|(name, _)| PASSED_VARIABLES.iter().any(|p| name.starts_with(p)))
                .collect();
            vars.sort();
            builder.envs(&vars);
        }
        for dir in &self.dirs {
            builder.preopened_dir(dir, GUEST_SOURCES, FsPerms::ReadWrite)?;
        }
        for (guest, host) in &self.mapped {
            builder.preopened_dir(host, guest, FsPerms::ReadWrite)?;
        }
        Ok(builder.build_p1())
    }

    fn run(self) -> wasmtime::Result<()> {
        let wasm = std::fs::read(&self.input)
            .map_err(|e| wasmtime::format_err!("{}: {e}", self.input.display()))?;
        let mut stdin = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut stdin)?;
        let mut wizer = Wizer::new();
        wizer.init_func(&self.init_func);
        let (cx, instrumented) = wizer.instrument(&wasm)?;
        let engine = Engine::new(&Config::new())?;
        let module = Module::new(&engine, &instrumented)?;
        let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |ctx| ctx)?;
        // The engine also imports WASI 0.2 functions it must not call while
        // it initializes (as with wizer: a call traps).
        linker.define_unknown_imports_as_traps(&module)?;
        let mut store = Store::new(&engine, self.wasi(stdin)?);
        stable_file_stats(&mut linker, &mut store)?;
        let instance = linker.instantiate(&mut store, &module)?;
        // As wizer does: a reactor's own initialization, then the one asked.
        if let Ok(reactor) = instance.get_typed_func::<(), ()>(&mut store, "_initialize") {
            reactor.call(&mut store, ())?;
        }
        instance
            .get_typed_func::<(), ()>(&mut store, &self.init_func)?
            .call(&mut store, ())?;
        let mut state = Snapshotted {
            store: &mut store,
            instance,
        };
        let bytes = block_on(wizer.snapshot(&cx, &mut state))?;
        std::fs::write(&self.output, bytes)
            .map_err(|e| wasmtime::format_err!("{}: {e}", self.output.display()))?;
        Ok(())
    }
}

/// Where preview 1 puts a file's identity and times in a `filestat`.
const FILESTAT_DEV: usize = 0;
const FILESTAT_INO: usize = 8;
const FILESTAT_TIMES: std::ops::Range<usize> = 40..64;

/// The preview-1 calls whose answers carry a file's identity and times,
/// with the index of their `filestat` pointer argument.
const FILESTAT_CALLS: [(&str, usize); 2] = [("fd_filestat_get", 1), ("path_filestat_get", 4)];

/// Replaces `fd_filestat_get` and `path_filestat_get` by the same calls
/// with the file's times zeroed and its device and inode numbered in the
/// order the engine first sees them: the real ones (when the build wrote
/// the file, where the file system put it) would end up in the snapshot.
///
/// wasmtime-wasi's calls read the memory of the instance that calls them,
/// so the real ones are called through a small forwarding instance
/// ([`forwarder`]) that shares the engine's memory.
fn stable_file_stats(
    linker: &mut Linker<WasiP1Ctx>,
    store: &mut Store<WasiP1Ctx>,
) -> wasmtime::Result<()> {
    const WASI: &str = "wasi_snapshot_preview1";
    let engine = store.engine().clone();
    let forwarding = Module::new(&engine, forwarder())?;
    let mut real: Linker<WasiP1Ctx> = Linker::new(&engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut real, |ctx| ctx)?;
    let shared = std::sync::Arc::new(std::sync::Mutex::new(Forwarded {
        real,
        forwarding,
        instance: None,
        numbers: Renumbered::default(),
    }));
    linker.allow_shadowing(true);
    for (name, buf_arg) in FILESTAT_CALLS {
        let Ok(wasmtime::Extern::Func(original)) = linker.get(&mut *store, WASI, name) else {
            wasmtime::bail!("wasmtime-wasi defines no {name}");
        };
        let ty = original.ty(&*store);
        let shared = shared.clone();
        linker.func_new(WASI, name, ty, move |mut caller, params, results| {
            let Some(wasmtime::Extern::Memory(memory)) = caller.get_export("memory") else {
                wasmtime::bail!("{name}: the engine exports no memory");
            };
            let mut forwarded = shared.lock().expect("not poisoned");
            let instance = forwarded.instance(&mut caller, memory)?;
            instance
                .get_func(&mut caller, name)
                .expect("the forwarder exports every call")
                .call(&mut caller, params, results)?;
            let (wasmtime::Val::I32(0), wasmtime::Val::I32(buf)) = (&results[0], &params[buf_arg])
            else {
                return Ok(());
            };
            let at = *buf as u32 as usize;
            let stat = memory
                .data_mut(&mut caller)
                .get_mut(at..at + 64)
                .ok_or_else(|| wasmtime::format_err!("{name}: filestat out of bounds"))?;
            forwarded.numbers.stabilize(stat);
            Ok(())
        })?;
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// The real calls, reached through an instance that shares the engine's
/// memory (made at the first call, when that memory exists).
struct Forwarded {
    real: Linker<WasiP1Ctx>,
    forwarding: Module,
    instance: Option<Instance>,
    numbers: Renumbered,
}

impl Forwarded {
    fn instance(
        &mut self,
        caller: &mut wasmtime::Caller<'_, WasiP1Ctx>,
        memory: wasmtime::Memory,
    ) -> wasmtime::Result<Instance> {
        if let Some(instance) = self.instance {
            return Ok(instance);
        }
        self.real.define(&mut *caller, "env", "memory", memory)?;
        let instance = self.real.instantiate(&mut *caller, &self.forwarding)?;
        self.instance = Some(instance);
        Ok(instance)
    }
}

/// A module that imports a memory and the [`FILESTAT_CALLS`], exports the
/// memory, and exports each call as a function that calls it.
fn forwarder() -> Vec<u8> {
    use wasm_encoder::{
        CodeSection, EntityType, ExportKind, ExportSection, Function, FunctionSection,
        ImportSection, Instruction, MemoryType, TypeSection, ValType as W,
    };
    let mut types = TypeSection::new();
    let mut imports = ImportSection::new();
    let mut functions = FunctionSection::new();
    let mut exports = ExportSection::new();
    let mut code = CodeSection::new();
    imports.import(
        "env",
        "memory",
        EntityType::Memory(MemoryType {
            minimum: 0,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        }),
    );
    let calls = FILESTAT_CALLS.len() as u32;
    for (index, (name, buf_arg)) in FILESTAT_CALLS.iter().enumerate() {
        let params = vec![W::I32; buf_arg + 1];
        types.ty().function(params.clone(), [W::I32]);
        imports.import(
            "wasi_snapshot_preview1",
            name,
            EntityType::Function(index as u32),
        );
        functions.function(index as u32);
        exports.export(name, ExportKind::Func, calls + index as u32);
        let mut body = Function::new([]);
        for param in 0..params.len() as u32 {
            body.instruction(&Instruction::LocalGet(param));
        }
        body.instruction(&Instruction::Call(index as u32));
        body.instruction(&Instruction::End);
        code.function(&body);
    }
    exports.export("memory", ExportKind::Memory, 0);
    let mut module = wasm_encoder::Module::new();
    module
        .section(&types)
        .section(&imports)
        .section(&functions)
        .section(&exports)
        .section(&code);
    module.finish()
}

/// Real device and inode numbers mapped to 1, 2, ... in order of first
/// sight (so two names of one file still compare equal).
#[derive(Default)]
struct Renumbered {
    devices: std::collections::HashMap<u64, u64>,
    inodes: std::collections::HashMap<(u64, u64), u64>,
}

impl Renumbered {
    fn stabilize(&mut self, stat: &mut [u8]) {
        let read = |at: usize| u64::from_le_bytes(stat[at..at + 8].try_into().expect("8 bytes"));
        let (dev, ino) = (read(FILESTAT_DEV), read(FILESTAT_INO));
        let next = self.devices.len() as u64 + 1;
        let device = *self.devices.entry(dev).or_insert(next);
        let next = self.inodes.len() as u64 + 1;
        let inode = *self.inodes.entry((dev, ino)).or_insert(next);
        stat[FILESTAT_DEV..FILESTAT_DEV + 8].copy_from_slice(&device.to_le_bytes());
        stat[FILESTAT_INO..FILESTAT_INO + 8].copy_from_slice(&inode.to_le_bytes());
        stat[FILESTAT_TIMES].fill(0);
    }
}

/// The instance's globals and memories, for wizer's snapshot.
struct Snapshotted<'a> {
    store: &'a mut Store<WasiP1Ctx>,
    instance: Instance,
}

impl InstanceState for Snapshotted<'_> {
    async fn global_get(&mut self, name: &str, _: ValType) -> SnapshotVal {
        let global = self
            .instance
            .get_global(&mut *self.store, name)
            .expect("wizer names an exported global");
        match global.get(&mut *self.store) {
            wasmtime::Val::I32(x) => SnapshotVal::I32(x),
            wasmtime::Val::I64(x) => SnapshotVal::I64(x),
            wasmtime::Val::F32(x) => SnapshotVal::F32(x),
            wasmtime::Val::F64(x) => SnapshotVal::F64(x),
            wasmtime::Val::V128(x) => SnapshotVal::V128(x.as_u128()),
            other => panic!("a global wizer cannot snapshot: {other:?}"),
        }
    }

    async fn memory_contents(&mut self, name: &str, contents: impl FnOnce(&[u8]) + Send) {
        let memory = self
            .instance
            .get_memory(&mut *self.store, name)
            .expect("wizer names an exported memory");
        contents(memory.data(&*self.store))
    }
}

/// Drives a future that never waits (the snapshot only reads the store).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime")
        .block_on(future)
}

/// The wall clock at the epoch, always.
struct EpochClock;

impl HostWallClock for EpochClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// A monotonic clock that moves 1 µs each time it is read.
#[derive(Default)]
struct CountingClock(AtomicU64);

impl HostMonotonicClock for CountingClock {
    fn resolution(&self) -> u64 {
        1_000
    }
    fn now(&self) -> u64 {
        self.0.fetch_add(1_000, Ordering::Relaxed) + 1_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split(' ').map(String::from).collect()
    }

    #[test]
    fn componentize_js_arguments_are_understood() {
        let request = Request::parse(&args(
            "--allow-wasi --init-func componentize.wizer --dir=/tmp/ab12/sources \
             --mapdir=/::/home/u/p/.sluice-build/7-0 --wasm-bulk-memory=true \
             --inherit-env=true -o=/tmp/ab12/out.wasm /tmp/ab12/in.wasm",
        ))
        .expect("parsed");
        assert_eq!(request.init_func, "componentize.wizer");
        assert_eq!(request.dirs, [PathBuf::from("/tmp/ab12/sources")]);
        assert!(request.inherit_env);
        assert_eq!(request.output, PathBuf::from("/tmp/ab12/out.wasm"));
        assert_eq!(request.input, PathBuf::from("/tmp/ab12/in.wasm"));
        let stdin = "--initializer-script-path /tmp/ab12/sources/initializer.js \
                     --strip-path-prefix /home/u/p/.sluice-build/7-0/ js/app.js";
        assert_eq!(
            request.guest_arguments(stdin.into()),
            "--initializer-script-path /sluice-js/sources/initializer.js \
             --strip-path-prefix / js/app.js"
        );
    }

    #[test]
    fn an_unknown_option_is_refused() {
        let refused = Request::parse(&args("--init-func f -o out in.wasm --keep-init-func"));
        assert!(format!("{:?}", refused.expect_err("refused")).contains("--keep-init-func"));
    }
}
