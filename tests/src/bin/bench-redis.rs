//! Redis sink throughput, as ratios measured in one run on one machine.
//!
//! 1. Sink bar: 100k writes (50k rows, each an SADD to `seen:{day}` and a
//!    HINCRBY of `events` by day) committed through the exactly-once sink
//!    (one script per 10k-row batch, offset compare-and-set, type checks
//!    and lineage included) against a raw client pipelining the same
//!    commands in the same 10k-row chunks. Fresh server state per round,
//!    interleaved, best of 5; once without persistence and once with
//!    `appendfsync always`.
//! 2. End to end: Kafka -> Wasm -> Redis exactly-once against a raw
//!    `read_committed` consume of the same topic, twice: identity with a
//!    PFADD of each key (grouped into variadic calls), and json-filter with
//!    a ZINCRBY of each purchase's amount to its user (not idempotent, one
//!    call per record). The
//!    pipeline's steady state comes from its lineage, the raw consume is
//!    timed from its first message, so start-up is left out on both sides.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-redis && target/release/bench-redis [RECORDS]`

use sluice::batch::{OffsetRange, Plan, Records};
use sluice::config::PipelineConfig;
use sluice::output::{Column, ColumnData, Output, TargetRows};
use sluice::sink::{Commit, CommitOutcome, Sink};
use sluice_tests::redis_server::RedisServer;
use sluice_tests::*;
use std::time::{Duration, Instant};

const ROWS: usize = 50_000;
const CHUNK: usize = 10_000;
const DAYS: [&str; 7] = [
    "2026-11-24",
    "2026-11-25",
    "2026-11-26",
    "2026-11-27",
    "2026-11-28",
    "2026-11-29",
    "2026-11-30",
];

fn text_column(name: &str, values: &[String]) -> Column {
    let mut lengths = Vec::new();
    let mut data = Vec::new();
    for v in values {
        lengths.push(v.len() as u32);
        data.extend_from_slice(v.as_bytes());
    }
    Column {
        name: name.into(),
        nulls: vec![],
        data: ColumnData::Text { lengths, data },
    }
}

/// (day, user) rows, `CHUNK` per batch.
fn batches() -> Vec<(Vec<String>, Vec<String>)> {
    (0..ROWS / CHUNK)
        .map(|b| {
            let rows = b * CHUNK..(b + 1) * CHUNK;
            (
                rows.clone().map(|i| DAYS[i % 7].to_string()).collect(),
                rows.map(|i| format!("user-{}", (i * 7919) % 20_000))
                    .collect(),
            )
        })
        .collect()
}

fn sink_config(url: &str) -> sluice::config::SinkConfig {
    let target = Target::new("events")
        .column("day", "text")
        .column("user", "text")
        .redis(&[
            ("command", "sadd".into()),
            ("key", "seen:{day}".into()),
            ("member", "{user}".into()),
        ])
        .redis(&[
            ("command", "hincrby".into()),
            ("key", "events".into()),
            ("field", "{day}".into()),
        ]);
    let text = PipelineToml::new("bench", "x", &["t"], std::path::Path::new("m.wasm"))
        .sink_url(url)
        .target(target)
        .to_string();
    PipelineConfig::parse(&text).expect("bench config").sink
}

async fn through_sink(server: &RedisServer, input: &[(Vec<String>, Vec<String>)]) -> Duration {
    let sink = sluice::sink::redis::open(&sink_config(&server.url()))
        .await
        .expect("open sink");
    let outputs: Vec<Output> = input
        .iter()
        .map(|(days, users)| Output {
            targets: vec![TargetRows {
                target: "events".into(),
                rows: days.len() as u32,
                columns: vec![text_column("day", days), text_column("user", users)],
            }],
            rejections: vec![],
            late: Vec::new(),
            state: Default::default(),
        })
        .collect();
    let records = Records::default();
    let started = Instant::now();
    for (i, output) in outputs.iter().enumerate() {
        let range = OffsetRange {
            topic: "t".into(),
            partition: 0,
            from: (i * CHUNK) as i64,
            until: ((i + 1) * CHUNK) as i64,
        };
        let plan = Plan::new("bench", vec![range], "m", "p", 0);
        let commit = Commit {
            plan: &plan,
            records: &records,
            output,
            dead_letters: &[],
            output_digest: "d",
            state_reads: &Default::default(),
        };
        assert_eq!(
            sink.commit(&commit).await.unwrap(),
            CommitOutcome::Committed
        );
    }
    started.elapsed()
}

fn raw_pipelined(server: &RedisServer, input: &[(Vec<String>, Vec<String>)]) -> Duration {
    let mut conn = server.conn();
    let started = Instant::now();
    for (days, users) in input {
        let mut pipe = redis::pipe();
        for (day, user) in days.iter().zip(users) {
            pipe.cmd("SADD")
                .arg(format!("seen:{day}"))
                .arg(user)
                .ignore();
            pipe.cmd("HINCRBY").arg("events").arg(day).arg(1).ignore();
        }
        pipe.query::<()>(&mut conn).unwrap();
    }
    started.elapsed()
}

/// The same writes as a raw client that groups like the sink does: one
/// variadic SADD per day and one HINCRBY per day with the summed count,
/// per 10k-row chunk.
fn raw_grouped(server: &RedisServer, input: &[(Vec<String>, Vec<String>)]) -> Duration {
    let mut conn = server.conn();
    let started = Instant::now();
    for (days, users) in input {
        let mut members: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for (day, user) in days.iter().zip(users) {
            members.entry(day).or_default().push(user);
        }
        let mut pipe = redis::pipe();
        for (day, users) in &members {
            for chunk in users.chunks(1000) {
                pipe.cmd("SADD")
                    .arg(format!("seen:{day}"))
                    .arg(chunk)
                    .ignore();
            }
            pipe.cmd("HINCRBY")
                .arg("events")
                .arg(day)
                .arg(users.len())
                .ignore();
        }
        pipe.query::<()>(&mut conn).unwrap();
    }
    started.elapsed()
}

fn flush(server: &RedisServer) {
    redis::cmd("FLUSHALL")
        .query::<()>(&mut server.conn())
        .unwrap();
}

async fn sink_bar(durable: bool) {
    let server = RedisServer::start_with(if durable { "bench-aof" } else { "bench" }, durable);
    let input = batches();
    let (mut best_sink, mut best_raw, mut best_grouped) =
        (Duration::MAX, Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        flush(&server);
        best_raw = best_raw.min(raw_pipelined(&server, &input));
        flush(&server);
        best_grouped = best_grouped.min(raw_grouped(&server, &input));
        flush(&server);
        best_sink = best_sink.min(through_sink(&server, &input).await);
    }
    let writes = 2 * ROWS;
    let rate = |d: Duration| writes as f64 / d.as_secs_f64();
    println!(
        "{}: raw pipelined {:>8.0}/s, raw grouped {:>8.0}/s, sluice EO sink {:>8.0}/s; \
         sink / pipelined {:.2}, sink / grouped {:.2}",
        if durable {
            "appendfsync always"
        } else {
            "no persistence    "
        },
        rate(best_raw),
        rate(best_grouped),
        rate(best_sink),
        best_raw.as_secs_f64() / best_sink.as_secs_f64(),
        best_grouped.as_secs_f64() / best_sink.as_secs_f64()
    );
}

fn e2e_config(brokers: &str, topic: &str, url: &str, identity: bool) -> PipelineToml {
    let (module, target) = match identity {
        true => (
            plugin("identity"),
            Target::records().redis(&[
                ("command", "pfadd".into()),
                ("key", "keys".into()),
                ("member", "{key}".into()),
            ]),
        ),
        false => (
            plugin("json-filter"),
            Target::new("purchases")
                .column("id", "integer")
                .column("user", "text")
                .column("amount", "real")
                .redis(&[
                    ("command", "zincrby".into()),
                    ("key", "spend".into()),
                    ("by", "{amount}".into()),
                    ("member", "{user}".into()),
                ]),
        ),
    };
    let config = PipelineToml::new("bench-e2e", brokers, &[topic], &module)
        .max_records_per_partition(10_000)
        .sink_url(url)
        .target(target);
    match identity {
        true => config,
        false => config
            .module_param("event", "purchase")
            .module_param("min_amount", 0.0),
    }
}

#[tokio::main]
async fn main() {
    let records: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("RECORDS"))
        .unwrap_or(200_000);
    println!(
        "1. sink: {} writes ({ROWS} rows x SADD + HINCRBY), batches of {CHUNK} rows, best of 5",
        2 * ROWS
    );
    sink_bar(false).await;
    sink_bar(true).await;

    let partitions = 4;
    let broker = Broker::start();
    let topic = "bench-redis";
    create_topic(&broker.brokers, topic, partitions);
    let input = bench::purchase_events(records, partitions);
    produce(&broker.brokers, topic, &input);
    let (seen, raw) = bench::raw_consume(&broker.brokers, topic, partitions);
    assert_eq!(seen, records);
    let raw_rate = records as f64 / raw.as_secs_f64();
    println!("2. end to end: {records} purchase events over {partitions} partitions");
    println!("raw rdkafka consume (read_committed):          {raw_rate:>10.0} records/s");
    for (what, identity) in [
        ("identity -> PFADD of each key (grouped)", true),
        ("json-filter -> ZINCRBY of each amount", false),
    ] {
        let server = RedisServer::start_with("bench-e2e", false);
        let dir = TempDir::new("bench-redis");
        let config = write_config(
            dir.path(),
            e2e_config(&broker.brokers, topic, &server.url(), identity),
        );
        let out = run_until_caught_up(&config, Duration::from_secs(1800));
        let logs = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{logs}");
        let (steady, batches) = server.lineage_rate("bench-e2e");
        println!(
            "sluice EO, {what}: {steady:>10.0} records/s ({batches} batches), / raw consume {:.2}",
            steady / raw_rate
        );
        // With SLUICE_TEST_LOG=info: a batch's timings, to see where the
        // time goes.
        let timed: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("batch committed"))
            .collect();
        if let Some(line) = timed.get(timed.len() / 2) {
            println!(
                "  a batch: {}",
                line.split("records=").nth(1).unwrap_or(line)
            );
        }
    }
}
