//! What event-time windows cost, as ratios measured in one run:
//!
//! - throughput: one topic (200k records by default, 10k keys, five
//!   minutes of event time per partition) through the stateless pipeline
//!   (`identity`) and through a tumbling-window sum per key (`windows`,
//!   1-minute windows, the records' own `ts`, `state_journal_batches = 8`),
//!   exactly-once into SQLite and Postgres, and the same windows without
//!   the state journal (`state_journal_batches = 1`, the default: the
//!   state table written every batch),
//!   in interleaved rounds; rates are the pipelines' steady state
//!   (first to last commit, from the lineage). Every windowed run's final
//!   rows are counted against a recomputation from the input;
//! - against the job a user would write by hand (`handwritten-windows`:
//!   rdkafka, a `HashMap` of windows, closed windows flushed to Postgres
//!   every BATCH records, then offsets: at-least-once, open windows only
//!   in memory), into Postgres with all partitions assigned, both timed
//!   from spawn to exit; sluice twice: with its module cache empty (the
//!   start-up compiles the module) and warm (the module compiled by the
//!   steady arms, as on a restart; the hand-written binary is built
//!   before it is timed, too);
//! - latency: a steady producer (2,000 records/s, `ts` = the send time)
//!   for 30 s into 1-second windows; per window and partition, from the
//!   send time of the record that moved the partition's watermark past the
//!   window's end to the commit of the batch that read it (its
//!   `committed_at_ms`, in the lineage: the window's row commits in that
//!   transaction); p50, p99 and max against the bar, 2 x the batch
//!   interval + the median commit.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-windows --bin handwritten-windows && \
//!       SLUICE_BIN=target/release/sluice target/release/bench-windows [RECORDS] [ROUNDS] [BATCH]`
//! (BATCH: records a partition per batch in both arms, and the hand-written
//! job's flush interval; default 10,000, sluice's default)
//! (`SLUICE_BENCH_LOGS=DIR` keeps each run's log, at `SLUICE_TEST_LOG`).

use sluice_tests::sinks::SinkDb;
use sluice_tests::windows::{self, Expected, Lateness, Shape};
use sluice_tests::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;
const KEYS: usize = 10_000;
/// Records a partition a batch: sluice's default `max_records_per_partition`,
/// BATCH's default and what the latency arm always runs with.
const DEFAULT_BATCH: u32 = 10_000;
const MINUTE: Shape = Shape::Tumbling { size_ms: 60_000 };
const LATENESS_MS: i64 = 1_000;
/// The watermark [`LATENESS_MS`] behind; late records are dead letters.
const LATENESS: Lateness = Lateness {
    allowed_ms: LATENESS_MS,
    retain_ms: 0,
};

/// No lateness, no retention.
const NO_LATENESS: Lateness = Lateness {
    allowed_ms: 0,
    retain_ms: 0,
};

/// `records` over [`PARTITIONS`], key `k` always in partition `k % 4`,
/// each partition's event time moving evenly over five minutes.
fn input(records: usize) -> Vec<Produce> {
    let per_partition = (records / PARTITIONS as usize).max(1) as i64;
    let step = 300_000 / per_partition;
    (0..records)
        .map(|i| {
            let key = i % KEYS;
            let partition = (key % PARTITIONS as usize) as i32;
            let ts = windows::T0 + (i as i64 / PARTITIONS as i64) * step;
            windows::record(partition, &format!("k{key}"), ts, (i % 100) as i64)
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Arm {
    Stateless,
    Windows,
    /// The same windows writing the state table in every batch
    /// (`sink.state_journal_batches = 1`): what the state journal saves.
    WindowsUnjournaled,
}

impl Arm {
    /// The arm's pipeline, batches of at most `batch` records a partition.
    fn config(self, name: &str, brokers: &str, batch: u32) -> PipelineToml {
        match self {
            Arm::Stateless => PipelineToml::identity(name, brokers, "bench", batch),
            Arm::Windows => windows::config(name, brokers, MINUTE, LATENESS)
                .topics(&["bench"])
                .max_records_per_partition(batch)
                .sink("state_journal_batches", 8),
            Arm::WindowsUnjournaled => Arm::Windows
                .config(name, brokers, batch)
                .sink("state_journal_batches", 1),
        }
    }
}

/// The compiled-module cache every steady arm shares (the modules are
/// compiled once, as a deployment does), and the warm spawn-to-exit arm
/// finds the windowed module compiled in.
fn shared_cache(dir: &TempDir) -> PathBuf {
    dir.path().join("module-cache")
}

/// Runs `arm` into `db` to the end; its steady rate.
async fn run(arm: Arm, db: &SinkDb, name: &str, brokers: &str, dir: &TempDir, batch: u32) -> f64 {
    let config = db
        .configure(
            arm.config(name, brokers, batch)
                .batch_interval_ms(100)
                .field(
                    "module",
                    "cache_dir",
                    shared_cache(dir).display().to_string(),
                ),
        )
        .write(&dir.path().join(name));
    let out = run_until_caught_up(&config, Duration::from_secs(1800));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bench::keep_log(name, &out);
    bench::lineage_rate(db).await.0
}

/// Final windows rows in `db`.
async fn final_rows(db: &SinkDb) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM {} WHERE {} = 'final'",
        db.table("windows"),
        db.ident("emit")
    );
    db.scalar(&sql).await.expect("windows rows")
}

/// Spawn-to-exit times of the hand-written windows and sluice's.
struct SpawnToExit {
    hand: Duration,
    /// sluice with the module cache empty: start-up compiles the module.
    sluice_cold: Duration,
    /// sluice finding the module compiled (a restart, or a deployment
    /// whose module was compiled before), like the hand-written binary,
    /// which is built before it is timed.
    sluice_warm: Duration,
}

/// The hand-written windows against sluice's (cold, then warm), all into
/// Postgres with all partitions assigned, spawn to exit. Each must leave
/// `windows` rows.
async fn against_handwritten(
    brokers: &str,
    tag: &str,
    dir: &TempDir,
    rows: i64,
    batch: u32,
) -> SpawnToExit {
    let (hand_db, schema) = bench::hand_schema(&format!("{tag}_hand")).await;
    let me = std::env::current_exe().expect("current exe");
    let size_ms = match MINUTE {
        Shape::Tumbling { size_ms } => size_ms,
        _ => unreachable!(),
    };
    let hand = bench::timed_ok(
        std::process::Command::new(me.with_file_name("handwritten-windows")).args([
            brokers,
            "bench",
            &sluice_tests::sinks::postgres_url(),
            &schema,
            &PARTITIONS.to_string(),
            &size_ms.to_string(),
            &LATENESS_MS.to_string(),
            &batch.to_string(),
        ]),
        "handwritten-windows",
    );
    let hand_rows = hand_db
        .scalar(&format!("SELECT count(*) FROM \"{schema}\".windows"))
        .await;
    assert_eq!(
        hand_rows,
        Some(rows),
        "hand-written: every closed window once"
    );
    let cold_cache = dir.path().join(format!("{tag}_cold_cache"));
    let cold = format!("{tag}_cold");
    let sluice_cold = timed_sluice(brokers, &cold, dir, rows, batch, &cold_cache).await;
    let warm = format!("{tag}_warm");
    let sluice_warm = timed_sluice(brokers, &warm, dir, rows, batch, &shared_cache(dir)).await;
    SpawnToExit {
        hand,
        sluice_cold,
        sluice_warm,
    }
}

/// sluice's windows into a fresh Postgres database with all partitions
/// assigned and compiled modules in `cache`, spawn to exit.
async fn timed_sluice(
    brokers: &str,
    name: &str,
    dir: &TempDir,
    rows: i64,
    batch: u32,
    cache: &Path,
) -> Duration {
    let sluice_db = SinkDb::fresh_postgres(name).await;
    let all: Vec<i32> = (0..PARTITIONS).collect();
    std::fs::create_dir_all(dir.path().join(name)).unwrap();
    let config = sluice_db
        .configure(
            Arm::Windows
                .config(name, brokers, batch)
                .batch_interval_ms(100)
                .assign("bench", &all)
                .field("module", "cache_dir", cache.display().to_string()),
        )
        .write(&dir.path().join(name));
    let took = bench::timed_sluice_run(&config);
    assert_eq!(
        final_rows(&sluice_db).await,
        rows,
        "{name}: every closed window once"
    );
    took
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// Produces `rate` records/s for `seconds` (in 1 ms ticks), `ts` = the
/// send time, 1,000 keys.
fn produce_live(brokers: &str, topic: &str, rate: u64, seconds: u64) {
    let p: rdkafka::producer::ThreadedProducer<_> =
        producer_config(brokers, 5).create().expect("producer");
    let started = Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let due = started.elapsed().as_micros() as u64 * rate / 1_000_000;
        while sent < due {
            let key = (sent % 1_000) as usize;
            let partition = (key % PARTITIONS as usize) as i32;
            send(
                &p,
                topic,
                &windows::record(partition, &format!("k{key}"), now_ms(), 1),
            );
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    rdkafka::producer::Producer::flush(&p, Duration::from_secs(60)).expect("flush");
}

/// Latency of 1-second windows under a steady producer: per window and
/// partition, ms from the send of the record that moved the watermark past
/// the window's end to its batch's commit. Sorted.
async fn window_latencies(brokers: &str, dir: &TempDir, interval_ms: u64) -> (Vec<i64>, i64) {
    let name = format!("bench_latency_{interval_ms}");
    create_topic(brokers, &name, PARTITIONS);
    let db = SinkDb::Sqlite(dir.path().join(format!("{name}.db")));
    std::fs::create_dir_all(dir.path().join(&name)).unwrap();
    let config = db
        .configure(
            windows::config(
                &name,
                brokers,
                Shape::Tumbling { size_ms: 1_000 },
                NO_LATENESS,
            )
            .batch_interval_ms(interval_ms)
            .max_records_per_partition(DEFAULT_BATCH),
        )
        .write(&dir.path().join(&name));
    let mut child = std::process::Command::new(sluice_bin())
        .arg("run")
        .arg(&config)
        .env("SLUICE_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn sluice");
    std::thread::sleep(Duration::from_secs(8));
    produce_live(brokers, &name, 2_000, 30);
    std::thread::sleep(Duration::from_secs(5));
    child.kill().expect("stop sluice");
    child.wait().expect("wait");
    let pool = db.pool().await;
    let batches: Vec<(i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT r.partition, r.from_offset, r.until_offset, b.committed_at_ms \
         FROM sluice_batch_ranges r JOIN sluice_batches b ON b.batch_id = r.batch_id",
    )
    .fetch_all(&pool)
    .await
    .expect("lineage");
    let commits: Vec<i64> = {
        let mut c: Vec<i64> =
            sqlx::query_scalar("SELECT committed_at_ms - batch_time_ms FROM sluice_batches")
                .fetch_all(&pool)
                .await
                .expect("lineage");
        c.sort();
        c
    };
    let commit_of = |partition: i64, offset: i64| {
        batches
            .iter()
            .find(|b| b.0 == partition && b.1 <= offset && offset < b.2)
            .map(|b| b.3)
    };
    let mut latencies = Vec::new();
    let mut by_partition: BTreeMap<i32, Vec<Seen>> = BTreeMap::new();
    for r in read_committed(brokers, &name, PARTITIONS) {
        by_partition.entry(r.partition).or_default().push(r);
    }
    for (partition, records) in by_partition {
        let ts = |r: &Seen| {
            let v: serde_json::Value = serde_json::from_str(&r.value).expect("JSON");
            v["ts"].as_i64().expect("ts")
        };
        let Some(first) = records.first().map(ts) else {
            continue;
        };
        // The first whole second's end, then each one after.
        let mut end = first - first.rem_euclid(1_000) + 2_000;
        for r in &records {
            let t = ts(r);
            while t >= end - 1 {
                if let Some(committed) = commit_of(partition.into(), r.offset) {
                    latencies.push(committed - t);
                }
                end += 1_000;
            }
        }
    }
    latencies.sort();
    (latencies, commits[commits.len() / 2])
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let records: usize = args.next().map_or(200_000, |a| a.parse().expect("RECORDS"));
    let rounds: usize = args.next().map_or(3, |a| a.parse().expect("ROUNDS"));
    let batch: u32 = args
        .next()
        .map_or(DEFAULT_BATCH, |a| a.parse().expect("BATCH"));
    let broker = Broker::start();
    let brokers = broker.brokers.as_str();
    create_topic(brokers, "bench", PARTITIONS);
    produce(brokers, "bench", &input(records));
    let expected = Expected::of(
        &read_committed(brokers, "bench", PARTITIONS),
        MINUTE,
        LATENESS,
    );
    let rows = expected.rows.len() as i64;
    println!(
        "{records} records, {KEYS} keys over {PARTITIONS} partitions, 1-minute windows: \
         {rows} windows close"
    );
    let dir = TempDir::new("bench-windows");
    for round in 0..rounds {
        for sink in ["sqlite", "postgres"] {
            let mut rates = Vec::new();
            let arms = [
                (Arm::Stateless, "stateless"),
                (Arm::Windows, "windows"),
                (Arm::WindowsUnjournaled, "unjournaled"),
            ];
            for (arm, label) in arms {
                let name = format!("bench_{sink}_{label}_{round}");
                std::fs::create_dir_all(dir.path().join(&name)).unwrap();
                let db = match sink {
                    "sqlite" => SinkDb::Sqlite(dir.path().join(&name).join("s.db")),
                    _ => SinkDb::fresh_postgres(&name).await,
                };
                rates.push(run(arm, &db, &name, brokers, &dir, batch).await);
                if arm != Arm::Stateless {
                    assert_eq!(final_rows(&db).await, rows, "{name}: every window once");
                }
            }
            println!(
                "round {round} {sink:>8}: stateless {:>8.0} rec/s, windows {:>8.0} rec/s, \
                 windows/stateless {:.2}; unjournaled windows {:>8.0} rec/s, \
                 windows/unjournaled {:.2}",
                rates[0],
                rates[1],
                rates[1] / rates[0],
                rates[2],
                rates[1] / rates[2]
            );
        }
        let tag = format!("bench_hand_{round}");
        let times = against_handwritten(brokers, &tag, &dir, rows, batch).await;
        let rate = |d: Duration| records as f64 / d.as_secs_f64();
        let hand = times.hand;
        for (took, cache) in [(times.sluice_cold, "cold"), (times.sluice_warm, "warm")] {
            println!(
                "round {round} postgres, spawn to exit: hand-written windows {:>8.0} rec/s ({:.1} s), \
                 sluice windows, module cache {cache}, {:>8.0} rec/s ({:.1} s), \
                 sluice/hand-written {:.2}",
                rate(hand),
                hand.as_secs_f64(),
                rate(took),
                took.as_secs_f64(),
                hand.as_secs_f64() / took.as_secs_f64()
            );
        }
    }
    for interval_ms in [200, 50] {
        let (latencies, commit) = window_latencies(brokers, &dir, interval_ms).await;
        assert!(!latencies.is_empty(), "no window closed");
        println!(
            "latency, 1-second windows at 2000 rec/s, batch_interval_ms {interval_ms}: \
             {} windows, p50 {} ms, p99 {} ms, max {} ms; bar 2 x {interval_ms} + commit \
             (median batch, plan to commit, {commit} ms) = {} ms",
            latencies.len(),
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            latencies[latencies.len() - 1],
            2 * interval_ms as i64 + commit
        );
    }
}
