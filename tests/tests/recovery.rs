//! How fast an instance is back at work after it died, and what it finds
//! when partitions come back to it: a SIGKILLed instance restarted with
//! static membership (`source.instance_id`) against one without; a
//! partition returning to an instance that owned it before, with its
//! checkpoint beyond the log end this instance last saw.
//!
//! Each test has its own topic, pipeline and SQLite file.

use sluice_tests::control::{Host, Producer, sluice_ok};
use sluice_tests::{
    PipelineToml, TempDir, create_topic, identity_config, shared_broker, sqlite_count,
};
use std::path::Path;
use std::time::{Duration, Instant};

/// Starts `config` with its log in `log`, waits for its first commit;
/// returns the host and how long that took from the start of the process.
fn start_until_first_commit(config: &Path, log: &Path) -> (Host, Duration) {
    let started = Instant::now();
    let host = Host::start(config, log);
    host.wait_for_log("batch committed", 1, Duration::from_secs(120));
    (host, started.elapsed())
}

/// An identity pipeline on `name` (2 partitions), changed by `change`,
/// written to `dir`.
fn pipeline(
    name: &str,
    dir: &TempDir,
    change: impl FnOnce(PipelineToml) -> PipelineToml,
) -> std::path::PathBuf {
    create_topic(shared_broker(), name, 2);
    change(identity_config(
        name,
        shared_broker(),
        name,
        &dir.path().join("out.db"),
        500,
    ))
    .write(dir.path())
}

/// Kills the first run with SIGKILL and measures the restart's time to its
/// first commit.
fn restart_after_sigkill(config: &Path, dir: &TempDir) -> Duration {
    let (first, _) = start_until_first_commit(config, &dir.path().join("first.log"));
    first.signal(libc::SIGKILL);
    drop(first);
    let (second, took) = start_until_first_commit(config, &dir.path().join("second.log"));
    second.stop();
    took
}

/// Session timeout of the pipelines in the restart test: long enough that
/// waiting for an old session to expire cannot hide in the noise.
const SESSION_TIMEOUT: Duration = Duration::from_secs(20);

/// With static membership a SIGKILLed instance restarted under the same
/// name gets its partitions back without waiting for its old session to
/// expire; without it, it waits for that and a rebalance. Both measured in
/// this run, under a steady producer. (Tansu pauses a static member's
/// JoinGroup and SyncGroup for 3 s each, so "at once" is ~6 s there; on
/// Apache Kafka a known static member rejoins without a rebalance.)
#[test]
fn a_restarted_static_member_takes_its_partitions_back_at_once() {
    let dynamic_dir = TempDir::new("recovery-dynamic");
    let session = |config: PipelineToml| {
        config.source_property(
            "session.timeout.ms",
            &SESSION_TIMEOUT.as_millis().to_string(),
        )
    };
    let dynamic = pipeline("recovery-dynamic", &dynamic_dir, session);
    let static_dir = TempDir::new("recovery-static");
    let fixed = pipeline("recovery-static", &static_dir, |config| {
        session(config).source("instance_id", "recovery-host-a")
    });
    let producers = [
        Producer::start(shared_broker(), "recovery-dynamic", 2),
        Producer::start(shared_broker(), "recovery-static", 2),
    ];
    let dynamic_took = restart_after_sigkill(&dynamic, &dynamic_dir);
    let static_took = restart_after_sigkill(&fixed, &static_dir);
    for p in producers {
        p.stop();
    }
    println!(
        "restart after SIGKILL to first commit: static member {:.1} s, dynamic member {:.1} s ({:.2}x)",
        static_took.as_secs_f64(),
        dynamic_took.as_secs_f64(),
        static_took.as_secs_f64() / dynamic_took.as_secs_f64()
    );
    assert!(
        static_took < SESSION_TIMEOUT,
        "a static member waited {static_took:?}, as long as its old session ({SESSION_TIMEOUT:?})"
    );
    assert!(
        dynamic_took > SESSION_TIMEOUT,
        "a dynamic member was back in {dynamic_took:?}: the comparison measured nothing"
    );
}

/// A partition comes back to an instance that owned it before, while
/// another instance moved its checkpoint past the log end the first one
/// last fetched: the first instance resumes there instead of failing with
/// "beyond the log end" (its cached log end is stale until a fetch).
#[test]
fn a_partition_returning_to_its_former_owner_resumes_at_the_new_checkpoint() {
    let name = "recovery-return";
    let dir = TempDir::new(name);
    let config = pipeline(name, &dir, |config| config);
    let producer = Producer::start(shared_broker(), name, 2);
    let (first, _) = start_until_first_commit(&config, &dir.path().join("first.log"));
    let second = Host::start(&config, &dir.path().join("second.log"));
    // The second instance takes a partition, works it, and leaves.
    second.wait_for_log("batch committed", 5, Duration::from_secs(120));
    let assigned = first.log().matches("partitions assigned").count();
    second.stop();
    first.wait_for_log(
        "partitions assigned",
        assigned + 1,
        Duration::from_secs(120),
    );
    let committed = first.log().matches("batch committed").count();
    first.wait_for_log("batch committed", committed + 10, Duration::from_secs(60));
    assert!(
        !first.log().contains("beyond the log end"),
        "{}",
        first.log()
    );
    producer.stop();
    first.stop();
}

/// `sluice reset`: a dry run changes nothing; one partition moved back to
/// an offset is processed again from there (append rows come again), the
/// old run's lineage moves to `PIPELINE@reset-1` and stays readable, and
/// `verify` passes on the new lineage; a reset while an instance runs
/// fences it at its next commit and it continues from the new checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn reset_reprocesses_on_purpose_and_keeps_the_old_run_readable() {
    use sluice_tests::{numbered, produce, run_ok, sqlite};
    let name = "recovery-reset";
    let dir = TempDir::new(name);
    let config = pipeline(name, &dir, |config| config);
    let config_arg = config.to_str().unwrap();
    produce(shared_broker(), name, &numbered(name, 200, 2));
    run_ok(&config);
    let pool = sqlite(&dir.path().join("out.db")).await;
    assert_eq!(
        sqlite_count(&pool, "SELECT count(*) FROM records").await,
        200
    );

    let dry = sluice_ok(&["reset", config_arg, "--to-earliest", "--dry-run"]);
    assert!(
        dry.contains("would move") && dry.contains("dry run"),
        "{dry}"
    );
    let by_time = sluice_ok(&["reset", config_arg, "--to-time", "0", "--dry-run"]);
    assert!(
        by_time.contains(&format!("{name}[0]: checkpoint 100 -> 0")),
        "{by_time}"
    );
    let checkpoints = "SELECT sum(next_offset) FROM sluice_checkpoints";
    assert_eq!(
        sqlite_count(&pool, checkpoints).await,
        200,
        "a dry run changed checkpoints"
    );

    // Refused, nothing changed: an offset outside the log, a partition the
    // pipeline does not read, no target at all.
    for (args, says) in [
        (vec!["--to-offset", "999999"], "is not in the log"),
        (
            vec!["--to-earliest", "--partition", "elsewhere:0"],
            "not a partition",
        ),
        (vec![], "required"),
    ] {
        let out = std::process::Command::new(sluice_tests::sluice_bin())
            .args(["reset", config_arg])
            .args(&args)
            .output()
            .expect("run sluice");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
    assert_eq!(
        sqlite_count(&pool, checkpoints).await,
        200,
        "a refused reset changed checkpoints"
    );

    let partition = format!("{name}:0");
    let moved = sluice_ok(&[
        "reset",
        config_arg,
        "--to-offset",
        "50",
        "--partition",
        &partition,
    ]);
    assert!(
        moved.contains(&format!("{name}[0]: checkpoint 100 -> 50")),
        "{moved}"
    );
    assert!(moved.contains(&format!("`{name}@reset-1`")), "{moved}");
    assert!(moved.contains("appended again"), "{moved}");
    run_ok(&config);
    assert_eq!(
        sqlite_count(&pool, "SELECT count(*) FROM records").await,
        250
    );
    let twice = sqlite_count(
        &pool,
        "SELECT count(*) FROM (SELECT partition, \"offset\" FROM records \
         GROUP BY 1, 2 HAVING count(*) = 2)",
    )
    .await;
    assert_eq!(twice, 50, "partition 0 offsets 50..100 processed twice");
    let archived = format!("SELECT count(*) FROM sluice_batches WHERE pipeline = '{name}@reset-1'");
    assert!(
        sqlite_count(&pool, &archived).await >= 1,
        "the old run's lineage is kept"
    );
    let verified = sluice_ok(&["verify", config_arg]);
    assert!(verified.contains(" 0 differ"), "{verified}");

    // A running instance: fenced at its next commit, continues from 0.
    let host = Host::start(&config, &dir.path().join("running.log"));
    host.wait_for_log("reading partition", 2, Duration::from_secs(60));
    sluice_ok(&["reset", config_arg, "--to-earliest"]);
    produce(shared_broker(), name, &numbered("late", 10, 2));
    let deadline = Instant::now() + Duration::from_secs(60);
    while sqlite_count(&pool, "SELECT count(*) FROM records").await < 250 + 210 {
        assert!(
            Instant::now() < deadline,
            "not re-read after the reset:\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(host.log().contains("fenced"), "{}", host.log());
    host.stop();
    assert_eq!(
        sqlite_count(&pool, "SELECT count(*) FROM records").await,
        460
    );
}
