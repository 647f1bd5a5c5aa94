//! The keyed-state workload the state tests run: the `tally` plugin counts
//! records per key per partition in state and writes each record's running
//! count. Its input has keys that repeat; its expected rows and final state
//! are recomputed from an independent `read_committed` read of the input
//! alone, so a state write lost, doubled or leaked from a fenced zombie
//! shows as a wrong count.
//!
//! It must not read what it checks through sluice: rows and state are read
//! from the sink's tables directly.

use crate::redis_server::RedisServer;
use crate::sinks::SinkDb;
use crate::{PipelineToml, Produce, Seen, Target};
use std::collections::BTreeMap;

/// How many distinct keys the input repeats.
pub const KEYS: usize = 300;

/// A tally pipeline of `pipeline` reading topic `pipeline`.
pub fn config(pipeline: &str, brokers: &str, max_records: u32) -> PipelineToml {
    PipelineToml::new(pipeline, brokers, &[pipeline], &crate::plugin("tally"))
        .max_records_per_partition(max_records)
        .batch_interval_ms(100)
        .short_session()
        .target(
            Target::new("tallies")
                .column("partition", "integer")
                .column("offset", "integer")
                .column("key", "blob")
                .column("n", "integer"),
        )
}

/// `records` with their keys folded onto [`KEYS`] repeating keys.
pub fn keyed(records: Vec<Produce>) -> Vec<Produce> {
    records
        .into_iter()
        .enumerate()
        .map(|(i, r)| Produce {
            key: Some(format!("k{}", (i * 7919) % KEYS)),
            ..r
        })
        .collect()
}

/// One row of `tallies`: (partition, offset, key, n).
pub type Tally = (i64, i64, Vec<u8>, i64);

/// What the tally pipeline must leave, recomputed from its input.
#[derive(Debug, Default, PartialEq)]
pub struct Expected {
    /// In (partition, offset) order.
    pub rows: Vec<Tally>,
    /// (partition, key) -> count.
    pub state: BTreeMap<(i64, Vec<u8>), i64>,
}

impl Expected {
    /// Counts `input` (in (partition, offset) order) per partition and key,
    /// leaving out records whose value is in `skipped` (dead letters).
    pub fn of(input: &[Seen], skipped: &[&str]) -> Expected {
        let mut e = Expected::default();
        for r in input {
            if skipped.contains(&r.value.as_str()) {
                continue;
            }
            let key = r.key.clone().unwrap_or_default().into_bytes();
            let n = e
                .state
                .entry((r.partition as i64, key.clone()))
                .or_default();
            *n += 1;
            e.rows.push((r.partition as i64, r.offset, key, *n));
        }
        e
    }
}

/// The `tallies` table and the pipeline's stored state, as the sink holds
/// them.
pub async fn stored(db: &SinkDb, pipeline: &str) -> Expected {
    let pool = db.pool().await;
    let (p, o) = (db.ident("partition"), db.ident("offset"));
    let rows_sql = format!(
        "SELECT {p}, {o}, {k}, {n} FROM {t} ORDER BY {p}, {o}",
        k = db.ident("key"),
        n = db.ident("n"),
        t = db.table("tallies")
    );
    let rows: Vec<Tally> = sqlx::query_as(&rows_sql)
        .fetch_all(&pool)
        .await
        .expect("tallies table");
    pool.close().await;
    Expected {
        rows,
        state: stored_state(db, pipeline).await,
    }
}

/// The pipeline's stored state in `db` (a sink's database, or the
/// `[state]` database of a sink that keeps none of its own), read directly.
pub async fn stored_state(db: &SinkDb, pipeline: &str) -> BTreeMap<(i64, Vec<u8>), i64> {
    stored_keys(db, pipeline)
        .await
        .into_iter()
        .map(|(key, value)| {
            let n = String::from_utf8(value)
                .ok()
                .and_then(|v| v.parse().ok())
                .expect("a count as decimal text");
            (key, n)
        })
        .collect()
}

/// Every key the pipeline keeps in `db` (a SQL database), per partition,
/// with its value, read directly: the state table's rows with the state
/// journal's rows of each partition laid over them in order.
pub async fn stored_keys(db: &SinkDb, pipeline: &str) -> BTreeMap<(i64, Vec<u8>), Vec<u8>> {
    let pool = db.pool().await;
    let p = db.ident("partition");
    // As hex: MySQL reports the VARBINARY key to the `Any` driver as text.
    let key_hex = match db {
        SinkDb::Postgres { .. } => "encode(k.state_key, 'hex')",
        _ => "hex(k.state_key)",
    };
    let scopes = db.table("sluice_state_scopes");
    let state_sql = format!(
        "SELECT s.{p}, {key_hex}, k.value FROM {state} k JOIN {scopes} s ON s.scope = k.scope \
         WHERE s.pipeline = '{pipeline}'",
        state = db.table("sluice_keyed_state"),
    );
    let stored: Vec<(i64, String, Vec<u8>)> = sqlx::query_as(&state_sql)
        .fetch_all(&pool)
        .await
        .expect("state table");
    let journal_sql = format!(
        "SELECT s.{p}, j.changes FROM {journal} j JOIN {scopes} s ON s.scope = j.scope \
         WHERE s.pipeline = '{pipeline}' ORDER BY s.{p}, j.seq",
        journal = db.table("sluice_state_journal"),
    );
    let journal: Vec<(i64, Vec<u8>)> = sqlx::query_as(&journal_sql)
        .fetch_all(&pool)
        .await
        .expect("state journal");
    pool.close().await;
    let mut keys: BTreeMap<(i64, Vec<u8>), Vec<u8>> = stored
        .into_iter()
        .map(|(partition, key, value)| ((partition, hex::decode(key).expect("hex")), value))
        .collect();
    for (partition, changes) in journal {
        let changes = sluice::state::decode_keys(&changes).expect("a journal row");
        for (key, value) in changes {
            match value {
                Some(v) => keys.insert((partition, key), v.value),
                None => keys.remove(&(partition, key)),
            };
        }
    }
    keys
}

/// `config` (a tally pipeline's) into Redis at `url`: each row `hset`
/// into `tallies:{partition}`, field `{offset}`, value `{key} {n}`.
pub fn redis_config(config: PipelineToml, url: &str) -> PipelineToml {
    config
        .sink_url(url)
        .sink("lock_timeout_ms", 3000)
        .targets(|target| {
            target.redis(&[
                ("command", "hset".into()),
                ("key", "tallies:{partition}".into()),
                ("field", "{offset}".into()),
                ("value", "{key} {n}".into()),
            ])
        })
}

/// What [`redis_config`] wrote and the pipeline's stored state (topic
/// `pipeline`, `partitions` partitions), from the server directly.
pub fn stored_redis(server: &RedisServer, pipeline: &str, partitions: i32) -> Expected {
    use redis::Commands;
    let mut conn = server.conn();
    let mut e = Expected::default();
    for p in 0..partitions {
        let rows: BTreeMap<i64, String> = conn.hgetall(format!("tallies:{p}")).expect("HGETALL");
        for (offset, row) in rows {
            let (key, n) = row.rsplit_once(' ').expect("`key n`");
            e.rows.push((
                p as i64,
                offset,
                key.as_bytes().to_vec(),
                n.parse().expect("n"),
            ));
        }
        let hash = format!("sluice_state:{pipeline}:{pipeline}:{p}");
        let state: BTreeMap<Vec<u8>, Vec<u8>> = conn.hgetall(hash).expect("HGETALL state");
        for (key, stored) in state {
            // Tag 1: no expiry; the value follows.
            assert_eq!(stored.first(), Some(&1), "a stored value's tag");
            let n = std::str::from_utf8(&stored[1..]).unwrap().parse().unwrap();
            e.state.insert((p as i64, key), n);
        }
    }
    e
}

/// Asserts the sink holds exactly what `expected` says: every row once
/// with its count, and the final count of every key.
pub async fn assert_stored(db: &SinkDb, pipeline: &str, expected: &Expected) {
    assert_same(pipeline, &stored(db, pipeline).await, expected);
}

/// Asserts `actual` (what a sink holds) is `expected`, row by row and key
/// by key.
pub fn assert_same(pipeline: &str, actual: &Expected, expected: &Expected) {
    assert_eq!(
        actual.rows.len(),
        expected.rows.len(),
        "{pipeline}: row count differs from the recomputation"
    );
    if let Some(at) = (0..actual.rows.len()).find(|&i| actual.rows[i] != expected.rows[i]) {
        panic!(
            "{pipeline}: row {at} is {:?}, the recomputation says {:?}",
            actual.rows[at], expected.rows[at]
        );
    }
    assert_eq!(
        actual.state.len(),
        expected.state.len(),
        "{pipeline}: number of state keys"
    );
    assert!(
        actual.state == expected.state,
        "{pipeline}: final state differs from the recomputation"
    );
}
