//! C plugins: clang for `wasm32-wasi` (wasi-libc) as a reactor with the C
//! SDK and the bindings `wit-bindgen c` makes, then WASI preview 1 adapted
//! (`adapt_preview1`, which Go shares). It must not look for tools itself
//! (`toolchain` does).

use super::toolchain::{cargo_tool, find_tool, run, toolchains_dir, wasm_tools};
use super::{BuildError, io, write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What `sluice new --lang c` writes (`sdk/c/template`).
pub(super) const TEMPLATE: &[(&str, &str)] =
    &[("app.c", include_str!("../../../sdk/c/template/app.c"))];

/// The C SDK's headers (`sluice.h`; `sluice_json.h`, its JSON reader;
/// `sluice_window.h`, its event-time windows), staged with the bindings.
const C_SDK_HEADERS: &[(&str, &str)] = &[
    ("sluice.h", include_str!("../../../sdk/c/sluice.h")),
    (
        "sluice_json.h",
        include_str!("../../../sdk/c/sluice_json.h"),
    ),
    (
        "sluice_window.h",
        include_str!("../../../sdk/c/sluice_window.h"),
    ),
];
/// The C SDK's sources, compiled with the project.
const C_SDK_SOURCES: &[(&str, &str)] = &[
    ("sluice.c", include_str!("../../../sdk/c/sluice.c")),
    (
        "sluice_json.c",
        include_str!("../../../sdk/c/sluice_json.c"),
    ),
    (
        "sluice_window.c",
        include_str!("../../../sdk/c/sluice_window.c"),
    ),
];

/// clang for `wasm32-wasi` (wasi-libc) as a reactor, with the bindings
/// `wit-bindgen c` makes from the staged WIT and the C SDK; then
/// `wasm-tools component new`, adapting WASI preview 1 to the 0.2
/// interfaces the host provides deterministically.
pub(super) fn build_c(dir: &Path, stage: &Path, entry: &str, out: &Path) -> Result<(), BuildError> {
    const C_INSTALL: &str =
        "apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32   (Debian 12)";
    let clang = find_tool("clang", "c/bin/clang").ok_or_else(|| BuildError::ToolMissing {
        tool: "clang",
        looked: toolchains_dir().join("c/bin").display().to_string(),
        install: C_INSTALL.into(),
    })?;
    let sysroot = wasi_sysroot().ok_or_else(|| BuildError::ToolMissing {
        tool: "wasi-libc",
        looked: "$WASI_SYSROOT, /usr (Debian's wasi-libc), /usr/share/wasi-sysroot".into(),
        install: C_INSTALL.into(),
    })?;
    let bindgen = cargo_tool("wit-bindgen").ok_or_else(|| BuildError::ToolMissing {
        tool: "wit-bindgen",
        looked: "PATH and ~/.cargo/bin".into(),
        install: "cargo install wit-bindgen-cli --version =0.61.0 --locked".into(),
    })?;
    let wasm_tools = wasm_tools()?;
    let bindings = stage.join("c");
    let mut command = Command::new(bindgen);
    command
        .arg("c")
        .arg(stage.join("wit"))
        .args(["--world", "transform", "--out-dir"])
        .arg(&bindings);
    run("wit-bindgen", command)?;
    for (name, text) in C_SDK_HEADERS.iter().chain(C_SDK_SOURCES) {
        write(&bindings.join(name), text)?;
    }
    let core = stage.join("core.wasm");
    let mut command = Command::new(clang);
    command
        .args(["--target=wasm32-wasi", "-mexec-model=reactor", "-O2"])
        // The stack below the data (an overflow traps instead of
        // overwriting the heap), 1 MiB of it.
        .args(["-Wl,--stack-first", "-Wl,-z,stack-size=1048576"])
        .arg(format!("--sysroot={}", sysroot.display()))
        .arg("-I")
        .arg(&bindings)
        .arg("-I")
        .arg(dir)
        .arg("-o")
        .arg(&core)
        .arg(dir.join(entry))
        .args(other_c_sources(dir, entry)?)
        .args(C_SDK_SOURCES.iter().map(|(name, _)| bindings.join(name)))
        .arg(bindings.join("transform.c"))
        .arg(bindings.join("transform_component_type.o"))
        .current_dir(dir);
    run("clang", command)?;
    adapt_preview1(&wasm_tools, stage, &core, out)
}

/// `wasm-tools component new` around a WASI preview-1 reactor that
/// carries its component type, adapting preview 1 to the 0.2 interfaces
/// the host provides deterministically (the adapter of wasmtime 48,
/// compiled into this binary).
pub(super) fn adapt_preview1(
    wasm_tools: &Path,
    stage: &Path,
    core: &Path,
    out: &Path,
) -> Result<(), BuildError> {
    let adapter = stage.join("wasi_snapshot_preview1.reactor.wasm");
    std::fs::write(
        &adapter,
        wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
    )
    .map_err(io(&adapter))?;
    let mut command = Command::new(wasm_tools);
    command
        .args(["component", "new"])
        .arg(core)
        .arg("--adapt")
        .arg(format!("wasi_snapshot_preview1={}", adapter.display()))
        .arg("-o")
        .arg(out);
    run("wasm-tools", command)
}

/// The project's other `.c` files at its top level, compiled with the entry.
fn other_c_sources(dir: &Path, entry: &str) -> Result<Vec<PathBuf>, BuildError> {
    let mut sources = Vec::new();
    for item in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = item.map_err(io(dir))?.path();
        let is_c = path.extension().is_some_and(|e| e == "c");
        if is_c && path.file_name() != Some(std::ffi::OsStr::new(entry)) {
            sources.push(path);
        }
    }
    sources.sort();
    Ok(sources)
}

/// A wasi-libc sysroot: `$WASI_SYSROOT`, Debian's (`/usr`, the libraries
/// in `/usr/lib/wasm32-wasi`) or wasi-sdk's.
fn wasi_sysroot() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("WASI_SYSROOT").map(PathBuf::from),
        Some(PathBuf::from("/usr")),
        Some(PathBuf::from("/usr/share/wasi-sysroot")),
        Some(PathBuf::from("/opt/wasi-sdk/share/wasi-sysroot")),
    ];
    candidates.into_iter().flatten().find(|root| {
        root.join("lib/wasm32-wasi/libc.a").is_file()
            || root.join("lib/wasm32-wasip1/libc.a").is_file()
    })
}
