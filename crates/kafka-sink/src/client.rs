//! The librdkafka plumbing both Kafka sinks share: the brokers a
//! `kafka://` URL names and the properties every client of the sink gets
//! ([`Cluster`]), the check that every topic written exists, queueing one
//! record on a producer and waiting for every record's acknowledgement.
//!
//! It must not decide what a batch sends (that is `records`) or when it
//! counts as committed (that is each sink).

use crate::records::OutRecord;
use crate::section::KafkaSection;
use rdkafka::client::Client;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};
use sluice_core::config::{KindSection, PipelineConfig};
use sluice_core::sink::SinkError;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long one broker call (metadata, init, offsets, commit) may take.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(30);

/// The brokers of a Kafka sink and what every client of it is configured
/// with (`sink.properties`: TLS, SASL).
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The bootstrap servers, as the URL names them.
    pub brokers: String,
    properties: BTreeMap<String, String>,
}

impl Cluster {
    /// The cluster `config`'s sink writes to.
    pub fn of(config: &PipelineConfig) -> Result<Cluster, SinkError> {
        Ok(Cluster {
            brokers: brokers_of(&config.sink.url)?,
            properties: KafkaSection::sink(&config.sink)?.properties,
        })
    }

    /// A client of the brokers with the sink's properties.
    pub fn client(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        config
    }

    /// The settings every producer of the sink shares: partitioning by
    /// key as the Java client does, a short linger, and a bounded queue,
    /// so a module that floods its output is held back (`send` waits while
    /// the queue is full) instead of queueing it all in the host's memory.
    /// The sink's properties may change all but the partitioner.
    pub fn producer(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "100000")
            .set("queue.buffering.max.kbytes", "65536");
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        config
            .set("bootstrap.servers", &self.brokers)
            .set("partitioner", "murmur2_random");
        config
    }
}

/// Every topic in `wanted`, and the `lineage` topic if given, exists on
/// the brokers `client` talks to (the sink never creates one: partitions,
/// retention and compaction are the operator's choice). `unreachable`
/// makes the error of a metadata read that failed.
pub fn check_topics<C: ClientContext>(
    client: &Client<C>,
    brokers: &str,
    wanted: &[&str],
    lineage: Option<&str>,
    unreachable: impl FnOnce(KafkaError) -> SinkError,
) -> Result<(), SinkError> {
    let metadata = client
        .fetch_metadata(None, BROKER_TIMEOUT)
        .map_err(unreachable)?;
    let exists = |name: &str| {
        metadata
            .topics()
            .iter()
            .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty())
    };
    if let Some(topic) = wanted.iter().find(|t| !exists(t)) {
        return Err(SinkError::Config(format!(
            "topic `{topic}` does not exist on {brokers}: create it (the Kafka sink never \
             creates topics)"
        )));
    }
    match lineage.filter(|t| !exists(t)) {
        Some(topic) => Err(SinkError::Config(format!(
            "the lineage topic `{topic}` does not exist on {brokers}: create it, time-retained \
             rather than compacted (its entries are keyed by pipeline, so compaction would keep \
             only the newest batch's; the Kafka sink never creates topics)"
        ))),
        None => Ok(()),
    }
}

/// Queues `r` on `producer`, waiting while its queue is full.
pub fn send<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &ThreadedProducer<C>,
    r: &OutRecord<'_>,
) -> Result<(), KafkaError> {
    let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
    for (name, value) in &r.headers {
        headers = headers.insert(Header {
            key: name,
            value: value.as_deref(),
        });
    }
    let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(r.topic).headers(headers);
    if let Some(partition) = r.partition {
        record = record.partition(partition);
    }
    if let Some(key) = &r.key {
        record = record.key(key);
    }
    if let Some(value) = &r.value {
        record = record.payload(value);
    }
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Waits until every record queued on `producer` is acknowledged or has
/// failed (its delivery report served by the producer's polling thread).
///
/// This stands in for rdkafka's `flush`, which, with anything outstanding,
/// polls in slices that each last their whole 100 ms: every batch's
/// flush, and the one `commit_transaction` starts with, took at least
/// 100 ms, whatever the batch (a 200-record transaction committed in ~100
/// ms on a broker that commits it in ~5). Once this returns, the
/// `commit_transaction` flush finds nothing outstanding and goes straight
/// to the commit. The 0.5 ms step bounds what waiting here adds.
pub fn wait_delivered<C: ProducerContext>(
    producer: &ThreadedProducer<C>,
    timeout: Duration,
) -> Result<(), KafkaError> {
    let started = Instant::now();
    while producer.in_flight_count() > 0 {
        if started.elapsed() > timeout {
            return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    Ok(())
}

/// The bootstrap servers a `kafka://host:port[,host:port]` URL names.
pub fn brokers_of(url: &str) -> Result<String, SinkError> {
    let brokers = url
        .strip_prefix("kafka://")
        .map(|rest| rest.trim_end_matches('/'))
        .unwrap_or("");
    if brokers.is_empty() || brokers.contains('/') || brokers.contains('@') {
        return Err(SinkError::Config(format!(
            "`{url}` is not a Kafka sink URL: use kafka://HOST:PORT (comma-separated for several)"
        )));
    }
    Ok(brokers.to_string())
}

#[cfg(test)]
mod tests {
    use super::brokers_of;

    #[test]
    fn a_kafka_url_names_its_brokers() {
        assert_eq!(brokers_of("kafka://a:9092").unwrap(), "a:9092");
        assert_eq!(brokers_of("kafka://a:1,b:2/").unwrap(), "a:1,b:2");
        for bad in [
            "kafka://",
            "kafka://user@a:1",
            "kafka://a:1/db",
            "redis://a:1",
        ] {
            let e = brokers_of(bad).unwrap_err().to_string();
            assert!(e.contains("not a Kafka sink URL"), "{bad}: {e}");
        }
    }
}
