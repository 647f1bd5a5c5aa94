//! Committing a prepared batch into the sink: retries through outages, a
//! fenced commit said so, and a commit whose outcome is unknown resolved by
//! reading the checkpoints back.
//!
//! # Delivery guarantee
//!
//! A batch lands at most once because the sink commits its outputs with a
//! compare-and-set of the offsets `from -> until`: a second landing would
//! find `until`, not `from`. It lands at least once because every failure
//! is either retried (nothing landed), or resolved by reading the
//! checkpoints (landed, nothing landed, or moved by another owner, which
//! the loop treats as fenced and re-reads from the checkpoint). It never
//! writes again after an unknown outcome without reading first.
//!
//! Shutdown ends the retries of a sink that is down (a pod's grace period
//! is shorter than an outage): the batch is abandoned, not lost. Its
//! offsets moved with it or not at all, so the next run reads it again
//! or goes on after it.
//!
//! It must not plan, read or transform: it gets a prepared batch.

use crate::{Parts, PipelineError};
use sluice_core::backoff::{GiveUp, RetryPolicy};
use sluice_core::batch::{OffsetRange, Plan, TopicPartition};
use sluice_core::error::Chain;
use sluice_core::sink::{Commit, CommitOutcome, Sink, SinkError};
use sluice_core::versions::Versions;
use std::collections::HashMap;
use std::time::Duration;

/// How an unreachable sink is retried (commits and checkpoint reads)
/// before the pipeline stops.
pub(crate) const SINK_RETRY: RetryPolicy = RetryPolicy {
    first: Duration::from_millis(100),
    max: Duration::from_secs(5),
    give_up: GiveUp::After(Duration::from_secs(300)),
};

/// What became of a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Landing {
    /// The batch is committed (now, or by an earlier attempt whose reply
    /// was lost).
    Landed,
    /// Another owner moved the offsets first; nothing of the batch landed.
    Fenced,
    /// Shutdown came while the sink was unavailable: no more tries. The
    /// batch landed or not as its checkpoint says (a try that may have
    /// landed is exactly what the offset compare-and-set settles for the
    /// next run).
    Abandoned,
}

/// What the checkpoints say after a commit whose outcome was unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resolved {
    /// They say `until` everywhere: it landed.
    Landed,
    /// They still say `from` everywhere (or nothing): commit again.
    NothingLanded,
    /// Someone else moved them: treat as fenced.
    MovedByOther,
}

impl<S: Sink, V: Versions> Parts<S, V> {
    /// Commits with retries (see [`SINK_RETRY`]).
    pub(crate) async fn commit(&self, commit: &Commit<'_>) -> Result<Landing, PipelineError> {
        let mut backoff = SINK_RETRY.start();
        loop {
            let tried = self.sink.commit(commit).await;
            self.answered(tried.as_ref().err());
            let error = match tried {
                Ok(CommitOutcome::Committed) => return Ok(Landing::Landed),
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
                    return Ok(Landing::Fenced);
                }
                Err(e) => e,
            };
            if let SinkError::CommitUnknown { .. } = error {
                tracing::warn!(batch = %commit.plan.batch_id, "{}; reading the checkpoint back", Chain(&error));
                let resolved = match self.resolve_unknown(commit.plan).await {
                    Err(e) if self.shutdown.is_cancelled() => {
                        tracing::warn!(batch = %commit.plan.batch_id, "{}; shutting down, so the batch is abandoned (it landed or not as its checkpoint says)", Chain(&e));
                        return Ok(Landing::Abandoned);
                    }
                    resolved => resolved?,
                };
                match resolved {
                    Resolved::Landed => return Ok(Landing::Landed),
                    Resolved::MovedByOther => return Ok(Landing::Fenced),
                    Resolved::NothingLanded => {
                        self.status.metrics().commit_retried();
                        continue;
                    }
                }
            }
            let Some(wait) = backoff.next_wait_if(error.is_retryable()) else {
                return Err(error.into());
            };
            if self.shutdown.is_cancelled() {
                tracing::warn!(batch = %commit.plan.batch_id, "commit failed: {}; shutting down, so the batch is abandoned (the next run goes on from its checkpoint)", Chain(&error));
                return Ok(Landing::Abandoned);
            }
            tracing::warn!(batch = %commit.plan.batch_id, "commit failed: {}; retrying in {wait:?}", Chain(&error));
            self.status.metrics().commit_retried();
            self.before_next_try(wait).await;
        }
    }

    /// Waits `wait` before the next try, or until shutdown if it comes
    /// first (that try is then the last: its failure gives up).
    async fn before_next_try(&self, wait: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = self.shutdown.cancelled() => {}
        }
    }

    /// The sink answered a try (`failed`: with that error): the probes
    /// see it, and the loop counts as alive while it retries.
    fn answered(&self, failed: Option<&SinkError>) {
        self.status.beat(false);
        self.status.sink_tried(failed.map(|e| Chain(e).to_string()));
    }

    /// After a commit with unknown outcome: what the checkpoints of the
    /// plan's partitions say.
    async fn resolve_unknown(&self, plan: &Plan) -> Result<Resolved, PipelineError> {
        let stored = self.checkpoints(&plan.partitions()).await?;
        let at = |r: &OffsetRange| stored.get(&r.topic_partition()).copied();
        if plan.ranges.iter().all(|r| at(r) == Some(r.until)) {
            tracing::info!(batch = %plan.batch_id, "commit had landed");
            return Ok(Resolved::Landed);
        }
        if plan
            .ranges
            .iter()
            .all(|r| at(r).is_none_or(|o| o == r.from))
        {
            return Ok(Resolved::NothingLanded);
        }
        Ok(Resolved::MovedByOther)
    }

    /// The sink's checkpoints of `partitions`, with retries (see
    /// [`SINK_RETRY`]).
    pub(crate) async fn checkpoints(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, PipelineError> {
        let mut backoff = SINK_RETRY.start();
        loop {
            let tried = self
                .sink
                .checkpoints(&self.options.pipeline, partitions)
                .await;
            self.answered(tried.as_ref().err());
            let error = match tried {
                Ok(c) => return Ok(c),
                Err(e) => e,
            };
            let Some(wait) = backoff.next_wait_if(error.is_retryable()) else {
                return Err(error.into());
            };
            if self.shutdown.is_cancelled() {
                return Err(error.into());
            }
            tracing::warn!(
                "reading checkpoints: {}; retrying in {wait:?}",
                Chain(&error)
            );
            self.before_next_try(wait).await;
        }
    }
}
