//! Python plugins: componentize-py with the entry module and the SDK on
//! its path, the WIT from the stage. It must not look for tools itself
//! (`toolchain` does).

use super::toolchain::{find_tool, run, toolchains_dir};
use super::{BuildError, write};
use std::path::Path;
use std::process::Command;

/// What `sluice new --lang python` writes (`sdk/python/template`).
pub(super) const TEMPLATE: &[(&str, &str)] = &[(
    "app.py",
    include_str!("../../../sdk/python/template/app.py"),
)];

/// The Python SDK (package `sluice_plugin`), file by file.
const PYTHON_SDK: &[(&str, &str)] = &[
    (
        "__init__.py",
        include_str!("../../../sdk/python/sluice_plugin/__init__.py"),
    ),
    (
        "window.py",
        include_str!("../../../sdk/python/sluice_plugin/window.py"),
    ),
];
/// Pinned: the version the conformance suite passes with.
const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";

/// componentize-py: the entry module and the SDK on its path, the WIT from
/// the stage.
pub(super) fn build_python(
    dir: &Path,
    stage: &Path,
    entry: &str,
    out: &Path,
) -> Result<(), BuildError> {
    let tool = find_tool("componentize-py", "python/bin/componentize-py").ok_or_else(|| {
        let venv = toolchains_dir().join("python");
        BuildError::ToolMissing {
            tool: "componentize-py",
            looked: toolchains_dir().join("python/bin").display().to_string(),
            install: format!(
                "python3 -m venv {0} && {0}/bin/pip install {COMPONENTIZE_PY}",
                venv.display()
            ),
        }
    })?;
    for (file, source) in PYTHON_SDK {
        write(&stage.join("python/sluice_plugin").join(file), source)?;
    }
    let module = entry.trim_end_matches(".py").replace('/', ".");
    let mut command = Command::new(tool);
    command
        .arg("-d")
        .arg(stage.join("wit"))
        .args(["-w", "transform", "componentize", &module, "-p"])
        .arg(dir)
        .arg("-p")
        .arg(stage.join("python"))
        .arg("-o")
        .arg(out)
        .current_dir(dir);
    run("componentize-py", command)
}
