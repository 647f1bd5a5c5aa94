//! Exactly-once into Postgres and MariaDB under faults: SIGKILL/restart
//! cycles, two owners of the same partitions (static assignment) fencing
//! each other, a database restart in the middle of a run, and replies to
//! `COMMIT` lost on the way back (fault proxy). Every result is compared
//! with an independent `read_committed` read of the input.
//!
//! Tests of one database run one at a time (a restart would disturb the
//! others); each owns its schema/database and topic.

use rand::SeedableRng;
use sluice_tests::proxy::FaultProxy;
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

    /// The test URL with its port replaced (to go through a proxy).
    fn url_via(self, port: u16) -> String {
        let url = match self {
            Db::Postgres => sinks::postgres_url(),
            Db::Mysql => sinks::mysql_url(),
        };
        url.replace(&format!(":{}/", self.port()), &format!(":{port}/"))
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
    create_topic(&broker.brokers, name, PARTITIONS);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xdb);
    let sent = crash::produce_mixed_input(&broker.brokers, name, PARTITIONS, &mut rng);
    assert!(
        sent >= 100_000,
        "needs at least 100k committed records, sent {sent}"
    );
    let db = which.fresh(name).await;
    let dir = TempDir::new(name);
    let config = write_config(
        dir.path(),
        &identity_config_into(name, &broker.brokers, name, &db.sink_toml(), 200),
    );
    let (kills, batches) = crash::kill_loop(&config, &db, 22, &mut rng).await;
    assert!(
        kills >= 20,
        "only {kills} kills before the pipeline finished"
    );
    run_ok(&config);
    let rows = db
        .assert_exactly_once(&broker.brokers, name, PARTITIONS, name)
        .await;
    println!(
        "{which:?}: {kills} SIGKILLs, {batches} batches between kills, {rows} records exactly once"
    );
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
/// range: each range is committed once, the loser rolls back and logs that
/// it was fenced.
async fn two_owners_fence(which: Db, name: &str) {
    let _only = which.lock().lock().await;
    let brokers = shared_broker();
    create_topic(brokers, name, PARTITIONS);
    produce(brokers, name, &numbered(name, 40_000, PARTITIONS));
    let db = which.fresh(name).await;
    let dir = TempDir::new(name);
    let config = identity_config_into(name, brokers, name, &db.sink_toml(), 100).replace(
        "batch_interval_ms = 100",
        &format!("batch_interval_ms = 20\nassign = {{ \"{name}\" = [0, 1, 2, 3] }}"),
    );
    let config = write_config(dir.path(), &config);
    let spawn = || spawn_until_caught_up(&config, "warn", Stdio::piped());
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let logs = format!(
        "{}\n{}",
        String::from_utf8_lossy(&a.stderr),
        String::from_utf8_lossy(&b.stderr)
    );
    assert!(a.status.success() && b.status.success(), "{logs}");
    let fenced = logs
        .matches("fenced: another owner moved the offsets first")
        .count();
    assert!(fenced > 0, "the two owners never collided: {logs}");
    let rows = db
        .assert_exactly_once(brokers, name, PARTITIONS, name)
        .await;
    println!("{which:?}: {fenced} fenced commits rolled back; {rows} records exactly once");
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_fences_a_second_owner_of_the_same_partitions() {
    two_owners_fence(Db::Postgres, "sluice_pg_fence").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_fences_a_second_owner_of_the_same_partitions() {
    two_owners_fence(Db::Mysql, "sluice_my_fence").await;
}

/// The database goes down for 12 s while the pipeline runs; it retries with
/// backoff, re-reads the checkpoint and finishes by itself.
async fn database_restart(which: Db, name: &str) {
    let _only = which.lock().lock().await;
    let brokers = shared_broker();
    create_topic(brokers, name, PARTITIONS);
    produce(brokers, name, &numbered(name, 60_000, PARTITIONS));
    let db = which.fresh(name).await;
    let dir = TempDir::new(name);
    let config = write_config(
        dir.path(),
        &identity_config_into(name, brokers, name, &db.sink_toml(), 100),
    );
    let child = spawn_until_caught_up(&config, "warn", Stdio::piped());
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.committed_batches().await < 5 {
        assert!(
            Instant::now() < deadline,
            "no batches committed within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Down longer than the pool's 10 s acquire timeout, so the pipeline's
    // own retry with backoff is exercised, not only the pool's waiting.
    which.restart(Duration::from_secs(12));
    let before = db.committed_batches().await;
    let out = child.wait_with_output().expect("wait");
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert!(
        logs.contains("retrying"),
        "the outage was not noticed: {logs}"
    );
    assert!(
        db.committed_batches().await > before,
        "work continued after the restart"
    );
    let rows = db
        .assert_exactly_once(brokers, name, PARTITIONS, name)
        .await;
    println!("{which:?}: restarted after {before} batches; {rows} records exactly once");
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
    let via = db.sink_toml_via(Some(&which.url_via(proxy.port)));
    let dir = TempDir::new(name);
    let config = write_config(
        dir.path(),
        &identity_config_into(name, brokers, name, &via, 200),
    );
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
