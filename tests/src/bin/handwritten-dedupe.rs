//! The stateful job a user would write by hand instead of a sluice dedupe,
//! as a baseline of `bench-state`: consume a topic with rdkafka
//! (`read_committed`, partitions assigned), keep the event ids seen in a
//! `HashMap` per partition (each expiring `TTL_MS` of record time after its
//! first sighting), and every 10,000 records write the first sightings as
//! rows (partition, offset, key, n = 1) and the ids added to the map into
//! Postgres in one transaction (two UNNEST statements), then commit the
//! offsets to the consumer group. On start it loads the ids from Postgres.
//!
//! At-least-once: a crash between the database commit and the offset commit
//! reads that batch again (its ids are then in the map, so its rows are not
//! written twice, but nothing fences a second instance). It uses nothing of
//! sluice. It stops once it has read every partition to the end.
//!
//! Usage: `handwritten-dedupe BROKERS TOPIC POSTGRES_URL SCHEMA PARTITIONS TTL_MS`

use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

const BATCH: usize = 10_000;

/// What one batch writes: first sightings as rows, and the ids seen.
#[derive(Default)]
struct Pending {
    partitions: Vec<i64>,
    offsets: Vec<i64>,
    keys: Vec<Vec<u8>>,
    seen_partitions: Vec<i32>,
    seen_keys: Vec<Vec<u8>>,
    seen_expiry: Vec<i64>,
    records: usize,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [brokers, topic, url, schema, partitions, ttl_ms] = args.as_slice() else {
        anyhow::bail!(
            "usage: handwritten-dedupe BROKERS TOPIC POSTGRES_URL SCHEMA PARTITIONS TTL_MS"
        );
    };
    let partitions: i32 = partitions.parse()?;
    let ttl_ms: i64 = ttl_ms.parse()?;
    let consumer = sluice_tests::bench::assigned_consumer(brokers, topic, partitions)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pool = runtime.block_on(connect(url, schema))?;
    let mut seen = runtime.block_on(load(&pool, schema))?;

    let mut at_end = HashSet::new();
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let mut pending = Pending::default();
    while at_end.len() < partitions as usize {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let key = m.key().unwrap_or_default().to_vec();
                let ids = seen.entry(m.partition()).or_default();
                let time = m.timestamp().to_millis().unwrap_or(0);
                if ids.get(&key).is_none_or(|&expires| expires <= time) {
                    ids.insert(key.clone(), time + ttl_ms);
                    pending.partitions.push(m.partition().into());
                    pending.offsets.push(m.offset());
                    pending.keys.push(key.clone());
                    pending.seen_partitions.push(m.partition());
                    pending.seen_keys.push(key);
                    pending.seen_expiry.push(time + ttl_ms);
                }
                next.insert(m.partition(), m.offset() + 1);
                pending.records += 1;
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
        let done = at_end.len() == partitions as usize;
        if pending.records >= BATCH || (pending.records > 0 && done) {
            runtime.block_on(write(&pool, schema, &pending))?;
            sluice_tests::bench::commit_offsets(&consumer, topic, &next)?;
            pending = Pending::default();
        }
    }
    Ok(())
}

async fn connect(url: &str, schema: &str) -> anyhow::Result<sqlx::PgPool> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    sqlx::raw_sql(&format!(
        "CREATE TABLE IF NOT EXISTS \"{schema}\".tallies \
           (partition BIGINT, \"offset\" BIGINT, key BYTEA, n BIGINT); \
         CREATE TABLE IF NOT EXISTS \"{schema}\".seen \
           (partition INT, key BYTEA, expires_at BIGINT, PRIMARY KEY (partition, key))"
    ))
    .execute(&pool)
    .await?;
    Ok(pool)
}

/// Per partition, the ids seen and when each expires.
type Seen = HashMap<i32, HashMap<Vec<u8>, i64>>;

async fn load(pool: &sqlx::PgPool, schema: &str) -> anyhow::Result<Seen> {
    let rows: Vec<(i32, Vec<u8>, i64)> = sqlx::query_as(&format!(
        "SELECT partition, key, expires_at FROM \"{schema}\".seen"
    ))
    .fetch_all(pool)
    .await?;
    let mut seen = Seen::new();
    for (partition, key, expires_at) in rows {
        seen.entry(partition).or_default().insert(key, expires_at);
    }
    Ok(seen)
}

async fn write(pool: &sqlx::PgPool, schema: &str, p: &Pending) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\".tallies (partition, \"offset\", key, n) \
         SELECT *, 1 FROM UNNEST($1::bigint[], $2::bigint[], $3::bytea[])"
    ))
    .bind(&p.partitions)
    .bind(&p.offsets)
    .bind(&p.keys)
    .execute(&mut *tx)
    .await?;
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\".seen (partition, key, expires_at) \
         SELECT * FROM UNNEST($1::int[], $2::bytea[], $3::bigint[]) \
         ON CONFLICT (partition, key) DO UPDATE SET expires_at = EXCLUDED.expires_at"
    ))
    .bind(&p.seen_partitions)
    .bind(&p.seen_keys)
    .bind(&p.seen_expiry)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}
