//! Moving an exactly-once Kafka sink's checkpoints on purpose (`sluice
//! reset`): the group's committed offsets of the moved partitions, each in
//! a transaction of its partition's producer.
//!
//! # Delivery guarantee
//!
//! The checkpoint of this sink is the consumer group's committed offset,
//! written by the batch transactions of one transactional id per input
//! partition (`sink`). A reset moves it the same way, fenced: it starts
//! the partition's producer under that id (`init_transactions` aborts a
//! running owner's open transaction and fences it), reads the stable
//! committed offset, and commits one transaction holding the new offset
//! and a [`ResetMark`] in the lineage topic. A running instance fails its
//! next produce or commit as fenced, replaces its producer (fencing this
//! one, which is done by then, or fails its commit and is tried again) and
//! re-reads the checkpoint: the new one. The lineage topic cannot be
//! rewritten, so the mark tells lineage readers that the batches before it
//! whose range of the partition ends past the new offset are the old run's
//! (`select_entries` leaves them out, as a SQL reset moves them to
//! `PIPELINE@reset-N`).
//!
//! Partitions are moved one transaction each (one producer each): a reset
//! that stops half-way leaves some moved, which the output says; running
//! it again moves the rest. Keyed state: the changelog's committed
//! position goes in the same transaction, to 0 with [`OnState::Clear`]
//! (no seal: empty state), else a partition that keeps state is refused
//! before anything moves. The dead letters of re-run offsets stay in the
//! dead-letter topic (a topic is not rewritten either). It must not write
//! to the output topics.

use crate::client::send;
use crate::lineage::read_entries;
use crate::records::OutRecord;
use crate::sink::{KafkaSink, Step, TxnProducer, in_transaction};
use rdkafka::{Offset, TopicPartitionList};
use sluice_core::batch::{TopicPartition, now_ms};
use sluice_core::config::PipelineConfig;
use sluice_core::reset::{OnState, PartitionMove, ResetDone, keeps_state};
use sluice_core::sink::SinkError;
use sluice_core::state::StateStore;
use sluice_core::store::{ResetMark, Selection, select_entries};
use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

/// Tries of one partition's move when a running owner takes its
/// transactional id back before the reset's transaction commits.
const ATTEMPTS: usize = 10;
/// The most keyed state restored to count a partition's keys.
const COUNT_MAX_BYTES: usize = 1 << 30;

/// Moves the group's committed offsets of `targets` for `config`'s
/// exactly-once Kafka sink; with `dry_run`, reports and fences nothing.
pub async fn reset(
    config: &PipelineConfig,
    targets: &[(TopicPartition, i64)],
    on_state: OnState,
    dry_run: bool,
) -> Result<ResetDone, SinkError> {
    let sink = KafkaSink::open(config).await?;
    let partitions: Vec<TopicPartition> = targets.iter().map(|(tp, _)| tp.clone()).collect();
    let entries = tokio::task::block_in_place(|| {
        read_entries(&sink.cluster, &sink.lineage_topic, &sink.pipeline)
    })?;
    let mut marks = Vec::new();
    for entry in &entries {
        marks.extend(ResetMark::parse(entry)?);
    }
    let reset = marks.iter().map(|m| m.reset).max().unwrap_or(0) + 1;
    let marks: Vec<ResetMark> = targets
        .iter()
        .map(|(tp, to)| ResetMark {
            reset,
            topic: tp.topic.clone(),
            partition: tp.partition,
            to: *to,
            at_ms: now_ms(),
        })
        .collect();
    let stale: HashSet<String> = select_entries(&entries, &Selection::default())?
        .into_iter()
        .filter(|b| marks.iter().any(|m| m.covers(b)))
        .map(|b| b.batch_id)
        .collect();
    let from = tokio::task::block_in_place(|| sink.committed(&partitions))?;
    let state_keys_cleared = settle_state(&sink, &partitions, on_state).await?;
    let mut moves = Vec::new();
    for ((tp, to), mark) in targets.iter().zip(&marks) {
        if !dry_run {
            tokio::task::block_in_place(|| sink.move_partition(tp, mark, on_state))
                .map_err(|e| moved_so_far(e, &moves))?;
        }
        moves.push(PartitionMove {
            partition: tp.clone(),
            from: from.get(tp).copied(),
            to: *to,
        });
    }
    Ok(ResetDone {
        archived_as: format!("{}@reset-{reset}", sink.pipeline),
        moves,
        batches_archived: stale.len(),
        dead_letters_archived: 0,
        state_keys_cleared,
    })
}

/// Refuses to move a partition that keeps state ([`OnState::Refuse`]);
/// else counts the keys the move clears. (The committed offsets were read,
/// which noted each partition's newest seal.)
async fn settle_state(
    sink: &KafkaSink,
    partitions: &[TopicPartition],
    on_state: OnState,
) -> Result<u64, SinkError> {
    let sealed: Vec<TopicPartition> = {
        let seals = sink.seals.lock().expect("seals lock");
        partitions
            .iter()
            .filter(|tp| seals.get(*tp).is_some_and(Option::is_some))
            .cloned()
            .collect()
    };
    let mut cleared = 0;
    for tp in &sealed {
        let keys = sink
            .state
            .load(&sink.pipeline, tp, COUNT_MAX_BYTES)
            .await
            .map_err(|e| SinkError::database(format!("reading the keyed state of {tp}"), e))?
            .map(|state| state.len() as i64);
        if on_state == OnState::Refuse && keys != Some(0) {
            return Err(SinkError::Config(keeps_state(tp, keys)));
        }
        cleared += keys.unwrap_or(0) as u64;
    }
    Ok(cleared)
}

/// A move that failed after others were done: the error says which moved.
fn moved_so_far(e: SinkError, moves: &[PartitionMove]) -> SinkError {
    if moves.is_empty() {
        return e;
    }
    let done: Vec<String> = moves.iter().map(|m| m.partition.to_string()).collect();
    SinkError::Database {
        context: format!(
            "resetting: {} moved before this failed; run the reset again to move the rest",
            done.join(", ")
        ),
        cause: Some(Box::new(e)),
    }
}

impl KafkaSink {
    /// Moves one partition's committed offset (and clears its state's
    /// position with [`OnState::Clear`]) with `mark`, fenced, in one
    /// transaction; tried again if a running owner fences it first.
    fn move_partition(
        &self,
        tp: &TopicPartition,
        mark: &ResetMark,
        on_state: OnState,
    ) -> Result<(), SinkError> {
        let mut last = None;
        for _ in 0..ATTEMPTS {
            self.fence_all(std::slice::from_ref(tp))?;
            let producer = self.producers.lock().expect("producers lock")[tp].clone();
            match self.move_once(&producer, tp, mark, on_state) {
                Ok(()) => return Ok(()),
                Err(Step::Replace) => last = Some(tp.clone()),
                Err(Step::Failed(e)) => return Err(e),
            }
        }
        Err(SinkError::Config(format!(
            "{} was fenced by a running owner each of {ATTEMPTS} times before the reset \
             committed; stop the pipeline, then reset",
            last.unwrap_or_else(|| tp.clone())
        )))
    }

    fn move_once(
        &self,
        producer: &Arc<TxnProducer>,
        tp: &TopicPartition,
        mark: &ResetMark,
        on_state: OnState,
    ) -> Result<(), Step> {
        in_transaction(producer, &self.group, tp, || {
            let json = mark.to_json();
            let record = OutRecord {
                topic: &self.lineage_topic,
                partition: None,
                key: Some(Cow::Borrowed(self.pipeline.as_bytes())),
                value: Some(Cow::Borrowed(json.as_bytes())),
                headers: Vec::new(),
            };
            let what = |w: &str| format!("{w} (reset of {tp})");
            send(producer, &record).map_err(|e| (what("producing the reset mark"), e))?;
            let mut offsets = TopicPartitionList::new();
            let offset = |list: &mut TopicPartitionList, topic: &str, at: i64| {
                list.add_partition_offset(topic, tp.partition, Offset::Offset(at))
                    .map_err(|e| (what("offsets"), e))
            };
            offset(&mut offsets, &tp.topic, mark.to)?;
            if let (OnState::Clear, Some(changelog)) = (on_state, self.changelog_of(tp)) {
                offset(&mut offsets, changelog, 0)?;
            }
            Ok(offsets)
        })
    }
}
