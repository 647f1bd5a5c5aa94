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

/// The test database's connection options, as application `app`.
fn named(app: &str) -> sqlx::postgres::PgConnectOptions {
    <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(&url())
        .unwrap()
        .application_name(app)
}

/// A connection named `app` on the test database, and its backend's pid.
async fn session(app: &str) -> (sqlx::PgConnection, i32) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect_with(&named(app)).await.unwrap();
    let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    (conn, pid)
}

/// Which of `pids` still have a session.
async fn alive(pool: &sqlx::PgPool, pids: &[i32]) -> Vec<i32> {
    sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE pid = ANY($1) ORDER BY pid")
        .bind(pids)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Only a sluice session waiting on its client inside a statement (a COPY
/// whose data never comes) with a transaction, for longer than the bound,
/// is ended: not one idle in its transaction (the server's timeout is for
/// that), not another application's stalled COPY, not one stalled for
/// less than the bound.
#[tokio::test]
async fn only_sluice_sessions_stalled_inside_a_statement_are_ended() {
    use super::stalled::end_stalled_sessions;
    use std::time::Duration;
    let table = "sluice_ut_stalled";
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_with(named("sluice"))
        .await
        .unwrap();
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (x bigint)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let insert = format!("INSERT INTO {table} VALUES (1)");
    let copy = format!("COPY {table} FROM STDIN");
    let (mut stalled, stalled_pid) = session("sluice").await;
    let (mut idle, idle_pid) = session("sluice").await;
    let (mut other, other_pid) = session("someone else").await;
    for conn in [&mut stalled, &mut idle, &mut other] {
        sqlx::raw_sql(&format!("BEGIN; {insert}"))
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    let stalled_copy = stalled.copy_in_raw(&copy).await.unwrap();
    let other_copy = other.copy_in_raw(&copy).await.unwrap();
    let all = [stalled_pid, idle_pid, other_pid];
    let mut expected = all.to_vec();
    expected.sort();

    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        end_stalled_sessions(&pool, Duration::from_secs(60)).await,
        Vec::<i32>::new(),
        "stalled for less than the bound"
    );
    assert_eq!(
        end_stalled_sessions(&pool, Duration::from_millis(200)).await,
        vec![stalled_pid]
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    expected.retain(|&p| p != stalled_pid);
    while alive(&pool, &all).await != expected {
        assert!(
            std::time::Instant::now() < deadline,
            "the stalled session is still there"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop((stalled_copy, other_copy));
    drop((stalled, idle, other));
    sqlx::raw_sql(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

/// A lock timeout (55P03), as the sink's errors carry it, is told apart
/// from any other failed statement.
#[tokio::test]
async fn a_lock_timeout_is_recognised_through_the_sink_error() {
    use crate::sink::SinkError;
    let (mut holder, _) = session("sluice").await;
    let (mut waiter, _) = session("sluice").await;
    let table = "sluice_ut_lock_timeout";
    for sql in [
        format!("DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (x bigint)"),
        format!("BEGIN; LOCK TABLE {table}"),
    ] {
        sqlx::raw_sql(&sql).execute(&mut holder).await.unwrap();
    }
    let timed_out = sqlx::raw_sql(&format!("SET lock_timeout = 100; SELECT * FROM {table}"))
        .execute(&mut waiter)
        .await
        .unwrap_err();
    let other = sqlx::raw_sql("SELECT * FROM sluice_ut_no_such_table")
        .execute(&mut waiter)
        .await
        .unwrap_err();
    assert!(super::stalled::timed_out_on_a_lock(
        &SinkError::unavailable("", timed_out)
    ));
    assert!(!super::stalled::timed_out_on_a_lock(&SinkError::database(
        "", other
    )));
    sqlx::raw_sql(&format!("ROLLBACK; DROP TABLE {table}"))
        .execute(&mut holder)
        .await
        .unwrap();
}
