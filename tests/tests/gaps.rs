//! Offset gaps and impossible checkpoints, through the `sluice` binary.
//!
//! Ranges end by consumer position, so empty partitions, ranges ending on a
//! transaction marker, aborted records in the middle and ranges with zero
//! records all commit correctly; a checkpoint outside the log fails loudly,
//! naming partition and offsets, with nothing written.

use sluice_tests::*;
use std::time::Duration;

async fn run_identity(pipeline: &str, topic: &str, partitions: i32) -> (TempDir, sqlx::SqlitePool) {
    let brokers = shared_broker();
    let dir = TempDir::new(pipeline);
    let db = dir.path().join("out.db");
    let config = write_config(
        dir.path(),
        &identity_config(pipeline, brokers, topic, &db, 1000),
    );
    run_ok(&config);
    let _ = partitions;
    let pool = sqlite(&db).await;
    (dir, pool)
}

fn one(partition: i32, value: &str) -> Produce {
    Produce {
        partition,
        key: None,
        value: value.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn aborted_records_in_the_middle_and_range_ending_on_a_marker() {
    let brokers = shared_broker();
    let topic = "gap-middle";
    create_topic(brokers, topic, 1);
    produce(brokers, topic, &[one(0, "a"), one(0, "b")]);
    produce_transaction(
        brokers,
        topic,
        "gap-mid-abort",
        &[one(0, "x"), one(0, "y")],
        false,
    );
    produce(brokers, topic, &[one(0, "c")]);
    // The log ends on this transaction's commit marker.
    produce_transaction(
        brokers,
        topic,
        "gap-mid-commit",
        &[one(0, "d"), one(0, "e")],
        true,
    );

    let (_dir, pool) = run_identity("gap-middle", topic, 1).await;
    let expected = read_committed(brokers, topic, 1);
    assert_eq!(identity_rows(&pool).await, expected);
    assert!(expected.iter().any(|s| s.value == "e"));
    // The checkpoint moved past the final commit marker: last record + 2.
    let last = expected.iter().map(|s| s.offset).max().unwrap();
    assert_eq!(checkpoints(&pool, "gap-middle").await, vec![(0, last + 2)]);
    assert_contiguous_lineage(&pool, "gap-middle").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn empty_partition_and_zero_record_range() {
    let brokers = shared_broker();
    let topic = "gap-empty";
    create_topic(brokers, topic, 3);
    produce(brokers, topic, &[one(0, "only")]);
    // Partition 1 holds nothing but an aborted transaction and its marker:
    // its range moves the offset but may carry zero records.
    produce_transaction(brokers, topic, "gap-empty-abort", &[one(1, "gone")], false);
    // Partition 2 stays empty.

    let (_dir, pool) = run_identity("gap-empty", topic, 3).await;
    let expected = read_committed(brokers, topic, 3);
    assert_eq!(identity_rows(&pool).await, expected);
    let cps = checkpoints(&pool, "gap-empty").await;
    assert_eq!(cps.iter().find(|(p, _)| *p == 0).map(|c| c.1), Some(1));
    // Record at offset 0 and the abort marker at 1: the range is 0..2.
    assert_eq!(cps.iter().find(|(p, _)| *p == 1).map(|c| c.1), Some(2));
    assert!(
        cps.iter().all(|(p, _)| *p != 2),
        "an empty partition gets no range"
    );
    if !expected.iter().any(|s| s.partition == 1) {
        let records: i64 = sqlx::query_scalar(
            "SELECT records FROM sluice_batch_ranges WHERE pipeline = 'gap-empty' AND partition = 1",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            records, 0,
            "the range over an aborted transaction holds no records"
        );
    }
}

async fn set_checkpoint(pool: &sqlx::SqlitePool, pipeline: &str, partition: i32, offset: i64) {
    sqlx::query(
        "UPDATE sluice_checkpoints SET next_offset = ? WHERE pipeline = ? AND partition = ?",
    )
    .bind(offset)
    .bind(pipeline)
    .bind(partition)
    .execute(pool)
    .await
    .unwrap();
}

async fn table_counts(pool: &sqlx::SqlitePool) -> (i64, i64) {
    let rows = sqlx::query_scalar("SELECT count(*) FROM records")
        .fetch_one(pool)
        .await
        .unwrap();
    let batches = sqlx::query_scalar("SELECT count(*) FROM sluice_batches")
        .fetch_one(pool)
        .await
        .unwrap();
    (rows, batches)
}

/// A checkpoint beyond the log end is what a topic that was deleted and
/// re-created leaves behind. Tansu's memory storage cannot delete a topic's
/// data and keep the broker, so the test moves the stored checkpoint past
/// the end instead: sluice sees exactly the same situation.
#[tokio::test(flavor = "multi_thread")]
async fn checkpoint_beyond_log_end_fails_loudly_and_writes_nothing() {
    let brokers = shared_broker();
    let topic = "gap-beyond";
    create_topic(brokers, topic, 1);
    produce(brokers, topic, &numbered("b", 10, 1));
    let (dir, pool) = run_identity("gap-beyond", topic, 1).await;
    set_checkpoint(&pool, "gap-beyond", 0, 5_000).await;
    produce(brokers, topic, &numbered("more", 5, 1));
    let before = table_counts(&pool).await;

    let config = dir.path().join("pipeline.toml");
    let out = run_until_caught_up(&config, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sluice must fail");
    assert!(
        stderr.contains("gap-beyond[0]"),
        "error names the partition: {stderr}"
    );
    assert!(stderr.contains("5000"), "error names the offset: {stderr}");
    assert!(stderr.contains("beyond the log end"), "{stderr}");
    assert_eq!(table_counts(&pool).await, before, "nothing may be written");
}

/// A checkpoint below the log start is what retention or DeleteRecords
/// leaves behind. The test asks the broker to delete records; where the
/// broker refuses DeleteRecords it moves the stored checkpoint below the log
/// start instead (to -5, below offset 0), which sluice must treat the same.
#[tokio::test(flavor = "multi_thread")]
async fn checkpoint_below_log_start_fails_loudly_and_writes_nothing() {
    let brokers = shared_broker();
    let topic = "gap-below";
    create_topic(brokers, topic, 1);
    produce(brokers, topic, &numbered("a", 10, 1));
    let (dir, pool) = run_identity("gap-below", topic, 1).await;
    let checkpoint = if delete_records(brokers, topic, 0, 8) {
        set_checkpoint(&pool, "gap-below", 0, 3).await;
        3
    } else {
        set_checkpoint(&pool, "gap-below", 0, -5).await;
        -5
    };
    let before = table_counts(&pool).await;

    let config = dir.path().join("pipeline.toml");
    let out = run_until_caught_up(&config, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sluice must fail");
    assert!(
        stderr.contains("gap-below[0]"),
        "error names the partition: {stderr}"
    );
    assert!(
        stderr.contains(&checkpoint.to_string()),
        "error names the offset: {stderr}"
    );
    assert!(stderr.contains("below the log start"), "{stderr}");
    assert_eq!(table_counts(&pool).await, before, "nothing may be written");
}

/// DeleteRecords up to `before`; false if the broker does not support it.
fn delete_records(brokers: &str, topic: &str, partition: i32, before: i64) -> bool {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(before))
        .unwrap();
    let result = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(admin.delete_records(
                &tpl,
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            ))
        })
        .join()
        .unwrap()
    });
    match result {
        Ok(list) => list.elements().iter().all(|e| e.error().is_ok()),
        Err(e) => {
            println!("broker refused DeleteRecords ({e}); moving the checkpoint instead");
            false
        }
    }
}

/// Records that make the module trap are isolated by bisection and stored
/// as dead letters with the trap message; every other record is committed.
#[tokio::test(flavor = "multi_thread")]
async fn poison_records_become_dead_letters_and_the_rest_commits() {
    let brokers = shared_broker();
    let topic = "poison";
    create_topic(brokers, topic, 2);
    let mut records = numbered("ok", 200, 2);
    records[37].value = "this is poison".into();
    records[150].value = "more poison here".into();
    produce(brokers, topic, &records);
    let dir = TempDir::new("poison");
    let db = dir.path().join("out.db");
    let config = write_config(
        dir.path(),
        &format!(
            r#"
pipeline = "poison"
[source]
brokers = "{brokers}"
topics = ["{topic}"]
[module]
path = "{module}"
params = {{ mode = "poison" }}
[sink]
url = "sqlite://{db}"
[[sink.targets]]
name = "echo"
columns = {{ offset = "integer", value = "text" }}
"#,
            module = plugin("hostile").display(),
            db = db.display()
        ),
    );
    run_ok(&config);
    let pool = sqlite(&db).await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM echo")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 198);
    let dead: Vec<(String, String, Vec<u8>)> = sqlx::query_as(
        "SELECT kind, reason, record_value FROM sluice_dead_letters ORDER BY record_value",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(dead.len(), 2);
    assert!(
        dead.iter()
            .all(|(kind, reason, _)| kind == "trap" && reason.contains("poison record"))
    );
    assert_eq!(dead[0].2, b"more poison here");
    assert_eq!(dead[1].2, b"this is poison");
}
