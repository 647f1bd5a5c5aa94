//! Loading a component: check its structure, imports and exports without
//! compiling (cheap, so a module that would be refused costs nothing to
//! refuse), compile under a budget or reuse the cached artifact, check the
//! world's types, pre-instantiate.
//!
//! The compiled-artifact cache is `cache`'s.

use super::RunError;
use super::bindings::{BatchState, Transform, TransformPre};
use super::cache;
use crate::batch::sha256_hex;
use sluice_core::limits::Limits;
use std::hash::{Hash, Hasher};
use std::path::Path;
use wasmtime::component::{Component, Linker, types::ComponentItem};
use wasmtime::{Engine, Store};

/// Interfaces a module may import: the world's own, of 0.1.3 (the host's),
/// 0.1.2 (built before timer values), 0.1.1 (before `time`) or 0.1.0
/// (before `state`); the linker serves older ones 0.1.3's, which semver
/// makes compatible.
const ALLOWED_IMPORTS: &[&str] = &[
    "sluice:plugin/types@0.1.3",
    "sluice:plugin/log@0.1.3",
    "sluice:plugin/state@0.1.3",
    "sluice:plugin/time@0.1.3",
    "sluice:plugin/types@0.1.2",
    "sluice:plugin/log@0.1.2",
    "sluice:plugin/state@0.1.2",
    "sluice:plugin/time@0.1.2",
    "sluice:plugin/types@0.1.1",
    "sluice:plugin/log@0.1.1",
    "sluice:plugin/state@0.1.1",
    "sluice:plugin/types@0.1.0",
    "sluice:plugin/log@0.1.0",
];

/// The WASI 0.2 interfaces a module may import (any 0.2.x; the host links
/// 0.2.12, which serves every older 0.2 import). All are deterministic per
/// batch (`wasi.rs`): the filesystem has no directory to open and every
/// socket use is denied, so importing them gives no access; they are here
/// because Python's and Go's runtimes import them whether used or not.
/// Anything else (wasi:http, wasi:keyvalue, ...) is refused at load.
const ALLOWED_WASI: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/ip-name-lookup",
];

/// Whether a module may import the interface `name` (`ns:pkg/iface@version`).
fn is_allowed_import(name: &str) -> bool {
    if ALLOWED_IMPORTS.contains(&name) {
        return true;
    }
    match name.split_once('@') {
        Some((interface, version)) => {
            version.starts_with("0.2.") && ALLOWED_WASI.contains(&interface)
        }
        None => false,
    }
}

/// The functions the world's transform exports.
const WORLD_EXPORTS: &[&str] = &["init", "process"];

/// Why a module cannot be used. All are the user's to fix; none is retryable.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error("cannot read module {path}")]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("not a WebAssembly component: {0}")]
    NotAComponent(String),
    #[error("{}", forbidden_imports(.0))]
    ForbiddenImport(Vec<String>),
    #[error(
        "module does not implement the sluice:plugin/transform world (0.1.3, or an older 0.1): {0}"
    )]
    WrongWorld(String),
    /// Compiling it would take more time or memory than the limits give.
    #[error("module refused: {0}")]
    CompileBudget(String),
    #[error("wasm engine: {0}")]
    Engine(String),
}

/// A validated, compiled, pre-instantiated module version.
pub struct LoadedModule {
    /// sha256 of the component bytes, hex.
    pub digest: String,
    pre: TransformPre<BatchState>,
}

impl LoadedModule {
    pub(super) fn instantiate(&self, store: &mut Store<BatchState>) -> Result<Transform, RunError> {
        self.pre
            .instantiate(store)
            .map_err(|e| RunError::Instantiate(format!("{e:#}")))
    }
}

/// Hex of the engine's compatibility hash: artifacts compiled by another
/// wasmtime version or configuration are never reused.
pub fn engine_hash(engine: &Engine) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{:016x}", h.finish())
}

pub fn load(
    engine: &Engine,
    linker: &Linker<BatchState>,
    limits: &Limits,
    bytes: &[u8],
    cache_dir: Option<&Path>,
) -> Result<LoadedModule, ModuleError> {
    if is_core_module(bytes) {
        return Err(ModuleError::NotAComponent(
            "this is a core wasm module; wrap it into a component (e.g. `wasm-tools component new`)"
                .into(),
        ));
    }
    check_before_compiling(bytes)?;
    let digest = sha256_hex(bytes);
    let component = cache::compile_cached(engine, limits, bytes, &digest, cache_dir)?;
    check_imports(engine, &component)?;
    let pre = linker
        .instantiate_pre(&component)
        .map_err(|e| ModuleError::WrongWorld(format!("{e:#}")))?;
    let pre = TransformPre::new(pre).map_err(|e| ModuleError::WrongWorld(format!("{e:#}")))?;
    Ok(LoadedModule { digest, pre })
}

fn is_core_module(bytes: &[u8]) -> bool {
    // A core module's preamble is `\0asm` + version 1; a component's is
    // `\0asm` + version 0x0d with layer 1.
    bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0]
}

/// The checks that need no compiling: the component's framing, its
/// top-level imports (only the world's own) and its exports (the world's
/// `init` and `process`; their types are checked after compiling). Nested modules and components are skipped: what they import
/// is satisfied inside the component, never by the host.
fn check_before_compiling(bytes: &[u8]) -> Result<(), ModuleError> {
    use wasmparser::{Parser, Payload};
    let malformed = |e: wasmparser::BinaryReaderError| ModuleError::NotAComponent(e.to_string());
    let mut imports = Vec::new();
    let mut exports = Vec::new();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(malformed)? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth -= 1,
            Payload::ComponentImportSection(section) if depth == 1 => {
                for import in section {
                    let import = import.map_err(malformed)?;
                    // Type imports name the types of the world's functions
                    // (checked with them after compiling), not host code.
                    if !matches!(import.ty, wasmparser::ComponentTypeRef::Type(_)) {
                        imports.push(import.name.name.to_string());
                    }
                }
            }
            Payload::ComponentExportSection(section) if depth == 1 => {
                for export in section {
                    exports.push(export.map_err(malformed)?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    let forbidden: Vec<String> = imports
        .into_iter()
        .filter(|name| !is_allowed_import(name))
        .collect();
    if !forbidden.is_empty() {
        return Err(ModuleError::ForbiddenImport(forbidden));
    }
    let missing: Vec<&str> = WORLD_EXPORTS
        .iter()
        .filter(|name| !exports.iter().any(|e| e == *name))
        .copied()
        .collect();
    match missing.is_empty() {
        true => Ok(()),
        false => Err(ModuleError::WrongWorld(format!(
            "it does not export `{}`",
            missing.join("`, `")
        ))),
    }
}

fn check_imports(engine: &Engine, component: &Component) -> Result<(), ModuleError> {
    let forbidden: Vec<String> = component
        .component_type()
        .imports(engine)
        .filter(|(name, item)| {
            !(is_allowed_import(name) && matches!(item.ty, ComponentItem::ComponentInstance(_)))
        })
        .map(|(name, _)| name.to_string())
        .collect();
    match forbidden.is_empty() {
        true => Ok(()),
        false => Err(ModuleError::ForbiddenImport(forbidden)),
    }
}

/// Names every forbidden import (the first ten), and, when some are WASI's,
/// which part of WASI a module may use.
fn forbidden_imports(names: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut listed: Vec<String> = names.iter().take(SHOWN).map(|n| format!("`{n}`")).collect();
    if names.len() > SHOWN {
        listed.push(format!("and {} more", names.len() - SHOWN));
    }
    let mut message = format!(
        "module imports {}, outside the sluice:plugin world (allowed: {} and deterministic WASI 0.2)",
        listed.join(", "),
        ALLOWED_IMPORTS.join(", ")
    );
    if names.iter().any(|n| n.starts_with("wasi:")) {
        message.push_str(&format!(
            "; of WASI 0.2, a module may import only {} (docs/languages.md)",
            ALLOWED_WASI.join(", ")
        ));
    }
    message
}

#[cfg(test)]
mod tests {
    use super::{forbidden_imports, is_allowed_import};

    #[test]
    fn every_forbidden_import_is_named_and_wasi_gets_the_allowed_list() {
        let names: Vec<String> = (0..12)
            .map(|i| format!("wasi:http/handler{i}@0.2.0"))
            .collect();
        let message = forbidden_imports(&names);
        assert!(message.contains("`wasi:http/handler0@0.2.0`"), "{message}");
        assert!(message.contains("`wasi:http/handler9@0.2.0`"), "{message}");
        assert!(message.contains("and 2 more"), "{message}");
        assert!(message.contains("wasi:clocks/wall-clock"), "{message}");

        let message = forbidden_imports(&["test:evil/net".to_string()]);
        assert!(
            message.starts_with("module imports `test:evil/net`, outside"),
            "{message}"
        );
        assert!(!message.contains("wasi:clocks"), "{message}");
    }

    #[test]
    fn only_the_deterministic_wasi_0_2_subset_is_allowed() {
        assert!(is_allowed_import("sluice:plugin/log@0.1.0"));
        assert!(is_allowed_import("wasi:clocks/wall-clock@0.2.0"));
        assert!(is_allowed_import("wasi:sockets/tcp@0.2.9"));
        assert!(!is_allowed_import("wasi:clocks/wall-clock"));
        assert!(!is_allowed_import("wasi:clocks/wall-clock@0.3.0"));
        assert!(!is_allowed_import("wasi:clocks/timezone@0.2.0"));
        assert!(!is_allowed_import("wasi:http/outgoing-handler@0.2.0"));
        assert!(!is_allowed_import("sluice:plugin/log@0.2.0"));
    }
}
