//! The `sluice reset` steps every sink's reset test takes through the CLI:
//! one partition moved back, and a reset under a running instance. Each
//! sink's test counts what landed its own way (the closures).
//!
//! It must not assert on a sink's contents itself.

use crate::control::{Host, sluice_ok};
use crate::{numbered, produce};
use std::path::Path;
use std::time::{Duration, Instant};

/// After a run over 100 records per partition of `topic`: `sluice reset
/// CONFIG --to-offset 50 --partition TOPIC:0`, asserting it says the move,
/// the first archive (`PIPELINE@reset-1`) and that re-run records come
/// again. Returns what it printed.
pub fn partition_0_back_to_50(config: &Path, topic: &str, pipeline: &str) -> String {
    let partition = format!("{topic}:0");
    let config = config.to_str().unwrap();
    let moved = sluice_ok(&[
        "reset",
        config,
        "--to-offset",
        "50",
        "--partition",
        &partition,
    ]);
    assert!(
        moved.contains(&format!("{topic}[0]: checkpoint 100 -> 50")),
        "{moved}"
    );
    assert!(moved.contains(&format!("`{pipeline}@reset-1`")), "{moved}");
    assert!(moved.contains("appended again"), "{moved}");
    moved
}

/// Starts an instance of `config` (its log in `dir`), resets all of
/// `topic`'s partitions to the log start under it, produces 10 more
/// records over 2 partitions and waits until `landed()` reaches `want`:
/// the instance was fenced at its next commit and continued from the new
/// checkpoint. Returns the reset's output.
pub async fn under_a_running_instance(
    config: &Path,
    dir: &Path,
    brokers: &str,
    topic: &str,
    want: i64,
    landed: impl AsyncFn() -> i64,
) -> String {
    let host = Host::start(config, &dir.join("running.log"));
    host.wait_for_log("reading partition", 2, Duration::from_secs(60));
    let moved = sluice_ok(&["reset", config.to_str().unwrap(), "--to-earliest"]);
    produce(brokers, topic, &numbered("late", 10, 2));
    let deadline = Instant::now() + Duration::from_secs(60);
    while landed().await < want {
        assert!(
            Instant::now() < deadline,
            "not re-read after the reset:\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(host.log().contains("fenced"), "{}", host.log());
    host.stop();
    assert_eq!(landed().await, want, "more than re-read after the reset");
    moved
}
