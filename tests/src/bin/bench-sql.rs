//! SQL sink throughput, as ratios measured in one run on one machine.
//!
//! 1. Sink bars: 100k narrow rows (id, text, int, timestamp as epoch ms)
//!    appended through the sink's batch transaction (offset CAS and lineage
//!    included) against a raw bulk load of the same rows in one transaction:
//!    Postgres `COPY`, MySQL/MariaDB multi-row INSERTs of 1000 literal rows.
//!    Interleaved, best of 5.
//! 2. End to end into Postgres: Kafka -> Wasm (identity) -> Postgres
//!    exactly-once and at-least-once, against a raw `read_committed` consume
//!    of the topic and a raw `COPY` of the same rows. Pipeline rates are
//!    taken from the lineage (first to last batch commit), so start-up and
//!    the group join are left out of all of them.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-sql && target/release/bench-sql [RECORDS]`

use rdkafka::error::KafkaError;
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

fn narrow_output(rows: &[(i64, String, i64, i64)]) -> Output {
    let mut lengths = Vec::new();
    let mut data = Vec::new();
    for r in rows {
        lengths.push(r.1.len() as u32);
        data.extend_from_slice(r.1.as_bytes());
    }
    let int = |name: &str, f: &dyn Fn(&(i64, String, i64, i64)) -> i64| Column {
        name: name.into(),
        nulls: vec![],
        data: ColumnData::Int64(rows.iter().map(f).collect()),
    };
    Output {
        targets: vec![TargetRows {
            target: "narrow".into(),
            rows: rows.len() as u32,
            columns: vec![
                int("id", &|r| r.0),
                Column {
                    name: "name".into(),
                    nulls: vec![],
                    data: ColumnData::Text { lengths, data },
                },
                int("n", &|r| r.2),
                int("ts", &|r| r.3),
            ],
        }],
        rejections: vec![],
    }
}

fn narrow_config(url: &str, schema: &str) -> sluice::config::SinkConfig {
    let text = format!(
        r#"
pipeline = "bench"
[source]
brokers = "x"
topics = ["t"]
[module]
path = "m.wasm"
[sink]
url = "{url}"
schema = "{schema}"
[[sink.targets]]
name = "narrow"
columns = {{ id = "integer", name = "text", n = "integer", ts = "integer" }}
"#
    );
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
    let digest = output.digest();
    let commit = Commit {
        plan: &plan,
        records: &records,
        output,
        dead_letters: &[],
        output_digest: &digest,
    };
    let started = Instant::now();
    sink.commit(&commit).await.expect("sink commit");
    started.elapsed()
}

async fn postgres_copy_narrow(
    conn: &mut sqlx::PgConnection,
    rows: &[(i64, String, i64, i64)],
) -> Duration {
    let mut text = String::with_capacity(rows.len() * 48);
    for (id, name, n, ts) in rows {
        text.push_str(&format!("{id}\t{name}\t{n}\t{ts}\n"));
    }
    let started = Instant::now();
    let mut tx = conn.begin().await.unwrap();
    let mut copy = tx
        .copy_in_raw("COPY sluice_bench_sql.raw_narrow (id, name, n, ts) FROM STDIN")
        .await
        .unwrap();
    copy.send(text.as_bytes()).await.unwrap();
    copy.finish().await.unwrap();
    tx.commit().await.unwrap();
    started.elapsed()
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
    let mut text = String::new();
    for (i, p) in input.iter().enumerate() {
        let key = p.key.as_deref().unwrap_or("");
        text.push_str(&format!(
            "{}\t{}\t\\\\x{}\t\\\\x{}\n",
            p.partition,
            i as i32 / PARTITIONS,
            hex(key.as_bytes()),
            hex(p.value.as_bytes())
        ));
    }
    let started = Instant::now();
    let mut tx = conn.begin().await.unwrap();
    let mut copy = tx
        .copy_in_raw("COPY sluice_bench_sql.raw_records FROM STDIN")
        .await
        .unwrap();
    copy.send(text.as_bytes()).await.unwrap();
    copy.finish().await.unwrap();
    tx.commit().await.unwrap();
    started.elapsed()
}

/// CPU seconds (user + system) of all waited-for children so far.
fn child_cpu() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs the identity pipeline into a fresh schema; returns records/s from
/// the first to the last batch commit (lineage), and the batches.
async fn pipeline_rate(brokers: &str, topic: &str, schema: &str, guarantee: &str) -> (f64, i64) {
    let db = SinkDb::fresh_postgres(schema).await;
    let dir = TempDir::new(schema);
    let sink = format!("{}\nguarantee = \"{guarantee}\"", db.sink_toml());
    let interval = std::env::var("BENCH_BATCH_INTERVAL_MS").unwrap_or_else(|_| "100".into());
    let max: u32 = std::env::var("BENCH_MAX_RECORDS")
        .map(|m| m.parse().unwrap())
        .unwrap_or(10_000);
    let config = identity_config_into(schema, brokers, topic, &sink, max)
        .replace(
            "batch_interval_ms = 100",
            &format!("batch_interval_ms = {interval}"),
        )
        .replace(
            "\"heartbeat.interval.ms\" = \"500\"",
            &format!(
                "\"heartbeat.interval.ms\" = \"500\"{}",
                std::env::var("BENCH_PROPS").unwrap_or_default()
            ),
        );
    let config = write_config(dir.path(), &config);
    let started = Instant::now();
    let out = run_until_caught_up(&config, Duration::from_secs(1800));
    let wall = started.elapsed();
    if std::env::var("SLUICE_TEST_LOG").is_ok() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
    let usage = child_cpu();
    eprintln!(
        "{schema}: whole process {:.2} s wall, children CPU so far {usage:.2} s",
        wall.as_secs_f64()
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let batches = db.table("sluice_batches");
    let first_ms = db
        .scalar(&format!("SELECT min(committed_at_ms) FROM {batches}"))
        .await
        .unwrap();
    let last_ms = db
        .scalar(&format!("SELECT max(committed_at_ms) FROM {batches}"))
        .await
        .unwrap();
    let first_records = db
        .scalar(&format!(
            "SELECT records_in FROM {batches} WHERE committed_at_ms = {first_ms} LIMIT 1"
        ))
        .await
        .unwrap();
    let total = db
        .scalar(&format!("SELECT sum(records_in)::bigint FROM {batches}"))
        .await
        .unwrap();
    let count = db
        .scalar(&format!("SELECT count(*) FROM {batches}"))
        .await
        .unwrap();
    let span = (last_ms - first_ms).max(1) as f64 / 1000.0;
    ((total - first_records) as f64 / span, count)
}

async fn end_to_end(records: usize) {
    let broker = Broker::start();
    let topic = "bench-sql";
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
    let (seen, consume) = raw_consume(&broker.brokers, topic);
    assert_eq!(seen, records);
    let copy = postgres_copy_records(&input).await;
    let (eo, eo_batches) =
        pipeline_rate(&broker.brokers, topic, "sluice_bench_eo", "exactly-once").await;
    let (alo, alo_batches) =
        pipeline_rate(&broker.brokers, topic, "sluice_bench_alo", "at-least-once").await;
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
