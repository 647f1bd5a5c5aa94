//! Modules over time: the module store (components by sha256, each
//! pipeline's activations), validation of an uploaded component, and
//! following the active version between batches.
//!
//! Owns what a "version" is: a (module digest, params) pair activated for a
//! pipeline under an increasing number. Lineage rows name the module and
//! params digests a batch ran, which map back to a version here. It must not
//! serve HTTP (that is `control`) nor run batches (that is `pipeline`).

mod follow;
mod store;
#[cfg(test)]
mod tests;
mod validate;

pub use follow::StoreVersions;
pub use store::ModuleStore;
pub use validate::{Rejected, validate};

use serde::Serialize;

/// One activation of a pipeline: from `activated_at_ms` on, its batches run
/// this module with these params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Version {
    pub pipeline: String,
    /// Increasing per pipeline; a rollback appends a new number.
    pub version: i64,
    /// sha256 of the component, hex.
    pub module_digest: String,
    /// The params handed to `init`, JSON.
    pub params: String,
    /// sha256 of `params`, hex (what lineage rows record).
    pub params_digest: String,
    /// Why it was activated: `seed` (first start, from the config),
    /// `activate` or `rollback`.
    pub action: String,
    pub activated_at_ms: i64,
}

/// A distinct (module, params) pair a pipeline has run, with the last
/// version number that activated it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionSummary {
    pub version: i64,
    pub module_digest: String,
    pub params_digest: String,
    pub params: String,
    pub active: bool,
}

/// Why the module store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached: retry later.
    #[error("module store unavailable: {0}")]
    Unavailable(String),
    /// The database refused a write while another held its lock (SQLite):
    /// retry shortly.
    #[error("module store busy: {0}")]
    Busy(String),
    /// Any other database error.
    #[error("module store: {0}")]
    Database(String),
    /// Names in the sink config do not fit the database.
    #[error("module store configuration: {0}")]
    Config(String),
    #[error("no module with digest {0} in the store (upload it first)")]
    UnknownModule(String),
    #[error("pipeline `{0}` has no earlier version to roll back to")]
    NothingToRollBack(String),
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Busy(_))
    }
}
