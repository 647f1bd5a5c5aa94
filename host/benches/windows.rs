//! A windowed batch's transform in the runtime alone (no broker, no sink,
//! so a profile of it holds nothing else), as ratios measured in one run:
//!
//! - the `windows` test module (a tumbling one-minute sum and count per
//!   key, the records' own `ts`, as `bench-windows` runs it) against the
//!   `identity` module over the same 10k-record batches, ns/record each;
//! - the same windows done natively (a `HashMap` of windows, the JSON
//!   parsed the same way, closed windows out as rows): what the sandbox,
//!   the state calls and the recorded reads cost on top.
//!
//! The batches are one partition's of `bench-windows`: 2,500 keys, 6 ms of
//! event time a record, so a batch holds a minute and each key about four
//! records of each window. Each batch starts from empty state (every window
//! it touches is opened in it, and those its minute passes close in it),
//! as a batch of `bench-windows` mostly does.
//!
//! Run: `scripts/build-plugins.sh && cargo bench -p sluice --bench windows`
//! (`SLUICE_BENCH_PLUGINS=DIR` takes the modules from DIR instead of
//! `plugins/dist`: an SDK change measured against the SDK before;
//! `SLUICE_BENCH_PROFILE=N` then runs the windows module alone over N more
//! batches, so a `perf record` of the bench is mostly the module's run).

use sluice::batch::{OwnedRecord, Plan, Records, single_partition_batch};
use sluice::config::LimitsConfig;
use sluice::runtime::{Limits, Runtime};
use sluice::state::EmptyState;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BATCH: usize = 10_000;
const ROUNDS: usize = 30;
const KEYS: usize = 2_500;
const STEP_MS: i64 = 6;
const SIZE_MS: i64 = 60_000;
const T0: i64 = 1_700_000_000_000;

/// Batch `n` of the partition: records `n * BATCH ..`.
fn batch(n: usize) -> (Plan, Records) {
    let owned: Vec<OwnedRecord> = (n * BATCH..(n + 1) * BATCH)
        .map(|j| {
            let ts = T0 + j as i64 * STEP_MS;
            OwnedRecord {
                offset: j as i64,
                timestamp: ts,
                key: Some(format!("k{}", (j * 4) % (KEYS * 4)).into_bytes()),
                value: Some(format!(r#"{{"amount":{},"ts":{ts}}}"#, j % 100).into_bytes()),
                headers: vec![],
            }
        })
        .collect();
    single_partition_batch("bench", "bench", &owned, 0)
}

#[derive(serde::Deserialize)]
struct Spend {
    amount: i64,
    ts: i64,
}

/// The windows module's work, natively: each record into its window, the
/// windows the batch's event time passed out as rows (key, start, total,
/// records).
fn native_windows(records: &Records) -> usize {
    let mut open: HashMap<(Vec<u8>, i64), (i64, i64)> = HashMap::new();
    let mut closed = Vec::new();
    let mut watermark = i64::MIN;
    for r in records.iter() {
        let Some(Ok(spend)) = r.value.map(serde_json::from_slice::<Spend>) else {
            continue;
        };
        let start = spend.ts - spend.ts.rem_euclid(SIZE_MS);
        let acc = open
            .entry((r.key.unwrap_or_default().to_vec(), start))
            .or_default();
        acc.0 += spend.amount;
        acc.1 += 1;
        watermark = watermark.max(spend.ts);
    }
    open.retain(|(key, start), acc| match start + SIZE_MS - 1 <= watermark {
        true => {
            closed.push((key.clone(), *start, acc.0, acc.1));
            false
        }
        false => true,
    });
    std::hint::black_box(&open);
    closed.len()
}

/// Best of `ROUNDS` interleaved runs of each (the least disturbed by other
/// load).
fn best_of(arms: &mut [&mut dyn FnMut(usize) -> usize]) -> Vec<Duration> {
    let mut best = vec![Duration::MAX; arms.len()];
    for round in 0..ROUNDS {
        for (arm, best) in arms.iter_mut().zip(&mut best) {
            let started = Instant::now();
            std::hint::black_box(arm(round));
            *best = (*best).min(started.elapsed());
        }
    }
    best
}

fn ns_per_record(d: Duration) -> f64 {
    d.as_nanos() as f64 / BATCH as f64
}

fn main() {
    let dist = std::env::var_os("SLUICE_BENCH_PLUGINS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/dist"),
        std::path::PathBuf::from,
    );
    let rt = Runtime::new(Limits::from_config(&LimitsConfig::default())).expect("runtime");
    let load = |name: &str| {
        let path = dist.join(format!("{name}.wasm"));
        let bytes = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/build-plugins.sh)", path.display()));
        rt.load(&bytes, None).expect("load")
    };
    let (identity, windows) = (load("identity"), load("windows"));
    let params =
        format!(r#"{{"windows":"tumbling","size_ms":{SIZE_MS},"time_field":"ts","retain_ms":0}}"#);
    let batches: Vec<(Plan, Records)> = (0..ROUNDS).map(batch).collect();
    let closed = native_windows(&batches[1].1);
    let out = (rt.run_with_state(
        &windows,
        &params,
        &batches[1].0,
        &batches[1].1,
        Arc::new(EmptyState),
    ))
    .expect("windows run");
    let finals = out.row_count() as usize;
    assert_eq!(
        finals, closed,
        "the module and the native windows close the same windows"
    );
    let best = best_of(&mut [
        &mut |n| {
            let (plan, records) = &batches[n];
            (rt.run(&identity, "{}", plan, records).expect("identity")).row_count() as usize
        },
        &mut |n| {
            let (plan, records) = &batches[n];
            let out = rt.run_with_state(&windows, &params, plan, records, Arc::new(EmptyState));
            out.expect("windows").row_count() as usize
        },
        &mut |n| native_windows(&batches[n].1),
    ]);
    let profiled: usize = std::env::var("SLUICE_BENCH_PROFILE").map_or(0, |n| {
        n.parse()
            .expect("SLUICE_BENCH_PROFILE is a number of batches")
    });
    for n in 0..profiled {
        let (plan, records) = &batches[n % ROUNDS];
        let out = rt.run_with_state(&windows, &params, plan, records, Arc::new(EmptyState));
        std::hint::black_box(out.expect("windows"));
    }
    let [identity, windows, native] = [best[0], best[1], best[2]].map(ns_per_record);
    println!(
        "{BATCH}-record batches, {KEYS} keys, one-minute windows ({finals} closed a batch); best of {ROUNDS}:"
    );
    println!("identity module  {identity:8.0} ns/record");
    println!(
        "windows module   {windows:8.0} ns/record   windows / identity {:.2}",
        windows / identity
    );
    println!(
        "windows native   {native:8.0} ns/record   module / native {:.2}",
        windows / native
    );
}
