//! End-to-end throughput, as ratios measured in one run on one machine:
//! Kafka -> Wasm (identity) -> SQLite exactly-once, against a raw
//! `read_committed` rdkafka consume of the same topic and against SQLite's
//! own bulk insert rate for the same rows. The pipeline's steady state comes
//! from its lineage and the raw consume is timed from its first message
//! (`sluice_tests::bench`), so start-up is left out on both sides.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-e2e && target/release/bench-e2e [RECORDS]`

use sluice_tests::*;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;

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
    let input = bench::purchase_events(records, PARTITIONS);
    produce(&broker.brokers, topic, &input);

    let (seen, raw) = bench::raw_consume(&broker.brokers, topic, PARTITIONS);
    assert_eq!(seen, records);

    let dir = TempDir::new("bench-e2e");
    let db = dir.path().join("sluice.db");
    let config = write_config(
        dir.path(),
        identity_config("bench", &broker.brokers, topic, &db, 10_000),
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
    let (steady, batches) = bench::lineage_rate(&sinks::SinkDb::Sqlite(db.clone())).await;

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
    println!("sluice steady state (lineage):        {steady:>10.0} records/s ({batches} batches)");
    println!(
        "sluice steady / raw consume: {:.2}; sluice steady / SQLite bulk insert: {:.2}",
        steady / rate(raw),
        steady / rate(bulk)
    );
}
