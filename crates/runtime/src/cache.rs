//! The compiled-artifact cache: a directory of `.cwasm` files keyed by
//! (sha256 of the .wasm, engine compatibility hash), written atomically,
//! read into memory, and bounded: past [`MAX_CACHE_BYTES`] the least
//! recently used artifacts are removed. Removing any file, or the whole
//! directory, is safe at any time: a missing artifact is compiled again.
//!
//! It must only ever deserialize artifacts this host compiled and wrote
//! itself: deserializing is unsafe for foreign bytes.

use super::compile;
use super::module::{ModuleError, engine_hash};
use sluice_core::limits::Limits;
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use wasmtime::Engine;
use wasmtime::component::Component;

/// The most compiled artifacts one cache directory keeps, in bytes (a
/// Python or JavaScript module compiles to ~40 MB, a Rust one to ~1 MB).
pub const MAX_CACHE_BYTES: u64 = 2 << 30;

pub(super) fn compile_cached(
    engine: &Engine,
    limits: &Limits,
    bytes: &[u8],
    digest: &str,
    cache_dir: Option<&Path>,
) -> Result<Component, ModuleError> {
    let Some(dir) = cache_dir else {
        return compile::compile(engine, limits, bytes);
    };
    let path = dir.join(format!("{digest}-{}.cwasm", engine_hash(engine)));
    // Read into memory rather than mmap the file: a cache file truncated
    // under a running host would otherwise crash it (SIGBUS).
    if let Ok(artifact) = std::fs::read(&path) {
        // SAFETY: files in the cache directory are written only by
        // `compile_cached` below, from `Component::serialize` of this same
        // engine configuration (the file name carries its compatibility
        // hash); wasmtime also checks the artifact's header on load.
        match unsafe { Component::deserialize(engine, &artifact) } {
            Ok(c) => {
                touch(&path);
                return Ok(c);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), "ignoring unusable cached module: {e:#}")
            }
        }
    }
    let component = compile::compile(engine, limits, bytes)?;
    let artifact = component
        .serialize()
        .map_err(|e| ModuleError::Engine(format!("{e:#}")))?;
    // The module is compiled: a cache that cannot be written only costs
    // the next start a compile.
    match write_atomically(dir, &path, &artifact) {
        Ok(()) => evict(dir, &path, MAX_CACHE_BYTES),
        Err(e) => tracing::warn!(path = %path.display(), "cannot cache the compiled module: {e}"),
    }
    Ok(component)
}

/// Writes `bytes` to `path` through a temporary file of its own (unique
/// per process and call, so concurrent loads of one module never share
/// one), renamed into place: readers see the whole file or none.
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Marks a cached artifact used now, for [`evict`]'s order.
fn touch(path: &Path) {
    if let Ok(file) = std::fs::File::options().append(true).open(path) {
        let _ = file.set_modified(SystemTime::now());
    }
}

/// Removes the least recently used artifacts of `dir` (oldest first, never
/// `keep`) until those left take at most `max_bytes`.
fn evict(dir: &Path, keep: &Path, max_bytes: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut artifacts: Vec<(SystemTime, u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((meta.modified().ok()?, meta.len(), e.path()))
        })
        .collect();
    let mut total: u64 = artifacts.iter().map(|(_, size, _)| size).sum();
    artifacts.sort();
    for (_, size, path) in artifacts {
        if total <= max_bytes {
            break;
        }
        if path != keep && std::fs::remove_file(&path).is_ok() {
            tracing::info!(path = %path.display(), "compile cache over {max_bytes} bytes: removed the least recently used artifact");
            total -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_least_recently_used_artifacts_go_first_and_never_the_one_in_use() {
        let dir = std::env::temp_dir().join(format!("sluice-cache-evict-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let epoch = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let artifact = |name: &str, age_s: u64| {
            let path = dir.join(format!("{name}.cwasm"));
            std::fs::write(&path, vec![0u8; 100]).unwrap();
            let file = std::fs::File::options().append(true).open(&path).unwrap();
            file.set_modified(epoch + Duration::from_secs(1_000 - age_s))
                .unwrap();
            path
        };
        let oldest = artifact("oldest", 300);
        let old = artifact("old", 200);
        let kept = artifact("kept", 400);
        let recent = artifact("recent", 100);
        std::fs::write(dir.join("other.txt"), vec![0u8; 1000]).unwrap();
        touch(&old);
        evict(&dir, &kept, 250);
        assert!(
            !oldest.exists() && !recent.exists(),
            "the least recently used two"
        );
        assert!(old.exists(), "used just now");
        assert!(kept.exists(), "the one in use, though the oldest");
        assert!(dir.join("other.txt").exists(), "only artifacts count");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
