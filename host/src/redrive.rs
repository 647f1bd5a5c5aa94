//! Redriving dead letters: `sluice dead-letters redrive` runs stored dead
//! letters through the pipeline's active version (the one `deploy
//! --activate` made current, typically a fixed module) and commits what
//! they give now in the sink, together with their removal.
//!
//! Owns grouping the dead letters into redrive batches (one per batch that
//! stored them), their plans and ids, and what to do when a commit fails.
//! The commit itself is the sink's (`Redrive`); it must not write outside
//! it, and it never moves an offset.
//!
//! # Delivery guarantee
//!
//! Exactly-once per dead letter: each redrive batch is one sink
//! transaction that deletes the dead letters it ran (all must still be
//! stored, or nothing is written) with the rows, the new dead letters of
//! records that fail again and a lineage row. A crash before the commit
//! leaves them stored for the next redrive; after it they are gone. A
//! commit whose outcome is unknown is settled by reading the dead letters
//! back (all gone: it landed; all there: run again), never by writing
//! blindly. It depends on the sink's atomic commit and on the module being
//! deterministic only as far as any batch does: a redrive is a new batch,
//! run with the version active now.

use crate::backends::WithRedriveSink;
use crate::batch::{OffsetRange, OwnedRecord, Plan, Records, now_ms, sha256_hex};
use crate::config::PipelineConfig;
use crate::pipeline::{Batch, PipelineError, Preparer};
use crate::runtime::{Limits, ModuleError, RunError, Runtime, WasmTransform};
use crate::sink::{Commit, Sink, SinkError};
use sluice_core::backoff::{GiveUp, RetryPolicy};
use sluice_core::dead_letters::{
    DeadLetterFilter, REDRIVE_PREFIX, Redrive, RedriveOutcome, StoredDeadLetter,
};
use sluice_core::state::NoState;
use sluice_core::store::{StoreError, Version};
use sluice_core::transform::Transform;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How a redrive's commit is retried while the sink is unreachable: 5
/// tries, 0.5 s apart at first, doubling up to 2 s.
const COMMIT_RETRY: RetryPolicy = RetryPolicy {
    first: Duration::from_millis(500),
    max: Duration::from_secs(2),
    give_up: GiveUp::AfterTries(5),
};

/// Why a redrive (or a listing) could not be done.
#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("pipeline `{0}` has no active version: run it once, or deploy and activate one")]
    NoActiveVersion(String),
    #[error("active module {digest}")]
    Module {
        digest: String,
        #[source]
        source: ModuleError,
    },
    #[error("active module {digest}: init")]
    Init {
        digest: String,
        #[source]
        source: RunError,
    },
    /// The active version failed the whole batch (not one record): nothing
    /// of it was committed.
    #[error("redriving the dead letters of batch {batch_id}")]
    Transform {
        batch_id: String,
        #[source]
        source: PipelineError,
    },
    /// After a commit with an unknown outcome only some of its dead letters
    /// are gone: another redrive ran at the same time.
    #[error(
        "redrive batch {batch_id}: after a lost commit reply {stored} of its {taken} dead letters \
         are still stored; another redrive ran at the same time: run it again"
    )]
    Unsettled {
        batch_id: String,
        stored: usize,
        taken: usize,
    },
}

/// One redrive batch done, for progress output.
#[derive(Debug, Clone)]
pub struct Redriven {
    /// The batch that stored the dead letters.
    pub from_batch: String,
    /// The redrive's batch id (its lineage row).
    pub batch_id: String,
    pub records: usize,
    pub rows_out: usize,
    /// Records that failed again (stored again as dead letters).
    pub dead_again: usize,
    /// False if another redrive took them first (nothing written).
    pub committed: bool,
}

/// What a whole redrive did.
#[derive(Debug, Clone, Default)]
pub struct RedriveDone {
    pub version: Option<Version>,
    pub batches: usize,
    pub records: usize,
    pub rows_out: usize,
    pub dead_again: usize,
    /// Redrive batches whose dead letters another redrive took first.
    pub skipped: usize,
}

/// The stored dead letters of `config`'s pipeline that `filter` keeps.
pub async fn list(
    config: &PipelineConfig,
    filter: &DeadLetterFilter,
) -> Result<Vec<StoredDeadLetter>, RedriveError> {
    let reader = crate::backends::dead_letters(config).await?;
    Ok(reader.list(&config.pipeline, filter).await?)
}

/// Redrives the dead letters `filter` keeps through the active version;
/// `on_batch` hears of each redrive batch with the number of dead letters
/// selected in all.
pub async fn redrive(
    config: &PipelineConfig,
    filter: &DeadLetterFilter,
    on_batch: impl FnMut(&Redriven, usize),
) -> Result<RedriveDone, RedriveError> {
    let redriving = Redriving {
        config,
        filter,
        on_batch,
    };
    crate::backends::with_redrive_sink(config, redriving).await?
}

/// A redrive, handed the sink it commits into.
struct Redriving<'a, F> {
    config: &'a PipelineConfig,
    filter: &'a DeadLetterFilter,
    on_batch: F,
}

impl<F: FnMut(&Redriven, usize)> WithRedriveSink for Redriving<'_, F> {
    type Output = Result<RedriveDone, RedriveError>;
    async fn with<S: Sink + Redrive>(self, sink: S) -> Self::Output {
        redrive_with(self.config, &sink, self.filter, self.on_batch).await
    }
}

async fn redrive_with<S: Redrive>(
    config: &PipelineConfig,
    sink: &S,
    filter: &DeadLetterFilter,
    mut on_batch: impl FnMut(&Redriven, usize),
) -> Result<RedriveDone, RedriveError> {
    let reader = crate::backends::dead_letters(config).await?;
    let selected = reader.list(&config.pipeline, filter).await?;
    let mut done = RedriveDone::default();
    if selected.is_empty() {
        return Ok(done);
    }
    let (version, preparer) = active_preparer(config).await?;
    done.version = Some(version);
    let total = selected.len();
    for (from_batch, letters) in redrive_batches(selected, filter)? {
        let batch = transform(&preparer, &config.pipeline, &from_batch, &letters)?;
        let committed = commit(sink, &batch, &from_batch, &letters).await?;
        let redriven = Redriven {
            from_batch,
            batch_id: batch.plan.batch_id.clone(),
            records: letters.len(),
            rows_out: batch.output.row_count() as usize,
            dead_again: batch.dead_letters.len(),
            committed,
        };
        match committed {
            true => {
                done.batches += 1;
                done.records += redriven.records;
                done.rows_out += redriven.rows_out;
                done.dead_again += redriven.dead_again;
            }
            false => done.skipped += 1,
        }
        on_batch(&redriven, total);
    }
    Ok(done)
}

/// The active version of the pipeline, loaded under the config's limits
/// and poison policy.
async fn active_preparer(
    config: &PipelineConfig,
) -> Result<(Version, Preparer<WasmTransform>), RedriveError> {
    let store = crate::backends::module_store(config).await?;
    let version = store
        .active(&config.pipeline)
        .await?
        .ok_or_else(|| RedriveError::NoActiveVersion(config.pipeline.clone()))?;
    let component = store.get(&version.module_digest).await?;
    let digest = version.module_digest.clone();
    let module_err = |source| RedriveError::Module {
        digest: digest.clone(),
        source,
    };
    let limits = Limits::from_config(&config.limits).with_event_time(&config.event_time);
    let runtime = Arc::new(Runtime::new(limits).map_err(module_err)?);
    let module = tokio::task::block_in_place(|| {
        runtime.load(&component, config.module.cache_dir.as_deref())
    })
    .map_err(module_err)?;
    let transform =
        WasmTransform::new(runtime, module, version.params.clone()).map_err(|source| {
            RedriveError::Init {
                digest: digest.clone(),
                source,
            }
        })?;
    let preparer = Preparer::new(config.pipeline.clone(), config.limits.on_poison, transform)
        .with_contract(crate::app::output_contract(config));
    Ok((version, preparer))
}

/// The redrive batches of `letters`, each stored by one batch, so a
/// redrive batch is never larger than a batch the pipeline ran: for a sink
/// that keeps them in a table, by the batch that stored them, each keeping
/// the listing's (topic, partition, offset) order
/// (`DeadLetterReader::list` gives it); for one that keeps them in a log
/// (`stored_at`), in the log's order, each a run stored by one batch in
/// one partition of it, since such a sink moves a position past what it
/// redrove and must not pass over any (it takes no filter).
fn redrive_batches(
    mut letters: Vec<StoredDeadLetter>,
    filter: &DeadLetterFilter,
) -> Result<Vec<(String, Vec<StoredDeadLetter>)>, RedriveError> {
    if letters.iter().any(|d| d.stored_at.is_some()) {
        if *filter != DeadLetterFilter::default() {
            return Err(RedriveError::Sink(SinkError::Config(
                "this sink keeps its dead letters in a log and redrives them in its order, \
                 all of them: use `--all` alone"
                    .into(),
            )));
        }
        letters.sort_by_key(|d| d.stored_at);
        let mut runs: Vec<(String, Vec<StoredDeadLetter>)> = Vec::new();
        for d in letters {
            let partition = d.stored_at.map(|at| at.partition);
            match runs.last_mut() {
                Some((batch, run))
                    if *batch == d.batch_id
                        && run[0].stored_at.map(|at| at.partition) == partition =>
                {
                    run.push(d)
                }
                _ => runs.push((d.batch_id.clone(), vec![d])),
            }
        }
        return Ok(runs);
    }
    let mut groups: BTreeMap<String, Vec<StoredDeadLetter>> = BTreeMap::new();
    for d in letters {
        groups.entry(d.batch_id.clone()).or_default().push(d);
    }
    Ok(groups.into_iter().collect())
}

/// Runs `letters` (sorted) as one batch under a plan of their own: the
/// ranges they span (for the seed), the stored batch's planned time (now,
/// if its lineage is gone) and a redrive id.
fn transform(
    preparer: &Preparer<WasmTransform>,
    pipeline: &str,
    from_batch: &str,
    letters: &[StoredDeadLetter],
) -> Result<Batch, RedriveError> {
    let mut records = Records::default();
    let mut ranges: Vec<OffsetRange> = Vec::new();
    for run in letters.chunk_by(|a, b| (&a.topic, a.partition) == (&b.topic, b.partition)) {
        let (first, last) = (&run[0], &run[run.len() - 1]);
        let owned: Vec<OwnedRecord> = run.iter().map(owned_record).collect();
        records.push_slice(&first.topic, first.partition, &owned);
        ranges.push(OffsetRange {
            topic: first.topic.clone(),
            partition: first.partition,
            from: first.offset,
            until: last.offset + 1,
        });
    }
    let module_digest = preparer.transform().module_digest().to_string();
    let batch_time_ms = letters[0].batch_time_ms.unwrap_or_else(now_ms);
    let mut plan = Plan::new(
        pipeline,
        ranges,
        &module_digest,
        preparer.params_digest(),
        batch_time_ms,
    );
    plan.batch_id = redrive_id(&plan, from_batch, letters);
    // A redrive commits beside the running pipeline, outside its offset
    // compare-and-set and its state cache: a state write here would race
    // the pipeline's, so a module's state calls fail the redrive instead.
    let state = Arc::new(NoState(
        "dead letters of a module that keeps keyed state cannot be redriven yet: \
         a redrive commits outside the pipeline's partitions and would race its state"
            .to_string(),
    ));
    let mut batch =
        tokio::task::block_in_place(|| preparer.transform_planned(plan, records, 0, state))
            .map_err(|source| RedriveError::Transform {
                batch_id: from_batch.to_string(),
                source,
            })?;
    // The offsets were committed by the batch that stored the dead
    // letters; a redrive's lineage row records none.
    batch.plan.ranges.clear();
    Ok(batch)
}

fn owned_record(d: &StoredDeadLetter) -> OwnedRecord {
    OwnedRecord {
        offset: d.offset,
        timestamp: d.timestamp,
        key: d.key.clone(),
        value: d.value.clone(),
        headers: Vec::new(),
    }
}

/// A redrive's batch id: its records, the batch that stored them and the
/// version that runs them, so redriving again what failed again (stored
/// under this id) gets a new one.
fn redrive_id(plan: &Plan, from_batch: &str, letters: &[StoredDeadLetter]) -> String {
    let mut text = format!(
        "{}\0{from_batch}\0{}\0{}",
        plan.pipeline, plan.module_digest, plan.params_digest
    );
    for d in letters {
        text.push_str(&format!("\0{}", d.key()));
    }
    format!("{REDRIVE_PREFIX}{}", &sha256_hex(text.as_bytes())[..24])
}

/// Commits one redrive batch; false if another redrive took its dead
/// letters first.
async fn commit<S: Redrive>(
    sink: &S,
    batch: &Batch,
    stored_by: &str,
    taken: &[StoredDeadLetter],
) -> Result<bool, RedriveError> {
    let commit = Commit {
        plan: &batch.plan,
        records: &batch.records,
        output: &batch.output,
        dead_letters: &batch.dead_letters,
        output_digest: &batch.output_digest,
        state_reads: &batch.state_reads,
    };
    let mut backoff = COMMIT_RETRY.start();
    loop {
        let error = match sink.redrive(&commit, stored_by, taken).await {
            Ok(RedriveOutcome::Committed) => return Ok(true),
            Ok(RedriveOutcome::Gone(key)) => {
                tracing::warn!(
                    batch = %batch.plan.batch_id,
                    "dead letter {key} is no longer stored (another redrive or a reset took it): \
                     skipping the dead letters of its batch"
                );
                return Ok(false);
            }
            Err(e) => e,
        };
        let Some(wait) = backoff.next_wait_if(error.is_retryable()) else {
            return Err(error.into());
        };
        tracing::warn!(batch = %batch.plan.batch_id, "{}; trying again", sluice_core::error::Chain(&error));
        tokio::time::sleep(wait).await;
        if matches!(error, SinkError::CommitUnknown { .. }) {
            match sink
                .still_stored(&batch.plan.pipeline, stored_by, taken)
                .await?
            {
                0 => return Ok(true),
                n if n == taken.len() => {}
                stored => {
                    return Err(RedriveError::Unsettled {
                        batch_id: batch.plan.batch_id.clone(),
                        stored,
                        taken: taken.len(),
                    });
                }
            }
        }
    }
}
