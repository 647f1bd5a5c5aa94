//! End-to-end latency and memory of a running pipeline, under a steady
//! producer at half the pipeline's own maximum rate (measured first in the
//! same run, over a backlog): Kafka -> Wasm (identity) -> SQLite,
//! exactly-once.
//!
//! Latency is per record, from the time the producer stamped into its value
//! (just before sending it) to its batch's `committed_at_ms` in the lineage
//! (written in the commit's transaction, so the row is visible a COMMIT
//! later). It is measured with the default `batch_interval_ms` (200) and
//! with a low-latency one (10), after a warm-up; p50, p99 and max are
//! printed with the batches' median commit time, after the baseline: a
//! plain rdkafka consumer of the same load, with librdkafka's default fetch
//! wait (500 ms) and with the shortest sluice sets (10 ms). With `soak SECONDS` it
//! instead runs the default config for that long and samples the host's
//! RSS every 5 s: the first minute is warm-up, the rest must stay flat.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-latency && target/release/bench-latency [soak SECONDS]`

use rdkafka::producer::Producer;
use sluice_tests::control::status_kib;
use sluice_tests::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const PARTITIONS: i32 = 4;
/// The load's producer batching: as sluice's own producers, and in a soak.
const LINGER_MS: u64 = 5;
const SOAK_LINGER_MS: u64 = 100;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

fn config(brokers: &str, topic: &str, db: &Path, interval_ms: u64) -> PipelineToml {
    // Extra `[source]` lines to try (e.g. librdkafka properties).
    let extra: toml::Table = std::env::var("BENCH_SOURCE")
        .unwrap_or_default()
        .parse()
        .expect("BENCH_SOURCE is TOML lines");
    extra.into_iter().fold(
        PipelineToml::new("latency", brokers, &[topic], &plugin("identity"))
            .batch_interval_ms(interval_ms)
            .sink_url(&format!("sqlite://{}", db.display()))
            .target(Target::records()),
        |config, (key, value)| config.source(&key, value),
    )
}

/// Produces `rate` records/s (in 1 ms ticks, batched by the producer for
/// `linger_ms`) until `stop`; each value carries its send time in ms.
/// Counts what it sent in `counted`, and returns how many were sent.
fn steady_producer(
    brokers: String,
    topic: String,
    rate: u64,
    linger_ms: u64,
    stop: Arc<AtomicBool>,
    counted: Arc<AtomicU64>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let p: rdkafka::producer::ThreadedProducer<_> = producer_config(&brokers, linger_ms)
            .create()
            .expect("producer");
        let started = Instant::now();
        let mut sent = 0u64;
        while !stop.load(Ordering::Relaxed) {
            counted.store(sent, Ordering::Relaxed);
            let due = started.elapsed().as_micros() as u64 * rate / 1_000_000;
            while sent < due {
                let r = Produce {
                    partition: (sent % PARTITIONS as u64) as i32,
                    key: Some(format!("key-{sent:08}")),
                    value: format!(
                        r#"{{"id":{sent},"t":{},"event":"purchase","pad":"xxxxxxxxxxxxxxxx"}}"#,
                        now_ms()
                    ),
                };
                send(&p, &topic, &r);
                sent += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        p.flush(Duration::from_secs(60)).expect("flush");
        sent
    })
}

fn start_sluice(config: &Path) -> Child {
    Command::new(sluice_bin())
        .arg("run")
        .arg(config)
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sluice")
}

fn stop(child: &mut Child) {
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().expect("wait sluice");
    assert!(status.success(), "sluice exited with {status}");
}

/// Process `pid`'s resident memory now, in MiB (0 once it is gone).
fn rss_mib(pid: u32) -> f64 {
    status_kib(pid as i32, "VmRSS:").map_or(0.0, |kib| kib as f64 / 1024.0)
}

/// CPU seconds (user + system) process `pid` has used so far.
fn cpu_seconds(pid: impl std::fmt::Display) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime, fields 14 and 15 of stat(5), in 100 Hz ticks.
    (ticks(11) + ticks(12)) / 100.0
}

/// Records the pipeline has committed so far, by its lineage.
async fn committed_records(pool: &sqlx::SqlitePool) -> i64 {
    sqlx::query_scalar(
        "SELECT CAST(COALESCE(sum(until_offset - from_offset), 0) AS INTEGER) \
         FROM sluice_batch_ranges",
    )
    .fetch_one(pool)
    .await
    .unwrap_or(0)
}

/// One soak sample: where memory, CPU and the lag are at `at`.
struct Sample {
    at: Duration,
    sluice_rss: f64,
    broker_rss: f64,
    sluice_cpu: f64,
    broker_cpu: f64,
    bench_cpu: f64,
    sent: u64,
    committed: i64,
}

impl Sample {
    /// The sample as a line, CPU as a share of one core since `before`.
    fn line(&self, before: &Sample) -> String {
        let secs = (self.at - before.at).as_secs_f64().max(0.001);
        let share = |now: f64, then: f64| 100.0 * (now - then) / secs;
        format!(
            "{:>5.0} s  RSS sluice {:>6.1} MiB, broker {:>7.1} MiB  CPU sluice {:>3.0}%, broker \
             {:>3.0}%, producer {:>3.0}%  sent {:>9}, committed {:>9}, lag {:>7}",
            self.at.as_secs_f64(),
            self.sluice_rss,
            self.broker_rss,
            share(self.sluice_cpu, before.sluice_cpu),
            share(self.broker_cpu, before.broker_cpu),
            share(self.bench_cpu, before.bench_cpu),
            self.sent,
            self.committed,
            self.sent as i64 - self.committed,
        )
    }
}

async fn wait_for_rows(pool: &sqlx::SqlitePool, rows: i64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM records")
            .fetch_one(pool)
            .await
            .unwrap_or(0);
        if n >= rows {
            return;
        }
        assert!(Instant::now() < deadline, "only {n} of {rows} rows arrived");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The maximum rate: the steady state of the same pipeline over a
/// backlog; and the process's peak RSS in MiB while it read the backlog.
async fn max_rate(brokers: &str, dir: &Path) -> (f64, u64) {
    let topic = "backlog";
    create_topic(brokers, topic, PARTITIONS);
    produce(brokers, topic, &bench::purchase_events(400_000, PARTITIONS));
    let db = dir.join("backlog.db");
    let path = dir.join("backlog.toml");
    std::fs::write(&path, config(brokers, topic, &db, 200).to_string()).expect("config");
    let run = run_measured(&path, "warn");
    assert!(run.success, "{}", run.log);
    let rate = bench::lineage_rate(&sinks::SinkDb::Sqlite(db)).await.0;
    (rate, run.peak_rss_mib)
}

struct Latencies {
    p50: i64,
    p99: i64,
    max: i64,
    /// Of the same records: produced -> their batch cut (fetch and wait).
    cut_p50: i64,
    cut_p99: i64,
    /// Median and p99 of batches: cut -> committed (transform and commit).
    commit_ms: i64,
    commit_p99: i64,
    records: usize,
}

/// Per record: lineage commit time minus the producer's stamp, for the
/// records with `id >= warm_up`.
async fn latencies(pool: &sqlx::SqlitePool, warm_up: u64) -> Latencies {
    let ranges: Vec<(i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT g.partition, g.from_offset, b.committed_at_ms, b.committed_at_ms - b.batch_time_ms \
         FROM sluice_batch_ranges g JOIN sluice_batches b \
         ON b.pipeline = g.pipeline AND b.batch_id = g.batch_id",
    )
    .fetch_all(pool)
    .await
    .expect("lineage");
    let mut by_partition: BTreeMap<i64, BTreeMap<i64, (i64, i64)>> = BTreeMap::new();
    let mut commit_times = Vec::new();
    for (p, from, at, took) in ranges {
        by_partition
            .entry(p)
            .or_default()
            .insert(from, (at, at - took));
        commit_times.push(took);
    }
    let rows: Vec<(i64, i64, Vec<u8>)> =
        sqlx::query_as("SELECT partition, \"offset\", value FROM records")
            .fetch_all(pool)
            .await
            .expect("records");
    let mut lat = Vec::new();
    let mut cut = Vec::new();
    for (p, offset, value) in rows {
        let v: serde_json::Value = serde_json::from_slice(&value).expect("json value");
        if v["id"].as_u64().expect("id") < warm_up {
            continue;
        }
        let sent = v["t"].as_i64().expect("t");
        let (_, (committed, cut_at)) = by_partition[&p]
            .range(..=offset)
            .next_back()
            .expect("its batch");
        lat.push(committed - sent);
        cut.push(cut_at - sent);
    }
    let at = |v: &mut Vec<i64>, q: f64| {
        v.sort_unstable();
        v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
    };
    Latencies {
        p50: at(&mut lat, 0.50),
        p99: at(&mut lat, 0.99),
        max: at(&mut lat, 1.0),
        cut_p50: at(&mut cut, 0.50),
        cut_p99: at(&mut cut, 0.99),
        commit_ms: at(&mut commit_times, 0.5),
        commit_p99: at(&mut commit_times, 0.99),
        records: lat.len(),
    }
}

/// Runs `interval_ms`'s pipeline under `rate` for `seconds` (the first
/// quarter is warm-up), sampling RSS every 5 s; returns latencies and the
/// RSS samples after the first minute.
async fn steady_run(
    brokers: &str,
    broker_pid: u32,
    dir: &Path,
    name: &str,
    interval_ms: u64,
    rate: u64,
    seconds: u64,
) -> (Latencies, Vec<f64>) {
    let topic = format!("steady-{name}");
    create_topic(brokers, &topic, PARTITIONS);
    let db = dir.join(format!("{name}.db"));
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config(brokers, &topic, &db, interval_ms).to_string()).expect("config");
    let mut child = start_sluice(&path);
    // Joined and reading before the clock starts.
    produce(
        brokers,
        &topic,
        &[Produce {
            partition: 0,
            key: None,
            value: r#"{"id":0,"t":0}"#.into(),
        }],
    );
    while !db.exists() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let pool = sqlite(&db).await;
    wait_for_rows(&pool, 1, Duration::from_secs(60)).await;
    let halt = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    // A soak's producer batches for longer: the broker's memory storage
    // pays per stored batch on every fetch, so 5 ms batches (~200 a second
    // per partition) saturate it within a minute or two, and then every
    // consumer falls behind whatever it does.
    let soak = seconds >= 120;
    let linger_ms = if soak { SOAK_LINGER_MS } else { LINGER_MS };
    let producing = steady_producer(
        brokers.into(),
        topic.clone(),
        rate,
        linger_ms,
        Arc::clone(&halt),
        Arc::clone(&counted),
    );
    let started = Instant::now();
    let mut rss = Vec::new();
    let sample = |committed: i64| Sample {
        at: started.elapsed(),
        sluice_rss: rss_mib(child.id()),
        broker_rss: rss_mib(broker_pid),
        sluice_cpu: cpu_seconds(child.id()),
        broker_cpu: cpu_seconds(broker_pid),
        bench_cpu: cpu_seconds("self"),
        sent: counted.load(Ordering::Relaxed),
        committed,
    };
    let mut before = sample(committed_records(&pool).await);
    while started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = sample(committed_records(&pool).await);
        // A long run prints where memory, CPU and the lag go.
        if soak {
            println!("{}", now.line(&before));
        }
        if started.elapsed() > Duration::from_secs(60) || !soak {
            rss.push(now.sluice_rss);
        }
        before = now;
    }
    halt.store(true, Ordering::Relaxed);
    let sent = producing.join().expect("producer");
    wait_for_rows(&pool, sent as i64 + 1, Duration::from_secs(120)).await;
    stop(&mut child);
    let warm_up = rate * seconds / 4;
    (latencies(&pool, warm_up.max(1)).await, rss)
}

/// The baseline: a plain `read_committed` rdkafka consumer (sluice's fetch
/// settings, the broker holding an empty fetch up to `fetch_wait_ms`)
/// reading the same kind of load, latency = receive time minus the
/// producer's stamp, after the same warm-up.
fn raw_consumer_latency(brokers: &str, fetch_wait_ms: u64, rate: u64, seconds: u64) -> (i64, i64) {
    use rdkafka::message::Message;
    let topic = format!("steady-raw-{fetch_wait_ms}");
    let topic = topic.as_str();
    create_topic(brokers, topic, PARTITIONS);
    let wait = fetch_wait_ms.to_string();
    let consumer =
        committed_reader_with(brokers, topic, PARTITIONS, &[("fetch.wait.max.ms", &wait)]);
    let halt = Arc::new(AtomicBool::new(false));
    let producing = steady_producer(
        brokers.into(),
        topic.into(),
        rate,
        LINGER_MS,
        Arc::clone(&halt),
        Arc::default(),
    );
    let started = Instant::now();
    let warm_up = rate * seconds / 4;
    let mut lat = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let v: serde_json::Value =
                serde_json::from_slice(m.payload().expect("value")).expect("json");
            if v["id"].as_u64().expect("id") >= warm_up {
                lat.push(now_ms() - v["t"].as_i64().expect("t"));
            }
        }
    }
    halt.store(true, Ordering::Relaxed);
    producing.join().expect("producer");
    lat.sort_unstable();
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    (at(0.5), at(0.99))
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let broker = Broker::start();
    let dir = TempDir::new("bench-latency");
    let (max, backlog_rss) = max_rate(&broker.brokers, dir.path()).await;
    let rate = std::env::var("BENCH_RATE")
        .ok()
        .map_or((max / 2.0) as u64, |r| r.parse().expect("BENCH_RATE"));
    println!(
        "maximum (steady state over a 400k backlog): {max:.0} records/s, peak RSS \
         {backlog_rss} MiB; load: {rate} records/s"
    );
    if let ["soak", seconds] = args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        let seconds: u64 = seconds.parse().expect("SECONDS");
        let (lat, rss) = steady_run(
            &broker.brokers,
            broker.pid(),
            dir.path(),
            "soak",
            200,
            rate,
            seconds,
        )
        .await;
        let (lo, hi) = rss
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        let first = rss.first().copied().unwrap_or(0.0);
        let last = rss.last().copied().unwrap_or(0.0);
        println!(
            "soak {seconds} s at {rate}/s: RSS after warm-up {first:.1} MiB, min {lo:.1}, max {hi:.1}, \
             last {last:.1} (max/min {:.3}, last/first {:.3}); p50 {} ms, p99 {} ms over {} records",
            hi / lo,
            last / first,
            lat.p50,
            lat.p99,
            lat.records
        );
        return;
    }
    // librdkafka's default fetch wait, and the shortest sluice sets.
    for fetch_wait_ms in [500, 10] {
        let (raw_p50, raw_p99) = raw_consumer_latency(&broker.brokers, fetch_wait_ms, rate, 40);
        println!(
            "raw rdkafka consumer, no sink, fetch.wait.max.ms = {fetch_wait_ms:>3}: p50 {raw_p50:>4} \
             ms, p99 {raw_p99:>4} ms"
        );
    }
    for (name, interval) in [("default", 200), ("low-latency", 10)] {
        let (lat, rss) = steady_run(
            &broker.brokers,
            broker.pid(),
            dir.path(),
            name,
            interval,
            rate,
            40,
        )
        .await;
        let bound = 2 * interval as i64 + lat.commit_ms;
        println!(
            "batch_interval_ms = {interval:>3}: p50 {:>4} ms, p99 {:>4} ms, max {:>4} ms over {} records \
             (to the cut: p50 {}, p99 {}); batch cut -> commit median {} ms, p99 {} ms; \
             bound 2 x interval + commit = {bound} ms; RSS {:.0}-{:.0} MiB",
            lat.p50,
            lat.p99,
            lat.max,
            lat.records,
            lat.cut_p50,
            lat.cut_p99,
            lat.commit_ms,
            lat.commit_p99,
            rss.iter().copied().fold(f64::MAX, f64::min),
            rss.iter().copied().fold(0.0, f64::max),
        );
    }
}
