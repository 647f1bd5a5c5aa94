//! The windowed job a user would write by hand instead of sluice's
//! windows, as a baseline of `bench-windows`: consume a topic with rdkafka
//! (`read_committed`, partitions assigned), sum `amount` per key in
//! tumbling windows of the records' `ts` in a `HashMap` per partition, with
//! the same rules as sluice's (a partition's watermark is its highest `ts`
//! so far minus the lateness, judged per record; a window closes when the
//! watermark reaches its last millisecond; a record for a closed window is
//! counted late and dropped), and every BATCH records write the windows
//! that closed as rows (partition, key, start_ms, end_ms, total, records)
//! into Postgres in one transaction (one UNNEST statement), then commit the
//! offsets to the consumer group.
//!
//! At-least-once, and weaker than that: the open windows live only in
//! memory, so a crash loses them (a restart from the committed offsets
//! counts only what comes after). It uses nothing of sluice. It stops once
//! it has read every partition to the end.
//!
//! Usage: `handwritten-windows BROKERS TOPIC POSTGRES_URL SCHEMA PARTITIONS SIZE_MS LATENESS_MS BATCH`

use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

/// A window being filled: its key and start.
type WindowKey = (Vec<u8>, i64);

/// One partition: its watermark and open windows (total, records).
#[derive(Default)]
struct Partition {
    watermark: Option<i64>,
    open: HashMap<WindowKey, (i64, i64)>,
}

/// Closed windows to write.
#[derive(Default)]
struct Rows {
    partitions: Vec<i64>,
    keys: Vec<String>,
    starts: Vec<i64>,
    ends: Vec<i64>,
    totals: Vec<i64>,
    records: Vec<i64>,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [
        brokers,
        topic,
        url,
        schema,
        partitions,
        size_ms,
        lateness_ms,
        batch,
    ] = args.as_slice()
    else {
        anyhow::bail!(
            "usage: handwritten-windows BROKERS TOPIC POSTGRES_URL SCHEMA PARTITIONS SIZE_MS \
             LATENESS_MS BATCH"
        );
    };
    let partitions: i32 = partitions.parse()?;
    let size_ms: i64 = size_ms.parse()?;
    let lateness_ms: i64 = lateness_ms.parse()?;
    let batch: usize = batch.parse()?;
    let consumer = sluice_tests::bench::assigned_consumer(brokers, topic, partitions)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pool = runtime.block_on(connect(url, schema))?;

    let mut state: HashMap<i32, Partition> = HashMap::new();
    let mut at_end = HashSet::new();
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let mut read = 0usize;
    while at_end.len() < partitions as usize {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let p = state.entry(m.partition()).or_default();
                if let Some((ts, amount)) = parse(m.payload().unwrap_or_default()) {
                    let start = ts - ts.rem_euclid(size_ms);
                    let closed = p.watermark.is_some_and(|w| start + size_ms - 1 <= w);
                    if !closed {
                        let key = (m.key().unwrap_or_default().to_vec(), start);
                        let window = p.open.entry(key).or_default();
                        *window = (window.0 + amount, window.1 + 1);
                    }
                    p.watermark = p.watermark.max(Some(ts - lateness_ms));
                }
                next.insert(m.partition(), m.offset() + 1);
                read += 1;
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
        let done = at_end.len() == partitions as usize;
        if read >= batch || (read > 0 && done) {
            let rows = close(&mut state, size_ms);
            runtime.block_on(write(&pool, schema, &rows))?;
            sluice_tests::bench::commit_offsets(&consumer, topic, &next)?;
            read = 0;
        }
    }
    Ok(())
}

/// A record's value: `ts` and `amount`.
#[derive(serde::Deserialize)]
struct Spent {
    ts: i64,
    amount: i64,
}

/// `ts` and `amount` of a JSON value, if it has both (parsed into a
/// struct, as sluice's windowed module does).
fn parse(value: &[u8]) -> Option<(i64, i64)> {
    let v: Spent = serde_json::from_slice(value).ok()?;
    Some((v.ts, v.amount))
}

/// Takes the windows each partition's watermark has closed.
fn close(state: &mut HashMap<i32, Partition>, size_ms: i64) -> Rows {
    let mut rows = Rows::default();
    for (&partition, p) in state.iter_mut() {
        let Some(watermark) = p.watermark else {
            continue;
        };
        p.open.retain(|(key, start), (total, records)| {
            let end = start + size_ms;
            if end - 1 > watermark {
                return true;
            }
            rows.partitions.push(partition.into());
            rows.keys.push(String::from_utf8_lossy(key).into_owned());
            rows.starts.push(*start);
            rows.ends.push(end);
            rows.totals.push(*total);
            rows.records.push(*records);
            false
        });
    }
    rows
}

async fn connect(url: &str, schema: &str) -> anyhow::Result<sqlx::PgPool> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    sqlx::raw_sql(&format!(
        "CREATE TABLE IF NOT EXISTS \"{schema}\".windows \
           (partition BIGINT, key TEXT, start_ms BIGINT, end_ms BIGINT, total BIGINT, \
            records BIGINT)"
    ))
    .execute(&pool)
    .await?;
    Ok(pool)
}

async fn write(pool: &sqlx::PgPool, schema: &str, rows: &Rows) -> anyhow::Result<()> {
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\".windows \
         SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], \
                              $5::bigint[], $6::bigint[])"
    ))
    .bind(&rows.partitions)
    .bind(&rows.keys)
    .bind(&rows.starts)
    .bind(&rows.ends)
    .bind(&rows.totals)
    .bind(&rows.records)
    .execute(pool)
    .await?;
    Ok(())
}
