//! The event-time workload: the `windows` plugin sums `amount` per key in
//! tumbling, hopping or session windows of the records' own time (`ts` in
//! the value), over input that arrives out of order, some of it behind
//! the allowed lateness. What it must leave (every final window, every
//! late record) is recomputed here from an independent `read_committed`
//! read of the input alone, record by record, as the contract defines it:
//! the watermark before a record is the highest `ts` of its partition's
//! records before it minus the lateness; a window `[start, end)` is closed
//! once the watermark reaches `end - 1`; with a retention `R`, a record
//! behind the watermark updates a closed window while `end - 1 + R` is
//! past it (a closed session: if its time is within the session's first
//! and last record).
//!
//! It must not read what it checks through sluice: rows and dead letters
//! are read from the sink's tables directly.

use crate::sinks::SinkDb;
use crate::{PipelineToml, Produce, Seen, Target};
use std::collections::{BTreeMap, BTreeSet};

/// Event time of the first record: a fixed instant, so runs are alike.
pub const T0: i64 = 1_700_000_000_000;

/// How windows are cut.
#[derive(Debug, Clone, Copy)]
pub enum Shape {
    Tumbling { size_ms: i64 },
    Hopping { size_ms: i64, hop_ms: i64 },
    Session { gap_ms: i64 },
}

impl Shape {
    fn params(self, config: PipelineToml) -> PipelineToml {
        match self {
            Shape::Tumbling { size_ms } => config
                .module_param("windows", "tumbling")
                .module_param("size_ms", size_ms),
            Shape::Hopping { size_ms, hop_ms } => config
                .module_param("windows", "hopping")
                .module_param("size_ms", size_ms)
                .module_param("hop_ms", hop_ms),
            Shape::Session { gap_ms } => config
                .module_param("windows", "session")
                .module_param("gap_ms", gap_ms),
        }
    }
}

/// A windows pipeline of `pipeline` reading topic `pipeline`, its event
/// time the records' `ts`, its watermark `lateness.allowed_ms` behind, its
/// closed windows retained `lateness.retain_ms`.
pub fn config(pipeline: &str, brokers: &str, shape: Shape, lateness: Lateness) -> PipelineToml {
    let config = PipelineToml::new(pipeline, brokers, &[pipeline], &crate::plugin("windows"))
        .max_records_per_partition(200)
        .batch_interval_ms(100)
        .short_session()
        .module_param("time_field", "ts")
        .module_param("retain_ms", lateness.retain_ms)
        .field("event_time", "allowed_lateness_ms", lateness.allowed_ms)
        .target(
            Target::new("windows")
                .column("partition", "integer")
                .column("key", "text")
                .column("start_ms", "integer")
                .column("end_ms", "integer")
                .column("total", "integer")
                .column("records", "integer")
                .column("emit", "text"),
        );
    shape.params(config)
}

/// A record of the input: its partition, key, event time and amount.
pub fn record(partition: i32, key: &str, ts: i64, amount: i64) -> Produce {
    Produce {
        partition,
        key: Some(key.to_string()),
        value: format!(r#"{{"amount":{amount},"ts":{ts}}}"#),
    }
}

/// `per_partition` records on each of `partitions`, 50 ms of event time
/// apart, most a little out of order (up to 300 ms), one in ten up to 4 s
/// (behind a lateness of 1 s, some land in closed windows); keys come in
/// bursts (a few of 30 per partition at a time), so sessions open and
/// close. Then one record per partition far ahead, which closes every
/// window before it.
pub fn input(partitions: i32, per_partition: usize, rng: &mut impl rand::Rng) -> Vec<Produce> {
    let mut records = Vec::new();
    for i in 0..per_partition {
        for p in 0..partitions {
            let back = match rng.gen_range(0..10) {
                0 => rng.gen_range(0..4_000),
                _ => rng.gen_range(0..300),
            };
            let ts = T0 + i as i64 * 50 - back;
            let k = ((i / 400) + rng.gen_range(0..3)) % 30;
            let key = format!("u{}", k as i32 * partitions + p);
            records.push(record(p, &key, ts, rng.gen_range(1..100)));
        }
    }
    for p in 0..partitions {
        records.push(record(p, "flush", T0 + 1_000_000_000, 0));
    }
    records
}

/// A window's final row: (partition, key, start, end, total, records).
pub type Row = (i64, String, i64, i64, i64, i64);

/// What the pipeline must leave.
#[derive(Debug, Default, PartialEq)]
pub struct Expected {
    /// Every window's final row (its value when it closed).
    pub rows: Vec<Row>,
    /// Every window late records updated, with its last value.
    pub updated: Vec<Row>,
    /// (partition, offset) of every late record no window took.
    pub late: BTreeSet<(i64, i64)>,
}

/// How late records are taken.
#[derive(Debug, Clone, Copy)]
pub struct Lateness {
    /// The watermark's distance behind the newest record
    /// (`event_time.allowed_lateness_ms`).
    pub allowed_ms: i64,
    /// How long a closed window still takes late records (the windows'
    /// `retain_ms`; 0: none, each late record is a dead letter).
    pub retain_ms: i64,
}

/// A window being filled: (start, end, total, records).
type Open = (i64, i64, i64, i64);

fn parse(r: &Seen) -> (i64, i64) {
    let v: serde_json::Value = serde_json::from_str(&r.value).expect("JSON input");
    (
        v["ts"].as_i64().expect("ts"),
        v["amount"].as_i64().expect("amount"),
    )
}

impl Expected {
    /// Recomputes `input` (in (partition, offset) order) record by record.
    pub fn of(input: &[Seen], shape: Shape, lateness: Lateness) -> Expected {
        let mut e = Expected::default();
        let mut by_partition: BTreeMap<i32, Vec<&Seen>> = BTreeMap::new();
        for r in input {
            by_partition.entry(r.partition).or_default().push(r);
        }
        for (p, records) in by_partition {
            let mut watermark: Option<i64> = None;
            // key -> windows of that key, open or closed (not yet out).
            let mut windows: BTreeMap<String, Vec<Open>> = BTreeMap::new();
            // (key, start, end) of a closed window -> (total, records) of
            // the late records that updated it.
            let mut updates: BTreeMap<(String, i64, i64), (i64, i64)> = BTreeMap::new();
            for r in records {
                let (ts, amount) = parse(r);
                let key = r.key.clone().unwrap_or_default();
                let open = |end: i64| watermark.is_none_or(|w| end - 1 > w);
                let retained = |end: i64| {
                    lateness.retain_ms > 0
                        && watermark.is_some_and(|w| end - 1 + lateness.retain_ms > w)
                };
                let mut update = |start: i64, end: i64| {
                    let u = updates.entry((key.clone(), start, end)).or_default();
                    (u.0, u.1) = (u.0 + amount, u.1 + 1);
                };
                let kept = windows.entry(key.clone()).or_default();
                let added = match shape {
                    Shape::Session { gap_ms } => {
                        let (mut start, mut end) = (ts, ts + gap_ms);
                        let meets = |w: &Open| open(w.1) && w.0 < ts + gap_ms && ts < w.1;
                        for w in kept.iter().filter(|w| meets(w)) {
                            (start, end) = (start.min(w.0), end.max(w.1));
                        }
                        if open(end) {
                            let (mut total, mut count) = (amount, 1);
                            kept.retain(|w| {
                                let joins = meets(w);
                                if joins {
                                    (total, count) = (total + w.2, count + w.3);
                                }
                                !joins
                            });
                            kept.push((start, end, total, count));
                            true
                        } else {
                            let holds = |w: &&Open| {
                                !open(w.1) && retained(w.1) && w.0 <= ts && ts <= w.1 - gap_ms
                            };
                            let closed = kept.iter().find(holds);
                            closed.map(|w| update(w.0, w.1)).is_some()
                        }
                    }
                    Shape::Tumbling { size_ms } | Shape::Hopping { size_ms, .. } => {
                        let hop = match shape {
                            Shape::Hopping { hop_ms, .. } => hop_ms,
                            _ => size_ms,
                        };
                        let mut start = ts - ts.rem_euclid(hop);
                        let mut added = false;
                        while start > ts - size_ms {
                            let end = start + size_ms;
                            if open(end) {
                                match kept.iter_mut().find(|w| w.0 == start) {
                                    Some(w) => (w.2, w.3) = (w.2 + amount, w.3 + 1),
                                    None => kept.push((start, end, amount, 1)),
                                }
                                added = true;
                            } else if retained(end) {
                                update(start, end);
                                added = true;
                            }
                            start -= hop;
                        }
                        added
                    }
                };
                if !added {
                    e.late.insert((p as i64, r.offset));
                }
                watermark = watermark.max(Some(ts - lateness.allowed_ms));
            }
            for ((key, start, end), (total, count)) in updates {
                let closed = windows[&key].iter().find(|w| (w.0, w.1) == (start, end));
                let (t, c) = closed.map(|w| (w.2, w.3)).unwrap_or_default();
                e.updated
                    .push((p as i64, key, start, end, total + t, count + c));
            }
            for (key, kept) in windows {
                for (start, end, total, count) in kept {
                    if watermark.is_some_and(|w| end - 1 <= w) {
                        e.rows
                            .push((p as i64, key.clone(), start, end, total, count));
                    }
                }
            }
        }
        e.rows.sort();
        e.updated.sort();
        e
    }
}

/// Each window's last `update` row of `rows` (the one with the most
/// records: each update adds some), sorted.
pub fn last_updates(rows: impl IntoIterator<Item = Row>) -> Vec<Row> {
    let mut last: BTreeMap<(i64, String, i64, i64), Row> = BTreeMap::new();
    for row in rows {
        let window = (row.0, row.1.clone(), row.2, row.3);
        match last.get(&window) {
            Some(kept) if kept.5 >= row.5 => {}
            _ => {
                last.insert(window, row);
            }
        }
    }
    last.into_values().collect()
}

/// The rows of `windows` in `db` emitted as `emit` (final, update), sorted.
pub async fn rows_emitted(db: &SinkDb, emit: &str) -> Vec<Row> {
    let sql = format!(
        "SELECT {}, {}, {}, {}, {}, {} FROM {} WHERE {} = '{emit}'",
        db.ident("partition"),
        db.ident("key"),
        db.ident("start_ms"),
        db.ident("end_ms"),
        db.ident("total"),
        db.ident("records"),
        db.table("windows"),
        db.ident("emit"),
    );
    let pool = db.pool().await;
    let mut rows: Vec<Row> = sqlx::query_as(&sql).fetch_all(&pool).await.expect("query");
    pool.close().await;
    rows.sort();
    rows
}

/// (partition, offset) of every `late` dead letter of `db`.
pub async fn late_records(db: &SinkDb) -> BTreeSet<(i64, i64)> {
    let sql = format!(
        "SELECT {}, {} FROM {} WHERE {} = 'late'",
        db.ident("partition"),
        db.ident("offset"),
        db.table("sluice_dead_letters"),
        db.ident("kind"),
    );
    let pool = db.pool().await;
    let rows: Vec<(i64, i64)> = sqlx::query_as(&sql).fetch_all(&pool).await.expect("query");
    pool.close().await;
    rows.into_iter().collect()
}

/// Asserts `db` holds exactly `expected`: each final window once with its
/// value, each updated window's last value, each late record once,
/// nothing else.
pub async fn assert_stored(db: &SinkDb, name: &str, expected: &Expected) {
    let rows = rows_emitted(db, "final").await;
    let distinct: BTreeSet<&Row> = rows.iter().collect();
    assert_eq!(distinct.len(), rows.len(), "{name}: a window emitted twice");
    if rows != expected.rows {
        let want: BTreeSet<&Row> = expected.rows.iter().collect();
        let missing: Vec<_> = want.difference(&distinct).take(5).collect();
        let extra: Vec<_> = distinct.difference(&want).take(5).collect();
        panic!(
            "{name}: {} final windows, {} expected; missing {missing:?}, unexpected {extra:?}",
            rows.len(),
            expected.rows.len()
        );
    }
    assert_eq!(
        last_updates(rows_emitted(db, "update").await),
        expected.updated,
        "{name}: updated windows"
    );
    assert_eq!(
        late_records(db).await,
        expected.late,
        "{name}: late records"
    );
}
