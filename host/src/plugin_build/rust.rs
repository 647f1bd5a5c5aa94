//! Rust plugins: cargo for `wasm32-unknown-unknown` (no WASI) with the
//! `sluice-plugin` SDK staged from this binary, then `wasm-tools component
//! new` around the core module. It must not look for tools itself
//! (`toolchain` does).

use super::toolchain::{cargo_tool, find_tool, run, run_capturing, toolchains_dir};
use super::{BuildError, WIT, write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Rust SDK (crate `sluice-plugin`), staged as a crate of its own:
/// each source file at its path in the crate.
const RUST_SDK: &[(&str, &str)] = &[
    ("src/lib.rs", include_str!("../../../sdk/rust/src/lib.rs")),
    // Its event-time windows (`sluice_plugin::window`).
    (
        "src/window.rs",
        include_str!("../../../sdk/rust/src/window.rs"),
    ),
    (
        "src/window/ceiling.rs",
        include_str!("../../../sdk/rust/src/window/ceiling.rs"),
    ),
    (
        "src/window/held.rs",
        include_str!("../../../sdk/rust/src/window/held.rs"),
    ),
];

/// What `sluice new --lang rust` writes (`sdk/rust/template`).
pub(super) const TEMPLATE: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../sdk/rust/template/Cargo.toml"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../sdk/rust/template/src/lib.rs"),
    ),
];
const RUST_SDK_VERSION: &str = "0.1.0";
/// Where the SDK is staged, under the project.
const RUST_SDK_STAGE: &str = ".sluice-build/rust-sdk/sluice-plugin";

/// Writes `text` to `path` unless it holds it already (a rewrite would
/// make cargo build the SDK again), through a rename, so a build reading
/// it at the same time sees the old file or the new one.
fn write_if_changed(path: &Path, text: &str) -> Result<(), BuildError> {
    if std::fs::read(path).is_ok_and(|held| held == text.as_bytes()) {
        return Ok(());
    }
    let fresh = path.with_extension(format!("new-{}", std::process::id()));
    write(&fresh, text)?;
    std::fs::rename(&fresh, path).map_err(super::io(path))
}

/// cargo for `wasm32-unknown-unknown` (no WASI) with `sluice-plugin`
/// patched to the SDK staged from this binary, then `wasm-tools component
/// new` around the core module.
pub(super) fn build_rust(
    dir: &Path,
    _stage: &Path,
    manifest: &str,
    out: &Path,
) -> Result<(), BuildError> {
    let cargo = find_tool("cargo", "rust/bin/cargo").ok_or_else(|| BuildError::ToolMissing {
        tool: "cargo",
        looked: toolchains_dir().join("rust/bin").display().to_string(),
        install: "rustup (https://rustup.rs), then: rustup target add wasm32-unknown-unknown"
            .into(),
    })?;
    let wasm_tools = cargo_tool("wasm-tools")
        .or_else(|| Some(cargo.with_file_name("wasm-tools")).filter(|p| p.is_file()))
        .ok_or_else(|| BuildError::ToolMissing {
            tool: "wasm-tools",
            looked: "PATH and ~/.cargo/bin".into(),
            install: "cargo install wasm-tools --locked".into(),
        })?;
    // Not in the build's own stage: at one place per project, rewritten
    // only when this binary's SDK differs, so cargo reuses its build and
    // the paths compiled into the module (panic locations) are the same
    // in every build: the same sources give the same bytes.
    let sdk = dir.join(RUST_SDK_STAGE);
    for (path, text) in RUST_SDK {
        write_if_changed(&sdk.join(path), text)?;
    }
    write_if_changed(&sdk.join("wit/sluice.wit"), WIT)?;
    write_if_changed(
        &sdk.join("Cargo.toml"),
        &format!(
            "[package]\nname = \"sluice-plugin\"\nversion = \"{RUST_SDK_VERSION}\"\n\
             edition = \"2024\"\n\n[dependencies]\nwit-bindgen = {{ version = \"0.61\", \
             default-features = false, features = [\"macros\", \"realloc\"] }}\n\
             foldhash = {{ version = \"0.2\", default-features = false }}\n"
        ),
    )?;
    let patch = format!(
        "patch.crates-io.sluice-plugin.path={:?}",
        sdk.display().to_string()
    );
    let mut command = Command::new(cargo);
    command
        .args(["build", "--release", "--target", "wasm32-unknown-unknown"])
        .args([
            "--message-format",
            "json-render-diagnostics",
            "--manifest-path",
        ])
        .arg(dir.join(manifest))
        .args(["--config", &patch])
        .current_dir(dir);
    let messages = run_capturing("cargo", command)?;
    let core = built_cdylib(&messages).ok_or_else(|| BuildError::Manifest {
        path: dir.join(manifest),
        message: "cargo built no `cdylib` .wasm: set `[lib] crate-type = [\"cdylib\"]`".into(),
    })?;
    let mut command = Command::new(wasm_tools);
    command
        .args(["component", "new"])
        .arg(&core)
        .arg("-o")
        .arg(out);
    run("wasm-tools", command)
}

/// The `.wasm` of the `cdylib` cargo reported building (its JSON messages).
fn built_cdylib(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib"))
        })
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|f| f.as_str().map(PathBuf::from))
                .collect::<Vec<_>>()
        })
        .rfind(|f| f.extension().is_some_and(|e| e == "wasm"))
}

#[cfg(test)]
mod tests {
    use super::RUST_SDK;
    use std::path::Path;

    /// The SDK's sources under `dir`, as paths in its crate.
    fn sources(dir: &Path, crate_root: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("the SDK's sources") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                sources(&path, crate_root, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let inside = path.strip_prefix(crate_root).expect("under the crate");
                found.push(inside.to_string_lossy().into_owned());
            }
        }
    }

    /// A source file added to the SDK without staging it would build in
    /// this repository and fail in every user's `sluice build`.
    #[test]
    fn every_sdk_source_is_staged() {
        let crate_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/rust");
        let mut found = Vec::new();
        sources(&crate_root.join("src"), &crate_root, &mut found);
        found.sort();
        let mut staged: Vec<String> = RUST_SDK.iter().map(|(p, _)| p.to_string()).collect();
        staged.sort();
        assert_eq!(found, staged);
    }
}
