//! What the benchmark binaries share: the raw-consume baseline, the
//! pipeline's steady-state rate read from its lineage, the offset commit
//! of the hand-written jobs (`handwritten-*`), a whole `sluice verify`
//! timed from spawn to exit (a command a user runs, not the pipeline), and
//! a run's log kept for reading (`SLUICE_BENCH_LOGS`).
//!
//! Both leave start-up out (client creation and group join on one side, the
//! first batch on the other), so the ratios compare steady states. It must
//! not time anything the pipeline does from outside the pipeline.

use crate::sinks::SinkDb;
use crate::{Produce, committed_reader, read_consumed};
use rdkafka::error::KafkaError;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `sluice verify` over every batch of `config`'s pipeline, which must
/// match them all; its time from spawn to exit.
pub fn verify(config: &Path) -> Duration {
    let started = Instant::now();
    let out = Command::new(crate::sluice_bin())
        .arg("verify")
        .arg(config)
        .env("SLUICE_LOG", "warn")
        .output()
        .expect("run sluice verify");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(", 0 differ"),
        "sluice verify failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// The benchmarks' input: `records` JSON purchase events of ~76 bytes with
/// 12-byte keys, round-robin over `partitions`.
pub fn purchase_events(records: usize, partitions: i32) -> Vec<Produce> {
    (0..records)
        .map(|i| Produce {
            partition: i as i32 % partitions,
            key: Some(format!("key-{i:08}")),
            value: format!(
                r#"{{"id":{i},"user":"user{}","event":"purchase","amount":{}.5,"pad":"xxxxxxxxxxxx"}}"#,
                i % 1000,
                i % 300
            ),
        })
        .collect()
}

/// Reads the whole topic with a plain `read_committed` consumer given the
/// fetch settings sluice's source uses by default (so the baseline is not
/// slowed by librdkafka's 1 s fetch backoff, which sluice avoids). Timed
/// from the first message to the last partition end.
pub fn raw_consume(brokers: &str, topic: &str, partitions: i32) -> (usize, Duration) {
    let c = committed_reader(brokers, topic, partitions);
    let (mut n, mut eof) = (0usize, 0);
    let mut first: Option<Instant> = None;
    while eof < partitions {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                use rdkafka::message::Message;
                first.get_or_insert_with(Instant::now);
                std::hint::black_box(m.payload());
                n += 1;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => eof += 1,
            Some(Err(e)) => panic!("{e}"),
            None => {}
        }
    }
    (n, first.expect("records").elapsed())
}

/// Records per second from the first to the last batch commit in the
/// lineage (the first batch's records left out), and the batch count.
pub async fn lineage_rate(db: &SinkDb) -> (f64, i64) {
    let batches = db.table("sluice_batches");
    let one = |sql: String| async move { db.scalar(&sql).await.expect(&sql) };
    let first_ms = one(format!("SELECT min(committed_at_ms) FROM {batches}")).await;
    let last_ms = one(format!("SELECT max(committed_at_ms) FROM {batches}")).await;
    let first_records = one(format!(
        "SELECT min(records_in) FROM {batches} WHERE committed_at_ms = {first_ms}"
    ))
    .await;
    let total = one(format!(
        "SELECT CAST(sum(records_in) AS BIGINT) FROM {batches}"
    ))
    .await;
    let count = one(format!("SELECT count(*) FROM {batches}")).await;
    let span = (last_ms - first_ms).max(1) as f64 / 1000.0;
    ((total - first_records) as f64 / span, count)
}

/// A hand-written job's offset commit, after its database commit: the next
/// offset of every partition read, to the consumer group.
pub fn commit_offsets(
    consumer: &rdkafka::consumer::BaseConsumer,
    topic: &str,
    next: &std::collections::BTreeMap<i32, i64>,
) -> Result<(), KafkaError> {
    use rdkafka::consumer::{CommitMode, Consumer};
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (&p, &o) in next {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Offset(o))?;
    }
    consumer.commit(&tpl, CommitMode::Sync)?;
    Ok(())
}

/// Records per second from the first to the last batch commit in an
/// exactly-once run's lineage topic (the first batch's records left out).
pub fn lineage_topic_rate(brokers: &str, name: &str) -> f64 {
    let mut commits: Vec<(i64, i64)> = read_consumed(brokers, &format!("{name}.lineage"), 1)
        .iter()
        .map(|e| {
            let entry: serde_json::Value = serde_json::from_str(&e.value).expect("lineage");
            (
                entry["committed_at_ms"].as_i64().expect("committed_at_ms"),
                entry["records"].as_i64().expect("records"),
            )
        })
        .collect();
    commits.sort();
    let (first, last) = (commits[0], commits[commits.len() - 1]);
    let after_first: i64 = commits[1..].iter().map(|(_, n)| n).sum();
    after_first as f64 / ((last.0 - first.0).max(1) as f64 / 1000.0)
}

/// With `SLUICE_BENCH_LOGS=DIR`, writes a run's log (at
/// `SLUICE_TEST_LOG`) to `DIR/NAME.log`; at `sluice=info` it has each
/// committed batch's `transform_ms` and `commit_ms`.
pub fn keep_log(name: &str, out: &std::process::Output) {
    if let Ok(dir) = std::env::var("SLUICE_BENCH_LOGS") {
        std::fs::write(format!("{dir}/{name}.log"), &out.stderr).expect("write the log");
    }
}

/// Runs `command` to a successful exit; how long it took (spawn to exit).
pub fn timed_ok(command: &mut Command, what: &str) -> Duration {
    timed_output(command, what).0
}

/// Runs `command` to a successful exit; how long it took and its output.
fn timed_output(command: &mut Command, what: &str) -> (Duration, std::process::Output) {
    let started = Instant::now();
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (took, out)
}

/// A hand-written job's consumer: `read_committed`, no auto-commit,
/// partition ends reported, every partition of `topic` assigned from the
/// start.
pub fn assigned_consumer(
    brokers: &str,
    topic: &str,
    partitions: i32,
) -> Result<rdkafka::consumer::BaseConsumer, KafkaError> {
    use rdkafka::consumer::Consumer;
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("handwritten-{}", std::process::id()))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("max.partition.fetch.bytes", "8388608")
        .set("fetch.queue.backoff.ms", "10")
        .create()?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

/// A fresh, created Postgres schema `name` for a hand-written job (which
/// creates its own tables in it): the database and the schema's name.
pub async fn hand_schema(name: &str) -> (SinkDb, String) {
    let db = SinkDb::fresh_postgres(name).await;
    let SinkDb::Postgres { schema, .. } = &db else {
        unreachable!("fresh_postgres gives Postgres")
    };
    let schema = schema.clone();
    let pool = db.pool().await;
    sqlx::raw_sql(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(&pool)
        .await
        .expect("schema");
    (db, schema)
}

/// `sluice run --until-caught-up CONFIG` to a successful exit, timed from
/// spawn to exit. With `SLUICE_BENCH_LOGS=DIR`, the run's log (at `SLUICE_TEST_LOG`) is
/// kept as `DIR/<config's folder>.timed.log`, its first line the spawn's
/// wall-clock time and the run's length, so start-up and exit can be read
/// against the log's timestamps.
pub fn timed_sluice_run(config: &Path) -> Duration {
    let mut command = Command::new(crate::sluice_bin());
    command.args(["run", "--until-caught-up"]).arg(config);
    let Ok(dir) = std::env::var("SLUICE_BENCH_LOGS") else {
        return timed_ok(command.env("SLUICE_LOG", "warn"), "sluice");
    };
    let level = std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "warn".into());
    let spawned = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros();
    let (took, out) = timed_output(command.env("SLUICE_LOG", level), "sluice");
    let name = config
        .parent()
        .and_then(Path::file_name)
        .map_or("sluice".into(), |n| n.to_string_lossy().into_owned());
    let log = format!(
        "spawned at unix µs {spawned}, exited {} µs later\n{}",
        took.as_micros(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(format!("{dir}/{name}.timed.log"), log).expect("write the log");
    took
}
