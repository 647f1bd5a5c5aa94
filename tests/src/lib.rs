//! Test harness for sluice's integration tests: a Tansu broker per test
//! binary on a free port, topic/produce/read helpers, the `sluice` binary and
//! the plugins built from this repo, and per-test temporary directories.
//!
//! It must not fake anything sluice talks to: brokers and databases are real.
//! The expected results of tests come from an independent `read_committed`
//! read of the input topic ([`read_committed`]), not from what was produced.

pub mod bench;
pub mod config;
pub mod control;
pub mod crash;
pub mod kafka_out;
pub mod markers;
pub mod proxy;
pub mod redis_server;
pub mod reset;
pub mod scenarios;
pub mod sinks;
pub mod tally;
pub mod tls;
pub mod windows;

pub use config::{PipelineToml, Target};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// A component built by `scripts/build-plugins.sh` into `plugins/dist`
/// (from `sdk/rust`, `examples/*/plugin` and `tests/plugins`).
pub fn plugin(name: &str) -> PathBuf {
    let path = repo_root()
        .join("plugins/dist")
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} missing: run scripts/build-plugins.sh",
        path.display()
    );
    path
}

/// The `sluice` binary of this build (built by the test script first).
pub fn sluice_bin() -> PathBuf {
    if let Ok(p) = std::env::var("SLUICE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().expect("exe dir");
    // Tests live in target/<profile>/deps, tools in target/<profile>.
    let profile_dir = if dir.ends_with("deps") {
        dir.parent().expect("profile dir")
    } else {
        dir
    };
    let bin = profile_dir.join("sluice");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build -p sluice` first",
        bin.display()
    );
    bin
}

/// A TCP port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A Tansu broker process on a free port, killed on drop.
pub struct Broker {
    pub brokers: String,
    child: Child,
}

impl Broker {
    /// Starts the transaction-capable Tansu build (memory storage).
    pub fn start() -> Broker {
        Broker::start_with(false)
    }

    /// The broker process's id (benchmarks sample its memory and CPU).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn start_with(die_with_parent: bool) -> Broker {
        let port = free_port();
        Broker::launch(port, port, die_with_parent)
    }

    /// A broker listening in plain text on a port of its own that tells
    /// clients to connect to `advertised` instead (where a TLS proxy
    /// forwards to it): [`Broker::brokers`] is the plain listener.
    pub fn start_behind(advertised: u16) -> Broker {
        Broker::launch(free_port(), advertised, false)
    }

    fn launch(port: u16, advertised: u16, die_with_parent: bool) -> Broker {
        use std::os::unix::process::CommandExt;
        let bin = tansu_bin();
        let url = format!("tcp://127.0.0.1:{port}");
        let advertised = format!("tcp://127.0.0.1:{advertised}");
        let log = std::env::temp_dir().join(format!("sluice-tansu-{port}.log"));
        let mut command = Command::new(bin);
        if die_with_parent {
            // SAFETY: prctl is async-signal-safe; nothing else runs in the child.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let child = command
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::from(std::fs::File::create(&log).expect("log file")))
            .stderr(Stdio::null())
            .spawn()
            .expect("start tansu");
        let brokers = format!("127.0.0.1:{port}");
        wait_for_port(&brokers, "tansu");
        Broker { brokers, child }
    }
}

/// Waits up to 20 s until `what` (a process just started) accepts
/// connections on `addr`.
pub fn wait_for_port(addr: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The broker shared by all tests of one test binary (each test uses its own
/// topics). It dies with the test process (parent-death signal).
pub fn shared_broker() -> &'static str {
    static BROKER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BROKER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        // The spawning thread must outlive the tests: the parent-death signal
        // fires when the thread that spawned the child exits.
        std::thread::spawn(move || {
            let broker = Broker::start_with(true);
            tx.send(broker.brokers.clone()).expect("send");
            std::mem::forget(broker);
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("broker started")
    })
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tansu_bin() -> PathBuf {
    if let Ok(p) = std::env::var("SLUICE_TANSU") {
        return PathBuf::from(p);
    }
    let out = Command::new(repo_root().join("scripts/tansu.sh"))
        .arg("path")
        .output()
        .expect("scripts/tansu.sh path");
    assert!(
        out.status.success(),
        "installing tansu failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).expect("utf8").trim())
}

/// Creates `topic` with `partitions` partitions.
pub fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    create_topic_with(brokers, topic, partitions, &[]);
}

/// [`create_topic`] by a client with `extra` librdkafka properties (TLS).
pub fn create_topic_with(brokers: &str, topic: &str, partitions: i32, extra: &[(&str, &str)]) {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (key, value) in extra {
        config.set(*key, *value);
    }
    let admin: AdminClient<DefaultClientContext> = config.create().expect("admin");
    // A thread of its own: callers may be inside a tokio runtime already.
    let result = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            rt.block_on(admin.create_topics(
                &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            ))
        })
        .join()
        .expect("create_topics thread")
    });
    for r in result.expect("create_topics") {
        r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
    }
}

/// One record to produce.
#[derive(Debug, Clone)]
pub struct Produce {
    pub partition: i32,
    pub key: Option<String>,
    pub value: String,
}

/// An idempotent producer (transactional if `transactional_id` is given).
pub fn producer(
    brokers: &str,
    transactional_id: Option<&str>,
) -> ThreadedProducer<DefaultProducerContext> {
    let mut c = producer_config(brokers, 5);
    if let Some(id) = transactional_id {
        c.set("transactional.id", id);
    }
    c.create().expect("producer")
}

/// The test producers' settings, batching for `linger_ms`.
pub fn producer_config(brokers: &str, linger_ms: u64) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("linger.ms", linger_ms.to_string())
        .set("enable.idempotence", "true");
    c
}

/// A producer thread that keeps sending until finished: chunk after chunk
/// (`chunk(sent so far)`), each flushed, then a pause.
pub struct Producing {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl Producing {
    /// Starts sending `chunk`s to `topic` on the shared broker.
    pub fn start(
        topic: &str,
        pause: Duration,
        chunk: impl Fn(usize) -> Vec<Produce> + Send + 'static,
    ) -> Producing {
        use rdkafka::producer::Producer as _;
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (stopped, topic) = (std::sync::Arc::clone(&stop), topic.to_string());
        let thread = std::thread::spawn(move || {
            let p = producer(shared_broker(), None);
            let mut sent = 0;
            while !stopped.load(Ordering::SeqCst) {
                let records = chunk(sent);
                for r in &records {
                    send(&p, &topic, r);
                }
                p.flush(Duration::from_secs(60)).expect("flush");
                sent += records.len();
                std::thread::sleep(pause);
            }
            sent
        });
        Producing { stop, thread }
    }

    /// Stops after the chunk in flight; returns how many records were sent.
    pub fn finish(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("the producer thread")
    }
}

/// Queues one record, waiting while the producer's queue is full.
pub fn send(p: &ThreadedProducer<DefaultProducerContext>, topic: &str, r: &Produce) {
    let mut rec = BaseRecord::<str, str>::to(topic)
        .partition(r.partition)
        .payload(&r.value);
    if let Some(k) = &r.key {
        rec = rec.key(k);
    }
    let mut rec = rec;
    loop {
        match p.send(rec) {
            Ok(()) => return,
            Err((
                KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                back,
            )) => {
                rec = back;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((e, _)) => panic!("produce: {e}"),
        }
    }
}

/// Produces `records` without a transaction and waits until acknowledged.
pub fn produce(brokers: &str, topic: &str, records: &[Produce]) {
    let p = producer(brokers, None);
    for r in records {
        send(&p, topic, r);
    }
    p.flush(Duration::from_secs(60)).expect("flush");
}

/// Produces `values` (any bytes, UTF-8 or not) to partition 0 of `topic`
/// without a transaction and waits until acknowledged.
pub fn produce_values(brokers: &str, topic: &str, values: &[Vec<u8>]) {
    let p = producer(brokers, None);
    for value in values {
        let mut rec = BaseRecord::<[u8], [u8]>::to(topic)
            .partition(0)
            .payload(value);
        while let Err((e, back)) = p.send(rec) {
            match e {
                KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                    rec = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                e => panic!("produce: {e}"),
            }
        }
    }
    p.flush(Duration::from_secs(60)).expect("flush");
}

/// Produces `records` in one transaction, committed or aborted.
pub fn produce_transaction(
    brokers: &str,
    topic: &str,
    id: &str,
    records: &[Produce],
    commit: bool,
) {
    let p = producer(brokers, Some(id));
    p.init_transactions(Duration::from_secs(30))
        .expect("init_transactions");
    p.begin_transaction().expect("begin");
    for r in records {
        send(&p, topic, r);
    }
    p.flush(Duration::from_secs(60)).expect("flush");
    if commit {
        p.commit_transaction(Duration::from_secs(30))
            .expect("commit");
    } else {
        p.abort_transaction(Duration::from_secs(30)).expect("abort");
    }
}

/// A record as an independent reader sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seen {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub value: String,
}

/// A `read_committed` consumer assigned to every partition of `topic` from
/// the start, reporting partition ends; no consumer group offsets involved.
pub fn committed_reader(brokers: &str, topic: &str, partitions: i32) -> BaseConsumer {
    committed_reader_with(brokers, topic, partitions, &[])
}

/// A [`committed_reader`] with `extra` librdkafka properties.
pub fn committed_reader_with(
    brokers: &str,
    topic: &str,
    partitions: i32,
    extra: &[(&str, &str)],
) -> BaseConsumer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("verify-{}", std::process::id()))
        .set("isolation.level", "read_committed")
        // sluice's own fetch defaults (see `KafkaSource::connect`): without
        // them librdkafka backs fetches off for 1 s at a time.
        .set("max.partition.fetch.bytes", "8388608")
        .set("fetch.queue.backoff.ms", "10")
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    let c: BaseConsumer = config.create().expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    c
}

/// Everything a `read_committed` consumer sees in `topic` (all partitions,
/// from the start until each partition reports its end): the broker's own
/// view of what is committed, used to compute expected results.
pub fn read_committed(brokers: &str, topic: &str, partitions: i32) -> Vec<Seen> {
    read_committed_with(brokers, topic, partitions, &[])
}

/// [`read_committed`] by a client with `extra` librdkafka properties
/// (TLS).
pub fn read_committed_with(
    brokers: &str,
    topic: &str,
    partitions: i32,
    extra: &[(&str, &str)],
) -> Vec<Seen> {
    let mut seen = read_to_end(brokers, topic, partitions, extra, |m| Seen {
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
    });
    seen.sort();
    seen
}

/// Every record of `topic` a [`committed_reader`] delivers until each
/// partition reports its end, each as `take` makes it, in delivery order.
fn read_to_end<T>(
    brokers: &str,
    topic: &str,
    partitions: i32,
    extra: &[(&str, &str)],
    mut take: impl FnMut(&rdkafka::message::BorrowedMessage<'_>) -> T,
) -> Vec<T> {
    let c = committed_reader_with(brokers, topic, partitions, extra);
    let mut done = std::collections::BTreeSet::new();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while done.len() < partitions as usize {
        assert!(
            Instant::now() < deadline,
            "read_committed did not reach the end of {topic}"
        );
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                done.remove(&m.partition());
                seen.push(take(&m));
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                done.insert(p);
            }
            Some(Err(e)) => panic!("read_committed {topic}: {e}"),
            None => {}
        }
    }
    seen
}

/// A record as a `read_committed` reader sees it, headers included.
#[derive(Debug, Clone)]
pub struct Consumed {
    pub partition: i32,
    pub key: Option<String>,
    pub value: String,
    pub headers: std::collections::BTreeMap<String, String>,
}

/// Everything committed in `topic`, in (partition, offset) order, with
/// headers (what a Kafka sink wrote).
pub fn read_consumed(brokers: &str, topic: &str, partitions: i32) -> Vec<Consumed> {
    let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned());
    read_to_end(brokers, topic, partitions, &[], |m| Consumed {
        partition: m.partition(),
        key: text(m.key()),
        value: text(m.payload()).unwrap_or_default(),
        headers: m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (h.key.to_string(), text(h.value).unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "sluice-{name}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a pipeline config into `dir` and returns its path.
pub fn write_config(dir: &Path, text: impl std::fmt::Display) -> PathBuf {
    let path = dir.join("pipeline.toml");
    std::fs::write(&path, text.to_string()).expect("write config");
    path
}

/// Starts `sluice run --until-caught-up CONFIG` with `SLUICE_LOG=log`; its
/// stdout is piped, its stderr goes to `stderr`.
pub fn spawn_until_caught_up(config: &Path, log: &str, stderr: Stdio) -> Child {
    Command::new(sluice_bin())
        .args(["run", "--until-caught-up"])
        .arg(config)
        .env("SLUICE_LOG", log)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn sluice")
}

/// Runs `sluice run CONFIG --until-caught-up` to completion (with a limit).
/// Output is read while the process runs, so verbose logs cannot fill the
/// pipe and stall it.
pub fn run_until_caught_up(config: &Path, limit: Duration) -> std::process::Output {
    let log = std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "warn".into());
    let child = spawn_until_caught_up(config, &log, Stdio::piped());
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output().expect("output"));
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out,
        Err(_) => {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let out = rx.recv().expect("output after kill");
            panic!(
                "sluice did not finish within {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// What a measured run of `sluice run --until-caught-up` left behind.
pub struct MeasuredRun {
    pub success: bool,
    /// Its log (stderr), at the level asked for.
    pub log: String,
    /// The most memory the process, or a compile worker it started, held
    /// resident (`VmHWM`), in MiB.
    pub peak_rss_mib: u64,
}

/// Runs `sluice run CONFIG --until-caught-up` with `SLUICE_LOG=log` to
/// completion and measures its peak memory by sampling
/// ([`control::sluice_sampled`]). Not wait4's rusage: a process inherits
/// the high-water mark of the test process that forked it, and a test
/// process that has read a large table measured its child at ~500 MiB for
/// a run peaking at ~100.
pub fn run_measured(config: &Path, log: &str) -> MeasuredRun {
    let run = control::sluice_sampled_logging(
        &[
            "run".as_ref(),
            "--until-caught-up".as_ref(),
            config.as_os_str(),
        ],
        log,
    );
    MeasuredRun {
        success: run.success,
        log: run.stderr,
        peak_rss_mib: run.peak_rss_mib.max(run.children_peak_rss_mib),
    }
}

/// Runs `sluice run CONFIG --until-caught-up` and asserts it succeeded.
pub fn run_ok(config: &Path) {
    let out = run_until_caught_up(config, Duration::from_secs(300));
    assert!(
        out.status.success(),
        "sluice failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What `sluice run --until-caught-up` says it did when it ends (its
/// `RunStats`, printed as its last line).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    pub batches: u64,
    pub records: u64,
    pub rows: u64,
    pub dead_letters: u64,
    /// Commits rolled back because another owner moved the offsets first.
    pub fenced: u64,
}

impl RunSummary {
    /// The summary line in `output` (a run's stdout or stderr).
    pub fn find(output: &str) -> Option<RunSummary> {
        output.lines().rev().find_map(RunSummary::parse)
    }

    /// `N batches, N records, N rows, N dead letters[, N fenced commits
    /// rolled back]`.
    fn parse(line: &str) -> Option<RunSummary> {
        let mut summary = RunSummary::default();
        let mut named = 0;
        for part in line.trim().split(", ") {
            let (n, what) = part.split_once(' ')?;
            let n: u64 = n.parse().ok()?;
            let field = match what {
                "batches" => &mut summary.batches,
                "records" => &mut summary.records,
                "rows" => &mut summary.rows,
                "dead letters" => &mut summary.dead_letters,
                "fenced commits rolled back" => &mut summary.fenced,
                _ => return None,
            };
            *field = n;
            named += 1;
        }
        (named >= 4).then_some(summary)
    }
}

/// Opens the pipeline's SQLite database.
pub async fn sqlite(path: &Path) -> sqlx::SqlitePool {
    let url = format!("sqlite://{}", path.display());
    // No idle reaper: sqlx 0.8.6's can spin at exit (sluice_sql::pool).
    sluice::sink::sql::pool::pool_options::<sqlx::Sqlite>(1)
        .connect(&url)
        .await
        .expect("open sqlite")
}

/// The one integer `sql` selects from `pool` (a count, a sum).
pub async fn sqlite_count(pool: &sqlx::SqlitePool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

/// Asserts lineage rows form contiguous ranges per partition: each range
/// starts where the previous one ended, with no overlap and no gap.
pub async fn assert_contiguous_lineage(db: &sqlx::SqlitePool, pipeline: &str) {
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT topic, partition, from_offset, until_offset FROM sluice_batch_ranges \
         WHERE pipeline = ? ORDER BY topic, partition, from_offset",
    )
    .bind(pipeline)
    .fetch_all(db)
    .await
    .expect("lineage");
    assert_ranges_contiguous(rows);
}

/// Asserts the ranges of lineage entries as the Redis and Kafka sinks
/// store them (JSON with `ranges: [{topic, partition, from, until}]`) are
/// contiguous per partition ([`assert_ranges_contiguous`]).
pub fn assert_entry_ranges_contiguous<'e>(entries: impl IntoIterator<Item = &'e str>) {
    let mut rows = Vec::new();
    for e in entries {
        let entry: serde_json::Value = serde_json::from_str(e).expect("lineage JSON");
        for r in entry["ranges"].as_array().expect("ranges") {
            rows.push((
                r["topic"].as_str().unwrap().to_string(),
                r["partition"].as_i64().unwrap(),
                r["from"].as_i64().unwrap(),
                r["until"].as_i64().unwrap(),
            ));
        }
    }
    rows.sort();
    assert_ranges_contiguous(rows);
}

/// Asserts lineage ranges `(topic, partition, from, until)`, sorted by
/// topic, partition and `from`, are non-empty and contiguous per partition.
pub fn assert_ranges_contiguous(rows: Vec<(String, i64, i64, i64)>) {
    assert!(!rows.is_empty(), "no lineage rows");
    let mut last: Option<(String, i64, i64)> = None;
    for (topic, partition, from, until) in rows {
        assert!(
            until > from,
            "empty range {topic}[{partition}] {from}..{until}"
        );
        if let Some((t, p, prev_until)) = &last
            && *t == topic
            && *p == partition
        {
            assert_eq!(
                from, *prev_until,
                "lineage gap or overlap in {topic}[{partition}]"
            );
        }
        last = Some((topic, partition, until));
    }
}

/// Config of a pipeline that copies every record of `topic` into the
/// `records` table of the SQLite file `db` with the identity plugin (append
/// mode): the strongest check of exactly-once, one row per delivered record.
pub fn identity_config(
    pipeline: &str,
    brokers: &str,
    topic: &str,
    db: &Path,
    max_records: u32,
) -> PipelineToml {
    sinks::SinkDb::Sqlite(db.to_path_buf()).configure(PipelineToml::identity(
        pipeline,
        brokers,
        topic,
        max_records,
    ))
}

/// An identity pipeline from `input` into the Kafka topic `output`: key
/// and value as they came, the source partition and offset as headers.
pub fn kafka_identity_config(
    pipeline: &str,
    brokers: &str,
    input: &str,
    output: &str,
) -> PipelineToml {
    PipelineToml::new(pipeline, brokers, &[input], &plugin("identity"))
        .sink_url(&format!("kafka://{brokers}"))
        .target(Target::records().kafka(output, "key", "value", &["partition", "offset"]))
}

/// A `records` row as selected: partition, offset, key, value.
pub type RecordRow = (i64, i64, Option<Vec<u8>>, Option<Vec<u8>>);

/// The `records` table of an identity pipeline, in (partition, offset) order.
pub async fn identity_rows(db: &sqlx::SqlitePool) -> Vec<Seen> {
    let rows: Vec<RecordRow> = sqlx::query_as(
        "SELECT partition, \"offset\", key, value FROM records ORDER BY partition, \"offset\"",
    )
    .fetch_all(db)
    .await
    .expect("records table");
    rows.into_iter()
        .map(|(partition, offset, key, value)| Seen {
            partition: partition as i32,
            offset,
            key: key.map(|k| String::from_utf8_lossy(&k).into_owned()),
            value: String::from_utf8_lossy(&value.unwrap_or_default()).into_owned(),
        })
        .collect()
}

/// The stored checkpoint of every partition of `pipeline`.
pub async fn checkpoints(db: &sqlx::SqlitePool, pipeline: &str) -> Vec<(i32, i64)> {
    let rows: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT partition, next_offset FROM sluice_checkpoints WHERE pipeline = ? ORDER BY partition",
    )
    .bind(pipeline)
    .fetch_all(db)
    .await
    .expect("checkpoints");
    rows.into_iter().map(|(p, o)| (p as i32, o)).collect()
}

/// `n` numbered non-transactional records spread over `partitions`.
pub fn numbered(prefix: &str, n: usize, partitions: i32) -> Vec<Produce> {
    (0..n)
        .map(|i| Produce {
            partition: (i as i32) % partitions,
            key: Some(format!("{prefix}-{i}")),
            value: format!("{prefix} value {i}"),
        })
        .collect()
}

/// Runs two processes of `config` (statically assigned the same
/// partitions) to the end at once and returns how many of their commits
/// were fenced; both must succeed.
pub fn race_two_owners(config: &Path) -> u64 {
    let spawn = || spawn_until_caught_up(config, "warn", Stdio::piped());
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(
        a.status.success() && b.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&a.stderr),
        String::from_utf8_lossy(&b.stderr)
    );
    [&a, &b]
        .iter()
        .map(|run| {
            let stdout = String::from_utf8_lossy(&run.stdout);
            RunSummary::find(&stdout).expect("a run summary").fenced
        })
        .sum()
}
