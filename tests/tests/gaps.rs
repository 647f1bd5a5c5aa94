//! Offset gaps, impossible checkpoints and hostile records and modules,
//! through the `sluice` binary.
//!
//! Ranges end by consumer position, so empty partitions, ranges ending on a
//! transaction marker, aborted records in the middle and ranges with zero
//! records all commit correctly; a checkpoint outside the log fails loudly,
//! naming partition and offsets, with nothing written. A record that fails
//! the module on its own becomes one dead letter of its kind; a module that
//! fails on every record is stopped within its isolation budget; shutdown
//! interrupts an isolation at once; the host's memory stays bounded.

use sluice_tests::control::sluice_ok;
use sluice_tests::*;
use std::time::Duration;

async fn run_identity(pipeline: &str, topic: &str, partitions: i32) -> (TempDir, sqlx::SqlitePool) {
    let brokers = shared_broker();
    let dir = TempDir::new(pipeline);
    let db = dir.path().join("out.db");
    let config = write_config(
        dir.path(),
        identity_config(pipeline, brokers, topic, &db, 1000),
    );
    run_ok(&config);
    let _ = partitions;
    let pool = sqlite(&db).await;
    (dir, pool)
}

fn one(partition: i32, value: &str) -> Produce {
    Produce {
        partition,
        key: None,
        value: value.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn aborted_records_in_the_middle_and_range_ending_on_a_marker() {
    let brokers = shared_broker();
    let topic = "gap-middle";
    create_topic(brokers, topic, 1);
    produce(brokers, topic, &[one(0, "a"), one(0, "b")]);
    produce_transaction(
        brokers,
        topic,
        "gap-mid-abort",
        &[one(0, "x"), one(0, "y")],
        false,
    );
    produce(brokers, topic, &[one(0, "c")]);
    // The log ends on this transaction's commit marker.
    produce_transaction(
        brokers,
        topic,
        "gap-mid-commit",
        &[one(0, "d"), one(0, "e")],
        true,
    );

    let (_dir, pool) = run_identity("gap-middle", topic, 1).await;
    let expected = read_committed(brokers, topic, 1);
    assert_eq!(identity_rows(&pool).await, expected);
    assert!(expected.iter().any(|s| s.value == "e"));
    // The checkpoint moved past the final commit marker: last record + 2.
    let last = expected.iter().map(|s| s.offset).max().unwrap();
    assert_eq!(checkpoints(&pool, "gap-middle").await, vec![(0, last + 2)]);
    assert_contiguous_lineage(&pool, "gap-middle").await;
}

/// `verify` of two batches that are not one after the other (as a
/// selection, or an aborted lineage entry on Kafka, makes them). Before the
/// replay read ahead, reading the first paused the partition past its
/// range and the second was a seek into the paused partition, which read
/// nothing more until the read limit and failed with "could not read
/// back"; now the first read keeps reading ahead and the second is served
/// from what it kept (the seek into a paused partition is left for topics
/// larger than the read-ahead).
#[tokio::test(flavor = "multi_thread")]
async fn verify_reads_batches_that_are_not_contiguous() {
    let brokers = shared_broker();
    let topic = "gap-verify-skip";
    create_topic(brokers, topic, 2);
    produce(brokers, topic, &numbered(topic, 4_000, 2));
    let dir = TempDir::new(topic);
    let db = dir.path().join("out.db");
    let config = write_config(dir.path(), identity_config(topic, brokers, topic, &db, 200));
    run_ok(&config);
    let pool = sqlite(&db).await;
    let batches: Vec<String> = sqlx::query_scalar(
        "SELECT batch_id FROM sluice_batch_ranges WHERE partition = 0 ORDER BY from_offset",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(batches.len(), 10, "{batches:?}");
    // Far enough apart that reading the first does not reach the second.
    let said = sluice_ok(&[
        "verify",
        config.to_str().unwrap(),
        "--batch",
        &batches[1],
        "--batch",
        &batches[9],
    ]);
    assert!(
        said.contains("verified 2 batches: 2 match, 0 differ"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn empty_partition_and_zero_record_range() {
    let brokers = shared_broker();
    let topic = "gap-empty";
    create_topic(brokers, topic, 3);
    produce(brokers, topic, &[one(0, "only")]);
    // Partition 1 holds nothing but an aborted transaction and its marker:
    // its range moves the offset but may carry zero records.
    produce_transaction(brokers, topic, "gap-empty-abort", &[one(1, "gone")], false);
    // Partition 2 stays empty.

    let (_dir, pool) = run_identity("gap-empty", topic, 3).await;
    let expected = read_committed(brokers, topic, 3);
    assert_eq!(identity_rows(&pool).await, expected);
    let cps = checkpoints(&pool, "gap-empty").await;
    assert_eq!(cps.iter().find(|(p, _)| *p == 0).map(|c| c.1), Some(1));
    // Record at offset 0 and the abort marker at 1: the range is 0..2.
    assert_eq!(cps.iter().find(|(p, _)| *p == 1).map(|c| c.1), Some(2));
    assert!(
        cps.iter().all(|(p, _)| *p != 2),
        "an empty partition gets no range"
    );
    if !expected.iter().any(|s| s.partition == 1) {
        let records: i64 = sqlx::query_scalar(
            "SELECT records FROM sluice_batch_ranges WHERE pipeline = 'gap-empty' AND partition = 1",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            records, 0,
            "the range over an aborted transaction holds no records"
        );
    }
}

async fn set_checkpoint(pool: &sqlx::SqlitePool, pipeline: &str, partition: i32, offset: i64) {
    sqlx::query(
        "UPDATE sluice_checkpoints SET next_offset = ? WHERE pipeline = ? AND partition = ?",
    )
    .bind(offset)
    .bind(pipeline)
    .bind(partition)
    .execute(pool)
    .await
    .unwrap();
}

async fn table_counts(pool: &sqlx::SqlitePool) -> (i64, i64) {
    let rows = sqlx::query_scalar("SELECT count(*) FROM records")
        .fetch_one(pool)
        .await
        .unwrap();
    let batches = sqlx::query_scalar("SELECT count(*) FROM sluice_batches")
        .fetch_one(pool)
        .await
        .unwrap();
    (rows, batches)
}

/// A checkpoint beyond the log end is what a topic that was deleted and
/// re-created leaves behind. Tansu's memory storage cannot delete a topic's
/// data and keep the broker, so the test moves the stored checkpoint past
/// the end instead: sluice sees exactly the same situation.
#[tokio::test(flavor = "multi_thread")]
async fn checkpoint_beyond_log_end_fails_loudly_and_writes_nothing() {
    let brokers = shared_broker();
    let topic = "gap-beyond";
    create_topic(brokers, topic, 1);
    produce(brokers, topic, &numbered("b", 10, 1));
    let (dir, pool) = run_identity("gap-beyond", topic, 1).await;
    set_checkpoint(&pool, "gap-beyond", 0, 5_000).await;
    produce(brokers, topic, &numbered("more", 5, 1));
    let before = table_counts(&pool).await;

    let config = dir.path().join("pipeline.toml");
    let out = run_until_caught_up(&config, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sluice must fail");
    assert!(
        stderr.contains("gap-beyond[0]"),
        "error names the partition: {stderr}"
    );
    assert!(stderr.contains("5000"), "error names the offset: {stderr}");
    assert!(stderr.contains("beyond the log end"), "{stderr}");
    assert_eq!(table_counts(&pool).await, before, "nothing may be written");
}

/// A checkpoint below the log start is what retention or DeleteRecords
/// leaves behind. The test asks the broker to delete records; where the
/// broker refuses DeleteRecords it moves the stored checkpoint below the log
/// start instead (to -5, below offset 0), which sluice must treat the same.
#[tokio::test(flavor = "multi_thread")]
async fn checkpoint_below_log_start_fails_loudly_and_writes_nothing() {
    let brokers = shared_broker();
    let topic = "gap-below";
    create_topic(brokers, topic, 1);
    produce(brokers, topic, &numbered("a", 10, 1));
    let (dir, pool) = run_identity("gap-below", topic, 1).await;
    let checkpoint = if delete_records(brokers, topic, 0, 8) {
        set_checkpoint(&pool, "gap-below", 0, 3).await;
        3
    } else {
        set_checkpoint(&pool, "gap-below", 0, -5).await;
        -5
    };
    let before = table_counts(&pool).await;

    let config = dir.path().join("pipeline.toml");
    let out = run_until_caught_up(&config, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sluice must fail");
    assert!(
        stderr.contains("gap-below[0]"),
        "error names the partition: {stderr}"
    );
    assert!(
        stderr.contains(&checkpoint.to_string()),
        "error names the offset: {stderr}"
    );
    assert!(stderr.contains("below the log start"), "{stderr}");
    assert_eq!(table_counts(&pool).await, before, "nothing may be written");
}

/// DeleteRecords up to `before`; false if the broker does not support it.
fn delete_records(brokers: &str, topic: &str, partition: i32, before: i64) -> bool {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(before))
        .unwrap();
    let result = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(admin.delete_records(
                &tpl,
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            ))
        })
        .join()
        .unwrap()
    });
    match result {
        Ok(list) => list.elements().iter().all(|e| e.error().is_ok()),
        Err(e) => {
            println!("broker refused DeleteRecords ({e}); moving the checkpoint instead");
            false
        }
    }
}

/// Records that make the module trap are isolated by bisection and stored
/// as dead letters with the trap message; every other record is committed.
#[tokio::test(flavor = "multi_thread")]
async fn poison_records_become_dead_letters_and_the_rest_commits() {
    let brokers = shared_broker();
    let topic = "poison";
    create_topic(brokers, topic, 2);
    let mut records = numbered("ok", 200, 2);
    records[37].value = "this is poison".into();
    records[150].value = "more poison here".into();
    produce(brokers, topic, &records);
    let dir = TempDir::new("poison");
    let db = dir.path().join("out.db");
    let config = write_config(
        dir.path(),
        hostile_config("poison", topic, &db, &POISON, ""),
    );
    run_ok(&config);
    let pool = sqlite(&db).await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM echo")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 198);
    let dead: Vec<(String, String, Vec<u8>)> = sqlx::query_as(
        "SELECT kind, reason, record_value FROM sluice_dead_letters ORDER BY record_value",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(dead.len(), 2);
    assert!(
        dead.iter()
            .all(|(kind, reason, _)| kind == "trap" && reason.contains("poison record"))
    );
    assert_eq!(dead[0].2, b"more poison here");
    assert_eq!(dead[1].2, b"this is poison");
}

/// A mode of the hostile plugin and the one target it writes.
struct Mode {
    name: &'static str,
    target: &'static str,
    columns: &'static [(&'static str, &'static str)],
}

/// Passes records through to `echo`, misbehaving on poison values.
const POISON: Mode = Mode {
    name: "poison",
    target: "echo",
    columns: &[("offset", "integer"), ("value", "text")],
};

/// Writes N boolean rows to `flood` for a record `flood:N`.
const FLOOD: Mode = Mode {
    name: "flood",
    target: "flood",
    columns: &[("flag", "boolean")],
};

/// Writes a text cell of N bytes to `wide` for a record `wide:N`.
const WIDE: Mode = Mode {
    name: "wide",
    target: "wide",
    columns: &[("text", "text")],
};

/// A hostile module's config into SQLite, in `mode`, under `limits`
/// (`[limits]` lines).
fn hostile_config(
    pipeline: &str,
    topic: &str,
    db: &std::path::Path,
    mode: &Mode,
    limits: &str,
) -> PipelineToml {
    let target = mode
        .columns
        .iter()
        .fold(Target::new(mode.target), |t, (name, kind)| {
            t.column(name, kind)
        });
    PipelineToml::new(pipeline, shared_broker(), &[topic], &plugin("hostile"))
        .module_param("mode", mode.name)
        .limits(limits)
        .sink_url(&format!("sqlite://{}", db.display()))
        .target(target)
}

/// `transform_ms` of the first batch the log shows committed with dead
/// letters.
fn transform_ms_of_batch_with_dead_letters(log: &str) -> u64 {
    log.lines()
        .find(|l| l.contains("batch committed") && !l.contains("dead_letters=0"))
        .and_then(|l| l.split("transform_ms=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no batch with dead letters in:\n{log}"))
}

/// A hostile pipeline run to its end (successful or not) over a new
/// one-partition topic.
struct HostileRun {
    /// Keeps the database and config until the test ends.
    dir: TempDir,
    /// The config, as built and as written.
    toml: PipelineToml,
    config: std::path::PathBuf,
    run: MeasuredRun,
    pool: sqlx::SqlitePool,
}

/// Runs the hostile plugin in `mode` over `records` under `limits`.
async fn run_mode(topic: &str, records: &[Produce], mode: &Mode, limits: &str) -> HostileRun {
    create_topic(shared_broker(), topic, 1);
    produce(shared_broker(), topic, records);
    let dir = TempDir::new(topic);
    let db = dir.path().join("out.db");
    let toml = hostile_config(topic, topic, &db, mode, limits);
    let config = toml.write(dir.path());
    let run = run_measured(&config, "info");
    let pool = sqlite(&db).await;
    HostileRun {
        dir,
        toml,
        config,
        run,
        pool,
    }
}

/// A successful `poison` run over `n` numbered records, some replaced by
/// `poison` (index, value).
async fn run_hostile(topic: &str, n: usize, poison: &[(usize, &str)], limits: &str) -> HostileRun {
    let mut records = numbered("ok", n, 1);
    for &(i, value) in poison {
        records[i].value = value.into();
    }
    let h = run_mode(topic, &records, &POISON, limits).await;
    assert!(h.run.success, "{}", h.run.log);
    h
}

impl HostileRun {
    /// Rows in `table`.
    async fn rows(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// (offset, kind, reason) of every dead letter, by offset.
    async fn dead_letters(&self) -> Vec<(i64, String, String)> {
        sqlx::query_as(
            "SELECT \"offset\", kind, reason FROM sluice_dead_letters ORDER BY \"offset\"",
        )
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }
}

/// One record that loops (fuel), one that allocates past the cap (memory)
/// and one that traps, among 5,000 in one batch: each ends as exactly one
/// dead letter of its kind, the other 4,997 commit, the host's peak memory
/// stays within twice the module's cap plus a fixed allowance, and `verify`
/// reproduces the batch.
#[tokio::test(flavor = "multi_thread")]
async fn looping_allocating_and_trapping_records_are_isolated_by_kind() {
    let cap_mib = 64;
    let limits = format!("fuel_per_batch = 300000000\nmax_memory_mib = {cap_mib}");
    let poison = [
        (1_234, "poison-spin: loops"),
        (2_500, "poison-bomb: allocates"),
        (4_321, "poison: traps"),
    ];
    let h = run_hostile("poison-kinds", 5_000, &poison, &limits).await;
    assert_eq!(h.rows("echo").await, 4_997);
    let dead = h.dead_letters().await;
    let kinds: Vec<(i64, &str)> = dead.iter().map(|(o, k, _)| (*o, k.as_str())).collect();
    assert_eq!(
        kinds,
        [(1_234, "fuel"), (2_500, "memory"), (4_321, "trap")],
        "{dead:?}"
    );
    assert!(dead[0].2.contains("fuel"), "{dead:?}");
    assert!(dead[1].2.contains("memory"), "{dead:?}");
    let allowance = 256;
    assert!(
        h.run.peak_rss_mib <= 2 * cap_mib + allowance,
        "host peak RSS {} MiB over 2 x {cap_mib} + {allowance} MiB",
        h.run.peak_rss_mib
    );
    let said = sluice_ok(&["verify", h.config.to_str().unwrap()]);
    assert!(said.contains("0 differ"), "{said}");
    println!(
        "3 poison records of 3 kinds in 5,000: isolated in {} ms of transform, host peak RSS {} MiB",
        transform_ms_of_batch_with_dead_letters(&h.run.log),
        h.run.peak_rss_mib
    );
}

/// Bisection's cost: one trapping record in a batch of 10,000 against the
/// same batch without it, in one run (printed for BENCHMARKS.md).
#[tokio::test(flavor = "multi_thread")]
async fn bisection_cost_of_one_poison_record_in_ten_thousand() {
    let mut took = Vec::new();
    for (name, poisoned) in [("bisect-clean", false), ("bisect-poisoned", true)] {
        create_topic(shared_broker(), name, 1);
        let mut records = numbered("ok", 10_000, 1);
        if poisoned {
            records[6_789].value = "poison: traps".into();
        }
        produce(shared_broker(), name, &records);
        let dir = TempDir::new(name);
        let config = write_config(
            dir.path(),
            hostile_config(name, name, &dir.path().join("out.db"), &POISON, ""),
        );
        let run = run_measured(&config, "info");
        assert!(run.success, "{}", run.log);
        let batch = run
            .log
            .lines()
            .find(|l| l.contains("batch committed") && l.contains("records=10000"))
            .unwrap_or_else(|| panic!("no 10,000-record batch:\n{}", run.log))
            .to_string();
        let ms: u64 = batch
            .split("transform_ms=")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("transform_ms");
        assert_eq!(batch.contains("dead_letters=1"), poisoned, "{batch}");
        took.push(ms);
    }
    println!(
        "bisection: 10,000 records in {} ms clean, {} ms with one poison record isolated",
        took[0], took[1]
    );
}

/// A record that runs past the deadline on every try (fuel would last far
/// longer) is retried, isolated and dead-lettered as `deadline`; the rest
/// commits.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_past_the_deadline_on_every_try_becomes_a_deadline_dead_letter() {
    let limits = "fuel_per_batch = 1000000000000\nbatch_timeout_ms = 300";
    let h = run_hostile(
        "poison-deadline",
        100,
        &[(42, "poison-spin: loops")],
        limits,
    )
    .await;
    assert_eq!(h.rows("echo").await, 99);
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        (dead[0].0, dead[0].1.as_str()),
        (42, "deadline"),
        "{dead:?}"
    );
    assert!(dead[0].2.contains("deadline of 300 ms"), "{dead:?}");
    // The whole batch and the record are tried twice, each part between
    // once: ceil(log2 100) + 3 deadlines, plus the parts that pass.
    let took = transform_ms_of_batch_with_dead_letters(&h.run.log);
    let bound = 300 * (7 + 3) + 2_000;
    assert!(took <= bound, "isolating took {took} ms, over {bound} ms");
    let tries = h.run.log.matches("trying once more").count();
    assert_eq!(tries, 2, "{}", h.run.log);
    println!("a stalled record in 100 at a 300 ms deadline: isolated in {took} ms");
}

/// A record that recurses without end under the largest stack a config may
/// allow (8 MiB, more than a default 2 MiB thread) traps inside the
/// sandbox instead of overflowing the host's thread: one `trap` dead letter,
/// the rest committed. A stack limit out of range is refused at start.
#[tokio::test(flavor = "multi_thread")]
async fn deep_recursion_under_the_largest_stack_traps_instead_of_crashing_the_host() {
    let topic = "poison-recurse";
    let limits = format!("max_stack_kib = {}", sluice::config::MAX_STACK_KIB);
    let poison = [(7, "poison-recurse: deeper and deeper")];
    let h = run_hostile(topic, 50, &poison, &limits).await;
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!((dead[0].0, dead[0].1.as_str()), (7, "trap"), "{dead:?}");
    assert!(dead[0].2.contains("stack"), "{dead:?}");
    assert_eq!(h.rows("echo").await, 49);

    let too_deep = format!("max_stack_kib = {}", sluice::config::MAX_STACK_KIB + 1);
    let db = h.dir.path().join("out.db");
    let refused = write_config(
        h.dir.path(),
        hostile_config(topic, topic, &db, &POISON, &too_deep),
    );
    let out = run_until_caught_up(&refused, Duration::from_secs(60));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`limits.max_stack_kib` = 8193 is outside 64..=8192"),
        "{err}"
    );
}

/// A module that floods its output (10 million boolean rows from one
/// record, about 20 MB in its own memory): the host holds the output in
/// typed columns, never as a wide value per cell, so its peak memory stays
/// within twice the module's cap plus a fixed allowance; every row lands.
#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_module_does_not_blow_up_the_host() {
    let rows = 10_000_000u64;
    let cap_mib = 64;
    let h = run_mode(
        "flood",
        &[one(0, &format!("flood:{rows}"))],
        &FLOOD,
        &format!("max_memory_mib = {cap_mib}"),
    )
    .await;
    let run = &h.run;
    assert!(run.success, "{}", run.log);
    assert_eq!(h.rows("flood").await as u64, rows);
    // Measured: 88 MiB; 312 MiB while the sink took the output as one wide
    // value per cell.
    let allowance = 128;
    assert!(
        run.peak_rss_mib <= 2 * cap_mib + allowance,
        "host peak RSS {} MiB over 2 x {cap_mib} + {allowance} MiB for {rows} boolean rows",
        run.peak_rss_mib
    );
    println!(
        "flood: {rows} boolean rows from one record, host peak RSS {} MiB (cap {cap_mib} MiB)",
        run.peak_rss_mib
    );
}

/// A record that needs 100 MiB, under a 64 MiB cap, ends as a `memory` dead
/// letter; the batch's lineage records the cap, and `verify` under a config
/// whose cap would let the record through replays it under the recorded
/// one: the batch reproduces.
#[tokio::test(flavor = "multi_thread")]
async fn verify_replays_a_batch_under_the_limits_it_ran_with() {
    let poison = [(700, "poison-hungry: needs 100 MiB")];
    let h = run_hostile("replay-limits", 1_000, &poison, "max_memory_mib = 64").await;
    assert_eq!(h.rows("echo").await, 999);
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!((dead[0].0, dead[0].1.as_str()), (700, "memory"));
    let settings: Vec<String> = sqlx::query_scalar("SELECT settings FROM sluice_batches")
        .fetch_all(&h.pool)
        .await
        .unwrap();
    assert!(!settings.is_empty());
    for s in &settings {
        let s: serde_json::Value = serde_json::from_str(s).expect("settings are JSON");
        assert_eq!(s["max_memory_mib"], 64, "{s}");
        assert_eq!(s["on_poison"], "dead-letter", "{s}");
        assert!(
            s["engine"].as_str().unwrap().contains("wasmtime 48.0.8"),
            "{s}"
        );
    }
    h.toml
        .clone()
        .field("limits", "max_memory_mib", 256)
        .write(h.dir.path());
    let said = sluice_ok(&["verify", h.config.to_str().unwrap()]);
    assert!(
        said.contains("0 differ") && !said.contains("note:"),
        "{said}"
    );
}

/// The output budget: one record whose output alone is over
/// `limits.max_output_mib` becomes an `output` dead letter and the rest
/// commits; records each within it but together over it fail the batch
/// with the setting to change, committing nothing.
#[tokio::test(flavor = "multi_thread")]
async fn output_over_the_budget_is_isolated_or_refused_with_the_remedy() {
    let mut records: Vec<Produce> = (0..50).map(|_| one(0, "flood:1000")).collect();
    records[20] = one(0, "flood:20000000");
    let h = run_mode("output-budget", &records, &FLOOD, "max_output_mib = 8").await;
    assert!(h.run.success, "{}", h.run.log);
    assert_eq!(h.rows("flood").await, 49 * 1000);
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!((dead[0].0, dead[0].1.as_str()), (20, "output"));
    assert!(
        dead[0]
            .2
            .contains("over the limit of 8 MiB (`limits.max_output_mib`)"),
        "{dead:?}"
    );

    let records: Vec<Produce> = (0..20).map(|_| one(0, "flood:1000000")).collect();
    let h = run_mode(
        "output-budget-batch",
        &records,
        &FLOOD,
        "max_output_mib = 8",
    )
    .await;
    assert!(!h.run.success);
    assert!(
        h.run
            .log
            .contains("lower `source.max_records_per_partition` or raise the limit"),
        "{}",
        h.run.log
    );
    let committed = h.rows("sluice_checkpoints").await;
    assert_eq!(committed, 0, "nothing is committed");
}

/// The module digest sluice records for a component file.
fn digest_of(path: &std::path::Path) -> String {
    sluice::batch::sha256_hex(&std::fs::read(path).expect("read module"))
}

/// `after N runs` in a module-at-fault error.
fn runs_in(log: &str) -> u32 {
    log.split("after ")
        .filter_map(|rest| rest.split(" runs").next()?.parse().ok())
        .next()
        .unwrap_or_else(|| panic!("no run count in:\n{log}"))
}

/// A module that fails on every record of a 2,000-record batch (it loops:
/// fuel; it allocates and keeps it: memory; it stalls: the deadline) is the
/// module's fault, not the records': the run stops naming the module and
/// the kind, after no more runs than its isolation budget allows
/// (`isolation_budget` x (ceil(log2 2000) + 2) plus the batch's two tries)
/// and within two minutes, committing nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_module_that_fails_on_every_record_stops_within_its_isolation_budget() {
    let cases = [
        (
            "every-spin",
            "spin",
            "fuel_per_batch = 300000000",
            "fuel",
            4,
        ),
        ("every-bomb", "bomb", "max_memory_mib = 64", "memory", 4),
        (
            "every-stall",
            "spin",
            "fuel_per_batch = 1000000000000\nbatch_timeout_ms = 1500\nisolation_budget = 1",
            "deadline",
            1,
        ),
    ];
    let module = digest_of(&plugin("hostile"));
    for (topic, mode, limits, kind, budget) in cases {
        let started = std::time::Instant::now();
        let mode = Mode {
            name: mode,
            ..POISON
        };
        let h = run_mode(topic, &numbered("ok", 2_000, 1), &mode, limits).await;
        let took = started.elapsed();
        assert!(!h.run.success, "{}", h.run.log);
        let log = &h.run.log;
        assert!(
            log.contains(&format!("module {module} is at fault, not the records")),
            "{log}"
        );
        assert!(log.contains(&format!("the last as `{kind}`")), "{log}");
        assert!(log.contains("`limits.isolation_budget`"), "{log}");
        let runs = runs_in(log);
        assert!(runs <= budget * 13 + 2, "{topic}: {runs} runs");
        assert!(took < Duration::from_secs(120), "{topic}: {took:?}");
        assert_eq!(
            h.rows("sluice_checkpoints").await,
            0,
            "nothing is committed"
        );
        println!("{topic}: every record fails as {kind}: stopped after {runs} runs in {took:?}");
    }
}

/// More than `max_poison_share` of a batch's records trapping is the
/// module's fault: the run stops with the share named, committing nothing;
/// with the share at 1 the same batch is isolated and committed.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_mostly_of_poison_is_the_modules_fault_unless_the_share_allows_it() {
    let poison: Vec<(usize, &str)> = (0..200)
        .filter(|i| i % 4 != 0)
        .map(|i| (i, "poison"))
        .collect();
    let mut records = numbered("ok", 200, 1);
    for &(i, value) in &poison {
        records[i].value = value.into();
    }
    let h = run_mode("poison-share", &records, &POISON, "").await;
    assert!(!h.run.success, "{}", h.run.log);
    assert!(
        h.run.log.contains(
            "more than 100 of the batch's records fail on their own (`limits.max_poison_share`)"
        ),
        "{}",
        h.run.log
    );
    assert_eq!(
        h.rows("sluice_checkpoints").await,
        0,
        "nothing is committed"
    );

    let h = run_mode(
        "poison-share-all",
        &records,
        &POISON,
        "max_poison_share = 1",
    )
    .await;
    assert!(h.run.success, "{}", h.run.log);
    assert_eq!(h.rows("echo").await, 50);
    assert_eq!(h.dead_letters().await.len(), 150);
}

/// SIGTERM while a module that fails on every record is being isolated
/// (looping, allocating, stalling; a budget that would last for hours)
/// ends the process within a few seconds, cleanly, committing nothing of
/// the batch.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_interrupts_an_isolation_at_once() {
    let cases = [
        ("term-spin", "spin", "fuel_per_batch = 300000000"),
        ("term-bomb", "bomb", "max_memory_mib = 64"),
        (
            "term-stall",
            "spin",
            "fuel_per_batch = 1000000000000\nbatch_timeout_ms = 1500",
        ),
    ];
    for (topic, mode, limits) in cases {
        create_topic(shared_broker(), topic, 1);
        produce(shared_broker(), topic, &numbered("ok", 2_000, 1));
        let dir = TempDir::new(topic);
        let db = dir.path().join("out.db");
        let mode = Mode {
            name: mode,
            ..POISON
        };
        let limits = format!("{limits}\nisolation_budget = 1000\nmax_poison_share = 1");
        let config = write_config(
            dir.path(),
            hostile_config(topic, topic, &db, &mode, &limits).assign(topic, &[0]),
        );
        let mut host = sluice_tests::control::Host::start(&config, &dir.path().join("run.log"));
        host.wait_for_log("bisecting the batch", 1, Duration::from_secs(120));
        std::thread::sleep(Duration::from_millis(500));
        let took = host.terminate_within(Duration::from_secs(5), topic);
        assert!(
            host.log().contains("abandoned the batch being prepared"),
            "{}",
            host.log()
        );
        let pool = sqlite(&db).await;
        assert_eq!(
            sqlite_count(&pool, "SELECT count(*) FROM sluice_checkpoints").await,
            0
        );
        println!("{topic}: SIGTERM during isolation ended the process in {took:?}");
    }
}

/// SIGTERM during the isolation of a second batch (every record of it
/// loops) keeps the first batch's commit and nothing of the second; a
/// restart resumes from the checkpoint and, with a budget that lets it,
/// isolates the second batch: every record once, as a row or a dead letter.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_after_sigterm_in_isolation_resumes_from_the_checkpoint() {
    let topic = "term-resume";
    create_topic(shared_broker(), topic, 1);
    let mut records = numbered("ok", 1_000, 1);
    for r in &mut records[500..] {
        r.value = "poison-spin: loops".into();
    }
    produce(shared_broker(), topic, &records);
    let dir = TempDir::new(topic);
    let db = dir.path().join("out.db");
    let config = |limits: &str| {
        hostile_config(topic, topic, &db, &POISON, limits)
            .max_records_per_partition(500)
            .assign(topic, &[0])
            .write(dir.path())
    };
    let config_path =
        config("fuel_per_batch = 300000000\nisolation_budget = 1000\nmax_poison_share = 1");
    let mut host = sluice_tests::control::Host::start(&config_path, &dir.path().join("run.log"));
    host.wait_for_log("bisecting the batch", 1, Duration::from_secs(120));
    let asked = std::time::Instant::now();
    host.signal(libc::SIGTERM);
    while host.is_running() {
        assert!(asked.elapsed() < Duration::from_secs(5), "{}", host.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let pool = sqlite(&db).await;
    let checkpoint = "SELECT next_offset FROM sluice_checkpoints";
    assert_eq!(sqlite_count(&pool, checkpoint).await, 500);
    assert_eq!(sqlite_count(&pool, "SELECT count(*) FROM echo").await, 500);

    // Little fuel: each looping record is found in a few milliseconds.
    let config_path =
        config("fuel_per_batch = 20000000\nisolation_budget = 1000\nmax_poison_share = 1");
    run_ok(&config_path);
    assert_eq!(sqlite_count(&pool, checkpoint).await, 1_000);
    let rows = "SELECT count(DISTINCT \"offset\") FROM echo WHERE \"offset\" < 500";
    assert_eq!(sqlite_count(&pool, rows).await, 500);
    assert_eq!(sqlite_count(&pool, "SELECT count(*) FROM echo").await, 500);
    let dead = "SELECT count(DISTINCT \"offset\") FROM sluice_dead_letters WHERE kind = 'fuel' AND \"offset\" >= 500";
    assert_eq!(sqlite_count(&pool, dead).await, 500);
    assert_eq!(
        sqlite_count(&pool, "SELECT count(*) FROM sluice_dead_letters").await,
        500
    );
    assert_contiguous_lineage(&pool, topic).await;
}

/// One record whose value is not UTF-8, among 5,000, written into a text
/// column unchecked (the Rust SDK's `Row::bytes`) breaks the output
/// contract on its own: it becomes one `contract` dead letter and the other
/// 4,999 commit. The C template, which did the same before the templates
/// agreed, now replaces the bad bytes (as every template does) and commits
/// all 5,000.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_whose_output_breaks_the_contract_becomes_a_contract_dead_letter() {
    let dir = TempDir::new("contract-c");
    let project = dir.path().join("upper");
    sluice_ok(&["new", "--lang", "c", project.to_str().unwrap()]);
    sluice_ok(&["build", project.to_str().unwrap()]);
    let c_module = project.join("dist/upper.wasm");
    // (topic, module, params, target, the bad record's row if it has one)
    let guests = [
        (
            "contract-rust",
            plugin("hostile"),
            Some(("mode", "raw")),
            "echo",
            None,
        ),
        (
            "contract-c",
            c_module,
            None,
            "out",
            Some("B\u{FFFD}\u{FFFD}D"),
        ),
    ];
    for (topic, module, params, target, replaced) in guests {
        create_topic(shared_broker(), topic, 1);
        let mut values: Vec<Vec<u8>> = (0..5_000).map(|i| format!("ok-{i}").into_bytes()).collect();
        values[3_210] = vec![b'b', 0xff, 0xfe, b'd'];
        produce_values(shared_broker(), topic, &values);
        let dir = TempDir::new(topic);
        let db = dir.path().join("out.db");
        let mut config = PipelineToml::new(topic, shared_broker(), &[topic], &module)
            .sink_url(&format!("sqlite://{}", db.display()))
            .target(
                Target::new(target)
                    .column("offset", "integer")
                    .column("value", "text"),
            );
        if let Some((key, value)) = params {
            config = config.module_param(key, value);
        }
        let config = config.write(dir.path());
        run_ok(&config);
        let pool = sqlite(&db).await;
        let said = sluice_ok(&["verify", config.to_str().unwrap()]);
        assert!(said.contains("0 differ"), "{said}");
        let rows = sqlite_count(&pool, &format!("SELECT count(*) FROM {target}")).await;
        let dead: Vec<(i64, String, String)> =
            sqlx::query_as("SELECT \"offset\", kind, reason FROM sluice_dead_letters")
                .fetch_all(&pool)
                .await
                .unwrap();
        if let Some(replaced) = replaced {
            assert_eq!((rows, dead.len()), (5_000, 0), "{topic}: {dead:?}");
            let value: String = sqlx::query_scalar(&format!(
                "SELECT value FROM {target} WHERE \"offset\" = 3210"
            ))
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(value, replaced, "{topic}");
            continue;
        }
        assert_eq!(rows, 4_999, "{topic}");
        assert_eq!(dead.len(), 1, "{topic}: {dead:?}");
        assert_eq!(
            (dead[0].0, dead[0].1.as_str()),
            (3_210, "contract"),
            "{dead:?}"
        );
        assert!(dead[0].2.contains("not UTF-8"), "{dead:?}");
    }
}

/// A module that logs an 8 MiB line for each of 60 records: the host keeps
/// each line cut to 4 KiB, not the lifted message behind it, so its peak
/// memory stays within twice the module's cap plus a fixed allowance.
#[tokio::test(flavor = "multi_thread")]
async fn a_log_flood_costs_the_host_its_cut_lines_only() {
    let cap_mib = 64;
    let mode = Mode {
        name: "shout",
        ..POISON
    };
    let h = run_mode(
        "log-flood",
        &numbered("ok", 60, 1),
        &mode,
        &format!("max_memory_mib = {cap_mib}"),
    )
    .await;
    assert!(h.run.success, "{}", h.run.log);
    assert_eq!(h.rows("echo").await, 60);
    let allowance = 128;
    assert!(
        h.run.peak_rss_mib <= 2 * cap_mib + allowance,
        "host peak RSS {} MiB over 2 x {cap_mib} + {allowance} MiB",
        h.run.peak_rss_mib
    );
    println!(
        "log flood: 60 lines of 8 MiB, host peak RSS {} MiB (cap {cap_mib} MiB)",
        h.run.peak_rss_mib
    );
}

/// A running pipeline whose version fails on every record of a batch
/// stalls instead of exiting: nothing of the batch is committed, `status`
/// names the version and the reason, `sluice_stalled` is 1, the control API
/// stays up. Activating a fixed version (the same module in `echo` mode)
/// ends the stall at the next batch boundary and the same records commit,
/// once, under the new version.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_pipeline_stalls_on_a_version_at_fault_until_another_is_activated() {
    use sluice_tests::control::{Host, cli_ok, control_port, deploy_hostile, raw_request};
    let topic = "stall-service";
    create_topic(shared_broker(), topic, 1);
    produce(shared_broker(), topic, &numbered("ok", 300, 1));
    let dir = TempDir::new(topic);
    let db = dir.path().join("out.db");
    let (port, url) = control_port();
    let mode = Mode {
        name: "spin",
        ..POISON
    };
    let config = hostile_config(
        topic,
        topic,
        &db,
        &mode,
        "fuel_per_batch = 100000000\nisolation_budget = 1",
    )
    .assign(topic, &[0])
    .control(port, 32 << 20)
    .write(dir.path());
    let host = Host::start(&config, &dir.path().join("run.log"));
    host.wait_for_api(port);
    host.wait_for_log(
        "stalled until another version is activated",
        1,
        Duration::from_secs(120),
    );
    let status: serde_json::Value = serde_json::from_str(&cli_ok(&url, &["status"])).unwrap();
    let stalled = &status["running"]["stalled"];
    assert_eq!(
        stalled["module_digest"],
        digest_of(&plugin("hostile")),
        "{status}"
    );
    assert!(
        stalled["reason"]
            .as_str()
            .unwrap()
            .contains("the last as `fuel`"),
        "{status}"
    );
    let metrics = raw_request(port, "GET /metrics HTTP/1.1", b"").body;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sluice_stalled{") && l.ends_with(" 1")),
        "{metrics}"
    );
    let pool = sqlite(&db).await;
    assert_eq!(
        sqlite_count(&pool, "SELECT count(*) FROM sluice_checkpoints").await,
        0
    );

    deploy_hostile(&url, "echo");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sqlite_count(&pool, "SELECT count(*) FROM echo").await < 300 {
        assert!(std::time::Instant::now() < deadline, "{}", host.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status: serde_json::Value = serde_json::from_str(&cli_ok(&url, &["status"])).unwrap();
    assert!(status["running"]["stalled"].is_null(), "{status}");
    let metrics = raw_request(port, "GET /metrics HTTP/1.1", b"").body;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sluice_stalled{") && l.ends_with(" 0")),
        "{metrics}"
    );
    host.stop();
    assert_eq!(
        sqlite_count(&pool, "SELECT count(DISTINCT \"offset\") FROM echo").await,
        300
    );
    assert_eq!(sqlite_count(&pool, "SELECT count(*) FROM echo").await, 300);
    assert_eq!(
        sqlite_count(&pool, "SELECT count(*) FROM sluice_dead_letters").await,
        0
    );
    assert_eq!(
        sqlite_count(&pool, "SELECT next_offset FROM sluice_checkpoints").await,
        300
    );
}

/// Under a 256 MiB cap, a module's largest outputs: 20 million boolean rows
/// from one record, and one 100 MiB text cell. The host's peak memory stays
/// within twice the cap plus a fixed allowance, and every row lands.
#[tokio::test(flavor = "multi_thread")]
async fn the_largest_outputs_a_256_mib_module_can_make_cost_the_host_a_bounded_multiple() {
    let cap_mib = 256;
    let allowance = 128;
    let limits = format!("max_memory_mib = {cap_mib}");
    let cases = [
        ("big-flood", "flood:20000000", &FLOOD, 20_000_000),
        ("big-cell", "wide:104857600", &WIDE, 1),
    ];
    for (topic, value, mode, rows) in cases {
        let h = run_mode(topic, &[one(0, value)], mode, &limits).await;
        assert!(h.run.success, "{}", h.run.log);
        assert_eq!(h.rows(mode.target).await, rows);
        assert!(
            h.run.peak_rss_mib <= 2 * cap_mib + allowance,
            "{topic}: host peak RSS {} MiB over 2 x {cap_mib} + {allowance} MiB",
            h.run.peak_rss_mib
        );
        println!(
            "{topic}: {value}, host peak RSS {} MiB (cap {cap_mib} MiB)",
            h.run.peak_rss_mib
        );
    }
}
