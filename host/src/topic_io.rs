//! `sluice produce` and `sluice consume`: sample lines ([`crate::sample`])
//! into a topic, and a topic's committed records back into sample lines, so
//! a sample, a topic and a dead letter's `--sample` are interchangeable.
//!
//! It must not run modules or touch a sink: it is how a user gets data in
//! and out around a pipeline.

use crate::sample::{self, SampleLine};
use crate::sink::kafka::to_end::{EndReadError, EndReader, partitions_of};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long the broker has to create a topic.
const BROKER_TIMEOUT: Duration = Duration::from_secs(15);

/// Where the topic is: brokers, and librdkafka properties (TLS, SASL) as a
/// pipeline's `[source.properties]` gives them.
#[derive(Debug, Clone)]
pub struct Brokers {
    pub brokers: String,
    pub properties: BTreeMap<String, String>,
}

impl Brokers {
    fn client(&self) -> ClientConfig {
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", &self.brokers);
        for (k, v) in &self.properties {
            client.set(k, v);
        }
        client
    }
}

/// Why records could not be produced or consumed.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    /// A line of the sample does not read; nothing was produced.
    #[error("line {line}: {message}")]
    Sample { line: usize, message: String },
    #[error("topic `{0}` does not exist")]
    NoTopic(String),
    /// A line names a partition the topic does not have; nothing was
    /// produced.
    #[error("line {line}: `{topic}` has no partition {partition} (it has {count})")]
    NoPartition {
        line: usize,
        topic: String,
        partition: i32,
        count: usize,
    },
    #[error("reading `{topic}`")]
    Read {
        topic: String,
        #[source]
        source: EndReadError,
    },
    #[error("kafka: {context}")]
    Kafka {
        context: String,
        #[source]
        source: KafkaError,
    },
}

fn kafka(context: impl Into<String>) -> impl FnOnce(KafkaError) -> TopicError {
    let context = context.into();
    move |source| TopicError::Kafka { context, source }
}

/// What a produce did: records per partition.
#[derive(Debug, Default)]
pub struct Produced {
    pub partitions: BTreeMap<i32, usize>,
}

impl Produced {
    pub fn records(&self) -> usize {
        self.partitions.values().sum()
    }
}

/// The number of partitions of `topic`.
fn partition_count(at: &Brokers, topic: &str) -> Result<usize, TopicError> {
    let probe: BaseConsumer = at.client().create().map_err(kafka("client"))?;
    let partitions = tokio::task::block_in_place(|| partitions_of(&probe, topic));
    Ok(partitions.map_err(|e| read_error(topic, e))?.len())
}

/// A read's failure: a missing topic is said as produce says it.
fn read_error(topic: &str, e: EndReadError) -> TopicError {
    match e {
        EndReadError::NoTopic(t) => TopicError::NoTopic(t),
        e => TopicError::Read {
            topic: topic.to_string(),
            source: e,
        },
    }
}

/// Creates `topic` with `partitions` partitions (replication 1: a local
/// or test broker; production topics are the operator's) unless it exists.
/// Returns true if it made it.
pub async fn create_if_missing(
    at: &Brokers,
    topic: &str,
    partitions: i32,
) -> Result<bool, TopicError> {
    match partition_count(at, topic) {
        Ok(_) => return Ok(false),
        Err(TopicError::NoTopic(_)) => {}
        Err(e) => return Err(e),
    }
    let admin: AdminClient<DefaultClientContext> =
        at.client().create().map_err(kafka("admin client"))?;
    let made = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(BROKER_TIMEOUT)),
        )
        .await
        .map_err(kafka(format!("creating `{topic}`")))?;
    for result in made {
        result
            .map_err(|(_, code)| kafka(format!("creating `{topic}`"))(KafkaError::AdminOp(code)))?;
    }
    Ok(true)
}

/// Produces every record of the sample `text` to `topic`, in order, each to
/// its line's `partition` (or where the producer's partitioner puts its
/// key), with its `timestamp` (or now, if absent or negative), key, value
/// and headers. A line's
/// `topic` and `offset` are not used: the topic is `topic`, the broker
/// gives offsets. Every line is read, and every partition checked, before
/// anything is sent; returns once the broker acknowledged every record.
pub async fn produce(to: &Brokers, topic: &str, text: &str) -> Result<Produced, TopicError> {
    let lines =
        sample::lines(text).map_err(|(line, message)| TopicError::Sample { line, message })?;
    let count = partition_count(to, topic)?;
    if let Some((line, l)) = lines
        .iter()
        .find(|(_, l)| l.partition.is_some_and(|p| p as usize >= count))
    {
        return Err(TopicError::NoPartition {
            line: *line,
            topic: topic.to_string(),
            partition: l.partition.unwrap_or_default(),
            count,
        });
    }
    let producer: FutureProducer = to
        .client()
        .set("enable.idempotence", "true")
        .create()
        .map_err(kafka("producer"))?;
    let mut sends = Vec::with_capacity(lines.len());
    for (line, l) in &lines {
        let mut next = record(topic, l);
        loop {
            match producer.send_result(next) {
                Ok(delivery) => break sends.push(delivery),
                // The producer's queue is full: wait for deliveries.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    next = back;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((e, _)) => return Err(kafka(format!("line {line}: sending to `{topic}`"))(e)),
            }
        }
    }
    let mut produced = Produced::default();
    for (send, (line, _)) in sends.into_iter().zip(&lines) {
        let delivery = send.await.map_err(|_| TopicError::Kafka {
            context: format!("line {line}: the producer went away"),
            source: KafkaError::Canceled,
        })?;
        let delivered =
            delivery.map_err(|(e, _)| kafka(format!("line {line}: delivery to `{topic}`"))(e))?;
        *produced.partitions.entry(delivered.partition).or_default() += 1;
    }
    Ok(produced)
}

fn record<'a>(topic: &'a str, l: &'a SampleLine) -> FutureRecord<'a, [u8], [u8]> {
    let mut record = FutureRecord::to(topic);
    if let Some(p) = l.partition {
        record = record.partition(p);
    }
    // A negative time (a dead letter stored before sluice kept times says
    // -1) is no time: the producer's.
    if let Some(ts) = l.timestamp.filter(|ts| *ts >= 0) {
        record = record.timestamp(ts);
    }
    if let Some(key) = &l.key {
        record = record.key(key.as_slice());
    }
    if let Some(value) = &l.value {
        record = record.payload(value.as_slice());
    }
    if !l.headers.is_empty() {
        let headers = l
            .headers
            .iter()
            .fold(OwnedHeaders::new(), |h, (key, value)| {
                h.insert(Header {
                    key,
                    value: value.as_deref(),
                })
            });
        record = record.headers(headers);
    }
    record
}

/// Which records `consume` reads.
#[derive(Debug, Default)]
pub struct Consume {
    /// Only this partition (all by default).
    pub partition: Option<i32>,
    /// At most this many records (all by default).
    pub max_records: Option<usize>,
}

/// How long a consume may read before it gives up.
const READ_FOR: Duration = Duration::from_secs(120);

/// The committed records of `topic` (`read_committed`), from the start of
/// each partition to its end as the read finds it, in partition and offset
/// order, as sample lines naming their topic, partition, offset and time.
pub fn consume(
    from: &Brokers,
    topic: &str,
    which: &Consume,
) -> Result<Vec<SampleLine>, TopicError> {
    let group = format!("sluice-consume-{topic}");
    let reader = EndReader::open(from.client(), &group, topic).map_err(|e| read_error(topic, e))?;
    let count = reader.partitions().len();
    let wanted: Vec<i32> = match which.partition {
        Some(p) if p >= 0 && (p as usize) < count => vec![p],
        Some(p) => {
            return Err(TopicError::NoPartition {
                line: 0,
                topic: topic.to_string(),
                partition: p,
                count,
            });
        }
        None => reader.partitions().to_vec(),
    };
    let max = which.max_records.unwrap_or(usize::MAX);
    let mut lines = Vec::new();
    if max > 0 {
        reader
            .read(&wanted, READ_FOR, |m| {
                lines.push(line_of(m));
                lines.len() < max
            })
            .map_err(|e| read_error(topic, e))?;
    }
    lines.sort_by_key(|l| (l.partition, l.offset));
    Ok(lines)
}

fn line_of(m: &rdkafka::message::BorrowedMessage<'_>) -> SampleLine {
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
    SampleLine {
        topic: Some(m.topic().to_string()),
        partition: Some(m.partition()),
        offset: Some(m.offset()),
        timestamp: m.timestamp().to_millis(),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
    }
}
