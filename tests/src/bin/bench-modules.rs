//! Module lifecycle figures, as ratios against baselines measured in the
//! same run:
//! - deploy of a ~2 MB component (`tests/plugins/bulky`) through the
//!   control API, cold (nothing compiled yet): upload + validation +
//!   compilation + store, against compiling the same bytes in-process with
//!   the same engine settings (the floor);
//! - activation latency: from the acknowledged activation until the host's
//!   status reports it prepares batches with the new version (and, for
//!   information, until the first batch with it was planned, which also
//!   waits for input), against the pipeline's batch interval (the bar:
//!   within one interval), over several swaps under a continuous producer.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-modules && target/release/bench-modules`

use sluice::batch::{now_ms, sha256_hex};
use sluice::control::ControlClient;
use sluice::runtime::{Limits, Runtime};
use sluice_tests::control::{Host, Producer, TOKEN, control_port, lineage};
use sluice_tests::sinks::SinkDb;
use sluice_tests::*;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;
const BATCH_INTERVAL_MS: i64 = 100;
const SWAPS: usize = 6;

fn compile_floor(component: &[u8]) -> Duration {
    let runtime = Runtime::new(Limits::default()).expect("runtime");
    let started = Instant::now();
    runtime.load(component, None).expect("bulky compiles");
    started.elapsed()
}

#[tokio::main]
async fn main() {
    let broker = Broker::start();
    let topic = "bench-modules";
    create_topic(&broker.brokers, topic, PARTITIONS);
    let dir = TempDir::new("bench-modules");
    let db = SinkDb::Sqlite(dir.path().join("out.db"));
    let (port, url) = control_port();
    let config = db
        .configure(PipelineToml::identity(
            "bench-modules",
            &broker.brokers,
            topic,
            10_000,
        ))
        .control(port, 64 * 1024 * 1024)
        .write(dir.path());
    let host = Host::start(&config, &dir.path().join("sluice.log"));
    host.wait_for_api(port);
    let client = ControlClient::new(&url, Some(TOKEN.into()));

    let bulky = std::fs::read(plugin("bulky")).expect("bulky built");
    let floor = compile_floor(&bulky);
    let started = Instant::now();
    let deployed = client
        .deploy(bulky.clone(), "{}", false)
        .await
        .expect("deploy");
    let deploy = started.elapsed();
    println!(
        "deploy of a {:.2} MB component (cold, compile included): {:>6} ms (validation {} ms); \
         in-process compile alone {:>6} ms; ratio {:.2} (bar: under 2000 ms)",
        bulky.len() as f64 / 1e6,
        deploy.as_millis(),
        deployed.validate_ms,
        floor.as_millis(),
        deploy.as_secs_f64() / floor.as_secs_f64()
    );

    let producer = Producer::start(&broker.brokers, topic, PARTITIONS);
    let stamp = std::fs::read(plugin("stamp")).expect("stamp built");
    let stamp_digest = client
        .deploy(stamp, "{}", false)
        .await
        .expect("deploy stamp")
        .module_digest;
    let identity_digest = sha256_hex(&std::fs::read(plugin("identity")).unwrap());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut activations = Vec::new();
    let mut reached = Vec::new();
    for i in 0..SWAPS {
        let digest = if i % 2 == 0 {
            &stamp_digest
        } else {
            &identity_digest
        };
        client.activate(digest, "{}").await.expect("activate");
        // From when the activation was acknowledged (committed in the
        // store): SQLite may hold the row's insert behind the sink's write
        // lock, so its own timestamp can be earlier than its visibility.
        let acknowledged = Instant::now();
        activations.push((now_ms(), digest.clone()));
        // Reached: the host reports it prepares batches with it.
        loop {
            let status = client.status().await.expect("status");
            if status["running"]["module_digest"] == digest.as_str() {
                break;
            }
            assert!(
                acknowledged.elapsed() < Duration::from_secs(10),
                "never switched"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        reached.push(acknowledged.elapsed().as_millis() as i64);
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    producer.stop();
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        for line in host.log().lines() {
            if line.contains("version activated") || line.contains("switching to module") {
                println!("  log: {line}");
            }
        }
    }
    host.stop();

    let batches = lineage(&db, "bench-modules").await;
    let pool = db.pool().await;
    let times: Vec<(String, i64)> = sqlx::query_as(
        "SELECT batch_id, batch_time_ms FROM sluice_batches WHERE pipeline = 'bench-modules'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let planned_at = |id: &str| times.iter().find(|t| t.0 == id).map(|t| t.1).unwrap();
    let mut worst_first = 0;
    for ((at, digest), reached) in activations.iter().zip(&reached) {
        let first = batches
            .iter()
            .filter(|b| &b.module_digest == digest)
            .map(|b| planned_at(&b.batch_id))
            .filter(|t| t + BATCH_INTERVAL_MS >= *at)
            .min()
            .expect("a batch ran the new version");
        // A batch may be planned with it before the HTTP answer arrives.
        let first = (first - at).max(0);
        worst_first = worst_first.max(first);
        println!(
            "activation of {}…: running on the host after {reached} ms; first batch with it \
             planned after {first} ms",
            &digest[..12]
        );
    }
    let worst = reached.iter().copied().max().unwrap_or(0);
    println!(
        "worst activation latency {worst} ms (first batch: {worst_first} ms, which also waits \
         for input); batch interval {BATCH_INTERVAL_MS} ms; ratio {:.2} (bar: within one batch \
         interval, <= 1.00)",
        worst as f64 / BATCH_INTERVAL_MS as f64
    );
}
