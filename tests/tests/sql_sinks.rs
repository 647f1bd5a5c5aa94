//! Exactly-once into Postgres and MariaDB under faults: SIGKILL/restart
//! cycles, two owners of the same partitions (static assignment) fencing
//! each other, a database restart in the middle of a run, and replies to
//! `COMMIT` lost on the way back (fault proxy). Every result is compared
//! with an independent `read_committed` read of the input.
//!
//! Tests of one database run one at a time (a restart would disturb the
//! others); each owns its schema/database and topic.

use sluice_tests::control::sluice_ok;
use sluice_tests::proxy::FaultProxy;
use sluice_tests::scenarios::{BadConfigs, KillLoop, Lifecycle, TwoOwners};
use sluice_tests::sinks::SinkDb;
use sluice_tests::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

const PARTITIONS: i32 = 4;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Db {
    Postgres,
    Mysql,
}

static POSTGRES: Mutex<()> = Mutex::const_new(());
static MYSQL: Mutex<()> = Mutex::const_new(());

impl Db {
    fn lock(self) -> &'static Mutex<()> {
        match self {
            Db::Postgres => &POSTGRES,
            Db::Mysql => &MYSQL,
        }
    }

    async fn fresh(self, name: &str) -> SinkDb {
        match self {
            Db::Postgres => SinkDb::fresh_postgres(name).await,
            Db::Mysql => SinkDb::fresh_mysql(name).await,
        }
    }

    fn port(self) -> u16 {
        match self {
            Db::Postgres => 5432,
            Db::Mysql => 3306,
        }
    }

    /// The test URL with its port replaced (to go through a proxy), in
    /// plain text.
    fn url_via(self, port: u16) -> String {
        let url = match self {
            Db::Postgres => sinks::postgres_url(),
            Db::Mysql => sinks::mysql_url(),
        };
        let url = url.replace(&format!(":{}/", self.port()), &format!(":{port}/"));
        // The proxy reads the protocol in plain text: no TLS through it
        // (the machine's Postgres offers TLS, and sqlx takes it when offered).
        let joint = if url.contains('?') { '&' } else { '?' };
        match self {
            Db::Postgres => format!("{url}{joint}sslmode=disable"),
            Db::Mysql => format!("{url}{joint}ssl-mode=DISABLED"),
        }
    }

    /// Stops the server, keeps it down for `down`, starts it again and
    /// waits until it accepts connections.
    fn restart(self, down: Duration) {
        match self {
            Db::Postgres => {
                let version = std::fs::read_dir("/etc/postgresql")
                    .expect("/etc/postgresql")
                    .flatten()
                    .next()
                    .expect("a cluster")
                    .file_name();
                let cluster = |action: &str| {
                    let status = Command::new("pg_ctlcluster")
                        .arg("--skip-systemctl-redirect")
                        .arg(&version)
                        .args(["main", action])
                        .status()
                        .expect("pg_ctlcluster");
                    assert!(status.success(), "pg_ctlcluster {action}");
                };
                cluster("stop");
                std::thread::sleep(down);
                cluster("start");
            }
            Db::Mysql => {
                let status = Command::new("mariadb-admin")
                    .args(["-uroot", "-h127.0.0.1", "shutdown"])
                    .status()
                    .expect("mariadb-admin");
                assert!(status.success(), "mariadb-admin shutdown");
                std::thread::sleep(down);
                let status = Command::new("start-stop-daemon")
                    .args([
                        "--start",
                        "--oknodo",
                        "--background",
                        "--exec",
                        "/usr/sbin/mariadbd",
                    ])
                    .status()
                    .expect("start-stop-daemon");
                assert!(status.success(), "start mariadbd");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", self.port())).is_err() {
            assert!(Instant::now() < deadline, "{self:?} did not come back");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

async fn sigkill_cycles(which: Db, name: &str) {
    let _only = which.lock().lock().await;
    let broker = Broker::start();
    // Small batches: each restart gets a few in before its kill, so the
    // input outlasts the kills (with 200 a loaded run once finished after 19).
    let kill_loop = KillLoop {
        brokers: &broker.brokers,
        name,
        seed: 0xdb,
        kills: 22,
        max_records: 100,
        batch_interval_ms: 100,
        assigned: false,
    };
    kill_loop.run(&which.fresh(name).await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_survives_sigkill_cycles_exactly_once() {
    sigkill_cycles(Db::Postgres, "sluice_pg_crash").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_survives_sigkill_cycles_exactly_once() {
    sigkill_cycles(Db::Mysql, "sluice_my_crash").await;
}

/// Two processes statically assigned the same partitions race for every
/// range: each range is committed once, the loser rolls back.
async fn two_owners_fence(which: Db, name: &str) {
    let _only = which.lock().lock().await;
    let two_owners = TwoOwners {
        brokers: shared_broker(),
        name,
        records: 40_000,
        partitions: PARTITIONS,
        max_records: 100,
        batch_interval_ms: 20,
    };
    two_owners.run(&which.fresh(name).await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_fences_a_second_owner_of_the_same_partitions() {
    two_owners_fence(Db::Postgres, "sluice_pg_fence").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_fences_a_second_owner_of_the_same_partitions() {
    two_owners_fence(Db::Mysql, "sluice_my_fence").await;
}

/// Configs every sink kind refuses are refused on each SQL database
/// before anything is written.
#[tokio::test(flavor = "multi_thread")]
async fn bad_configs_of_any_sink_are_refused_on_sql_and_write_nothing() {
    let dir = TempDir::new("sql-bad-any");
    let bad = |name| BadConfigs {
        brokers: shared_broker(),
        name,
    };
    bad("sqlite_bad_any")
        .run(&SinkDb::Sqlite(dir.path().join("bad.db")))
        .await;
    for (which, name) in [
        (Db::Postgres, "sluice_pg_bad_any"),
        (Db::Mysql, "sluice_my_bad_any"),
    ] {
        let _only = which.lock().lock().await;
        bad(name).run(&which.fresh(name).await).await;
    }
}

/// Deploy, hot swap under load, rollback and `verify` on MariaDB: the
/// module store and lineage live in the sink's database.
#[tokio::test(flavor = "multi_thread")]
async fn module_lifecycle_works_on_mariadb() {
    let name = "sluice_my_lifecycle";
    let _only = Db::Mysql.lock().lock().await;
    let lifecycle = Lifecycle {
        brokers: shared_broker(),
        name,
        max_records: 200,
    };
    lifecycle.run(&Db::Mysql.fresh(name).await).await;
}

/// The database goes down for `down` while the pipeline (with `properties`
/// added to its librdkafka ones) runs; it waits the outage out, re-reads
/// the checkpoint and finishes by itself, exactly once. Returns its log.
async fn outage(
    which: Db,
    name: &str,
    records: usize,
    down: Duration,
    properties: &[(&str, &str)],
) -> String {
    let _only = which.lock().lock().await;
    let brokers = shared_broker();
    create_topic(brokers, name, PARTITIONS);
    produce(brokers, name, &numbered(name, records, PARTITIONS));
    let db = which.fresh(name).await;
    let dir = TempDir::new(name);
    let mut config = db.configure(PipelineToml::identity(name, brokers, name, 100));
    for (key, value) in properties {
        config = config.source_property(key, value);
    }
    let config = config.write(dir.path());
    let child = spawn_until_caught_up(&config, "info", Stdio::piped());
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.committed_batches().await < 5 {
        assert!(
            Instant::now() < deadline,
            "no batches committed within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    which.restart(down);
    let before = db.committed_batches().await;
    let out = child.wait_with_output().expect("wait");
    let logs = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{logs}");
    // Whichever met the outage first waited it out: a commit (retried with
    // backoff) or the version check between batches (the module store is
    // in the same database; the batch then waits for it).
    assert!(
        logs.contains("retrying") || logs.contains("module store unavailable"),
        "the outage was not noticed: {logs}"
    );
    assert!(
        db.committed_batches().await > before,
        "work continued after the restart"
    );
    let rows = db
        .assert_exactly_once(brokers, name, PARTITIONS, name)
        .await;
    println!("{which:?}: down {down:?} after {before} batches; {rows} records exactly once");
    logs
}

/// Down 12 s: longer than the pool's 10 s acquire timeout, so the
/// pipeline's own retry with backoff is exercised, not only the pool's
/// waiting.
async fn database_restart(which: Db, name: &str) {
    outage(which, name, 60_000, Duration::from_secs(12), &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_restart_mid_run_resumes_exactly_once() {
    database_restart(Db::Postgres, "sluice_pg_restart").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_restart_mid_run_resumes_exactly_once() {
    database_restart(Db::Mysql, "sluice_my_restart").await;
}

/// The server commits but the reply to COMMIT is lost: the host reads the
/// checkpoint back, finds the batch landed and does not write it again.
async fn lost_commit_reply(which: Db, name: &str) {
    let _only = which.lock().lock().await;
    let brokers = shared_broker();
    create_topic(brokers, name, PARTITIONS);
    produce(brokers, name, &numbered(name, 20_000, PARTITIONS));
    let db = which.fresh(name).await;
    let proxy = FaultProxy::start(&format!("127.0.0.1:{}", which.port()), 5, 4);
    let dir = TempDir::new(name);
    let config = db
        .configure_via(
            PipelineToml::identity(name, brokers, name, 200),
            &which.url_via(proxy.port),
        )
        .write(dir.path());
    let out = spawn_until_caught_up(&config, "info", Stdio::piped())
        .wait_with_output()
        .expect("run sluice");
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert!(
        proxy.drops() >= 3,
        "only {} of {} COMMIT replies dropped",
        proxy.drops(),
        proxy.commits()
    );
    let unknown = logs.matches("commit outcome unknown").count();
    let landed = logs.matches("commit had landed").count();
    assert!(
        unknown >= proxy.drops() && landed >= 3,
        "unknown {unknown}, landed {landed}: {logs}"
    );
    let rows = db
        .assert_exactly_once(brokers, name, PARTITIONS, name)
        .await;
    println!(
        "{which:?}: {} COMMIT replies dropped of {}; {landed} resolved as landed; {rows} records exactly once",
        proxy.drops(),
        proxy.commits()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_lost_commit_reply_is_resolved_from_the_checkpoint() {
    lost_commit_reply(Db::Postgres, "sluice_pg_lost_reply").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_lost_commit_reply_is_resolved_from_the_checkpoint() {
    lost_commit_reply(Db::Mysql, "sluice_my_lost_reply").await;
}

/// Holds Postgres table `table` of `db` in EXCLUSIVE mode (writers wait,
/// readers do not) until the returned transaction ends.
async fn lock_exclusive<'p>(
    pool: &'p sqlx::AnyPool,
    db: &SinkDb,
    table: &str,
) -> sqlx::Transaction<'p, sqlx::Any> {
    let mut lock = pool.begin().await.unwrap();
    sqlx::query(&format!("LOCK TABLE {} IN EXCLUSIVE MODE", db.table(table)))
        .execute(&mut *lock)
        .await
        .unwrap();
    lock
}

/// `guarantee = "at-least-once"` replays a batch whose rows committed but
/// whose offsets did not. The crash is put exactly there: the test holds a
/// lock on the checkpoint table, so the second transaction waits while the
/// first (rows and dead letters) has committed, and the process is killed
/// then. The restart writes the batch's dead letters again: they are kept
/// once, not a fatal unique violation on every restart.
#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_replays_dead_letters_after_a_crash_between_its_transactions() {
    let _only = Db::Postgres.lock().lock().await;
    let name = "sluice_pg_alo_dead_letters";
    let brokers = shared_broker();
    create_topic(brokers, name, 2);
    let events = |from: usize, to: usize| -> Vec<Produce> {
        (from..to)
            .map(|i| Produce {
                partition: (i % 2) as i32,
                key: Some(format!("e{i}")),
                // Malformed on both partitions, so every batch has some.
                value: match i % 10 {
                    3 | 4 => format!("not json {i}"),
                    _ => format!(
                        r#"{{"id":{i},"user":"u{}","event":"purchase","amount":{i}.5}}"#,
                        i % 7
                    ),
                },
            })
            .collect()
    };
    produce(brokers, name, &events(0, 2_000));
    let db = Db::Postgres.fresh(name).await;
    let dir = TempDir::new(name);
    let config = db
        .configure(
            PipelineToml::new(name, brokers, &[name], &plugin("json-filter"))
                .batch_interval_ms(100)
                .max_records_per_partition(500)
                // Static assignment: no group join, so nothing waits on the
                // coordinator.
                .assign(name, &[0, 1])
                .module_param("event", "purchase")
                .sink("guarantee", "at-least-once")
                .sink("lock_timeout_ms", 60_000)
                .target(
                    Target::new("purchases")
                        .field("mode", "upsert")
                        .field("key", vec!["id"])
                        .column("id", "integer")
                        .column("user", "text")
                        .column("amount", "real"),
                ),
        )
        .write(dir.path());
    let first_log = dir.path().join("first.log");
    let mut first = spawn_until_caught_up(
        &config,
        "info",
        Stdio::from(std::fs::File::create(&first_log).unwrap()),
    );
    // Caught up once: checkpoints exist for both partitions.
    assert!(
        first.wait().unwrap().success(),
        "{}",
        std::fs::read_to_string(&first_log).unwrap_or_default()
    );
    let letters_before = db.dead_letters().await;
    assert_eq!(letters_before, 400);

    let pool = db.pool().await;
    let lock = lock_exclusive(&pool, &db, "sluice_checkpoints").await;
    produce(brokers, name, &events(2_000, 3_000));
    let second_log = dir.path().join("second.log");
    let mut second = spawn_until_caught_up(
        &config,
        "info",
        Stdio::from(std::fs::File::create(&second_log).unwrap()),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.dead_letters().await == letters_before {
        assert!(
            Instant::now() < deadline,
            "the rows transaction never committed; log:\n{}",
            std::fs::read_to_string(&second_log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Rows and dead letters of the new batch are in; its offsets wait.
    second.kill().unwrap();
    second.wait().unwrap();
    lock.rollback().await.unwrap();
    let letters_replayed = db.dead_letters().await;
    assert!(letters_replayed > letters_before);

    let out = run_until_caught_up(&config, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "restart after the crash failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Recompute from the committed input: every malformed record once as a
    // dead letter, every purchase once in the table.
    let input = read_committed(brokers, name, 2);
    let bad: Vec<(i64, i64)> = input
        .iter()
        .filter(|r| r.value.starts_with("not json"))
        .map(|r| (r.partition as i64, r.offset))
        .collect();
    let good = input.len() - bad.len();
    let mut stored: Vec<(i64, i64)> = sqlx::query_as(&format!(
        "SELECT CAST(\"partition\" AS BIGINT), CAST(\"offset\" AS BIGINT) FROM {} ORDER BY 1, 2",
        db.table("sluice_dead_letters")
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    stored.sort();
    let mut expected = bad.clone();
    expected.sort();
    assert_eq!(
        stored, expected,
        "dead letters differ from the malformed input"
    );
    let purchases = db
        .scalar(&format!("SELECT count(*) FROM {}", db.table("purchases")))
        .await
        .unwrap();
    assert_eq!(purchases as usize, good);
    println!(
        "at-least-once: crash between the transactions with {} dead letters in flight; \
         replayed; {} dead letters and {good} purchases, each once",
        letters_replayed - letters_before,
        bad.len()
    );
}

/// Local ports of `pid`'s established connections to `port` (from `ss`).
fn local_ports_to(pid: i32, port: u16) -> Vec<i32> {
    let out = Command::new("ss")
        .args([
            "-tnpH",
            "state",
            "established",
            &format!("( dport = :{port} )"),
        ])
        .output()
        .expect("ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter_map(|local| local.rsplit(':').next()?.parse().ok())
        .collect()
}

/// `commit_ms` of every batch `log` shows committed, in order.
fn commit_times(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("batch committed"))
        .filter_map(|l| {
            l.split("commit_ms=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Freezes `a` inside a commit: holds the dead-letter table (written after
/// the target rows), waits until one of A's sessions waits for a lock,
/// stops A, releases the table, and waits until A's transaction sits idle
/// (its client frozen). Returns when A was frozen.
async fn freeze_inside_commit(
    a: &sluice_tests::control::Host,
    db: &sinks::SinkDb,
    pool: &sqlx::AnyPool,
) -> Instant {
    let table_lock = lock_exclusive(pool, db, "sluice_dead_letters").await;
    wait_for_session_of(a, pool, "wait_event_type = 'Lock'").await;
    a.signal(libc::SIGSTOP);
    let frozen_at = Instant::now();
    table_lock.rollback().await.unwrap();
    wait_for_session_of(a, pool, "state = 'idle in transaction'").await;
    frozen_at
}

/// Waits until a Postgres session of `host` matches `condition`.
async fn wait_for_session_of(
    host: &sluice_tests::control::Host,
    pool: &sqlx::AnyPool,
    condition: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let sql = format!(
        "SELECT client_port FROM pg_stat_activity WHERE application_name = 'sluice' AND {condition}"
    );
    loop {
        let ports: Vec<i32> = sqlx::query_scalar(&sql).fetch_all(pool).await.unwrap();
        let own = local_ports_to(host.pid(), 5432);
        if ports.iter().any(|p| own.contains(p)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no session of the host with {condition}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// True if some of the `words` rows are locked by another transaction.
async fn holds_word_rows(db: &sinks::SinkDb, pool: &sqlx::AnyPool, words: usize) -> bool {
    let mut probe = pool.begin().await.unwrap();
    let free: Vec<String> = sqlx::query_scalar(&format!(
        "SELECT word FROM {} FOR UPDATE SKIP LOCKED",
        db.table("word_counts")
    ))
    .fetch_all(&mut *probe)
    .await
    .unwrap();
    probe.rollback().await.unwrap();
    free.len() < words
}

/// Two instances of a word count (accumulate, overlapping keys) in one
/// group. One is frozen (SIGSTOP) in the middle of its commit, after its
/// rows were written and before COMMIT, holding their row locks: the other
/// is held up for at most `lock_timeout_ms` (the database ends the frozen
/// session), keeps committing, and takes over. When the frozen one wakes,
/// its commit fails and is resolved from the checkpoint. The counts equal a
/// recomputation from the committed input.
#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_instance_holds_the_others_up_for_at_most_the_lock_timeout() {
    use sluice_tests::control::Host;
    let _only = Db::Postgres.lock().lock().await;
    let name = "sluice_pg_frozen";
    let brokers = shared_broker();
    create_topic(brokers, name, 2);
    let db = Db::Postgres.fresh(name).await;
    let dir = TempDir::new(name);
    let lock_timeout_ms = 3000u64;
    let config = db
        .configure(
            PipelineToml::new(name, brokers, &[name], &plugin("word-count"))
                .batch_interval_ms(100)
                .short_session()
                .sink("lock_timeout_ms", lock_timeout_ms as i64)
                .target(Target::word_counts()),
        )
        .write(dir.path());
    let words = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    ];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producing = {
        let (stop, topic) = (std::sync::Arc::clone(&stop), name.to_string());
        std::thread::spawn(move || {
            use rdkafka::producer::Producer as _;
            let p = producer(shared_broker(), None);
            let mut i = 0usize;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let chunk: Vec<Produce> = (i..i + 100)
                    .map(|j| Produce {
                        partition: (j % 2) as i32,
                        key: None,
                        value: format!(
                            "{} {} {}",
                            words[j % 8],
                            words[(j / 8) % 8],
                            words[(j * 7) % 8]
                        ),
                    })
                    .collect();
                for r in &chunk {
                    send(&p, &topic, r);
                }
                // Not UTF-8: a dead letter in every batch of both partitions.
                for partition in 0..2 {
                    let bad = rdkafka::producer::BaseRecord::<str, [u8]>::to(&topic)
                        .partition(partition)
                        .key("bad")
                        .payload(&[0xff, 0xfe][..]);
                    p.send(bad).map_err(|(e, _)| e).expect("send");
                }
                p.flush(Duration::from_secs(60)).expect("flush");
                i += chunk.len();
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let a = Host::start(&config, &dir.path().join("a.log"));
    let b = Host::start(&config, &dir.path().join("b.log"));
    a.wait_for_log("batch committed", 1, Duration::from_secs(90));
    b.wait_for_log("batch committed", 1, Duration::from_secs(90));

    // Catch A inside a commit, holding word rows that B needs (tried again
    // if A happened to be caught before writing them).
    let pool = db.pool().await;
    let mut attempts = 0;
    let (b_before, frozen_at) = loop {
        attempts += 1;
        assert!(
            attempts <= 5,
            "could not catch A holding word rows in 5 attempts"
        );
        let b_before = commit_times(&b.log()).len();
        let frozen_at = freeze_inside_commit(&a, &db, &pool).await;
        if holds_word_rows(&db, &pool, words.len()).await {
            break (b_before, frozen_at);
        }
        a.signal(libc::SIGCONT);
        tokio::time::sleep(Duration::from_secs(1)).await;
    };

    // B goes on within the bound, and keeps going while A stays frozen.
    b.wait_for_log(
        "batch committed",
        b_before + 1,
        Duration::from_millis(lock_timeout_ms) + Duration::from_secs(5),
    );
    let first_after = frozen_at.elapsed();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let b_times = commit_times(&b.log());
    let during = &b_times[b_before..];
    assert!(
        during.len() >= 10,
        "B committed only {} batches in 20 s while A was frozen",
        during.len()
    );
    let worst = *during.iter().max().unwrap();
    assert!(
        worst >= lock_timeout_ms / 2,
        "B never waited for the frozen A's locks (worst commit {worst} ms): the scenario did not happen\nA:\n{}\nB:\n{}",
        a.log(),
        b.log()
    );
    assert!(
        worst <= lock_timeout_ms + 2000,
        "a commit of B waited {worst} ms (lock_timeout_ms = {lock_timeout_ms})"
    );
    assert!(
        b.log().contains("partitions assigned"),
        "B never took A's partitions"
    );
    a.signal(libc::SIGCONT);
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    producing.join().unwrap();

    // Both finish what was produced; then the counts are exact.
    let input = read_committed(brokers, name, 2);
    let mut expected = std::collections::BTreeMap::<String, i64>::new();
    for r in input.iter().filter(|r| r.key.as_deref() != Some("bad")) {
        for w in r.value.split_whitespace() {
            *expected.entry(w.to_string()).or_default() += 1;
        }
    }
    let expected: Vec<(String, i64)> = expected.into_iter().collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let counts = db.pairs("word_counts", "word", "n").await;
        if counts == expected {
            break;
        }
        let total: i64 = counts.iter().map(|c| c.1).sum();
        let want: i64 = expected.iter().map(|c| c.1).sum();
        assert!(
            total <= want,
            "counted {total} words of {want}: a batch applied twice"
        );
        assert!(
            Instant::now() < deadline,
            "counts {counts:?} never reached {expected:?}\nA:\n{}\nB:\n{}",
            a.log(),
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Overlapping keys written by two instances take row locks in key
    // order: no deadlock (each would be retried, with a WARN).
    for log in [a.log(), b.log()] {
        assert!(!log.contains("deadlock detected"), "{log}");
    }
    a.stop();
    b.stop();
    println!(
        "frozen instance: B committed {} ms after the freeze, {} batches in 20 s, worst commit {worst} ms (lock_timeout_ms = {lock_timeout_ms})",
        first_after.as_millis(),
        during.len()
    );
}

/// An instance frozen (SIGSTOP) inside a `COPY ... FROM STDIN` (its append
/// rows) leaves its Postgres session active and waiting on the client, which
/// no timeout of the server's ends, holding the checkpoint rows it moved
/// first. The other instance, once its statements time out on those rows,
/// ends that session (it is sluice's, holds a transaction, and has waited on
/// its client longer than `lock_timeout_ms`) and takes every partition over
/// while the first stays frozen. Thawed, the first resolves its batch from
/// the checkpoint; the rows equal the committed input, one per record.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_frozen_inside_a_copy_is_ended_by_the_instance_it_blocks() {
    use sluice_tests::control::Host;
    let _only = Db::Postgres.lock().lock().await;
    let name = "sluice_pg_frozen_copy";
    let brokers = shared_broker();
    create_topic(brokers, name, 2);
    let db = Db::Postgres.fresh(name).await;
    let dir = TempDir::new(name);
    let lock_timeout_ms = 3000u64;
    let config = db
        .configure(
            PipelineToml::identity(name, brokers, name, 500)
                .sink("lock_timeout_ms", lock_timeout_ms as i64),
        )
        .write(dir.path());
    let producing = Producing::start(name, Duration::from_millis(50), |sent| {
        numbered(&format!("live{sent}"), 100, 2)
    });
    let a = Host::start(&config, &dir.path().join("a.log"));
    let b = Host::start(&config, &dir.path().join("b.log"));
    a.wait_for_log("batch committed", 1, Duration::from_secs(90));
    b.wait_for_log("batch committed", 1, Duration::from_secs(90));

    // Catch A inside its COPY: hold the records table until A's COPY waits
    // for it, stop A, let the COPY start: its session now waits for data.
    let pool = db.pool().await;
    let table_lock = lock_exclusive(&pool, &db, "records").await;
    wait_for_session_of(&a, &pool, "wait_event_type = 'Lock' AND query LIKE 'COPY%'").await;
    a.signal(libc::SIGSTOP);
    let frozen_at = Instant::now();
    table_lock.rollback().await.unwrap();
    wait_for_session_of(&a, &pool, "state = 'active' AND wait_event = 'ClientRead'").await;
    let at_freeze = db.checkpoints().await;

    // B takes A's partitions over (6 s session timeout, the group's join)
    // and moves every checkpoint on while A is still frozen.
    let deadline = frozen_at + Duration::from_secs(60);
    loop {
        let now = db.checkpoints().await;
        if at_freeze.iter().all(|(p, at)| now.get(p) > Some(at)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B did not get past the frozen A in 60 s: checkpoints {now:?}, at the freeze {at_freeze:?}\nB:\n{}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let moved_after = frozen_at.elapsed();
    // A's other connections are idle; the one in the COPY is gone.
    let own = local_ports_to(a.pid(), 5432);
    let in_transaction: Vec<i32> = sqlx::query_scalar(
        "SELECT client_port FROM pg_stat_activity \
         WHERE application_name = 'sluice' AND backend_xid IS NOT NULL",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        !in_transaction.iter().any(|p| own.contains(p)),
        "the frozen A still holds a transaction"
    );
    a.signal(libc::SIGCONT);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let sent = producing.finish() as i64;
    let logs = || format!("A:\n{}\nB:\n{}", a.log(), b.log());
    db.wait_for_committed_total(name, sent, Duration::from_secs(120), logs)
        .await;
    a.stop();
    b.stop();
    pool.close().await;
    let rows = db.assert_exactly_once(brokers, name, 2, name).await;
    println!(
        "frozen inside a COPY: every checkpoint moved {} ms after the freeze; {rows} records exactly once",
        moved_after.as_millis()
    );
}

/// Postgres is down for two minutes while the pipeline runs in a group
/// whose `max.poll.interval.ms` is 20 s. The commit retries through the
/// outage while the source keeps the membership alive (it polls with the
/// partitions paused): the instance is never thrown out of the group, no
/// partition is revoked, and the result is exact.
#[tokio::test(flavor = "multi_thread")]
async fn a_two_minute_database_outage_keeps_the_group_membership() {
    let logs = outage(
        Db::Postgres,
        "sluice_pg_long_outage",
        40_000,
        Duration::from_secs(120),
        &[("max.poll.interval.ms", "20000")],
    )
    .await;
    // Closing the consumer at the end leaves the group (a revocation);
    // before that, none.
    let running = logs
        .split("caught up with the log ends")
        .next()
        .expect("a first part");
    assert_eq!(
        running.matches("partitions assigned").count(),
        1,
        "the instance lost its partitions during the outage: {logs}"
    );
    assert!(!running.contains("partitions revoked"), "{logs}");
    assert!(!running.contains("MAXPOLL"), "{logs}");
}

/// One rule for floats on every sink: NaN and infinities never reach it
/// (the records that produce them become `non-finite` dead letters, the
/// rest commits), and -0.0 is stored as 0.0 (SQLite and MySQL cannot keep
/// the sign, so no sink does).
async fn floats_follow_one_rule(db: SinkDb, name: &str) {
    let brokers = shared_broker();
    create_topic(brokers, name, 1);
    let values = ["1.5", "-0", "NaN", "inf", "-inf", "2", "not a float"];
    let records: Vec<Produce> = values
        .iter()
        .map(|v| Produce {
            partition: 0,
            key: None,
            value: v.to_string(),
        })
        .collect();
    produce(brokers, name, &records);
    let dir = TempDir::new(name);
    let config = db
        .configure(
            PipelineToml::new(name, brokers, &[name], &plugin("hostile"))
                .module_param("mode", "floats")
                .target(
                    Target::new("floats")
                        .column("offset", "integer")
                        .column("x", "real"),
                ),
        )
        .write(dir.path());
    run_ok(&config);
    let pool = db.pool().await;
    let (o, x) = (db.ident("offset"), db.ident("x"));
    let rows: Vec<(i64, Option<f64>)> = sqlx::query_as(&format!(
        "SELECT {o}, {x} FROM {} ORDER BY {o}",
        db.table("floats")
    ))
    .fetch_all(&pool)
    .await
    .expect("floats");
    assert_eq!(
        rows,
        [(0, Some(1.5)), (1, Some(0.0)), (5, Some(2.0)), (6, None)],
        "{name}"
    );
    let (_, zero) = rows[1];
    assert!(
        zero.unwrap().is_sign_positive(),
        "{name}: -0.0 kept its sign"
    );
    // MySQL's LONGTEXT arrives as a blob through sqlx's Any driver.
    let text = |c: &str| match db {
        SinkDb::Mysql { .. } => format!("CAST({c} AS CHAR(2000))"),
        _ => c.to_string(),
    };
    let dead: Vec<(i64, String, String)> = sqlx::query_as(&format!(
        "SELECT {o}, {}, {} FROM {} ORDER BY {o}",
        text("kind"),
        text("reason"),
        db.table("sluice_dead_letters")
    ))
    .fetch_all(&pool)
    .await
    .expect("dead letters");
    let kinds: Vec<(i64, &str)> = dead.iter().map(|(o, k, _)| (*o, k.as_str())).collect();
    assert_eq!(
        kinds,
        [(2, "non-finite"), (3, "non-finite"), (4, "non-finite")],
        "{name}: {dead:?}"
    );
    assert!(
        dead[0].2.contains("column `x`") && dead[0].2.contains("NaN"),
        "{dead:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn floats_follow_one_rule_on_sqlite_postgres_and_mariadb() {
    let dir = TempDir::new("floats-sqlite");
    floats_follow_one_rule(SinkDb::Sqlite(dir.path().join("out.db")), "floats_sqlite").await;
    {
        let _only = Db::Postgres.lock().lock().await;
        floats_follow_one_rule(Db::Postgres.fresh("sluice_pg_floats").await, "floats_pg").await;
    }
    let _only = Db::Mysql.lock().lock().await;
    floats_follow_one_rule(Db::Mysql.fresh("sluice_my_floats").await, "floats_my").await;
}

/// A `batches` table made by an older sluice (no `settings` column) gets
/// the column at the next start, in every dialect: the old rows keep an
/// empty value, new batches record their settings, and `verify` checks the
/// new batches. So does a `dead_letters` table without `record_timestamp`.
async fn older_lineage_table_is_migrated(db: SinkDb, name: &str) {
    create_topic(shared_broker(), name, 1);
    produce(shared_broker(), name, &numbered("old", 200, 1));
    let dir = TempDir::new(name);
    let config = db
        .configure(PipelineToml::identity(name, shared_broker(), name, 50))
        .write(dir.path());
    run_ok(&config);
    let batches = db.table("sluice_batches");
    let pool = db.pool().await;
    sqlx::raw_sql(&format!("ALTER TABLE {batches} DROP COLUMN settings"))
        .execute(&pool)
        .await
        .expect("drop the column, as an older sluice made the table");
    let dead_letters = db.table("sluice_dead_letters");
    sqlx::raw_sql(&format!(
        "ALTER TABLE {dead_letters} DROP COLUMN record_timestamp"
    ))
    .execute(&pool)
    .await
    .expect("drop the column, as an older sluice made the table");
    let old_batches = db.committed_batches().await;
    assert!(old_batches > 0);

    produce(shared_broker(), name, &numbered("new", 200, 1));
    let restarted_at = sluice::batch::now_ms();
    run_ok(&config);
    let count = |filter: &str| {
        let sql = format!("SELECT count(*) FROM {batches} WHERE {filter}");
        let db = &db;
        async move { db.scalar(&sql).await.expect("the settings column exists") }
    };
    assert_eq!(count("settings = ''").await, old_batches);
    assert!(count("settings LIKE '%max_memory_mib%'").await > 0);
    let timestamps = format!("SELECT count(*) FROM {dead_letters} WHERE record_timestamp = -1");
    assert_eq!(
        db.scalar(&timestamps)
            .await
            .expect("the record_timestamp column exists"),
        0
    );
    let said = sluice_ok(&[
        "verify",
        config.to_str().unwrap(),
        "--since-ms",
        &restarted_at.to_string(),
    ]);
    assert!(said.contains(" 0 differ"), "{said}");
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn older_lineage_tables_get_the_settings_column_in_every_dialect() {
    let dir = TempDir::new("migrate-sqlite-db");
    let sqlite = SinkDb::Sqlite(dir.path().join("out.db"));
    older_lineage_table_is_migrated(sqlite, "migrate-sqlite").await;
    for which in [Db::Postgres, Db::Mysql] {
        let _serial = which.lock().lock().await;
        let name = format!("migrate_{which:?}").to_lowercase();
        older_lineage_table_is_migrated(which.fresh(&name).await, &name).await;
    }
}
