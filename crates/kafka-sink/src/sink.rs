//! The Kafka sink: one producer transaction per batch.
//!
//! # Delivery guarantee
//!
//! Exactly-once into the output topics, as a `read_committed` reader sees
//! them, given the three conditions (the source replays a range, the
//! transform is deterministic, and this commit is atomic and fenced). One
//! transaction holds the batch's records, its dead letters, its lineage
//! entry and the move of its input partition's offset in the pipeline's
//! consumer group (`send_offsets_to_transaction`): they land together or
//! not at all. The group's committed offsets are the checkpoint, read with
//! `require_stable` (librdkafka asks for it under `read_committed`), so a
//! transaction still settling is never read as a checkpoint.
//!
//! Keyed state goes in the same transaction: the batch's changes to its
//! partition of the changelog topic, sealed, and the group's offset of
//! that changelog partition moved past the seal (see [`crate::changelog`]),
//! so state lands with the records and offsets or not at all, and a
//! fenced zombie's state never counts even where a broker shows aborted
//! records.
//!
//! Fencing is by transactional id, one per input partition
//! (`sluice-<pipeline>-<topic>-<partition>`), and so every batch holds one
//! partition. Whoever starts a partition first calls `init_transactions`
//! under its id: the broker aborts the transaction the previous owner left
//! open and bumps the producer epoch, so a zombie (paused, cut off, or a
//! second instance statically assigned the same partition) fails its next
//! produce, offset commit or commit with `ProducerFenced`. Only then is the
//! checkpoint read. The consumer-group generation (KIP-447) is not relied
//! on: the brokers sluice is tested against do not check it on
//! `TxnOffsetCommit`, while every broker checks the epoch.
//!
//! It must not read input or decide ranges: that is the source and the
//! loop. It never imports another sink.

use crate::broker_errors::BrokerErrors;
use crate::changelog::{ChangelogBatch, SEAL_KEY, Seal, Tag};
use crate::client::{BROKER_TIMEOUT, Cluster, check_topics, send, wait_delivered};
use crate::records::BatchLayout;
use crate::section::KafkaSection;
use crate::state::{KafkaStateStore, missing_changelog};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use sluice_core::backoff::{GiveUp, RetryPolicy};
use sluice_core::batch::{OffsetRange, TopicPartition};
use sluice_core::config::KindSection;
use sluice_core::config::PipelineConfig;
use sluice_core::sink::{Commit, CommitOutcome, Sink, SinkError};
use sluice_core::state::StateStore;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) type TxnProducer = ThreadedProducer<SealWatch>;

/// A transactional producer's context: notes the changelog offset each
/// seal was written at (from its delivery report), which the transaction
/// then commits as the changelog's position.
pub(crate) struct SealWatch {
    changelog: String,
    /// The tag and offset of the seal last delivered.
    seal: Mutex<Option<(Tag, i64)>>,
}

impl ClientContext for SealWatch {}

impl ProducerContext for SealWatch {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        // The key first: it is one byte to compare, for every record.
        if let Ok(m) = result
            && m.key() == Some(SEAL_KEY)
            && m.topic() == self.changelog
            && let Ok(seal) = Seal::decode(m.payload().unwrap_or_default())
        {
            *self.seal.lock().unwrap_or_else(|e| e.into_inner()) = Some((seal.tag, m.offset()));
        }
    }
}

impl SealWatch {
    /// The offset the seal tagged `tag` was delivered at, if it was (a
    /// report of an earlier, aborted attempt's seal is not it).
    fn delivered(&self, tag: &Tag) -> Option<i64> {
        match *self.seal.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((delivered, offset)) if delivered == *tag => Some(offset),
            _ => None,
        }
    }
}

/// Where the state of one input topic's partitions goes.
struct Changelog {
    topic: String,
    /// How many partitions it has (`None`: it does not exist).
    partitions: Option<usize>,
}

/// How long an abort may take: one that does not finish leaves the
/// producer unusable, and it is replaced.
const ABORT_TIMEOUT: Duration = Duration::from_secs(5);
/// How a commit whose outcome is retriable is retried (every 100 ms for a
/// minute) before the loop is told its outcome is unknown.
const COMMIT_RETRY: RetryPolicy = RetryPolicy {
    first: Duration::from_millis(100),
    max: Duration::from_millis(100),
    give_up: GiveUp::After(Duration::from_secs(60)),
};

/// Commits each batch in a transaction of its partition's producer.
pub struct KafkaSink {
    pub(crate) cluster: Cluster,
    pub(crate) pipeline: String,
    pub(crate) layout: BatchLayout,
    pub(crate) lineage_topic: String,
    /// Where the batches' dead letters go.
    pub(crate) dead_letter_topic: String,
    /// Reads the group's committed offsets; its group metadata goes with
    /// every transaction's offsets.
    pub(crate) offsets: BaseConsumer<BrokerErrors>,
    pub(crate) group: ConsumerGroupMetadata,
    pub(crate) producers: Mutex<HashMap<TopicPartition, Arc<TxnProducer>>>,
    /// Per input topic, its changelog.
    changelogs: HashMap<String, Changelog>,
    /// Per owned partition, the changelog offset of its newest committed
    /// seal (`None`: no batch of it has changed state); read with the
    /// checkpoints, moved by each commit that changes state.
    pub(crate) seals: Mutex<HashMap<TopicPartition, Option<i64>>>,
    pub(crate) state: Arc<KafkaStateStore>,
    /// The producer of this process's redrive, once started (`redrive`).
    pub(crate) redriving: Mutex<Option<Arc<TxnProducer>>>,
}

impl KafkaSink {
    /// Connects to the brokers of `config.sink.url` (`kafka://host:port`,
    /// comma-separated for several) and checks every topic it writes
    /// exists.
    pub async fn open(config: &PipelineConfig) -> Result<KafkaSink, SinkError> {
        let cluster = Cluster::of(config)?;
        let group_id = config.group_id();
        let offsets: BaseConsumer<BrokerErrors> = cluster
            .client()
            .set("group.id", &group_id)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create_with_context(BrokerErrors::default())
            .map_err(|e| SinkError::Config(format!("Kafka sink client: {e}")))?;
        let group = offsets
            .group_metadata()
            .ok_or_else(|| SinkError::Config("Kafka sink: no consumer group metadata".into()))?;
        let fields = KafkaSection::sink(&config.sink)?;
        let dead_letter_topic = fields.dead_letter_topic(&config.pipeline);
        let mut sink = KafkaSink {
            cluster,
            pipeline: config.pipeline.clone(),
            layout: BatchLayout::new(&config.sink.targets, dead_letter_topic.clone())?,
            lineage_topic: fields.lineage_topic(&config.pipeline),
            dead_letter_topic,
            offsets,
            group,
            producers: Mutex::new(HashMap::new()),
            changelogs: HashMap::new(),
            seals: Mutex::new(HashMap::new()),
            state: Arc::new(KafkaStateStore::for_pipeline(config)?),
            redriving: Mutex::new(None),
        };
        tokio::task::block_in_place(|| {
            sink.check_topics()?;
            sink.changelogs = sink.find_changelogs(config)?;
            Ok::<_, SinkError>(())
        })?;
        Ok(sink)
    }

    /// Each input topic's changelog, and whether it exists (it need not,
    /// unless the module keeps state).
    fn find_changelogs(
        &self,
        config: &PipelineConfig,
    ) -> Result<HashMap<String, Changelog>, SinkError> {
        let fields = KafkaSection::sink(&config.sink)?;
        let metadata = self
            .offsets
            .client()
            .fetch_metadata(None, BROKER_TIMEOUT)
            .map_err(|e| self.unreachable(e))?;
        Ok(config
            .source
            .topics
            .iter()
            .map(|input| {
                let topic = fields.changelog_topic(config, input);
                let partitions = metadata
                    .topics()
                    .iter()
                    .find(|t| t.name() == topic && t.error().is_none())
                    .map(|t| t.partitions().len())
                    .filter(|n| *n > 0);
                (input.clone(), Changelog { topic, partitions })
            })
            .collect())
    }

    /// The changelog partition keeping `tp`'s state, if it exists.
    pub(crate) fn changelog_of(&self, tp: &TopicPartition) -> Option<&str> {
        let changelog = self.changelogs.get(&tp.topic)?;
        let partitions = changelog.partitions?;
        (usize::try_from(tp.partition).ok()? < partitions).then_some(changelog.topic.as_str())
    }

    /// Every topic this sink writes exists.
    fn check_topics(&self) -> Result<(), SinkError> {
        check_topics(
            self.offsets.client(),
            &self.cluster.brokers,
            &self.layout.topics(),
            Some(&self.lineage_topic),
            |e| self.unreachable(e),
        )
    }

    /// A metadata read failed with `e`: unavailable, with librdkafka's
    /// reason (polling the reader serves the queue it reports it on; the
    /// reader is assigned nothing, so a poll reads no record).
    fn unreachable(&self, e: KafkaError) -> SinkError {
        let serve = || {
            self.offsets.poll(Duration::from_millis(50));
        };
        (self.offsets.context()).unavailable(&self.cluster.brokers, e, serve)
    }

    /// The transactional id fencing owners of `tp`.
    fn transactional_id(&self, tp: &TopicPartition) -> String {
        format!("sluice-{}-{}-{}", self.pipeline, tp.topic, tp.partition)
    }

    /// A new transactional producer for `tp`, initialized: every earlier
    /// producer under its id (a previous owner, or this one's own last)
    /// is fenced and its open transaction aborted.
    fn fence(&self, tp: &TopicPartition) -> Result<Arc<TxnProducer>, SinkError> {
        let changelog = self.changelog_of(tp).unwrap_or_default();
        self.transactional(self.transactional_id(tp), changelog, &tp.to_string())
    }

    /// A new transactional producer under `id`, initialized (fencing every
    /// earlier one under it); `changelog` is the topic whose seals it
    /// notes, `what` names it in errors.
    pub(crate) fn transactional(
        &self,
        id: String,
        changelog: &str,
        what: &str,
    ) -> Result<Arc<TxnProducer>, SinkError> {
        let watch = SealWatch {
            changelog: changelog.to_string(),
            seal: Mutex::new(None),
        };
        let producer: TxnProducer = self
            .cluster
            .producer()
            .set("transactional.id", id)
            .create_with_context(watch)
            .map_err(|e| SinkError::Config(format!("Kafka producer: {e}")))?;
        self.connect(&producer, what)?;
        producer
            .init_transactions(BROKER_TIMEOUT)
            .map_err(|e| broker_error(format!("init_transactions for {what}"), e))?;
        Ok(Arc::new(producer))
    }

    /// Connects `producer` to a broker the cluster names (not just the
    /// bootstrap address) before it asks for a producer id: librdkafka
    /// asks only once such a broker is up, and else retries on a 500 ms
    /// timer. A first metadata answer comes over the bootstrap connection,
    /// which librdkafka then drops; the next comes from a named broker. On
    /// Tansu this cut a fence from ~510 ms to ~55 ms.
    fn connect(&self, producer: &TxnProducer, tp: &str) -> Result<(), SinkError> {
        for _ in 0..3 {
            let metadata = producer
                .client()
                .fetch_metadata(Some(&self.lineage_topic), BROKER_TIMEOUT)
                .map_err(|e| broker_error(format!("connecting the producer for {tp}"), e))?;
            if metadata.orig_broker_id() >= 0 {
                break;
            }
        }
        Ok(())
    }

    /// Fences every other owner of `partitions` (in parallel: each is a
    /// round trip to the transaction coordinator) and keeps the producers.
    pub(crate) fn fence_all(&self, partitions: &[TopicPartition]) -> Result<(), SinkError> {
        let fenced: Vec<(TopicPartition, Result<Arc<TxnProducer>, SinkError>)> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = partitions
                    .iter()
                    .map(|tp| (tp.clone(), scope.spawn(move || self.fence(tp))))
                    .collect();
                handles
                    .into_iter()
                    .map(|(tp, h)| (tp, h.join().expect("fencing thread")))
                    .collect()
            });
        let mut producers = self.producers.lock().expect("producers lock");
        for (tp, producer) in fenced {
            producers.insert(tp, producer?);
        }
        Ok(())
    }

    /// The group's committed offsets of `partitions`, stable ones only;
    /// notes the newest committed seal of each one's changelog partition.
    pub(crate) fn committed(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError> {
        let changelogs: Vec<(TopicPartition, TopicPartition)> = partitions
            .iter()
            .filter_map(|tp| {
                let changelog = TopicPartition {
                    topic: self.changelog_of(tp)?.to_string(),
                    partition: tp.partition,
                };
                Some((tp.clone(), changelog))
            })
            .collect();
        let mut list = TopicPartitionList::new();
        for tp in partitions.iter().chain(changelogs.iter().map(|(_, c)| c)) {
            list.add_partition(&tp.topic, tp.partition);
        }
        let committed = self
            .offsets
            .committed_offsets(list, BROKER_TIMEOUT)
            .map_err(|e| SinkError::unavailable("reading the group's committed offsets", e))?;
        let mut offsets: HashMap<TopicPartition, i64> = committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((
                    TopicPartition {
                        topic: e.topic().to_string(),
                        partition: e.partition(),
                    },
                    o,
                )),
                _ => None,
            })
            .collect();
        let mut seals = self.seals.lock().expect("seals lock");
        for tp in partitions {
            seals.insert(tp.clone(), None);
        }
        for (tp, changelog) in changelogs {
            let end = offsets.remove(&changelog).filter(|end| *end > 0);
            seals.insert(tp, end.map(|end| end - 1));
        }
        Ok(offsets)
    }

    /// The changelog records of `c`'s state changes to `tp`, if any.
    fn changelog_batch<'a>(
        &'a self,
        c: &'a Commit<'_>,
        range: &OffsetRange,
    ) -> Result<Option<ChangelogBatch<'a>>, SinkError> {
        let tp = range.topic_partition();
        let Some(changes) = c.output.state.0.get(&tp).filter(|k| !k.is_empty()) else {
            return Ok(None);
        };
        let Some(topic) = self.changelog_of(&tp) else {
            let topic = &self.changelogs[&tp.topic].topic;
            return Err(SinkError::Config(missing_changelog(topic, &tp)));
        };
        let previous = *self
            .seals
            .lock()
            .expect("seals lock")
            .get(&tp)
            .ok_or_else(|| SinkError::Config(format!("no checkpoint was read for {tp}")))?;
        Ok(Some(ChangelogBatch::new(topic, range, changes, previous)))
    }

    /// One transaction: begin, send, offsets, commit.
    fn transact(&self, c: &Commit<'_>, range: &OffsetRange) -> Result<CommitOutcome, SinkError> {
        let tp = range.topic_partition();
        let fenced = || CommitOutcome::Fenced {
            partition: tp.to_string(),
            expected: range.from,
            found: None,
        };
        let producer = self
            .producers
            .lock()
            .expect("producers lock")
            .get(&tp)
            .cloned();
        let Some(producer) = producer else {
            // Released (the partition left this instance after the batch
            // was read): nothing is sent, and the loop re-reads only the
            // partitions it owns, fencing anew.
            tracing::info!(partition = %tp, "a batch of a partition this instance no longer owns is dropped");
            return Ok(fenced());
        };
        let records = self.layout.records(c, Some(&self.lineage_topic))?;
        let changelog = self.changelog_batch(c, range)?;
        let mut sealed_at = None;
        let done = in_transaction(&producer, &self.group, &tp, || {
            let produce = |r: &crate::records::OutRecord<'_>| {
                send(&producer, r).map_err(|e| (format!("producing to {}", r.topic), e))
            };
            records.send_each(produce)?;
            let mut offsets = TopicPartitionList::new();
            offsets
                .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(range.until))
                .map_err(|e| ("offsets".to_string(), e))?;
            if let Some(changelog) = &changelog {
                changelog.send_each(produce)?;
                let seal = self.seal_offset(&producer, &tp, &changelog.tag)?;
                offsets
                    .add_partition_offset(changelog.topic, tp.partition, Offset::Offset(seal + 1))
                    .map_err(|e| ("offsets".to_string(), e))?;
                sealed_at = Some(seal);
            }
            Ok(offsets)
        });
        match done {
            Ok(()) => {
                if let Some(seal) = sealed_at {
                    let mut seals = self.seals.lock().expect("seals lock");
                    seals.insert(tp, Some(seal));
                }
                Ok(CommitOutcome::Committed)
            }
            Err(Step::Replace) => Ok(fenced()),
            Err(Step::Failed(e)) => Err(e),
        }
    }

    /// Waits for every record sent so far, the seal last, and returns the
    /// seal's offset.
    fn seal_offset(
        &self,
        producer: &TxnProducer,
        tp: &TopicPartition,
        tag: &Tag,
    ) -> Result<i64, (String, KafkaError)> {
        wait_delivered(producer, BROKER_TIMEOUT)
            .map_err(|e| (format!("waiting for the batch's state records ({tp})"), e))?;
        producer.context().delivered(tag).ok_or_else(|| {
            (
                format!("the changelog seal of {tp} was not acknowledged"),
                KafkaError::MessageProduction(RDKafkaErrorCode::Fail),
            )
        })
    }
}

impl Sink for KafkaSink {
    /// Fences every other owner of `partitions`, then reads their stable
    /// committed offsets.
    async fn checkpoints(
        &self,
        _pipeline: &str,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError> {
        tokio::task::block_in_place(|| {
            self.fence_all(partitions)?;
            self.committed(partitions)
        })
    }

    async fn commit(&self, c: &Commit<'_>) -> Result<CommitOutcome, SinkError> {
        let [range] = c.plan.ranges.as_slice() else {
            return Err(SinkError::Config(format!(
                "the Kafka sink commits one partition per batch; batch {} has {}",
                c.plan.batch_id,
                c.plan.ranges.len()
            )));
        };
        tokio::task::block_in_place(|| self.transact(c, range))
    }

    fn one_partition_per_batch(&self) -> bool {
        true
    }

    /// Keyed state lives in the changelog topics, restored from there.
    fn state_store(&self) -> Option<Arc<dyn StateStore>> {
        Some(self.state.clone())
    }

    /// Closes the producers of partitions this instance no longer owns (on
    /// a thread of their own: closing takes ~100 ms). Their transactional
    /// ids are the new owners' now, which fence them anyway; kept, each
    /// would hold its threads and broker connections until exit, one per
    /// partition this instance ever owned.
    fn released(&self, partitions: &[TopicPartition]) {
        let closing: Vec<Arc<TxnProducer>> = {
            let mut producers = self.producers.lock().expect("producers lock");
            partitions
                .iter()
                .filter_map(|tp| producers.remove(tp))
                .collect()
        };
        if closing.is_empty() {
            return;
        }
        tracing::info!(
            partitions = %describe_partitions(partitions),
            "closing the producers of partitions this instance no longer owns"
        );
        std::thread::spawn(move || close_all(closing));
    }
}

/// `topic[0], topic[1]`, for the log.
fn describe_partitions(partitions: &[TopicPartition]) -> String {
    partitions
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Drop for KafkaSink {
    /// Closes the producers side by side (see [`close_all`]).
    fn drop(&mut self) {
        let producers = std::mem::take(
            self.producers
                .get_mut()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        close_all(producers.into_values().collect());
    }
}

/// Closes `producers` side by side. Closing one waits out its polling
/// thread's current 100 ms poll, then librdkafka's shutdown; one after
/// another, a pipeline of 4 partitions took ~0.4 s to exit.
fn close_all(producers: Vec<Arc<TxnProducer>>) {
    std::thread::scope(|scope| {
        for producer in producers {
            scope.spawn(move || drop(producer));
        }
    });
}

/// What the log says when a producer can commit no more.
const REPLACED: &str = "its transaction is void; this producer is replaced and the partition \
                        read again from the checkpoint (which fences anew)";

/// What a failed transaction leaves the loop to do.
pub(crate) enum Step {
    /// This producer can never commit again (fenced by a newer owner, or
    /// left in a state no abort clears): nothing of the batch landed; the
    /// loop re-reads the checkpoint, which fences anew with a new producer.
    Replace,
    /// A sink error the loop acts on (retriable: the batch is sent again).
    Failed(SinkError),
}

/// One transaction of `producer`, as every commit of this sink makes it:
/// begin; `fill` produces its records and returns the offsets that go with
/// them; the offsets, sent for `group`; every record acknowledged (before
/// the commit, whose own flush would wait 100 ms more); the commit. A
/// failure before the commit (nothing landed) is handled by
/// [`after_failure`], the commit by [`commit_with_retry`]. `tp` names the
/// transaction in errors.
pub(crate) fn in_transaction(
    producer: &TxnProducer,
    group: &ConsumerGroupMetadata,
    tp: &TopicPartition,
    fill: impl FnOnce() -> Result<TopicPartitionList, (String, KafkaError)>,
) -> Result<(), Step> {
    let step = |what: &str, result: Result<(), KafkaError>| {
        result.map_err(|e| (format!("{what} ({tp})"), e))
    };
    let sent = (|| {
        step("begin_transaction", producer.begin_transaction())?;
        let offsets = fill()?;
        step(
            "send_offsets_to_transaction",
            producer.send_offsets_to_transaction(&offsets, group, BROKER_TIMEOUT),
        )?;
        step(
            "waiting for the transaction's records to be acknowledged",
            wait_delivered(producer, BROKER_TIMEOUT),
        )
    })();
    if let Err((what, e)) = sent {
        return Err(after_failure(producer, what, e));
    }
    commit_with_retry(producer, tp)
}

/// After `what` failed with `e` before the commit: a fenced producer is
/// replaced; an abortable transaction is aborted and the batch sent again
/// by the same producer; one that cannot be aborted is replaced too.
fn after_failure(producer: &TxnProducer, what: String, e: KafkaError) -> Step {
    if let Some(step) = fatal(producer, &what, &e) {
        return step;
    }
    match producer.abort_transaction(ABORT_TIMEOUT) {
        Ok(()) => Step::Failed(broker_error(what, e)),
        Err(abort) => {
            tracing::warn!(
                "{what}: {e}; the abort failed too ({abort}), as it does once a newer owner fenced \
                 this producer: {REPLACED}"
            );
            Step::Replace
        }
    }
}

/// `Some` if the producer is in a fatal state (librdkafka raises it in the
/// background, so the error a call returns may only say "erroneous
/// state"): fenced means replace it, anything else stops the pipeline.
fn fatal(producer: &TxnProducer, what: &str, e: &KafkaError) -> Option<Step> {
    // The broker's codes, and librdkafka's local one for a fence it
    // learned of in the background (say, adding a partition to the
    // transaction): the same fact, whichever call meets it first.
    let fenced_by = |code: RDKafkaErrorCode| {
        matches!(
            code,
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::Fenced
        )
    };
    let code = match producer.client().fatal_error() {
        Some((code, _)) => code,
        None if e.rdkafka_error_code().is_some_and(fenced_by) => RDKafkaErrorCode::ProducerFenced,
        None => return None,
    };
    if fenced_by(code) {
        tracing::warn!(
            "{what}: {e}: a newer owner of this partition fenced this producer: {REPLACED}"
        );
        return Some(Step::Replace);
    }
    Some(Step::Failed(SinkError::database(
        format!("{what}: the producer failed fatally ({code:?})"),
        e.clone(),
    )))
}

/// Commits, retrying what librdkafka calls retriable (the outcome is then
/// unknown, and committing again is what resolves it); a commit that needs
/// an abort is handled as a failure before the commit (nothing landed);
/// past [`COMMIT_RETRY`] the
/// outcome is reported unknown and the loop reads the checkpoint back.
fn commit_with_retry(producer: &TxnProducer, tp: &TopicPartition) -> Result<(), Step> {
    let mut backoff = COMMIT_RETRY.start();
    loop {
        let e = match producer.commit_transaction(BROKER_TIMEOUT) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if let Some(step) = fatal(producer, &format!("commit_transaction ({tp})"), &e) {
            return Err(step);
        }
        match &e {
            KafkaError::Transaction(rd) if rd.txn_requires_abort() => {
                return Err(after_failure(
                    producer,
                    format!("commit_transaction ({tp})"),
                    e,
                ));
            }
            KafkaError::Transaction(rd) if rd.is_retriable() => {
                let Some(wait) = backoff.next_wait() else {
                    return Err(Step::Failed(SinkError::commit_unknown(
                        format!("commit_transaction ({tp})"),
                        e,
                    )));
                };
                tracing::warn!("commit_transaction ({tp}): {e}; committing again");
                std::thread::sleep(wait);
            }
            _ => {
                return Err(Step::Failed(SinkError::commit_unknown(
                    format!("commit_transaction ({tp})"),
                    e,
                )));
            }
        }
    }
}

/// A broker call that failed: retriable ones make the sink unavailable
/// (the loop retries), fatal ones stop the pipeline.
pub(crate) fn broker_error(what: String, e: KafkaError) -> SinkError {
    let retriable = match &e {
        KafkaError::Transaction(rd) => !rd.is_fatal(),
        _ => true,
    };
    if retriable {
        SinkError::unavailable(what, e)
    } else {
        SinkError::database(what, e)
    }
}
