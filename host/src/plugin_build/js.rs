//! JavaScript plugins: componentize-js through Node, the project's `.js`
//! files and the SDK staged side by side, this binary as its
//! pre-initializer (`js_pre_init`: the same sources give the same
//! bytes). It must not look for tools itself (`toolchain` does).

use super::toolchain::{find_tool, run, toolchains_dir};
use super::{BuildError, io, write};
use std::path::Path;
use std::process::Command;

/// What `sluice new --lang js` writes (`sdk/js/template`).
pub(super) const TEMPLATE: &[(&str, &str)] =
    &[("app.js", include_str!("../../../sdk/js/template/app.js"))];

/// The JavaScript SDK: its modules, staged next to the project's sources
/// (`import ... from './sluice.js'`, `'./window.js'`).
const JS_SDK: &[(&str, &str)] = &[
    ("sluice.js", include_str!("../../../sdk/js/sluice.js")),
    ("window.js", include_str!("../../../sdk/js/window.js")),
];
/// Pinned: the version the conformance suite passes with.
const COMPONENTIZE_JS: &str = "@bytecodealliance/componentize-js@0.23.0";

/// componentize-js through Node: the project's `.js` files and the SDK
/// staged side by side (so `import ... from './sluice.js'` resolves), the
/// WASI features a transform must not have (HTTP) left out.
pub(super) fn build_js(
    dir: &Path,
    stage: &Path,
    entry: &str,
    out: &Path,
) -> Result<(), BuildError> {
    let node = find_tool("node", "node/bin/node").ok_or_else(|| BuildError::ToolMissing {
        tool: "node",
        looked: toolchains_dir().join("node/bin").display().to_string(),
        install: "apt-get install nodejs npm   (Node 20 or newer)".into(),
    })?;
    let package = [
        dir.join("node_modules/@bytecodealliance/componentize-js"),
        toolchains_dir().join("js/node_modules/@bytecodealliance/componentize-js"),
    ]
    .into_iter()
    .find(|p| p.join("src/componentize.js").is_file())
    .ok_or_else(|| BuildError::ToolMissing {
        tool: "componentize-js",
        looked: format!(
            "{} and the project's node_modules",
            toolchains_dir().join("js/node_modules").display()
        ),
        install: format!(
            "npm install --prefix {} {COMPONENTIZE_JS}",
            toolchains_dir().join("js").display()
        ),
    })?;
    let sources = stage.join("js");
    copy_js_sources(dir, dir, &sources)?;
    for (name, text) in JS_SDK {
        write(&sources.join(name), text)?;
    }
    let pre_init = link_pre_init(stage)?;
    let script = stage.join("build.mjs");
    write(
        &script,
        &format!(
            "import {{ componentize }} from {:?};\n\
             import {{ writeFile }} from 'node:fs/promises';\n\
             const [source, wit, out, wizerBin] = process.argv.slice(2);\n\
             const {{ component }} = await componentize({{ sourcePath: source, witPath: wit, \
             worldName: 'transform', disableFeatures: ['http', 'fetch-event'], wizerBin }});\n\
             await writeFile(out, component);\n",
            package.join("src/componentize.js").display().to_string()
        ),
    )?;
    let mut command = Command::new(node);
    command
        .arg(&script)
        .arg(sources.join(entry))
        .arg(stage.join("wit"))
        .arg(out)
        .arg(&pre_init)
        .current_dir(stage);
    run("componentize-js", command)
}

/// A link to this binary named as the pre-initializer (`js_pre_init`),
/// which componentize-js runs instead of its own wizer so that the same
/// sources build to the same bytes.
fn link_pre_init(stage: &Path) -> Result<std::path::PathBuf, BuildError> {
    let this = std::env::current_exe().map_err(io(Path::new("/proc/self/exe")))?;
    let dir = stage.join("bin");
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let link = dir.join(super::JS_PRE_INIT_NAME);
    std::os::unix::fs::symlink(&this, &link).map_err(io(&link))?;
    Ok(link)
}

/// Copies every `.js`/`.mjs` file under `from` (not `node_modules`, `dist`
/// or the stage) to the same place under `to`.
fn copy_js_sources(root: &Path, from: &Path, to: &Path) -> Result<(), BuildError> {
    for entry in std::fs::read_dir(from).map_err(io(from))? {
        let path = entry.map_err(io(from))?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if !matches!(name, "node_modules" | "dist" | ".sluice-build" | ".git") {
                copy_js_sources(root, &path, to)?;
            }
        } else if name.ends_with(".js") || name.ends_with(".mjs") {
            let relative = path.strip_prefix(root).expect("under the root");
            let target = to.join(relative);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            std::fs::copy(&path, &target).map_err(io(&path))?;
        }
    }
    Ok(())
}
