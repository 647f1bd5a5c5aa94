//! SQL sink throughput, as ratios measured in one run on one machine.
//!
//! 1. Sink bars: 100k narrow rows (id, text, int, timestamp as epoch ms)
//!    appended through the sink's batch transaction (offset CAS and lineage
//!    included) against a raw bulk load of the same rows in one transaction:
//!    Postgres binary `COPY` (encoded before the clock starts), MySQL/MariaDB
//!    multi-row INSERTs of 1000 literal rows.
//!    Interleaved, best of 5.
//! 2. End to end into Postgres: Kafka -> Wasm (identity) -> Postgres
//!    exactly-once and at-least-once, against a raw `read_committed` consume
//!    of the topic (timed from its first message) and a raw binary `COPY` of
//!    the same rows. Pipeline rates are taken from the lineage (first to last
//!    batch commit), so start-up and the group join are left out on both
//!    sides (`sluice_tests::bench`). Three interleaved rounds, best of each.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-sql && target/release/bench-sql [RECORDS]`

use sluice::batch::{OffsetRange, Plan, Records};
use sluice::config::PipelineConfig;
use sluice::output::{Column, ColumnData, Output, TargetRows};
use sluice::sink::Commit;
use sluice::sink::sql::{SqlBackend, SqlSink};
use sluice_tests::sinks::{SinkDb, mysql_url, postgres_url};
use sluice_tests::*;
use sqlx::Connection;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;
const NARROW: usize = 100_000;

/// Narrow rows: (id, name, n, ts).
fn narrow_rows() -> Vec<(i64, String, i64, i64)> {
    (0..NARROW as i64)
        .map(|i| {
            (
                i,
                format!("name-{:06}", i % 50_000),
                i % 977,
                1_764_000_000_000 + i,
            )
        })
        .collect()
}

/// id, text, int, timestamp.
type NarrowRow = (i64, String, i64, i64);

fn narrow_output(rows: &[NarrowRow]) -> Output {
    let mut lengths = Vec::new();
    let mut data = Vec::new();
    for r in rows {
        lengths.push(r.1.len() as u32);
        data.extend_from_slice(r.1.as_bytes());
    }
    let int = |name: &str, f: fn(&NarrowRow) -> i64| Column {
        name: name.into(),
        nulls: vec![],
        data: ColumnData::Int64(rows.iter().map(f).collect()),
    };
    Output {
        targets: vec![TargetRows {
            target: "narrow".into(),
            rows: rows.len() as u32,
            columns: vec![
                int("id", |r| r.0),
                Column {
                    name: "name".into(),
                    nulls: vec![],
                    data: ColumnData::Text { lengths, data },
                },
                int("n", |r| r.2),
                int("ts", |r| r.3),
            ],
        }],
        rejections: vec![],
        late: Vec::new(),
        state: Default::default(),
    }
}

fn narrow_config(url: &str, schema: &str) -> sluice::config::SinkConfig {
    let text = PipelineToml::new("bench", "x", &["t"], std::path::Path::new("m.wasm"))
        .sink_url(url)
        .sink("schema", schema)
        .target(
            Target::new("narrow")
                .column("id", "integer")
                .column("name", "text")
                .column("n", "integer")
                .column("ts", "integer"),
        )
        .to_string();
    PipelineConfig::parse(&text).expect("config").sink
}

/// One sink commit of all rows as one batch; `round` keeps ranges moving.
async fn sink_append<B: SqlBackend>(sink: &SqlSink<B>, output: &Output, round: i64) -> Duration {
    let range = OffsetRange {
        topic: "t".into(),
        partition: 0,
        from: round * NARROW as i64,
        until: (round + 1) * NARROW as i64,
    };
    let plan = Plan::new("bench", vec![range], "m", "p", 0);
    let records = Records::default();
    let digest = output.digest(&[]);
    let commit = Commit {
        plan: &plan,
        records: &records,
        output,
        dead_letters: &[],
        output_digest: &digest,
        state_reads: &Default::default(),
    };
    let started = Instant::now();
    sink.commit(&commit).await.expect("sink commit");
    started.elapsed()
}

/// A field of Postgres's binary COPY format.
enum Field<'a> {
    Int(i64),
    Bytes(&'a [u8]),
}

/// Rows in Postgres's binary COPY format (the fastest raw load).
fn binary_copy<'a>(rows: impl Iterator<Item = Vec<Field<'a>>>) -> Vec<u8> {
    let mut out = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0".to_vec();
    for row in rows {
        out.extend_from_slice(&(row.len() as i16).to_be_bytes());
        for field in row {
            match field {
                Field::Int(x) => {
                    out.extend_from_slice(&8i32.to_be_bytes());
                    out.extend_from_slice(&x.to_be_bytes());
                }
                Field::Bytes(b) => {
                    out.extend_from_slice(&(b.len() as i32).to_be_bytes());
                    out.extend_from_slice(b);
                }
            }
        }
    }
    out.extend_from_slice(&(-1i16).to_be_bytes());
    out
}

/// One binary COPY of `data` into `table`, in one transaction (timed; the
/// encoding is not).
async fn postgres_copy(conn: &mut sqlx::PgConnection, table: &str, data: &[u8]) -> Duration {
    let started = Instant::now();
    let mut tx = conn.begin().await.unwrap();
    let mut copy = tx
        .copy_in_raw(&format!("COPY {table} FROM STDIN (FORMAT binary)"))
        .await
        .unwrap();
    for chunk in data.chunks(1 << 20) {
        copy.send(chunk).await.unwrap();
    }
    copy.finish().await.unwrap();
    tx.commit().await.unwrap();
    started.elapsed()
}

async fn postgres_copy_narrow(
    conn: &mut sqlx::PgConnection,
    rows: &[(i64, String, i64, i64)],
) -> Duration {
    let data = binary_copy(rows.iter().map(|(id, name, n, ts)| {
        vec![
            Field::Int(*id),
            Field::Bytes(name.as_bytes()),
            Field::Int(*n),
            Field::Int(*ts),
        ]
    }));
    postgres_copy(conn, "sluice_bench_sql.raw_narrow", &data).await
}

async fn mysql_insert_narrow(
    conn: &mut sqlx::MySqlConnection,
    rows: &[(i64, String, i64, i64)],
) -> Duration {
    let statements: Vec<String> = rows
        .chunks(1000)
        .map(|chunk| {
            let values: Vec<String> = chunk
                .iter()
                .map(|(id, name, n, ts)| format!("({id},'{name}',{n},{ts})"))
                .collect();
            format!(
                "INSERT INTO sluice_bench_sql.raw_narrow (id, name, n, ts) VALUES {}",
                values.join(",")
            )
        })
        .collect();
    let started = Instant::now();
    let mut tx = conn.begin().await.unwrap();
    for sql in &statements {
        sqlx::raw_sql(sql).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    started.elapsed()
}

async fn sink_bars() {
    let rows = narrow_rows();
    let output = narrow_output(&rows);
    let rate = |d: Duration| NARROW as f64 / d.as_secs_f64();

    SinkDb::fresh_postgres("sluice_bench_sql").await;
    let sink = sluice::sink::postgres::open(&narrow_config(&postgres_url(), "sluice_bench_sql"))
        .await
        .unwrap();
    let mut conn = sqlx::PgConnection::connect(&postgres_url()).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE sluice_bench_sql.raw_narrow (id BIGINT, name TEXT, n BIGINT, ts BIGINT)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let (mut best_sink, mut best_raw) = (Duration::MAX, Duration::MAX);
    for round in 0..5 {
        best_raw = best_raw.min(postgres_copy_narrow(&mut conn, &rows).await);
        best_sink = best_sink.min(sink_append(&sink, &output, round).await);
    }
    println!(
        "Postgres, {NARROW} narrow rows, one transaction: COPY {:>9.0} rows/s, sluice sink {:>9.0} rows/s, ratio {:.2} (bar 0.70)",
        rate(best_raw),
        rate(best_sink),
        rate(best_sink) / rate(best_raw)
    );

    SinkDb::fresh_mysql("sluice_bench_sql").await;
    let sink = sluice::sink::mysql::open(&narrow_config(&mysql_url(), "sluice_bench_sql"))
        .await
        .unwrap();
    let mut conn = sqlx::MySqlConnection::connect(&mysql_url()).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE sluice_bench_sql.raw_narrow (id BIGINT, name LONGTEXT, n BIGINT, ts BIGINT)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let (mut best_sink, mut best_raw) = (Duration::MAX, Duration::MAX);
    for round in 0..5 {
        best_raw = best_raw.min(mysql_insert_narrow(&mut conn, &rows).await);
        best_sink = best_sink.min(sink_append(&sink, &output, round).await);
    }
    println!(
        "MariaDB, {NARROW} narrow rows, one transaction: multi-row INSERT {:>9.0} rows/s, sluice sink {:>9.0} rows/s, ratio {:.2} (bar 0.70)",
        rate(best_raw),
        rate(best_sink),
        rate(best_sink) / rate(best_raw)
    );
}

/// COPY of the identity rows (partition, offset, key, value), one transaction.
async fn postgres_copy_records(input: &[Produce]) -> Duration {
    let mut conn = sqlx::PgConnection::connect(&postgres_url()).await.unwrap();
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS sluice_bench_sql.raw_records; CREATE TABLE sluice_bench_sql.raw_records \
         (\"partition\" BIGINT, \"offset\" BIGINT, key BYTEA, value BYTEA)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let data = binary_copy(input.iter().enumerate().map(|(i, p)| {
        vec![
            Field::Int(p.partition as i64),
            Field::Int(i as i64 / PARTITIONS as i64),
            Field::Bytes(p.key.as_deref().unwrap_or("").as_bytes()),
            Field::Bytes(p.value.as_bytes()),
        ]
    }));
    postgres_copy(&mut conn, "sluice_bench_sql.raw_records", &data).await
}

/// Runs the identity pipeline into a fresh schema; returns records/s from
/// the first to the last batch commit (lineage), and the batches.
async fn pipeline_rate(brokers: &str, topic: &str, schema: &str, guarantee: &str) -> (f64, i64) {
    let db = SinkDb::fresh_postgres(schema).await;
    let dir = TempDir::new(schema);
    let config = db
        .configure(PipelineToml::identity(schema, brokers, topic, 10_000))
        .sink("guarantee", guarantee)
        .write(dir.path());
    let out = run_until_caught_up(&config, Duration::from_secs(1800));
    if std::env::var("SLUICE_TEST_LOG").is_ok() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bench::lineage_rate(&db).await
}

async fn end_to_end(records: usize) {
    let broker = Broker::start();
    let topic = "bench-sql";
    create_topic(&broker.brokers, topic, PARTITIONS);
    let input = bench::purchase_events(records, PARTITIONS);
    produce(&broker.brokers, topic, &input);
    // Three interleaved rounds of all four, best of each: the machine is
    // shared and single runs move by ±20%.
    let (mut consume, mut copy) = (Duration::MAX, Duration::MAX);
    let (mut eo, mut alo, mut eo_batches, mut alo_batches) = (0.0f64, 0.0f64, 0, 0);
    for round in 0..3 {
        let (seen, took) = bench::raw_consume(&broker.brokers, topic, PARTITIONS);
        assert_eq!(seen, records);
        consume = consume.min(took);
        copy = copy.min(postgres_copy_records(&input).await);
        let schema = format!("sluice_bench_eo_{round}");
        let (rate, batches) = pipeline_rate(&broker.brokers, topic, &schema, "exactly-once").await;
        (eo, eo_batches) = if rate > eo {
            (rate, batches)
        } else {
            (eo, eo_batches)
        };
        let schema = format!("sluice_bench_alo_{round}");
        let (rate, batches) = pipeline_rate(&broker.brokers, topic, &schema, "at-least-once").await;
        (alo, alo_batches) = if rate > alo {
            (rate, batches)
        } else {
            (alo, alo_batches)
        };
    }
    let rate = |d: Duration| records as f64 / d.as_secs_f64();
    let floor = rate(consume).min(rate(copy));
    println!(
        "{records} records of ~{} bytes over {PARTITIONS} partitions",
        input[0].value.len()
    );
    println!(
        "raw rdkafka consume (read_committed): {:>10.0} records/s",
        rate(consume)
    );
    println!(
        "raw Postgres COPY, one transaction:   {:>10.0} records/s",
        rate(copy)
    );
    println!("sluice -> Postgres exactly-once:      {eo:>10.0} records/s ({eo_batches} batches)");
    println!("sluice -> Postgres at-least-once:     {alo:>10.0} records/s ({alo_batches} batches)");
    println!(
        "exactly-once / min(consume, COPY): {:.2} (bar 0.80)",
        eo / floor
    );
    println!(
        "exactly-once / at-least-once:      {:.2} (bar 0.95)",
        eo / alo
    );
}

#[tokio::main]
async fn main() {
    let records: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("RECORDS"))
        .unwrap_or(300_000);
    sink_bars().await;
    end_to_end(records).await;
}
