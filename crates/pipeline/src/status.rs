//! What a running pipeline tells the control plane: the version it runs,
//! its counters, its last committed batch and where each owned partition
//! stands (lag), its recent activity for the status page (the newest
//! batches and dead letters, batches and commit time per 10 s over the
//! last 5 minutes), and its Prometheus metrics. The pipeline publishes a
//! fresh snapshot after every batch.
//!
//! It must not be read by the batch loop: it is an outward view only.

use crate::Metrics;
use crate::batch::OffsetRange;
use serde::Serialize;
use sluice_core::batch::now_ms;
use sluice_core::source::PartitionProgress;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// How many of the newest batches and dead letters a status keeps.
pub const RECENT: usize = 20;
/// The width of one timeline bucket.
pub const BUCKET_MS: i64 = 10_000;
/// How many buckets the timeline keeps (5 minutes).
pub const BUCKETS: usize = 30;

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
    /// Set while the pipeline stalls: the version it runs failed too many
    /// records of a batch for them to be the records' fault. Nothing is
    /// prepared with that version any more; activating another one
    /// (`sluice rollback`) clears it.
    pub stalled: Option<Stall>,
    /// The newest committed batches, newest first.
    pub recent_batches: VecDeque<RecentBatch>,
    /// The newest dead letters this host committed, newest first: where
    /// the record is and its kind (the reason may carry record data: `sluice
    /// dead-letters show` has it).
    pub recent_dead_letters: VecDeque<RecentDeadLetter>,
    /// Committed batches per [`BUCKET_MS`], oldest first, the last
    /// [`BUCKETS`] of them (buckets without batches are left out).
    pub timeline: VecDeque<Bucket>,
}

/// Why and since when the pipeline stalls.
#[derive(Debug, Clone, Serialize)]
pub struct Stall {
    /// The module digest of the version at fault.
    pub module_digest: String,
    /// The batch it could not prepare, and its ranges.
    pub batch_id: String,
    pub ranges: String,
    /// The whole reason, as the log says it.
    pub reason: String,
    pub since_ms: i64,
}

/// One recently committed batch.
#[derive(Debug, Clone, Serialize)]
pub struct RecentBatch {
    pub batch_id: String,
    pub ranges: Vec<OffsetRange>,
    pub records: usize,
    pub rows: u64,
    pub dead_letters: usize,
    pub commit_ms: u64,
    pub committed_at_ms: i64,
}

/// One recent dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct RecentDeadLetter {
    pub batch_id: String,
    /// `TOPIC:PARTITION:OFFSET`.
    pub record: String,
    pub kind: String,
}

/// Batches committed in one [`BUCKET_MS`] window.
#[derive(Debug, Clone, Serialize)]
pub struct Bucket {
    /// Start of the window, ms since the epoch.
    pub start_ms: i64,
    pub batches: u64,
    pub records: u64,
    /// Sum and maximum of the batches' commit times.
    pub commit_ms_total: u64,
    pub commit_ms_max: u64,
}

impl Status {
    /// Keeps `batch` (and its dead letters) in the recent activity.
    pub fn remember(&mut self, batch: RecentBatch, dead_letters: Vec<RecentDeadLetter>) {
        let start_ms = batch.committed_at_ms - batch.committed_at_ms.rem_euclid(BUCKET_MS);
        if self.timeline.back().is_none_or(|b| b.start_ms != start_ms) {
            self.timeline.push_back(Bucket {
                start_ms,
                batches: 0,
                records: 0,
                commit_ms_total: 0,
                commit_ms_max: 0,
            });
        }
        let bucket = self.timeline.back_mut().expect("just pushed");
        bucket.batches += 1;
        bucket.records += batch.records as u64;
        bucket.commit_ms_total += batch.commit_ms;
        bucket.commit_ms_max = bucket.commit_ms_max.max(batch.commit_ms);
        let oldest = start_ms - BUCKET_MS * (BUCKETS as i64 - 1);
        while self.timeline.front().is_some_and(|b| b.start_ms < oldest) {
            self.timeline.pop_front();
        }
        self.recent_batches.push_front(batch);
        self.recent_batches.truncate(RECENT);
        // In batch order, each in front: the batch's last ends first.
        let skip = dead_letters.len().saturating_sub(RECENT);
        for d in dead_letters.into_iter().skip(skip) {
            self.recent_dead_letters.push_front(d);
        }
        self.recent_dead_letters.truncate(RECENT);
    }
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
    health: Arc<Health>,
}

/// What `/healthz` and `/readyz` read, kept apart from [`Status`] so the
/// loop's beat costs an atomic store, not the status lock.
#[derive(Debug, Default)]
struct Health {
    /// When the batch loop last came round (or a sink retry last tried),
    /// ms since the epoch; 0: not yet.
    beat_ms: std::sync::atomic::AtomicI64,
    /// Ownership was settled at least once (possibly to no partitions).
    settled: std::sync::atomic::AtomicBool,
    /// Why the sink's last try failed, while it keeps failing.
    sink_problem: Mutex<Option<String>>,
}

/// What the probes see.
#[derive(Debug, Clone)]
pub struct HealthView {
    /// When the batch loop last came round, ms since the epoch (0: never).
    pub beat_ms: i64,
    /// The consumer group (or static assignment) has settled ownership.
    pub settled: bool,
    /// Why the sink's last try failed, while it keeps failing.
    pub sink_problem: Option<String>,
}

impl StatusBoard {
    /// The board of pipeline `pipeline`, whose metrics carry its name.
    pub fn for_pipeline(pipeline: &str) -> Self {
        StatusBoard {
            status: Arc::default(),
            metrics: Metrics::new(pipeline),
            health: Arc::default(),
        }
    }

    /// The batch loop came round (or waits on the sink, retrying):
    /// `settled` if ownership has been settled.
    pub fn beat(&self, settled: bool) {
        use std::sync::atomic::Ordering;
        self.health.beat_ms.store(now_ms(), Ordering::Relaxed);
        if settled {
            self.health.settled.store(true, Ordering::Relaxed);
        }
    }

    /// The sink's last try failed (`Some(why)`), or answered (`None`).
    pub fn sink_tried(&self, problem: Option<String>) {
        *self.health.sink_problem.lock().expect("health lock") = problem;
    }

    pub fn health(&self) -> HealthView {
        use std::sync::atomic::Ordering;
        HealthView {
            beat_ms: self.health.beat_ms.load(Ordering::Relaxed),
            settled: self.health.settled.load(Ordering::Relaxed),
            sink_problem: self
                .health
                .sink_problem
                .lock()
                .expect("health lock")
                .clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(at: i64, commit_ms: u64) -> RecentBatch {
        RecentBatch {
            batch_id: format!("b{at}"),
            ranges: vec![],
            records: 10,
            rows: 10,
            dead_letters: 0,
            commit_ms,
            committed_at_ms: at,
        }
    }

    #[test]
    fn the_timeline_sums_batches_per_bucket_and_keeps_five_minutes() {
        let mut s = Status::default();
        s.remember(batch(1_000, 4), vec![]);
        s.remember(batch(9_999, 6), vec![]);
        s.remember(batch(10_000, 1), vec![]);
        assert_eq!(s.timeline.len(), 2);
        let first = &s.timeline[0];
        assert_eq!((first.start_ms, first.batches, first.records), (0, 2, 20));
        assert_eq!((first.commit_ms_total, first.commit_ms_max), (10, 6));
        s.remember(batch(10_000 + 30 * BUCKET_MS, 1), vec![]);
        assert_eq!(s.timeline.len(), 1, "older than 5 minutes: dropped");
        for i in 0..30 {
            s.remember(batch(400_000 + i, 1), vec![]);
        }
        assert_eq!(s.recent_batches.len(), RECENT);
        assert_eq!(s.recent_batches[0].batch_id, "b400029", "newest first");
    }

    #[test]
    fn recent_dead_letters_are_newest_first_and_bounded() {
        let mut s = Status::default();
        let dead = |i: usize| RecentDeadLetter {
            batch_id: "b".into(),
            record: format!("t:0:{i}"),
            kind: "rejected".into(),
        };
        s.remember(batch(0, 1), (0..5).map(dead).collect());
        s.remember(batch(1, 1), (5..50).map(dead).collect());
        assert_eq!(s.recent_dead_letters.len(), RECENT);
        assert_eq!(s.recent_dead_letters[0].record, "t:0:49");
        assert_eq!(s.recent_dead_letters[RECENT - 1].record, "t:0:30");
    }
}
