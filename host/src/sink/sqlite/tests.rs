//! Tests of the SQLite sink against real SQLite files: the offset
//! compare-and-set (fencing), the write modes, and identifiers from config.

use super::SqliteSink;
use crate::batch::{OffsetRange, OwnedRecord, Plan, Records, TopicPartition};
use crate::config::{PipelineConfig, SinkConfig};
use crate::output::{Column, ColumnData, Output, TargetRows};
use crate::sink::{Commit, CommitOutcome, DeadLetter, DeadLetterKind};
use sqlx::Row;

fn temp_db(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-sqlite-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("sink.db")
}

fn sink_config(db: &std::path::Path, targets: &str) -> SinkConfig {
    let text = format!(
        r#"
pipeline = "p"
[source]
brokers = "x"
topics = ["t"]
[module]
path = "m.wasm"
[sink]
url = "sqlite://{}"
{targets}
"#,
        db.display()
    );
    PipelineConfig::parse(&text).expect("config").sink
}

fn words_output(words: &[(&str, i64)]) -> Output {
    let mut lengths = Vec::new();
    let mut data = Vec::new();
    for (w, _) in words {
        lengths.push(w.len() as u32);
        data.extend_from_slice(w.as_bytes());
    }
    Output {
        targets: vec![TargetRows {
            target: "counts".into(),
            rows: words.len() as u32,
            columns: vec![
                Column {
                    name: "word".into(),
                    nulls: vec![],
                    data: ColumnData::Text { lengths, data },
                },
                Column {
                    name: "n".into(),
                    nulls: vec![],
                    data: ColumnData::Int64(words.iter().map(|w| w.1).collect()),
                },
            ],
        }],
        rejections: vec![],
    }
}

fn batch(from: i64, until: i64) -> (Plan, Records) {
    let owned: Vec<OwnedRecord> = (from..until)
        .map(|o| OwnedRecord {
            offset: o,
            timestamp: 0,
            key: None,
            value: Some(vec![b'x']),
            headers: vec![],
        })
        .collect();
    let mut records = Records::default();
    records.push_slice("t", 0, &owned);
    let range = OffsetRange {
        topic: "t".into(),
        partition: 0,
        from,
        until,
    };
    (Plan::new("p", vec![range], "m", "params", 0), records)
}

const COUNTS: &str = r#"
[[sink.targets]]
name = "counts"
mode = "accumulate"
key = ["word"]
columns = { word = "text", n = "integer" }
"#;

async fn commit(sink: &SqliteSink, from: i64, until: i64, output: &Output) -> CommitOutcome {
    let (plan, records) = batch(from, until);
    let digest = output.digest();
    let c = Commit {
        plan: &plan,
        records: &records,
        output,
        dead_letters: &[],
        output_digest: &digest,
    };
    sink.commit(&c).await.expect("commit reaches the database")
}

async fn counts(sink: &SqliteSink) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT word, n FROM counts ORDER BY word")
        .fetch_all(&sink.backend().pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn stale_from_is_fenced_and_rolls_back_everything() {
    let db = temp_db("fence");
    let sink = super::open(&sink_config(&db, COUNTS)).await.unwrap();
    assert_eq!(
        commit(&sink, 0, 10, &words_output(&[("a", 1)])).await,
        CommitOutcome::Committed
    );
    // A zombie that planned the same range again (its `from` is stale).
    let fenced = commit(&sink, 0, 10, &words_output(&[("a", 100), ("zombie", 1)])).await;
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
        commit(&sink, 5, 12, &words_output(&[("b", 1)])).await,
        CommitOutcome::Fenced { .. }
    ));
    assert_eq!(counts(&sink).await, vec![("a".into(), 1)]);
    let batches: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice_batches")
        .fetch_one(&sink.backend().pool)
        .await
        .unwrap();
    assert_eq!(batches, 1, "fenced batches leave no lineage");
    // The rightful next batch goes through and accumulates.
    assert_eq!(
        commit(&sink, 10, 20, &words_output(&[("a", 2), ("b", 3)])).await,
        CommitOutcome::Committed
    );
    assert_eq!(counts(&sink).await, vec![("a".into(), 3), ("b".into(), 3)]);
    let tp = TopicPartition {
        topic: "t".into(),
        partition: 0,
    };
    assert_eq!(
        sink.checkpoints("p", std::slice::from_ref(&tp))
            .await
            .unwrap()
            .get(&tp),
        Some(&20)
    );
}

#[tokio::test]
async fn write_modes_append_upsert_delete() {
    let db = temp_db("modes");
    let targets = r#"
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
"#;
    let sink = super::open(&sink_config(&db, targets)).await.unwrap();
    let mut out = words_output(&[("a", 1), ("b", 2)]);
    let mut latest = out.targets[0].clone();
    latest.target = "latest".into();
    out.targets.push(latest);
    assert_eq!(commit(&sink, 0, 1, &out).await, CommitOutcome::Committed);
    let mut out2 = words_output(&[("a", 5)]);
    out2.targets[0].target = "latest".into();
    let mut again = words_output(&[("a", 5)]);
    again.targets[0].target = "counts".into();
    out2.targets.push(again.targets.remove(0));
    let mut gone = words_output(&[("b", 0)]);
    gone.targets[0].target = "gone".into();
    gone.targets[0].columns.truncate(1);
    out2.targets.push(gone.targets.remove(0));
    assert_eq!(commit(&sink, 1, 2, &out2).await, CommitOutcome::Committed);
    let log: Vec<(String, i64)> = sqlx::query_as("SELECT word, n FROM log ORDER BY rowid")
        .fetch_all(&sink.backend().pool)
        .await
        .unwrap();
    assert_eq!(log, vec![("a".into(), 1), ("b".into(), 2), ("a".into(), 5)]);
    let latest: Vec<(String, i64)> = sqlx::query_as("SELECT word, n FROM latest ORDER BY word")
        .fetch_all(&sink.backend().pool)
        .await
        .unwrap();
    assert_eq!(latest, vec![("a".into(), 5)]);
}

#[tokio::test]
async fn identifiers_with_quotes_spaces_and_sql_are_quoted_not_pasted() {
    let db = temp_db("idents");
    let targets = r#"
[[sink.targets]]
name = "counts"
table = 'weird "table"; DROP TABLE sluice_checkpoints; --'
mode = "accumulate"
key = ["word"]
columns = { word = "text", n = "integer" }
"#;
    let sink = super::open(&sink_config(&db, targets)).await.unwrap();
    assert_eq!(
        commit(&sink, 0, 1, &words_output(&[("x", 4)])).await,
        CommitOutcome::Committed
    );
    let row =
        sqlx::query(r#"SELECT word, n FROM "weird ""table""; DROP TABLE sluice_checkpoints; --""#)
            .fetch_one(&sink.backend().pool)
            .await
            .unwrap();
    assert_eq!(row.get::<i64, _>(1), 4);
    let checkpoints: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice_checkpoints")
        .fetch_one(&sink.backend().pool)
        .await
        .unwrap();
    assert_eq!(checkpoints, 1, "the checkpoint table survived");

    let bad = r#"
[[sink.targets]]
name = "counts"
table = "tab\u0000le"
columns = { word = "text" }
"#;
    let err = super::open(&sink_config(&temp_db("idents-bad"), bad))
        .await
        .err()
        .expect("rejected");
    assert!(err.to_string().contains("invalid identifier"), "{err}");
}

#[tokio::test]
async fn output_that_does_not_fit_the_target_is_a_config_error() {
    let db = temp_db("mismatch");
    let sink = super::open(&sink_config(&db, COUNTS)).await.unwrap();
    let mut out = words_output(&[("a", 1)]);
    out.targets[0].columns[1].data = ColumnData::Float64(vec![1.5]);
    let (plan, records) = batch(0, 1);
    let digest = out.digest();
    let c = Commit {
        plan: &plan,
        records: &records,
        output: &out,
        dead_letters: &[],
        output_digest: &digest,
    };
    let err = sink.commit(&c).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("column `n` is Integer but the module wrote float64"),
        "{err}"
    );
    let tp = TopicPartition {
        topic: "t".into(),
        partition: 0,
    };
    assert!(
        sink.checkpoints("p", &[tp]).await.unwrap().is_empty(),
        "nothing committed"
    );
}

#[tokio::test]
async fn dead_letters_keep_the_record() {
    let db = temp_db("dead");
    let sink = super::open(&sink_config(&db, COUNTS)).await.unwrap();
    let (plan, records) = batch(0, 3);
    let out = words_output(&[]);
    let digest = out.digest();
    let dead = [DeadLetter {
        index: 1,
        reason: "bad".into(),
        kind: DeadLetterKind::Rejected,
    }];
    let c = Commit {
        plan: &plan,
        records: &records,
        output: &out,
        dead_letters: &dead,
        output_digest: &digest,
    };
    assert_eq!(sink.commit(&c).await.unwrap(), CommitOutcome::Committed);
    let row: (i64, Vec<u8>, String, String) =
        sqlx::query_as("SELECT \"offset\", record_value, kind, reason FROM sluice_dead_letters")
            .fetch_one(&sink.backend().pool)
            .await
            .unwrap();
    assert_eq!(row, (1, b"x".to_vec(), "rejected".into(), "bad".into()));
}
