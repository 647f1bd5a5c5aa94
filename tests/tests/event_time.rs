//! Event time through the CLI, against real databases and a real broker:
//! the `windows` plugin (the Rust SDK's windows: a sum and count per key
//! per window of the records' own time) over out-of-order input, some of
//! it behind the allowed lateness. Tumbling and session windows through
//! ≥ 20 SIGKILLs, two owners racing (each loser a fenced zombie), hopping
//! windows with early rows, and a partition that goes idle; the session
//! kill test and the race retain closed windows, so late records within
//! the retention update them. Every final window, every updated window's
//! last value and every `late` dead letter is checked
//! against a recomputation from an independent `read_committed` read;
//! `verify` must replay every batch alike, timers fired included.
//!
//! Each test owns its topic, database (schema) and pipeline.

use rand::SeedableRng;
use sluice_tests::control::assert_verified;
use sluice_tests::sinks::SinkDb;
use sluice_tests::windows::{self, Expected, Lateness, Shape};
use sluice_tests::*;

const PARTITIONS: i32 = 3;
/// The watermark 1 s behind; late records are dead letters.
const LATENESS: Lateness = Lateness {
    allowed_ms: 1_000,
    retain_ms: 0,
};

/// No lateness, no retention.
const NO_LATENESS: Lateness = Lateness {
    allowed_ms: 0,
    retain_ms: 0,
};

/// The watermark 1 s behind; a closed window takes late records 1.5 s
/// more (the input's latest records are up to 4 s behind: some update
/// their window, some are dead letters).
const RETAINED: Lateness = Lateness {
    allowed_ms: 1_000,
    retain_ms: 1_500,
};

/// The kill loop over windowed input with `members` processes of the
/// pipeline (more than one: members of its consumer group, each kill a
/// rebalance): ≥ 20 SIGKILLs 0-60 ms after a batch lands, a final run,
/// then every final window once with its value, every window late records
/// updated with its last value (with a retention), every other late record
/// a `late` dead letter once, lineage contiguous and every batch replayed
/// alike.
async fn windows_survive_sigkills(
    db: SinkDb,
    name: &str,
    shape: Shape,
    lateness: Lateness,
    seed: u64,
    members: usize,
) {
    let broker = Broker::start();
    let brokers = broker.brokers.as_str();
    create_topic(brokers, name, PARTITIONS);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    produce(brokers, name, &windows::input(PARTITIONS, 12_000, &mut rng));
    let dir = TempDir::new(name);
    // Batches of 100 records a partition (≥ 120 batches), 50 with two
    // members (each kill also waits out a rebalance), so the kills (each
    // after one batch lands, several may land before it hits) do not run
    // out of batches before the 20th.
    let per_batch = 100 / members as u32;
    // Through the state journal (a merge every 8 batches of a partition):
    // kills land between appends, merges and the reads of a taken
    // partition.
    let windowed = windows::config(name, brokers, shape, lateness)
        .max_records_per_partition(per_batch)
        .sink("state_journal_batches", 8);
    let config = db.configure(windowed).write(dir.path());
    let committed = async || db.committed_batches().await;
    let (kills, _) = crash::kill_group_loop(&config, committed, 22, members, &mut rng).await;
    assert!(kills >= scenarios::MIN_KILLS, "only {kills} kills");
    run_ok(&config);
    let input = read_committed(brokers, name, PARTITIONS);
    let expected = Expected::of(&input, shape, lateness);
    assert!(expected.rows.len() > 300, "{} windows", expected.rows.len());
    assert!(expected.late.len() > 50, "{} late", expected.late.len());
    if lateness.retain_ms > 0 {
        let updated = expected.updated.len();
        assert!(updated > 50, "{updated} windows updated");
    }
    windows::assert_stored(&db, name, &expected).await;
    db.assert_contiguous_lineage(name).await;
    let batches = assert_verified(&config);
    println!(
        "{name}: {kills} SIGKILLs of one of {members} processes; {} records; {} windows closed \
         exactly once, {} updated by late records, {} late records dead-lettered exactly once; \
         {batches} batches verified",
        input.len(),
        expected.rows.len(),
        expected.updated.len(),
        expected.late.len()
    );
}

/// Two members of the pipeline's consumer group (no static assignment),
/// a random one SIGKILLed 0-60 ms after a batch lands and started again,
/// ≥ 20 times: each kill hands the victim's partitions (their open
/// windows, timers and watermarks, in the sink's state) to the other
/// member at the rebalance, and some come back when it rejoins. Tumbling
/// windows on Postgres, then the checks of the kill loop.
#[tokio::test(flavor = "multi_thread")]
async fn tumbling_windows_close_exactly_once_through_rebalances_and_sigkills() {
    let name = "windows_rebalance";
    let db = SinkDb::fresh_postgres(name).await;
    let shape = Shape::Tumbling { size_ms: 10_000 };
    windows_survive_sigkills(db, name, shape, LATENESS, 0x7eb, 2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tumbling_windows_close_exactly_once_through_sigkills() {
    let name = "windows_tumbling_crash";
    let db = SinkDb::fresh_postgres(name).await;
    let shape = Shape::Tumbling { size_ms: 10_000 };
    windows_survive_sigkills(db, name, shape, LATENESS, 0x7e1, 1).await;
}

/// Session windows that take late records for 1.5 s after they close:
/// each late record within it updates its session, the rest are dead
/// letters.
#[tokio::test(flavor = "multi_thread")]
async fn session_windows_close_and_update_exactly_once_through_sigkills() {
    let dir = TempDir::new("windows-session-crash");
    let db = SinkDb::Sqlite(dir.path().join("crash.db"));
    let shape = Shape::Session { gap_ms: 400 };
    windows_survive_sigkills(db, "windows_session_crash", shape, RETAINED, 0x5e5, 1).await;
}

/// Hopping windows with early rows: the final rows are exactly the
/// recomputed ones; every early row is of a window that closed later, with
/// no more records than its final row.
#[tokio::test(flavor = "multi_thread")]
async fn hopping_windows_emit_early_then_once_final() {
    let name = "windows_hopping";
    let broker = Broker::start();
    let brokers = broker.brokers.as_str();
    create_topic(brokers, name, PARTITIONS);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x4091);
    produce(brokers, name, &windows::input(PARTITIONS, 3_000, &mut rng));
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("hop.db"));
    let shape = Shape::Hopping {
        size_ms: 6_000,
        hop_ms: 2_000,
    };
    let config = windows::config(name, brokers, shape, LATENESS).module_param("early", true);
    let config = db.configure(config).write(dir.path());
    run_ok(&config);
    let input = read_committed(brokers, name, PARTITIONS);
    let expected = Expected::of(&input, shape, LATENESS);
    windows::assert_stored(&db, name, &expected).await;
    let early: Vec<(i64, String, i64, i64, i64)> = {
        let sql = format!(
            "SELECT {}, {}, {}, {}, {} FROM {} WHERE {} = 'early'",
            db.ident("partition"),
            db.ident("key"),
            db.ident("start_ms"),
            db.ident("end_ms"),
            db.ident("records"),
            db.table("windows"),
            db.ident("emit"),
        );
        let pool = db.pool().await;
        sqlx::query_as(&sql).fetch_all(&pool).await.expect("query")
    };
    assert!(!early.is_empty(), "no early rows");
    let finals: std::collections::BTreeMap<_, _> = (expected.rows.iter())
        .map(|(p, k, s, e, _, n)| ((*p, k.clone(), *s, *e), *n))
        .collect();
    let flush = |key: &str| key == "flush";
    for (p, key, start, end, records) in &early {
        match finals.get(&(*p, key.clone(), *start, *end)) {
            Some(n) => assert!(records <= n, "early {records} > final {n}"),
            None => assert!(
                flush(key),
                "early row of a window never closed: {key} {start}"
            ),
        }
    }
    assert_verified(&config);
}

/// Partition 1 goes quiet while partition 0 moves on: partition 0's windows
/// close by its own records (partitions are judged apart, so an idle one
/// holds back no other), partition 1's stay open; when partition 1's
/// records resume, its windows close. Each step is what the recomputation
/// says, and `verify` replays it.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_partition_holds_back_only_its_own_windows() {
    let name = "windows_idle";
    let broker = Broker::start();
    let brokers = broker.brokers.as_str();
    create_topic(brokers, name, 2);
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("idle.db"));
    let shape = Shape::Tumbling { size_ms: 1_000 };
    let config = db
        .configure(windows::config(name, brokers, shape, NO_LATENESS))
        .write(dir.path());
    let at = |s: i64| windows::T0 + s * 1_000;
    let both: Vec<Produce> = (0..10)
        .flat_map(|s| {
            [
                windows::record(0, "a", at(s), 1),
                windows::record(1, "b", at(s), 2),
            ]
        })
        .collect();
    produce(brokers, name, &both);
    run_ok(&config);
    // Partition 1 is idle from here; partition 0 goes on for a minute.
    let on: Vec<Produce> = (10..70)
        .map(|s| windows::record(0, "a", at(s), 1))
        .collect();
    produce(brokers, name, &on);
    run_ok(&config);
    let input = read_committed(brokers, name, 2);
    let expected = Expected::of(&input, shape, NO_LATENESS);
    windows::assert_stored(&db, name, &expected).await;
    let closed = |p: i64| expected.rows.iter().filter(|r| r.0 == p).count();
    assert_eq!((closed(0), closed(1)), (69, 9), "{:?}", expected.rows);
    // Partition 1 resumes: its windows close by its own records.
    produce(brokers, name, &[windows::record(1, "b", at(70), 2)]);
    run_ok(&config);
    let input = read_committed(brokers, name, 2);
    let expected = Expected::of(&input, shape, NO_LATENESS);
    windows::assert_stored(&db, name, &expected).await;
    assert_eq!(
        closed(1) + 1,
        expected.rows.iter().filter(|r| r.0 == 1).count()
    );
    assert_verified(&config);
}

/// Windows opened by a module built before contract 0.1.3 (each
/// aggregate under a `sluice/w/` state key, its timer without a value:
/// the `windows` plugin's stand-in mode) are taken over by the current SDK
/// deployed and activated on the running host: one window the new version
/// adds records to, ones it only closes, each closes once with every
/// record's amount, no old key is left behind, and `verify` replays both
/// versions' batches.
#[tokio::test(flavor = "multi_thread")]
async fn windows_opened_before_timer_values_close_after_an_upgrade() {
    let name = "windows_upgrade";
    let broker = Broker::start();
    let brokers = broker.brokers.as_str();
    create_topic(brokers, name, 2);
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("upgrade.db"));
    let shape = Shape::Tumbling { size_ms: 10_000 };
    let (port, url) = sluice_tests::control::control_port();
    let legacy = windows::config(name, brokers, shape, NO_LATENESS)
        .module_param("legacy_layout", true)
        .control(port, 1 << 25);
    let config = db.configure(legacy).write(dir.path());
    let host = sluice_tests::control::Host::start(&config, &dir.path().join("host.log"));
    host.wait_for_api(port);
    let at = |s: i64| windows::T0 + s * 1_000;
    // Before the upgrade every window stays open (the last record is at 5 s).
    let before: Vec<Produce> = (0..6)
        .flat_map(|s| {
            [
                windows::record(0, "a", at(s), 1),
                windows::record(0, "b", at(s), 2),
                windows::record(1, "c", at(s), 3),
            ]
        })
        .collect();
    produce(brokers, name, &before);
    let limit = std::time::Duration::from_secs(120);
    host.wait_for_metric("sluice_records_in_total", before.len() as f64, limit);
    let opened = std::time::Instant::now();
    while old_window_keys(&db, name).await < 3 && opened.elapsed() < limit {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(
        old_window_keys(&db, name).await,
        3,
        "a, b and c open, the old way"
    );
    let windows = plugin("windows").display().to_string();
    let params = r#"{"windows":"tumbling","size_ms":10000,"retain_ms":0,"time_field":"ts"}"#;
    let deploy = ["deploy", &windows, "--params", params, "--activate"];
    let out = sluice_tests::control::cli_ok(&url, &deploy);
    assert!(out.contains("activated version 2"), "{out}");
    host.wait_for_metric("sluice_module_swaps_total", 1.0, limit);
    // After it, `b`'s first window takes more records; every window before 20 s closes.
    let after: Vec<Produce> = (6..25)
        .map(|s| windows::record(0, "b", at(s), 2))
        .chain([windows::record(1, "c", at(26), 3)])
        .collect();
    produce(brokers, name, &after);
    let all = (before.len() + after.len()) as f64;
    host.wait_for_metric("sluice_records_in_total", all, limit);
    host.stop();
    let input = read_committed(brokers, name, 2);
    let expected = Expected::of(&input, shape, NO_LATENESS);
    windows::assert_stored(&db, name, &expected).await;
    let row = |p: i64, key: &str| {
        let row = (expected.rows.iter()).find(|r| r.0 == p && r.1 == key && r.2 == at(0));
        row.map(|r| (r.4, r.5))
    };
    assert_eq!(row(0, "a"), Some((6, 6)), "{:?}", expected.rows);
    assert_eq!(row(0, "b"), Some((20, 10)), "{:?}", expected.rows);
    assert_eq!(row(1, "c"), Some((18, 6)), "{:?}", expected.rows);
    assert_eq!(old_window_keys(&db, name).await, 0, "old keys left behind");
    assert_verified(&config);
}

/// How many windows `pipeline` keeps the way modules before contract
/// 0.1.3 did (under a `sluice/w/` state key), read from the SQLite state
/// table and journal directly.
async fn old_window_keys(db: &SinkDb, pipeline: &str) -> i64 {
    let keys = sluice_tests::tally::stored_keys(db, pipeline).await;
    keys.keys()
        .filter(|(_, key)| key.starts_with(b"sluice/w/"))
        .count() as i64
}

/// Two processes statically assigned the same partitions race over
/// windowed input to the end: the loser of each race is a zombie whose
/// commit is fenced and rolled back, and whose cached state and timer
/// index are dropped (read again from the sink). Closed windows take late
/// records for 1.5 s. Every window still closes exactly once with its
/// value, every update lands once (the last has every late record within
/// the retention), every other late record is one dead letter, and
/// `verify` replays every batch.
#[tokio::test(flavor = "multi_thread")]
async fn two_racing_owners_close_each_window_once() {
    let name = "windows_two_owners";
    let broker = Broker::start();
    let brokers = broker.brokers.as_str();
    create_topic(brokers, name, PARTITIONS);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x2077);
    produce(brokers, name, &windows::input(PARTITIONS, 6_000, &mut rng));
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("race.db"));
    let all: Vec<i32> = (0..PARTITIONS).collect();
    let shape = Shape::Tumbling { size_ms: 5_000 };
    let config = windows::config(name, brokers, shape, RETAINED)
        .max_records_per_partition(100)
        .batch_interval_ms(20)
        .assign(name, &all);
    let config = db.configure(config).write(dir.path());
    let fenced = race_two_owners(&config);
    assert!(fenced > 0, "the two owners never collided");
    let input = read_committed(brokers, name, PARTITIONS);
    let expected = Expected::of(&input, shape, RETAINED);
    assert!(!expected.updated.is_empty() && !expected.late.is_empty());
    windows::assert_stored(&db, name, &expected).await;
    db.assert_contiguous_lineage(name).await;
    let batches = assert_verified(&config);
    println!(
        "{name}: {fenced} fenced commits rolled back; {} windows closed exactly once, {} updated \
         by late records, {} late records; {batches} batches verified",
        expected.rows.len(),
        expected.updated.len(),
        expected.late.len()
    );
}

/// A hostile `timers` pipeline over one partition holding `values`, one
/// record a batch, into SQLite, with a small state cache (16 MiB: what is
/// measured is the timers' bounds, not the cache's) and `limits`
/// besides, run to its end and measured.
struct TimerFlood {
    /// Serves the input (`verify` reads it again).
    _broker: Broker,
    /// Holds the database.
    _dir: TempDir,
    db: SinkDb,
    /// The pipeline's name (its topic's too).
    name: String,
    config: std::path::PathBuf,
    run: MeasuredRun,
}

fn flood_timers(name: &str, values: Vec<String>, limits: &[(&str, i64)]) -> TimerFlood {
    let broker = Broker::start();
    let brokers = broker.brokers.as_str();
    create_topic(brokers, name, 1);
    let records: Vec<Produce> = values
        .into_iter()
        .map(|value| Produce {
            partition: 0,
            key: None,
            value,
        })
        .collect();
    produce(brokers, name, &records);
    let dir = TempDir::new(name);
    let db = SinkDb::Sqlite(dir.path().join("flood.db"));
    let config = PipelineToml::new(name, brokers, &[name], &plugin("hostile"))
        .module_param("mode", "timers")
        .max_records_per_partition(1)
        .field("limits", "state_cache_mib", 16)
        .target(
            Target::new("fired")
                .column("timer", "text")
                .column("at_ms", "integer"),
        );
    let config = limits.iter().fold(config, |config, (key, value)| {
        config.field("limits", key, *value)
    });
    let config = db.configure(config).write(dir.path());
    let run = run_measured(&config, "warn");
    TimerFlood {
        _broker: broker,
        _dir: dir,
        db,
        name: name.to_string(),
        config,
        run,
    }
}

impl TimerFlood {
    /// The timers fired (rows) and the distinct ones among them.
    async fn fired(&self) -> (Option<i64>, Option<i64>) {
        let fired = self.db.scalar("SELECT COUNT(*) FROM fired").await;
        let distinct = (self.db)
            .scalar("SELECT COUNT(*) FROM (SELECT DISTINCT timer, at_ms FROM fired)")
            .await;
        (fired, distinct)
    }

    /// Timers still in the committed state.
    async fn timers_left(&self) -> Option<i64> {
        let keys = sluice_tests::tally::stored_keys(&self.db, &self.name).await;
        Some(
            keys.keys()
                .filter(|(_, key)| key.starts_with(&[0xFF, b't']))
                .count() as i64,
        )
    }

    fn assert_peak_within(&self, allowance_mib: u64) {
        assert!(
            self.run.peak_rss_mib <= allowance_mib,
            "host peak RSS {} MiB over {allowance_mib} MiB",
            self.run.peak_rss_mib
        );
    }
}

/// A module that sets 600,000 timers of 240-byte keys (far in the future),
/// then one record that passes them all: the host holds only the earliest
/// (4 MiB a partition) and fires the rest, oldest first, as the
/// partition's next batches come; every timer fires exactly once, the
/// host's peak memory stays bounded (with every timer held and all fired
/// in one batch, it peaked at 1,661 MiB; bounded, 185 MiB), and `verify`
/// replays every batch.
#[tokio::test(flavor = "multi_thread")]
async fn a_module_flooding_timers_is_held_to_a_bounded_index_and_each_fires_once() {
    let (sets, per_set, ticks) = (15, 40_000, 150);
    let values: Vec<String> = (0..sets)
        .map(|_| format!("timers:{per_set}"))
        .chain(["flush".to_string()])
        .chain((0..ticks).map(|_| "tick".to_string()))
        .collect();
    let flood = flood_timers("timer_flood", values, &[]);
    assert!(flood.run.success, "{}", flood.run.log);
    let total = (sets * per_set) as i64;
    assert_eq!(flood.fired().await, (Some(total), Some(total)));
    assert_eq!(flood.timers_left().await, Some(0), "timers left in state");
    flood.assert_peak_within(256);
    let batches = assert_verified(&flood.config);
    println!(
        "{total} timers of 240-byte keys set and fired exactly once; host peak RSS {} MiB; \
         {batches} batches verified",
        flood.run.peak_rss_mib
    );
}

/// A module that keeps 256 KiB with each of 2,304 timers (576 MiB in all,
/// 24 MiB a batch) and then passes them all, under a 32 MiB module memory
/// (so `max_output_mib` is 32 too): one record asking for 40 MiB of timer
/// values in its batch is stopped at the budget as it writes them and
/// becomes an `output` dead letter, the others commit; due timers hand
/// out at most a quarter of the module's memory (8 MiB) of values a batch,
/// so each timer fires exactly once with its value whole over the next
/// batches, the host's peak memory stays under a fraction of the values'
/// total, and `verify` replays every batch.
#[tokio::test(flavor = "multi_thread")]
async fn timers_keeping_large_values_fire_a_bounded_share_a_batch_and_each_once() {
    let (sets, per_set, kept) = (24, 96, 256 << 10);
    let values: Vec<String> = (0..sets)
        .map(|_| format!("timers:{per_set}:{kept}"))
        .chain([format!("timers:160:{kept}"), "flush".to_string()])
        .chain((0..100).map(|_| "tick".to_string()))
        .collect();
    let flood = flood_timers("valued_timers", values, &[("max_memory_mib", 32)]);
    assert!(flood.run.success, "{}", flood.run.log);
    let total = (sets * per_set) as i64;
    assert_eq!(flood.fired().await, (Some(total), Some(total)));
    let whole = (flood.db)
        .scalar(&format!(
            "SELECT COUNT(*) FROM fired WHERE timer LIKE '%={kept}'"
        ))
        .await;
    assert_eq!(whole, Some(total), "every value handed out whole");
    let refused = (flood.db)
        .scalar(&format!(
            "SELECT COUNT(*) FROM sluice_dead_letters WHERE kind = 'output' \
             AND \"offset\" = {sets} AND reason LIKE '%max_output_mib%'"
        ))
        .await;
    let dead = flood
        .db
        .scalar("SELECT COUNT(*) FROM sluice_dead_letters")
        .await;
    assert_eq!((refused, dead), (Some(1), Some(1)));
    assert_eq!(flood.timers_left().await, Some(0), "timers left in state");
    flood.assert_peak_within(320);
    let batches = assert_verified(&flood.config);
    println!(
        "{total} timers keeping {} MiB set and fired exactly once with their values; \
         host peak RSS {} MiB; {batches} batches verified",
        total * kept / (1 << 20),
        flood.run.peak_rss_mib
    );
}
