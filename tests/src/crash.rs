//! The crash loop shared by the exactly-once tests of every sink: input with
//! plain records and committed and aborted transactions, and a loop that
//! SIGKILLs `sluice` at random moments while batches flow.
//!
//! It must not decide what is correct: tests compare the sink's tables with
//! an independent `read_committed` read of the input.

use crate::{numbered, produce, produce_transaction, spawn_until_caught_up};
use rand::Rng;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Produces plain records, committed transactions and aborted ones (every
/// fourth), interleaved over `partitions`. Returns how many records were
/// sent outside aborted transactions (≥ 100,000).
pub fn produce_mixed_input(
    brokers: &str,
    topic: &str,
    partitions: i32,
    rng: &mut impl Rng,
) -> usize {
    let mut sent = 0;
    for round in 0..20 {
        let plain = numbered(&format!("plain{round}"), 4_500, partitions);
        produce(brokers, topic, &plain);
        sent += plain.len();
        let size = rng.gen_range(200..1_500);
        let txn = numbered(&format!("txn{round}"), size, partitions);
        let commit = round % 4 != 3;
        produce_transaction(brokers, topic, &format!("{topic}-{round}"), &txn, commit);
        if commit {
            sent += txn.len();
        }
    }
    sent
}

/// Runs `sluice run --until-caught-up CONFIG` and SIGKILLs it `kills` times,
/// each time 0-60 ms after the run committed a new batch (as `committed`
/// counts them in the sink), so kills hit reading, transforming and
/// committing alike. Returns the kills done (fewer if the pipeline
/// finished first) and the batches committed meanwhile.
pub async fn kill_loop(
    config: &Path,
    committed: impl AsyncFn() -> i64,
    kills: usize,
    rng: &mut impl Rng,
) -> (usize, i64) {
    kill_group_loop(config, committed, kills, 1, rng).await
}

/// The kill loop over `members` processes of the pipeline at once (members
/// of its consumer group, unless the config assigns partitions): each kill
/// hits a random one, started again at once, so with more than one every
/// kill is also a rebalance. A member that caught up on what it held and
/// exited is started again too (it rejoins the group); the loop ends when
/// every member has exited on its own. Returns as `kill_loop` does.
pub async fn kill_group_loop(
    config: &Path,
    committed: impl AsyncFn() -> i64,
    kills: usize,
    members: usize,
    rng: &mut impl Rng,
) -> (usize, i64) {
    let mut done = 0;
    let mut batches = 0;
    let started = Instant::now();
    let mut running: Vec<Option<Child>> = (0..members).map(|_| None).collect();
    while done < kills {
        for slot in running.iter_mut().filter(|s| s.is_none()) {
            *slot = Some(spawn_drained(config));
        }
        while !all_exited(&mut running) && committed().await <= batches {
            if started.elapsed() > Duration::from_secs(900) {
                stalled(config, &mut running);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..60))).await;
        let victim = if members > 1 {
            rng.gen_range(0..members)
        } else {
            0
        };
        let child = running[victim].as_mut().expect("started above");
        if child.try_wait().expect("wait").is_some() {
            if all_exited(&mut running) {
                break; // finished before we could kill one
            }
            running[victim] = None; // caught up on what it held: it rejoins
            continue;
        }
        child.kill().expect("SIGKILL"); // std's kill() is SIGKILL on Unix
        child.wait().expect("reap");
        running[victim] = None;
        done += 1;
        batches = committed().await;
    }
    for child in running.iter_mut().flatten() {
        child.kill().ok();
        child.wait().expect("reap");
    }
    (done, batches)
}

/// Where the members' logs go: next to the config, appended by each.
fn members_log(config: &Path) -> PathBuf {
    config.with_extension("members.log")
}

/// Stops the members (a stalled one would outlive the test) and fails
/// with the end of their logs, so a stall says where it stopped.
fn stalled(config: &Path, running: &mut [Option<Child>]) -> ! {
    for child in running.iter_mut().flatten() {
        child.kill().ok();
        child.wait().ok();
    }
    let log = std::fs::read_to_string(members_log(config)).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let tail = lines[lines.len().saturating_sub(60)..].join("\n");
    panic!("crash loop took too long; the members' last log lines:\n{tail}");
}

/// `sluice run --until-caught-up CONFIG`, its stdout drained, so a pipeline
/// printing its rows (the stdout sink) never blocks on a full pipe; its log
/// (info) appended to [`members_log`].
fn spawn_drained(config: &Path) -> Child {
    let log = (std::fs::OpenOptions::new().create(true).append(true))
        .open(members_log(config))
        .expect("the members' log");
    let mut child = spawn_until_caught_up(config, "info", Stdio::from(log));
    let mut out = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    child
}

/// Every member started has exited.
fn all_exited(running: &mut [Option<Child>]) -> bool {
    (running.iter_mut().flatten()).all(|c| c.try_wait().expect("wait").is_some())
}
