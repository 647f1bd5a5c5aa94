//! The job a user would write by hand instead of running sluice, as the
//! baseline of `bench-user-job`: consume a topic with rdkafka
//! (`read_committed`), count the words of each 10,000-record batch, add the
//! counts to a Postgres table with one UNNEST upsert per batch, and commit
//! the batch's offsets to the consumer group after the database commit.
//!
//! At-least-once: a crash between the database commit and the offset commit
//! counts that batch twice. It uses nothing of sluice; its word splitting
//! is the `word-count` plugin's (alphanumeric runs, lowercased). It stops
//! once it has read every partition to the end it had at start.
//!
//! With FIELD it counts the words of that string field of each JSON value
//! instead of the whole value (a value without it is skipped).
//!
//! Usage: `handwritten-word-count BROKERS TOPIC POSTGRES_URL TABLE (group GROUP_ID | assign PARTITIONS) [FIELD]`

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

const BATCH: usize = 10_000;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (brokers, topic, url, table, mode, arg, field) = match args.as_slice() {
        [b, t, u, tb, m, a] => (b, t, u, tb, m, a, None),
        [b, t, u, tb, m, a, f] => (b, t, u, tb, m, a, Some(f.as_str())),
        _ => anyhow::bail!(
            "usage: handwritten-word-count BROKERS TOPIC POSTGRES_URL TABLE (group GROUP_ID | assign PARTITIONS) [FIELD]"
        ),
    };
    let group = match mode.as_str() {
        "group" => arg.clone(),
        _ => format!("handwritten-{}", std::process::id()),
    };
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", &group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "true")
        // The same tuning sluice uses by default: fetch sizes, and a session
        // timeout of 10 s (librdkafka's 45 s default costs a 22.5 s join on
        // Tansu, which holds a JoinGroup for half the session timeout).
        .set("max.partition.fetch.bytes", "8388608")
        .set("fetch.queue.backoff.ms", "10")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .create()?;
    let partitions: i32 = match mode.as_str() {
        "group" => {
            consumer.subscribe(&[topic])?;
            partition_count(&consumer, topic)?
        }
        "assign" => {
            let n: i32 = arg.parse()?;
            let mut tpl = TopicPartitionList::new();
            for p in 0..n {
                tpl.add_partition_offset(topic, p, Offset::Beginning)?;
            }
            consumer.assign(&tpl)?;
            n
        }
        other => anyhow::bail!("unknown mode {other}"),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pool = runtime.block_on(connect(url, table))?;

    let mut at_end = std::collections::HashSet::new();
    let mut counts: HashMap<String, i64> = HashMap::new();
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let mut in_batch = 0;
    while at_end.len() < partitions as usize {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                if let Some(value) = m.payload() {
                    count_words(value, field, &mut counts);
                }
                next.insert(m.partition(), m.offset() + 1);
                in_batch += 1;
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
        if in_batch >= BATCH || (in_batch > 0 && at_end.len() == partitions as usize) {
            runtime.block_on(upsert(&pool, table, &counts))?;
            sluice_tests::bench::commit_offsets(&consumer, topic, &next)?;
            counts.clear();
            in_batch = 0;
        }
    }
    Ok(())
}

fn partition_count(consumer: &BaseConsumer, topic: &str) -> anyhow::Result<i32> {
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(15))?;
    Ok(metadata.topics()[0].partitions().len() as i32)
}

/// The `word-count` plugin's words: runs of alphanumeric characters,
/// lowercased, of the value or of its JSON `field`.
fn count_words(value: &[u8], field: Option<&str>, counts: &mut HashMap<String, i64>) {
    let json;
    let text = match field {
        None => match std::str::from_utf8(value) {
            Ok(text) => text,
            Err(_) => return,
        },
        Some(field) => {
            json = serde_json::from_slice::<serde_json::Value>(value).ok();
            match json
                .as_ref()
                .and_then(|v| v.get(field))
                .and_then(|f| f.as_str())
            {
                Some(text) => text,
                None => return,
            }
        }
    };
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        *counts.entry(word.to_lowercase()).or_default() += 1;
    }
}

async fn connect(url: &str, table: &str) -> anyhow::Result<sqlx::PgPool> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (word TEXT PRIMARY KEY, n BIGINT NOT NULL)"
    ))
    .execute(&pool)
    .await?;
    Ok(pool)
}

async fn upsert(
    pool: &sqlx::PgPool,
    table: &str,
    counts: &HashMap<String, i64>,
) -> anyhow::Result<()> {
    let (words, ns): (Vec<&str>, Vec<i64>) = counts.iter().map(|(w, n)| (w.as_str(), *n)).unzip();
    let mut tx = pool.begin().await?;
    sqlx::query(&format!(
        "INSERT INTO {table} (word, n) SELECT * FROM UNNEST($1::text[], $2::bigint[]) \
         ON CONFLICT (word) DO UPDATE SET n = {table}.n + EXCLUDED.n"
    ))
    .bind(&words)
    .bind(&ns)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}
