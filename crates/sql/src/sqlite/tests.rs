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
