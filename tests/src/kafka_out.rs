//! The Kafka sink as the tests see it: its topics (output, dead letters,
//! lineage), the group offsets its transactions move, and the checks of its
//! output and lineage, read by librdkafka's `read_committed` or, where
//! aborted output exists, by the broker's transaction markers (this
//! broker's `read_committed` shows aborted records: docs/kafka.md).
//!
//! It must not decide what is correct: the expected records come from an
//! independent `read_committed` read of the input.

use crate::markers::read_committed_by_markers;
use crate::scenarios::{PARTITIONS, TestSink};
use crate::{
    Consumed, PipelineToml, Seen, assert_entry_ranges_contiguous, create_topic, read_consumed,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;

/// An identity pipeline's output into Kafka: each input record once in
/// `{pipeline}-out`, key and value as they came, the source partition and
/// offset as headers.
pub struct KafkaOut {
    brokers: String,
    output: String,
    /// The offsets of the pipeline's group on its input (one consumer,
    /// asked again and again by the kill loop).
    offsets: GroupOffsets,
}

impl KafkaOut {
    /// The output of the pipeline `pipeline` reading `input`, its sink
    /// topics created ([`create_sink_topics`], output `{pipeline}-out`).
    pub fn create(brokers: &str, pipeline: &str, input: &str) -> KafkaOut {
        let output = format!("{pipeline}-out");
        create_sink_topics(brokers, pipeline, &output);
        let group = format!("sluice-{pipeline}");
        KafkaOut {
            brokers: brokers.into(),
            output,
            offsets: GroupOffsets::new(brokers, &group, input, PARTITIONS),
        }
    }
}

impl KafkaOut {
    /// The output topic.
    pub fn output(&self) -> &str {
        &self.output
    }
}

impl TestSink for KafkaOut {
    fn label(&self) -> String {
        "kafka".into()
    }

    fn configure(&self, config: PipelineToml) -> PipelineToml {
        let output = self.output.clone();
        config
            .sink_url(&format!("kafka://{}", self.brokers))
            .targets(move |t| t.kafka(&output, "key", "value", &["partition", "offset"]))
    }

    /// The offsets the sink's transactions moved in the pipeline's group.
    async fn progress(&self, _pipeline: &str) -> i64 {
        self.offsets.total()
    }

    /// The output topic read by the broker's transaction markers (a killed
    /// or fenced transaction leaves aborted output), each record as the
    /// input record its headers name.
    async fn identity_output(&self) -> Vec<Seen> {
        let mut seen: Vec<Seen> =
            read_committed_by_markers(&self.brokers, &self.output, PARTITIONS)
                .into_iter()
                .map(|c| Seen {
                    partition: c.headers["partition"].parse().expect("partition header"),
                    offset: c.headers["offset"].parse().expect("offset header"),
                    key: c.key,
                    value: c.value,
                })
                .collect();
        seen.sort_by_key(|s| (s.partition, s.offset));
        seen
    }

    async fn assert_lineage(&self, pipeline: &str) -> usize {
        assert_lineage_contiguous(&self.brokers, pipeline, By::Markers)
    }

    /// Also: the records of a key keep their input order.
    async fn assert_identity_exactly_once(&self, pipeline: &str, expected: &[Seen]) -> usize {
        self.assert_lineage(pipeline).await;
        let out = read_committed_by_markers(&self.brokers, &self.output, PARTITIONS);
        assert_output_exactly_once(expected, &out);
        out.len()
    }
}

/// The sum of the group's committed offsets over `topic`'s partitions: it
/// grows with every committed batch.
pub struct GroupOffsets {
    consumer: BaseConsumer,
    topic: String,
    partitions: i32,
}

impl GroupOffsets {
    pub fn new(brokers: &str, group: &str, topic: &str, partitions: i32) -> GroupOffsets {
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .create()
            .expect("offsets consumer");
        GroupOffsets {
            consumer,
            topic: topic.to_string(),
            partitions,
        }
    }

    pub fn total(&self) -> i64 {
        self.each().iter().map(|o| o.unwrap_or(0)).sum()
    }

    /// Each partition's committed offset (`None`: none, or unreadable).
    pub fn each(&self) -> Vec<Option<i64>> {
        let mut list = TopicPartitionList::new();
        for p in 0..self.partitions {
            list.add_partition(&self.topic, p);
        }
        let Ok(committed) = self
            .consumer
            .committed_offsets(list, Duration::from_secs(10))
        else {
            return vec![None; self.partitions as usize];
        };
        committed
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
            .collect()
    }
}

/// Waits until `topic` holds `count` records committed by the broker's
/// transaction markers, failing after `limit` with what `logs` says. Where
/// two instances commit at once this, not the group's offsets, is the sign
/// that every record is through: the broker can keep a committed
/// transaction's offsets pending for good (docs/kafka.md, "offsets left
/// pending").
pub async fn wait_for_committed_output(
    brokers: &str,
    topic: &str,
    count: usize,
    limit: Duration,
    logs: impl Fn() -> String,
) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let committed = read_committed_by_markers(brokers, topic, PARTITIONS).len();
        if committed >= count {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{topic} holds {committed} of {count} records committed\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The sink's topics for `pipeline`: output, dead letters, lineage.
pub fn create_sink_topics(brokers: &str, pipeline: &str, output: &str) {
    create_topic(brokers, output, PARTITIONS);
    create_topic(brokers, &format!("{pipeline}.dead-letters"), 1);
    create_topic(brokers, &format!("{pipeline}.lineage"), 1);
}

/// How an output topic is read: librdkafka's `read_committed`, or the
/// broker's transaction markers (where aborted output exists).
#[derive(Clone, Copy)]
pub enum By {
    Librdkafka,
    Markers,
}

/// The lineage topic's committed entries: their ranges contiguous per
/// partition (each batch starts where the one before ended: no batch
/// committed twice, none skipped). Returns how many there are.
pub fn assert_lineage_contiguous(brokers: &str, pipeline: &str, by: By) -> usize {
    let topic = format!("{pipeline}.lineage");
    let entries = match by {
        By::Librdkafka => read_consumed(brokers, &topic, 1),
        By::Markers => read_committed_by_markers(brokers, &topic, 1),
    };
    for e in &entries {
        assert_eq!(
            e.key.as_deref(),
            Some(pipeline),
            "lineage keyed by pipeline"
        );
    }
    let checked = std::panic::catch_unwind(|| {
        assert_entry_ranges_contiguous(entries.iter().map(|e| e.value.as_str()))
    });
    if let Err(failed) = checked {
        let dump = std::env::temp_dir().join(format!("sluice-{topic}-raw.txt"));
        let _ = std::fs::write(&dump, crate::markers::dump_raw(brokers, &topic, 1));
        eprintln!("the lineage topic's raw log: {}", dump.display());
        std::panic::resume_unwind(failed);
    }
    entries.len()
}

/// Every committed input record is in the output exactly once, its key and
/// value unchanged, its headers naming where it came from, and the records
/// of a key in input order.
pub fn assert_output_exactly_once(input: &[Seen], output: &[Consumed]) {
    let mut by_origin: BTreeMap<(i32, i64), &Consumed> = BTreeMap::new();
    for o in output {
        let origin = (
            o.headers["partition"]
                .parse::<i32>()
                .expect("partition header"),
            o.headers["offset"].parse::<i64>().expect("offset header"),
        );
        assert!(
            by_origin.insert(origin, o).is_none(),
            "input record {origin:?} is in the output twice"
        );
    }
    for i in input {
        let o = by_origin.get(&(i.partition, i.offset)).unwrap_or_else(|| {
            panic!(
                "input record {}:{} is not in the output",
                i.partition, i.offset
            )
        });
        assert_eq!(
            (&o.key, &o.value),
            (&i.key, &i.value),
            "record {}:{}",
            i.partition,
            i.offset
        );
    }
    assert_eq!(
        by_origin.len(),
        input.len(),
        "output holds records not in the committed input"
    );
    // Per key: one output partition, offsets rising in input order.
    let mut last: BTreeMap<&str, (i32, i64)> = BTreeMap::new();
    for o in output {
        let key = o.key.as_deref().expect("keyed");
        let origin = (
            o.headers["partition"].parse().unwrap(),
            o.headers["offset"].parse().unwrap(),
        );
        if let Some(before) = last.insert(key, origin) {
            assert!(
                before < origin,
                "key {key}: {origin:?} came after {before:?}"
            );
        }
    }
}
