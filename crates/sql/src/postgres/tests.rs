//! The shared SQL sink scenarios (`crate::scenarios`) against the real
//! Postgres (`SLUICE_TEST_POSTGRES_URL`, default the local server), one
//! schema per test, dropped first.

use crate::scenarios::{self as s, sink_config};

pub fn url() -> String {
    std::env::var("SLUICE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

async fn open(schema: &str, extra: &str, targets: &str) -> super::PostgresSink {
    let pool = sqlx::PgPool::connect(&url()).await.expect("Postgres is up");
    sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
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
    let long = s::COUNTS.replace(
        "name = \"counts\"",
        &format!("name = \"counts\"\ntable = \"{}\"", "t".repeat(64)),
    );
    let too_long = super::open(&sink_config(&url(), Some(schema), "", &long)).await;
    s::bad_identifier(too_long.err().expect("Postgres would truncate it"));
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
async fn unreachable_server_is_a_clear_retriable_error() {
    let config = sink_config(
        "postgres://postgres:secret@127.0.0.1:1/test",
        None,
        "",
        s::COUNTS,
    );
    let err = super::open(&config)
        .await
        .err()
        .expect("nothing listens on port 1");
    assert!(err.is_retryable(), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("cannot connect to postgres://postgres:***@127.0.0.1:1"),
        "{message}"
    );
    assert!(!message.contains("secret"), "{message}");
}

#[tokio::test]
async fn awkward_values_and_nulls_round_trip() {
    let schema = "sluice_ut_values";
    s::values_round_trip(&open(schema, "", s::VALUES).await, Some(schema)).await;
}

#[tokio::test]
async fn awkward_values_reach_a_table_of_other_types_through_text_copy() {
    // A table created by the user with types sluice does not write itself
    // (int4, varchar, float4): COPY falls back to the text format.
    let schema = "sluice_ut_values_text";
    let pool = sqlx::PgPool::connect(&url()).await.unwrap();
    sqlx::raw_sql(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; \
         CREATE TABLE {schema}.vals (id integer, txt varchar(200), bin bytea, x real, flag boolean)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let sink = super::open(&sink_config(&url(), Some(schema), "", s::VALUES))
        .await
        .unwrap();
    s::values_round_trip(&sink, Some(schema)).await;
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
