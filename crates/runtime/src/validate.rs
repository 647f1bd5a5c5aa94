//! Validation of an uploaded component before anything is stored: the size
//! limit, that it is a component that compiles, implements the sluice world
//! and imports nothing else, and that `init` accepts the params.
//!
//! It must not store anything: a rejected module leaves no trace but the
//! error (and, for one that compiled, the host's own compiled-artifact
//! cache entry).

use crate::{LoadedModule, ModuleError, RunError, Runtime};
use std::path::Path;

/// Why an upload was refused; every message is for the user to act on.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    #[error("module is {size} bytes, over the limit of {limit} bytes (control.max_module_bytes)")]
    TooLarge { size: usize, limit: usize },
    #[error(transparent)]
    Module(#[from] ModuleError),
    #[error("params are not valid JSON: {0}")]
    ParamsNotJson(#[source] serde_json::Error),
    #[error("module's init refused the params: {0}")]
    Params(RunError),
    /// No instance could be made for the check (say, the pool is full):
    /// nothing is wrong with the module; try again.
    #[error("cannot check the module now: {0}; try again")]
    Busy(RunError),
}

/// Checks `component` and `params` as a pipeline would load them; returns
/// the compiled module.
pub fn validate(
    runtime: &Runtime,
    component: &[u8],
    params: &str,
    max_bytes: usize,
    cache_dir: Option<&Path>,
) -> Result<LoadedModule, Rejected> {
    if component.len() > max_bytes {
        return Err(Rejected::TooLarge {
            size: component.len(),
            limit: max_bytes,
        });
    }
    serde_json::from_str::<serde_json::Value>(params).map_err(Rejected::ParamsNotJson)?;
    let module = runtime.load(component, cache_dir)?;
    runtime.check_params(&module, params).map_err(|e| match e {
        RunError::Instantiate(_) => Rejected::Busy(e),
        other => Rejected::Params(other),
    })?;
    Ok(module)
}
