//! The control API's answers as types: the server builds them and the
//! client (the CLI) reads them, so both sides agree by the compiler, not by
//! field names written twice. `openapi.json` documents the same shapes.
//!
//! It must not hold behaviour: data only.

use serde::{Deserialize, Serialize};
use sluice_core::store::{Version, VersionSummary};

/// `POST /v1/modules`: what a deploy stored (and activated).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deployed {
    /// sha256 of the stored component, hex.
    pub module_digest: String,
    /// Its size in bytes.
    pub size: usize,
    /// How long validating it took.
    pub validate_ms: u64,
    /// The version it became, with `?activate=true`.
    pub activated: Option<Version>,
}

/// `GET /v1/versions`: the distinct versions and every activation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Versions {
    /// Each (module, params) pair the pipeline has run, with the last
    /// version number that activated it.
    pub versions: Vec<VersionSummary>,
    /// Every activation, oldest first.
    pub history: Vec<Version>,
}

/// `GET /v1/logs`: a page of the module log lines a host kept.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogsPage {
    pub lines: Vec<LogLine>,
    /// The newest line kept (0 before any).
    pub last_seq: u64,
    /// Lines after the asked-for one that are gone from the buffer.
    pub missed: u64,
}

/// One module log line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogLine {
    /// Its place among the lines the host kept, from 1.
    pub seq: u64,
    pub batch_id: String,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub level: String,
    pub message: String,
    /// When the host kept it (ms since the epoch).
    pub at_ms: i64,
}
