//! The Redis sink against real Redis servers (each test starts its own
//! `redis-server` with an append-only file, `appendfsync always`): exactly
//! once across SIGKILLs, two owners of one partition, Redis itself killed
//! and restarted, a lost script reply, the module lifecycle, the
//! at-least-once (idempotent) mode and bad configs. Results are compared
//! with an independent `read_committed` read of the input.

use rand::SeedableRng;
use redis::Commands;
use sluice_tests::control::{self, Host, Producer, cli_ok, sluice_ok};
use sluice_tests::proxy::FaultProxy;
use sluice_tests::redis_server::{RedisServer, identity_redis_config};
use sluice_tests::*;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_at_random_moments_on_redis_loses_and_duplicates_nothing() {
    let broker = Broker::start();
    let topic = "redis-crash";
    create_topic(&broker.brokers, topic, PARTITIONS);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7ed15);
    let sent = crash::produce_mixed_input(&broker.brokers, topic, PARTITIONS, &mut rng);
    assert!(
        sent >= 100_000,
        "the test needs 100k committed records, sent {sent}"
    );
    let redis = RedisServer::start("crash");
    let dir = TempDir::new("redis-crash");
    let config = write_config(
        dir.path(),
        &identity_redis_config("rcrash", &broker.brokers, topic, &redis.url(), 100, ""),
    );
    let (kills, batches) = crash::kill_loop(
        &config,
        async || redis.committed_batches("rcrash"),
        24,
        &mut rng,
    )
    .await;
    assert!(
        kills >= 20,
        "only {kills} kills before the pipeline finished"
    );
    run_ok(&config);
    let expected = read_committed(&broker.brokers, topic, PARTITIONS);
    let n = redis.assert_identity_exactly_once("rcrash", &expected);
    println!(
        "{kills} SIGKILLs ({batches} batches between them); {n} records exactly once in Redis"
    );
}

/// Two processes statically assigned the same partitions race for every
/// range; the script's compare-and-set lets one commit each.
#[tokio::test(flavor = "multi_thread")]
async fn two_owners_of_one_partition_commit_each_range_once() {
    let brokers = shared_broker();
    let topic = "redis-fence";
    create_topic(brokers, topic, 2);
    produce(brokers, topic, &numbered(topic, 30_000, 2));
    let redis = RedisServer::start("fence");
    let dir = TempDir::new("redis-fence");
    let assign = format!("assign = {{ \"{topic}\" = [0, 1] }}");
    let config = write_config(
        dir.path(),
        &identity_redis_config("rfence", brokers, topic, &redis.url(), 50, &assign),
    );
    let spawn = || {
        Command::new(sluice_bin())
            .args(["run", "--until-caught-up"])
            .arg(&config)
            .env("SLUICE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice")
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&a.stderr),
        String::from_utf8_lossy(&b.stderr)
    );
    assert!(a.status.success() && b.status.success(), "{logs}");
    let fenced = logs
        .matches("fenced: another owner moved the offsets first")
        .count();
    assert!(fenced > 0, "the two owners never raced: {logs}");
    let n = redis.assert_identity_exactly_once("rfence", &read_committed(brokers, topic, 2));
    println!("{fenced} commits fenced; {n} records exactly once");
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
        &identity_redis_config(
            "rcap",
            brokers,
            topic,
            &redis.url(),
            1000,
            "max_records_per_batch = 300",
        ),
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
        &identity_redis_config("rrestart", brokers, topic, &redis.url(), 100, ""),
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
    let text = identity_redis_config("rfrozen", brokers, topic, &redis.url(), 100, "")
        .replace("lock_timeout_ms = 3000", "lock_timeout_ms = 500");
    let config = write_config(dir.path(), &text);
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
        &identity_redis_config("rlost", brokers, topic, &via, 200, ""),
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
    let brokers = shared_broker();
    let topic = "redis-lifecycle";
    create_topic(brokers, topic, 2);
    let redis = RedisServer::start("lifecycle");
    let dir = TempDir::new("redis-lifecycle");
    let (port, url) = control::control_port();
    let config = write_config(
        dir.path(),
        &format!(
            "{}\n{}",
            identity_redis_config("rlife", brokers, topic, &redis.url(), 200, ""),
            control::control_toml(port, 1 << 25)
        ),
    );
    let host = Host::start(&config, &dir.path().join("host.log"));
    host.wait_for_api(port);
    let producer = Producer::start(brokers, topic, 2);
    let stamp = plugin("stamp").display().to_string();
    while redis.committed_batches("rlife") < 3 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = cli_ok(
        &url,
        &[
            "deploy",
            &stamp,
            "--params",
            r#"{"tag":"v2:"}"#,
            "--activate",
        ],
    );
    assert!(out.contains("activated version 2"), "{out}");
    let wait_for_stamped = async || {
        let started = Instant::now();
        loop {
            let mut conn = redis.conn();
            let last: Vec<(String, BTreeMap<String, String>)> = redis::cmd("XREVRANGE")
                .arg("rec:0")
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query(&mut conn)
                .unwrap();
            if last
                .first()
                .is_some_and(|(_, f)| f["value"].starts_with("v2:"))
            {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the swap never showed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    wait_for_stamped().await;
    let out = cli_ok(&url, &["rollback"]);
    assert!(out.contains("activated version 3"), "{out}");
    let versions = cli_ok(&url, &["versions"]);
    assert!(versions.contains("(active)"), "{versions}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let produced = producer.stop();
    let started = Instant::now();
    loop {
        let counts: BTreeMap<String, i64> = redis.conn().hgetall("counts").unwrap();
        if counts.values().sum::<i64>() as usize >= produced {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "pipeline fell behind"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    host.stop();
    // Every record once, written by the version its batch ran.
    let expected = read_committed(brokers, topic, 2);
    assert_eq!(expected.len(), produced);
    let mut conn = redis.conn();
    let mut stamped = 0;
    for p in 0..2 {
        let entries: Vec<(String, BTreeMap<String, String>)> = redis::cmd("XRANGE")
            .arg(format!("rec:{p}"))
            .arg("-")
            .arg("+")
            .query(&mut conn)
            .unwrap();
        let want: Vec<&Seen> = expected.iter().filter(|s| s.partition == p).collect();
        assert_eq!(entries.len(), want.len(), "partition {p}");
        for ((_, f), w) in entries.iter().zip(&want) {
            assert_eq!(f["offset"], w.offset.to_string());
            let value = f["value"].strip_prefix("v2:").unwrap_or(&f["value"]);
            stamped += f["value"].starts_with("v2:") as usize;
            assert_eq!(value, w.value);
        }
    }
    assert!(stamped > 0);
    redis.assert_contiguous_lineage("rlife");
    let verified = sluice_ok(&["verify", config.to_str().unwrap()]);
    assert!(verified.contains(" 0 differ"), "{verified}");
    println!("{produced} records, {stamped} by the swapped-in version; {verified}");
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
    let config = write_config(
        dir.path(),
        &format!(
            r#"
pipeline = "ridem"
[source]
brokers = "{brokers}"
topics = ["{topic}"]
max_records_per_partition = 500
[module]
path = "{module}"
[sink]
url = "{url}"
guarantee = "idempotent"
[[sink.targets]]
name = "records"
columns = {{ partition = "integer", offset = "integer", key = "blob", value = "blob" }}
[[sink.targets.redis]]
command = "hset"
key = "values:{{partition}}"
field = "{{offset}}"
value = "{{value}}"
[[sink.targets.redis]]
command = "pfadd"
key = "distinct-keys"
member = "{{key}}"
[[sink.targets.redis]]
command = "set"
key = "last:{{partition}}"
value = "{{offset}}"
ttl_s = 3600
"#,
            module = plugin("identity").display(),
            url = redis.url()
        ),
    );
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

/// Bad configs are refused by `check` (no network) with the reason; a key
/// of another type already in Redis fails the first batch with nothing
/// written.
#[tokio::test(flavor = "multi_thread")]
async fn bad_redis_configs_are_refused_and_write_nothing() {
    let base = |commands: &str, extra: &str| {
        format!(
            r#"
pipeline = "rbad"
[source]
brokers = "127.0.0.1:1"
topics = ["t"]
[module]
path = "{module}"
[sink]
url = "redis://127.0.0.1:6379/0"
{extra}
[[sink.targets]]
name = "records"
columns = {{ partition = "integer", offset = "integer", key = "blob", value = "blob" }}
{commands}
"#,
            module = plugin("identity").display()
        )
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
            base(
                "[[sink.targets.redis]]\ncommand = \"lpush\"\nkey = \"k\"\n",
                "",
            ),
            "unknown variant `lpush`",
        ),
        (
            base(
                "[[sink.targets.redis]]\ncommand = \"sadd\"\nkey = \"k:{part}\"\nmember = \"{key}\"\n",
                "",
            ),
            "names column `part`",
        ),
        (
            base(
                "[[sink.targets.redis]]\ncommand = \"sadd\"\nkey = \"\"\nmember = \"{key}\"\n",
                "",
            ),
            "must not be empty",
        ),
        (
            base(
                "[[sink.targets.redis]]\ncommand = \"sadd\"\nkey = \"k\"\n",
                "",
            ),
            "`sadd` needs `member`",
        ),
        (
            base(
                "[[sink.targets.redis]]\ncommand = \"incrby\"\nkey = \"k\"\nby = \"two\"\n",
                "",
            ),
            "is not a number",
        ),
        (
            base(
                "[[sink.targets.redis]]\ncommand = \"hincrby\"\nkey = \"k\"\nfield = \"{partition}\"\n",
                "guarantee = \"at-least-once\"",
            ),
            "`hincrby` is not idempotent",
        ),
        (base("", ""), "needs at least one `[[sink.targets.redis]]`"),
        (
            base(
                "mode = \"upsert\"\nkey = [\"offset\"]\n[[sink.targets.redis]]\ncommand = \"del\"\nkey = \"k\"\n",
                "",
            ),
            "target `records`: `key` is for SQL sinks, not Redis sinks",
        ),
    ];
    for (config, expected) in &cases {
        let (ok, err) = check(config);
        assert!(
            !ok && err.contains(expected),
            "expected {expected:?}, got: {err}"
        );
    }
    let good = base(
        "[[sink.targets.redis]]\ncommand = \"sadd\"\nkey = \"k:{partition}\"\nmember = \"{key}\"\n",
        "",
    );
    let (ok, err) = check(&good);
    assert!(ok, "{err}");
    // `reset` moves SQL checkpoints only, and says so before connecting.
    let out = Command::new(sluice_bin())
        .args(["reset", "--to-earliest"])
        .arg(write_config(dir.path(), &good))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("moves checkpoints of SQL sinks only"),
        "{err}"
    );

    // A key already holding another type: the script refuses before writing.
    let brokers = shared_broker();
    let topic = "redis-wrongtype";
    create_topic(brokers, topic, 1);
    produce(brokers, topic, &numbered(topic, 100, 1));
    let redis = RedisServer::start("wrongtype");
    let _: () = redis.conn().set("counts", "not a hash").unwrap();
    let config = write_config(
        dir.path(),
        &identity_redis_config("rwrong", brokers, topic, &redis.url(), 100, ""),
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
