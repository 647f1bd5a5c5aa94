//! Test scenarios every SQL backend must pass, run by each backend's own
//! `tests.rs` against its real database: fencing, write modes (with keys
//! repeated inside one batch), identifiers from config, output that does not
//! fit, dead letters, the at-least-once split, and keyed state (with many
//! deletes in one batch, and through the state journal).
//!
//! Checks go through the sink's public API and single-value queries, so one
//! scenario serves every dialect. It must not know any one backend.

use super::{Dialect, Param, SqlBackend, SqlSink};
use crate::batch::{OwnedRecord, Plan, Records, TopicPartition, single_partition_batch};
use crate::config::{PipelineConfig, SinkConfig};
use crate::output::{Column, ColumnData, Output, TargetRows};
use crate::sink::{Commit, CommitOutcome, DeadLetter, DeadLetterKind, SinkError};
use sluice_core::state::{StateMap, StateValue};
pub use sluice_core::testing::words_output;

/// A sink config for `url` with the given `[[sink.targets]]` (and extra
/// `[sink]` keys before them).
pub fn sink_config(url: &str, schema: Option<&str>, extra: &str, targets: &str) -> SinkConfig {
    let schema = schema
        .map(|s| format!("schema = \"{s}\""))
        .unwrap_or_default();
    let text = format!(
        r#"
pipeline = "p"
[source]
brokers = "x"
topics = ["t"]
[module]
path = "m.wasm"
[sink]
url = "{url}"
{schema}
{extra}
{targets}
"#
    );
    PipelineConfig::parse(&text).expect("config").sink
}

pub const COUNTS: &str = r#"
[[sink.targets]]
name = "counts"
mode = "accumulate"
key = ["word"]
columns = { word = "text", n = "integer" }
"#;

pub const MODES: &str = r#"
[[sink.targets]]
name = "counts"
table = "log"
columns = { word = "text", n = "integer" }

[[sink.targets]]
name = "latest"
mode = "upsert"
key = ["word"]
columns = { word = "text", n = "integer" }

[[sink.targets]]
name = "gone"
table = "latest"
mode = "delete"
key = ["word"]
columns = { word = "text" }

[[sink.targets]]
name = "totals"
mode = "accumulate"
key = ["word"]
columns = { word = "text", n = "integer", x = "real" }
"#;

/// Table and column names no one should paste into SQL.
pub const WEIRD: &str = r#"
[[sink.targets]]
name = "counts"
table = 'we"ird `table`; DROP TABLE sluice_checkpoints; --'
mode = "accumulate"
key = ["the word"]
columns = { "the word" = "text", 'n"`' = "integer" }
"#;

pub fn batch(from: i64, until: i64) -> (Plan, Records) {
    let owned: Vec<OwnedRecord> = (from..until)
        .map(|o| OwnedRecord {
            offset: o,
            timestamp: 0,
            key: None,
            value: Some(vec![b'x']),
            headers: vec![],
        })
        .collect();
    single_partition_batch("p", "t", &owned, 0)
}

pub async fn try_commit<B: SqlBackend>(
    sink: &SqlSink<B>,
    from: i64,
    until: i64,
    output: &Output,
    dead_letters: &[DeadLetter],
) -> Result<CommitOutcome, SinkError> {
    try_commit_reading(sink, from, until, output, dead_letters, &Default::default()).await
}

/// [`try_commit`] of a batch that read `state_reads` of its start state.
async fn try_commit_reading<B: SqlBackend>(
    sink: &SqlSink<B>,
    from: i64,
    until: i64,
    output: &Output,
    dead_letters: &[DeadLetter],
    state_reads: &StateMap,
) -> Result<CommitOutcome, SinkError> {
    let (plan, records) = batch(from, until);
    let digest = sluice_core::sink::digest(output, dead_letters);
    let c = Commit {
        plan: &plan,
        records: &records,
        output,
        dead_letters,
        output_digest: &digest,
        state_reads,
    };
    sink.commit(&c).await
}

/// Keyed state through the batch transaction and back through the state
/// store: sets (a key that is not UTF-8, a value with an expiry), the same
/// key in two partitions (each its own scope), then a delete and an
/// overwrite of keys the batch read with values; reads of one key, of many
/// keys at once (repeated and missing ones too) and of a whole partition.
pub async fn state_round_trip<B: SqlBackend>(sink: &SqlSink<B>, config: &SinkConfig) {
    use sluice_core::state::StateStore;
    let store = crate::SqlStateStore::open(&config.store()).await.unwrap();
    let tp = |partition: i32| TopicPartition {
        topic: "t".into(),
        partition,
    };
    let value = |v: &[u8], expires_at_ms: Option<i64>| {
        Some(StateValue {
            value: v.to_vec(),
            expires_at_ms,
        })
    };
    let odd = vec![0xff, 0x00, b'k'];
    let mut first = Output::default();
    let mut reads = StateMap::default();
    for (p, key, v) in [
        (0, b"a".to_vec(), value(b"1", None)),
        (0, odd.clone(), value(b"2", Some(5))),
        (1, b"a".to_vec(), value(b"other", None)),
    ] {
        first.state.insert(&tp(p), key.clone(), v);
        reads.insert(&tp(p), key, None);
    }
    let landed = try_commit_reading(sink, 0, 2, &first, &[], &reads).await;
    assert_eq!(landed.unwrap(), CommitOutcome::Committed);
    let get = |p: i32, key: &[u8]| {
        let (store, key) = (&store, key.to_vec());
        async move { store.get("p", &tp(p), &key).await.unwrap() }
    };
    assert_eq!(get(0, b"a").await, value(b"1", None));
    assert_eq!(get(0, &odd).await, value(b"2", Some(5)));
    assert_eq!(get(1, b"a").await, value(b"other", None));
    assert_eq!(get(2, b"a").await, None, "a partition never numbered");
    let many = store
        .get_many("p", &tp(0), &[b"a", b"missing", &odd, b"a"])
        .await
        .unwrap();
    assert_eq!(
        many,
        [
            value(b"1", None),
            None,
            value(b"2", Some(5)),
            value(b"1", None)
        ]
    );

    let mut second = Output::default();
    second.state.insert(&tp(0), b"a".to_vec(), None);
    second.state.insert(&tp(0), odd.clone(), value(b"3", None));
    let mut reads = StateMap::default();
    reads.insert(&tp(0), b"a".to_vec(), value(b"1", None));
    reads.insert(&tp(0), odd.clone(), value(b"2", Some(5)));
    let landed = try_commit_reading(sink, 2, 4, &second, &[], &reads).await;
    assert_eq!(landed.unwrap(), CommitOutcome::Committed);
    assert_eq!(get(0, b"a").await, None, "deleted");
    assert_eq!(get(0, &odd).await, value(b"3", None), "overwritten");
    let whole = store.load("p", &tp(0), 1 << 20).await.unwrap().unwrap();
    assert_eq!(
        whole,
        [(
            odd,
            StateValue {
                value: b"3".to_vec(),
                expires_at_ms: None
            }
        )]
    );
    assert_eq!(get(1, b"a").await, value(b"other", None), "untouched");
    let size = |p: i32| {
        let store = &store;
        async move { store.size("p", &tp(p)).await.unwrap() }
    };
    let of = |keys, bytes| sluice_core::state::StateSize { keys, bytes };
    assert_eq!(size(0).await, of(1, 3 + 1), "the odd key and \"3\"");
    assert_eq!(size(1).await, of(1, 1 + 5));
    assert_eq!(size(2).await, of(0, 0), "a partition never numbered");
}

/// Many state deletes in one batch: three partitions, more keys in one
/// than a delete statement lists, keys that are prefixes of others and a
/// key never stored. Exactly the deleted keys go; the others stay.
pub async fn state_bulk_deletes<B: SqlBackend>(sink: &SqlSink<B>, config: &SinkConfig) {
    use sluice_core::state::StateStore;
    let store = crate::SqlStateStore::open(&config.store()).await.unwrap();
    let tp = |partition: i32| TopicPartition {
        topic: "bulk".into(),
        partition,
    };
    const KEYS: usize = 1_200;
    let key = |i: usize| format!("k{i}").into_bytes();
    let stored = |i: usize| StateValue {
        value: vec![i as u8],
        expires_at_ms: None,
    };
    let (mut first, mut absent) = (Output::default(), StateMap::default());
    for p in 0..3 {
        for i in 0..KEYS {
            first.state.insert(&tp(p), key(i), Some(stored(i)));
            absent.insert(&tp(p), key(i), None);
        }
    }
    let landed = try_commit_reading(sink, 0, 1, &first, &[], &absent).await;
    assert_eq!(landed.unwrap(), CommitOutcome::Committed);

    // Partition 0 loses its even keys, 1 all but k7, 2 nothing; a key
    // that was never stored is deleted too.
    let gone = |p: i32, i: usize| match p {
        0 => i.is_multiple_of(2),
        1 => i != 7,
        _ => false,
    };
    let (mut second, mut read) = (Output::default(), StateMap::default());
    for p in 0..2 {
        for i in (0..KEYS).filter(|&i| gone(p, i)) {
            second.state.insert(&tp(p), key(i), None);
            read.insert(&tp(p), key(i), Some(stored(i)));
        }
    }
    second.state.insert(&tp(0), b"never".to_vec(), None);
    read.insert(&tp(0), b"never".to_vec(), None);
    let landed = try_commit_reading(sink, 1, 2, &second, &[], &read).await;
    assert_eq!(landed.unwrap(), CommitOutcome::Committed);

    for p in 0..3 {
        let mut whole = store.load("p", &tp(p), 1 << 24).await.unwrap().unwrap();
        whole.sort_by(|a, b| a.0.cmp(&b.0));
        let mut expected: Vec<(Vec<u8>, StateValue)> = (0..KEYS)
            .filter(|&i| !gone(p, i))
            .map(|i| (key(i), stored(i)))
            .collect();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            whole, expected,
            "partition {p} keeps exactly its undeleted keys"
        );
    }
}

/// `[sink]` of [`state_journal`]: three batches a partition's journal.
pub const JOURNAL_OF_THREE: &str = "state_journal_batches = 3";

/// The state journal (a sink with [`JOURNAL_OF_THREE`]): every batch of a
/// partition rewriting most of its keys and deleting others goes into the
/// journal twice, then merges into the table; after each, every read of
/// the store (one key, many, the whole partition, pages in key order,
/// the size) agrees with the state the batches made. Then batches of new
/// keys only: their merge does not pay, and the next batch writes the
/// table directly.
pub async fn state_journal<B: SqlBackend>(
    sink: &SqlSink<B>,
    config: &SinkConfig,
    schema: Option<&str>,
) {
    use sluice_core::state::{ScanPage, StateSize, StateStore};
    use std::collections::BTreeMap;
    let store = crate::SqlStateStore::open(&config.store()).await.unwrap();
    let n = Names::of(sink, schema);
    let journal_rows = n.count(&format!("{}state_journal", config.store().table_prefix));
    let mut model: BTreeMap<Vec<u8>, StateValue> = BTreeMap::new();
    let batch_state = |model: &mut BTreeMap<Vec<u8>, StateValue>,
                       changes: Vec<(Vec<u8>, Option<StateValue>)>| {
        let (mut output, mut reads) = (Output::default(), StateMap::default());
        for (key, value) in changes {
            reads.insert(&tp(), key.clone(), model.get(&key).cloned());
            match &value {
                Some(v) => model.insert(key.clone(), v.clone()),
                None => model.remove(&key),
            };
            output.state.insert(&tp(), key, value);
        }
        (output, reads)
    };
    let check = |model: BTreeMap<Vec<u8>, StateValue>, at: String| {
        let store = &store;
        async move {
            let mut asked: Vec<Vec<u8>> = (0..20).map(|i| format!("k{i}").into_bytes()).collect();
            asked.push(b"missing".to_vec());
            let refs: Vec<&[u8]> = asked.iter().map(Vec::as_slice).collect();
            let many = store.get_many("p", &tp(), &refs).await.unwrap();
            let expected: Vec<Option<StateValue>> =
                asked.iter().map(|k| model.get(k).cloned()).collect();
            assert_eq!(many, expected, "get_many {at}");
            for key in [&asked[0], &asked[5], &asked[20]] {
                let one = store.get("p", &tp(), key).await.unwrap();
                assert_eq!(one, model.get(key).cloned(), "get {at}");
            }
            let mut whole = store.load("p", &tp(), 1 << 20).await.unwrap().unwrap();
            whole.sort_by(|a, b| a.0.cmp(&b.0));
            let all: Vec<(Vec<u8>, StateValue)> =
                model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            assert_eq!(whole, all, "load {at}");
            for prefix in [b"k".to_vec(), b"k1".to_vec(), Vec::new()] {
                let mut page = ScanPage {
                    prefix: prefix.clone(),
                    after: None,
                    limit: 3,
                };
                let mut scanned = Vec::new();
                loop {
                    let keys = store.scan("p", &tp(), &page).await.unwrap();
                    let done = keys.len() < page.limit;
                    page.after = keys.last().map(|(k, _)| k.clone());
                    scanned.extend(keys);
                    if done {
                        break;
                    }
                }
                let expected: Vec<(Vec<u8>, StateValue)> = all
                    .iter()
                    .filter(|(k, _)| k.starts_with(&prefix))
                    .cloned()
                    .collect();
                assert_eq!(scanned, expected, "scan of {prefix:?} {at}");
            }
            let mut size = StateSize::default();
            for (key, value) in &model {
                size.count(key.len(), &Some(value.clone()), 1);
            }
            assert_eq!(store.size("p", &tp()).await.unwrap(), size, "size {at}");
        }
    };
    let value = |v: String| StateValue {
        value: v.into_bytes(),
        expires_at_ms: None,
    };
    // Batches 0 to 8 rewrite most of 20 keys and delete the rest: two
    // journal rows, then a merge. Batches 9 to 12 write new keys only:
    // appended twice, merged (not worth it), then straight into the table.
    let journal_after = [1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 0];
    for (b, rows_after) in (0i64..).zip(journal_after) {
        let changes = match b {
            0..9 => (0..20)
                .map(|i| {
                    let key = format!("k{i}").into_bytes();
                    match (i + b) % 3 {
                        0 => (key, None),
                        _ => (key, Some(value(format!("{b}-{i}")))),
                    }
                })
                .collect(),
            _ => (0..10)
                .map(|i| (format!("n{b}-{i}").into_bytes(), Some(value(b.to_string()))))
                .collect(),
        };
        let (output, reads) = batch_state(&mut model, changes);
        let landed = try_commit_reading(sink, b, b + 1, &output, &[], &reads).await;
        assert_eq!(landed.unwrap(), CommitOutcome::Committed);
        let rows = value_of(sink, &journal_rows).await;
        assert_eq!(rows, rows_after, "journal rows after batch {b}");
        check(model.clone(), format!("after batch {b}")).await;
    }
}

/// [`value`] of a count.
async fn value_of<B: SqlBackend>(sink: &SqlSink<B>, sql: &str) -> i64 {
    value(sink, sql, &[]).await.unwrap_or(0)
}

async fn commit<B: SqlBackend>(
    sink: &SqlSink<B>,
    from: i64,
    until: i64,
    output: &Output,
) -> CommitOutcome {
    try_commit(sink, from, until, output, &[])
        .await
        .expect("commit reaches the database")
}

/// One integer from `sql` (placeholders in the dialect's style).
async fn value<B: SqlBackend>(sink: &SqlSink<B>, sql: &str, params: &[Param<'_>]) -> Option<i64> {
    sink.backend()
        .query_i64(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

struct Names {
    d: &'static Dialect,
    schema: Option<String>,
}

impl Names {
    fn of<B: SqlBackend>(sink: &SqlSink<B>, schema: Option<&str>) -> Names {
        Names {
            d: sink.backend().dialect(),
            schema: schema.map(str::to_string),
        }
    }
    fn table(&self, name: &str) -> String {
        self.d.qualified(self.schema.as_deref(), name).unwrap()
    }
    fn col(&self, name: &str) -> String {
        self.d.ident(name).unwrap()
    }
    /// `SELECT <col> FROM <table> WHERE <key> = ?`
    fn lookup(&self, table: &str, col: &str, key: &str) -> String {
        format!(
            "SELECT {} FROM {} WHERE {} = {}",
            self.col(col),
            self.table(table),
            self.col(key),
            self.d.param(1)
        )
    }
    fn count(&self, table: &str) -> String {
        format!("SELECT count(*) FROM {}", self.table(table))
    }
}

fn tp() -> TopicPartition {
    TopicPartition {
        topic: "t".into(),
        partition: 0,
    }
}

/// A stale `from` is fenced and rolls back everything; the rightful next
/// batch then commits.
pub async fn fencing<B: SqlBackend>(sink: &SqlSink<B>, schema: Option<&str>) {
    let n = Names::of(sink, schema);
    let a = n.lookup("counts", "n", "word");
    assert_eq!(
        commit(sink, 0, 10, &words_output("counts", &[("a", 1)])).await,
        CommitOutcome::Committed
    );
    // A zombie that planned the same range again (its `from` is stale).
    let fenced = commit(
        sink,
        0,
        10,
        &words_output("counts", &[("a", 100), ("zombie", 1)]),
    )
    .await;
    assert_eq!(
        fenced,
        CommitOutcome::Fenced {
            partition: "t[0]".into(),
            expected: 0,
            found: Some(10)
        }
    );
    // A zombie with an overlapping range.
    assert!(matches!(
        commit(sink, 5, 12, &words_output("counts", &[("b", 1)])).await,
        CommitOutcome::Fenced { .. }
    ));
    assert_eq!(value(sink, &a, &[Param::Text("a")]).await, Some(1));
    assert_eq!(value(sink, &n.count("counts"), &[]).await, Some(1));
    let batches = value(sink, &n.count("sluice_batches"), &[]).await;
    assert_eq!(batches, Some(1), "fenced batches leave no lineage");
    assert_eq!(
        commit(sink, 10, 20, &words_output("counts", &[("a", 2), ("b", 3)])).await,
        CommitOutcome::Committed
    );
    assert_eq!(value(sink, &a, &[Param::Text("a")]).await, Some(3));
    assert_eq!(value(sink, &a, &[Param::Text("b")]).await, Some(3));
    let stored = sink.checkpoints("p", &[tp()]).await.unwrap();
    assert_eq!(stored.get(&tp()), Some(&20));
    let ranges = value(sink, &n.count("sluice_batch_ranges"), &[]).await;
    assert_eq!(ranges, Some(2));
}

/// Append keeps every row, upsert keeps the last row per key (also within
/// one batch), accumulate adds (also within one batch), delete removes.
pub async fn write_modes<B: SqlBackend>(sink: &SqlSink<B>, schema: Option<&str>) {
    let n = Names::of(sink, schema);
    let mut out = words_output("counts", &[("a", 1), ("b", 2)]);
    out.targets.push(
        words_output("latest", &[("a", 1), ("b", 2), ("a", 7)])
            .targets
            .remove(0),
    );
    let mut totals = words_output("totals", &[("a", 1), ("a", 2), ("c", 5)])
        .targets
        .remove(0);
    totals.columns.push(Column {
        name: "x".into(),
        nulls: vec![0, 1, 0],
        data: ColumnData::Float64(vec![0.5, 9.0, 0.25]),
    });
    out.targets.push(totals.clone());
    assert_eq!(commit(sink, 0, 1, &out).await, CommitOutcome::Committed);

    let mut out2 = words_output("latest", &[("a", 5)]);
    out2.targets
        .push(words_output("counts", &[("a", 5)]).targets.remove(0));
    let mut gone = words_output("gone", &[("b", 0)]).targets.remove(0);
    gone.columns.truncate(1);
    out2.targets.push(gone);
    out2.targets.push(totals);
    assert_eq!(commit(sink, 1, 2, &out2).await, CommitOutcome::Committed);

    let log_a = format!(
        "{} WHERE {} = {}",
        n.count("log"),
        n.col("word"),
        n.d.param(1)
    );
    assert_eq!(value(sink, &log_a, &[Param::Text("a")]).await, Some(2));
    assert_eq!(value(sink, &n.count("log"), &[]).await, Some(3));
    let latest = n.lookup("latest", "n", "word");
    assert_eq!(value(sink, &latest, &[Param::Text("a")]).await, Some(5));
    assert_eq!(
        value(sink, &latest, &[Param::Text("b")]).await,
        None,
        "deleted"
    );
    let total = n.lookup("totals", "n", "word");
    assert_eq!(value(sink, &total, &[Param::Text("a")]).await, Some(6));
    assert_eq!(value(sink, &total, &[Param::Text("c")]).await, Some(10));
    // Nulls add nothing: x(a) = 0.5 + 0.5, scaled to compare as an integer.
    let x = format!(
        "SELECT CAST({} * 100 AS {}) FROM {} WHERE {} = {}",
        n.col("x"),
        if n.d.name == "MySQL" {
            "SIGNED"
        } else {
            "BIGINT"
        },
        n.table("totals"),
        n.col("word"),
        n.d.param(1)
    );
    assert_eq!(value(sink, &x, &[Param::Text("a")]).await, Some(100));
}

/// Quotes, backticks, spaces and SQL in names are quoted, never pasted.
pub async fn identifiers<B: SqlBackend>(sink: &SqlSink<B>, schema: Option<&str>) {
    let n = Names::of(sink, schema);
    let mut out = words_output("counts", &[("x", 4), ("x", 1)]);
    out.targets[0].columns[0].name = "the word".into();
    out.targets[0].columns[1].name = "n\"`".into();
    assert_eq!(commit(sink, 0, 1, &out).await, CommitOutcome::Committed);
    let sql = n.lookup(
        "we\"ird `table`; DROP TABLE sluice_checkpoints; --",
        "n\"`",
        "the word",
    );
    assert_eq!(value(sink, &sql, &[Param::Text("x")]).await, Some(5));
    let checkpoints = value(sink, &n.count("sluice_checkpoints"), &[]).await;
    assert_eq!(checkpoints, Some(1), "the checkpoint table survived");
}

/// A name with a control character never reaches the database.
pub fn bad_identifier(error: SinkError) {
    assert!(error.to_string().contains("invalid identifier"), "{error}");
}

pub const BAD_IDENT: &str = r#"
[[sink.targets]]
name = "counts"
table = "tab\u0000le"
columns = { word = "text" }
"#;

/// Output that does not match the declared columns is a config error and
/// commits nothing.
pub async fn mismatch<B: SqlBackend>(sink: &SqlSink<B>) {
    let mut out = words_output("counts", &[("a", 1)]);
    out.targets[0].columns[1].data = ColumnData::Float64(vec![1.5]);
    let err = try_commit(sink, 0, 1, &out, &[]).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("column `n` is Integer but the module wrote float64"),
        "{err}"
    );
    assert!(
        sink.checkpoints("p", &[tp()]).await.unwrap().is_empty(),
        "nothing committed"
    );
}

/// A dead letter keeps the record's value, kind and reason.
pub async fn dead_letters<B: SqlBackend>(sink: &SqlSink<B>, schema: Option<&str>) {
    let n = Names::of(sink, schema);
    let dead = [DeadLetter {
        index: 1,
        reason: "bad".into(),
        kind: DeadLetterKind::Rejected,
    }];
    let out = words_output("counts", &[]);
    let outcome = try_commit(sink, 0, 3, &out, &dead).await.unwrap();
    assert_eq!(outcome, CommitOutcome::Committed);
    let sql = format!(
        "SELECT {} FROM {} WHERE {} = {} AND {} = {} AND {} = {}",
        n.col("offset"),
        n.table("sluice_dead_letters"),
        n.col("kind"),
        n.d.param(1),
        n.col("reason"),
        n.d.param(2),
        n.col("record_value"),
        n.d.param(3)
    );
    let params = [
        Param::Text("rejected"),
        Param::Text("bad"),
        Param::Bytes(Some(b"x")),
    ];
    assert_eq!(value(sink, &sql, &params).await, Some(1));
}

/// At-least-once commits rows and offsets in two transactions; a stale
/// range is still refused at the offsets step (its rows did land: that is
/// the difference to exactly-once).
pub async fn at_least_once<B: SqlBackend>(sink: &SqlSink<B>, schema: Option<&str>) {
    let n = Names::of(sink, schema);
    let a = n.lookup("counts", "n", "word");
    let out = words_output("counts", &[("a", 1)]);
    assert_eq!(commit(sink, 0, 5, &out).await, CommitOutcome::Committed);
    assert!(matches!(
        commit(sink, 0, 5, &out).await,
        CommitOutcome::Fenced { .. }
    ));
    assert_eq!(
        value(sink, &a, &[Param::Text("a")]).await,
        Some(2),
        "duplicated"
    );
    let stored = sink.checkpoints("p", &[tp()]).await.unwrap();
    assert_eq!(stored.get(&tp()), Some(&5));
}

pub const VALUES: &str = r#"
[[sink.targets]]
name = "vals"
columns = { id = "integer", txt = "text", bin = "blob", x = "real", flag = "boolean" }
"#;

/// The text that needs escaping in bulk formats.
pub const AWKWARD_TEXT: &str = "tab\there\nnew line \\N back\\slash \"dq\" 'sq' \r COMMIT; ünï";
pub const AWKWARD_BYTES: &[u8] = &[0, 1, 255, b'\\', b'\n', b'\t', b'N'];

/// Awkward values and nulls of every type survive the bulk path unchanged.
pub async fn values_round_trip<B: SqlBackend>(sink: &SqlSink<B>, schema: Option<&str>) {
    let n = Names::of(sink, schema);
    let text = AWKWARD_TEXT;
    let out = Output {
        targets: vec![TargetRows {
            target: "vals".into(),
            rows: 2,
            columns: vec![
                Column {
                    name: "id".into(),
                    nulls: vec![],
                    data: ColumnData::Int64(vec![1, 2]),
                },
                Column {
                    name: "txt".into(),
                    nulls: vec![0, 1],
                    data: ColumnData::Text {
                        lengths: vec![text.len() as u32, 0],
                        data: text.as_bytes().to_vec(),
                    },
                },
                Column {
                    name: "bin".into(),
                    nulls: vec![0, 1],
                    data: ColumnData::Bytes {
                        lengths: vec![AWKWARD_BYTES.len() as u32, 0],
                        data: AWKWARD_BYTES.to_vec(),
                    },
                },
                Column {
                    name: "x".into(),
                    nulls: vec![0, 1],
                    data: ColumnData::Float64(vec![2.5, 0.0]),
                },
                Column {
                    name: "flag".into(),
                    nulls: vec![0, 1],
                    data: ColumnData::Bool(vec![1, 0]),
                },
            ],
        }],
        rejections: vec![],
        late: Vec::new(),
        state: Default::default(),
    };
    assert_eq!(commit(sink, 0, 1, &out).await, CommitOutcome::Committed);
    let (id, txt, bin, x, flag) = (
        n.col("id"),
        n.col("txt"),
        n.col("bin"),
        n.col("x"),
        n.col("flag"),
    );
    let vals = n.table("vals");
    let exact = format!(
        "SELECT count(*) FROM {vals} WHERE {id} = 1 AND {txt} = {} AND {bin} = {} AND {flag}",
        n.d.param(1),
        n.d.param(2)
    );
    let params = [Param::Text(text), Param::Bytes(Some(AWKWARD_BYTES))];
    assert_eq!(
        value(sink, &exact, &params).await,
        Some(1),
        "text, bytes and boolean intact"
    );
    let int = if n.d.name == "MySQL" {
        "SIGNED"
    } else {
        "BIGINT"
    };
    let doubled = format!("SELECT CAST({x} * 2 AS {int}) FROM {vals} WHERE {id} = 1");
    assert_eq!(value(sink, &doubled, &[]).await, Some(5));
    let nulls = format!(
        "SELECT count(*) FROM {vals} WHERE {id} = 2 AND {txt} IS NULL AND {bin} IS NULL \
         AND {x} IS NULL AND {flag} IS NULL"
    );
    assert_eq!(value(sink, &nulls, &[]).await, Some(1), "nulls stay null");
}

/// Dead letters are read back with their record, kind and batch, and a
/// redrive takes them once: its rows, its new dead letters and its
/// lineage row land with their removal; the same redrive again finds its
/// first dead letter gone and writes nothing.
pub async fn redrive<B: SqlBackend>(sink: &SqlSink<B>, config: &SinkConfig) {
    use sluice_core::dead_letters::{
        DeadLetterFilter, DeadLetterReader, RecordKey, RedriveOutcome,
    };
    let schema = crate::section::SqlSinkFields::of(&config.store())
        .unwrap()
        .schema;
    let n = Names::of(sink, schema.as_deref());
    let dead = [
        DeadLetter {
            index: 1,
            reason: "bad".into(),
            kind: DeadLetterKind::Rejected,
        },
        DeadLetter {
            index: 2,
            reason: "trapped".into(),
            kind: DeadLetterKind::Trap,
        },
    ];
    let outcome = try_commit(sink, 0, 3, &words_output("counts", &[]), &dead)
        .await
        .unwrap();
    assert_eq!(outcome, CommitOutcome::Committed);
    let (stored_plan, _) = batch(0, 3);
    let reader = crate::SqlDeadLetters::open(&config.store()).await.unwrap();
    let all = reader
        .list("p", &DeadLetterFilter::default())
        .await
        .unwrap();
    let offsets: Vec<i64> = all.iter().map(|d| d.offset).collect();
    assert_eq!(offsets, [1, 2]);
    assert_eq!(all[0].value.as_deref(), Some(&b"x"[..]));
    assert_eq!((all[0].key.as_deref(), all[0].timestamp), (None, 0));
    assert_eq!(
        (all[0].kind.as_str(), all[1].kind.as_str()),
        ("rejected", "trap")
    );
    assert_eq!(all[1].batch_id, stored_plan.batch_id);
    assert_eq!(all[1].batch_time_ms, Some(0));
    assert!(all[1].committed_at_ms.is_some());
    let traps = DeadLetterFilter {
        kind: Some("trap".into()),
        ..Default::default()
    };
    assert_eq!(reader.list("p", &traps).await.unwrap().len(), 1);

    // The redrive: offset 1 gives a row now, offset 2 fails again.
    let mut records = Records::default();
    let owned: Vec<OwnedRecord> = all
        .iter()
        .map(|d| OwnedRecord {
            offset: d.offset,
            timestamp: d.timestamp,
            key: d.key.clone(),
            value: d.value.clone(),
            headers: vec![],
        })
        .collect();
    records.push_slice("t", 0, &owned);
    let mut plan = Plan::new("p", vec![], "m", "pp", 0);
    plan.batch_id = "redrive-1".into();
    let output = words_output("counts", &[("a", 1)]);
    let again = [DeadLetter {
        index: 1,
        reason: "trapped again".into(),
        kind: DeadLetterKind::Trap,
    }];
    let digest = sluice_core::sink::digest(&output, &again);
    let c = Commit {
        plan: &plan,
        records: &records,
        output: &output,
        dead_letters: &again,
        output_digest: &digest,
        state_reads: &Default::default(),
    };
    let taken: Vec<RecordKey> = all.iter().map(|d| d.key()).collect();
    let stored_by = stored_plan.batch_id.as_str();
    assert_eq!(
        sink.redrive(&c, stored_by, &taken).await.unwrap(),
        RedriveOutcome::Committed
    );
    let a = n.lookup("counts", "n", "word");
    assert_eq!(value(sink, &a, &[Param::Text("a")]).await, Some(1));
    let left = reader
        .list("p", &DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(
        (left[0].offset, left[0].batch_id.as_str()),
        (2, "redrive-1")
    );
    assert_eq!(left[0].reason, "trapped again");
    let records_in = format!(
        "SELECT {} FROM {} WHERE {} = {}",
        n.col("records_in"),
        n.table("sluice_batches"),
        n.col("batch_id"),
        n.d.param(1)
    );
    assert_eq!(
        value(sink, &records_in, &[Param::Text("redrive-1")]).await,
        Some(2)
    );
    let ranges = format!(
        "SELECT COUNT(*) FROM {} WHERE {} = {}",
        n.table("sluice_batch_ranges"),
        n.col("batch_id"),
        n.d.param(1)
    );
    assert_eq!(
        value(sink, &ranges, &[Param::Text("redrive-1")]).await,
        Some(0)
    );

    // Taken already (offset 2 is stored again, but by the redrive).
    assert_eq!(
        sink.redrive(&c, stored_by, &taken).await.unwrap(),
        RedriveOutcome::Gone(taken[0].clone())
    );
    assert_eq!(
        value(sink, &a, &[Param::Text("a")]).await,
        Some(1),
        "nothing written"
    );
    assert_eq!(sink.still_stored("p", stored_by, &taken).await.unwrap(), 0);
    assert_eq!(
        sink.still_stored("p", "redrive-1", &taken).await.unwrap(),
        1
    );
}
