//! Exactly-once under fault injection: the `sluice` process is killed with
//! SIGKILL at random moments and restarted, and the final tables must equal a
//! recomputation from an independent `read_committed` read of the input.
//!
//! Also keeps the broker's known aborted-record leak visible (docs/ARCHITECTURE.md).

use rand::{Rng, SeedableRng};
use sluice_tests::scenarios::{KillLoop, TwoOwners};
use sluice_tests::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_at_random_moments_loses_and_duplicates_nothing() {
    let broker = Broker::start();
    let dir = TempDir::new("crash");
    let kill_loop = KillLoop {
        brokers: &broker.brokers,
        name: "crash-input",
        seed: 0x5eed,
        kills: 24,
        max_records: 100,
        batch_interval_ms: 100,
        assigned: false,
    };
    kill_loop
        .run(&sinks::SinkDb::Sqlite(dir.path().join("crash.db")))
        .await;
}

/// Two processes statically assigned the same partitions race for every
/// range of one SQLite file: each range is committed once, the loser rolls
/// back.
#[tokio::test(flavor = "multi_thread")]
async fn two_owners_of_the_same_partitions_fence_each_other() {
    let dir = TempDir::new("sqlite-fence");
    let two_owners = TwoOwners {
        brokers: shared_broker(),
        name: "sqlite-fence",
        records: 40_000,
        partitions: PARTITIONS,
        max_records: 100,
        batch_interval_ms: 20,
    };
    two_owners
        .run(&sinks::SinkDb::Sqlite(dir.path().join("fence.db")))
        .await;
}

/// Word count accumulates into SQLite across SIGKILLs: the totals equal the
/// word counts recomputed from the committed input.
#[tokio::test(flavor = "multi_thread")]
async fn word_count_totals_survive_sigkill() {
    let brokers = shared_broker();
    let topic = "crash-words";
    create_topic(brokers, topic, PARTITIONS);
    let words = ["alpha", "beta", "gamma", "delta", "epsilon"];
    let lines: Vec<Produce> = (0..20_000)
        .map(|i| Produce {
            partition: i % PARTITIONS,
            key: None,
            value: format!(
                "{} {} {}",
                words[i as usize % 5],
                words[(i as usize / 5) % 5],
                i % 7
            ),
        })
        .collect();
    produce(brokers, topic, &lines[..10_000]);
    produce_transaction(brokers, topic, "wc-commit", &lines[10_000..15_000], true);
    produce_transaction(brokers, topic, "wc-abort", &lines[15_000..], false);

    let dir = TempDir::new("wc-crash");
    let db = dir.path().join("wc.db");
    let config = PipelineToml::new("wc-crash", brokers, &[topic], &plugin("word-count"))
        .max_records_per_partition(300)
        .batch_interval_ms(50)
        .short_session()
        .sink_url(&format!("sqlite://{}", db.display()))
        .target(Target::word_counts())
        .write(dir.path());
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..5 {
        let mut child = Command::new(sluice_bin())
            .args(["run", "--until-caught-up"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        std::thread::sleep(Duration::from_millis(rng.gen_range(300..1500)));
        let _ = child.kill();
        let _ = child.wait();
    }
    run_ok(&config);

    let mut expected = std::collections::BTreeMap::<String, i64>::new();
    for seen in read_committed(brokers, topic, PARTITIONS) {
        for w in seen
            .value
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            *expected.entry(w.to_lowercase()).or_default() += 1;
        }
    }
    let pool = sqlite(&db).await;
    let rows: Vec<(String, i64)> = sqlx::query_as("SELECT word, n FROM word_counts ORDER BY word")
        .fetch_all(&pool)
        .await
        .unwrap();
    let actual: std::collections::BTreeMap<String, i64> = rows.into_iter().collect();
    assert_eq!(actual, expected);
    assert_contiguous_lineage(&pool, "wc-crash").await;
}

/// Reproduces the broker defect docs/ARCHITECTURE.md describes: this Tansu build lets a
/// `read_committed` consumer see records of some aborted transactions. The
/// crash test stays right regardless (it compares with the broker's own
/// committed view); this test keeps the defect visible. If it starts
/// failing, the broker was fixed: update docs/ARCHITECTURE.md and delete this test.
#[test]
fn broker_defect_aborted_records_visible_to_read_committed() {
    let broker = Broker::start();
    let topic = "abort-leak";
    create_topic(&broker.brokers, topic, 1);
    let mut aborted_values = std::collections::HashSet::new();
    for t in 0..12 {
        let records: Vec<Produce> = (0..300)
            .map(|i| Produce {
                partition: 0,
                key: None,
                value: format!("aborted-{t}-{i}"),
            })
            .collect();
        aborted_values.extend(records.iter().map(|r| r.value.clone()));
        produce_transaction(
            &broker.brokers,
            topic,
            &format!("leak-{t}"),
            &records,
            false,
        );
        let committed = vec![Produce {
            partition: 0,
            key: None,
            value: format!("committed-{t}"),
        }];
        produce_transaction(&broker.brokers, topic, &format!("ok-{t}"), &committed, true);
    }
    let seen = read_committed(&broker.brokers, topic, 1);
    let committed = seen
        .iter()
        .filter(|s| s.value.starts_with("committed-"))
        .count();
    let leaked = seen
        .iter()
        .filter(|s| aborted_values.contains(&s.value))
        .count();
    println!("read_committed saw {committed} committed and {leaked} aborted records (of 3600)");
    assert_eq!(committed, 12, "committed records must all be visible");
    assert!(
        leaked > 0,
        "no aborted record leaked: the broker defect seems fixed; update docs/ARCHITECTURE.md and remove this test"
    );
}

/// SIGTERM finishes the batch in flight and exits 0: whatever was committed
/// is exactly the records below each checkpoint, never half a batch; a
/// restart then completes the rest.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_the_batch_in_flight() {
    let brokers = shared_broker();
    let topic = "drain";
    create_topic(brokers, topic, 2);
    produce(brokers, topic, &numbered("drain", 60_000, 2));
    let dir = TempDir::new("drain");
    let db = dir.path().join("drain.db");
    let config = write_config(
        dir.path(),
        identity_config("drain", brokers, topic, &db, 200),
    );

    let child = Command::new(sluice_bin())
        .arg("run")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Stop it mid-run: as soon as the first batches are committed.
    let deadline = Instant::now() + Duration::from_secs(60);
    while sinks::SinkDb::Sqlite(db.clone()).committed_batches().await == 0 {
        assert!(Instant::now() < deadline, "no batch committed within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "SIGTERM must exit 0: {stderr}");
    assert!(stderr.contains("finishing the batch in flight"), "{stderr}");

    let expected = read_committed(brokers, topic, 2);
    let pool = sqlite(&db).await;
    let stored = checkpoints(&pool, "drain").await;
    assert!(!stored.is_empty(), "some batches committed before SIGTERM");
    let below_checkpoints: Vec<Seen> = expected
        .iter()
        .filter(|s| {
            stored
                .iter()
                .any(|(p, next)| *p == s.partition && s.offset < *next)
        })
        .cloned()
        .collect();
    assert!(
        below_checkpoints.len() < expected.len(),
        "stopped before the end"
    );
    assert_eq!(
        identity_rows(&pool).await,
        below_checkpoints,
        "exactly the committed ranges, no half batch"
    );

    run_ok(&config);
    assert_eq!(identity_rows(&pool).await, expected);
    assert_contiguous_lineage(&pool, "drain").await;
}

/// SIGTERM while the sink is down (a pod stopped during a database
/// outage): the commit's retries end at once, the batch in flight is
/// abandoned rather than retried for minutes past the grace period, and
/// the process exits cleanly within seconds. Nothing is lost: with the
/// sink back, a restart lands every record exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_sink_outage_exits_at_once_and_loses_nothing() {
    use sluice_tests::redis_server::{RedisServer, identity_redis_config};
    let name = "term_outage";
    let brokers = shared_broker();
    create_topic(brokers, name, 2);
    produce(brokers, name, &numbered(name, 400, 2));
    let mut redis = RedisServer::start(name);
    let dir = TempDir::new(name);
    let (port, _) = sluice_tests::control::control_port();
    let config = identity_redis_config(name, brokers, name, &redis.url(), 100)
        .batch_interval_ms(50)
        .control(port, 1 << 20)
        .write(dir.path());
    let mut host = sluice_tests::control::Host::start(&config, &dir.path().join("host.log"));
    host.wait_for_api(port);
    host.wait_for_metric("sluice_records_in_total", 400.0, Duration::from_secs(90));
    redis.kill();
    produce(brokers, name, &numbered("during", 400, 2));
    host.wait_for_log("retrying in", 2, Duration::from_secs(60));
    let took = host.terminate_within(Duration::from_secs(10), "with the sink down");
    let log = host.log();
    assert!(log.contains("the batch is abandoned"), "{log}");
    assert!(host.exit_status().is_some_and(|s| s.success()), "{log}");
    println!("{name}: exited {took:?} after SIGTERM with the sink down");
    redis.restart();
    run_ok(&config);
    let expected = read_committed(brokers, name, 2);
    assert_eq!(expected.len(), 800);
    redis.assert_identity_exactly_once(name, &expected);
}

/// A batch whose partitions are all read to their log end is cut at once,
/// not after `batch_interval_ms`: with an interval of a minute, a one-shot
/// `--until-caught-up` run ends within seconds, and a running pipeline
/// commits each of three waves of records long before the interval is up
/// (the first by its poll, the later ones by the read-ahead after a
/// commit), and SIGTERM does not wait for the poll under way either. What
/// it commits is still exactly the input.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_at_its_end_does_not_hold_a_batch_back() {
    const INTERVAL: Duration = Duration::from_secs(60);
    let brokers = shared_broker();
    let topic = "tail";
    create_topic(brokers, topic, 2);
    let dir = TempDir::new("tail");
    let db = dir.path().join("tail.db");
    let config = identity_config("tail", brokers, topic, &db, 10_000)
        .batch_interval_ms(INTERVAL.as_millis() as u64)
        .write(dir.path());
    let sink = sinks::SinkDb::Sqlite(db.clone());

    produce(brokers, topic, &numbered("tail-0", 50, 2));
    let started = Instant::now();
    run_ok(&config);
    let one_shot = started.elapsed();
    assert!(
        one_shot < INTERVAL / 2,
        "--until-caught-up took {one_shot:?}: the last batch waited for the interval"
    );
    assert_eq!(
        sink.committed_batches().await,
        1,
        "one batch for the 50 records"
    );

    let mut child = Command::new(sluice_bin())
        .arg("run")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut expected_rows = 50;
    for wave in 1..=3 {
        produce(brokers, topic, &numbered(&format!("tail-{wave}"), 20, 2));
        expected_rows += 20;
        let produced = Instant::now();
        sluice_tests::control::wait_for_rows(&sink, expected_rows, INTERVAL / 2).await;
        eprintln!(
            "wave {wave}: committed {:?} after it was produced",
            produced.elapsed()
        );
    }
    // A poll of up to a minute is under way: SIGTERM cuts it short.
    let stopping = Instant::now();
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().expect("wait").success());
    assert!(
        stopping.elapsed() < INTERVAL / 2,
        "SIGTERM took {:?}: it waited for the poll",
        stopping.elapsed()
    );
    let pool = sqlite(&db).await;
    assert_eq!(
        identity_rows(&pool).await,
        read_committed(brokers, topic, 2)
    );
    assert_contiguous_lineage(&pool, "tail").await;
}

/// Two instances of one pipeline split the partitions through the consumer
/// group, hand them over when one stops, and together deliver every record
/// exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn two_instances_share_partitions_exactly_once() {
    let brokers = shared_broker();
    let topic = "shared";
    create_topic(brokers, topic, 4);
    produce(brokers, topic, &numbered("shared", 40_000, 4));
    let dir = TempDir::new("shared");
    let db = dir.path().join("shared.db");
    let shared = identity_config("shared", brokers, topic, &db, 250);
    let config = shared.write(dir.path());
    let spawn = || {
        Command::new(sluice_bin())
            .args(["run", "--until-caught-up"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let first = spawn();
    std::thread::sleep(Duration::from_millis(1_500));
    let second = spawn();
    for child in [first, second] {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Whatever the two left (a partition revoked late), a last run finishes.
    // It joins under another consumer group: the group only splits work, the
    // checkpoint lives in the sink. (Joining the old group again sometimes
    // waits forever on Tansu after two members left: a broker defect noted
    // in the issue, not reproduced minimally yet.)
    let final_config = shared
        .source("group_id", "sluice-shared-final")
        .write(dir.path());
    run_ok(&final_config);
    let pool = sqlite(&db).await;
    assert_eq!(
        identity_rows(&pool).await,
        read_committed(brokers, topic, 4)
    );
    assert_contiguous_lineage(&pool, "shared").await;
}
