//! `sluice new` and `sluice build`: plugin projects in each guest language,
//! scaffolded from templates and built into components by calling the
//! language's own toolchain.
//!
//! Owns the project manifest (`sluice-plugin.toml`), what every template
//! shares (`host/templates`: its README and sample; each language's own
//! files come from its module, out of `sdk/<language>/template`), and
//! where toolchains are looked for. The WIT and the language SDKs are
//! compiled into this binary and staged into a fresh directory under the
//! project's `.sluice-build/` for every build (removed after it; the Rust
//! SDK is the exception, kept in `.sluice-build/rust-sdk/` so the paths
//! cargo compiles in stay the same), so a project needs only its own
//! sources and always builds against the contract of the host that builds
//! it. The same sources give the same bytes in every language but Python
//! (docs/languages.md, "Reproducible builds"). It must not run or validate
//! transforms: `sluice test` and the runtime do that (`js_pre_init` runs
//! componentize-js's engine at build time, only to snapshot it).
//!
//! One module per language (`rust`, `c`, `go`, `python`, `js`: its SDK
//! staged, its toolchain's steps; `js_pre_init`, the deterministic
//! snapshot step componentize-js runs) and `toolchain`, which finds and
//! runs the tools.

mod adapter_realloc;
mod c;
mod go;
mod js;
mod js_pre_init;
mod python;
mod rust;
mod toolchain;

pub use js_pre_init::pre_init_main as js_pre_init_main;
pub use js_pre_init::{PRE_INIT_NAME as JS_PRE_INIT_NAME, is_pre_init as is_js_pre_init};
pub use toolchain::toolchains_dir;

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The plugin contract, as this host implements it.
const WIT: &str = include_str!("../../wit/sluice.wit");

/// The manifest's file name, at the project's root.
pub const MANIFEST: &str = "sluice-plugin.toml";

/// A guest language `sluice new` and `sluice build` know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Rust,
    C,
    Python,
    Js,
    Go,
}

impl Language {
    /// The language's name, for people.
    pub fn name(self) -> &'static str {
        match self {
            Language::Rust => "Rust",
            Language::C => "C",
            Language::Python => "Python",
            Language::Js => "JavaScript",
            Language::Go => "Go",
        }
    }

    fn default_entry(self) -> &'static str {
        match self {
            Language::Rust => "Cargo.toml",
            Language::C => "app.c",
            Language::Python => "app.py",
            Language::Js => "app.js",
            Language::Go => "go.mod",
        }
    }
}

/// `sluice-plugin.toml`: what a plugin project is.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The plugin's name: the component is built as `dist/<name>.wasm`.
    pub name: String,
    /// Its language: `rust`, `c`, `python`, `js` or `go`.
    pub language: Language,
    /// The source file that exports the transform (default `app.c`,
    /// `app.py`, `app.js`; for Rust, the package's `Cargo.toml`; for Go,
    /// the `go.mod` of the module whose root is the main package), relative
    /// to the project.
    #[serde(default)]
    pub entry: Option<String>,
}

/// Why a project could not be made or built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Manifest { path: PathBuf, message: String },
    #[error("{0} exists already; choose another name or remove it")]
    Exists(PathBuf),
    #[error("`{0}` is not a plugin name: use letters, digits, `-` and `_`")]
    BadName(String),
    #[error(
        "{tool} is not installed (looked on PATH and in {looked}); install it with:\n  {install}"
    )]
    ToolMissing {
        tool: &'static str,
        looked: String,
        install: String,
    },
    #[error("{tool} failed ({status}):\n{output}")]
    ToolFailed {
        tool: &'static str,
        status: std::process::ExitStatus,
        output: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Scaffolds a project for `language` in a new directory `dir` (its last
/// component is the plugin's name).
pub fn new_project(dir: &Path, language: Language) -> Result<(), BuildError> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(BuildError::BadName(name));
    }
    if dir.exists() {
        return Err(BuildError::Exists(dir.to_path_buf()));
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let fill = |template: &str| {
        template
            .replace("{{name}}", &name)
            .replace("{{language}}", language.name())
    };
    // The manifest's spelling is the CLI's (`--lang`): one name each.
    let value = clap::ValueEnum::to_possible_value(&language).expect("no skipped variant");
    let lang = value.get_name();
    let sources: &[(&str, &str)] = match language {
        Language::Rust => rust::TEMPLATE,
        Language::C => c::TEMPLATE,
        Language::Python => python::TEMPLATE,
        Language::Js => js::TEMPLATE,
        Language::Go => go::TEMPLATE,
    };
    let mut files: Vec<(String, String)> = sources
        .iter()
        .map(|(file, text)| (file.to_string(), fill(text)))
        .collect();
    files.extend([
        (
            MANIFEST.to_string(),
            format!("name = \"{name}\"\nlanguage = \"{lang}\"\n"),
        ),
        (
            "sample.jsonl".to_string(),
            include_str!("../templates/sample.jsonl").to_string(),
        ),
        (
            "README.md".to_string(),
            fill(include_str!("../templates/README.md")),
        ),
        (
            ".gitignore".to_string(),
            "/dist\n/target\n/.sluice-build\n/.sluice-cache\n".to_string(),
        ),
    ]);
    for (file, text) in files {
        write(&dir.join(file), &text)?;
    }
    Ok(())
}

/// Reads `dir`'s manifest.
pub fn manifest(dir: &Path) -> Result<Manifest, BuildError> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&path).map_err(|e| BuildError::Manifest {
        path: path.clone(),
        message: format!("{e} (is this a plugin project? `sluice new` makes one)"),
    })?;
    let manifest: Manifest = toml::from_str(&text).map_err(|e| BuildError::Manifest {
        path: path.clone(),
        message: e.message().to_string(),
    })?;
    if manifest.name.is_empty() {
        return Err(BuildError::Manifest {
            path,
            message: "`name` is empty".into(),
        });
    }
    Ok(manifest)
}

/// Builds the project in `dir` into a component; returns its path
/// (`out`, or `dir/dist/<name>.wasm`).
pub fn build(dir: &Path, out: Option<&Path>) -> Result<PathBuf, BuildError> {
    let manifest = manifest(dir)?;
    let dir = std::fs::canonicalize(dir).map_err(io(dir))?;
    let out = match out {
        Some(path) => std::path::absolute(path).map_err(io(path))?,
        None => dir.join("dist").join(format!("{}.wasm", manifest.name)),
    };
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    // A stage of its own per build: two builds of one project at once
    // (an editor and a terminal, parallel tests) never share one.
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stage = dir
        .join(".sluice-build")
        .join(format!("{}-{n}", std::process::id()));
    if stage.exists() {
        std::fs::remove_dir_all(&stage).map_err(io(&stage))?;
    }
    write(&stage.join("wit/sluice.wit"), WIT)?;
    let entry = manifest
        .entry
        .clone()
        .unwrap_or_else(|| manifest.language.default_entry().to_string());
    if !dir.join(&entry).is_file() {
        return Err(BuildError::Manifest {
            path: dir.join(MANIFEST),
            message: format!("entry `{entry}` is not a file in the project"),
        });
    }
    let built = match manifest.language {
        Language::Rust => rust::build_rust(&dir, &stage, &entry, &out),
        Language::C => c::build_c(&dir, &stage, &entry, &out),
        Language::Python => python::build_python(&dir, &stage, &entry, &out),
        Language::Js => js::build_js(&dir, &stage, &entry, &out),
        Language::Go => go::build_go(&dir, &stage, &entry, &out),
    };
    // The stage is only an input of this build; a leftover costs disk only.
    let _ = std::fs::remove_dir_all(&stage);
    built.map(|()| out)
}

fn write(path: &Path, text: &str) -> Result<(), BuildError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    std::fs::write(path, text).map_err(io(path))
}
