//! End-to-end throughput, as ratios measured in one run on one machine:
//! Kafka -> Wasm (identity) -> SQLite exactly-once, against a raw
//! `read_committed` rdkafka consume of the same topic and against SQLite's
//! own bulk insert rate for the same rows.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-e2e && target/release/bench-e2e [RECORDS]`

use rdkafka::error::KafkaError;
use sluice_tests::*;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;

fn raw_consume(brokers: &str, topic: &str) -> (usize, Duration) {
    let started = Instant::now();
    let c = committed_reader(brokers, topic, PARTITIONS);
    let (mut n, mut eof) = (0usize, 0);
    while eof < PARTITIONS {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                use rdkafka::message::Message;
                std::hint::black_box(m.payload());
                n += 1;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => eof += 1,
            Some(Err(e)) => panic!("{e}"),
            None => {}
        }
    }
    (n, started.elapsed())
}

async fn sqlite_bulk_insert(dir: &std::path::Path, rows: &[Produce]) -> Duration {
    let db = dir.join("raw.db");
    let url = format!("sqlite://{}?mode=rwc", db.display());
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    sqlx::query("PRAGMA journal_mode=WAL")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("PRAGMA synchronous=FULL")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE records (partition INTEGER, \"offset\" INTEGER, key BLOB, value BLOB)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let started = Instant::now();
    let mut tx = pool.begin().await.unwrap();
    for (chunk_no, chunk) in rows.chunks(500).enumerate() {
        let mut sql =
            String::from("INSERT INTO records (partition, \"offset\", key, value) VALUES ");
        sql.push_str(&vec!["(?,?,?,?)"; chunk.len()].join(","));
        let mut q = sqlx::query(&sql);
        for (i, r) in chunk.iter().enumerate() {
            q = q
                .bind(r.partition)
                .bind((chunk_no * 500 + i) as i64)
                .bind(r.key.as_deref().map(str::as_bytes))
                .bind(r.value.as_bytes());
        }
        q.execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    started.elapsed()
}

#[tokio::main]
async fn main() {
    let records: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("RECORDS"))
        .unwrap_or(200_000);
    let broker = Broker::start();
    let topic = "bench";
    create_topic(&broker.brokers, topic, PARTITIONS);
    let input: Vec<Produce> = (0..records)
        .map(|i| Produce {
            partition: i as i32 % PARTITIONS,
            key: Some(format!("key-{i:08}")),
            value: format!(
                r#"{{"id":{i},"user":"user{}","event":"purchase","amount":{}.5,"pad":"xxxxxxxxxxxx"}}"#,
                i % 1000,
                i % 300
            ),
        })
        .collect();
    produce(&broker.brokers, topic, &input);

    let (seen, raw) = raw_consume(&broker.brokers, topic);
    assert_eq!(seen, records);

    let dir = TempDir::new("bench-e2e");
    let db = dir.path().join("sluice.db");
    let config = write_config(
        dir.path(),
        &identity_config("bench", &broker.brokers, topic, &db, 10_000),
    );
    let started = Instant::now();
    let out = run_until_caught_up(&config, Duration::from_secs(1800));
    let e2e = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pool = sqlite(&db).await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows as usize, records);

    // The same process on an empty topic: start-up and consumer-group join,
    // which a long-running pipeline pays once.
    create_topic(&broker.brokers, "bench-empty", PARTITIONS);
    let empty_db = dir.path().join("empty.db");
    let empty_config = dir.path().join("empty");
    std::fs::create_dir_all(&empty_config).unwrap();
    let empty_config = write_config(
        &empty_config,
        &identity_config(
            "bench-empty",
            &broker.brokers,
            "bench-empty",
            &empty_db,
            10_000,
        ),
    );
    let started = Instant::now();
    let out = run_until_caught_up(&empty_config, Duration::from_secs(300));
    let startup = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let bulk = sqlite_bulk_insert(dir.path(), &input).await;
    let rate = |d: Duration| records as f64 / d.as_secs_f64();
    println!(
        "{records} records of ~{} bytes over {PARTITIONS} partitions",
        input[0].value.len()
    );
    println!(
        "raw rdkafka consume (read_committed): {:>10.0} records/s",
        rate(raw)
    );
    println!(
        "SQLite bulk insert, one transaction:  {:>10.0} records/s",
        rate(bulk)
    );
    println!(
        "sluice Kafka -> Wasm -> SQLite (EO):  {:>10.0} records/s (whole process, start-up included)",
        rate(e2e)
    );
    let steady = e2e.saturating_sub(startup);
    println!(
        "sluice start-up (empty topic, group join): {:.2} s",
        startup.as_secs_f64()
    );
    println!(
        "sluice without start-up:              {:>10.0} records/s",
        rate(steady)
    );
    println!(
        "sluice / raw consume: {:.2} (whole process), {:.2} (without start-up)",
        rate(e2e) / rate(raw),
        rate(steady) / rate(raw)
    );
    println!(
        "sluice / SQLite bulk insert: {:.2} (whole process), {:.2} (without start-up)",
        rate(e2e) / rate(bulk),
        rate(steady) / rate(bulk)
    );
}
