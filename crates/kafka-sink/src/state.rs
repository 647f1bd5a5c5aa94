//! Keyed state on an exactly-once Kafka sink, read back from its changelog
//! topic (laid out and judged by [`crate::changelog`]): a partition's
//! committed state is restored whole, reading the changelog partition from
//! its start to the group's committed position twice (its seals first,
//! then the changes the seals' chain names).
//!
//! The pipeline's cache holds what this restores; a key is never looked up
//! alone for it (each lookup would read the whole partition), so a
//! partition whose state does not fit the cache is a clear error there.
//! `sluice state get` may look one up that way.
//!
//! It must not write: changes are written only by the sink's transaction.

use crate::changelog::{Chain, Entry, Seal, TAG_HEADER};
use crate::client::{BROKER_TIMEOUT, Cluster};
use crate::section::{KafkaSection, KafkaSinkFields};
use crate::to_end::{EndIsNotAnError, EndReadError, EndReader};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sluice_core::batch::TopicPartition;
use sluice_core::config::{KindSection, PipelineConfig};
use sluice_core::sink::SinkError;
use sluice_core::state::{StateError, StateStore, StateValue};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// How long restoring one partition may take.
const RESTORE_FOR: Duration = Duration::from_secs(300);
/// What `sluice state get` restores at most to look a key up.
const GET_MAX_BYTES: usize = 1 << 30;

/// Reads an exactly-once Kafka sink's keyed state from its changelog.
pub struct KafkaStateStore {
    inner: Arc<Changelogs>,
    /// Whether `get` may restore a whole partition to look one key up.
    key_lookups: bool,
}

/// Where a pipeline's changelogs are.
struct Changelogs {
    cluster: Cluster,
    group: String,
    config: PipelineConfig,
    fields: KafkaSinkFields,
}

impl KafkaStateStore {
    /// The store `sluice state` reads (a key looked up alone restores its
    /// partition).
    pub fn open(config: &PipelineConfig) -> Result<KafkaStateStore, SinkError> {
        Ok(KafkaStateStore {
            inner: Arc::new(Changelogs {
                cluster: Cluster::of(config)?,
                group: config.group_id(),
                config: config.clone(),
                fields: KafkaSection::sink(&config.sink)?,
            }),
            key_lookups: true,
        })
    }

    /// The store the pipeline's cache reads: partitions whole only.
    pub(crate) fn for_pipeline(config: &PipelineConfig) -> Result<KafkaStateStore, SinkError> {
        Ok(KafkaStateStore {
            key_lookups: false,
            ..KafkaStateStore::open(config)?
        })
    }

    async fn restore(
        &self,
        tp: &TopicPartition,
        max_bytes: usize,
    ) -> Result<Option<BTreeMap<Vec<u8>, StateValue>>, StateError> {
        let (inner, tp) = (Arc::clone(&self.inner), tp.clone());
        tokio::task::spawn_blocking(move || inner.restore(&tp, max_bytes))
            .await
            .map_err(StateError::unreadable)?
    }
}

#[async_trait::async_trait]
impl StateStore for KafkaStateStore {
    async fn load(
        &self,
        _pipeline: &str,
        tp: &TopicPartition,
        max_bytes: usize,
    ) -> Result<Option<Vec<(Vec<u8>, StateValue)>>, StateError> {
        Ok(self
            .restore(tp, max_bytes)
            .await?
            .map(|state| state.into_iter().collect()))
    }

    async fn get(
        &self,
        _pipeline: &str,
        tp: &TopicPartition,
        key: &[u8],
    ) -> Result<Option<StateValue>, StateError> {
        if !self.key_lookups {
            return Err(StateError::Unsupported(format!(
                "the keyed state of {tp} is more than the state cache has room for \
                 (`limits.state_cache_mib`): an exactly-once Kafka sink restores a partition's \
                 state whole from its changelog topic, so the cache must hold it; raise the limit"
            )));
        }
        match self.restore(tp, GET_MAX_BYTES).await? {
            Some(mut state) => Ok(state.remove(key)),
            None => Err(StateError::Unsupported(format!(
                "the keyed state of {tp} is over {} MiB",
                GET_MAX_BYTES >> 20
            ))),
        }
    }
}

impl Changelogs {
    /// The committed state of `tp`, if it takes at most `max_bytes`.
    fn restore(
        &self,
        tp: &TopicPartition,
        max_bytes: usize,
    ) -> Result<Option<BTreeMap<Vec<u8>, StateValue>>, StateError> {
        let topic = self.fields.changelog_topic(&self.config, &tp.topic);
        let reader = self.reader(&topic, tp)?;
        let Some(end) = committed_end(reader.consumer(), &topic, tp.partition)? else {
            return Ok(Some(BTreeMap::new()));
        };
        let mut seals = HashMap::new();
        read_to(&reader, tp.partition, end, |m| {
            if let Entry::Seal = Entry::of(m.key()) {
                seals.insert(m.offset(), Seal::decode(m.payload().unwrap_or_default())?);
            }
            Ok(true)
        })?;
        let chain = Chain::ending_at(end, &seals)?;
        let mut state = BTreeMap::new();
        let mut bytes = 0usize;
        read_to(&reader, tp.partition, end, |m| {
            let Entry::Change(key) = Entry::of(m.key()) else {
                return Ok(true);
            };
            if !chain.keeps(m.offset(), tag_of(m)) {
                return Ok(true);
            }
            let size = |v: &StateValue| key.len() + v.size();
            if let Some(old) = state.remove(key) {
                bytes -= size(&old);
            }
            if let Some(stored) = m.payload() {
                let value = StateValue::from_stored(stored)?;
                bytes += size(&value);
                state.insert(key.to_vec(), value);
            }
            Ok(bytes <= max_bytes)
        })?;
        Ok((bytes <= max_bytes).then_some(state))
    }

    /// A reader of every record of changelog `topic`, aborted or not (the
    /// chain judges them; a reader of committed records only could wait on
    /// a broker's stuck last stable offset), under the pipeline's group
    /// name for its committed offsets; the topic must have `tp`'s
    /// partition.
    fn reader(&self, topic: &str, tp: &TopicPartition) -> Result<EndReader, StateError> {
        let reader = match EndReader::open_all(self.cluster.client(), &self.group, topic) {
            Ok(reader) => reader,
            Err(EndReadError::NoTopic(_)) => {
                return Err(StateError::Unsupported(missing_changelog(topic, tp)));
            }
            Err(e) => return Err(StateError::unreadable(e)),
        };
        match reader.partitions().contains(&tp.partition) {
            true => Ok(reader),
            false => Err(StateError::Unsupported(format!(
                "the changelog topic `{topic}` has {} partitions, too few for input partition \
                 {tp}: it needs as many as the input topic",
                reader.partitions().len()
            ))),
        }
    }
}

/// Why a stateful module cannot run without the changelog topic.
pub(crate) fn missing_changelog(topic: &str, tp: &TopicPartition) -> String {
    format!(
        "the module keeps keyed state, which an exactly-once Kafka sink keeps in the changelog \
         topic `{topic}` (`sink.state_topic`), and it does not exist: create it compacted \
         (cleanup.policy=compact) with as many partitions as `{}` (the Kafka sink never creates \
         topics)",
        tp.topic
    )
}

/// The state record's tag.
fn tag_of<'a>(m: &'a BorrowedMessage<'_>) -> Option<&'a [u8]> {
    m.headers()?
        .iter()
        .find(|h| h.key == TAG_HEADER)
        .and_then(|h| h.value)
}

/// The group's stable committed offset of the changelog partition: just
/// past its newest committed seal (`None`: no batch has changed state).
fn committed_end(
    reader: &BaseConsumer<EndIsNotAnError>,
    topic: &str,
    partition: i32,
) -> Result<Option<i64>, StateError> {
    let mut list = TopicPartitionList::new();
    list.add_partition(topic, partition);
    let committed = reader
        .committed_offsets(list, BROKER_TIMEOUT)
        .map_err(StateError::unreadable)?;
    Ok(committed.elements().iter().find_map(|e| match e.offset() {
        Offset::Offset(o) if o > 0 => Some(o),
        _ => None,
    }))
}

/// Reads `partition` from its start through offset `end - 1`, handing
/// each record to `take` until it says to stop or fails.
fn read_to(
    reader: &EndReader,
    partition: i32,
    end: i64,
    mut take: impl FnMut(&BorrowedMessage<'_>) -> Result<bool, StateError>,
) -> Result<(), StateError> {
    // Why the read ended: the last record reached, `take` done or failed.
    let mut ended: Option<Result<(), StateError>> = None;
    reader
        .read(&[partition], RESTORE_FOR, |m| {
            let result = match m.offset() >= end {
                true => Ok(false),
                false => take(m).map(|more| more && m.offset() < end - 1),
            };
            match result {
                Ok(true) => true,
                Ok(false) => {
                    ended = Some(Ok(()));
                    false
                }
                Err(e) => {
                    ended = Some(Err(e));
                    false
                }
            }
        })
        .map_err(StateError::unreadable)?;
    match ended {
        Some(result) => result,
        None => Err(StateError::Corrupt(format!(
            "the changelog [{partition}] ends before its committed position {end}"
        ))),
    }
}
