//! The crash loop shared by the exactly-once tests of every sink: input with
//! plain records and committed and aborted transactions, and a loop that
//! SIGKILLs `sluice` at random moments while batches flow.
//!
//! It must not decide what is correct: tests compare the sink's tables with
//! an independent `read_committed` read of the input.

use crate::{numbered, produce, produce_transaction, spawn_until_caught_up};
use rand::Rng;
use std::path::Path;
use std::process::Stdio;
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
    let mut done = 0;
    let mut batches = 0;
    let started = Instant::now();
    while done < kills {
        let mut child = spawn_until_caught_up(config, "warn", Stdio::null());
        // Drained, so a pipeline printing its rows (the stdout sink) never
        // blocks on a full pipe.
        let mut out = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        while child.try_wait().expect("wait").is_none() && committed().await <= batches {
            assert!(
                started.elapsed() < Duration::from_secs(900),
                "crash loop took too long"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..60))).await;
        if child.try_wait().expect("wait").is_some() {
            break; // finished before we could kill it
        }
        child.kill().expect("SIGKILL"); // std's kill() is SIGKILL on Unix
        child.wait().expect("reap");
        done += 1;
        batches = committed().await;
    }
    (done, batches)
}
