//! `sluice verify` against the pipeline's own steady state, by batch size,
//! as ratios measured in one run: one topic of JSON events over 4
//! partitions, run to the end (identity into SQLite, exactly-once) with
//! 1,000, 2,500 and 10,000 records per partition per batch, each run then
//! verified whole. The steady state comes from the lineage (first to last
//! commit); verify is timed from spawn to exit (start-up included, as a
//! user sees it) and must match every batch.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-verify && target/release/bench-verify [RECORDS] [ROUNDS]`

use sluice_tests::sinks::SinkDb;
use sluice_tests::*;
use std::time::Duration;

const PARTITIONS: i32 = 4;
const BATCH_SIZES: [u32; 3] = [1_000, 2_500, 10_000];

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let records: usize = args.next().map_or(400_000, |a| a.parse().expect("RECORDS"));
    let rounds: usize = args.next().map_or(1, |a| a.parse().expect("ROUNDS"));
    let broker = Broker::start();
    let topic = "bench";
    create_topic(&broker.brokers, topic, PARTITIONS);
    produce(
        &broker.brokers,
        topic,
        &bench::purchase_events(records, PARTITIONS),
    );
    let dir = TempDir::new("bench-verify");
    println!("{records} records over {PARTITIONS} partitions; identity into SQLite");
    println!(
        "| round | records per partition per batch | batches | steady state | verify | verify / steady |"
    );
    println!("|---|---|---|---|---|---|");
    for round in 0..rounds {
        for size in BATCH_SIZES {
            let name = format!("verify_{round}_{size}");
            let run_dir = dir.path().join(&name);
            std::fs::create_dir_all(&run_dir).expect("run dir");
            let db = run_dir.join("sink.db");
            let config = write_config(
                &run_dir,
                identity_config(&name, &broker.brokers, topic, &db, size),
            );
            let out = run_until_caught_up(&config, Duration::from_secs(1800));
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let (steady, batches) = bench::lineage_rate(&SinkDb::Sqlite(db.clone())).await;
            let took = bench::verify(&config);
            let rate = records as f64 / took.as_secs_f64();
            println!(
                "| {round} | {size} | {batches} | {steady:.0}/s | {rate:.0}/s ({:.1} s) | {:.2} |",
                took.as_secs_f64(),
                rate / steady
            );
        }
    }
}
