//! Reading a topic's committed records from the start of its partitions to
//! their ends: what `verify` does to the lineage topic, `sluice consume` to
//! any topic and a state restore to a changelog partition (every record
//! there: it judges them itself). One consumer, assigned (never
//! subscribed, nothing committed), ending each partition where a fetch
//! reports its end (some brokers answer ListOffsets wrong, none a fetch).
//!
//! It must not decide what a record means: the caller's `take` does.

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// How long a metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(15);

/// The context of a consumer that reads to the end of its partitions
/// (`enable.partition.eof`): librdkafka also reports each end reached as a
/// client error, which the default context logs at ERROR. An end is not an
/// error; every other one is logged as before.
pub struct EndIsNotAnError;

impl ClientContext for EndIsNotAnError {
    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::PartitionEOF(_))
            && error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF)
        {
            tracing::error!("librdkafka: {error}: {reason}");
        }
    }
}

impl ConsumerContext for EndIsNotAnError {}

/// Why a read to the end stopped short.
#[derive(Debug, thiserror::Error)]
pub enum EndReadError {
    #[error("topic `{0}` does not exist")]
    NoTopic(String),
    #[error("reading `{topic}` took over {limit:?}")]
    TookTooLong { topic: String, limit: Duration },
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// The partitions of `topic`, as the brokers `consumer` talks to say.
pub fn partitions_of<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
) -> Result<Vec<i32>, EndReadError> {
    let metadata = consumer.fetch_metadata(Some(topic), METADATA_TIMEOUT)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    match partitions.is_empty() {
        true => Err(EndReadError::NoTopic(topic.to_string())),
        false => Ok(partitions),
    }
}

/// A consumer of one topic, read from the start: `read_committed`, or
/// every record, aborted or not ([`EndReader::open_all`]).
pub struct EndReader {
    consumer: BaseConsumer<EndIsNotAnError>,
    topic: String,
    partitions: Vec<i32>,
}

impl EndReader {
    /// A consumer on `client` (brokers and properties set) under the group
    /// name `group` (never joined: it only names the client), and the
    /// partitions of `topic`.
    pub fn open(client: ClientConfig, group: &str, topic: &str) -> Result<Self, EndReadError> {
        Self::open_as(client, group, topic, "read_committed")
    }

    /// As [`EndReader::open`], but reading every record, aborted or not
    /// (for a caller that judges them itself, and must not wait on a
    /// broker's stuck last stable offset).
    pub fn open_all(client: ClientConfig, group: &str, topic: &str) -> Result<Self, EndReadError> {
        Self::open_as(client, group, topic, "read_uncommitted")
    }

    fn open_as(
        mut client: ClientConfig,
        group: &str,
        topic: &str,
        isolation: &str,
    ) -> Result<Self, EndReadError> {
        let consumer: BaseConsumer<EndIsNotAnError> = client
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", isolation)
            .set("enable.partition.eof", "true")
            .set("fetch.wait.max.ms", "50")
            .create_with_context(EndIsNotAnError)?;
        let partitions = partitions_of(&consumer, topic)?;
        Ok(EndReader {
            consumer,
            topic: topic.to_string(),
            partitions,
        })
    }

    /// Every partition of the topic.
    pub fn partitions(&self) -> &[i32] {
        &self.partitions
    }

    /// The consumer (to ask its group's committed offsets; it never joins
    /// the group).
    pub fn consumer(&self) -> &BaseConsumer<EndIsNotAnError> {
        &self.consumer
    }

    /// Reads `partitions` from their start, handing each record to `take`,
    /// until every one has reported its end or `take` says to stop
    /// (returns false); fails past `limit`.
    pub fn read(
        &self,
        partitions: &[i32],
        limit: Duration,
        mut take: impl FnMut(&BorrowedMessage<'_>) -> bool,
    ) -> Result<(), EndReadError> {
        let mut list = TopicPartitionList::new();
        for &p in partitions {
            list.add_partition_offset(&self.topic, p, Offset::Beginning)?;
        }
        self.consumer.assign(&list)?;
        let mut at_end: BTreeSet<i32> = BTreeSet::new();
        let started = Instant::now();
        while at_end.len() < partitions.len() {
            if started.elapsed() > limit {
                return Err(EndReadError::TookTooLong {
                    topic: self.topic.clone(),
                    limit,
                });
            }
            match self.consumer.poll(Duration::from_millis(200)) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    at_end.insert(p);
                }
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(m)) if !take(&m) => break,
                Some(Ok(_)) => {}
            }
        }
        Ok(())
    }
}
