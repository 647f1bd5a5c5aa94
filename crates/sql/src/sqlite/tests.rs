//! The shared SQL sink scenarios (`crate::scenarios`) against real
//! SQLite files, one file per test.

use crate::scenarios::{self as s, sink_config};

fn temp_db(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("sluice-sqlite-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    format!("sqlite://{}", dir.join("sink.db").display())
}

async fn open(name: &str, extra: &str, targets: &str) -> super::SqliteSink {
    super::open(&sink_config(&temp_db(name), None, extra, targets))
        .await
        .unwrap()
}

#[tokio::test]
async fn stale_from_is_fenced_and_rolls_back_everything() {
    s::fencing(&open("fence", "", s::COUNTS).await, None).await;
}

#[tokio::test]
async fn write_modes_append_upsert_accumulate_delete() {
    s::write_modes(&open("modes", "", s::MODES).await, None).await;
}

#[tokio::test]
async fn identifiers_with_quotes_spaces_and_sql_are_quoted_not_pasted() {
    s::identifiers(&open("idents", "", s::WEIRD).await, None).await;
    let bad = super::open(&sink_config(&temp_db("bad"), None, "", s::BAD_IDENT)).await;
    s::bad_identifier(bad.err().expect("rejected"));
}

#[tokio::test]
async fn output_that_does_not_fit_the_target_is_a_config_error() {
    s::mismatch(&open("mismatch", "", s::COUNTS).await).await;
}

#[tokio::test]
async fn dead_letters_are_read_back_and_redriven_once() {
    let config = sink_config(&temp_db("redrive"), None, "", s::COUNTS);
    let sink = super::open(&config).await.unwrap();
    s::redrive(&sink, &config).await;
}

#[tokio::test]
async fn dead_letters_keep_the_record() {
    s::dead_letters(&open("dead", "", s::COUNTS).await, None).await;
}

#[tokio::test]
async fn at_least_once_commits_rows_before_offsets() {
    let extra = r#"guarantee = "at-least-once""#;
    s::at_least_once(&open("alo", extra, s::COUNTS).await, None).await;
}

#[tokio::test]
async fn sqlite_has_no_schemas() {
    let config = sink_config(&temp_db("schema"), Some("s"), "", s::COUNTS);
    let err = super::open(&config).await.err().expect("rejected");
    assert!(err.to_string().contains("has no schemas"), "{err}");
}

#[tokio::test]
async fn awkward_values_and_nulls_round_trip() {
    s::values_round_trip(&open("values", "", s::VALUES).await, None).await;
}

/// State kept in the first layout (table `state`, keyed by pipeline, topic,
/// partition and key) is refused while it holds rows, saying how to move
/// it; the same table empty is left alone.
#[tokio::test]
async fn state_in_the_first_layout_is_refused_not_lost() {
    let url = temp_db("old-state");
    let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE sluice_state (pipeline TEXT NOT NULL, topic TEXT NOT NULL, \
         partition INTEGER NOT NULL, state_key BLOB NOT NULL, value BLOB, expires_at_ms INTEGER, \
         PRIMARY KEY (pipeline, topic, partition, state_key))",
    )
    .execute(&pool)
    .await
    .unwrap();
    let config = sink_config(&url, None, "", s::COUNTS);
    super::open(&config)
        .await
        .expect("an empty old table is no state");
    sqlx::raw_sql("INSERT INTO sluice_state VALUES ('p', 't', 0, x'6b', x'31', NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let err = super::open(&config).await.err().expect("refused");
    let said = err.to_string();
    assert!(
        said.contains("\"sluice_state\" holds keyed state") && said.contains("docs/state.md"),
        "{said}"
    );
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice_state")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(kept, 1, "the old state is left as it was");
    // The move docs/state.md gives, then the state reads back.
    sqlx::raw_sql(
        "BEGIN; \
         INSERT INTO sluice_state_scopes (pipeline, topic, partition) \
           SELECT DISTINCT pipeline, topic, partition FROM sluice_state WHERE true \
           ON CONFLICT DO NOTHING; \
         INSERT INTO sluice_keyed_state (scope, state_key, value, expires_at_ms) \
           SELECT s.scope, o.state_key, o.value, o.expires_at_ms \
           FROM sluice_state o JOIN sluice_state_scopes s \
             ON s.pipeline = o.pipeline AND s.topic = o.topic AND s.partition = o.partition; \
         DROP TABLE sluice_state; \
         COMMIT;",
    )
    .execute(&pool)
    .await
    .unwrap();
    super::open(&config).await.expect("moved");
    let store = crate::SqlStateStore::open(&config.store()).await.unwrap();
    let tp = crate::batch::TopicPartition {
        topic: "t".into(),
        partition: 0,
    };
    use sluice_core::state::StateStore;
    let value = store.get("p", &tp, b"k").await.unwrap().expect("moved");
    assert_eq!(value.value, b"1");
}

#[tokio::test]
async fn keyed_state_through_the_journal() {
    let config = sink_config(&temp_db("journal"), None, s::JOURNAL_OF_THREE, s::COUNTS);
    let sink = super::open(&config).await.unwrap();
    s::state_journal(&sink, &config, None).await;
}

#[tokio::test]
async fn keyed_state_round_trips() {
    let config = sink_config(&temp_db("state"), None, "", s::COUNTS);
    let sink = super::open(&config).await.unwrap();
    s::state_round_trip(&sink, &config).await;
}

#[tokio::test]
async fn many_state_deletes_in_one_batch() {
    let config = sink_config(&temp_db("state_bulk"), None, "", s::COUNTS);
    let sink = super::open(&config).await.unwrap();
    s::state_bulk_deletes(&sink, &config).await;
}
