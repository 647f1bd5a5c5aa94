//! Scenarios every exactly-once sink must pass, written once over
//! [`TestSink`] and run per sink kind from that sink's test binary: the
//! kill loop (SIGKILL at random moments, then a final run), two owners of
//! the same partitions racing for every range, a module's lifecycle under
//! load (deploy, hot swap, rollback, `verify`), and bad configs refused
//! writing nothing.
//!
//! It must not know a sink's layout: a [`TestSink`] points a config at
//! itself and checks its own output against the independent
//! `read_committed` read the scenario hands it.

use crate::control::{Host, Producer, cli_ok, control_port, sluice_ok};
use crate::{PipelineToml, RunSummary, Seen, TempDir, crash, plugin, produce, read_committed};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// A sink an identity pipeline can commit into, as the scenarios see it.
#[allow(async_fn_in_trait)] // used by generic tests only, never boxed
pub trait TestSink {
    /// What messages call it (`postgres`, `redis`, ...).
    fn label(&self) -> String;

    /// `config` (an identity pipeline's) with its `[sink]` pointed here
    /// and what this sink needs to write the `records` target.
    fn configure(&self, config: PipelineToml) -> PipelineToml;

    /// A count that rises with every batch `pipeline` commits (its
    /// batches, or the offsets its commits moved).
    async fn progress(&self, pipeline: &str) -> i64;

    /// What the identity pipeline wrote here: per output record, the input
    /// record it came from as written (partition, offset, key, value), in
    /// (partition, offset) order, duplicates kept.
    async fn identity_output(&self) -> Vec<Seen>;

    /// Asserts `pipeline`'s lineage ranges are contiguous per partition
    /// (no batch committed twice, none skipped) and no dead letters are
    /// stored; returns how many batches the lineage holds.
    async fn assert_lineage(&self, pipeline: &str) -> usize;

    /// Asserts this sink holds `expected` (the committed input, read
    /// independently) each record exactly once, as the identity plugin
    /// wrote it, with contiguous lineage and no dead letters. Returns how
    /// many records it checked. A sink checks more where it writes more.
    async fn assert_identity_exactly_once(&self, pipeline: &str, expected: &[Seen]) -> usize {
        let actual = self.identity_output().await;
        assert_eq!(
            actual.len(),
            expected.len(),
            "{}: record count differs from the committed input",
            self.label()
        );
        assert!(
            actual == expected,
            "{}: records differ from the read_committed input",
            self.label()
        );
        self.assert_lineage(pipeline).await;
        actual.len()
    }
}

/// The kill loop: at least 100k committed records (plain, in committed
/// and in aborted transactions) on a fresh `name` topic of 4 partitions,
/// `sluice` SIGKILLed `kills` times 0-60 ms after a batch landed, then run
/// to the end: the sink holds the committed input exactly once, and
/// `verify` replays every batch alike.
pub struct KillLoop<'a> {
    /// The broker (its own: the loop's input is large).
    pub brokers: &'a str,
    /// The pipeline and its input topic.
    pub name: &'a str,
    /// Seeds the input's transaction sizes and the kill moments.
    pub seed: u64,
    /// How many kills are tried; at least [`MIN_KILLS`] must happen.
    pub kills: usize,
    /// `max_records_per_partition`: small, so the input outlasts the kills.
    pub max_records: u32,
    /// `batch_interval_ms`.
    pub batch_interval_ms: u64,
    /// Read by static assignment (no group joins between kills) rather
    /// than as a group member.
    pub assigned: bool,
}

/// The kills a kill loop must get in before its pipeline finishes.
pub const MIN_KILLS: usize = 20;

/// How many partitions the kill loop's topic has.
pub const PARTITIONS: i32 = 4;

impl KillLoop<'_> {
    /// Runs the loop against `sink`; returns the records checked.
    pub async fn run(&self, sink: &impl TestSink) -> usize {
        use rand::SeedableRng;
        let (brokers, name) = (self.brokers, self.name);
        crate::create_topic(brokers, name, PARTITIONS);
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed);
        let sent = crash::produce_mixed_input(brokers, name, PARTITIONS, &mut rng);
        assert!(
            sent >= 100_000,
            "needs at least 100k committed records, sent {sent}"
        );
        let dir = TempDir::new(name);
        let mut config = PipelineToml::identity(name, brokers, name, self.max_records)
            .batch_interval_ms(self.batch_interval_ms);
        if self.assigned {
            config = config.assign(name, &[0, 1, 2, 3]);
        }
        let config = sink.configure(config).write(dir.path());
        let (kills, progress) = crash::kill_loop(
            &config,
            async || sink.progress(name).await,
            self.kills,
            &mut rng,
        )
        .await;
        assert!(
            kills >= MIN_KILLS,
            "{}: only {kills} kills before the pipeline finished",
            sink.label()
        );
        crate::run_ok(&config);
        let expected = read_committed(brokers, name, PARTITIONS);
        let checked = sink.assert_identity_exactly_once(name, &expected).await;
        let verified = sluice_ok(&["verify", config.to_str().unwrap()]);
        let summary = verified.lines().last().unwrap_or_default();
        assert!(
            summary.contains(" 0 differ") && !summary.contains("verified 0 batches"),
            "{}: verify after the kills: {verified}",
            sink.label()
        );
        println!(
            "{}: {kills} SIGKILLs (progress {progress} by the last); {checked} records exactly once; {summary}",
            sink.label()
        );
        checked
    }
}

/// Two processes statically assigned the same partitions race for every
/// range of `records` numbered records: each range lands once, the loser
/// of each race rolls back (both runs' summaries count those commits).
pub struct TwoOwners<'a> {
    pub brokers: &'a str,
    /// The pipeline and its input topic.
    pub name: &'a str,
    pub records: usize,
    pub partitions: i32,
    pub max_records: u32,
    pub batch_interval_ms: u64,
}

impl TwoOwners<'_> {
    /// Runs both owners to the end against `sink`; returns how many
    /// commits were fenced.
    pub async fn run(&self, sink: &impl TestSink) -> u64 {
        let (brokers, name) = (self.brokers, self.name);
        crate::create_topic(brokers, name, self.partitions);
        produce(
            brokers,
            name,
            &crate::numbered(name, self.records, self.partitions),
        );
        let dir = TempDir::new(name);
        let all: Vec<i32> = (0..self.partitions).collect();
        let config = PipelineToml::identity(name, brokers, name, self.max_records)
            .batch_interval_ms(self.batch_interval_ms)
            .assign(name, &all);
        let config = sink.configure(config).write(dir.path());
        // Their logs (at `SLUICE_TEST_LOG`, warn by default) are kept in
        // the system's temp directory, for the failure of a looped run.
        let level = std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "warn".into());
        let spawn = || crate::spawn_until_caught_up(&config, &level, Stdio::piped());
        let (a, b) = (spawn(), spawn());
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        for (owner, run) in [("a", &a), ("b", &b)] {
            let kept = std::env::temp_dir().join(format!("sluice-{name}-owner-{owner}.log"));
            let _ = std::fs::write(kept, &run.stderr);
        }
        let logs = format!(
            "{}\n{}",
            String::from_utf8_lossy(&a.stderr),
            String::from_utf8_lossy(&b.stderr)
        );
        assert!(a.status.success() && b.status.success(), "{logs}");
        let fenced: u64 = [&a, &b]
            .iter()
            .map(|run| {
                let stdout = String::from_utf8_lossy(&run.stdout);
                RunSummary::find(&stdout)
                    .unwrap_or_else(|| panic!("no run summary in {stdout:?}"))
                    .fenced
            })
            .sum();
        assert!(fenced > 0, "the two owners never collided: {logs}");
        let expected = read_committed(brokers, name, self.partitions);
        let checked = sink.assert_identity_exactly_once(name, &expected).await;
        println!(
            "{}: {fenced} fenced commits rolled back; {checked} records exactly once",
            sink.label()
        );
        fenced
    }
}

/// A module's lifecycle under load: an identity pipeline with its control
/// API runs while records keep coming; `stamp` (which prefixes values with
/// `v2:`) is deployed and activated, then rolled back. Every record lands
/// once, written by the version its batch ran (some stamped, some not),
/// the lineage is contiguous and `verify` replays every batch alike.
pub struct Lifecycle<'a> {
    pub brokers: &'a str,
    /// The pipeline and its input topic (2 partitions).
    pub name: &'a str,
    pub max_records: u32,
}

/// What a lifecycle run leaves for a sink's own further checks.
pub struct LifecycleRun {
    /// Holds the config (and the state store, where it is a local file).
    pub dir: TempDir,
    pub config: PathBuf,
    /// Batches `verify` replayed.
    pub batches: usize,
}

impl Lifecycle<'_> {
    pub async fn run(&self, sink: &impl TestSink) -> LifecycleRun {
        let (brokers, name) = (self.brokers, self.name);
        crate::create_topic(brokers, name, 2);
        let dir = TempDir::new(name);
        let (port, url) = control_port();
        let config = sink
            .configure(PipelineToml::identity(
                name,
                brokers,
                name,
                self.max_records,
            ))
            .control(port, 1 << 25)
            .write(dir.path());
        let host = Host::start(&config, &dir.path().join("host.log"));
        host.wait_for_api(port);
        let producing = Producer::start(brokers, name, 2);
        host.wait_for_metric("sluice_batches_total", 3.0, Duration::from_secs(90));
        let stamp = plugin("stamp").display().to_string();
        let deploy = [
            "deploy",
            &stamp,
            "--params",
            r#"{"tag":"v2:"}"#,
            "--activate",
        ];
        let out = cli_ok(&url, &deploy);
        assert!(out.contains("activated version 2"), "{out}");
        host.wait_for_metric("sluice_module_swaps_total", 1.0, Duration::from_secs(30));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let out = cli_ok(&url, &["rollback"]);
        assert!(out.contains("activated version 3"), "{out}");
        let versions = cli_ok(&url, &["versions"]);
        assert!(versions.contains("(active)"), "{versions}");
        host.wait_for_metric("sluice_module_swaps_total", 2.0, Duration::from_secs(30));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let produced = producing.stop();
        let limit = Duration::from_secs(120);
        host.wait_for_metric("sluice_records_in_total", produced as f64, limit);
        let status = cli_ok(&url, &["status"]);
        let identity = sluice::batch::sha256_hex(&std::fs::read(plugin("identity")).unwrap());
        assert!(
            status.contains(&identity),
            "the rollback runs identity: {status}"
        );
        host.stop();

        let expected = read_committed(brokers, name, 2);
        assert_eq!(expected.len(), produced);
        let mut stamped = 0;
        let output: Vec<Seen> = sink
            .identity_output()
            .await
            .into_iter()
            .map(|mut seen| {
                if let Some(value) = seen.value.strip_prefix("v2:") {
                    seen.value = value.to_string();
                    stamped += 1;
                }
                seen
            })
            .collect();
        assert!(
            stamped > 0 && stamped < output.len(),
            "{}: both versions wrote records ({stamped} of {} stamped)",
            sink.label(),
            output.len()
        );
        assert_eq!(
            output.len(),
            expected.len(),
            "{}: record count",
            sink.label()
        );
        assert!(output == expected, "{}: records differ", sink.label());
        let batches = sink.assert_lineage(name).await;
        let verified = sluice_ok(&["verify", config.to_str().unwrap()]);
        assert!(
            verified.contains(&format!(
                "verified {batches} batches: {batches} match, 0 differ"
            )),
            "{verified}"
        );
        println!(
            "{}: {produced} records, {stamped} by the swapped-in version; {verified}",
            sink.label()
        );
        LifecycleRun {
            dir,
            config,
            batches,
        }
    }
}

/// Configs broken in ways every sink kind refuses (a field no kind has, a
/// bound crossed, a target without columns): `check` and `run` both refuse
/// each, saying what is wrong, and the sink holds nothing afterwards,
/// though the topic has records to write.
pub struct BadConfigs<'a> {
    pub brokers: &'a str,
    /// The pipeline and its input topic.
    pub name: &'a str,
}

/// A change that breaks a config, and what the refusal must say.
type Breakage = (fn(PipelineToml) -> PipelineToml, &'static str);

impl BadConfigs<'_> {
    const CASES: [Breakage; 3] = [
        (|c| c.sink("colour", "red"), "unknown field `colour`"),
        (
            |c| c.sink("lock_timeout_ms", 0),
            "`sink.lock_timeout_ms` = 0 is outside",
        ),
        (
            |c| c.targets(|t| t.field("columns", toml::Table::new())),
            "target `records` declares no columns",
        ),
    ];

    pub async fn run(&self, sink: &impl TestSink) {
        let (brokers, name) = (self.brokers, self.name);
        crate::create_topic(brokers, name, 1);
        produce(brokers, name, &crate::numbered(name, 100, 1));
        let dir = TempDir::new(name);
        for (break_it, says) in Self::CASES {
            let good = sink.configure(PipelineToml::identity(name, brokers, name, 100));
            let config = break_it(good).write(dir.path());
            for command in [&["check"][..], &["run", "--until-caught-up"]] {
                let out = std::process::Command::new(crate::sluice_bin())
                    .args(command)
                    .arg(&config)
                    .output()
                    .expect("run sluice");
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(
                    !out.status.success(),
                    "{}: {command:?} accepted it",
                    sink.label()
                );
                assert!(
                    err.contains(says),
                    "{}: expected `{says}` in: {err}",
                    sink.label()
                );
            }
        }
        assert_eq!(
            sink.progress(name).await,
            0,
            "{}: a batch landed",
            sink.label()
        );
        assert!(
            sink.identity_output().await.is_empty(),
            "{}: something was written",
            sink.label()
        );
    }
}
