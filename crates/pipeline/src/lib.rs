//! The batch loop: plan -> read -> transform -> commit, until shut down.
//! While a batch commits, a blocking thread already reads, plans and
//! transforms the next one (`prepare`), so Kafka, the Wasm sandbox and the
//! database work at the same time.
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
//! Preparing ahead does not weaken this: the next batch's `from` is the
//! committing batch's `until`, which the compare-and-set checks, and a
//! prepared batch is dropped when the one before it is fenced.
//!
//! Owns commit retries, fencing and the shutdown drain (a batch already
//! prepared is committed before stopping); `prepare` owns the transform
//! retries and bisection of batches with poison records. It must
//! not talk SQL, Kafka protocol or Wasm directly: it goes through the core's
//! `Sink`, `Source`, `Transform` and `Versions` traits, and the crate
//! depends on none of sqlx, rdkafka or wasmtime (`sluice-pipeline`).

mod metrics;
mod prepare;
mod status;

pub use metrics::Metrics;
pub use prepare::{Batch, Preparer};
pub use status::{
    Bucket, LastBatch, PartitionStatus, RecentBatch, RecentDeadLetter, Stall, Status, StatusBoard,
};

use sluice_core::{batch, config};

use crate::batch::{OffsetRange, Plan, TopicPartition, describe, now_ms};
use crate::config::OnPoison;
use sluice_core::contract::OutputContract;
use sluice_core::error::Chain;
use sluice_core::sink::{Commit, CommitOutcome, Sink, SinkError};
use sluice_core::source::{PollSignals, Source, SourceError};
use sluice_core::transform::{ModuleAtFault, RunError, Transform};
use sluice_core::versions::{Swap, VersionError, Versions};
use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long to wait for a first assignment before warning about it.
const ASSIGNMENT_PATIENCE: Duration = Duration::from_secs(30);
/// How long an unreachable sink is retried before the pipeline stops.
const SINK_RETRY_FOR: Duration = Duration::from_secs(300);
/// Shortest wait between two asks for another version while stalled.
const STALL_RECHECK: Duration = Duration::from_millis(250);

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
    pub on_poison: OnPoison,
    /// Stop (successfully) once caught up with the log ends seen at start.
    /// A version at fault then stops the run with the reason instead of
    /// stalling it.
    pub until_caught_up: bool,
    /// The sink's targets every run's output must fit.
    pub contract: OutputContract,
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

pub struct Pipeline<Src: Source, S: Sink, V: Versions> {
    options: RunOptions,
    /// `None` only while the next batch is prepared during a commit.
    source: Option<Src>,
    /// What the blocking thread read and prepared during the last commit.
    ahead: Option<Ahead>,
    sink: S,
    versions: V,
    /// When the active version was last asked for.
    version_checked: Cell<Instant>,
    /// A newer version found (and loaded) while the last batch committed.
    pending_swap: Option<Swap<V::Transform>>,
    preparer: Arc<Preparer<V::Transform>>,
    /// The preparer in use, for the task that interrupts it at shutdown.
    current: tokio::sync::watch::Sender<Arc<Preparer<V::Transform>>>,
    /// The module digest of the version the pipeline stalls on (it failed
    /// too many records of a batch): nothing is prepared with it.
    stalled: Option<String>,
    picker: Arc<RangePicker>,
    stats: RunStats,
    status: StatusBoard,
    /// The token `run` was given: it also cuts a poll short, so a long
    /// `batch_interval` does not delay shutdown.
    shutdown: CancellationToken,
    /// The partitions owned when last looked: the sink is told of those
    /// that leave it.
    owned: BTreeSet<TopicPartition>,
}

/// The outcome of reading ahead during a commit: how long the poll took and
/// the next batch, if there was anything to plan.
struct Ahead {
    poll_ms: u64,
    batch: Result<Option<Batch>, PipelineError>,
}

impl<Src: Source, S: Sink, V: Versions> Pipeline<Src, S, V> {
    /// A pipeline starting with `transform` (the active version) and
    /// following `versions` from then on.
    pub fn new(
        options: RunOptions,
        source: Src,
        sink: S,
        versions: V,
        transform: V::Transform,
        status: StatusBoard,
    ) -> Self {
        let preparer = Arc::new(
            Preparer::new(options.pipeline.clone(), options.on_poison, transform)
                .with_contract(options.contract.clone()),
        );
        let picker = Arc::new(RangePicker::new(sink.one_partition_per_batch()));
        let (current, _) = tokio::sync::watch::channel(Arc::clone(&preparer));
        let pipeline = Pipeline {
            options,
            source: Some(source),
            ahead: None,
            picker,
            sink,
            versions,
            version_checked: Cell::new(Instant::now()),
            pending_swap: None,
            preparer,
            current,
            stalled: None,
            stats: RunStats::default(),
            status,
            shutdown: CancellationToken::new(),
            owned: BTreeSet::new(),
        };
        pipeline.publish_version();
        pipeline
    }

    /// Logs (once per change) and publishes that the active version cannot
    /// run here, or that it can again (`None`).
    fn report_version_problem(&self, problem: Option<String>) {
        let changed = self.status.snapshot().version_problem != problem;
        if !changed {
            return;
        }
        match &problem {
            Some(p) => tracing::error!(
                module = %self.preparer.transform().module_digest(),
                "{p}; keeping the running version (roll back, or give this host the limits it needs)"
            ),
            None => tracing::info!("the active version runs on this host again"),
        }
        self.status.update(|s| s.version_problem = problem);
    }

    /// Another version is active: a stall on the one before is over.
    fn unstall(&mut self) {
        if self.stalled.take().is_some() {
            tracing::info!("another version is active; no longer stalled");
            self.status.metrics().stalled(false);
            self.status.update(|s| s.stalled = None);
        }
    }

    /// Puts the version batches are now prepared with on the status board.
    fn publish_version(&self) {
        let transform = self.preparer.transform();
        let (module, params) = (
            transform.module_digest().to_string(),
            batch::sha256_hex(transform.params().as_bytes()),
        );
        self.status.metrics().active_module(&module, &params);
        let pipeline = self.options.pipeline.clone();
        self.status.update(|s| {
            s.pipeline = pipeline;
            s.module_digest = module;
            s.params_digest = params;
        });
    }

    /// Runs batches until `shutdown` fires (the batch in flight, and one
    /// already prepared, are committed first) or, with `until_caught_up`,
    /// until caught up.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<RunStats, PipelineError> {
        self.shutdown = shutdown.clone();
        let interrupter = self.interrupt_on(shutdown.clone());
        let result = self.run_batches(&shutdown).await;
        interrupter.abort();
        let stats = result?;
        tracing::info!(stats = ?stats, "pipeline stopped");
        Ok(stats)
    }

    /// Once `shutdown` fires, interrupts the preparer in use: a batch being
    /// transformed or isolated is abandoned at once (it was never
    /// committed); a commit in flight is not touched.
    fn interrupt_on(&self, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        let mut current = self.current.subscribe();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            current.borrow_and_update().interrupt();
        })
    }

    async fn run_batches(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<RunStats, PipelineError> {
        let started = Instant::now();
        let mut warned_unassigned = false;
        loop {
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
            let (poll_ms, prepared) = match self.ahead.take() {
                Some(ahead) => (ahead.poll_ms, self.settle_prepared(ahead.batch)?),
                None if shutdown.is_cancelled() => break,
                None if self.stalled.is_some() => (self.wait_stalled().await, None),
                None => (self.poll().await?, None),
            };
            self.start_unstarted().await?;
            self.release_lost();
            let prepared = self.follow_active_version(prepared).await?;
            let batch = match prepared {
                Some(batch) => batch,
                None if shutdown.is_cancelled() => break,
                None if self.stalled.is_some() => continue,
                None => {
                    let offered = self.source().plan_ranges();
                    let ranges = self.picker.pick(offered);
                    if ranges.is_empty() {
                        if self.options.until_caught_up && self.source().caught_up() {
                            tracing::info!("caught up with the log ends seen at start");
                            break;
                        }
                        continue;
                    }
                    // CPU-bound: keep the async workers free for signals and timers.
                    let source = self.source.as_ref().expect("source present");
                    let prepared =
                        tokio::task::block_in_place(|| self.preparer.prepare(source, ranges));
                    match self.settle_prepared(prepared.map(Some))? {
                        Some(batch) => batch,
                        None => continue,
                    }
                }
            };
            self.commit_batch(batch, poll_ms, !shutdown.is_cancelled())
                .await?;
        }
        Ok(self.stats.clone())
    }

    /// What becomes of a batch that failed to prepare for a reason that is
    /// not an error of the run: interrupted by shutdown, it is abandoned
    /// (`None`); failed by a version at fault, the pipeline stalls on that
    /// version (`None`), unless it runs `until_caught_up`.
    fn settle_prepared(
        &mut self,
        prepared: Result<Option<Batch>, PipelineError>,
    ) -> Result<Option<Batch>, PipelineError> {
        match prepared {
            Err(PipelineError::Transform {
                error: RunError::Interrupted,
                batch_id,
                ..
            }) => {
                tracing::info!(batch = %batch_id, "shutting down: abandoned the batch being prepared (nothing of it was committed)");
                Ok(None)
            }
            Err(PipelineError::Transform {
                batch_id,
                ranges,
                error: RunError::ModuleAtFault(fault),
            }) if !self.options.until_caught_up => {
                self.stall(batch_id, ranges, &fault);
                Ok(None)
            }
            other => other,
        }
    }

    /// Stops preparing batches with the version at fault and says so.
    fn stall(&mut self, batch_id: String, ranges: String, fault: &ModuleAtFault) {
        let reason = fault.to_string();
        tracing::error!(batch = %batch_id, %ranges, "{reason}; stalled until another version is activated");
        self.stalled = Some(fault.module.clone());
        self.status.metrics().stalled(true);
        let stall = Stall {
            module_digest: fault.module.clone(),
            batch_id,
            ranges,
            reason,
            since_ms: now_ms(),
        };
        self.status.update(|s| s.stalled = Some(stall));
    }

    /// While stalled: keeps the group membership for a quarter batch
    /// interval (at least [`STALL_RECHECK`]) or until shutdown, so the loop
    /// then asks for another version. Returns 0 (no poll was made).
    async fn wait_stalled(&mut self) -> u64 {
        let source = self.source.take().expect("source present");
        let shutdown = self.shutdown.clone();
        let pause = (self.options.batch_interval / 4).max(STALL_RECHECK);
        let wait = async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(pause) => {}
            }
        };
        let (source, (), (), swap) = self.on_source_watching(source, |_, _| (), wait).await;
        self.source = Some(source);
        self.pending_swap = swap.or(self.pending_swap.take());
        0
    }

    /// At a batch boundary: switches to the version found during the last
    /// commit, or (at most every quarter batch interval) asks for the
    /// active version and switches if another one was activated. A batch already
    /// prepared with the old version is prepared again from the same
    /// ranges, so every batch runs on the version active when it commits.
    async fn follow_active_version(
        &mut self,
        prepared: Option<Batch>,
    ) -> Result<Option<Batch>, PipelineError> {
        let swap = match self.pending_swap.take() {
            Some(swap) => swap,
            None if self.version_checked.get().elapsed() < self.options.batch_interval / 4 => {
                return Ok(prepared);
            }
            None => {
                self.version_checked.set(Instant::now());
                match self.versions.newer(self.preparer.transform()).await {
                    Ok(Some(swap)) => swap,
                    Ok(None) => {
                        self.report_version_problem(None);
                        return Ok(prepared);
                    }
                    Err(e @ VersionError::Unavailable(_)) => {
                        tracing::warn!("{}; keeping the running version", Chain(&e));
                        return Ok(prepared);
                    }
                    Err(e) => {
                        self.report_version_problem(Some(Chain(&e).to_string()));
                        return Ok(prepared);
                    }
                }
            }
        };
        self.report_version_problem(None);
        tracing::info!(
            version = swap.version,
            module = %swap.transform.module_digest(),
            "switching to module version at this batch boundary"
        );
        let preparer = Preparer::new(
            self.options.pipeline.clone(),
            self.options.on_poison,
            swap.transform,
        )
        .with_contract(self.options.contract.clone());
        self.preparer = Arc::new(preparer);
        self.current.send_replace(Arc::clone(&self.preparer));
        if self.shutdown.is_cancelled() {
            self.preparer.interrupt();
        }
        self.status.metrics().swapped();
        self.publish_version();
        self.unstall();
        let Some(stale) = prepared else {
            return Ok(None);
        };
        let source = self.source.as_ref().expect("source present");
        let batch =
            tokio::task::block_in_place(|| self.preparer.prepare(source, stale.plan.ranges));
        self.settle_prepared(batch.map(Some))
    }

    /// Reads from Kafka for up to one batch interval (less if another
    /// version becomes active meanwhile, or once what waits is read to the
    /// log end); returns its duration.
    async fn poll(&mut self) -> Result<u64, PipelineError> {
        let wait = self.options.batch_interval;
        let source = self.source.take().expect("source present");
        let poll = move |source: &mut Src, signals: &PollSignals| {
            let polling = Instant::now();
            let polled = source.poll(wait, signals);
            (polled, polling.elapsed().as_millis() as u64)
        };
        let (source, (polled, poll_ms), (), swap) =
            self.on_source_watching(source, poll, async {}).await;
        self.source = Some(source);
        self.pending_swap = swap.or(self.pending_swap.take());
        polled?;
        Ok(poll_ms)
    }

    /// Runs `work` on `source` on a blocking thread while `alongside` runs
    /// here and the active version is watched; a version found interrupts
    /// `work`'s poll and is returned for the next batch boundary. Once
    /// `alongside` is done nothing holds the next batch back, so `work`'s
    /// poll may cut it as soon as it has read to the log end. If `work`
    /// ends first, the thread holds the source's
    /// group membership (`Source::hold`) until `alongside` is done, so
    /// a commit retrying through a long sink outage does not get this
    /// instance thrown out of the group.
    async fn on_source_watching<R: Send + 'static, F: Future>(
        &self,
        mut source: Src,
        work: impl FnOnce(&mut Src, &PollSignals) -> R + Send + 'static,
        alongside: F,
    ) -> (Src, R, F::Output, Option<Swap<V::Transform>>) {
        let signals = Arc::new(PollSignals::new(self.options.until_caught_up));
        let work_signals = Arc::clone(&signals);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let (alongside_done, hold_until) = std::sync::mpsc::channel();
        let working = tokio::task::spawn_blocking(move || {
            let result = work(&mut source, &work_signals);
            let _ = done_tx.send(());
            source.hold(&hold_until);
            (source, result)
        });
        let alongside = async {
            let output = alongside.await;
            signals.cut_at_end();
            let _ = alongside_done.send(());
            output
        };
        let (alongside, swap) = tokio::join!(alongside, self.watch_versions(done_rx, &signals));
        let (source, result) = working.await.expect("source task");
        (source, result, alongside, swap)
    }

    /// Reads the checkpoint of every newly assigned partition and seeks there.
    async fn start_unstarted(&mut self) -> Result<(), PipelineError> {
        let fresh = self.source().unstarted();
        if fresh.is_empty() {
            return Ok(());
        }
        self.restart(&fresh).await
    }

    /// Tells the sink of the partitions this instance owned when last
    /// looked and owns no more.
    fn release_lost(&mut self) {
        let owned: BTreeSet<TopicPartition> = self.owned_partitions().into_iter().collect();
        if owned == self.owned {
            return;
        }
        let lost: Vec<TopicPartition> = self.owned.difference(&owned).cloned().collect();
        self.owned = owned;
        if !lost.is_empty() {
            self.sink.released(&lost);
        }
    }

    /// The partitions the source owns now.
    fn owned_partitions(&mut self) -> Vec<TopicPartition> {
        self.source()
            .progress()
            .into_iter()
            .map(|p| TopicPartition {
                topic: p.topic,
                partition: p.partition,
            })
            .collect()
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
                    tracing::warn!(
                        "reading checkpoints: {}; retrying in {backoff:?}",
                        Chain(&e)
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Commits `batch`; meanwhile (if `prepare_next`) a blocking thread
    /// polls the source and prepares the next batch, kept in `self.ahead`.
    ///
    /// The source is told the ranges are committed before the commit ends,
    /// so the next batch starts at their `until`. That is safe: if the commit
    /// is fenced, the prepared batch is dropped and the partitions restart
    /// from the sink's checkpoint; if it fails, the pipeline stops; and a
    /// batch planned from a wrong `from` could never pass the sink's offset
    /// compare-and-set anyway. `poll_ms` (the read that gathered this batch)
    /// only goes into the log.
    async fn commit_batch(
        &mut self,
        batch: Batch,
        poll_ms: u64,
        prepare_next: bool,
    ) -> Result<(), PipelineError> {
        self.source().committed(&batch.plan.ranges);
        let preparer = Arc::clone(&self.preparer);
        let picker = Arc::clone(&self.picker);
        let wait = self.options.batch_interval;
        let commit = Commit {
            plan: &batch.plan,
            records: &batch.records,
            output: &batch.output,
            dead_letters: &batch.dead_letters,
            output_digest: &batch.output_digest,
        };
        let committing = Instant::now();
        let source = self.source.take().expect("source present");
        let read_next = move |source: &mut Src, signals: &PollSignals| {
            prepare_next.then(|| read_ahead(source, &preparer, &picker, wait, signals))
        };
        let committed = async {
            let committed = self.commit(&commit).await;
            (committed, committing.elapsed().as_millis() as u64)
        };
        let (source, ahead, (committed, commit_ms), swap) =
            self.on_source_watching(source, read_next, committed).await;
        self.source = Some(source);
        self.ahead = ahead;
        self.pending_swap = swap.or(self.pending_swap.take());
        if committed? {
            self.account(&batch, poll_ms, commit_ms);
            return Ok(());
        }
        self.stats.fenced += 1;
        self.status.metrics().fenced();
        self.ahead = None;
        // Only partitions still owned: reading a lost one's checkpoint
        // could fence its new owner (the Kafka sink fences as it reads).
        let owned = self.owned_partitions();
        let partitions: Vec<TopicPartition> = batch
            .plan
            .ranges
            .iter()
            .map(OffsetRange::topic_partition)
            .filter(|tp| owned.contains(tp))
            .collect();
        if partitions.is_empty() {
            return Ok(());
        }
        self.restart(&partitions).await
    }

    /// While a commit and the read-ahead run: asks for the active version
    /// every quarter batch interval (once the last ask is that old) until
    /// the read-ahead is `done`; a newer version is loaded here and
    /// interrupts the read-ahead's poll, and so does shutdown.
    async fn watch_versions(
        &self,
        mut done: tokio::sync::oneshot::Receiver<()>,
        signals: &PollSignals,
    ) -> Option<Swap<V::Transform>> {
        let every = self.options.batch_interval / 4;
        let mut asked = self.version_checked.get();
        loop {
            let next = asked + every;
            let stopping = signals.interrupted();
            tokio::select! {
                _ = &mut done => return None,
                _ = self.shutdown.cancelled(), if !stopping => {
                    signals.interrupt();
                    continue;
                }
                _ = tokio::time::sleep_until(next.into()), if !stopping => {}
            }
            asked = Instant::now();
            self.version_checked.set(asked);
            match self.versions.newer(self.preparer.transform()).await {
                Ok(Some(swap)) => {
                    signals.interrupt();
                    return Some(swap);
                }
                Ok(None) => {}
                Err(e @ VersionError::Unavailable(_)) => {
                    tracing::warn!("{}; keeping the running version", Chain(&e));
                    return None;
                }
                Err(e) => {
                    self.report_version_problem(Some(Chain(&e).to_string()));
                    return None;
                }
            }
        }
    }

    /// Counts and logs a committed batch.
    fn account(&mut self, batch: &Batch, poll_ms: u64, commit_ms: u64) {
        let records = batch.records.len();
        let rows = batch.output.row_count();
        let dead_letters = batch.dead_letters.len();
        self.stats.batches += 1;
        self.stats.records += records as u64;
        self.stats.rows += rows;
        self.stats.dead_letters += dead_letters as u64;
        tracing::info!(
            batch = %batch.plan.batch_id,
            ranges = %describe(&batch.plan.ranges),
            records,
            rows,
            dead_letters,
            poll_ms,
            read_ms = batch.read_ms,
            transform_ms = batch.transform_ms,
            commit_ms,
            "batch committed"
        );
        let partitions: Vec<PartitionStatus> = self
            .source()
            .progress()
            .into_iter()
            .map(PartitionStatus::of)
            .collect();
        let metrics = self.status.metrics();
        metrics.committed(batch, commit_ms);
        metrics.partitions(&partitions);
        let stats = self.stats.clone();
        let committed_at_ms = now_ms();
        let last = LastBatch {
            batch_id: batch.plan.batch_id.clone(),
            ranges: batch.plan.ranges.clone(),
            records,
            module_digest: batch.plan.module_digest.clone(),
            committed_at_ms,
        };
        let recent = RecentBatch {
            batch_id: batch.plan.batch_id.clone(),
            ranges: batch.plan.ranges.clone(),
            records,
            rows,
            dead_letters,
            commit_ms,
            committed_at_ms,
        };
        let recent_dead = recent_dead_letters(batch);
        self.status.update(|s| {
            s.remember(recent, recent_dead);
            s.batches = stats.batches;
            s.records = stats.records;
            s.rows = stats.rows;
            s.dead_letters = stats.dead_letters;
            s.fenced = stats.fenced;
            s.last_batch = Some(last);
            s.partitions = partitions;
        });
    }

    fn source(&mut self) -> &mut Src {
        self.source
            .as_mut()
            .expect("the source is back after every commit")
    }

    /// Commits with retries. `Ok(true)`: the batch is committed (now or by an
    /// earlier attempt whose reply was lost); `Ok(false)`: fenced.
    async fn commit(&self, commit: &Commit<'_>) -> Result<bool, PipelineError> {
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
                Err(e @ SinkError::CommitUnknown { .. }) => {
                    tracing::warn!(batch = %commit.plan.batch_id, "{}; reading the checkpoint back", Chain(&e));
                    match self.resolve_unknown(commit.plan).await? {
                        Some(done) => return Ok(done),
                        None => {
                            // Nothing landed: commit again.
                            self.status.metrics().commit_retried();
                            continue;
                        }
                    }
                }
                Err(e) if e.is_retryable() && started.elapsed() < SINK_RETRY_FOR => {
                    tracing::warn!(batch = %commit.plan.batch_id, "commit failed: {}; retrying in {backoff:?}", Chain(&e));
                    self.status.metrics().commit_retried();
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

/// Polls for up to `wait` (or, once the commit is done, until read to the
/// log end), then plans and prepares the next batch from what is buffered
/// (runs on the blocking thread during a commit).
fn read_ahead<T: Transform>(
    source: &mut impl Source,
    preparer: &Preparer<T>,
    picker: &RangePicker,
    wait: Duration,
    signals: &PollSignals,
) -> Ahead {
    let polling = Instant::now();
    let polled = source.poll(wait, signals);
    let poll_ms = polling.elapsed().as_millis() as u64;
    let batch = polled.map_err(PipelineError::from).and_then(|()| {
        let ranges = picker.pick(source.plan_ranges());
        if ranges.is_empty() {
            return Ok(None);
        }
        preparer.prepare(source, ranges).map(Some)
    });
    Ahead { poll_ms, batch }
}

/// Picks the ranges of the next batch from those the source offers: all
/// of them, or, for a sink that fences owners per partition, one
/// partition's, the partitions taken in turn so none waits behind a busy
/// one.
#[derive(Debug)]
struct RangePicker {
    one_partition: bool,
    last: std::sync::Mutex<Option<TopicPartition>>,
}

impl RangePicker {
    fn new(one_partition: bool) -> RangePicker {
        RangePicker {
            one_partition,
            last: std::sync::Mutex::new(None),
        }
    }

    fn pick(&self, mut ranges: Vec<OffsetRange>) -> Vec<OffsetRange> {
        if !self.one_partition || ranges.len() <= 1 {
            return ranges;
        }
        let mut last = self.last.lock().expect("picker lock");
        let after_last = |r: &OffsetRange| last.as_ref().is_none_or(|l| r.topic_partition() > *l);
        let next = ranges.iter().position(after_last).unwrap_or(0);
        let chosen = ranges.swap_remove(next);
        *last = Some(chosen.topic_partition());
        vec![chosen]
    }
}

/// The newest [`status::RECENT`] dead letters of `batch`, in batch order.
fn recent_dead_letters(batch: &Batch) -> Vec<RecentDeadLetter> {
    let newest = &batch.dead_letters[batch.dead_letters.len().saturating_sub(status::RECENT)..];
    if newest.is_empty() {
        return Vec::new();
    }
    let records: Vec<_> = batch.records.iter().collect();
    newest
        .iter()
        .filter_map(|d| {
            let r = records.get(d.index)?;
            Some(RecentDeadLetter {
                batch_id: batch.plan.batch_id.clone(),
                record: format!("{}:{}:{}", r.topic, r.partition, r.offset),
                kind: d.kind.as_str().to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(partitions: &[i32]) -> Vec<OffsetRange> {
        partitions
            .iter()
            .map(|&partition| OffsetRange {
                topic: "t".into(),
                partition,
                from: 0,
                until: 10,
            })
            .collect()
    }

    fn picked(picker: &RangePicker, partitions: &[i32]) -> Vec<i32> {
        picker
            .pick(ranges(partitions))
            .iter()
            .map(|r| r.partition)
            .collect()
    }

    #[test]
    fn a_per_partition_sink_gets_the_partitions_in_turn() {
        let picker = RangePicker::new(true);
        assert_eq!(picked(&picker, &[0, 1, 2]), [0]);
        assert_eq!(picked(&picker, &[0, 1, 2]), [1]);
        // Partition 2 has nothing waiting: the turn wraps to 0.
        assert_eq!(picked(&picker, &[0, 1]), [0]);
        assert_eq!(picked(&picker, &[0, 1, 2]), [1]);
        assert_eq!(picked(&picker, &[0, 1, 2]), [2]);
        assert_eq!(picked(&picker, &[0, 1, 2]), [0]);
    }

    #[test]
    fn other_sinks_get_every_range() {
        assert_eq!(picked(&RangePicker::new(false), &[0, 1, 2]), [0, 1, 2]);
    }
}
