//! Redriving dead letters into the exactly-once Kafka sink: a redrive
//! batch's records, its new dead letters and lineage entry, and the move
//! of the redrive's position in the dead-letter topic, in one producer
//! transaction.
//!
//! # Delivery guarantee
//!
//! Exactly-once per dead letter. A topic cannot drop the dead letters a
//! redrive ran, so the redrive keeps a *position* per dead-letter
//! partition: the pipeline's consumer group's committed offset of it,
//! written by `send_offsets_to_transaction` in each redrive transaction
//! (read back stable, as the batch checkpoints are). Dead letters below it
//! are redriven; listings leave them out. The host redrives them in the
//! topic's order, in runs stored by one batch, so the position only ever
//! passes over what was redriven (or what the listing did not show:
//! another pipeline's records, an aborted attempt's copies).
//!
//! One transactional id per pipeline (`sluice-<pipeline>-redrive`)
//! fences: a redrive starting aborts the open transaction of one running
//! or killed and makes its next commit fail. A fenced redrive takes the id
//! back and reads the position again before each commit; a run whose
//! first dead letter is below it was taken by the other ([`RedriveOutcome::Gone`]).
//! Depends on the broker's transactions and fencing, as every batch does.
//!
//! It must not move an input offset.

use crate::client::{BROKER_TIMEOUT, send};
use crate::sink::{KafkaSink, Step, TxnProducer, in_transaction};
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use sluice_core::batch::TopicPartition;
use sluice_core::dead_letters::{Redrive, RedriveOutcome, StoredAt, StoredDeadLetter};
use sluice_core::sink::{Commit, SinkError};
use std::sync::Arc;

/// Times a redrive batch takes the transactional id back from another
/// redrive before it gives up.
const ATTEMPTS: usize = 10;

/// Where a run of dead letters is stored: one partition of the
/// dead-letter topic, its first and last offsets.
struct Run {
    partition: i32,
    first: i64,
    last: i64,
}

impl Run {
    fn of(taken: &[StoredDeadLetter]) -> Result<Run, SinkError> {
        let at: Vec<StoredAt> = taken
            .iter()
            .map(|d| {
                d.stored_at.ok_or_else(|| {
                    SinkError::Config(format!("dead letter {} has no place in the topic", d.key()))
                })
            })
            .collect::<Result<_, _>>()?;
        let partition = at.first().map_or(0, |a| a.partition);
        if at.iter().any(|a| a.partition != partition) {
            return Err(SinkError::Config(
                "a redrive batch spans partitions of the dead-letter topic".into(),
            ));
        }
        Ok(Run {
            partition,
            first: at.iter().map(|a| a.offset).min().unwrap_or(0),
            last: at.iter().map(|a| a.offset).max().unwrap_or(0),
        })
    }
}

impl KafkaSink {
    /// This process's redrive producer; a new one (taking the id back)
    /// with `fresh`, or if there is none yet.
    fn redrive_producer(&self, fresh: bool) -> Result<Arc<TxnProducer>, SinkError> {
        let mut slot = self.redriving.lock().expect("redrive producer lock");
        if let (false, Some(producer)) = (fresh, slot.as_ref()) {
            return Ok(Arc::clone(producer));
        }
        let id = format!("sluice-{}-redrive", self.pipeline);
        let producer = self.transactional(id, "", "the redrive")?;
        *slot = Some(Arc::clone(&producer));
        Ok(producer)
    }

    /// The redrive's position in `partition` of the dead-letter topic:
    /// the dead letters below it are redriven (0: none).
    fn redrive_position(&self, partition: i32) -> Result<i64, SinkError> {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.dead_letter_topic, partition);
        let committed =
            tokio::task::block_in_place(|| self.offsets.committed_offsets(list, BROKER_TIMEOUT))
                .map_err(|e| SinkError::unavailable("reading the redrive's position", e))?;
        Ok(committed
            .elements()
            .iter()
            .find_map(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
            .unwrap_or(0))
    }

    /// One transaction: the redrive batch's records and the position past
    /// `run`.
    fn redrive_once(
        &self,
        producer: &TxnProducer,
        commit: &Commit<'_>,
        run: &Run,
    ) -> Result<(), Step> {
        let records = self
            .layout
            .records(commit, Some(&self.lineage_topic))
            .map_err(Step::Failed)?;
        let tp = TopicPartition {
            topic: self.dead_letter_topic.clone(),
            partition: run.partition,
        };
        in_transaction(producer, &self.group, &tp, || {
            records.send_each(|r| {
                send(producer, r).map_err(|e| (format!("producing to {}", r.topic), e))
            })?;
            let mut offsets = TopicPartitionList::new();
            offsets
                .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(run.last + 1))
                .map_err(|e| (format!("offsets (redrive of {tp})"), e))?;
            Ok(offsets)
        })
    }
}

impl Redrive for KafkaSink {
    async fn redrive(
        &self,
        commit: &Commit<'_>,
        _stored_by: &str,
        taken: &[StoredDeadLetter],
    ) -> Result<RedriveOutcome, SinkError> {
        let run = Run::of(taken)?;
        for attempt in 0..ATTEMPTS {
            let producer = tokio::task::block_in_place(|| self.redrive_producer(attempt > 0))?;
            if run.first < self.redrive_position(run.partition)? {
                return Ok(RedriveOutcome::Gone(taken[0].key()));
            }
            match tokio::task::block_in_place(|| self.redrive_once(&producer, commit, &run)) {
                Ok(()) => return Ok(RedriveOutcome::Committed),
                Err(Step::Replace) => continue,
                Err(Step::Failed(e)) => return Err(e),
            }
        }
        Err(SinkError::Config(format!(
            "another redrive of this pipeline took the redrive's transactional id each of \
             {ATTEMPTS} times: run one redrive at a time"
        )))
    }

    async fn still_stored(
        &self,
        _pipeline: &str,
        _stored_by: &str,
        taken: &[StoredDeadLetter],
    ) -> Result<usize, SinkError> {
        let run = Run::of(taken)?;
        let position = self.redrive_position(run.partition)?;
        Ok(taken
            .iter()
            .filter(|d| d.stored_at.is_some_and(|at| at.offset >= position))
            .count())
    }
}
