//! Kafka → Wasm (identity) → Kafka throughput, as ratios measured in one
//! run on one machine, interleaved rounds over the same input topic:
//!
//! 1. a raw consume + produce loop written directly with rdkafka (a
//!    `read_committed` consumer assigned to every partition, a producer
//!    with the same batching as sluice's, each record's key and value
//!    copied with its origin in two headers; no transactions, no offsets:
//!    the fastest a hand-written job can be);
//! 2. sluice, exactly-once (the default): one producer transaction per
//!    batch and partition, offsets sent in it;
//! 3. sluice, `guarantee = "at-least-once"`: an idempotent producer without
//!    transactions, offsets committed afterwards (in the state store).
//!
//! Each is timed as a whole: the raw loop from creating its clients to its
//! last record acknowledged, sluice from process start to exit
//! (`run --until-caught-up`, partitions statically assigned, so no group
//! join; the module compiled from the cache after the first round). Every
//! round writes fresh output topics, and each output is checked to hold
//! every input record. `BENCH_RAW_PRODUCER=name=value,...` adds settings
//! to the raw loop's producer (e.g. `enable.idempotence=true`).
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-kafka && SLUICE_BIN=$CARGO_TARGET_DIR/release/sluice \
//!       $CARGO_TARGET_DIR/release/bench-kafka [RECORDS] [ROUNDS]`

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use sluice_tests::*;
use std::path::Path;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;

/// The hand-written job: consume everything committed, produce each record
/// to `output`, wait for every acknowledgement. Returns the records copied.
fn raw_copy(brokers: &str, input: &str, output: &str) -> usize {
    let consumer = committed_reader(brokers, input, PARTITIONS);
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000");
    // Extra producer settings, `name=value,name=value`, to try.
    for setting in std::env::var("BENCH_RAW_PRODUCER")
        .unwrap_or_default()
        .split(',')
    {
        if let Some((name, value)) = setting.split_once('=') {
            config.set(name, value);
        }
    }
    let producer: ThreadedProducer<DefaultProducerContext> = config.create().expect("producer");
    let (mut copied, mut ended) = (0, 0);
    while ended < PARTITIONS {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let (partition, offset) = (m.partition().to_string(), m.offset().to_string());
                let headers = OwnedHeaders::new_with_capacity(2)
                    .insert(Header {
                        key: "partition",
                        value: Some(&partition),
                    })
                    .insert(Header {
                        key: "offset",
                        value: Some(&offset),
                    });
                let mut record: BaseRecord<'_, [u8], [u8]> =
                    BaseRecord::to(output).headers(headers);
                if let Some(k) = m.key() {
                    record = record.key(k);
                }
                if let Some(v) = m.payload() {
                    record = record.payload(v);
                }
                while let Err((e, back)) = producer.send(record) {
                    assert!(
                        matches!(
                            e,
                            KafkaError::MessageProduction(
                                rdkafka::types::RDKafkaErrorCode::QueueFull
                            )
                        ),
                        "{e}"
                    );
                    record = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                copied += 1;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => ended += 1,
            Some(Err(e)) => panic!("{e}"),
            None => {}
        }
    }
    producer.flush(Duration::from_secs(120)).expect("flush");
    copied
}

/// How many records a `read_committed` reader finds in `topic`. Read, not
/// summed from watermarks: Tansu's ListOffsets(latest) answers the newest
/// batch's base offset + 1, so watermarks miss all but one record of each
/// partition's last batch.
fn records_in(brokers: &str, topic: &str) -> usize {
    read_committed(brokers, topic, PARTITIONS).len()
}

/// Runs sluice over `input` (of `expected` records) once, checks its
/// output holds them all; returns its whole-process time and its steady
/// rate from its lineage.
async fn run_sluice(
    dir: &Path,
    brokers: &str,
    (input, expected): (&str, usize),
    name: &str,
    guarantee: &str,
) -> (Duration, f64) {
    let output = format!("{name}-out");
    create_topic(brokers, &output, PARTITIONS);
    create_topic(brokers, &format!("{name}.dead-letters"), 1);
    create_topic(brokers, &format!("{name}.lineage"), 1);
    let run_dir = dir.join(name);
    std::fs::create_dir_all(&run_dir).expect("run dir");
    let config = kafka_identity_config(name, brokers, input, &output)
        .assign(input, &[0, 1, 2, 3])
        .sink("guarantee", guarantee)
        // Every round shares one compiled-module cache.
        .field(
            "module",
            "cache_dir",
            dir.join("cache").display().to_string(),
        )
        .write(&run_dir);
    let started = Instant::now();
    run_ok(&config);
    let took = started.elapsed();
    let steady = if guarantee == "exactly-once" {
        bench::lineage_topic_rate(brokers, name)
    } else {
        bench::lineage_rate(&sinks::SinkDb::Sqlite(run_dir.join(".sluice-state.db")))
            .await
            .0
    };
    // Exactly-once writes each record once; at-least-once may repeat some.
    let written = records_in(brokers, &output);
    assert!(
        written == expected || (guarantee == "at-least-once" && written > expected),
        "{name}: {written} records out of {expected}"
    );
    (took, steady)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let records: usize = args.next().map_or(400_000, |a| a.parse().expect("RECORDS"));
    let rounds: usize = args.next().map_or(3, |a| a.parse().expect("ROUNDS"));
    let broker = Broker::start();
    let brokers = broker.brokers.as_str();
    let input = "bench-in";
    create_topic(brokers, input, PARTITIONS);
    produce(brokers, input, &bench::purchase_events(records, PARTITIONS));
    let dir = TempDir::new("bench-kafka");
    let rate = |d: Duration| records as f64 / d.as_secs_f64();
    let (mut raw, mut eo, mut alo) = (Vec::new(), Vec::new(), Vec::new());
    let (mut eo_steady, mut alo_steady) = (Vec::new(), Vec::new());
    // Each round's own ratios: the rounds are interleaved so that a ratio
    // compares runs under the same machine load.
    let (mut eo_alo, mut eo_raw) = (Vec::new(), Vec::new());
    println!("{records} records of ~76 bytes over {PARTITIONS} partitions, {rounds} rounds");
    for round in 0..rounds {
        let output = format!("raw-{round}-out");
        create_topic(brokers, &output, PARTITIONS);
        let started = Instant::now();
        assert_eq!(raw_copy(brokers, input, &output), records);
        let r = rate(started.elapsed());
        let name = format!("eo-{round}");
        let (took, es) =
            run_sluice(dir.path(), brokers, (input, records), &name, "exactly-once").await;
        let e = rate(took);
        let name = format!("alo-{round}");
        let (took, als) = run_sluice(
            dir.path(),
            brokers,
            (input, records),
            &name,
            "at-least-once",
        )
        .await;
        let a = rate(took);
        println!(
            "round {round}: raw loop {r:>8.0}/s  sluice exactly-once {e:>8.0}/s (steady {es:.0})  \
             at-least-once {a:>8.0}/s (steady {als:.0})  EO/ALO {:.2}  EO/raw {:.2}",
            e / a,
            e / r
        );
        eo_alo.push(e / a);
        eo_raw.push(e / r);
        raw.push(r);
        eo.push(e);
        alo.push(a);
        eo_steady.push(es);
        alo_steady.push(als);
    }
    let (r, e, a) = (median(raw), median(eo), median(alo));
    let (es, als) = (median(eo_steady), median(alo_steady));
    println!(
        "median records/s, whole process: raw rdkafka loop {r:.0}, sluice exactly-once {e:.0}, \
         sluice at-least-once {a:.0}; steady state (lineage): exactly-once {es:.0}, \
         at-least-once {als:.0}"
    );
    println!(
        "median of the rounds' ratios: exactly-once / at-least-once {:.2} (bar 0.70), \
         exactly-once / raw loop {:.2} (bar 0.50); of the median rates: {:.2} and {:.2}; \
         steady states: {:.2} and {:.2}; at-least-once / raw loop: {:.2}",
        median(eo_alo),
        median(eo_raw),
        e / a,
        e / r,
        es / als,
        es / r,
        a / r
    );
}
