//! The stdout sink: rows printed as JSON lines or tables, dead letters on
//! stderr, checkpoints in the local state store. Across SIGKILLs it
//! resumes from its checkpoint and prints at most the batch in flight
//! again (at-least-once, a window of one batch); nothing is lost compared
//! with an independent `read_committed` read.

use rand::{Rng, SeedableRng};
use sluice_tests::control::sluice_ok;
use sluice_tests::*;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;
const MAX_RECORDS: i64 = 200;

/// Pipeline `pipeline` running `plugin_name` (`identity`, or
/// `json-filter` into `purchases`) on `topic`, printing to stdout.
fn stdout_config(pipeline: &str, brokers: &str, topic: &str, plugin_name: &str) -> PipelineToml {
    let target = match plugin_name {
        "identity" => Target::records(),
        _ => Target::new("purchases")
            .column("id", "integer")
            .column("user", "text")
            .column("amount", "real"),
    };
    PipelineToml::new(pipeline, brokers, &[topic], &plugin(plugin_name))
        .max_records_per_partition(MAX_RECORDS as u32)
        .batch_interval_ms(50)
        .short_session()
        .sink_url("stdout://")
        .target(target)
}

/// Lineage batches the state store next to `config` holds.
async fn committed_batches(dir: &std::path::Path) -> i64 {
    let db = dir.join(".sluice-state.db");
    if !db.exists() {
        return 0;
    }
    let pool = sqlite(&db).await;
    let n = sqlx::query_scalar("SELECT count(*) FROM sluice_batches")
        .fetch_one(&pool)
        .await
        .unwrap_or(0);
    pool.close().await;
    n
}

#[tokio::test(flavor = "multi_thread")]
async fn stdout_resumes_after_sigkill_and_repeats_at_most_the_batch_in_flight() {
    let brokers = shared_broker();
    let topic = "stdout-crash";
    create_topic(brokers, topic, PARTITIONS);
    produce(brokers, topic, &numbered(topic, 20_000, PARTITIONS));
    let dir = TempDir::new("stdout-crash");
    let config = write_config(
        dir.path(),
        stdout_config("stdout-crash", brokers, topic, "identity"),
    );
    let printed = dir.path().join("printed.jsonl");
    let spawn = || {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&printed)
            .unwrap();
        Command::new(sluice_bin())
            .args(["run", "--until-caught-up"])
            .arg(&config)
            .env("SLUICE_LOG", "info")
            .stdout(out)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice")
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let mut kills = 0;
    let started = Instant::now();
    while kills < 6 {
        let seen = committed_batches(dir.path()).await;
        let mut child = spawn();
        while child.try_wait().unwrap().is_none() && committed_batches(dir.path()).await <= seen {
            assert!(started.elapsed() < Duration::from_secs(300), "no progress");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..40))).await;
        if child.try_wait().unwrap().is_some() {
            break;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
    }
    let last = spawn().wait_with_output().unwrap();
    let logs = String::from_utf8_lossy(&last.stderr);
    assert!(last.status.success(), "{logs}");
    assert!(logs.contains("stdout sink: at-least-once"), "{logs}");

    let mut times: BTreeMap<(i64, i64), (usize, String)> = BTreeMap::new();
    let text = std::fs::read_to_string(&printed).unwrap();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue; // a line cut by a kill
        };
        let row = &v["row"];
        let key = (
            row["partition"].as_i64().unwrap(),
            row["offset"].as_i64().unwrap(),
        );
        let entry = times
            .entry(key)
            .or_insert((0, row["value"].as_str().unwrap().to_string()));
        entry.0 += 1;
    }
    let expected = read_committed(brokers, topic, PARTITIONS);
    for s in &expected {
        let (n, value) = times
            .get(&(s.partition as i64, s.offset))
            .unwrap_or_else(|| panic!("record {}@{} never printed", s.partition, s.offset));
        assert!(*n >= 1);
        assert_eq!(value, &s.value);
    }
    assert_eq!(
        times.len(),
        expected.len(),
        "printed records that are not in the input"
    );
    let repeated: usize = times.values().map(|(n, _)| n - 1).sum();
    let window = (PARTITIONS as i64 * MAX_RECORDS) as usize;
    assert!(
        repeated <= kills * window,
        "{repeated} repeated rows after {kills} kills: more than one batch ({window}) per kill"
    );
    let pool = sqlite(&dir.path().join(".sluice-state.db")).await;
    assert_contiguous_lineage(&pool, "stdout-crash").await;
    println!(
        "{kills} SIGKILLs; {} records printed, {repeated} rows printed again (bound {})",
        expected.len(),
        kills * window
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stdout_prints_tables_and_dead_letters_and_verifies() {
    let brokers = shared_broker();
    let topic = "stdout-table";
    create_topic(brokers, topic, 1);
    let events = [
        r#"{"id":1,"user":"ann","event":"purchase","amount":12.5}"#,
        r#"{"id":2,"user":"bob","event":"purchase","amount":100.25}"#,
        "not json",
        r#"{"id":3,"user":"a-very-long-user-name-that-goes-on-and-on-and-on","event":"purchase","amount":3.0}"#,
    ];
    let records: Vec<Produce> = events
        .iter()
        .map(|e| Produce {
            partition: 0,
            key: None,
            value: e.to_string(),
        })
        .collect();
    produce(brokers, topic, &records);
    let dir = TempDir::new("stdout-table");
    let config = write_config(
        dir.path(),
        stdout_config("stdout-table", brokers, topic, "json-filter").sink("format", "table"),
    );
    let out = Command::new(sluice_bin())
        .args(["run", "--until-caught-up"])
        .arg(&config)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("── batch "), "{stdout}");
    assert!(
        stdout.contains("4 records, 3 rows, 1 dead letters"),
        "{stdout}"
    );
    let header = stdout
        .lines()
        .find(|l| l.contains("amount"))
        .expect("a header line");
    let ann = stdout
        .lines()
        .find(|l| l.contains("ann"))
        .expect("ann's row");
    assert_eq!(
        header.find("id"),
        ann.find('1'),
        "columns not aligned:\n{stdout}"
    );
    assert!(
        stdout.contains("a-very-long-user-name-that-goes-on-and-…"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("batches,"),
        "the run summary belongs on stderr: {stdout}"
    );
    let dead: serde_json::Value = stderr
        .lines()
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v["dead_letter"].is_object())
        })
        .unwrap_or_else(|| panic!("no dead letter line: {stderr}"));
    assert_eq!(dead["dead_letter"]["offset"], 2);
    assert_eq!(dead["dead_letter"]["value"], "not json");
    assert_eq!(dead["dead_letter"]["kind"], "rejected");
    let verified = sluice_ok(&["verify", config.to_str().unwrap()]);
    assert!(verified.contains(" 0 differ"), "{verified}");
}

/// A terminal takes no part in a commit: `guarantee = "exactly-once"` on
/// the stdout sink is refused by `check` and by `run`, with the reason and
/// what to use, before anything is read; without it the sink runs
/// at-least-once, as the start-up line says.
#[test]
fn stdout_refuses_exactly_once_and_says_what_to_use() {
    let brokers = shared_broker();
    let topic = "stdout-exactly-once";
    create_topic(brokers, topic, 1);
    let dir = TempDir::new(topic);
    let config = write_config(
        dir.path(),
        stdout_config(topic, brokers, topic, "identity").sink("guarantee", "exactly-once"),
    );
    for verb in ["check", "run"] {
        let out = Command::new(sluice_bin())
            .arg(verb)
            .args((verb == "run").then_some("--until-caught-up"))
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && out.stdout.is_empty(),
            "{verb}: {stderr}"
        );
        assert!(
            stderr.contains("the stdout sink cannot be exactly-once")
                && stderr.contains("\"at-least-once\""),
            "{verb}: {stderr}"
        );
    }
    assert!(
        !dir.path().join(".sluice-state.db").exists(),
        "refused before the state store was opened"
    );
}
