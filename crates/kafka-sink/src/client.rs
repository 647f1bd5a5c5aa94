//! The librdkafka plumbing both Kafka sinks share: the broker list of a
//! `kafka://` URL, the check that every topic written exists, and queueing
//! one record on a producer.
//!
//! It must not decide what a batch sends (that is `records`) or when it
//! counts as committed (that is each sink).

use crate::records::OutRecord;
use rdkafka::client::Client;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};
use sluice_core::sink::SinkError;
use std::time::Duration;

/// How long one broker call (metadata, init, offsets, commit) may take.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(30);

/// The settings every producer of the sink shares: partitioning by key
/// as the Java client does, a short linger, and a bounded queue, so a
/// module that floods its output is held back (`send` waits while the
/// queue is full) instead of queueing it all in the host's memory.
pub fn producer_config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "100000")
        .set("queue.buffering.max.kbytes", "65536");
    config
}

/// Every topic in `wanted` exists on the brokers `client` talks to (the
/// sink never creates one: partitions, retention and compaction are the
/// operator's choice).
pub fn check_topics<C: ClientContext>(
    client: &Client<C>,
    brokers: &str,
    wanted: &[&str],
) -> Result<(), SinkError> {
    let metadata = client
        .fetch_metadata(None, BROKER_TIMEOUT)
        .map_err(|e| SinkError::unavailable(format!("Kafka brokers {brokers}"), e))?;
    let exists = |name: &str| {
        metadata
            .topics()
            .iter()
            .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty())
    };
    match wanted.iter().find(|t| !exists(t)) {
        Some(missing) => Err(SinkError::Config(format!(
            "topic `{missing}` does not exist on {brokers}: create it (the Kafka sink never \
             creates topics; the lineage topic should be time-retained, not compacted)"
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
