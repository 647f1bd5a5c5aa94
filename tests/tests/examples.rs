//! The runnable examples in `examples/`: each config runs against a test
//! broker on its sample data and must give its `expected.txt`. Each SQL
//! example names its own schema, dropped before its test.

use sluice_tests::control::sluice_ok;
use sluice_tests::sinks::SinkDb;
use sluice_tests::*;
use std::path::Path;

/// An example's config pointed at `brokers`, the example's plugin by its
/// absolute path, and a SQLite file (if it writes one) in `dir`.
fn adapt_config(example: &Path, brokers: &str, dir: &Path) -> PipelineToml {
    let config = PipelineToml::read(&example.join("pipeline.toml"));
    let module = example.join(config.get("module", "path").expect("module path"));
    let url = config.get("sink", "url").expect("sink url").to_string();
    let url = match url.split_once("://") {
        Some(("sqlite", file)) => format!("sqlite://{}/{file}", dir.display()),
        Some(("kafka", _)) => format!("kafka://{brokers}"),
        _ => url,
    };
    config
        .source("brokers", brokers)
        .module_path(&module)
        .sink_url(&url)
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
    run_ok(&adapt_config(&example, brokers, dir.path()).write(dir.path()));
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

/// With `field`, the word-count plugin counts the words of one string field
/// of a JSON value, and rejects a value that is not such an object (run
/// through `sluice test`).
#[test]
fn word_count_counts_the_words_of_a_json_field() {
    let dir = TempDir::new("word-count-field");
    let input = dir.path().join("in.jsonl");
    let lines = [
        r#"{"value":"{\"user\":\"Ann Bob\",\"other\":\"zed\"}"}"#,
        r#"{"value":"{\"user\":\"ann\"}"}"#,
        r#"{"value":"{\"user\":7}"}"#,
        r#"{"value":"not json"}"#,
    ];
    std::fs::write(&input, lines.join("\n")).unwrap();
    let out = sluice_ok(&[
        "test",
        plugin("word-count").to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--params",
        r#"{"field":"user"}"#,
        "--json",
    ]);
    let parsed: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let rows: Vec<(String, i64)> = parsed
        .iter()
        .filter_map(|v| v.get("row"))
        .map(|r| (r["word"].as_str().unwrap().into(), r["n"].as_i64().unwrap()))
        .collect();
    assert_eq!(rows, [("ann".to_string(), 2), ("bob".to_string(), 1)]);
    let rejected: Vec<i64> = parsed
        .iter()
        .filter_map(|v| v.get("dead_letter"))
        .map(|d| {
            assert_eq!(
                d["reason"],
                "value is not a JSON object with a string `user`"
            );
            d["offset"].as_i64().unwrap()
        })
        .collect();
    assert_eq!(rejected, [2, 3]);
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

/// Runs a SQL example from its schema dropped: produces `data` (relative to
/// the examples directory) and runs the config until caught up, with
/// `pipeline` as the pipeline name when given (a replay from scratch).
async fn run_sql_example(
    name: &str,
    topic: &str,
    data: &str,
    partitions: i32,
    pipeline: Option<&str>,
) {
    let brokers = shared_broker();
    let example = repo_root().join("examples").join(name);
    if pipeline.is_none() {
        create_topic(brokers, topic, partitions);
        produce_lines(
            brokers,
            topic,
            &repo_root().join("examples").join(data),
            partitions,
        );
    }
    let dir = TempDir::new(name);
    // The test's own topic, so no two tests read one topic.
    let mut config = adapt_config(&example, brokers, dir.path()).topics(&[topic]);
    if let Some(p) = pipeline {
        let renamed = format!("{p}-{}", config.name());
        config = config.renamed(&renamed);
    }
    let config = config.write(dir.path());
    run_ok(&config);
}

fn schema_of(name: &str) -> String {
    let text = std::fs::read_to_string(
        repo_root()
            .join("examples")
            .join(name)
            .join("pipeline.toml"),
    )
    .unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("schema = "))
        .expect("schema line");
    line.trim_start_matches("schema = ")
        .trim_matches('"')
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn orders_mysql_example_appends_each_order_once_with_its_offset() {
    let db = SinkDb::fresh_mysql(&schema_of("orders-mysql")).await;
    run_sql_example(
        "orders-mysql",
        "orders",
        "orders-mysql/orders.jsonl",
        2,
        None,
    )
    .await;
    let pool = db.pool().await;
    let rows: Vec<(String, String, i64, i64, i64)> = sqlx::query_as(&format!(
        // LONGTEXT comes back as a BLOB through sqlx's Any driver: cast it.
        "SELECT order_id, CAST(customer AS CHAR(255)), total_cents, kafka_partition, kafka_offset \
         FROM {} ORDER BY order_id",
        db.table("orders")
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut actual = String::from("order_id customer total_cents kafka_partition kafka_offset\n");
    for (id, customer, cents, partition, offset) in rows {
        actual.push_str(&format!("{id} {customer} {cents} {partition} {offset}\n"));
    }
    actual.push_str(&format!("dead_letters {}\n", db.dead_letters().await));
    assert_eq!(actual, expected("orders-mysql"));
}

#[tokio::test(flavor = "multi_thread")]
async fn word_count_postgres_example_gives_the_sqlite_counts() {
    let db = SinkDb::fresh_postgres(&schema_of("word-count-postgres")).await;
    run_sql_example(
        "word-count-postgres",
        "words-pg",
        "word-count/words.txt",
        4,
        None,
    )
    .await;
    let actual: String = db
        .pairs("word_counts", "word", "n")
        .await
        .iter()
        .map(|(w, n)| format!("{w} {n}\n"))
        .collect();
    assert_eq!(actual, expected("word-count"));
}

/// The stateful dedupe: first sightings only, repeats counted per user,
/// across batches of ten records (state carried from batch to batch), as
/// `expected.py` recomputes them.
#[tokio::test(flavor = "multi_thread")]
async fn dedupe_postgres_example_passes_first_sightings_only() {
    let db = SinkDb::fresh_postgres(&schema_of("dedupe-postgres")).await;
    run_sql_example(
        "dedupe-postgres",
        "payments-ex",
        "dedupe-postgres/events.jsonl",
        1,
        None,
    )
    .await;
    let pool = db.pool().await;
    let events: Vec<(String, i64, f64)> = sqlx::query_as(&format!(
        "SELECT {u}, count(*), sum(amount) FROM {t} GROUP BY {u} ORDER BY {u}",
        u = db.ident("user"),
        t = db.table("events")
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    let repeats: std::collections::HashMap<String, i64> =
        db.pairs("repeats", "user", "n").await.into_iter().collect();
    let mut actual = String::new();
    for (user, n, amount) in events {
        let dropped = repeats.get(&user).copied().unwrap_or(0);
        actual.push_str(&format!(
            "{user} events={n} amount={amount:.2} repeats={dropped}\n"
        ));
    }
    actual.push_str(&format!("dead letters={}\n", db.dead_letters().await));
    assert_eq!(actual, expected("dedupe-postgres"));
}

/// Spend per user per minute of event time: every minute's row as
/// `expected.py` recomputes it (final ones final, open ones with their
/// running figure), one late payment updating its final minute (within
/// the module's 90 s retention), the other a `late` dead letter, the line
/// that is not a payment rejected.
#[tokio::test(flavor = "multi_thread")]
async fn spend_per_minute_example_closes_each_minute_once() {
    let db = SinkDb::fresh_postgres(&schema_of("spend-per-minute-postgres")).await;
    let name = "spend-per-minute-postgres";
    let data = "spend-per-minute-postgres/payments.jsonl";
    run_sql_example(name, "payments-by-minute-ex", data, 1, None).await;
    let pool = db.pool().await;
    let rows: Vec<(String, i64, i64, i64, bool)> = sqlx::query_as(&format!(
        "SELECT {u}, minute, cents, payments, {f} FROM {t} ORDER BY {u}, minute",
        u = db.ident("user"),
        f = db.ident("final"),
        t = db.table("spend_per_minute")
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut actual = String::from("user minute cents payments final\n");
    for (user, minute, cents, payments, last) in rows {
        actual.push_str(&format!("{user} {minute} {cents} {payments} {last}\n"));
    }
    let count = |kind: &str| {
        format!(
            "SELECT count(*) FROM {} WHERE kind = '{kind}'",
            db.table("sluice_dead_letters")
        )
    };
    let late = db.scalar(&count("late")).await.unwrap_or(0);
    let rejected = db.scalar(&count("rejected")).await.unwrap_or(0);
    actual.push_str(&format!("late={late} rejected={rejected}\n"));
    assert_eq!(actual, expected(name));
}

/// The changelog converges, and replaying the whole log again from a new
/// pipeline (no checkpoints) over the same table gives the same table.
#[tokio::test(flavor = "multi_thread")]
async fn changelog_example_converges_and_replays_to_the_same_table() {
    let db = SinkDb::fresh_postgres(&schema_of("changelog-upsert")).await;
    let name = "changelog-upsert";
    run_sql_example(
        name,
        "customer-changes",
        "changelog-upsert/changes.jsonl",
        1,
        None,
    )
    .await;
    let table = || async {
        let pool = db.pool().await;
        let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(&format!(
            "SELECT id, name, email FROM {} ORDER BY id",
            db.table("customers")
        ))
        .fetch_all(&pool)
        .await
        .unwrap();
        let mut out = String::from("id name email\n");
        for (id, name, email) in rows {
            out.push_str(&format!(
                "{id} {name} {}\n",
                email.as_deref().unwrap_or("NULL")
            ));
        }
        out
    };
    let first = table().await;
    assert_eq!(
        format!("{first}dead_letters {}\n", db.dead_letters().await),
        expected(name)
    );
    run_sql_example(
        name,
        "customer-changes",
        "changelog-upsert/changes.jsonl",
        1,
        Some("replay"),
    )
    .await;
    assert_eq!(
        table().await,
        first,
        "a full replay converges to the same table"
    );
}

/// The dedupe example's Redis keys: per day the users seen and the event
/// count, as `expected.txt` lists them, and the dead letters.
fn dedupe_summary(redis: &sluice_tests::redis_server::RedisServer) -> String {
    use redis::Commands;
    let mut conn = redis.conn();
    let counts: std::collections::BTreeMap<String, i64> = conn.hgetall("dedupe:events").unwrap();
    let mut out = String::new();
    for (day, events) in &counts {
        let mut users: Vec<String> = conn.smembers(format!("dedupe:seen:{day}")).unwrap();
        users.sort();
        out += &format!("{day} users={} events={events}\n", users.join(","));
    }
    let dead: i64 = conn
        .llen("dedupe:sluice:dead_letters:dedupe-redis")
        .unwrap();
    out + &format!("dead letters={dead}\n")
}

fn dedupe_config(
    brokers: &str,
    redis: &sluice_tests::redis_server::RedisServer,
    dir: &Path,
) -> PipelineToml {
    let example = repo_root().join("examples/dedupe-redis");
    adapt_config(&example, brokers, dir).sink_url(&redis.url())
}

#[tokio::test(flavor = "multi_thread")]
async fn dedupe_redis_example_gives_expected_sets_and_counts() {
    let brokers = shared_broker();
    let example = repo_root().join("examples/dedupe-redis");
    create_topic(brokers, "user-events", 2);
    produce_lines(brokers, "user-events", &example.join("events.jsonl"), 2);
    let redis = sluice_tests::redis_server::RedisServer::start("dedupe-example");
    let dir = TempDir::new("dedupe-redis");
    run_ok(&dedupe_config(brokers, &redis, dir.path()).write(dir.path()));
    assert_eq!(dedupe_summary(&redis), expected("dedupe-redis"));
}

/// The dedupe example across SIGKILLs of sluice and one of Redis: the sets
/// and the exact counts equal a recomputation from the committed input.
#[tokio::test(flavor = "multi_thread")]
async fn dedupe_redis_example_is_exact_across_crashes() {
    use rand::{Rng, SeedableRng};
    let brokers = shared_broker();
    let topic = "user-events-crash";
    create_topic(brokers, topic, 2);
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let days = ["2026-11-28", "2026-11-29", "2026-11-30", "2026-12-01"];
    let events: Vec<Produce> = (0..30_000)
        .map(|i| Produce {
            partition: i % 2,
            key: None,
            value: match i % 997 {
                0 => "garbage".to_string(),
                _ => format!(
                    r#"{{"user":"u{}","day":"{}"}}"#,
                    rng.gen_range(0..500),
                    days[rng.gen_range(0..4)]
                ),
            },
        })
        .collect();
    produce(brokers, topic, &events[..20_000]);
    produce_transaction(
        brokers,
        topic,
        "dedupe-abort",
        &events[20_000..25_000],
        false,
    );
    produce_transaction(brokers, topic, "dedupe-commit", &events[25_000..], true);
    let mut redis = sluice_tests::redis_server::RedisServer::start("dedupe-crash");
    let dir = TempDir::new("dedupe-crash");
    let config = dedupe_config(brokers, &redis, dir.path())
        .topics(&[topic])
        .max_records_per_partition(300)
        .batch_interval_ms(50)
        .write(dir.path());
    let lineage = "dedupe:sluice:lineage:dedupe-redis";
    let committed = async || -> i64 {
        use redis::Commands;
        redis::Client::open(redis.url())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| c.llen(lineage))
            .unwrap_or(0)
    };
    let (kills, _) = crash::kill_loop(&config, committed, 6, &mut rng).await;
    redis.kill();
    redis.restart();
    run_ok(&config);
    let mut seen: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    let mut counts: std::collections::BTreeMap<String, i64> = Default::default();
    let mut dead = 0;
    for s in read_committed(brokers, topic, 2) {
        match serde_json::from_str::<serde_json::Value>(&s.value) {
            Ok(e) => {
                let day = e["day"].as_str().unwrap().to_string();
                seen.entry(day.clone())
                    .or_default()
                    .insert(e["user"].as_str().unwrap().to_string());
                *counts.entry(day).or_default() += 1;
            }
            Err(_) => dead += 1,
        }
    }
    let mut want = String::new();
    for (day, users) in &seen {
        let users: Vec<&str> = users.iter().map(String::as_str).collect();
        want += &format!("{day} users={} events={}\n", users.join(","), counts[day]);
    }
    want += &format!("dead letters={dead}\n");
    assert_eq!(dedupe_summary(&redis), want);
    println!(
        "dedupe: {kills} SIGKILLs and a Redis restart; {} events counted exactly",
        counts.values().sum::<i64>()
    );
}

/// The inspect-stdout example prints the json-filter example's rows as
/// JSON lines, and its dead letter on stderr.
#[tokio::test(flavor = "multi_thread")]
async fn inspect_stdout_example_prints_the_json_filter_rows() {
    let brokers = shared_broker();
    let topic = "events-inspect";
    create_topic(brokers, topic, 2);
    let data = repo_root().join("examples/json-filter/events.jsonl");
    produce_lines(brokers, topic, &data, 2);
    let dir = TempDir::new("inspect-stdout");
    let config = adapt_config(
        &repo_root().join("examples/inspect-stdout"),
        brokers,
        dir.path(),
    )
    .topics(&[topic])
    .write(dir.path());
    let out = std::process::Command::new(sluice_bin())
        .args(["run", "--until-caught-up"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let mut rows: Vec<(i64, String, f64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            assert_eq!(v["target"], "purchases");
            let r = &v["row"];
            (
                r["id"].as_i64().unwrap(),
                r["user"].as_str().unwrap().to_string(),
                r["amount"].as_f64().unwrap(),
            )
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    let dead = stderr
        .lines()
        .filter(|l| l.contains("\"dead_letter\""))
        .count();
    let mut actual = String::from("id user amount\n");
    for (id, user, amount) in rows {
        actual.push_str(&format!("{id} {user} {amount:?}\n"));
    }
    actual.push_str(&format!("dead_letters {dead}\n"));
    assert_eq!(actual, expected("inspect-stdout"));
    assert!(
        dir.path().join(".sluice-state.db").exists(),
        "no checkpoint file"
    );
}

/// Kafka to Kafka: valid orders enriched into `orders-enriched` (keyed by
/// id, the row as JSON), the rest dead letters with their reason.
#[test]
fn enrich_kafka_example_enriches_valid_orders_and_dead_letters_the_rest() {
    let brokers = shared_broker();
    let example = repo_root().join("examples/enrich-kafka");
    create_topic(brokers, "order-events", 2);
    for (topic, partitions) in [
        ("orders-enriched", 2),
        ("enrich.dead-letters", 1),
        ("enrich.lineage", 1),
    ] {
        create_topic(brokers, topic, partitions);
    }
    produce_lines(brokers, "order-events", &example.join("orders.jsonl"), 2);
    let dir = TempDir::new("enrich-kafka");
    run_ok(&adapt_config(&example, brokers, dir.path()).write(dir.path()));
    let mut out = read_consumed(brokers, "orders-enriched", 2);
    out.sort_by_key(|r| r.key.as_deref().unwrap_or("").parse::<i64>().unwrap_or(-1));
    let dead = read_consumed(brokers, "enrich.dead-letters", 1);
    let mut actual = String::from("orders-enriched (key, value):\n");
    for r in &out {
        assert_eq!(
            r.headers.get("tier").map(String::as_str),
            r.value
                .split("\"tier\":\"")
                .nth(1)
                .and_then(|t| t.split('"').next())
        );
        actual.push_str(&format!(
            "{} {}\n",
            r.key.as_deref().unwrap_or("-"),
            r.value
        ));
    }
    let reasons: Vec<&str> = dead
        .iter()
        .map(|d| d.headers["sluice.reason"].as_str())
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("missing field `amount`")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("negative")),
        "{reasons:?}"
    );
    assert!(
        dead.iter().all(|d| d.headers["sluice.kind"] == "rejected"
            && d.headers["sluice.topic"] == "order-events")
    );
    actual.push_str(&format!("enrich.dead-letters: {}\n", dead.len()));
    assert_eq!(actual, expected("enrich-kafka"));
}

/// A Kafka-to-Kafka example with keyed state: `examples/<name>`, reading
/// `input`, its pipeline `pipeline` writing `output`.
struct KafkaExample {
    name: &'static str,
    input: &'static str,
    pipeline: &'static str,
    output: &'static str,
    /// The sample, in the example's folder: one record per line.
    data: &'static str,
}

impl KafkaExample {
    /// Creates the example's topics (one partition each: its input, and
    /// its output, dead letters, lineage and state), then produces the
    /// first half of the sample and runs the pipeline to its end, then the
    /// second half in a new process, which restores what the first left in
    /// state. Returns the config it ran.
    fn run_in_two_processes(&self, brokers: &str, dir: &Path) -> std::path::PathBuf {
        let example = repo_root().join("examples").join(self.name);
        let sink_topics =
            ["dead-letters", "lineage", "state"].map(|t| format!("{}.{t}", self.pipeline));
        for topic in [self.input, self.output]
            .into_iter()
            .chain(sink_topics.iter().map(String::as_str))
        {
            create_topic(brokers, topic, 1);
        }
        let text = std::fs::read_to_string(example.join(self.data)).unwrap();
        let records: Vec<Produce> = text
            .lines()
            .enumerate()
            .map(|(i, l)| Produce {
                partition: 0,
                key: Some(i.to_string()),
                value: l.into(),
            })
            .collect();
        let config = adapt_config(&example, brokers, dir).write(dir);
        let (first, second) = records.split_at(records.len() / 2);
        for half in [first, second] {
            produce(brokers, self.input, half);
            run_ok(&config);
        }
        config
    }
}

/// Kafka to Kafka with keyed state: every movement once in `balances` with
/// the balance after it (each the one before plus the movement), the
/// withdrawals past zero dead letters, and the final balances what
/// `expected.py` recomputes; the second half of the input runs in a second
/// process, which restores the balances from the changelog topic.
#[test]
fn balance_kafka_example_keeps_running_balances_across_batches_and_restarts() {
    let brokers = shared_broker();
    let example = KafkaExample {
        name: "balance-kafka",
        input: "movements",
        pipeline: "balance",
        output: "balances",
        data: "movements.jsonl",
    };
    let dir = TempDir::new(example.name);
    example.run_in_two_processes(brokers, dir.path());
    let mut balances: std::collections::BTreeMap<String, (usize, i64)> = Default::default();
    for r in read_consumed(brokers, "balances", 1) {
        let row: serde_json::Value = serde_json::from_str(&r.value).unwrap();
        let account = row["account"].as_str().unwrap().to_string();
        assert_eq!(r.key.as_deref(), Some(account.as_str()), "keyed by account");
        let (cents, after) = (
            row["cents"].as_i64().unwrap(),
            row["balance"].as_i64().unwrap(),
        );
        let (n, before) = balances.entry(account).or_default();
        assert_eq!(
            after,
            *before + cents,
            "{row}: the balance before was {before}"
        );
        (*n, *before) = (*n + 1, after);
    }
    let mut actual = String::new();
    for (account, (n, balance)) in &balances {
        actual.push_str(&format!("{account} movements={n} balance={balance}\n"));
    }
    let dead = read_consumed(brokers, "balance.dead-letters", 1);
    assert!(
        dead.iter()
            .any(|d| d.headers["sluice.reason"].contains("insufficient funds")),
        "a withdrawal past zero is a dead letter"
    );
    actual.push_str(&format!("dead letters={}\n", dead.len()));
    assert_eq!(actual, expected("balance-kafka"));
}

/// Kafka to Kafka with event time: each closed session of page views once
/// in `sessions` (keyed by user), the late views and the rejected line as
/// dead letters of their kinds, all as `expected.py` recomputes them; the
/// second half of the input runs in a second process, which restores the
/// open sessions, the timers and the watermark from the changelog topic.
#[test]
fn sessions_kafka_example_writes_each_closed_session_once_across_restarts() {
    let brokers = shared_broker();
    let example = KafkaExample {
        name: "sessions-kafka",
        input: "page-views",
        pipeline: "sessions",
        output: "sessions",
        data: "views.jsonl",
    };
    let dir = TempDir::new(example.name);
    let config = example.run_in_two_processes(brokers, dir.path());
    let mut sessions = Vec::new();
    for r in read_consumed(brokers, "sessions", 1) {
        let s: serde_json::Value = serde_json::from_str(&r.value).unwrap();
        let user = s["user"].as_str().unwrap().to_string();
        assert_eq!(r.key.as_deref(), Some(user.as_str()), "keyed by user");
        let int = |c: &str| s[c].as_i64().unwrap();
        sessions.push((user, int("start_ms"), int("end_ms"), int("views")));
    }
    let written = sessions.len();
    sessions.sort();
    sessions.dedup();
    assert_eq!(sessions.len(), written, "a session written twice");
    let mut actual = String::from("user start_ms end_ms views\n");
    for (user, start, end, views) in &sessions {
        actual.push_str(&format!("{user} {start} {end} {views}\n"));
    }
    let dead = read_consumed(brokers, "sessions.dead-letters", 1);
    let kind = |k: &str| {
        dead.iter()
            .filter(|d| d.headers["sluice.kind"] == k)
            .count()
    };
    assert_eq!(kind("late") + kind("rejected"), dead.len());
    // Open sessions are not written: what expected.py counts as open is
    // what the state still holds (`sluice state scan`), per user a list of
    // sessions of 28 bytes each (start, end, length, an 8-byte count).
    let config_arg = config.to_str().unwrap();
    let state = sluice_ok(&[
        "state",
        "scan",
        config_arg,
        "--partition",
        "page-views:0",
        "--prefix",
        "sluice/s/",
        "--limit",
        "0",
        "--json",
    ]);
    let open: usize = state
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["value_hex"].as_str().expect("sessions are bytes").len() / 2 / 28
        })
        .sum();
    actual.push_str(&format!(
        "open={open} late={} rejected={}\n",
        kind("late"),
        kind("rejected")
    ));
    assert_eq!(actual, expected("sessions-kafka"));
}

/// The local workflow's way in and out: a sample produced with `sluice
/// produce` (which creates the topic), run by a pipeline and verified, and
/// read back by `sluice consume` as the same records (partition, time, key,
/// value, headers; bytes that are not UTF-8 as hex), which read again as
/// a sample. A missing topic and a bad line are refused with nothing sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_sample_goes_in_with_produce_and_comes_back_with_consume() {
    use sluice::sample::{SampleLine, lines};
    let brokers = shared_broker();
    let topic = "workflow-io";
    let dir = TempDir::new(topic);
    let sample = dir.path().join("sample.jsonl");
    let text = [
        r#"{"value": "hello", "key": "k1", "partition": 1, "timestamp": 1700000000000, "headers": {"h": "v", "n": null}}"#,
        r#"{"value_hex": "00ff", "partition": 0, "timestamp": 1700000000001}"#,
        r#"{"value": {"json": [1, 2]}, "key_hex": "ff00", "partition": 1, "timestamp": 1700000000002, "offset": 99}"#,
        r#"{"value": null, "partition": 0, "timestamp": 1700000000003}"#,
    ]
    .join("\n");
    std::fs::write(&sample, &text).unwrap();
    let sample_arg = sample.to_str().unwrap();
    let said = sluice_ok(&[
        "produce",
        topic,
        sample_arg,
        "--brokers",
        brokers,
        "--partitions",
        "2",
    ]);
    assert!(
        said.contains("created workflow-io with 2 partitions")
            && said.contains("produced 4 records to workflow-io (by partition: 0: 2, 1: 2)"),
        "{said}"
    );

    // What a record is, apart from where the log put it.
    let record = |l: &SampleLine| {
        (
            l.partition,
            l.timestamp,
            l.key.clone(),
            l.value.clone(),
            l.headers.clone(),
        )
    };
    let mut sent: Vec<_> = lines(&text)
        .unwrap()
        .iter()
        .map(|(_, l)| record(l))
        .collect();
    let consumed = sluice_ok(&["consume", topic, "--brokers", brokers]);
    let mut back: Vec<_> = lines(&consumed)
        .unwrap()
        .iter()
        .map(|(_, l)| record(l))
        .collect();
    sent.sort();
    back.sort();
    assert_eq!(back, sent, "{consumed}");
    assert!(consumed.contains(r#""value_hex":"00ff""#), "{consumed}");
    let one = sluice_ok(&[
        "consume",
        topic,
        "--brokers",
        brokers,
        "--partition",
        "1",
        "--max-records",
        "1",
    ]);
    assert_eq!(one.lines().count(), 1, "{one}");

    let db = dir.path().join("out.db");
    let config = identity_config(topic, brokers, topic, &db, 100).write(dir.path());
    run_ok(&config);
    let pool = sqlite(&db).await;
    assert_eq!(
        identity_rows(&pool).await,
        read_committed(brokers, topic, 2)
    );
    let verified = sluice_ok(&["verify", config.to_str().unwrap()]);
    assert!(verified.contains(" 0 differ"), "{verified}");

    let refused = |args: &[&str], expected: &str| {
        let out = std::process::Command::new(sluice_bin())
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(expected),
            "{args:?}: {err}"
        );
    };
    refused(
        &[
            "produce",
            "workflow-io-none",
            sample_arg,
            "--brokers",
            brokers,
        ],
        "topic `workflow-io-none` does not exist",
    );
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"value\": \"ok\"}\n{\"valeu\": \"typo\"}\n").unwrap();
    refused(
        &[
            "produce",
            topic,
            bad.to_str().unwrap(),
            "--brokers",
            brokers,
        ],
        "line 2: unknown field `valeu`",
    );
    let wide = dir.path().join("wide.jsonl");
    std::fs::write(
        &wide,
        "{\"value\": \"ok\"}\n{\"value\": \"x\", \"partition\": 7}\n",
    )
    .unwrap();
    refused(
        &[
            "produce",
            topic,
            wide.to_str().unwrap(),
            "--brokers",
            brokers,
        ],
        "line 2: `workflow-io` has no partition 7 (it has 2)",
    );
    assert_eq!(
        read_committed(brokers, topic, 2).len(),
        4,
        "nothing more was sent"
    );
}
