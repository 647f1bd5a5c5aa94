//! Finding a guest toolchain (on PATH, in the toolchains directory, where
//! cargo installs) and running it with its output kept for the error. It
//! must not know a language's build steps.

use super::BuildError;
use std::path::PathBuf;
use std::process::Command;

/// Where `sluice build` looks for toolchains it did not find on PATH:
/// `$SLUICE_TOOLCHAINS`, else `~/.cache/sluice/toolchains`.
pub fn toolchains_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SLUICE_TOOLCHAINS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache/sluice/toolchains")
}

/// `wasm-tools`, which wraps a core module into a component.
pub(super) fn wasm_tools() -> Result<PathBuf, BuildError> {
    cargo_tool("wasm-tools").ok_or_else(|| BuildError::ToolMissing {
        tool: "wasm-tools",
        looked: "PATH and ~/.cargo/bin".into(),
        install: "cargo install wasm-tools --locked".into(),
    })
}

/// A tool cargo installs: on PATH, else in `$CARGO_HOME/bin` (default
/// `~/.cargo/bin`).
pub(super) fn cargo_tool(name: &str) -> Option<PathBuf> {
    find_tool(name, &format!("rust/bin/{name}")).or_else(|| {
        let home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
        Some(home.join("bin").join(name)).filter(|p| p.is_file())
    })
}

/// `name` on PATH, else `relative` under the toolchains directory.
pub(super) fn find_tool(name: &str, relative: &str) -> Option<PathBuf> {
    find_on_path(name).or_else(|| Some(toolchains_dir().join(relative)).filter(|p| p.is_file()))
}

pub(super) fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs a toolchain command; its output is shown only when it fails.
pub(super) fn run(tool: &'static str, command: Command) -> Result<(), BuildError> {
    run_capturing(tool, command).map(|_| ())
}

/// [`run`], returning what the command wrote to stdout.
pub(super) fn run_capturing(
    tool: &'static str,
    mut command: Command,
) -> Result<String, BuildError> {
    let output = command.output().map_err(|source| BuildError::Io {
        path: PathBuf::from(command.get_program()),
        source,
    })?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Err(BuildError::ToolFailed {
        tool,
        status: output.status,
        output: text.trim_end().to_string(),
    })
}
