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
//! prepared batch is dropped when the one before it is fenced. Keyed state
//! is output like rows: a batch's state writes commit in the sink's same
//! atomic unit, behind the same compare-and-set; the batch read ahead
//! starts from the committing batch's writes (`state`), which is right
//! exactly when that batch lands, and is dropped otherwise.
//!
//! Owns the order of the steps, the restart after a fence and the shutdown
//! drain (a batch already prepared is committed before stopping); `commit`
//! owns commit retries and unknown outcomes, `follow` the version policy,
//! `beside` reading while a commit runs, `state` the keyed state cache,
//! and `prepare` the transform
//! retries and bisection of batches with poison records. It must
//! not talk SQL, Kafka protocol or Wasm directly: it goes through the core's
//! `Sink`, `Source`, `Transform` and `Versions` traits, and the crate
//! depends on none of sqlx, rdkafka or wasmtime (`sluice-pipeline`).

mod beside;
mod commit;
mod follow;
mod metrics;
mod picker;
mod prepare;
mod state;
mod status;
mod timer_index;

pub use metrics::Metrics;
pub use prepare::{Batch, Preparer};
pub use status::{
    Bucket, LastBatch, PartitionStatus, RecentBatch, RecentDeadLetter, Stall, Status, StatusBoard,
};

use sluice_core::{batch, config};

use crate::batch::{TopicPartition, describe, now_ms};
use crate::config::OnPoison;
use commit::Landing;
use picker::RangePicker;
use sluice_core::contract::OutputContract;
use sluice_core::sink::{Commit, Sink, SinkError};
use sluice_core::source::{PollSignals, Source, SourceError};
use sluice_core::state::{StateBase, StateError};
use sluice_core::transform::{ModuleAtFault, RunError, Transform};
use sluice_core::versions::{Swap, Versions};
use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long to wait for a first assignment before warning about it.
const ASSIGNMENT_PATIENCE: Duration = Duration::from_secs(30);
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
    /// Keyed state the batch cannot commit with: a partition over its
    /// limit, or the state store unreachable while checking it.
    #[error(transparent)]
    State(#[from] StateError),
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
    /// Keyed state since the process started (zero for a stateless module).
    pub state: StateStats,
}

/// What keyed state cost a run: how many keys its batches read and wrote,
/// and how many of the reads the cache could not answer.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct StateStats {
    /// Distinct keys each committed batch read, summed over batches.
    pub keys_read: u64,
    /// Keys committed batches changed (each key once per batch).
    pub keys_written: u64,
    /// Expired keys committed batches removed (besides their modules'
    /// changes).
    pub keys_expired: u64,
    /// Reads of one key from the sink (the cache did not hold it).
    pub sink_key_reads: u64,
    /// Loads of a partition's whole state from the sink into the cache.
    pub partitions_loaded: u64,
    /// Reads of a batch's record keys in one round trip (a partition
    /// larger than the cache), before the batch runs.
    pub record_key_reads: u64,
    /// Time spent in those reads, in seconds.
    pub sink_read_seconds: f64,
}

impl StateStats {
    /// The share of keys read that the cache answered without reading the
    /// key from the sink (1.0 when no key was read).
    pub fn cache_hit_ratio(&self) -> f64 {
        match self.keys_read {
            0 => 1.0,
            read => 1.0 - self.sink_key_reads.min(read) as f64 / read as f64,
        }
    }
}

pub struct Pipeline<Src: Source, S: Sink, V: Versions> {
    source: Src,
    /// Everything else a step uses while the source reads beside it.
    parts: Parts<S, V>,
    /// The module digest of the version the pipeline stalls on (it failed
    /// too many records of a batch): nothing is prepared with it.
    stalled: Option<String>,
    stats: RunStats,
    /// The partitions owned when last looked: the sink is told of those
    /// that leave it.
    owned: BTreeSet<TopicPartition>,
}

/// What a commit and the version watch use while the source reads on a
/// thread of its own (see `beside`).
pub(crate) struct Parts<S: Sink, V: Versions> {
    options: RunOptions,
    sink: S,
    versions: V,
    /// When the active version was last asked for.
    version_checked: Cell<Instant>,
    preparer: Arc<Preparer<V::Transform>>,
    /// The preparer in use, for the task that interrupts it at shutdown.
    current: tokio::sync::watch::Sender<Arc<Preparer<V::Transform>>>,
    picker: RangePicker,
    status: StatusBoard,
    /// The token `run` was given: it also cuts a poll short, so a long
    /// `batch_interval` does not delay shutdown.
    shutdown: CancellationToken,
    /// Where the source's blocking work runs beside a commit or a wait.
    source_thread: beside::SourceThread,
    /// The owned partitions' keyed state, for the module's runs.
    state: Arc<state::KeptState>,
}

/// What the source gave a step of the loop: how long its poll took (for
/// the log), a batch the read-ahead already prepared, and a newer version
/// found meanwhile.
struct Read<T> {
    poll_ms: u64,
    prepared: Option<Batch>,
    swap: Option<Swap<T>>,
}

/// What a commit leaves for the next step: what the source read (and
/// prepared) meanwhile, if it read ahead, and a newer version found
/// meanwhile.
struct AfterCommit<T> {
    ahead: Option<Ahead>,
    swap: Option<Swap<T>>,
}

impl<T> Default for AfterCommit<T> {
    fn default() -> Self {
        AfterCommit {
            ahead: None,
            swap: None,
        }
    }
}

/// The outcome of reading ahead during a commit: how long the poll took and
/// the next batch, if there was anything to plan.
struct Ahead {
    poll_ms: u64,
    batch: Result<Option<Batch>, PipelineError>,
}

/// What planning from what the source has read gave.
enum Planned {
    Batch(Box<Batch>),
    /// Nothing to commit this time round.
    Nothing,
    /// Running `until_caught_up`, and caught up: the run is over.
    CaughtUp,
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
        let picker = RangePicker::new(sink.one_partition_per_batch());
        let (current, _) = tokio::sync::watch::channel(Arc::clone(&preparer));
        let state = state::KeptState::new(
            &options.pipeline,
            sink.state_store(),
            preparer.transform().limits().state_cache_bytes,
            preparer.transform().limits().max_state_partition_bytes,
            status.metrics().clone(),
        );
        let parts = Parts {
            options,
            sink,
            versions,
            version_checked: Cell::new(Instant::now()),
            preparer,
            current,
            picker,
            status,
            shutdown: CancellationToken::new(),
            source_thread: beside::SourceThread::new(),
            state,
        };
        parts.publish_version();
        Pipeline {
            source,
            parts,
            stalled: None,
            stats: RunStats::default(),
            owned: BTreeSet::new(),
        }
    }

    /// Runs batches until `shutdown` fires (the batch in flight, and one
    /// already prepared, are committed first) or, with `until_caught_up`,
    /// until caught up.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<RunStats, PipelineError> {
        self.parts.shutdown = shutdown.clone();
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
        let mut current = self.parts.current.subscribe();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            current.borrow_and_update().interrupt();
        })
    }

    /// The loop: read (or take what was read during the last commit),
    /// start new partitions, follow the active version, plan and prepare,
    /// commit while reading ahead.
    async fn run_batches(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<RunStats, PipelineError> {
        let started = Instant::now();
        let mut warned_unassigned = false;
        let mut after = AfterCommit::default();
        loop {
            self.parts.status.beat(self.source.assigned_once());
            if !warned_unassigned {
                warned_unassigned = self.warn_if_unassigned(started);
            }
            let read = match after.ahead.take() {
                Some(ahead) => Read {
                    poll_ms: ahead.poll_ms,
                    prepared: self.settle_prepared(ahead.batch)?,
                    swap: None,
                },
                None if shutdown.is_cancelled() => break,
                None if self.stalled.is_some() => self.wait_stalled(),
                None => self.poll()?,
            };
            self.start_unstarted().await?;
            self.release_lost();
            let found = read.swap.or(after.swap.take());
            let prepared = self.follow_active_version(found, read.prepared).await?;
            let batch = match prepared {
                Some(batch) => batch,
                None if shutdown.is_cancelled() => break,
                None if self.stalled.is_some() => continue,
                None => match self.plan_and_prepare()? {
                    Planned::Batch(batch) => *batch,
                    Planned::Nothing => continue,
                    Planned::CaughtUp => break,
                },
            };
            after = self
                .commit_batch(batch, read.poll_ms, !shutdown.is_cancelled())
                .await?;
        }
        let mut stats = self.stats.clone();
        stats.state = self.parts.status.metrics().state_stats();
        Ok(stats)
    }

    /// Warns, and says so, if the consumer group has assigned nothing for
    /// [`ASSIGNMENT_PATIENCE`] since `started`.
    fn warn_if_unassigned(&self, started: Instant) -> bool {
        let waited = !self.source.assigned_once() && started.elapsed() > ASSIGNMENT_PATIENCE;
        if waited {
            tracing::warn!(
                "no partitions assigned by the consumer group after {ASSIGNMENT_PATIENCE:?}; \
                 still waiting (is the group coordinator healthy?)"
            );
        }
        waited
    }

    /// Plans the next batch from what the source has read and prepares it
    /// (CPU-bound: the async workers stay free for signals and timers).
    fn plan_and_prepare(&mut self) -> Result<Planned, PipelineError> {
        let ranges = self.parts.picker.pick(self.source.plan_ranges());
        if ranges.is_empty() {
            if self.parts.options.until_caught_up && self.source.caught_up() {
                tracing::info!("caught up with the log ends seen at start");
                return Ok(Planned::CaughtUp);
            }
            return Ok(Planned::Nothing);
        }
        let preparer = &self.parts.preparer;
        let state = self.parts.state.base();
        let prepared =
            tokio::task::block_in_place(|| preparer.prepare(&self.source, ranges, state));
        Ok(match self.settle_prepared(prepared.map(Some))? {
            Some(batch) => Planned::Batch(Box::new(batch)),
            None => Planned::Nothing,
        })
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
            }) if !self.parts.options.until_caught_up => {
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
        self.parts.status.metrics().stalled(true);
        let stall = Stall {
            module_digest: fault.module.clone(),
            batch_id,
            ranges,
            reason,
            since_ms: now_ms(),
        };
        self.parts.status.update(|s| s.stalled = Some(stall));
    }

    /// Another version is active: a stall on the one before is over.
    fn unstall(&mut self) {
        if self.stalled.take().is_some() {
            tracing::info!("another version is active; no longer stalled");
            self.parts.status.metrics().stalled(false);
            self.parts.status.update(|s| s.stalled = None);
        }
    }

    /// While stalled: keeps the group membership for a quarter batch
    /// interval (at least [`STALL_RECHECK`]) or until shutdown, so the loop
    /// then asks for another version. Nothing is polled.
    fn wait_stalled(&mut self) -> Read<V::Transform> {
        let shutdown = self.parts.shutdown.clone();
        let pause = (self.parts.options.batch_interval / 4).max(STALL_RECHECK);
        let wait = async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(pause) => {}
            }
        };
        let beside = self.parts.beside(&mut self.source, |_, _| (), wait);
        Read {
            poll_ms: 0,
            prepared: None,
            swap: beside.swap,
        }
    }

    /// Reads from Kafka for up to one batch interval (less if another
    /// version becomes active meanwhile, or once what waits is read to the
    /// log end).
    fn poll(&mut self) -> Result<Read<V::Transform>, PipelineError> {
        let wait = self.parts.options.batch_interval;
        let poll = move |source: &mut Src, signals: &PollSignals| {
            let polling = Instant::now();
            let polled = source.poll(wait, signals);
            (polled, polling.elapsed().as_millis() as u64)
        };
        let beside = self.parts.beside(&mut self.source, poll, async {});
        let (polled, poll_ms) = beside.read;
        polled?;
        Ok(Read {
            poll_ms,
            prepared: None,
            swap: beside.swap,
        })
    }

    /// Reads the checkpoint of every newly assigned partition and seeks there.
    async fn start_unstarted(&mut self) -> Result<(), PipelineError> {
        let fresh = self.source.unstarted();
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
            self.parts.state.forget(&lost);
            self.parts.sink.released(&lost);
        }
    }

    /// The partitions the source owns now.
    fn owned_partitions(&self) -> Vec<TopicPartition> {
        self.source
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
        self.parts.state.forget(partitions);
        let checkpoints = self.parts.checkpoints(partitions).await?;
        let starts: Vec<_> = partitions
            .iter()
            .map(|tp| (tp.clone(), checkpoints.get(tp).copied()))
            .collect();
        tokio::task::block_in_place(|| self.source.start_partitions(&starts))?;
        Ok(())
    }

    /// Commits `batch`; meanwhile (if `prepare_next`) the source polls and
    /// prepares the next batch beside it, handed back for the next step.
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
    ) -> Result<AfterCommit<V::Transform>, PipelineError> {
        self.source.committed(&batch.plan.ranges);
        let commit = Commit {
            plan: &batch.plan,
            records: &batch.records,
            output: &batch.output,
            dead_letters: &batch.dead_letters,
            output_digest: &batch.output_digest,
            state_reads: &batch.state_reads,
        };
        let parts = &self.parts;
        parts
            .state
            .committing(&batch.plan.batch_id, &batch.output.state)
            .await?;
        let (preparer, picker) = (&*parts.preparer, &parts.picker);
        let wait = parts.options.batch_interval;
        let state = parts.state.base();
        let read_next = move |source: &mut Src, signals: &PollSignals| {
            prepare_next.then(|| read_ahead(source, preparer, picker, wait, signals, state))
        };
        let committing = Instant::now();
        let committed = async {
            let landing = parts.commit(&commit).await;
            (landing, committing.elapsed().as_millis() as u64)
        };
        let beside = parts.beside(&mut self.source, read_next, committed);
        let (landing, commit_ms) = beside.alongside;
        match landing? {
            Landing::Landed => {
                self.parts.state.landed(&batch.plan.batch_id);
                self.account(&batch, poll_ms, commit_ms);
                Ok(AfterCommit {
                    ahead: beside.read,
                    swap: beside.swap,
                })
            }
            Landing::Fenced => {
                self.parts
                    .state
                    .abandoned(&batch.plan.batch_id, &batch.plan.partitions());
                self.restart_fenced(&batch).await?;
                Ok(AfterCommit {
                    ahead: None,
                    swap: beside.swap,
                })
            }
            Landing::Abandoned => {
                self.parts
                    .state
                    .abandoned(&batch.plan.batch_id, &batch.plan.partitions());
                Ok(AfterCommit::default())
            }
        }
    }

    /// After `batch` was fenced: counts it, and restarts its partitions
    /// still owned from their checkpoints (what was read ahead is dropped).
    async fn restart_fenced(&mut self, batch: &Batch) -> Result<(), PipelineError> {
        self.stats.fenced += 1;
        self.parts.status.metrics().fenced();
        // Only partitions still owned: reading a lost one's checkpoint
        // could fence its new owner (the Kafka sink fences as it reads).
        let owned = self.owned_partitions();
        let partitions: Vec<TopicPartition> = (batch.plan.partitions().into_iter())
            .filter(|tp| owned.contains(tp))
            .collect();
        if partitions.is_empty() {
            return Ok(());
        }
        self.restart(&partitions).await
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
            .source
            .progress()
            .into_iter()
            .map(PartitionStatus::of)
            .collect();
        let metrics = self.parts.status.metrics();
        // Checkpoints first: a scrape that sees the batch's records counted
        // sees the checkpoints it moved too.
        metrics.partitions(&partitions);
        metrics.committed(batch, commit_ms);
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
        self.parts.status.update(|s| {
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
}

/// Polls for up to `wait` (or, once the commit is done, until read to the
/// log end), then plans and prepares the next batch from what is buffered
/// (runs beside a commit).
fn read_ahead<T: Transform>(
    source: &mut impl Source,
    preparer: &Preparer<T>,
    picker: &RangePicker,
    wait: Duration,
    signals: &PollSignals,
    state: Arc<dyn StateBase>,
) -> Ahead {
    let polling = Instant::now();
    let polled = source.poll(wait, signals);
    let poll_ms = polling.elapsed().as_millis() as u64;
    let batch = polled.map_err(PipelineError::from).and_then(|()| {
        let ranges = picker.pick(source.plan_ranges());
        if ranges.is_empty() {
            return Ok(None);
        }
        preparer.prepare(source, ranges, state).map(Some)
    });
    Ahead { poll_ms, batch }
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
