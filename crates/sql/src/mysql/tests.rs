//! The shared SQL sink scenarios (`crate::scenarios`) against the real
//! MySQL/MariaDB (`SLUICE_TEST_MYSQL_URL`, default the local server), one
//! database per test, dropped first.

use crate::scenarios::{self as s, sink_config};

pub fn url() -> String {
    std::env::var("SLUICE_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

async fn open(schema: &str, extra: &str, targets: &str) -> super::MysqlSink {
    let pool = sqlx::MySqlPool::connect(&url())
        .await
        .expect("MariaDB is up");
    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS `{schema}`"))
        .execute(&pool)
        .await
        .unwrap();
    super::open(&sink_config(&url(), Some(schema), extra, targets))
        .await
        .unwrap()
}

#[tokio::test]
async fn stale_from_is_fenced_and_rolls_back_everything() {
    let schema = "sluice_ut_fence";
    s::fencing(&open(schema, "", s::COUNTS).await, Some(schema)).await;
}

#[tokio::test]
async fn write_modes_append_upsert_accumulate_delete() {
    let schema = "sluice_ut_modes";
    s::write_modes(&open(schema, "", s::MODES).await, Some(schema)).await;
}

#[tokio::test]
async fn identifiers_with_quotes_spaces_and_sql_are_quoted_not_pasted() {
    let schema = "sluice_ut_idents";
    s::identifiers(&open(schema, "", s::WEIRD).await, Some(schema)).await;
    let bad = super::open(&sink_config(&url(), Some(schema), "", s::BAD_IDENT)).await;
    s::bad_identifier(bad.err().expect("rejected"));
}

#[tokio::test]
async fn output_that_does_not_fit_the_target_is_a_config_error() {
    s::mismatch(&open("sluice_ut_mismatch", "", s::COUNTS).await).await;
}

#[tokio::test]
async fn dead_letters_are_read_back_and_redriven_once() {
    let schema = "sluice_ut_redrive";
    let sink = open(schema, "", s::COUNTS).await;
    s::redrive(&sink, &sink_config(&url(), Some(schema), "", s::COUNTS)).await;
}

#[tokio::test]
async fn dead_letters_keep_the_record() {
    let schema = "sluice_ut_dead";
    s::dead_letters(&open(schema, "", s::COUNTS).await, Some(schema)).await;
}

#[tokio::test]
async fn at_least_once_commits_rows_before_offsets() {
    let schema = "sluice_ut_alo";
    let extra = r#"guarantee = "at-least-once""#;
    s::at_least_once(&open(schema, extra, s::COUNTS).await, Some(schema)).await;
}

#[tokio::test]
async fn statements_stay_under_the_packet_limit() {
    // Three times max_allowed_packet of rows would fail as one statement;
    // the sink cuts them into packet-sized chunks.
    let schema = "sluice_ut_packet";
    let sink = open(schema, "", s::COUNTS).await;
    let pool = sqlx::MySqlPool::connect(&url()).await.unwrap();
    let packet: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)")
        .fetch_one(&pool)
        .await
        .unwrap();
    let word = "w".repeat(200);
    let n = (packet as usize * 3) / 200 + 1;
    let words: Vec<String> = (0..n).map(|i| format!("{word}{i}")).collect();
    let rows: Vec<(&str, i64)> = words.iter().map(|w| (w.as_str(), 1)).collect();
    let out = s::words_output("counts", &rows);
    let outcome = s::try_commit(&sink, 0, 1, &out, &[]).await.unwrap();
    assert_eq!(outcome, crate::sink::CommitOutcome::Committed);
    let count: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM `{schema}`.`counts`"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count as usize, n);
}

#[tokio::test]
async fn awkward_values_and_nulls_round_trip() {
    let schema = "sluice_ut_values";
    s::values_round_trip(&open(schema, "", s::VALUES).await, Some(schema)).await;
}

#[tokio::test]
async fn keyed_state_through_the_journal() {
    let schema = "sluice_ut_journal";
    let sink = open(schema, s::JOURNAL_OF_THREE, s::COUNTS).await;
    let config = sink_config(&url(), Some(schema), s::JOURNAL_OF_THREE, s::COUNTS);
    s::state_journal(&sink, &config, Some(schema)).await;
}

#[tokio::test]
async fn keyed_state_round_trips() {
    let schema = "sluice_ut_state";
    let sink = open(schema, "", s::COUNTS).await;
    s::state_round_trip(&sink, &sink_config(&url(), Some(schema), "", s::COUNTS)).await;
}

#[tokio::test]
async fn many_state_deletes_in_one_batch() {
    let schema = "sluice_ut_state_bulk";
    let sink = open(schema, "", s::COUNTS).await;
    s::state_bulk_deletes(&sink, &sink_config(&url(), Some(schema), "", s::COUNTS)).await;
}
