//! What keyed state costs, as ratios measured in one run: the same topic of
//! events (100k distinct ids by default, every tenth record a repeat of an
//! earlier id of its partition) through
//!
//! - the stateless pipeline (`identity`: every record out as a row),
//! - a stateful dedupe (`tally` with `dedupe_ttl_ms`: a state lookup for
//!   every record, the first sighting of an id passes with a state write
//!   that expires in 24 h, repeats are dropped), and
//! - on the SQL sinks, the same dedupe with a 1 MiB state cache (its state
//!   is read from the sink as batches need it),
//!
//! all exactly-once into SQLite, Postgres and Kafka (state in a changelog
//! topic), in interleaved rounds. Rates are the pipelines' steady state
//! (first to last commit, from the lineage). Every dedupe's output is
//! checked: one row per distinct id, and its `state:` summary line (keys
//! read, the cache hit ratio, reads from the sink and their time) printed.
//!
//! Each round also runs, into Postgres with all partitions assigned, the
//! same dedupe as a user would write it by hand (`handwritten-dedupe`:
//! rdkafka, a `HashMap` of ids, rows and ids flushed to Postgres every
//! 10,000 records, then offsets: at-least-once) against the sluice dedupe,
//! both timed from spawn to exit.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-state --bin handwritten-dedupe && \
//!       SLUICE_BIN=target/release/sluice target/release/bench-state [IDS] [ROUNDS]`
//! (`SLUICE_BENCH_SINKS=postgres` runs one sink kind; `SLUICE_BENCH_LOGS=DIR` keeps
//! each run's log, at `SLUICE_TEST_LOG`).

use sluice_tests::sinks::SinkDb;
use sluice_tests::*;
use std::time::Duration;

const PARTITIONS: i32 = 4;

/// `ids` distinct event ids, and a repeat after every nine new ones (10%
/// of the records), in the partition of the id it repeats.
fn events(ids: usize) -> Vec<Produce> {
    let mut out = Vec::with_capacity(ids + ids / 9);
    for id in 0..ids {
        let event = |id: usize| Produce {
            partition: (id % PARTITIONS as usize) as i32,
            key: Some(format!("ev-{id:09}")),
            value: format!(
                r#"{{"id":{id},"user":"user{}","amount":{}.5}}"#,
                id % 1000,
                id % 300
            ),
        };
        out.push(event(id));
        if id % 9 == 8 {
            out.push(event(id / 2));
        }
    }
    out
}

#[derive(Clone, Copy)]
enum Arm {
    Stateless,
    Dedupe,
    /// The dedupe with a state cache far smaller than its state (SQL sinks
    /// only): partitions are read from the sink as batches need them.
    SmallCache,
}

/// The small cache's budget, in MiB: the dedupe's cached state takes ~94
/// bytes an id, so a partition outgrows it ~11,000 ids in.
const SMALL_CACHE_MIB: i64 = 1;

impl Arm {
    fn config(self, name: &str, brokers: &str) -> PipelineToml {
        match self {
            Arm::Stateless => PipelineToml::identity(name, brokers, "bench", 10_000),
            Arm::Dedupe => tally::config(name, brokers, 10_000)
                .topics(&["bench"])
                .module_param("dedupe_ttl_ms", TTL_MS),
            Arm::SmallCache => Arm::Dedupe.config(name, brokers).field(
                "limits",
                "state_cache_mib",
                SMALL_CACHE_MIB,
            ),
        }
    }
}

/// Runs `arm` into an exactly-once Kafka sink to the end (rows to
/// `{name}-out`, state to `{name}.state`); its steady rate. A dedupe's
/// output is checked: one record per distinct id.
fn run_kafka(arm: Arm, name: &str, brokers: &str, dir: &TempDir, ids: usize) -> f64 {
    let out = format!("{name}-out");
    create_topic(brokers, &out, PARTITIONS);
    create_topic(brokers, &format!("{name}.state"), PARTITIONS);
    create_topic(brokers, &format!("{name}.dead-letters"), 1);
    create_topic(brokers, &format!("{name}.lineage"), 1);
    let config = arm
        .config(name, brokers)
        .batch_interval_ms(100)
        .sink_url(&format!("kafka://{brokers}"))
        .targets(|t| t.kafka_topic(&out))
        .write(&dir.path().join(name));
    let run = run_until_caught_up(&config, Duration::from_secs(1800));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    bench::keep_log(name, &run);
    print_state_line(name, &run);
    if let Arm::Dedupe = arm {
        let rows = read_committed(brokers, &out, PARTITIONS).len();
        assert_eq!(rows, ids, "{name}: one record per distinct id");
    }
    bench::lineage_topic_rate(brokers, name)
}

/// Prints the `state:` line of a stateful run's summary (keys read, the
/// cache hit ratio, time reading the sink).
fn print_state_line(name: &str, out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Some(line) = stdout.lines().find(|l| l.starts_with("state: ")) {
        println!("  {name} {line}");
    }
}

/// Runs `arm` into `db` to the end; its steady rate.
async fn run(arm: Arm, db: &SinkDb, name: &str, brokers: &str, dir: &TempDir) -> f64 {
    let config = db
        .configure(arm.config(name, brokers).batch_interval_ms(100))
        .write(&dir.path().join(name));
    let out = run_until_caught_up(&config, Duration::from_secs(1800));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bench::keep_log(name, &out);
    print_state_line(name, &out);
    bench::lineage_rate(db).await.0
}

const TTL_MS: i64 = 86_400_000;

/// The sink kinds to run: all three, or those `SLUICE_BENCH_SINKS` lists
/// (comma-separated).
fn sinks() -> Vec<String> {
    let all = "sqlite,postgres,kafka";
    let listed = std::env::var("SLUICE_BENCH_SINKS").unwrap_or_else(|_| all.to_string());
    let sinks: Vec<String> = listed.split(',').map(|s| s.trim().to_string()).collect();
    for sink in &sinks {
        assert!(
            all.split(',').any(|k| k == sink),
            "no sink kind {sink:?} here: {all}"
        );
    }
    sinks
}

/// The hand-written dedupe against the sluice dedupe, both into Postgres
/// with all partitions assigned, spawn to exit: (hand-written, sluice).
async fn against_handwritten(
    brokers: &str,
    ids: usize,
    tag: &str,
    dir: &TempDir,
) -> (Duration, Duration) {
    let (hand_db, schema) = bench::hand_schema(&format!("{tag}_hand")).await;
    let me = std::env::current_exe().expect("current exe");
    let hand = bench::timed_ok(
        std::process::Command::new(me.with_file_name("handwritten-dedupe")).args([
            brokers,
            "bench",
            &sluice_tests::sinks::postgres_url(),
            &schema,
            &PARTITIONS.to_string(),
            &TTL_MS.to_string(),
        ]),
        "handwritten-dedupe",
    );
    let rows = hand_db
        .scalar(&format!("SELECT count(*) FROM \"{schema}\".tallies"))
        .await;
    assert_eq!(
        rows,
        Some(ids as i64),
        "hand-written: one row per distinct id"
    );
    let sluice_db = SinkDb::fresh_postgres(&format!("{tag}_sluice")).await;
    let all: Vec<i32> = (0..PARTITIONS).collect();
    let name = format!("{tag}_sluice");
    std::fs::create_dir_all(dir.path().join(&name)).unwrap();
    let config = sluice_db
        .configure(
            Arm::Dedupe
                .config(&name, brokers)
                .batch_interval_ms(100)
                .assign("bench", &all),
        )
        .write(&dir.path().join(&name));
    let took = bench::timed_sluice_run(&config);
    let rows = sluice_db
        .scalar(&format!(
            "SELECT count(*) FROM {}",
            sluice_db.table("tallies")
        ))
        .await;
    assert_eq!(rows, Some(ids as i64), "sluice: one row per distinct id");
    (hand, took)
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let ids: usize = args.next().map_or(100_000, |a| a.parse().expect("IDS"));
    let rounds: usize = args.next().map_or(3, |a| a.parse().expect("ROUNDS"));
    let broker = Broker::start();
    create_topic(&broker.brokers, "bench", PARTITIONS);
    let input = events(ids);
    produce(&broker.brokers, "bench", &input);
    println!(
        "{} records ({ids} distinct ids, {} repeats) over {PARTITIONS} partitions",
        input.len(),
        input.len() - ids
    );
    let dir = TempDir::new("bench-state");
    for round in 0..rounds {
        for sink in sinks() {
            let mut rates = Vec::new();
            let arms = [
                (Arm::Stateless, "stateless"),
                (Arm::Dedupe, "dedupe"),
                (Arm::SmallCache, "small_cache"),
            ];
            for (arm, label) in arms {
                if sink == "kafka" && matches!(arm, Arm::SmallCache) {
                    continue;
                }
                let name = format!("bench_{sink}_{label}_{round}");
                std::fs::create_dir_all(dir.path().join(&name)).unwrap();
                if sink == "kafka" {
                    rates.push(run_kafka(arm, &name, &broker.brokers, &dir, ids));
                    continue;
                }
                let db = match sink.as_str() {
                    "sqlite" => SinkDb::Sqlite(dir.path().join(&name).join("s.db")),
                    _ => SinkDb::fresh_postgres(&name).await,
                };
                let rate = run(arm, &db, &name, &broker.brokers, &dir).await;
                if !matches!(arm, Arm::Stateless) {
                    let rows = db
                        .scalar(&format!("SELECT count(*) FROM {}", db.table("tallies")))
                        .await;
                    assert_eq!(rows, Some(ids as i64), "{name}: one row per distinct id");
                }
                rates.push(rate);
            }
            println!(
                "round {round} {sink:>8}: stateless {:>8.0} rec/s, dedupe {:>8.0} rec/s, dedupe/stateless {:.2}",
                rates[0],
                rates[1],
                rates[1] / rates[0]
            );
            if let Some(small) = rates.get(2) {
                println!(
                    "round {round} {sink:>8}: dedupe with a {SMALL_CACHE_MIB} MiB state cache {small:>8.0} \
                     rec/s, /stateless {:.2}, /dedupe {:.2}",
                    small / rates[0],
                    small / rates[1]
                );
            }
        }
        let tag = format!("bench_hand_{round}");
        let (hand, took) = against_handwritten(&broker.brokers, ids, &tag, &dir).await;
        let rate = |d: Duration| input.len() as f64 / d.as_secs_f64();
        println!(
            "round {round} postgres, spawn to exit: hand-written dedupe {:>8.0} rec/s ({:.1} s), \
             sluice dedupe {:>8.0} rec/s ({:.1} s), sluice/hand-written {:.2}",
            rate(hand),
            hand.as_secs_f64(),
            rate(took),
            took.as_secs_f64(),
            hand.as_secs_f64() / took.as_secs_f64()
        );
    }
}
