//! What a running pipeline tells the control plane: the version it runs,
//! its counters, its last committed batch and where each owned partition
//! stands (lag), and its Prometheus metrics. The pipeline publishes a fresh
//! snapshot after every batch.
//!
//! It must not be read by the batch loop: it is an outward view only.

use crate::Metrics;
use crate::batch::OffsetRange;
use serde::Serialize;
use sluice_core::source::PartitionProgress;
use std::sync::{Arc, Mutex};

/// A snapshot of one running pipeline on this host.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Status {
    pub pipeline: String,
    /// Module digest of the version batches are prepared with now.
    pub module_digest: String,
    /// Params digest of the version batches are prepared with now.
    pub params_digest: String,
    pub batches: u64,
    pub records: u64,
    pub rows: u64,
    pub dead_letters: u64,
    pub fenced: u64,
    pub last_batch: Option<LastBatch>,
    pub partitions: Vec<PartitionStatus>,
    /// Set while the store's active version cannot run on this host (say,
    /// its `init` needs more memory than this host's limits give): the
    /// host keeps the version it runs, or waits if it has none yet.
    pub version_problem: Option<String>,
}

/// The last batch this host committed.
#[derive(Debug, Clone, Serialize)]
pub struct LastBatch {
    pub batch_id: String,
    pub ranges: Vec<OffsetRange>,
    pub records: usize,
    pub module_digest: String,
    pub committed_at_ms: i64,
}

/// One owned partition.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionStatus {
    #[serde(flatten)]
    pub progress: PartitionProgress,
    /// Offsets between the checkpoint and the log end.
    pub lag: Option<i64>,
}

impl PartitionStatus {
    pub fn of(progress: PartitionProgress) -> Self {
        let lag = match (progress.next_offset, progress.log_end) {
            (Some(next), Some(end)) => Some((end - next).max(0)),
            _ => None,
        };
        PartitionStatus { progress, lag }
    }
}

/// Shared between the pipeline (writer) and the control plane (reader).
#[derive(Debug, Clone, Default)]
pub struct StatusBoard {
    status: Arc<Mutex<Status>>,
    metrics: Metrics,
}

impl StatusBoard {
    /// The board of pipeline `pipeline`, whose metrics carry its name.
    pub fn for_pipeline(pipeline: &str) -> Self {
        StatusBoard {
            status: Arc::default(),
            metrics: Metrics::new(pipeline),
        }
    }

    pub fn snapshot(&self) -> Status {
        self.status.lock().expect("status lock").clone()
    }

    pub fn update(&self, f: impl FnOnce(&mut Status)) {
        f(&mut self.status.lock().expect("status lock"))
    }

    /// The pipeline's metrics (shared: every clone of the board records
    /// into the same registry).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}
