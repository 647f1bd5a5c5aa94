//! A tiny Kafka client for the quickstart and manual runs (Debian's kcat is
//! too old for Tansu): create a topic, produce a file's lines, print what
//! a topic holds.
//!
//!   kafka-tool create-topic BROKERS TOPIC PARTITIONS
//!   kafka-tool produce BROKERS TOPIC FILE      (line i goes to partition i % n)
//!   kafka-tool consume BROKERS TOPIC           (read_committed, to the end:
//!                                               one `key value [headers]` line each)

use sluice_tests::{Produce, create_topic, produce, read_consumed};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["create-topic", brokers, topic, partitions] => {
            create_topic(
                brokers,
                topic,
                partitions.parse().expect("partitions is a number"),
            );
            println!("created topic {topic}");
        }
        ["produce", brokers, topic, file] => {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {file}: {e}"));
            let partitions = partition_count(brokers, topic);
            let records: Vec<Produce> = text
                .lines()
                .enumerate()
                .map(|(i, line)| Produce {
                    partition: (i as i32) % partitions,
                    key: Some(i.to_string()),
                    value: line.to_string(),
                })
                .collect();
            produce(brokers, topic, &records);
            println!("produced {} records to {topic}", records.len());
        }
        ["consume", brokers, topic] => {
            for r in read_consumed(brokers, topic, partition_count(brokers, topic)) {
                let key = r.key.as_deref().unwrap_or("-");
                match r.headers.is_empty() {
                    true => println!("{key} {}", r.value),
                    false => println!("{key} {} {:?}", r.value, r.headers),
                }
            }
        }
        _ => {
            eprintln!(
                "usage: kafka-tool create-topic BROKERS TOPIC PARTITIONS | produce BROKERS TOPIC FILE \
                 | consume BROKERS TOPIC"
            );
            std::process::exit(2);
        }
    }
}

fn partition_count(brokers: &str, topic: &str) -> i32 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("client");
    let md = c
        .fetch_metadata(Some(topic), std::time::Duration::from_secs(10))
        .expect("metadata");
    md.topics()
        .first()
        .map(|t| t.partitions().len() as i32)
        .filter(|&n| n > 0)
        .expect("topic exists")
}
