//! sluice against the job a user would write by hand, as ratios measured in
//! one run: the same topic (JSON events over 4 partitions, some of them in
//! committed and in aborted transactions) counted by word into Postgres by
//!
//! - a raw `read_committed` consume (the ceiling),
//! - `handwritten-word-count` (rdkafka + sqlx, 10,000-record batches, one
//!   UNNEST upsert each, offsets committed to the group after the database:
//!   at-least-once), by static assignment and by consumer group,
//! - `sluice run --until-caught-up` with the `word-count` plugin
//!   (exactly-once, accumulate), by static assignment and by group,
//!
//! in interleaved rounds, each process timed from spawn to exit (the whole
//! process, start-up included). Every arm's table is checked against word
//! counts recomputed from an independent `read_committed` read. It also
//! prints sluice's steady state (first to last commit, from its lineage),
//! its peak RSS, and `sluice verify`'s rate over the same batches.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-user-job --bin handwritten-word-count && \
//!       target/release/bench-user-job [RECORDS] [ROUNDS] [FIELD]`
//!
//! FIELD (default `user`, 1,000 distinct values) is the JSON field whose
//! words are counted, as the workload; `-` counts the words of the
//! whole value instead (every record adds a distinct word: the database's
//! upserts dominate).

use sluice_tests::sinks::{SinkDb, postgres_url};
use sluice_tests::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Assign,
    Group,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Assign => "static assign",
            Mode::Group => "consumer group",
        }
    }

    /// For table, schema and group names.
    fn tag(self) -> &'static str {
        match self {
            Mode::Assign => "assign",
            Mode::Group => "group",
        }
    }
}

/// Runs `command` to completion and asserts it succeeded; its time.
fn timed_ok(command: &mut Command, what: &str) -> Duration {
    let started = Instant::now();
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// The input: `records` purchase events, a tenth of them in committed
/// transactions and a tenth more in aborted ones, interleaved with plain
/// writes.
fn produce_input(brokers: &str, topic: &str, records: usize) {
    let events = bench::purchase_events(records, PARTITIONS);
    let chunks: Vec<&[Produce]> = events.chunks(records.div_ceil(20).max(1)).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        match i % 10 {
            3 => produce_transaction(brokers, topic, &format!("bench-c{i}"), chunk, true),
            7 => produce_transaction(brokers, topic, &format!("bench-a{i}"), chunk, false),
            _ => produce(brokers, topic, chunk),
        }
    }
}

/// Word counts of what a `read_committed` reader sees: the expected table.
fn expected_counts(
    brokers: &str,
    topic: &str,
    field: Option<&str>,
) -> (usize, BTreeMap<String, i64>) {
    let seen = read_committed(brokers, topic, PARTITIONS);
    let mut counts = BTreeMap::new();
    for r in &seen {
        let text = match field {
            None => r.value.clone(),
            Some(f) => serde_json::from_str::<serde_json::Value>(&r.value).expect("json")[f]
                .as_str()
                .expect("field")
                .to_string(),
        };
        for word in text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            *counts.entry(word.to_lowercase()).or_default() += 1;
        }
    }
    (seen.len(), counts)
}

fn sibling_bin(name: &str) -> std::path::PathBuf {
    let me = std::env::current_exe().expect("current exe");
    me.with_file_name(name)
}

/// Runs the hand-written job into `schema`.word_counts; returns its time.
async fn handwritten(
    brokers: &str,
    topic: &str,
    db: &SinkDb,
    mode: Mode,
    tag: &str,
    field: Option<&str>,
) -> Duration {
    let SinkDb::Postgres { schema, .. } = db else {
        unreachable!()
    };
    let pool = db.pool().await;
    sqlx::raw_sql(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(&pool)
        .await
        .expect("schema");
    let table = format!("\"{schema}\".word_counts");
    let (how, arg) = match mode {
        Mode::Assign => ("assign", PARTITIONS.to_string()),
        Mode::Group => ("group", format!("handwritten-{tag}")),
    };
    timed_ok(
        Command::new(sibling_bin("handwritten-word-count"))
            .args([brokers, topic, &postgres_url(), &table, how, &arg])
            .args(field),
        "handwritten-word-count",
    )
}

fn sluice_config(
    brokers: &str,
    topic: &str,
    db: &SinkDb,
    mode: Mode,
    tag: &str,
    field: Option<&str>,
) -> PipelineToml {
    let mut config = PipelineToml::new(tag, brokers, &[topic], &plugin("word-count"))
        .target(Target::word_counts());
    if let Some(f) = field {
        config = config.module_param("field", f);
    }
    if let Mode::Assign = mode {
        let all: Vec<i32> = (0..PARTITIONS).collect();
        config = config.assign(topic, &all);
    }
    db.configure(config)
}

struct SluiceRun {
    took: Duration,
    peak_rss_mib: u64,
    config: std::path::PathBuf,
}

fn run_sluice(dir: &Path, config: PipelineToml, tag: &str) -> SluiceRun {
    let path = dir.join(format!("{tag}.toml"));
    std::fs::write(&path, config.to_string()).expect("write config");
    let started = Instant::now();
    let run = run_measured(&path, "warn");
    let took = started.elapsed();
    assert!(run.success, "sluice failed:\n{}", run.log);
    SluiceRun {
        took,
        peak_rss_mib: run.peak_rss_mib,
        config: path,
    }
}

async fn assert_counts(db: &SinkDb, expected: &BTreeMap<String, i64>, what: &str) {
    let got: BTreeMap<String, i64> = db
        .pairs("word_counts", "word", "n")
        .await
        .into_iter()
        .collect();
    assert!(
        &got == expected,
        "{what}: word counts differ from the read_committed recomputation ({} words vs {})",
        got.len(),
        expected.len()
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let records: usize = args.next().map_or(470_000, |a| a.parse().expect("RECORDS"));
    let rounds: usize = args.next().map_or(3, |a| a.parse().expect("ROUNDS"));
    let field = args.next().unwrap_or_else(|| "user".into());
    let field = (field != "-").then_some(field.as_str());
    let broker = Broker::start();
    let brokers = broker.brokers.clone();
    let topic = "words";
    create_topic(&brokers, topic, PARTITIONS);
    produce_input(&brokers, topic, records);
    let (committed, expected) = expected_counts(&brokers, topic, field);
    println!(
        "{records} records produced over {PARTITIONS} partitions (a tenth in committed \
         transactions, a tenth in aborted ones), {committed} seen by a read_committed reader; \
         counting the words of {}: {} distinct",
        field.map_or("the whole value".to_string(), |f| format!("field `{f}`")),
        expected.len()
    );
    let dir = TempDir::new("bench-user-job");
    let rate = |d: Duration| committed as f64 / d.as_secs_f64();
    let mut table: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut ratios: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        let (_, raw) = bench::raw_consume(&brokers, topic, PARTITIONS);
        table
            .entry("raw consume (from first message)".into())
            .or_default()
            .push(rate(raw));
        for mode in [Mode::Assign, Mode::Group] {
            let tag = format!("uj_{}_{round}_{}", std::process::id(), mode.tag());
            let hand_db = SinkDb::fresh_postgres(&format!("{tag}_hand")).await;
            let hand = handwritten(&brokers, topic, &hand_db, mode, &tag, field).await;
            assert_counts(&hand_db, &expected, "hand-written job").await;
            let sluice_db = SinkDb::fresh_postgres(&format!("{tag}_sluice")).await;
            let run = run_sluice(
                dir.path(),
                sluice_config(&brokers, topic, &sluice_db, mode, &tag, field),
                &tag,
            );
            assert_counts(&sluice_db, &expected, "sluice").await;
            let (steady, batches) = bench::lineage_rate(&sluice_db).await;
            let ratio = hand.as_secs_f64() / run.took.as_secs_f64();
            println!(
                "round {round}, {}: hand-written {:.0}/s, sluice {:.0}/s ({ratio:.2}x), \
                 sluice steady {:.0}/s over {} batches, peak RSS {} MiB",
                mode.name(),
                rate(hand),
                rate(run.took),
                steady,
                batches,
                run.peak_rss_mib
            );
            let name = mode.name();
            let mut record = |what: &str, value: f64| {
                table
                    .entry(format!("{what}, {name}"))
                    .or_default()
                    .push(value)
            };
            record("hand-written", rate(hand));
            record("sluice exactly-once", rate(run.took));
            record("sluice steady state (lineage)", steady);
            record("sluice peak RSS MiB", run.peak_rss_mib as f64);
            ratios
                .entry(format!("sluice / hand-written, {name}"))
                .or_default()
                .push(ratio);
            if mode == Mode::Assign {
                let took = bench::verify(&run.config);
                table
                    .entry("sluice verify".into())
                    .or_default()
                    .push(rate(took));
                ratios
                    .entry("verify / sluice steady state".into())
                    .or_default()
                    .push(rate(took) / steady);
            }
        }
    }
    println!("\nmedians over {rounds} rounds ({committed} committed records):");
    for (what, v) in table {
        println!("  {what:<48} {:>10.0}", median(v));
    }
    for (what, v) in ratios {
        println!("  {what:<48} {:>10.2}", median(v));
    }
}
