//! The Redis sink against real Redis servers (each test starts its own
//! `redis-server` with an append-only file, `appendfsync always`): exactly
//! once across SIGKILLs, two owners of one partition, Redis itself killed
//! and restarted, a lost script reply, the module lifecycle, the
//! at-least-once (idempotent) mode, dead letters kept by count and bad
//! configs. Results are compared with an independent `read_committed` read
//! of the input.

use redis::Commands;
use sluice_tests::proxy::FaultProxy;
use sluice_tests::redis_server::{RedisServer, identity_redis_config};
use sluice_tests::scenarios::{BadConfigs, KillLoop, Lifecycle, TwoOwners};
use sluice_tests::*;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use toml::Value;

const PARTITIONS: i32 = 4;

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_at_random_moments_on_redis_loses_and_duplicates_nothing() {
    let broker = Broker::start();
    let kill_loop = KillLoop {
        brokers: &broker.brokers,
        name: "redis-crash",
        seed: 0x7ed15,
        kills: 24,
        max_records: 100,
        batch_interval_ms: 100,
        assigned: false,
    };
    kill_loop.run(&RedisServer::start("crash")).await;
}

/// Two processes statically assigned the same partitions race for every
/// range; the script's compare-and-set lets one commit each.
#[tokio::test(flavor = "multi_thread")]
async fn two_owners_of_one_partition_commit_each_range_once() {
    let two_owners = TwoOwners {
        brokers: shared_broker(),
        name: "redis-fence",
        records: 30_000,
        partitions: 2,
        max_records: 50,
        batch_interval_ms: 100,
    };
    two_owners.run(&RedisServer::start("fence")).await;
}

/// A batch is bounded across its partitions when it is planned, not split
/// mid-commit: every lineage entry holds at most `max_records_per_batch`
/// offsets, and the result is exact.
#[tokio::test(flavor = "multi_thread")]
async fn batches_are_capped_up_front_across_partitions() {
    let brokers = shared_broker();
    let topic = "redis-cap";
    create_topic(brokers, topic, PARTITIONS);
    produce(brokers, topic, &numbered(topic, 8_000, PARTITIONS));
    let redis = RedisServer::start("cap");
    let dir = TempDir::new("redis-cap");
    let config = write_config(
        dir.path(),
        identity_redis_config("rcap", brokers, topic, &redis.url(), 1000)
            .source("max_records_per_batch", 300),
    );
    run_ok(&config);
    let entries: Vec<String> = redis.conn().lrange("sluice_lineage:rcap", 0, -1).unwrap();
    let mut multi = 0;
    for e in &entries {
        let v: serde_json::Value = serde_json::from_str(e).unwrap();
        let ranges = v["ranges"].as_array().unwrap();
        let offsets: i64 = ranges
            .iter()
            .map(|r| r["until"].as_i64().unwrap() - r["from"].as_i64().unwrap())
            .sum();
        assert!(offsets <= 300, "a batch of {offsets} offsets: {e}");
        multi += (ranges.len() > 1) as usize;
    }
    assert!(multi > 0, "no batch spanned several partitions");
    redis.assert_identity_exactly_once("rcap", &read_committed(brokers, topic, PARTITIONS));
    println!(
        "{} batches of at most 300 offsets, {multi} over several partitions",
        entries.len()
    );
}

/// Redis SIGKILLed mid-run and started again from its append-only file:
/// the pipeline waits, resumes, and the result is exact.
#[tokio::test(flavor = "multi_thread")]
async fn redis_killed_and_restarted_mid_run_resumes_exactly() {
    let brokers = shared_broker();
    let topic = "redis-restart";
    create_topic(brokers, topic, PARTITIONS);
    produce(brokers, topic, &numbered(topic, 40_000, PARTITIONS));
    let mut redis = RedisServer::start("restart");
    let dir = TempDir::new("redis-restart");
    let config = write_config(
        dir.path(),
        identity_redis_config("rrestart", brokers, topic, &redis.url(), 100),
    );
    let child = spawn_until_caught_up(&config, "info", Stdio::piped());
    let started = Instant::now();
    while redis.committed_batches("rrestart") < 5 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no batch committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    redis.restart();
    let out = child.wait_with_output().expect("run");
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert!(
        logs.contains("sink unavailable"),
        "the outage went unnoticed: {logs}"
    );
    let n =
        redis.assert_identity_exactly_once("rrestart", &read_committed(brokers, topic, PARTITIONS));
    println!("Redis killed and restarted mid-run; {n} records exactly once");
}

/// Redis frozen (SIGSTOP) for several reply timeouts mid-run, then thawed:
/// the commit in flight times out (outcome unknown), reads time out and are
/// retried, the queued script runs on thaw and is resolved from the
/// checkpoints; the result is exact.
#[tokio::test(flavor = "multi_thread")]
async fn frozen_redis_is_waited_out_and_the_result_is_exact() {
    let brokers = shared_broker();
    let topic = "redis-frozen";
    create_topic(brokers, topic, PARTITIONS);
    produce(brokers, topic, &numbered(topic, 40_000, PARTITIONS));
    let redis = RedisServer::start("frozen");
    let dir = TempDir::new("redis-frozen");
    let config = identity_redis_config("rfrozen", brokers, topic, &redis.url(), 100)
        .sink("lock_timeout_ms", 500)
        .write(dir.path());
    let child = spawn_until_caught_up(&config, "info", Stdio::piped());
    let started = Instant::now();
    while redis.committed_batches("rfrozen") < 5 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no batch committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.signal(libc::SIGSTOP);
    tokio::time::sleep(Duration::from_secs(4)).await;
    redis.signal(libc::SIGCONT);
    let out = child.wait_with_output().expect("run");
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert!(
        logs.contains("commit outcome unknown") || logs.contains("sink unavailable"),
        "the freeze went unnoticed: {logs}"
    );
    let n =
        redis.assert_identity_exactly_once("rfrozen", &read_committed(brokers, topic, PARTITIONS));
    let unknown = logs.matches("commit outcome unknown").count();
    println!(
        "Redis frozen 4 s mid-run; {unknown} commits of unknown outcome; {n} records exactly once"
    );
}

/// A fault proxy swallows the reply to some commit scripts after Redis ran
/// them: the pipeline reads the checkpoints back and writes nothing twice.
#[tokio::test(flavor = "multi_thread")]
async fn lost_script_reply_is_resolved_from_the_checkpoints() {
    let brokers = shared_broker();
    let topic = "redis-lost-reply";
    create_topic(brokers, topic, PARTITIONS);
    produce(brokers, topic, &numbered(topic, 20_000, PARTITIONS));
    let redis = RedisServer::start("lost-reply");
    let proxy = FaultProxy::start_on(&format!("127.0.0.1:{}", redis.port), b"EVALSHA", 5, 4);
    let via = format!("redis://127.0.0.1:{}/0", proxy.port);
    let dir = TempDir::new("redis-lost-reply");
    let config = write_config(
        dir.path(),
        identity_redis_config("rlost", brokers, topic, &via, 200),
    );
    let out = spawn_until_caught_up(&config, "info", Stdio::piped())
        .wait_with_output()
        .expect("run sluice");
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert!(proxy.drops() >= 3, "only {} replies dropped", proxy.drops());
    let unknown = logs.matches("commit outcome unknown").count();
    let landed = logs.matches("commit had landed").count();
    assert!(
        unknown >= 3 && landed >= 1,
        "unknown {unknown}, landed {landed}: {logs}"
    );
    let n =
        redis.assert_identity_exactly_once("rlost", &read_committed(brokers, topic, PARTITIONS));
    println!(
        "{} script replies dropped of {}; {landed} resolved as landed; {n} records exactly once",
        proxy.drops(),
        proxy.commits()
    );
}

/// Deploy, hot swap under load, rollback and `verify` on a Redis pipeline:
/// the module store and lineage live in Redis.
#[tokio::test(flavor = "multi_thread")]
async fn module_lifecycle_works_on_redis() {
    let lifecycle = Lifecycle {
        brokers: shared_broker(),
        name: "redis-lifecycle",
        max_records: 200,
    };
    lifecycle.run(&RedisServer::start("lifecycle")).await;
}

/// At-least-once (idempotent) mode: commands pipelined, offsets after.
/// Idempotent commands land the same however often a batch is replayed.
#[tokio::test(flavor = "multi_thread")]
async fn idempotent_mode_writes_idempotent_commands() {
    let brokers = shared_broker();
    let topic = "redis-idempotent";
    create_topic(brokers, topic, PARTITIONS);
    produce(brokers, topic, &numbered(topic, 10_000, PARTITIONS));
    let redis = RedisServer::start("idempotent");
    let dir = TempDir::new("redis-idempotent");
    let records = Target::records()
        .redis(&[
            ("command", "hset".into()),
            ("key", "values:{partition}".into()),
            ("field", "{offset}".into()),
            ("value", "{value}".into()),
        ])
        .redis(&[
            ("command", "pfadd".into()),
            ("key", "distinct-keys".into()),
            ("member", "{key}".into()),
        ])
        .redis(&[
            ("command", "set".into()),
            ("key", "last:{partition}".into()),
            ("value", "{offset}".into()),
            ("ttl_s", 3600.into()),
        ]);
    let config = PipelineToml::new("ridem", brokers, &[topic], &plugin("identity"))
        .max_records_per_partition(500)
        .sink_url(&redis.url())
        .sink("guarantee", "idempotent")
        .target(records)
        .write(dir.path());
    run_ok(&config);
    run_ok(&config); // caught up: a second run finds nothing to do
    let expected = read_committed(brokers, topic, PARTITIONS);
    let mut conn = redis.conn();
    for p in 0..PARTITIONS {
        let values: BTreeMap<i64, String> = conn.hgetall(format!("values:{p}")).unwrap();
        let want: BTreeMap<i64, String> = expected
            .iter()
            .filter(|s| s.partition == p)
            .map(|s| (s.offset, s.value.clone()))
            .collect();
        assert_eq!(values, want, "partition {p}");
        let last: i64 = conn.get(format!("last:{p}")).unwrap();
        assert_eq!(Some(&last), want.keys().last());
        let ttl: i64 = conn.ttl(format!("last:{p}")).unwrap();
        assert!((1..=3600).contains(&ttl), "ttl {ttl}");
    }
    let distinct: i64 = redis::cmd("PFCOUNT")
        .arg("distinct-keys")
        .query(&mut conn)
        .unwrap();
    let error = (distinct - expected.len() as i64).abs() as f64 / expected.len() as f64;
    assert!(
        error < 0.02,
        "HyperLogLog estimate {distinct} of {}",
        expected.len()
    );
    redis.assert_contiguous_lineage("ridem");
}

/// Configs every sink kind refuses are refused on Redis too, before
/// anything is written.
#[tokio::test(flavor = "multi_thread")]
async fn bad_configs_of_any_sink_are_refused_on_redis_and_write_nothing() {
    let bad = BadConfigs {
        brokers: shared_broker(),
        name: "redis-bad-any",
    };
    bad.run(&RedisServer::start("bad-any")).await;
}

/// Bad configs are refused by `check` (no network) with the reason; a key
/// of another type already in Redis fails the first batch with nothing
/// written.
#[tokio::test(flavor = "multi_thread")]
async fn bad_redis_configs_are_refused_and_write_nothing() {
    // The identity pipeline into Redis with these commands.
    let with = |commands: &[&[(&str, Value)]]| {
        let target = commands
            .iter()
            .fold(Target::records(), |target, command| target.redis(command));
        PipelineToml::new("rbad", "127.0.0.1:1", &["t"], &plugin("identity"))
            .sink_url("redis://127.0.0.1:6379/0")
            .target(target)
    };
    let dir = TempDir::new("redis-bad");
    let check = |text: &str| {
        let path = write_config(dir.path(), text);
        let out = Command::new(sluice_bin())
            .arg("check")
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let cases = [
        (
            with(&[&[("command", "lpush".into()), ("key", "k".into())]]),
            "unknown variant `lpush`",
        ),
        (
            with(&[&[
                ("command", "sadd".into()),
                ("key", "k:{part}".into()),
                ("member", "{key}".into()),
            ]]),
            "names column `part`",
        ),
        (
            with(&[&[
                ("command", "sadd".into()),
                ("key", "".into()),
                ("member", "{key}".into()),
            ]]),
            "must not be empty",
        ),
        (
            with(&[&[("command", "sadd".into()), ("key", "k".into())]]),
            "`sadd` needs `member`",
        ),
        (
            with(&[&[
                ("command", "incrby".into()),
                ("key", "k".into()),
                ("by", "two".into()),
            ]]),
            "is not a number",
        ),
        (
            with(&[&[
                ("command", "hincrby".into()),
                ("key", "k".into()),
                ("field", "{partition}".into()),
            ]])
            .sink("guarantee", "at-least-once"),
            "`hincrby` is not idempotent",
        ),
        (with(&[]), "needs at least one `[[sink.targets.redis]]`"),
        (
            with(&[&[("command", "del".into()), ("key", "k".into())]])
                .targets(|t| t.field("mode", "upsert").field("key", vec!["offset"])),
            "target `records`: `key` is for SQL sinks, not Redis sinks",
        ),
    ];
    for (config, expected) in &cases {
        let (ok, err) = check(&config.to_string());
        assert!(
            !ok && err.contains(expected),
            "expected {expected:?}, got: {err}"
        );
    }
    let good = with(&[&[
        ("command", "sadd".into()),
        ("key", "k:{partition}".into()),
        ("member", "{key}".into()),
    ]])
    .to_string();
    let (ok, err) = check(&good);
    assert!(ok, "{err}");

    // A key already holding another type: the script refuses before writing.
    let brokers = shared_broker();
    let topic = "redis-wrongtype";
    create_topic(brokers, topic, 1);
    produce(brokers, topic, &numbered(topic, 100, 1));
    let redis = RedisServer::start("wrongtype");
    let _: () = redis.conn().set("counts", "not a hash").unwrap();
    let config = write_config(
        dir.path(),
        identity_redis_config("rwrong", brokers, topic, &redis.url(), 100),
    );
    let out = run_until_caught_up(&config, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(
            "key \"counts\" holds a string, but the batch writes it as a hash: nothing was written"
        ),
        "{err}"
    );
    let keys: Vec<String> = redis.conn().keys("*").unwrap();
    let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        ["counts", "sluice_modules", "sluice_versions:rwrong"],
        "something was written"
    );
}

/// Dead letters are kept by count (`sink.dead_letters_keep`): a module that
/// rejects every fifth record leaves the newest `keep` in the list, the
/// oldest trimmed in the commits that added more; the rows of the others
/// all land.
#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_are_trimmed_to_the_newest_kept() {
    let brokers = shared_broker();
    let topic = "redis-dead-keep";
    create_topic(brokers, topic, 2);
    let numbers: Vec<Produce> = (1..=200)
        .map(|n| Produce {
            partition: n % 2,
            key: None,
            value: n.to_string(),
        })
        .collect();
    produce(brokers, topic, &numbers);
    let redis = RedisServer::start("dead-keep");
    let dir = TempDir::new(topic);
    let numbers_target = Target::new("numbers")
        .column("n", "integer")
        .column("partition", "integer")
        .column("offset", "integer")
        .column("timestamp", "integer")
        .redis(&[
            ("command", "hset".into()),
            ("key", "numbers".into()),
            ("field", "{n}".into()),
            ("value", "{offset}".into()),
        ]);
    let config = PipelineToml::new("rdeadkeep", brokers, &[topic], &plugin("picky"))
        .max_records_per_partition(20)
        .module_param("reject_multiples_of", 5)
        .sink_url(&redis.url())
        .sink("dead_letters_keep", 15)
        .target(numbers_target)
        .write(dir.path());
    run_ok(&config);
    let mut conn = redis.conn();
    let landed: BTreeMap<i64, i64> = conn.hgetall("numbers").unwrap();
    assert_eq!(landed.len(), 160, "every number not a multiple of 5");
    let kept: Vec<String> = conn.lrange("sluice_dead_letters:rdeadkeep", 0, -1).unwrap();
    assert_eq!(kept.len(), 15, "{kept:?}");
    // Every dead letter was a multiple of 5; those kept are the newest of
    // each partition (its offsets only grow from commit to commit).
    let all: Vec<(i32, i64)> = read_committed(brokers, topic, 2)
        .into_iter()
        .filter(|s| s.value.parse::<i64>().unwrap() % 5 == 0)
        .map(|s| (s.partition, s.offset))
        .collect();
    for p in 0..2 {
        let mut of_p: Vec<i64> = kept
            .iter()
            .map(|k| serde_json::from_str::<serde_json::Value>(k).unwrap())
            .filter(|v| v["partition"].as_i64() == Some(p as i64))
            .map(|v| v["offset"].as_i64().unwrap())
            .collect();
        of_p.sort();
        let mut newest: Vec<i64> = all.iter().filter(|d| d.0 == p).map(|d| d.1).collect();
        newest.sort();
        let newest = newest.split_off(newest.len() - of_p.len());
        assert_eq!(
            of_p, newest,
            "partition {p}: the newest dead letters are kept"
        );
    }
    // `dead-letters list` and `show` read them back, by record, with the
    // batch's times from its lineage entry and the record's own time.
    let config_arg = config.to_str().unwrap();
    let listed = sluice_tests::control::listed_dead_letters(config_arg);
    assert_eq!(listed.len(), 15, "{listed:?}");
    for d in &listed {
        assert_eq!(d["kind"], "rejected", "{d}");
        assert!(d["committed_at_ms"].as_i64().is_some(), "{d}");
        assert!(d["timestamp"].as_i64().unwrap() > 0, "{d}");
    }
    let record = sluice_tests::control::record_of(&listed[0]);
    let shown = sluice_tests::control::sluice_ok(&["dead-letters", "show", config_arg, &record]);
    assert!(shown.contains(&record), "{shown}");
}

/// `sluice reset` on Redis, through the CLI: a dry run changes nothing; a
/// partition moved back re-runs its records (the stream gets them again,
/// the counter adds them again, as the note says), the old run's lineage
/// entries and dead letters move to `PIPELINE@reset-1`, `verify` passes;
/// a running instance is fenced at its next commit and continues from the
/// new checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn reset_moves_checkpoints_and_archives_lineage_on_redis() {
    use sluice_tests::control::sluice_ok;
    let brokers = shared_broker();
    let topic = "redis-reset";
    create_topic(brokers, topic, 2);
    produce(brokers, topic, &numbered(topic, 200, 2));
    let redis = RedisServer::start("reset");
    let dir = TempDir::new(topic);
    let config = write_config(
        dir.path(),
        identity_redis_config("rreset", brokers, topic, &redis.url(), 30),
    );
    let config_arg = config.to_str().unwrap();
    run_ok(&config);
    let checkpoints =
        || -> BTreeMap<String, i64> { redis.conn().hgetall("sluice_checkpoints:rreset").unwrap() };
    let counts = || -> BTreeMap<String, i64> { redis.conn().hgetall("counts").unwrap() };
    let both = BTreeMap::from([(format!("{topic}:0"), 100), (format!("{topic}:1"), 100)]);
    assert_eq!(checkpoints(), both);

    let dry = sluice_ok(&["reset", config_arg, "--to-earliest", "--dry-run"]);
    assert!(
        dry.contains("would move") && dry.contains("dry run"),
        "{dry}"
    );
    assert!(
        dry.contains(&format!("{topic}[1]: checkpoint 100 -> 0")),
        "{dry}"
    );
    assert_eq!(checkpoints(), both, "a dry run moved checkpoints");

    let moved = sluice_tests::reset::partition_0_back_to_50(&config, topic, "rreset");
    assert!(
        moved.contains("target `records`: re-processed records are appended again"),
        "{moved}"
    );
    let archived: Vec<String> = redis
        .conn()
        .lrange("sluice_lineage:rreset@reset-1", 0, -1)
        .unwrap();
    assert!(!archived.is_empty(), "the old run's lineage is kept");
    for e in &archived {
        let v: serde_json::Value = serde_json::from_str(e).unwrap();
        assert!(
            v["ranges"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["partition"] == 0 && r["until"].as_i64().unwrap() > 50),
            "archived an entry the move does not cover: {v}"
        );
    }
    assert_eq!(
        redis.conn().get::<_, i64>("sluice_resets:rreset").unwrap(),
        1
    );
    run_ok(&config);
    assert_eq!(counts()["0"], 150, "partition 0 offsets 50..100 again");
    assert_eq!(counts()["1"], 100);
    let verified = sluice_ok(&["verify", config_arg]);
    assert!(verified.contains(" 0 differ"), "{verified}");

    // A running instance: fenced at its next commit, continues from 0.
    let landed = async || counts().values().sum::<i64>();
    let moved = sluice_tests::reset::under_a_running_instance(
        &config,
        dir.path(),
        brokers,
        topic,
        460,
        landed,
    )
    .await;
    assert!(moved.contains("`rreset@reset-2`"), "{moved}");
}
