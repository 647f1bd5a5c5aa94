//! The runnable examples in `examples/`: each config runs against a test
//! broker on its sample data and must give its `expected.txt`.

use sluice_tests::*;
use std::path::Path;

/// Copies an example's config into `dir`, pointing it at `brokers`, the
/// example's plugin and a database in `dir`.
fn adapt_config(example: &Path, brokers: &str, dir: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(example.join("pipeline.toml")).expect("example config");
    let text = text
        .replace("127.0.0.1:19092", brokers)
        .replace(
            "../../plugins/dist/",
            &format!("{}/", repo_root().join("plugins/dist").display()),
        )
        .replace("sqlite://", &format!("sqlite://{}/", dir.display()));
    write_config(dir, &text)
}

fn produce_lines(brokers: &str, topic: &str, file: &Path, partitions: i32) {
    let text = std::fs::read_to_string(file).expect("sample data");
    let records: Vec<Produce> = text
        .lines()
        .enumerate()
        .map(|(i, l)| Produce {
            partition: i as i32 % partitions,
            key: Some(i.to_string()),
            value: l.into(),
        })
        .collect();
    produce(brokers, topic, &records);
}

/// Produces an example's sample data to its topic, runs its config until
/// caught up and opens its database.
async fn run_example(
    name: &str,
    topic: &str,
    data: &str,
    partitions: i32,
) -> (TempDir, sqlx::SqlitePool) {
    let brokers = shared_broker();
    let example = repo_root().join("examples").join(name);
    create_topic(brokers, topic, partitions);
    produce_lines(brokers, topic, &example.join(data), partitions);
    let dir = TempDir::new(name);
    run_ok(&adapt_config(&example, brokers, dir.path()));
    let pool = sqlite(&dir.path().join(format!("{name}.db"))).await;
    (dir, pool)
}

fn expected(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("examples").join(name).join("expected.txt")).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn word_count_example_gives_expected_counts() {
    let (_dir, pool) = run_example("word-count", "words", "words.txt", 4).await;
    let rows: Vec<(String, i64)> = sqlx::query_as("SELECT word, n FROM word_counts ORDER BY word")
        .fetch_all(&pool)
        .await
        .unwrap();
    let actual: String = rows.iter().map(|(w, n)| format!("{w} {n}\n")).collect();
    assert_eq!(actual, expected("word-count"));
}

#[tokio::test(flavor = "multi_thread")]
async fn json_filter_example_gives_expected_rows_and_dead_letter() {
    let (_dir, pool) = run_example("json-filter", "events", "events.jsonl", 2).await;
    let rows: Vec<(i64, String, f64)> =
        sqlx::query_as("SELECT id, user, amount FROM purchases ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice_dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut actual = String::from("id user amount\n");
    for (id, user, amount) in rows {
        actual.push_str(&format!("{id} {user} {amount:?}\n"));
    }
    actual.push_str(&format!("dead_letters {dead}\n"));
    assert_eq!(actual, expected("json-filter"));
}
