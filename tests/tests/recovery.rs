//! How fast an instance is back at work after it died, and what it finds
//! when partitions come back to it: a SIGKILLed instance restarted with
//! static membership (`source.instance_id`) against one without; a
//! partition returning to an instance that owned it before, with its
//! checkpoint beyond the log end this instance last saw.
//!
//! And six instances over 24 partitions through a scale-up, a rolling
//! restart, a SIGKILL and a SIGSTOP, exactly once, and through a
//! scale-down to two; and the broker defects that shape those tests.
//!
//! Each test has its own topic, pipeline and sink (SQLite file, or Postgres
//! schema).

use rdkafka::consumer::BaseConsumer;
use sluice_tests::control::{Host, Producer, sluice_ok};
use sluice_tests::sinks::SinkDb;
use sluice_tests::{
    PipelineToml, TempDir, create_topic, identity_config, shared_broker, sqlite_count,
};
use std::collections::BTreeMap;
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

    sluice_tests::reset::partition_0_back_to_50(&config, name, name);
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
    let records = async || sqlite_count(&pool, "SELECT count(*) FROM records").await;
    sluice_tests::reset::under_a_running_instance(
        &config,
        dir.path(),
        shared_broker(),
        name,
        250 + 210,
        records,
    )
    .await;
}

/// How many partitions and instances the scale-out test runs.
const SCALE_PARTITIONS: i32 = 24;
const SCALE_INSTANCES: usize = 6;

/// The scale tests' pipeline: identity on `name` into `db`, batches of
/// 500 per partition, the short session, written to `dir`.
fn scale_config(db: &SinkDb, name: &str, dir: &TempDir) -> std::path::PathBuf {
    db.configure(scale_pipeline(name)).write(dir.path())
}

/// The scale tests' pipeline before its sink: identity on `name`,
/// batches of 500 per partition, the short session.
fn scale_pipeline(name: &str) -> PipelineToml {
    PipelineToml::identity(name, shared_broker(), name, 500)
        .short_session()
        // The broker waits this long at most for a member to rejoin a
        // rebalance (a departed one included).
        .source_property("max.poll.interval.ms", "15000")
}

/// The instances of one pipeline, each a static member named `sluice-N`
/// (as a StatefulSet names its pods), each incarnation logging to a file
/// of its own.
struct Fleet<'a> {
    config: &'a Path,
    dir: &'a TempDir,
    hosts: Vec<Option<Host>>,
    incarnations: usize,
}

impl Fleet<'_> {
    /// Starts instance `i` (again).
    fn start(&mut self, i: usize) {
        self.incarnations += 1;
        let log = self
            .dir
            .path()
            .join(format!("sluice-{i}.{}.log", self.incarnations));
        let id = format!("sluice-{i}");
        self.hosts[i] = Some(Host::start_as(self.config, &log, Some(&id)));
    }

    fn host(&self, i: usize) -> &Host {
        self.hosts[i].as_ref().expect("instance running")
    }

    /// Waits until instance `i`'s current incarnation has committed.
    fn wait_committing(&self, i: usize) {
        self.host(i)
            .wait_for_log("batch committed", 1, Duration::from_secs(120));
    }

    /// SIGTERM to instance `i`; it must exit cleanly.
    fn terminate(&mut self, i: usize) {
        self.hosts[i].take().expect("instance running").stop();
    }
}

/// Each partition's commits as seen from the sink: when its checkpoint
/// was seen to move (polled every 50 ms).
struct CommitWatch {
    moved: std::sync::Arc<std::sync::Mutex<BTreeMap<i64, Vec<Instant>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CommitWatch {
    fn start(db: &SinkDb) -> CommitWatch {
        let moved = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let (db, log) = (db.clone(), moved.clone());
        let task = tokio::spawn(async move {
            let mut last = BTreeMap::new();
            loop {
                for (partition, next) in db.checkpoints().await {
                    if last.insert(partition, next) != Some(next) {
                        let mut log = log.lock().unwrap();
                        let marks: &mut Vec<Instant> = log.entry(partition).or_default();
                        marks.push(Instant::now());
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        CommitWatch { moved, task }
    }

    /// Waits until each of the scale tests' partitions has committed after
    /// `since`; panics with `stalled()` after two minutes.
    fn wait_all_moved(&self, since: Instant, stalled: impl Fn() -> String) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let moved = self.moved.lock().unwrap();
            let behind = (0..SCALE_PARTITIONS as i64)
                .filter(|p| moved.get(p).is_none_or(|m| m.last() <= Some(&since)))
                .count();
            drop(moved);
            if behind == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{behind} partitions never committed again\n{}",
                stalled()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The longest any partition went without a commit between `from` and
    /// `to`.
    fn pause(&self, from: Instant, to: Instant) -> Duration {
        let moved = self.moved.lock().unwrap();
        let longest = |seen: &Vec<Instant>| {
            let mut marks: Vec<Instant> = vec![from];
            marks.extend(seen.iter().copied().filter(|t| *t > from && *t < to));
            marks.push(to);
            let gaps = marks.windows(2).map(|w| w[1] - w[0]);
            gaps.max().unwrap_or_default()
        };
        moved.values().map(longest).max().unwrap_or_default()
    }
}

impl Drop for CommitWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A raw librdkafka consumer of `topic` in `group`, with the pipeline's
/// short session (6 s, heartbeats every 500 ms) and rebalance timeout
/// (`max.poll.interval.ms` 15 s); static member `instance` if given;
/// offsets never committed.
fn raw_member(brokers: &str, group: &str, instance: Option<&str>, topic: &str) -> BaseConsumer {
    use rdkafka::consumer::Consumer;
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("max.poll.interval.ms", "15000")
        .set("enable.auto.commit", "false");
    if let Some(instance) = instance {
        config.set("group.instance.id", instance);
    }
    let c: BaseConsumer = config.create().expect("a raw consumer");
    c.subscribe(&[topic]).expect("subscribe");
    c
}

/// The broker's own rebalance time for a group like the pipeline's:
/// `members - 1` raw librdkafka consumers (static members, the same
/// session) own `topic`'s partitions; a last one joins. How long from its
/// subscribe until the group covers every partition again with it in.
fn raw_group_join(brokers: &str, topic: &str, members: usize) -> Duration {
    let group_id = format!("raw-{topic}");
    let consumer = |i: usize| raw_member(brokers, &group_id, Some(&format!("raw-{i}")), topic);
    let mut group: Vec<BaseConsumer> = (0..members - 1).map(consumer).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    settle(&group, deadline, "the raw group never settled");
    let joining = Instant::now();
    group.push(consumer(members - 1));
    settle(
        &group,
        deadline,
        "the raw group never took its last member in",
    );
    joining.elapsed()
}

/// Polls every member of `group` until each owns some partitions and
/// together they own all of the scale tests' topic; panics saying `what`
/// at `deadline`.
fn settle(group: &[BaseConsumer], deadline: Instant, what: &str) {
    use rdkafka::consumer::Consumer;
    loop {
        for c in group {
            let _ = c.poll(Duration::from_millis(10));
        }
        let owned: Vec<usize> = group
            .iter()
            .map(|c| c.assignment().map(|a| a.count()).unwrap_or(0))
            .collect();
        if owned.iter().all(|n| *n > 0) && owned.iter().sum::<usize>() == SCALE_PARTITIONS as usize
        {
            return;
        }
        assert!(Instant::now() < deadline, "{what}");
    }
}

/// Six instances of one pipeline over 24 partitions into Postgres, under
/// steady input, taken through what a StatefulSet does to them: a start
/// at 2, a scale-up to 6, a rolling restart (SIGTERM each in turn, the
/// same member name back), one SIGKILL, one SIGSTOP past the session
/// timeout (a zombie, thawed). Every record lands once (against an
/// independent `read_committed` read), the lineage stays contiguous, and
/// the longest pause in the group's commits at each step is printed
/// beside the broker's own rebalance time for a raw consumer group of the
/// same size (BENCHMARKS.md).
///
/// The scale-down is `six_instances_scaled_down_to_two_land_every_record_once`,
/// with dynamic members: static ones that leave are never expired here
/// (`broker_defect_a_departed_static_member_is_never_expired`).
#[tokio::test(flavor = "multi_thread")]
async fn six_instances_through_rolling_restart_scale_up_and_faults_land_every_record_once() {
    let name = "scale_out";
    let brokers = shared_broker();
    create_topic(brokers, name, SCALE_PARTITIONS);
    let raw_join = raw_group_join(brokers, name, SCALE_INSTANCES);
    let db = SinkDb::fresh_postgres(name).await;
    let dir = TempDir::new(name);
    let config = scale_config(&db, name, &dir);
    let producing = Producer::start(brokers, name, SCALE_PARTITIONS);
    let commits = CommitWatch::start(&db);
    let mut fleet = Fleet {
        config: &config,
        dir: &dir,
        hosts: (0..SCALE_INSTANCES).map(|_| None).collect(),
        incarnations: 0,
    };
    let step = |what: &str, started: Instant| {
        commits.wait_all_moved(Instant::now(), String::new);
        let pause = commits.pause(started, Instant::now());
        println!("{name}: {what}: longest pause in a partition's commits {pause:?}");
    };

    let started = Instant::now();
    for i in 0..2 {
        fleet.start(i);
    }
    for i in 0..2 {
        fleet.wait_committing(i);
    }
    step("start 2", started);

    let started = Instant::now();
    for i in 2..SCALE_INSTANCES {
        fleet.start(i);
    }
    for i in 2..SCALE_INSTANCES {
        fleet.wait_committing(i);
    }
    step("scale up 2 -> 6", started);

    let started = Instant::now();
    for i in 0..SCALE_INSTANCES {
        let one = Instant::now();
        fleet.terminate(i);
        fleet.start(i);
        fleet.wait_committing(i);
        step(&format!("rolling restart of sluice-{i}"), one);
    }
    step("rolling restart, all 6", started);

    let started = Instant::now();
    fleet.host(2).signal(libc::SIGKILL);
    fleet.hosts[2] = None;
    fleet.start(2);
    fleet.wait_committing(2);
    step("SIGKILL of sluice-2, restarted", started);

    let started = Instant::now();
    fleet.host(3).signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(10));
    fleet.host(3).signal(libc::SIGCONT);
    let commits_of_3 = fleet.host(3).log().matches("batch committed").count();
    fleet.host(3).wait_for_log(
        "batch committed",
        commits_of_3 + 1,
        Duration::from_secs(120),
    );
    step("SIGSTOP of sluice-3 for 10 s, thawed", started);

    let produced = producing.stop();
    sluice_tests::control::wait_for_rows(&db, produced, Duration::from_secs(180)).await;
    for i in 0..SCALE_INSTANCES {
        fleet.terminate(i);
    }
    drop(commits);
    let checked = db
        .assert_exactly_once(brokers, name, SCALE_PARTITIONS, name)
        .await;
    assert_eq!(checked, produced);
    println!(
        "{name}: {checked} records exactly once over {} incarnations; a raw group of {SCALE_INSTANCES} takes a joining member in {raw_join:?}",
        fleet.incarnations
    );
}

/// Tansu keeps a static member that closed (no LeaveGroup, as KIP-345
/// has it) in the group for good: Kafka removes it after its session
/// timeout and hands its partitions over; here, for 20 s past a 6 s
/// timeout, the one member left never owns more than its own share. When
/// this fails the broker is fixed: give the static scale-out test the
/// scale-down (now a test of dynamic members of its own); update
/// docs/operations.md.
#[test]
fn broker_defect_a_departed_static_member_is_never_expired() {
    use rdkafka::consumer::Consumer;
    let brokers = shared_broker();
    let topic = "static_leave";
    create_topic(brokers, topic, 6);
    let consumer = |i: usize| raw_member(brokers, topic, Some(&format!("member-{i}")), topic);
    let owned = |c: &BaseConsumer| c.assignment().map(|a| a.count()).unwrap_or(0);
    let mut group: Vec<BaseConsumer> = (0..3).map(consumer).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !group.iter().all(|c| owned(c) == 2) {
        assert!(Instant::now() < deadline, "the group never settled");
        for c in &group {
            let _ = c.poll(Duration::from_millis(10));
        }
    }
    // Closing a member waits for the broker's answer to its leaving,
    // which this broker may never send (a close was seen to hang for
    // good): the departed members, and at the end the one left, are
    // closed on threads of their own, never waited for.
    let departed: Vec<BaseConsumer> = group.drain(1..).collect();
    std::thread::spawn(move || drop(departed));
    let left = Instant::now();
    // The most the member left owns at any moment: a rebalance of its own
    // (its session lapsing on a busy broker) may leave it with none for a
    // while, which says nothing about the departed members.
    let mut most = owned(&group[0]);
    while left.elapsed() < Duration::from_secs(20) {
        let _ = group[0].poll(Duration::from_millis(10));
        most = most.max(owned(&group[0]));
    }
    std::thread::spawn(move || drop(group));
    assert_eq!(
        most, 2,
        "the departed static members' partitions were handed over: the broker defect is gone"
    );
}

/// Tansu v0.6.0 never replaces a group's leader that leaves while the
/// group is rebalancing (its `Forming` state): the leave removes the
/// member but keeps it as the leader, so the members left are told to
/// wait for an assignment that nobody will send, for good (only an
/// expired leader is cleared, and a member that left never expires).
/// Kafka elects a new leader. Three raw dynamic members; the first to
/// join is the leader; one leaves (the group starts rebalancing), then
/// the leader leaves before it rejoins: the one member left is never
/// assigned anything in 20 s. When this fails the broker is fixed: the
/// default `leave_group_on_shutdown = true` is then safe on it too
/// (docs/operations.md).
#[test]
fn broker_defect_a_leader_leaving_a_rebalance_wedges_the_group() {
    use rdkafka::consumer::Consumer;
    let brokers = shared_broker();
    let topic = "leader_leave";
    create_topic(brokers, topic, 6);
    let consumer = || raw_member(brokers, topic, None, topic);
    let owned = |c: &BaseConsumer| c.assignment().map(|a| a.count()).unwrap_or(0);
    let poll_until = |group: &[BaseConsumer], done: &dyn Fn(&[BaseConsumer]) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(group) {
            assert!(Instant::now() < deadline, "the group never settled");
            for c in group {
                let _ = c.poll(Duration::from_millis(10));
            }
        }
    };
    let mut group = vec![consumer()];
    poll_until(&group, &|g| owned(&g[0]) == 6);
    group.push(consumer());
    group.push(consumer());
    poll_until(&group, &|g| g.iter().all(|c| owned(c) == 2));
    let leader = group.remove(0);
    drop(group.pop());
    drop(leader);
    let left = Instant::now();
    let mut most = 0;
    while left.elapsed() < Duration::from_secs(20) {
        let _ = group[0].poll(Duration::from_millis(10));
        most = most.max(owned(&group[0]));
    }
    assert!(
        most < 6,
        "the member left took every partition: the broker defect is gone"
    );
}

/// The broker's own time for the scale-down: a raw group of
/// `SCALE_INSTANCES` dynamic members settles, all but two close in a row;
/// how long from the first close until the two cover every partition.
fn raw_group_scale_down(brokers: &str, topic: &str) -> Duration {
    let group_id = format!("raw-down-{topic}");
    let mut group: Vec<BaseConsumer> = (0..SCALE_INSTANCES)
        .map(|_| raw_member(brokers, &group_id, None, topic))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    settle(&group, deadline, "the raw group never settled");
    let leaving = Instant::now();
    group.truncate(2);
    settle(
        &group,
        deadline,
        "the raw group's last two never took every partition",
    );
    leaving.elapsed()
}

/// The scale-down a Deployment (or a StatefulSet on a broker that expires
/// departed static members) does: six instances, dynamic members, under
/// steady input; four stop with SIGTERM in a row and the two left take
/// every partition over. Every record lands once, the lineage stays
/// contiguous, and the longest pause in commits is printed beside a raw
/// group's own time for the same scale-down.
///
/// Dynamic members, in a group of their own: on this broker a static
/// member that closed is never expired and keeps its share of the
/// partitions (`broker_defect_a_departed_static_member_is_never_expired`),
/// so static instances cannot scale down here. And the instances do not
/// leave the group (`leave_group_on_shutdown = false`), they expire: with
/// LeaveGroup, the group's leader among the four leaving while the group
/// rebalanced wedged it for good in about half the runs
/// (`broker_defect_a_leader_leaving_a_rebalance_wedges_the_group`).
#[tokio::test(flavor = "multi_thread")]
async fn six_instances_scaled_down_to_two_land_every_record_once() {
    let name = "scale_down";
    let brokers = shared_broker();
    create_topic(brokers, name, SCALE_PARTITIONS);
    let raw_down = raw_group_scale_down(brokers, name);
    let db = SinkDb::fresh_postgres(name).await;
    let dir = TempDir::new(name);
    let config = db
        .configure(scale_pipeline(name).source("leave_group_on_shutdown", false))
        .write(dir.path());
    let producing = Producer::start(brokers, name, SCALE_PARTITIONS);
    let commits = CommitWatch::start(&db);
    let mut hosts: Vec<Host> = (0..SCALE_INSTANCES)
        .map(|i| Host::start(&config, &dir.path().join(format!("sluice-{i}.log"))))
        .collect();
    for host in &hosts {
        host.wait_for_log("batch committed", 1, Duration::from_secs(120));
    }
    let started = Instant::now();
    while hosts.len() > 2 {
        hosts.pop().expect("an instance").stop();
    }
    // Every partition commits again, the departed ones' too once the
    // survivors own them; a stall shows both survivors' logs.
    commits.wait_all_moved(Instant::now(), || {
        format!(
            "survivor 0:\n{}\nsurvivor 1:\n{}",
            hosts[0].log(),
            hosts[1].log()
        )
    });
    let pause = commits.pause(started, Instant::now());
    let produced = producing.stop();
    sluice_tests::control::wait_for_rows(&db, produced, Duration::from_secs(180)).await;
    for host in hosts {
        host.stop();
    }
    drop(commits);
    let checked = db
        .assert_exactly_once(brokers, name, SCALE_PARTITIONS, name)
        .await;
    assert_eq!(checked, produced);
    println!(
        "{name}: 6 -> 2: longest pause in a partition's commits {pause:?}; a raw group of {SCALE_INSTANCES} \
         scales down to 2 in {raw_down:?}; {checked} records exactly once"
    );
}
