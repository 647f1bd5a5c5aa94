//! The batch loop's state machine, in process and in seconds: each path the
//! loop takes when something goes wrong at the worst moment (a fence
//! between prepare and commit, a lost commit reply, an outage, a version
//! swap during the read-ahead, a shutdown or a revoke while a commit is in
//! flight, poison records), with assertions on what is committed: every
//! record once, ranges tiling each partition, the checkpoint at their end.
//!
//! The source, sink, transform and versions are the fakes in `fakes/`; the
//! same paths run end to end against Kafka, real databases and real Wasm in
//! the `sluice-tests` suites.

mod fakes;

use fakes::*;
use sluice_core::config::OnPoison;
use sluice_core::sink::DeadLetterKind;
use sluice_pipeline::{Pipeline, PipelineError, RunOptions, RunStats, StatusBoard};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const PARTITIONS: [i32; 3] = [0, 1, 2];

fn options(until_caught_up: bool) -> RunOptions {
    RunOptions {
        pipeline: "loop-test".into(),
        batch_interval: Duration::from_millis(40),
        on_poison: OnPoison::DeadLetter,
        until_caught_up,
        contract: Default::default(),
    }
}

/// Logs of 3 partitions with `per_partition` records each.
fn logs(per_partition: usize) -> Logs {
    let logs = Logs::default();
    for p in PARTITIONS {
        logs.append(p, per_partition, &[]);
    }
    logs
}

/// Runs a pipeline on `source` and `sink` (version 1, following
/// `versions`) until caught up, or until `shutdown` if given.
async fn run(
    source: MemorySource,
    sink: &FaultySink,
    versions: &FakeVersions,
    shutdown: Option<CancellationToken>,
) -> Result<RunStats, PipelineError> {
    let until_caught_up = shutdown.is_none();
    let pipeline = Pipeline::new(
        options(until_caught_up),
        source,
        sink.clone(),
        versions.clone(),
        FakeTransform::new(1),
        StatusBoard::default(),
    );
    let run = pipeline.run(shutdown.unwrap_or_default());
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the loop finished within a minute")
}

async fn run_to_the_end(logs: &Logs, sink: &FaultySink) -> RunStats {
    let source = MemorySource::new(logs, &PARTITIONS, 50);
    run(source, sink, &FakeVersions::new(1), None)
        .await
        .expect("the pipeline runs to the end")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_lands_once_in_ranges_that_tile_each_partition() {
    let logs = logs(300);
    let sink = FaultySink::default();
    let stats = run_to_the_end(&logs, &sink).await;
    let landed = assert_exactly_once(&logs, &sink, &PARTITIONS);
    assert_eq!(landed, 900);
    assert_eq!(stats.records, 900);
    assert_eq!(stats.batches as usize, sink.landed().len());
    for p in PARTITIONS {
        // Ranges end by position: the checkpoint is the log end, markers
        // included.
        assert_eq!(sink.checkpoint(p), Some(logs.end(p)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_between_prepare_and_commit_drops_the_batch_and_replans_from_the_checkpoint() {
    let logs = logs(300);
    let sink = FaultySink::default();
    // The second commit meets partition 1's checkpoint moved by another
    // owner, into the middle of what the batch planned.
    sink.on_attempt(
        2,
        Fault::FenceBy {
            partition: 1,
            to: 57,
        },
    );
    let stats = run_to_the_end(&logs, &sink).await;
    assert_eq!(stats.fenced, 1);
    let landed = sink.landed();
    let other = landed.iter().filter(|b| b.by_other_owner).count();
    assert_eq!(other, 1, "the other owner's commit stands");
    // Nothing the other owner committed is committed again.
    let own = assert_exactly_once(&logs, &sink, &PARTITIONS);
    let others_records = logs
        .offsets(1)
        .iter()
        .filter(|o| (50..57).contains(*o))
        .count();
    assert_eq!(own + others_records, 900);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_reply_is_settled_from_the_checkpoint_never_by_writing_again() {
    let logs = logs(200);
    let sink = FaultySink::default();
    sink.on_attempt(2, Fault::LoseReply);
    let stats = run_to_the_end(&logs, &sink).await;
    assert_eq!(assert_exactly_once(&logs, &sink, &PARTITIONS), 600);
    assert_eq!(stats.fenced, 0);
    // One attempt per landed batch: the lost reply was not retried.
    assert_eq!(sink.attempts(), sink.landed().len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_lost_before_it_landed_is_committed_again_once() {
    let logs = logs(200);
    let sink = FaultySink::default();
    sink.on_attempt(2, Fault::LoseRequest);
    sink.on_attempt(4, Fault::Unavailable);
    run_to_the_end(&logs, &sink).await;
    assert_eq!(assert_exactly_once(&logs, &sink, &PARTITIONS), 600);
    // Two attempts that landed nothing, each tried again.
    assert_eq!(sink.attempts(), sink.landed().len() + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_during_the_read_ahead_reprepares_the_next_batch_with_the_new_version() {
    let logs = logs(300);
    let sink = FaultySink::default();
    let versions = FakeVersions::new(1);
    // Version 2 is activated while the second batch commits, and the commit
    // lasts long enough for the loop to notice and read ahead.
    let activate = versions.clone();
    sink.on_attempt(
        2,
        Fault::During {
            cue: Box::new(move || activate.activate(2)),
            for_: Duration::from_millis(100),
        },
    );
    let source = MemorySource::new(&logs, &PARTITIONS, 50);
    run(source, &sink, &versions, None).await.unwrap();
    assert_eq!(assert_exactly_once(&logs, &sink, &PARTITIONS), 900);
    let landed = sink.landed();
    // No batch mixes versions: every row was made by its plan's module.
    for b in &landed {
        for (version, ..) in &b.rows {
            assert_eq!(
                b.module_digest,
                format!("module-v{version}"),
                "batch {}",
                b.batch_id
            );
        }
    }
    // The batch in flight kept version 1; every later one runs version 2.
    let digests: Vec<&str> = landed.iter().map(|b| b.module_digest.as_str()).collect();
    assert_eq!(&digests[..2], ["module-v1", "module-v1"]);
    assert!(
        digests[2..].iter().all(|d| *d == "module-v2"),
        "{digests:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_mid_commit_drains_and_a_restart_resumes_exactly_where_it_stopped() {
    let logs = logs(300);
    let sink = FaultySink::default();
    let shutdown = CancellationToken::new();
    let cancel = shutdown.clone();
    sink.on_attempt(
        3,
        Fault::During {
            cue: Box::new(move || cancel.cancel()),
            for_: Duration::from_millis(80),
        },
    );
    let source = MemorySource::new(&logs, &PARTITIONS, 50);
    let stats = run(source, &sink, &FakeVersions::new(1), Some(shutdown))
        .await
        .expect("a shutdown is a clean stop");
    // The batch in flight landed, and so did one prepared before the
    // shutdown (if any): nothing prepared is dropped.
    let landed = sink.landed();
    assert!(landed.len() >= 3, "the batch committing at shutdown landed");
    assert_eq!(stats.batches as usize, landed.len());
    let before_restart = assert_exactly_once(&logs, &sink, &PARTITIONS);
    assert!(before_restart < 900, "the shutdown stopped the run early");
    // A new instance resumes from the checkpoints.
    run_to_the_end(&logs, &sink).await;
    assert_eq!(assert_exactly_once(&logs, &sink, &PARTITIONS), 900);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_revoked_mid_batch_and_given_back_resumes_from_its_checkpoint() {
    let logs = logs(300);
    let sink = FaultySink::default();
    let source = MemorySource::new(&logs, &PARTITIONS, 50);
    let ownership = source.ownership();
    let (revoke, assign) = (ownership.clone(), ownership);
    // Partition 2 is revoked while batch 2 (which holds it) commits, and
    // given back while batch 4 commits.
    sink.on_attempt(
        2,
        Fault::During {
            cue: Box::new(move || revoke.lock().unwrap().push_back(Ownership::Revoke(2))),
            for_: Duration::from_millis(60),
        },
    );
    sink.on_attempt(
        4,
        Fault::During {
            cue: Box::new(move || assign.lock().unwrap().push_back(Ownership::Assign(2))),
            for_: Duration::from_millis(60),
        },
    );
    run(source, &sink, &FakeVersions::new(1), None)
        .await
        .unwrap();
    assert_eq!(assert_exactly_once(&logs, &sink, &PARTITIONS), 900);
    let without_2 = sink.landed()[2..4]
        .iter()
        .any(|b| b.ranges.iter().all(|r| r.partition != 2));
    assert!(
        without_2,
        "batches ran without partition 2 while it was revoked"
    );
    // The sink heard once that partition 2 left (and let go of what it
    // kept for it); taking it back read its checkpoint again.
    assert_eq!(sink.released(), vec![tp(2)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_become_dead_letters_and_the_rest_commits() {
    let logs = Logs::default();
    logs.append(0, 120, &[7, 64]);
    logs.append(1, 120, &[]);
    logs.append(2, 120, &[119]);
    let sink = FaultySink::default();
    let stats = run_to_the_end(&logs, &sink).await;
    assert_eq!(assert_exactly_once(&logs, &sink, &PARTITIONS), 360);
    let dead: Vec<(i32, i64, DeadLetterKind)> = sink
        .landed()
        .iter()
        .flat_map(|b| b.dead_letters.clone())
        .collect();
    let poison_offsets =
        |p: i32, at: &[usize]| -> Vec<i64> { at.iter().map(|i| logs.offsets(p)[*i]).collect() };
    let mut expected: Vec<(i32, i64, DeadLetterKind)> = Vec::new();
    for (p, at) in [(0, vec![7, 64]), (2, vec![119])] {
        for o in poison_offsets(p, &at) {
            expected.push((p, o, DeadLetterKind::Trap));
        }
    }
    let mut dead_sorted = dead.clone();
    dead_sorted.sort_by_key(|d| (d.0, d.1));
    assert_eq!(dead_sorted, expected);
    assert_eq!(stats.dead_letters, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_with_on_poison_fail_stops_the_loop_and_commits_nothing_of_that_batch() {
    let logs = Logs::default();
    logs.append(0, 30, &[12]);
    let sink = FaultySink::default();
    let pipeline = Pipeline::new(
        RunOptions {
            on_poison: OnPoison::Fail,
            ..options(true)
        },
        MemorySource::new(&logs, &[0], 50),
        sink.clone(),
        FakeVersions::new(1),
        FakeTransform::new(1),
        StatusBoard::default(),
    );
    let err = pipeline.run(CancellationToken::new()).await.unwrap_err();
    assert!(
        matches!(err, PipelineError::Transform { .. }),
        "stopped on the poison: {err}"
    );
    let poison = format!("poison at offset {}", logs.offsets(0)[12]);
    assert!(err.to_string().contains(&poison), "{err}");
    assert!(sink.landed().is_empty());
    assert_eq!(sink.checkpoint(0), None);
}
