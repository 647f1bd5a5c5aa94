//! Keyed state through the CLI, against real databases and a real broker:
//! a stateful module (`tally`: a running count per key and partition)
//! SIGKILLed at random moments (SQL, Redis, stdout), two owners fencing
//! each other, a poison record, an oversized value and one key too many in
//! stateful batches, a frozen zombie with a warm cache, state kept in
//! `[state]` by the sinks without state of their own, `sluice state`, and
//! the exactly-once Kafka sink's changelog (SIGKILLs, two owners fencing
//! each other, a missing changelog topic). Rows and the final state are checked
//! against a recomputation from an independent `read_committed` read;
//! `verify` must replay every stateful batch alike.
//!
//! Each test owns its topic, database (schema) and pipeline.

use sluice_tests::control::{assert_verified, sluice_ok};
use sluice_tests::sinks::SinkDb;
use sluice_tests::tally::{self, Expected};
use sluice_tests::*;
use tokio::sync::Mutex;

const PARTITIONS: i32 = 4;

/// One test per database server at a time.
static POSTGRES: Mutex<()> = Mutex::const_new(());
static MYSQL: Mutex<()> = Mutex::const_new(());

/// Mixed input with repeating keys: plain records and transactions, one in
/// four aborted; at least 100k committed.
fn produce_keyed_input(brokers: &str, topic: &str, rng: &mut impl rand::Rng) -> usize {
    let mut sent = 0;
    for round in 0..20 {
        let plain = tally::keyed(numbered(&format!("plain{round}"), 4_500, PARTITIONS));
        produce(brokers, topic, &plain);
        sent += plain.len();
        let size = rng.gen_range(200..1_500);
        let txn = tally::keyed(numbered(&format!("txn{round}"), size, PARTITIONS));
        let commit = round % 4 != 3;
        produce_transaction(brokers, topic, &format!("{topic}-{round}"), &txn, commit);
        if commit {
            sent += txn.len();
        }
    }
    sent
}

/// Every key `sluice state scan --json` shows of `partition` (`topic:p`),
/// one JSON object each.
fn scan_state(config: &std::path::Path, partition: &str) -> Vec<serde_json::Value> {
    let path = config.to_str().unwrap();
    let args = [
        "state",
        "scan",
        path,
        "--partition",
        partition,
        "--limit",
        "0",
        "--json",
    ];
    sluice_ok(&args)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A stateful pipeline after the kill loop, and what an independent
/// `read_committed` read of its input says it must have left.
struct Killed {
    broker: Broker,
    _dir: TempDir,
    config: std::path::PathBuf,
    kills: usize,
    expected: Expected,
}

impl Killed {
    /// `verify` replays every batch alike; prints what the run proved.
    fn verified(&self, name: &str) {
        let batches = assert_verified(&self.config);
        println!(
            "{name}: {} SIGKILLs; {} records counted exactly once into {} keys; {batches} batches verified",
            self.kills,
            self.expected.rows.len(),
            self.expected.state.len()
        );
    }
}

/// The kill loop with a stateful module (`tally` as `configure` points it
/// at its sink): over at least 100k keyed records with aborted
/// transactions, ≥ 20 SIGKILLs 0-60 ms after a batch lands (`committed`
/// counts them), then a final run.
async fn kill_stateful(
    name: &str,
    seed: u64,
    configure: impl FnOnce(PipelineToml) -> PipelineToml,
    committed: impl AsyncFn() -> i64,
) -> Killed {
    use rand::SeedableRng;
    let broker = Broker::start();
    let brokers = broker.brokers.as_str();
    create_topic(brokers, name, PARTITIONS);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sent = produce_keyed_input(brokers, name, &mut rng);
    assert!(sent >= 100_000, "sent {sent}");
    let dir = TempDir::new(name);
    let config = configure(tally::config(name, brokers, 100)).write(dir.path());
    let (kills, _) = crash::kill_loop(&config, committed, 22, &mut rng).await;
    assert!(kills >= scenarios::MIN_KILLS, "only {kills} kills");
    run_ok(&config);
    let input = read_committed(brokers, name, PARTITIONS);
    Killed {
        expected: Expected::of(&input, &[]),
        broker,
        _dir: dir,
        config,
        kills,
    }
}

/// The kill loop on a SQL sink: every count right, the final state right,
/// and `verify` replays every batch.
async fn state_survives_sigkills(db: SinkDb, name: &str) {
    let run = kill_stateful(
        name,
        0x5747e,
        |c| db.configure(c),
        async || db.committed_batches().await,
    )
    .await;
    tally::assert_stored(&db, name, &run.expected).await;
    db.assert_contiguous_lineage(name).await;
    run.verified(name);
}

/// The kill loop on Redis: state hashes written by the commit script.
#[tokio::test(flavor = "multi_thread")]
async fn redis_state_survives_sigkill_cycles_exactly_once() {
    let name = "state_redis_crash";
    let server = redis_server::RedisServer::start(name);
    let run = kill_stateful(
        name,
        0x5e715,
        |c| tally::redis_config(c, &server.url()),
        async || server.committed_batches(name),
    )
    .await;
    let actual = tally::stored_redis(&server, name, PARTITIONS);
    tally::assert_same(name, &actual, &run.expected);
    server.assert_contiguous_lineage(name);
    let batches = assert_verified(&run.config);
    println!(
        "{name}: {} SIGKILLs; {} records counted exactly once; {batches} batches verified",
        run.kills,
        run.expected.rows.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_state_survives_sigkill_cycles_exactly_once() {
    let dir = TempDir::new("state-sqlite-crash");
    let db = SinkDb::Sqlite(dir.path().join("crash.db"));
    state_survives_sigkills(db, "state_sqlite_crash").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_state_survives_sigkill_cycles_exactly_once() {
    let _only = POSTGRES.lock().await;
    let name = "state_pg_crash";
    state_survives_sigkills(SinkDb::fresh_postgres(name).await, name).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_state_survives_sigkill_cycles_exactly_once() {
    let _only = MYSQL.lock().await;
    let name = "state_my_crash";
    state_survives_sigkills(SinkDb::fresh_mysql(name).await, name).await;
}

/// The kill loop with expiring state (tally's dedupe mode, each key
/// expiring 1 ms of record time after its record, so every record reads
/// its key as absent and passes with n = 1) on SQLite: every record's row
/// exactly once, against the `read_committed` input; every key still
/// stored is one of its partition's keys, with its value, and the key of
/// each partition's last record (written by the partition's last batch,
/// which no later batch swept) is stored; the batches that removed expired
/// keys replay alike in `verify`.
#[tokio::test(flavor = "multi_thread")]
async fn expiring_state_survives_sigkill_cycles_exactly_once() {
    let dir = TempDir::new("state-expiry-crash");
    let db = SinkDb::Sqlite(dir.path().join("crash.db"));
    let name = "state_expiry_crash";
    let run = kill_stateful(
        name,
        0xe4b1,
        |c| db.configure(c).module_param("dedupe_ttl_ms", 1),
        async || db.committed_batches().await,
    )
    .await;
    let input = read_committed(&run.broker.brokers, name, PARTITIONS);
    let stored = tally::stored(&db, name).await;
    let rows: Vec<tally::Tally> = input
        .iter()
        .map(|r| {
            let key = r.key.clone().unwrap_or_default().into_bytes();
            (r.partition as i64, r.offset, key, 1)
        })
        .collect();
    assert_eq!(stored.rows.len(), rows.len(), "{name}: row count");
    assert!(stored.rows == rows, "{name}: rows differ from the input");
    for ((partition, key), n) in &stored.state {
        assert_eq!(*n, 1, "{name}: {partition} {key:?}");
        assert!(
            run.expected.state.contains_key(&(*partition, key.clone())),
            "{name}: {partition} {key:?} was never written"
        );
    }
    for p in 0..PARTITIONS as i64 {
        let last = input
            .iter()
            .rfind(|r| r.partition as i64 == p)
            .expect("input");
        let key = last.key.clone().unwrap_or_default().into_bytes();
        assert!(
            stored.state.contains_key(&(p, key)),
            "{name}: last key of {p}"
        );
    }
    db.assert_contiguous_lineage(name).await;
    run.verified(name);
    println!(
        "{name}: {} of {} keys still stored",
        stored.state.len(),
        run.expected.state.len()
    );
}

/// The kill loop on a sink that keeps its state in `[state]` (a SQLite
/// file here), with the offsets: the counts kept there equal the
/// recomputation after 20-odd SIGKILLs, and `verify` replays every batch
/// from the lineage kept there. `sink` points the config at the sink.
async fn state_in_the_store_survives_sigkills(
    name: &str,
    seed: u64,
    sink: impl FnOnce(PipelineToml) -> PipelineToml,
) -> Killed {
    let dir = TempDir::new(&format!("{name}-store"));
    let state = SinkDb::Sqlite(dir.path().join("state.db"));
    let run = kill_stateful(
        name,
        seed,
        |c| sink(c).field("state", "url", state.url()),
        async || state.committed_batches().await,
    )
    .await;
    assert_eq!(tally::stored_state(&state, name).await, run.expected.state);
    state.assert_contiguous_lineage(name).await;
    let batches = assert_verified(&run.config);
    println!(
        "{name}: {} SIGKILLs; {} keys' counts exact in [state]; {batches} batches verified",
        run.kills,
        run.expected.state.len()
    );
    run
}

/// The stdout sink: rows are printed at least once, the state exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn stdout_state_survives_sigkill_cycles_exactly_once() {
    state_in_the_store_survives_sigkills("state_stdout_crash", 0x57d0, |c| c.sink_url("stdout://"))
        .await;
}

/// The Kafka sink at least once: records are sent, then the offsets and
/// the state commit in `[state]`. A batch sent again after a kill was run
/// again from the same state, so it sends the same rows: the output topic
/// holds exactly the recomputed rows, some more than once, none with
/// another count.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_at_least_once_state_survives_sigkill_cycles_exactly_once() {
    let name = "state_kafka_alo_crash";
    let out = format!("{name}-out");
    let mut brokers = String::new();
    let run = state_in_the_store_survives_sigkills(name, 0x4a10, |c| {
        brokers = c.get("source", "brokers").expect("brokers").to_string();
        create_topic(&brokers, &out, PARTITIONS);
        create_topic(&brokers, &format!("{name}.dead-letters"), 1);
        c.sink_url(&format!("kafka://{brokers}"))
            .sink("guarantee", "at-least-once")
            .targets(|t| t.kafka_topic(&out))
    })
    .await;
    let sent = read_consumed(&brokers, &out, PARTITIONS);
    let rows: std::collections::BTreeSet<(i64, i64, i64)> = sent.iter().map(tally_row).collect();
    let expected: std::collections::BTreeSet<(i64, i64, i64)> = run
        .expected
        .rows
        .iter()
        .map(|(p, o, _, n)| (*p, *o, *n))
        .collect();
    assert_eq!(
        rows, expected,
        "every row sent, each with its recomputed count"
    );
    println!(
        "{name}: {} rows sent for {} records",
        sent.len(),
        expected.len()
    );
}

/// Two processes statically assigned the same partitions race for every
/// range: the loser of each race is a zombie whose state writes must not
/// land, and whose cache must not feed its next batch stale counts.
async fn fenced_owner_writes_no_state(db: SinkDb, name: &str) {
    let dir = TempDir::new(name);
    let (config, fenced) = two_owners(name, 30_000, &dir, |c| db.configure(c));
    let input = read_committed(shared_broker(), name, PARTITIONS);
    tally::assert_stored(&db, name, &Expected::of(&input, &[])).await;
    let batches = assert_verified(&config);
    println!("{name}: {fenced} fenced commits rolled back; {batches} batches verified");
}

/// Two processes of the tally pipeline `name` (as `configure` points it at
/// its sink, in `dir`), statically assigned the same partitions, racing
/// over `records` keyed records to the end; its config and how many of
/// their commits were fenced (at least one: they collided).
fn two_owners(
    name: &str,
    records: usize,
    dir: &TempDir,
    configure: impl FnOnce(PipelineToml) -> PipelineToml,
) -> (std::path::PathBuf, u64) {
    let brokers = shared_broker();
    create_topic(brokers, name, PARTITIONS);
    produce(
        brokers,
        name,
        &tally::keyed(numbered(name, records, PARTITIONS)),
    );
    let all: Vec<i32> = (0..PARTITIONS).collect();
    let config = configure(
        tally::config(name, brokers, 100)
            .batch_interval_ms(20)
            .assign(name, &all),
    )
    .write(dir.path());
    let fenced = race_two_owners(&config);
    assert!(fenced > 0, "the two owners never collided");
    (config, fenced)
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_fenced_owner_writes_no_state() {
    let dir = TempDir::new("state-sqlite-fence");
    let db = SinkDb::Sqlite(dir.path().join("fence.db"));
    fenced_owner_writes_no_state(db, "state_sqlite_fence").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_fenced_owner_writes_no_state() {
    let _only = POSTGRES.lock().await;
    let name = "state_pg_fence";
    fenced_owner_writes_no_state(SinkDb::fresh_postgres(name).await, name).await;
}

/// A zombie with a warm cache: instance A is frozen (SIGSTOP) just after a
/// commit, with its next batch transformed from its cached state, past its
/// session timeout; B takes its partitions over and commits on from the
/// stored state. A is thawed while input keeps coming: what it had in
/// flight lands only where the checkpoint is still the one it planned from
/// (the offset compare-and-set: then its cache was the stored state), else
/// is fenced, rolled back and its cache dropped; B's commits are fenced the
/// same way where A's landed first. The two finish the input themselves.
/// Every count and the final state equal a recomputation from the
/// `read_committed` input, and `verify` replays every batch.
#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_zombie_with_cached_state_never_lands_stale_counts() {
    use sluice_tests::control::Host;
    use std::time::Duration;
    let _only = POSTGRES.lock().await;
    let name = "state_pg_zombie";
    let brokers = shared_broker();
    create_topic(brokers, name, PARTITIONS);
    produce(
        brokers,
        name,
        &tally::keyed(numbered("backlog", 20_000, PARTITIONS)),
    );
    let db = SinkDb::fresh_postgres(name).await;
    let dir = TempDir::new(name);
    let config = db
        .configure(tally::config(name, brokers, 500))
        .write(dir.path());
    let producing = Producing::start(name, Duration::from_millis(40), |sent| {
        tally::keyed(numbered(&format!("live{sent}"), 200, PARTITIONS))
    });
    let a = Host::start(&config, &dir.path().join("a.log"));
    a.wait_for_log("batch committed", 3, Duration::from_secs(90));
    let committed = a.log().matches("batch committed").count();
    a.wait_for_log("batch committed", committed + 1, Duration::from_secs(30));
    a.signal(libc::SIGSTOP);
    let frozen_batches = db.committed_batches().await;
    // Past the 6 s session timeout: the group drops A, B takes everything.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let b = Host::start(&config, &dir.path().join("b.log"));
    b.wait_for_log("batch committed", 3, Duration::from_secs(90));
    assert!(db.committed_batches().await > frozen_batches);
    a.signal(libc::SIGCONT);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let sent = 20_000 + producing.finish() as i64;
    // The two instances finish the input themselves.
    let logs = || format!("A:\n{}\nB:\n{}", a.log(), b.log());
    db.wait_for_committed_total(name, sent, Duration::from_secs(180), logs)
        .await;
    a.stop();
    b.stop();
    let input = read_committed(brokers, name, PARTITIONS);
    assert_eq!(input.len() as i64, sent);
    tally::assert_stored(&db, name, &Expected::of(&input, &[])).await;
    db.assert_contiguous_lineage(name).await;
    let batches = assert_verified(&config);
    println!(
        "{name}: {} records counted exactly once through a zombie; {batches} batches verified",
        input.len()
    );
}

/// Records of a few keys in one partition, some with value `value`.
fn few_keys_with(name: &str, records: usize, every: usize, value: &str) -> Vec<Produce> {
    (0..records)
        .map(|i| Produce {
            partition: 0,
            key: Some(format!("k{}", i % 5)),
            value: match i % every == every - 1 {
                true => value.to_string(),
                false => format!("{name} {i}"),
            },
        })
        .collect()
}

/// A record that traps after writing state is a dead letter, and the batch
/// commits as if it never came: the other records' counts skip it, in
/// every batch it was bisected out of; `verify` replays those batches.
#[tokio::test(flavor = "multi_thread")]
async fn a_poison_record_has_no_effect_on_state() {
    let name = "state_poison";
    let brokers = shared_broker();
    create_topic(brokers, name, 1);
    produce(brokers, name, &few_keys_with(name, 400, 37, "poison"));
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("poison.db"));
    let config = db
        .configure(tally::config(name, brokers, 100).module_param("poison", "poison"))
        .write(dir.path());
    run_ok(&config);
    let input = read_committed(brokers, name, 1);
    let poison = input.iter().filter(|r| r.value == "poison").count();
    assert_eq!(poison, 10);
    assert_eq!(db.dead_letters().await, poison as i64);
    tally::assert_stored(&db, name, &Expected::of(&input, &["poison"])).await;
    assert_verified(&config);
}

/// A value over `limits.max_state_value_kib` is refused: the record that
/// wrote it is a `contract` dead letter naming the limit, the rest commit.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_value_over_the_limit_is_a_dead_letter() {
    let name = "state_too_big";
    let brokers = shared_broker();
    create_topic(brokers, name, 1);
    produce(brokers, name, &few_keys_with(name, 50, 10, "big"));
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("big.db"));
    let config = db
        .configure(
            tally::config(name, brokers, 100)
                .module_param("big", 2048)
                .field("limits", "max_state_value_kib", 1),
        )
        .write(dir.path());
    run_ok(&config);
    let input = read_committed(brokers, name, 1);
    tally::assert_stored(&db, name, &Expected::of(&input, &["big"])).await;
    let pool = db.pool().await;
    let reasons: Vec<(String, String)> =
        sqlx::query_as("SELECT kind, reason FROM sluice_dead_letters")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(reasons.len(), 5, "{reasons:?}");
    for (kind, reason) in &reasons {
        assert_eq!(kind, "contract");
        assert!(
            reason.contains("2048 bytes") && reason.contains("limits.max_state_value_kib"),
            "{reason}"
        );
    }
}

/// A partition's keyed state is bounded by `limits.max_state_partition_mib`:
/// the batch that would take it past the limit is not committed and the
/// pipeline stops, naming the partition and the limit; the state kept is
/// within it; raising the limit and starting again finishes the input with
/// every row once. 40 records each keep 100 KB under a key of their own
/// (4 MB) against a limit of 2 MiB and a cache of 1 MiB, so the partition
/// is measured both held whole and, once it outgrows the cache, in the
/// sink. On SQLite, Postgres, MariaDB and Redis.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_over_its_state_limit_stops_the_pipeline_and_loses_nothing() {
    let name = "state_full";
    let brokers = shared_broker();
    create_topic(brokers, name, 1);
    let records: Vec<Produce> = (0..40)
        .map(|i| Produce {
            partition: 0,
            key: Some(format!("k{i:02}")),
            value: "big".into(),
        })
        .collect();
    produce(brokers, name, &records);
    let dir = TempDir::new(name);
    let server = redis_server::RedisServer::start(name);
    let limited = |mib: i64| {
        tally::config(name, brokers, 5)
            .module_param("big", 100_000)
            .field("limits", "state_cache_mib", 1)
            .field("limits", "max_state_partition_mib", mib)
    };
    let db = SinkDb::Sqlite(dir.path().join("full.db"));
    let (postgres, mysql) = (
        SinkDb::fresh_postgres(name).await,
        SinkDb::fresh_mysql(name).await,
    );
    let configs = [
        (
            dir.path().join("sqlite"),
            db.configure(limited(2)),
            db.configure(limited(8)),
        ),
        (
            dir.path().join("postgres"),
            postgres.configure(limited(2)),
            postgres.configure(limited(8)),
        ),
        (
            dir.path().join("mysql"),
            mysql.configure(limited(2)),
            mysql.configure(limited(8)),
        ),
        (
            dir.path().join("redis"),
            tally::redis_config(limited(2), &server.url()),
            tally::redis_config(limited(8), &server.url()),
        ),
    ];
    let partition = format!("{name}:0");
    // Each key's bytes and its value's, as `sluice state scan` shows them.
    let kept = |config: &std::path::Path| -> Vec<usize> {
        scan_state(config, &partition)
            .iter()
            .map(|line| line["key"].as_str().unwrap().len() + line["value"].as_str().unwrap().len())
            .collect()
    };
    for (sub, tight, roomy) in configs {
        std::fs::create_dir_all(&sub).unwrap();
        let config = tight.write(&sub);
        let out = run_until_caught_up(&config, std::time::Duration::from_secs(300));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{config:?} ran past its limit: {stderr}"
        );
        assert!(
            stderr.contains(&format!("{name}[0]"))
                && stderr.contains("limits.max_state_partition_mib"),
            "{stderr}"
        );
        let sizes = kept(&config);
        let bytes: usize = sizes.iter().sum();
        assert!(
            !sizes.is_empty() && bytes <= 2 << 20,
            "{config:?}: {bytes} bytes kept"
        );
        let config = roomy.write(&sub);
        run_ok(&config);
        let sizes = kept(&config);
        assert_eq!(sizes, vec![3 + 100_000; 40], "{config:?}");
    }
    for db in [&db, &postgres, &mysql] {
        let (tallies, offset) = (db.table("tallies"), db.ident("offset"));
        let rows = db.scalar(&format!("SELECT COUNT(*) FROM {tallies}")).await;
        let offsets = db
            .scalar(&format!("SELECT COUNT(DISTINCT {offset}) FROM {tallies}"))
            .await;
        assert_eq!((rows, offsets), (Some(40), Some(40)), "{}", db.url());
    }
}

/// A batch may write at most `limits.max_state_keys_per_batch` distinct
/// keys: the record whose write is one key more is a `contract` dead letter
/// naming the limit, and the batch commits as if it never came (a key
/// written again is free). Every 10th record brings a new key; with a limit
/// of 4 keys and three repeating ones, a batch takes the first new key and
/// dead-letters every new one after it.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_writing_too_many_keys_dead_letters_the_record_over() {
    let name = "state_many_keys";
    let brokers = shared_broker();
    create_topic(brokers, name, 1);
    let records: Vec<Produce> = (0..50)
        .map(|i| Produce {
            partition: 0,
            key: Some(match i % 10 == 9 {
                true => format!("u{i}"),
                false => format!("k{}", i % 3),
            }),
            value: format!("{name} {i}"),
        })
        .collect();
    produce(brokers, name, &records);
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("keys.db"));
    let config = db
        .configure(tally::config(name, brokers, 100).field("limits", "max_state_keys_per_batch", 4))
        .write(dir.path());
    run_ok(&config);
    let pool = db.pool().await;
    let dead: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT \"offset\", kind, reason FROM sluice_dead_letters")
            .fetch_all(&pool)
            .await
            .unwrap();
    // However the 50 records were cut into batches, each batch of them
    // holds at most the three repeating keys and one new one.
    assert!(!dead.is_empty() && dead.len() <= 4, "{dead:?}");
    for (offset, kind, reason) in &dead {
        assert!(offset % 10 == 9 && *offset > 9, "{offset} holds no new key");
        assert_eq!(kind, "contract");
        assert!(
            reason.contains("4 keys per batch") && reason.contains("max_state_keys_per_batch"),
            "{reason}"
        );
    }
    let input: Vec<Seen> = read_committed(brokers, name, 1)
        .into_iter()
        .filter(|r| !dead.iter().any(|(offset, ..)| *offset == r.offset))
        .collect();
    tally::assert_stored(&db, name, &Expected::of(&input, &[])).await;
    assert_verified(&config);
}

/// The stdout sink and an at-least-once Kafka sink commit a stateful
/// module's state in `[state]`, with the offsets: a run counts every key
/// right, a second run resumes from that state (adding nothing), `verify`
/// replays the batches, and `sluice state` reads it there.
#[tokio::test(flavor = "multi_thread")]
async fn sinks_without_state_of_their_own_keep_it_in_the_state_store() {
    let brokers = shared_broker();
    for (name, sink) in [
        ("state_on_stdout", "stdout"),
        ("state_on_kafka_alo", "kafka"),
    ] {
        create_topic(brokers, name, 2);
        let mut records = few_keys_with(name, 300, 1000, "-");
        records.extend(
            few_keys_with(name, 120, 1000, "-")
                .into_iter()
                .map(|r| Produce { partition: 1, ..r }),
        );
        produce(brokers, name, &records);
        let dir = TempDir::new(name);
        let state_db = dir.path().join("state.db");
        let mut config = tally::config(name, brokers, 50).field(
            "state",
            "url",
            format!("sqlite://{}", state_db.display()),
        );
        if sink == "kafka" {
            let out = format!("{name}-out");
            create_topic(brokers, &out, 2);
            create_topic(brokers, &format!("{name}.dead-letters"), 1);
            config = config
                .sink_url(&format!("kafka://{brokers}"))
                .sink("guarantee", "at-least-once")
                .targets(|t| t.kafka_topic(&out));
        } else {
            config = config.sink_url("stdout://");
        }
        let config = config.write(dir.path());
        let first = run_until_caught_up(&config, std::time::Duration::from_secs(120));
        assert!(
            first.status.success(),
            "{}",
            String::from_utf8_lossy(&first.stderr)
        );
        run_ok(&config);
        let input = read_committed(brokers, name, 2);
        let expected = Expected::of(&input, &[]);
        let state = tally::stored_state(&SinkDb::Sqlite(state_db.clone()), name).await;
        assert_eq!(state, expected.state, "{sink}: state in [state]");
        if sink == "stdout" {
            // No fault: each row printed once, with the count the input implies.
            let printed: Vec<(i64, i64, i64)> = String::from_utf8_lossy(&first.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|l| l["target"] == "tallies")
                .map(|l| {
                    let row = &l["row"];
                    let n = |c: &str| row[c].as_i64().unwrap();
                    (n("partition"), n("offset"), n("n"))
                })
                .collect();
            let mut printed = printed;
            printed.sort();
            let want: Vec<(i64, i64, i64)> = expected
                .rows
                .iter()
                .map(|(p, o, _, n)| (*p, *o, *n))
                .collect();
            assert_eq!(printed, want, "stdout rows");
        }
        assert_verified(&config);
        let k0 = expected.state[&(1, b"k0".to_vec())];
        let partition = format!("{name}:1");
        let got = sluice_ok(&[
            "state",
            "get",
            config.to_str().unwrap(),
            "--partition",
            &partition,
            "--key",
            "k0",
        ]);
        assert_eq!(
            got.trim(),
            format!("{partition} \"k0\" = \"{k0}\""),
            "{sink}"
        );
    }
}

/// `config` (a tally pipeline's) into an exactly-once Kafka sink on the
/// brokers it reads: its rows to `{pipeline}-out`, its state to the
/// changelog `{pipeline}.state`, topics created here.
fn kafka_once(config: PipelineToml, pipeline: &str) -> PipelineToml {
    let brokers = config
        .get("source", "brokers")
        .expect("brokers")
        .to_string();
    let out = format!("{pipeline}-out");
    sluice_tests::kafka_out::create_sink_topics(&brokers, pipeline, &out);
    create_topic(&brokers, &format!("{pipeline}.state"), PARTITIONS);
    config
        .sink_url(&format!("kafka://{brokers}"))
        .targets(|t| t.kafka_topic(&out))
}

/// A tally row a Kafka sink wrote (the row as JSON): (partition, offset, n).
fn tally_row(record: &Consumed) -> (i64, i64, i64) {
    let row: serde_json::Value = serde_json::from_str(&record.value).expect("a JSON row");
    let n = |c: &str| row[c].as_i64().expect("an integer column");
    (n("partition"), n("offset"), n("n"))
}

/// The rows and final state an exactly-once Kafka sink committed for the
/// tally pipeline `pipeline`, read by the broker's transaction markers
/// (this broker shows aborted records to `read_committed`: docs/kafka.md):
/// each row's (partition, offset, n) from `{pipeline}-out`, and the last
/// committed value of every key of `{pipeline}.state`.
fn stored_kafka(brokers: &str, pipeline: &str) -> (Vec<(i64, i64, i64)>, Expected) {
    use sluice_tests::markers::read_committed_by_markers;
    let out = read_committed_by_markers(brokers, &format!("{pipeline}-out"), PARTITIONS);
    let mut rows: Vec<(i64, i64, i64)> = out.iter().map(tally_row).collect();
    rows.sort();
    let mut state = Expected::default();
    let changelog = read_committed_by_markers(brokers, &format!("{pipeline}.state"), PARTITIONS);
    for r in changelog {
        // A state record's key is 0x00 and the state key; a seal's is 0x01.
        let Some(key) = r.key.as_deref().and_then(|k| k.strip_prefix('\0')) else {
            continue;
        };
        // Tag 1: no expiry; the count follows.
        let n = r.value.strip_prefix('\u{1}').expect("a stored value's tag");
        state.state.insert(
            (r.partition as i64, key.as_bytes().to_vec()),
            n.parse().expect("a count"),
        );
    }
    (rows, state)
}

/// Asserts an exactly-once Kafka sink holds what `expected` says: every
/// row exactly once with its count, and every key's final count.
fn assert_stored_kafka(brokers: &str, pipeline: &str, expected: &Expected) {
    let (rows, stored) = stored_kafka(brokers, pipeline);
    let mut want: Vec<(i64, i64, i64)> = expected
        .rows
        .iter()
        .map(|(p, o, _, n)| (*p, *o, *n))
        .collect();
    want.sort();
    assert_eq!(rows.len(), want.len(), "{pipeline}: row count");
    assert!(
        rows == want,
        "{pipeline}: the rows differ from the recomputation"
    );
    assert_eq!(
        stored.state, expected.state,
        "{pipeline}: the committed state"
    );
}

/// The kill loop on the exactly-once Kafka sink: state goes to a changelog
/// topic in each batch's transaction and is restored from it after every
/// SIGKILL (the aborted transactions the kills leave included, which this
/// broker shows to `read_committed`); every row once with its count, every
/// key's final count right, `verify` replays every batch.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_exactly_once_state_survives_sigkill_cycles_exactly_once() {
    let name = "state_kafka_once_crash";
    let offsets = std::sync::OnceLock::new();
    let run = kill_stateful(
        name,
        0x4a1e0,
        |c| {
            let brokers = c.get("source", "brokers").expect("brokers").to_string();
            let group = format!("sluice-{name}");
            let _ = offsets.set(sluice_tests::kafka_out::GroupOffsets::new(
                &brokers, &group, name, PARTITIONS,
            ));
            kafka_once(c, name)
        },
        async || offsets.get().map_or(0, |o| o.total()),
    )
    .await;
    assert_stored_kafka(&run.broker.brokers, name, &run.expected);
    run.verified(name);
}

/// Two processes statically assigned the same partitions into an
/// exactly-once Kafka sink: each fences the other's transactional ids
/// again and again, so each restores state from the changelog over and
/// over, past the loser's aborted state records; none of them counts.
///
/// The output is read by the markers with producer epochs
/// (`markers::MarkedLog`): this broker leaves some transactions of a
/// fenced producer without an ABORT marker, so a reader that let the next
/// epoch's COMMIT marker take them saw one batch's rows twice (4 failures
/// in 56 runs before the reader knew epochs; 18 of 18 since).
///
/// Still ignored in the suite: its stateless twin
/// (`kafka_sink::two_owners_of_the_same_partitions_fence_each_other_on_kafka`)
/// saw an input range committed twice (about 1 run in 18), a suspected
/// broker race not proven yet (docs/kafka.md). Run it with `--ignored`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "its stateless twin saw a range committed twice, suspected broker race (see its doc)"]
async fn kafka_exactly_once_fenced_owner_writes_no_state() {
    let name = "state_kafka_once_fence";
    let dir = TempDir::new(name);
    let (config, fenced) = two_owners(name, 20_000, &dir, |c| kafka_once(c, name));
    let brokers = shared_broker();
    let input = read_committed(brokers, name, PARTITIONS);
    assert_stored_kafka(brokers, name, &Expected::of(&input, &[]));
    let batches = assert_verified(&config);
    println!("{name}: {fenced} fenced transactions; {batches} batches verified");
}

/// An exactly-once Kafka sink keeps state in a changelog topic it never
/// creates: without it a stateful module stops with the reason and what to
/// create, committing nothing; created, the same pipeline runs and
/// `sluice state` reads the state back from it.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_changelog_topic_stops_a_stateful_module_saying_what_to_create() {
    let name = "state_kafka_once";
    let brokers = shared_broker();
    create_topic(brokers, name, 1);
    let out = format!("{name}-out");
    sluice_tests::kafka_out::create_sink_topics(brokers, name, &out);
    produce(brokers, name, &few_keys_with(name, 10, 100, "-"));
    let dir = TempDir::new(name);
    let config = tally::config(name, brokers, 100)
        .sink_url(&format!("kafka://{brokers}"))
        .targets(|t| t.kafka_topic(&out))
        .write(dir.path());
    let run = run_until_caught_up(&config, std::time::Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("changelog topic `{name}.state`"))
            && stderr.contains("does not exist: create it compacted"),
        "{stderr}"
    );
    assert!(
        read_consumed(brokers, &out, PARTITIONS).is_empty(),
        "nothing committed"
    );
    create_topic(brokers, &format!("{name}.state"), 1);
    run_ok(&config);
    let looked = sluice_ok(&[
        "state",
        "get",
        config.to_str().unwrap(),
        "--partition",
        &format!("{name}:0"),
        "--key",
        "k0",
    ]);
    let input = read_committed(brokers, name, 1);
    let k0 = Expected::of(&input, &[]).state[&(0, b"k0".to_vec())];
    assert_eq!(looked.trim(), format!("{name}:0 \"k0\" = \"{k0}\""));
}

/// `sluice state get|scan` show what the sink holds, on the three SQL
/// databases and Redis:
/// every key of a partition with the count the input implies, one key,
/// an absent key, a prefix, a limit, and pages that add up to the whole.
#[tokio::test(flavor = "multi_thread")]
async fn state_cli_shows_a_partitions_state() {
    let name = "state_cli";
    let brokers = shared_broker();
    create_topic(brokers, name, 2);
    let mut records = few_keys_with(name, 60, 1000, "-");
    records.extend(
        few_keys_with(name, 7, 1000, "-")
            .into_iter()
            .map(|r| Produce { partition: 1, ..r }),
    );
    produce(brokers, name, &records);
    let input = read_committed(brokers, name, 2);
    let expected = Expected::of(&input, &[]);
    let dir = TempDir::new(name);
    let server = redis_server::RedisServer::start(name);
    for sub in ["sqlite", "postgres", "mysql", "redis"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let mut configs = Vec::new();
    for (db, sub) in [
        (SinkDb::Sqlite(dir.path().join("cli.db")), "sqlite"),
        (SinkDb::fresh_postgres(name).await, "postgres"),
        (SinkDb::fresh_mysql(name).await, "mysql"),
    ] {
        let config = db.configure(tally::config(name, brokers, 100));
        configs.push(config.write(&dir.path().join(sub)));
    }
    configs.push(
        tally::redis_config(tally::config(name, brokers, 100), &server.url())
            .write(&dir.path().join("redis")),
    );
    for config in &configs {
        run_ok(config);
        let config = config.to_str().unwrap();
        for p in 0..2 {
            let partition = format!("{name}:{p}");
            let scanned =
                sluice_ok(&["state", "scan", config, "--partition", &partition, "--json"]);
            let got: Vec<(Vec<u8>, i64)> = scanned
                .lines()
                .map(|l| {
                    let line: serde_json::Value = serde_json::from_str(l).unwrap();
                    let state = &line;
                    assert_eq!(state["topic"], name);
                    assert_eq!(state["partition"], p);
                    assert!(state["expires_at_ms"].is_null(), "{l}");
                    let n = state["value"].as_str().unwrap().parse().unwrap();
                    (state["key"].as_str().unwrap().as_bytes().to_vec(), n)
                })
                .collect();
            let want: Vec<(Vec<u8>, i64)> = expected
                .state
                .iter()
                .filter(|((partition, _), _)| *partition == p)
                .map(|((_, key), n)| (key.clone(), *n))
                .collect();
            assert_eq!(got, want, "{config} {partition}");
        }
        let partition = format!("{name}:0");
        let state = |verb: &str, extra: &[&str]| {
            let head = ["state", verb, config, "--partition", partition.as_str()];
            let args = [&head[..], extra].concat();
            sluice_ok(&args)
        };
        let k3 = expected.state[&(0, b"k3".to_vec())];
        let one = state("get", &["--key", "k3"]);
        assert_eq!(one.trim(), format!("{partition} \"k3\" = \"{k3}\""));
        let hex = state("get", &["--key-hex", "6b33", "--json"]);
        let hex: serde_json::Value = serde_json::from_str(&hex).unwrap();
        assert_eq!(hex["value"], k3.to_string());
        let none = state("get", &["--key", "nope"]);
        assert_eq!(none.trim(), format!("{partition} \"nope\" absent"));
        let prefixed = state("scan", &["--prefix", "k1"]);
        assert_eq!(prefixed.lines().count(), 1, "{prefixed}");
        let limited = state("scan", &["--limit", "2"]);
        assert_eq!(limited.lines().count(), 2, "{limited}");
        // Pages of two, each after the last key of the one before, give
        // every key once, in order.
        let keys_of = |extra: &[&str]| -> Vec<String> {
            let json = [extra, &["--json"]].concat();
            state("scan", &json)
                .lines()
                .map(|l| {
                    let line: serde_json::Value = serde_json::from_str(l).unwrap();
                    line["key"].as_str().unwrap().to_string()
                })
                .collect()
        };
        let (mut paged, mut after) = (Vec::new(), None::<String>);
        loop {
            let mut extra = vec!["--limit", "2"];
            if let Some(a) = &after {
                extra.extend(["--after-hex", a.as_str()]);
            }
            let page = keys_of(&extra);
            let Some(last) = page.last() else { break };
            after = Some(hex::encode(last));
            paged.extend(page);
        }
        let all = keys_of(&["--limit", "0"]);
        assert_eq!(paged, all);
        assert_eq!(
            all.len(),
            expected.state.keys().filter(|(p, _)| *p == 0).count()
        );
        // Bad input: a clear refusal, and the state is untouched.
        for (args, says) in [
            (
                vec!["get", config, "--partition", &partition, "--key-hex", "6b3"],
                "not hex",
            ),
            (
                vec!["get", config, "--partition", &partition, "--key-hex", "zz"],
                "not hex",
            ),
            (
                vec!["get", config, "--partition", name, "--key", "k3"],
                "TOPIC:PARTITION",
            ),
            (vec!["get", config, "--partition", &partition], "--key"),
            (
                vec!["scan", config, "--partition", &format!("{name}:x")],
                "TOPIC:PARTITION",
            ),
            (
                vec![
                    "scan",
                    config,
                    "--partition",
                    &partition,
                    "--after-hex",
                    "k",
                ],
                "not hex",
            ),
        ] {
            let out = std::process::Command::new(sluice_bin())
                .arg("state")
                .args(&args)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success() && out.stdout.is_empty(), "{args:?}");
            assert!(stderr.contains(says), "{args:?}: {stderr}");
        }
        assert_eq!(state("get", &["--key", "k3"]), one);
    }
}

/// `reset` never leaves state that disagrees with the checkpoint: it
/// refuses a partition that keeps state, moving nothing, and with
/// `--clear-state` deletes the state with the move, so the re-run counts
/// from scratch to the same final state.
#[tokio::test(flavor = "multi_thread")]
async fn reset_moves_state_with_the_checkpoint_or_refuses() {
    let name = "state_reset";
    let brokers = shared_broker();
    create_topic(brokers, name, 1);
    produce(brokers, name, &few_keys_with(name, 300, 1000, "-"));
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("reset.db"));
    let config = db
        .configure(tally::config(name, brokers, 100))
        .write(dir.path());
    run_ok(&config);
    let input = read_committed(brokers, name, 1);
    let expected = Expected::of(&input, &[]);
    tally::assert_stored(&db, name, &expected).await;
    let path = config.to_str().unwrap();

    let refused = std::process::Command::new(sluice_bin())
        .args(["reset", path, "--to-earliest"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("keeps keyed state (5 keys)") && stderr.contains("--clear-state"),
        "{stderr}"
    );
    let checkpoint = "SELECT next_offset FROM sluice_checkpoints";
    assert_eq!(db.scalar(checkpoint).await, Some(300), "nothing moved");

    let out = sluice_ok(&["reset", path, "--to-earliest", "--clear-state"]);
    assert!(out.contains("deleted 5 keyed state keys"), "{out}");
    run_ok(&config);
    let after = tally::stored(&db, name).await;
    assert_eq!(
        after.state, expected.state,
        "the re-run counts from scratch"
    );
    assert_eq!(
        after.rows.len(),
        2 * expected.rows.len(),
        "append rows come again"
    );
}

/// The same promise on Redis and on the exactly-once Kafka sink (whose
/// state is its changelog: `--clear-state` moves the changelog's committed
/// position to 0 in the reset's transaction), seen through `sluice state
/// scan`: refused with the keys counted, state unchanged; cleared with the
/// move, then the re-run counts from scratch to the same final state.
#[tokio::test(flavor = "multi_thread")]
async fn reset_moves_state_with_the_checkpoint_or_refuses_on_redis_and_kafka() {
    let brokers = shared_broker();
    let server = redis_server::RedisServer::start("state_reset_redis");
    for (name, sink) in [
        ("state_reset_redis", "redis"),
        ("state_reset_kafka", "kafka"),
    ] {
        create_topic(brokers, name, 1);
        produce(brokers, name, &few_keys_with(name, 300, 1000, "-"));
        let dir = TempDir::new(name);
        let config = match sink {
            "redis" => tally::redis_config(tally::config(name, brokers, 100), &server.url()),
            _ => kafka_once(tally::config(name, brokers, 100), name),
        }
        .write(dir.path());
        run_ok(&config);
        let expected = Expected::of(&read_committed(brokers, name, 1), &[]);
        let path = config.to_str().unwrap();
        let partition = format!("{name}:0");
        let scan = || {
            sluice_ok(&["state", "scan", path, "--partition", &partition, "--json"])
                .lines()
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    let key = v["key"].as_str().unwrap().as_bytes().to_vec();
                    (
                        (0i64, key),
                        v["value"].as_str().unwrap().parse::<i64>().unwrap(),
                    )
                })
                .collect::<std::collections::BTreeMap<(i64, Vec<u8>), i64>>()
        };
        assert_eq!(scan(), expected.state, "{sink}: the first run's state");

        let refused = std::process::Command::new(sluice_bin())
            .args(["reset", path, "--to-earliest"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{sink}: {stderr}");
        assert!(
            stderr.contains("keeps keyed state (5 keys)") && stderr.contains("--clear-state"),
            "{sink}: {stderr}"
        );
        let dry = sluice_ok(&["reset", path, "--to-earliest", "--clear-state", "--dry-run"]);
        assert!(
            dry.contains("checkpoint 300 -> 0") && dry.contains("would delete 5 keyed state keys"),
            "{sink}: nothing moved: {dry}"
        );
        assert_eq!(scan(), expected.state, "{sink}: state kept");

        let out = sluice_ok(&["reset", path, "--to-earliest", "--clear-state"]);
        assert!(out.contains("deleted 5 keyed state keys"), "{sink}: {out}");
        assert!(scan().is_empty(), "{sink}: state cleared with the move");
        run_ok(&config);
        assert_eq!(
            scan(),
            expected.state,
            "{sink}: the re-run counts from scratch"
        );
        assert_verified(&config);
    }
}

/// A module built against contract 0.1.0 (before `state`; bound directly
/// from a frozen copy of that WIT) loads and runs on this host unchanged.
#[tokio::test(flavor = "multi_thread")]
async fn a_module_built_against_0_1_0_runs_unchanged() {
    let name = "state_legacy";
    let brokers = shared_broker();
    create_topic(brokers, name, 1);
    produce(brokers, name, &few_keys_with(name, 120, 1000, "-"));
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("legacy.db"));
    let config = db
        .configure(
            PipelineToml::new(name, brokers, &[name], &plugin("legacy"))
                .target(Target::new("records").column("offset", "integer")),
        )
        .write(dir.path());
    run_ok(&config);
    let rows = db.scalar("SELECT count(*) FROM records").await;
    assert_eq!(rows, Some(120));
    assert_verified(&config);
}

/// Expired state does not stay stored: keys whose expiry passed (tally's
/// dedupe mode, each key expiring 1 ms of record time after its record)
/// are removed by a later batch of their partition, on every sink kind that
/// keeps state. `sluice state scan` shows only keys written since, the
/// run's summary counts what it removed, and `verify` still replays every
/// batch (what a batch removes is not part of its result).
#[tokio::test(flavor = "multi_thread")]
async fn expired_state_is_removed_by_later_batches() {
    let name = "state_expiry";
    let brokers = shared_broker();
    create_topic(brokers, name, 1);
    let keyed = |tag: &str, n: usize| -> Vec<Produce> {
        (0..n)
            .map(|i| Produce {
                partition: 0,
                key: Some(format!("{tag}{i}")),
                value: "-".into(),
            })
            .collect()
    };
    produce(brokers, name, &keyed("old", 300));
    let dir = TempDir::new(name);
    let server = redis_server::RedisServer::start(name);
    let base = || tally::config(name, brokers, 1000).module_param("dedupe_ttl_ms", 1);
    for sub in ["sqlite", "postgres", "mysql", "redis", "kafka"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let mut configs = Vec::new();
    for (db, sub) in [
        (SinkDb::Sqlite(dir.path().join("expiry.db")), "sqlite"),
        (SinkDb::fresh_postgres(name).await, "postgres"),
        (SinkDb::fresh_mysql(name).await, "mysql"),
    ] {
        configs.push(db.configure(base()).write(&dir.path().join(sub)));
    }
    configs.push(tally::redis_config(base(), &server.url()).write(&dir.path().join("redis")));
    configs.push(kafka_once(base(), name).write(&dir.path().join("kafka")));
    // What a run's summary says it removed.
    let removed_by = |config: &std::path::Path| -> u64 {
        let out = run_until_caught_up(config, std::time::Duration::from_secs(300));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
            .split(", ")
            .find_map(|part| part.trim().strip_suffix(" expired keys removed"))
            .map_or(0, |n| n.trim().parse().expect("a count"))
    };
    let first: Vec<u64> = configs.iter().map(|c| removed_by(c)).collect();
    produce(brokers, name, &keyed("new", 50));
    for (config, first) in configs.iter().zip(first) {
        let removed = removed_by(config);
        let path = config.to_str().unwrap();
        let keys: Vec<String> = scan_state(config, &format!("{name}:0"))
            .iter()
            .map(|line| line["key"].as_str().unwrap().to_string())
            .collect();
        assert!(
            !keys.is_empty() && keys.iter().all(|k| k.starts_with("new")),
            "{path}: {removed} removed, still stored: {keys:?}"
        );
        // Every key was written once: what is not stored was removed.
        assert_eq!(first + removed + keys.len() as u64, 350, "{path}");
        assert_verified(config);
    }
}

/// `sluice_state_partition_keys` and `sluice_state_partition_bytes` give,
/// per owned partition, the keys its state keeps and their keys' and
/// values' bytes, as the recomputation says.
#[tokio::test(flavor = "multi_thread")]
async fn state_metrics_give_each_partitions_keys_and_bytes() {
    use sluice_tests::control::{Host, control_port};
    let name = "state_partition_metrics";
    let brokers = shared_broker();
    create_topic(brokers, name, 2);
    let records = tally::keyed(numbered(name, 3_000, 2));
    produce(brokers, name, &records);
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("metrics.db"));
    let (port, _) = control_port();
    let config = db
        .configure(tally::config(name, brokers, 500).control(port, 1 << 20))
        .write(dir.path());
    let host = Host::start(&config, &dir.path().join("host.log"));
    host.wait_for_api(port);
    let limit = std::time::Duration::from_secs(120);
    host.wait_for_metric("sluice_records_in_total", records.len() as f64, limit);
    let scrape = sluice_tests::control::scrape_metrics(port);
    host.stop();
    let expected = Expected::of(&read_committed(brokers, name, 2), &[]);
    for p in 0..2i64 {
        let labels = [format!("topic=\"{name}\""), format!("partition=\"{p}\"")];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        let metric = |metric: &str| sluice_tests::control::metric_sample(&scrape, metric, &labels);
        let kept: Vec<(&Vec<u8>, &i64)> = expected
            .state
            .iter()
            .filter(|((partition, _), _)| *partition == p)
            .map(|((_, key), n)| (key, n))
            .collect();
        let bytes: usize = kept
            .iter()
            .map(|(k, n)| k.len() + n.to_string().len())
            .sum();
        assert_eq!(
            metric("sluice_state_partition_keys"),
            kept.len() as f64,
            "{p}"
        );
        assert_eq!(metric("sluice_state_partition_bytes"), bytes as f64, "{p}");
    }
}

/// A partition whose state outgrows `limits.state_cache_mib` is read from
/// the sink as needed, with the same counts and the host's memory bounded:
/// before each batch runs, the keys of its records the cache does not hold
/// are read in one round trip (`sluice_state_sink_reads_total
/// {kind="record_keys"}`), so a module keyed by record key (this one) reads
/// few keys one by one (`kind="key"`: those the cache lost to its budget
/// while the batch ran).
#[tokio::test(flavor = "multi_thread")]
async fn state_larger_than_the_cache_is_read_a_batch_of_record_keys_at_a_time() {
    use sluice_tests::control::{Host, control_port};
    let name = "state_small_cache";
    let brokers = shared_broker();
    create_topic(brokers, name, 1);
    // 40,000 distinct keys, then 10,000 repeats: ~3 MiB of cached state.
    let records: Vec<Produce> = (0..50_000)
        .map(|i| Produce {
            partition: 0,
            key: Some(format!("key-{:08}", i % 40_000)),
            value: format!("v{i}"),
        })
        .collect();
    produce(brokers, name, &records);
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("small.db"));
    let (port, _) = control_port();
    let config = db
        .configure(
            tally::config(name, brokers, 2_000)
                .field("limits", "state_cache_mib", 1)
                .control(port, 1 << 20),
        )
        .write(dir.path());
    let host = Host::start(&config, &dir.path().join("host.log"));
    host.wait_for_api(port);
    let limit = std::time::Duration::from_secs(240);
    host.wait_for_metric("sluice_records_in_total", records.len() as f64, limit);
    let scrape = sluice_tests::control::scrape_metrics(port);
    let metric =
        |name: &str, labels: &[&str]| sluice_tests::control::metric_sample(&scrape, name, labels);
    let misses = metric("sluice_state_sink_reads_total", &["kind=\"key\""]);
    let timed = metric("sluice_state_sink_read_seconds_count", &["kind=\"key\""]);
    let batched = metric("sluice_state_sink_reads_total", &["kind=\"record_keys\""]);
    let read = metric("sluice_state_keys_read_total", &[]);
    let cached = metric("sluice_state_cache_bytes", &[]);
    let peak = host.peak_rss_mib();
    host.stop();
    // Once the partition's state outgrows the cache (~13,000 keys in), each
    // batch reads its record keys in one round trip: most of 25 batches.
    assert!(
        batched >= 10.0,
        "record keys read a batch at a time: {batched}"
    );
    assert!(
        misses < read / 10.0,
        "few keys read one by one: {misses} of {read}"
    );
    assert_eq!(timed, misses, "every read from the sink is timed");
    assert!(cached <= (1 << 20) as f64, "the cache kept {cached} bytes");
    assert!(peak < 200, "peak RSS {peak} MiB");
    let input = read_committed(brokers, name, 1);
    tally::assert_stored(&db, name, &Expected::of(&input, &[])).await;
    println!(
        "{name}: {read} keys read, {batched} batched reads of record keys, {misses} keys read \
         one by one, cache at {cached} bytes, peak RSS {peak} MiB"
    );
}
