//! The Wasm boundary's cost, as ratios measured in one run:
//!
//! - identity plugin (every record out as a row) vs the same copy done
//!   natively, on 10k-record batches of ~100-byte values: ns/record each,
//!   and the boundary's cost (Wasm minus native) per record;
//! - JSON filter + projection plugin vs a native Rust implementation of the
//!   same logic, on the same batches.
//!
//! Run: `scripts/build-plugins.sh && cargo bench -p sluice --bench boundary`

use serde::Deserialize;
use sluice::batch::{OwnedRecord, Plan, Records, single_partition_batch};
use sluice::output::{Column, ColumnData, Output, TargetRows};
use sluice::runtime::{Limits, Runtime};
use std::borrow::Cow;
use std::path::Path;
use std::time::{Duration, Instant};

const BATCH: usize = 10_000;
const ROUNDS: usize = 50;

fn batch() -> (Plan, Records) {
    let users = ["ann", "bob", "cid", "dee", "eve"];
    let events = ["purchase", "view", "refund"];
    let owned: Vec<OwnedRecord> = (0..BATCH)
        .map(|i| {
            // ~100 bytes of JSON per value.
            let value = format!(
                r#"{{"id":{i},"user":"{}","event":"{}","amount":{}.{:02},"pad":"xxxxxxxxxx"}}"#,
                users[i % 5],
                events[i % 3],
                i % 200,
                i % 100
            );
            OwnedRecord {
                offset: i as i64,
                timestamp: 1_700_000_000_000 + i as i64,
                key: Some(format!("key-{i:06}").into_bytes()),
                value: Some(value.into_bytes()),
                headers: vec![],
            }
        })
        .collect();
    single_partition_batch("bench", "bench", &owned, 0)
}

/// Best times of `ROUNDS` runs of `a` and `b`, interleaved so that both
/// sides of a ratio see the same machine (the best run is the least
/// disturbed by other load on a shared machine).
fn measure_pair(mut a: impl FnMut() -> u64, mut b: impl FnMut() -> u64) -> (Duration, Duration) {
    let time = |f: &mut dyn FnMut() -> u64| {
        let t = Instant::now();
        std::hint::black_box(f());
        t.elapsed()
    };
    let (mut best_a, mut best_b) = (Duration::MAX, Duration::MAX);
    for _ in 0..ROUNDS {
        best_a = best_a.min(time(&mut a));
        best_b = best_b.min(time(&mut b));
    }
    (best_a, best_b)
}

fn ns_per_record(d: Duration) -> f64 {
    d.as_nanos() as f64 / BATCH as f64
}

fn var_column(name: &str, cells: impl Iterator<Item = Option<Vec<u8>>>, text: bool) -> Column {
    let (mut lengths, mut data, mut nulls) = (Vec::new(), Vec::new(), Vec::new());
    for c in cells {
        nulls.push(c.is_none() as u8);
        let c = c.unwrap_or_default();
        lengths.push(c.len() as u32);
        data.extend_from_slice(&c);
    }
    let data = if text {
        ColumnData::Text { lengths, data }
    } else {
        ColumnData::Bytes { lengths, data }
    };
    Column {
        name: name.into(),
        nulls,
        data,
    }
}

/// The identity plugin's work, natively: every record out as a row.
fn native_identity(records: &Records) -> Output {
    let rows: Vec<_> = records.iter().collect();
    Output {
        targets: vec![TargetRows {
            target: "records".into(),
            rows: rows.len() as u32,
            columns: vec![
                Column {
                    name: "partition".into(),
                    nulls: vec![],
                    data: ColumnData::Int64(rows.iter().map(|r| r.partition as i64).collect()),
                },
                Column {
                    name: "offset".into(),
                    nulls: vec![],
                    data: ColumnData::Int64(rows.iter().map(|r| r.offset).collect()),
                },
                var_column("key", rows.iter().map(|r| r.key.map(<[u8]>::to_vec)), false),
                var_column(
                    "value",
                    rows.iter().map(|r| r.value.map(<[u8]>::to_vec)),
                    false,
                ),
            ],
        }],
        rejections: vec![],
        late: Vec::new(),
        state: Default::default(),
    }
}

#[derive(Deserialize)]
struct Event<'a> {
    id: i64,
    #[serde(borrow)]
    user: Cow<'a, str>,
    #[serde(borrow)]
    event: Cow<'a, str>,
    amount: f64,
}

/// The json-filter plugin's logic, natively.
fn native_json_filter(records: &Records) -> Output {
    let (mut ids, mut amounts, mut rejected) = (Vec::new(), Vec::new(), 0u32);
    let (mut user_lengths, mut users) = (Vec::new(), Vec::new());
    for r in records.iter() {
        match r.value.map(serde_json::from_slice::<Event<'_>>) {
            Some(Ok(e)) if e.event == "purchase" && e.amount >= 10.0 => {
                ids.push(e.id);
                user_lengths.push(e.user.len() as u32);
                users.extend_from_slice(e.user.as_bytes());
                amounts.push(e.amount);
            }
            Some(Ok(_)) => {}
            _ => rejected += 1,
        }
    }
    std::hint::black_box(rejected);
    Output {
        targets: vec![TargetRows {
            target: "purchases".into(),
            rows: ids.len() as u32,
            columns: vec![
                Column {
                    name: "id".into(),
                    nulls: vec![],
                    data: ColumnData::Int64(ids),
                },
                Column {
                    name: "user".into(),
                    nulls: vec![],
                    data: ColumnData::Text {
                        lengths: user_lengths,
                        data: users,
                    },
                },
                Column {
                    name: "amount".into(),
                    nulls: vec![],
                    data: ColumnData::Float64(amounts),
                },
            ],
        }],
        rejections: vec![],
        late: Vec::new(),
        state: Default::default(),
    }
}

fn main() {
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/dist");
    let rt = Runtime::new(Limits::default()).expect("runtime");
    let load = |name: &str| {
        let bytes = std::fs::read(dist.join(format!("{name}.wasm")))
            .unwrap_or_else(|e| panic!("{name}.wasm: {e} (run scripts/build-plugins.sh)"));
        rt.load(&bytes, None).expect("load")
    };
    let identity = load("identity");
    let json = load("json-filter");
    let (plan, records) = batch();
    let bytes_per_value = records.values.len() / BATCH;

    let (native_id, wasm_id) = measure_pair(
        || native_identity(&records).row_count(),
        || {
            rt.run(&identity, "{}", &plan, &records)
                .expect("identity")
                .row_count()
        },
    );
    let params = r#"{"event":"purchase","min_amount":10.0}"#;
    assert_eq!(
        native_json_filter(&records).digest(&[]),
        rt.run(&json, params, &plan, &records).unwrap().digest(&[]),
        "native and Wasm json-filter must agree"
    );
    let (native_json, wasm_json) = measure_pair(
        || native_json_filter(&records).row_count(),
        || {
            rt.run(&json, params, &plan, &records)
                .expect("json")
                .row_count()
        },
    );

    // The canonical digest walks every cell (to skip values under nulls);
    // the legacy one hashed whole columns. Both over json-filter's output.
    let out = rt.run(&json, params, &plan, &records).expect("json");
    let (canonical, legacy) = measure_pair(
        || out.digest(&[]).len() as u64,
        || out.legacy_digest().len() as u64,
    );
    let rows = out.row_count().max(1) as f64;

    let empty = Records::default();
    let (fixed, _) = measure_pair(
        || {
            rt.run(&identity, "{}", &plan, &empty)
                .expect("empty")
                .row_count()
        },
        || 0,
    );
    println!(
        "per-batch fixed cost (fresh instance, init, empty process): {:.1} us",
        fixed.as_secs_f64() * 1e6
    );
    println!("batches of {BATCH} records, ~{bytes_per_value}-byte values, best of {ROUNDS} runs");
    println!(
        "identity:    native {:7.1} ns/record   wasm {:7.1} ns/record   boundary cost {:6.1} ns/record   ratio {:.2}x",
        ns_per_record(native_id),
        ns_per_record(wasm_id),
        ns_per_record(wasm_id) - ns_per_record(native_id),
        wasm_id.as_secs_f64() / native_id.as_secs_f64()
    );
    println!(
        "output digest over {rows} json-filter rows: canonical {:.1} ns/row, legacy {:.1} ns/row, ratio {:.2}x",
        canonical.as_nanos() as f64 / rows,
        legacy.as_nanos() as f64 / rows,
        canonical.as_secs_f64() / legacy.as_secs_f64()
    );
    println!(
        "json-filter: native {:7.1} ns/record   wasm {:7.1} ns/record   ratio {:.2}x",
        ns_per_record(native_json),
        ns_per_record(wasm_json),
        wasm_json.as_secs_f64() / native_json.as_secs_f64()
    );
}
