//! The batch loop: plan -> read -> transform -> commit, until shut down;
//! while a batch commits, the source already reads the next one (on a
//! blocking thread), so Kafka and the database work at the same time.
//!
//! # Delivery guarantee
//!
//! Exactly-once into the sink, given the three conditions: the source replays
//! a range `[from, until)` identically (Kafka, `read_committed`; the host, not
//! the consumer group, picks the ranges), the transform is deterministic (a
//! fresh sandboxed instance per batch, time and seed from the plan), and the
//! sink commits outputs together with a compare-and-set of the offsets. A
//! fenced commit (another owner moved the offsets) is rolled back and the
//! partitions re-read from the checkpoint; a commit whose outcome is unknown
//! is resolved by reading the checkpoint back, never by writing again.
//! Reading ahead does not weaken this: the next batch's `from` is the
//! committing batch's `until`, which the compare-and-set checks.
//!
//! Owns retry, bisection of trapping batches and the shutdown drain. It must
//! not talk SQL, Kafka protocol or Wasm directly: it goes through `Sink`,
//! `KafkaSource` and `Transform`.

use crate::batch::{OffsetRange, Plan, Records, TopicPartition, sha256_hex};
use crate::config::OnTrap;
use crate::output::Output;
use crate::runtime::RunError;
use crate::sink::{Commit, CommitOutcome, DeadLetter, DeadLetterKind, SinkError};
use crate::source::{KafkaSource, SourceError};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Times a retryable transform failure (timeout, retryable declared error)
/// is retried before the pipeline stops.
const TRANSFORM_RETRIES: u32 = 3;
/// How long to wait for a first assignment before warning about it.
const ASSIGNMENT_PATIENCE: Duration = Duration::from_secs(30);
/// How long an unreachable sink is retried before the pipeline stops.
const SINK_RETRY_FOR: Duration = Duration::from_secs(300);

/// The transform the pipeline runs; implemented by the Wasm runtime.
pub trait Transform {
    /// Module version recorded in plans and lineage.
    fn module_digest(&self) -> &str;
    /// The parameters as `init` receives them.
    fn params(&self) -> &str;
    /// Runs one whole batch in a fresh instance.
    fn run(&self, plan: &Plan, records: &Records) -> Result<Output, RunError>;
}

/// Where batches are committed; implemented by each sink backend.
#[allow(async_fn_in_trait)]
pub trait Sink {
    /// Stored next offsets of `partitions`; absent = never committed.
    async fn checkpoints(
        &self,
        pipeline: &str,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError>;
    /// Commits one batch atomically with the offset compare-and-set.
    async fn commit(&self, commit: &Commit<'_>) -> Result<CommitOutcome, SinkError>;
}

/// Why the pipeline stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("batch {batch_id} ({ranges}): {error}")]
    Transform {
        batch_id: String,
        ranges: String,
        error: RunError,
    },
}

/// How the loop runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub pipeline: String,
    pub batch_interval: Duration,
    pub on_trap: OnTrap,
    /// Stop (successfully) once caught up with the log ends seen at start.
    pub until_caught_up: bool,
}

/// Counters for the caller (and the end-of-run log line).
#[derive(Debug, Default, Clone)]
pub struct RunStats {
    pub batches: u64,
    pub records: u64,
    pub rows: u64,
    pub dead_letters: u64,
    pub fenced: u64,
}

pub struct Pipeline<S: Sink, T: Transform> {
    options: RunOptions,
    /// `None` only while a poll runs on a blocking thread during a commit.
    source: Option<KafkaSource>,
    /// The last commit already polled for the next batch (see `commit_and_poll`).
    polled_ahead: Option<u64>,
    sink: S,
    transform: T,
    params_digest: String,
    stats: RunStats,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn describe(ranges: &[OffsetRange]) -> String {
    ranges
        .iter()
        .map(|r| format!("{}[{}] {}..{}", r.topic, r.partition, r.from, r.until))
        .collect::<Vec<_>>()
        .join(", ")
}

impl<S: Sink, T: Transform> Pipeline<S, T> {
    pub fn new(options: RunOptions, source: KafkaSource, sink: S, transform: T) -> Self {
        let params_digest = sha256_hex(transform.params().as_bytes());
        Pipeline {
            options,
            source: Some(source),
            polled_ahead: None,
            sink,
            transform,
            params_digest,
            stats: RunStats::default(),
        }
    }

    /// Runs batches until `shutdown` fires (the batch in flight is finished
    /// first) or, with `until_caught_up`, until caught up.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<RunStats, PipelineError> {
        let started = Instant::now();
        let mut warned_unassigned = false;
        while !shutdown.is_cancelled() {
            if !warned_unassigned
                && !self.source().assigned_once()
                && started.elapsed() > ASSIGNMENT_PATIENCE
            {
                warned_unassigned = true;
                tracing::warn!(
                    "no partitions assigned by the consumer group after {ASSIGNMENT_PATIENCE:?}; \
                     still waiting (is the group coordinator healthy?)"
                );
            }
            let poll_ms = match self.polled_ahead.take() {
                Some(ms) => ms,
                None => {
                    let wait = self.options.batch_interval;
                    let polling = Instant::now();
                    tokio::task::block_in_place(|| self.source().poll(wait))?;
                    polling.elapsed().as_millis() as u64
                }
            };
            self.start_unstarted().await?;
            let ranges = self.source().plan_ranges();
            if ranges.is_empty() {
                if self.options.until_caught_up && self.source().caught_up() {
                    tracing::info!("caught up with the log ends seen at start");
                    break;
                }
                continue;
            }
            self.run_batch(ranges, poll_ms).await?;
        }
        tracing::info!(stats = ?self.stats, "pipeline stopped");
        Ok(self.stats)
    }

    /// Reads the checkpoint of every newly assigned partition and seeks there.
    async fn start_unstarted(&mut self) -> Result<(), PipelineError> {
        let fresh = self.source().unstarted();
        if fresh.is_empty() {
            return Ok(());
        }
        self.restart(&fresh).await
    }

    /// Re-reads checkpoints of `partitions` and restarts reading there.
    async fn restart(&mut self, partitions: &[TopicPartition]) -> Result<(), PipelineError> {
        let checkpoints = self.checkpoints_with_retry(partitions).await?;
        let starts: Vec<_> = partitions
            .iter()
            .map(|tp| (tp.clone(), checkpoints.get(tp).copied()))
            .collect();
        tokio::task::block_in_place(|| self.source().start_partitions(&starts))?;
        Ok(())
    }

    async fn checkpoints_with_retry(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, PipelineError> {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(100);
        loop {
            match self
                .sink
                .checkpoints(&self.options.pipeline, partitions)
                .await
            {
                Ok(c) => return Ok(c),
                Err(e) if e.is_retryable() && started.elapsed() < SINK_RETRY_FOR => {
                    tracing::warn!("reading checkpoints: {e}; retrying in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Plans, transforms and commits one batch (reading the next meanwhile);
    /// `poll_ms` (the read that gathered this batch) only goes into the log.
    async fn run_batch(
        &mut self,
        ranges: Vec<OffsetRange>,
        poll_ms: u64,
    ) -> Result<(), PipelineError> {
        let started = Instant::now();
        let plan = Plan::new(
            &self.options.pipeline,
            ranges,
            self.transform.module_digest(),
            &self.params_digest,
            now_ms(),
        );
        let records = self.source().records(&plan.ranges);
        let read_ms = started.elapsed().as_millis() as u64;
        // CPU-bound: keep the async workers free for signals and timers.
        let (output, dead_letters) =
            tokio::task::block_in_place(|| self.transform_batch(&plan, &records))?;
        let digest = output.digest();
        let commit = Commit {
            plan: &plan,
            records: &records,
            output: &output,
            dead_letters: &dead_letters,
            output_digest: &digest,
        };
        let (committed, polled, commit_ms) = self.commit_and_poll(&commit).await?;
        if committed {
            self.stats.batches += 1;
            self.stats.records += records.len() as u64;
            self.stats.rows += output.row_count();
            self.stats.dead_letters += dead_letters.len() as u64;
            tracing::info!(
                batch = %plan.batch_id,
                ranges = %describe(&plan.ranges),
                records = records.len(),
                rows = output.row_count(),
                dead_letters = dead_letters.len(),
                ms = started.elapsed().as_millis() as u64,
                poll_ms,
                read_ms,
                commit_ms,
                "batch committed"
            );
        } else {
            self.stats.fenced += 1;
            let partitions: Vec<TopicPartition> = plan
                .ranges
                .iter()
                .map(OffsetRange::topic_partition)
                .collect();
            self.restart(&partitions).await?;
        }
        Ok(polled?)
    }

    fn source(&mut self) -> &mut KafkaSource {
        self.source
            .as_mut()
            .expect("the source is back after every commit")
    }

    /// Commits `commit` while the source polls for the next batch on a
    /// blocking thread, so reading overlaps the database's work.
    ///
    /// The source is told the ranges are committed before the commit ends,
    /// so it gathers the next batch from their `until`. That is safe: if the
    /// commit is fenced, the partitions are restarted from the sink's
    /// checkpoint (dropping what was read ahead); if it fails, the pipeline
    /// stops; and a batch planned from a wrong `from` could never pass the
    /// sink's offset compare-and-set anyway.
    ///
    /// Returns whether the batch committed, the poll's own result (to be
    /// raised after the batch is accounted for) and the commit's duration.
    async fn commit_and_poll(
        &mut self,
        commit: &Commit<'_>,
    ) -> Result<(bool, Result<(), SourceError>, u64), PipelineError> {
        let mut source = self.source.take().expect("source present");
        source.committed(&commit.plan.ranges);
        let wait = self.options.batch_interval;
        let polling = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let polled = source.poll(wait);
            (source, polled, started.elapsed().as_millis() as u64)
        });
        let committing = Instant::now();
        let committed = self.commit(commit).await;
        let commit_ms = committing.elapsed().as_millis() as u64;
        let (source, polled, poll_ms) = polling.await.expect("poll task");
        self.source = Some(source);
        self.polled_ahead = Some(poll_ms);
        Ok((committed?, polled, commit_ms))
    }

    /// Runs the transform with the retry and trap policy; returns the output
    /// and the dead letters (rejections and isolated poison records).
    fn transform_batch(
        &self,
        plan: &Plan,
        records: &Records,
    ) -> Result<(Output, Vec<DeadLetter>), PipelineError> {
        let fail = |error| PipelineError::Transform {
            batch_id: plan.batch_id.clone(),
            ranges: describe(&plan.ranges),
            error,
        };
        let mut attempt = 0;
        let mut trapped_once = false;
        let (output, mut dead) = loop {
            attempt += 1;
            match self.transform.run(plan, records) {
                Ok(output) => break (output, Vec::new()),
                Err(e) if e.is_retryable() && attempt <= TRANSFORM_RETRIES => {
                    tracing::warn!(batch = %plan.batch_id, "{e}; retrying");
                }
                Err(RunError::Trap(msg)) if !trapped_once => {
                    tracing::warn!(batch = %plan.batch_id, "transform trapped, retrying once: {msg}");
                    trapped_once = true;
                }
                Err(RunError::Trap(_)) if self.options.on_trap == OnTrap::DeadLetter => {
                    tracing::warn!(batch = %plan.batch_id, "transform trapped twice; bisecting");
                    let mut output = Output::default();
                    let mut dead = Vec::new();
                    let all: Vec<usize> = (0..records.len()).collect();
                    self.bisect(plan, records, all, &mut output, &mut dead)
                        .map_err(fail)?;
                    break (output, dead);
                }
                Err(e) => return Err(fail(e)),
            }
        };
        dead.extend(output.rejections.iter().map(|r| DeadLetter {
            index: r.index as usize,
            reason: r.reason.clone(),
            kind: DeadLetterKind::Rejected,
        }));
        // One dead letter per record (a module may reject a record twice).
        dead.sort_by_key(|d| d.index);
        dead.dedup_by_key(|d| d.index);
        Ok((output, dead))
    }

    /// Runs the records at `indices` as a sub-batch; on a trap splits it in
    /// halves until single poison records are left, which become dead letters.
    fn bisect(
        &self,
        plan: &Plan,
        records: &Records,
        indices: Vec<usize>,
        output: &mut Output,
        dead: &mut Vec<DeadLetter>,
    ) -> Result<(), RunError> {
        let (sub, map) = records.select(&indices);
        match self.transform.run(plan, &sub) {
            Ok(o) => {
                output.absorb(o, &map);
                Ok(())
            }
            Err(RunError::Trap(msg)) if indices.len() == 1 => {
                dead.push(DeadLetter {
                    index: indices[0],
                    reason: msg,
                    kind: DeadLetterKind::Trap,
                });
                Ok(())
            }
            Err(RunError::Trap(_)) => {
                let mut left = indices;
                let right = left.split_off(left.len() / 2);
                self.bisect(plan, records, left, output, dead)?;
                self.bisect(plan, records, right, output, dead)
            }
            Err(e) => Err(e),
        }
    }

    /// Commits with retries. `Ok(true)`: the batch is committed (now or by an
    /// earlier attempt whose reply was lost); `Ok(false)`: fenced.
    async fn commit(&mut self, commit: &Commit<'_>) -> Result<bool, PipelineError> {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(100);
        loop {
            let result = self.sink.commit(commit).await;
            match result {
                Ok(CommitOutcome::Committed) => return Ok(true),
                Ok(CommitOutcome::Fenced {
                    partition,
                    expected,
                    found,
                }) => {
                    tracing::warn!(
                        batch = %commit.plan.batch_id,
                        %partition, expected, ?found,
                        "fenced: another owner moved the offsets first; rolled back, re-planning"
                    );
                    return Ok(false);
                }
                Err(SinkError::CommitUnknown(e)) => {
                    tracing::warn!(batch = %commit.plan.batch_id, "commit outcome unknown ({e}); reading the checkpoint back");
                    match self.resolve_unknown(commit.plan).await? {
                        Some(done) => return Ok(done),
                        None => continue, // nothing landed: commit again
                    }
                }
                Err(e) if e.is_retryable() && started.elapsed() < SINK_RETRY_FOR => {
                    tracing::warn!(batch = %commit.plan.batch_id, "commit failed: {e}; retrying in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// After a commit with unknown outcome: `Some(true)` if the checkpoint
    /// already says `until` everywhere (it landed), `None` if it still says
    /// `from` everywhere (nothing landed), `Some(false)` otherwise (someone
    /// else moved it: treat as fenced).
    async fn resolve_unknown(&self, plan: &Plan) -> Result<Option<bool>, PipelineError> {
        let partitions: Vec<TopicPartition> = plan
            .ranges
            .iter()
            .map(OffsetRange::topic_partition)
            .collect();
        let stored = self.checkpoints_with_retry(&partitions).await?;
        let at = |r: &OffsetRange| stored.get(&r.topic_partition()).copied();
        if plan.ranges.iter().all(|r| at(r) == Some(r.until)) {
            tracing::info!(batch = %plan.batch_id, "commit had landed");
            return Ok(Some(true));
        }
        if plan
            .ranges
            .iter()
            .all(|r| at(r).is_none_or(|o| o == r.from))
        {
            return Ok(None);
        }
        Ok(Some(false))
    }
}
