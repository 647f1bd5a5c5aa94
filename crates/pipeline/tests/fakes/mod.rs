//! In-process fakes for the batch loop's tests: a source over in-memory
//! logs, a sink that keeps checkpoints and rows in memory and injects, on
//! cue, the faults real services cannot produce when a test wants them (a
//! fence between prepare and commit, a lost commit reply, an outage, a
//! shutdown or a revoke while a commit is in flight), a transform in plain
//! Rust and a version store a test flips.
//!
//! They are fakes, named as such: they stand beside the real-service suites
//! in `tests/` (real Kafka, SQLite, Postgres, MariaDB, real Wasm), never
//! instead of them. They must not hold loop logic: what they decide (the CAS) mirrors
//! what the real backends do, and the source keeps its offsets in the
//! core's cursors, the same code the Kafka source runs.

use sluice_core::batch::{OffsetRange, OwnedRecord, Plan, Records, TopicPartition};
use sluice_core::cursor::{Caps, Cursors, Read};
use sluice_core::limits::Limits;
use sluice_core::output::{Column, ColumnData, Output, TargetRows};
use sluice_core::sink::{Commit, CommitOutcome, DeadLetterKind, Sink, SinkError};
use sluice_core::source::{PartitionProgress, PollSignals, Source, SourceError};
use sluice_core::transform::{RunError, Transform};
use sluice_core::versions::{Swap, VersionError, Versions};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const TOPIC: &str = "events";

/// A record value the fake transform traps on (a poison record).
pub const POISON: &[u8] = b"poison";

pub fn tp(partition: i32) -> TopicPartition {
    TopicPartition {
        topic: TOPIC.into(),
        partition,
    }
}

/// Partition logs shared by the source and the test. Offsets are not dense:
/// every tenth offset is skipped (a transaction marker), as in Kafka.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<BTreeMap<TopicPartition, Vec<OwnedRecord>>>>);

impl Logs {
    /// Appends `n` records to `partition`; `poison` marks which (by their
    /// position in this append) carry the poison value.
    pub fn append(&self, partition: i32, n: usize, poison: &[usize]) {
        let mut logs = self.0.lock().unwrap();
        let log = logs.entry(tp(partition)).or_default();
        let mut next = log.last().map(|r| r.offset + 1).unwrap_or(0);
        for i in 0..n {
            if next % 10 == 9 {
                next += 1; // a marker: no record at this offset
            }
            let value = match poison.contains(&i) {
                true => POISON.to_vec(),
                false => format!("p{partition}-{next}").into_bytes(),
            };
            log.push(OwnedRecord {
                offset: next,
                timestamp: 1_700_000_000_000 + next,
                key: None,
                value: Some(value),
                headers: vec![],
            });
            next += 1;
        }
    }

    /// The log end (the offset after the last record).
    pub fn end(&self, partition: i32) -> i64 {
        let logs = self.0.lock().unwrap();
        logs.get(&tp(partition))
            .and_then(|l| l.last())
            .map(|r| r.offset + 1)
            .unwrap_or(0)
    }

    /// Every record offset of `partition`.
    pub fn offsets(&self, partition: i32) -> Vec<i64> {
        let logs = self.0.lock().unwrap();
        logs.get(&tp(partition))
            .map(|l| l.iter().map(|r| r.offset).collect())
            .unwrap_or_default()
    }

    fn snapshot(&self, t: &TopicPartition) -> Vec<OwnedRecord> {
        self.0.lock().unwrap().get(t).cloned().unwrap_or_default()
    }
}

/// An ownership change the test queues; the source applies it at its next
/// poll or hold, as a consumer-group rebalance would.
#[derive(Debug, Clone)]
pub enum Ownership {
    Revoke(i32),
    Assign(i32),
}

/// A source over [`Logs`]; owns the partitions it is given, and follows the
/// [`Ownership`] changes queued on its handle. Its offsets are kept by the
/// core's [`Cursors`], as the Kafka source's are.
pub struct MemorySource {
    logs: Logs,
    cursors: Cursors,
    changes: Arc<Mutex<VecDeque<Ownership>>>,
}

impl MemorySource {
    pub fn new(logs: &Logs, partitions: &[i32], max_per_partition: i64) -> Self {
        let mut cursors = Cursors::new(Caps {
            per_partition: max_per_partition,
            per_batch: None,
        });
        cursors.assign(partitions.iter().map(|&p| tp(p)));
        MemorySource {
            logs: logs.clone(),
            cursors,
            changes: Arc::default(),
        }
    }

    /// Where a test queues ownership changes.
    pub fn ownership(&self) -> Arc<Mutex<VecDeque<Ownership>>> {
        Arc::clone(&self.changes)
    }

    fn apply_ownership_changes(&mut self) {
        let changes: Vec<_> = self.changes.lock().unwrap().drain(..).collect();
        for change in changes {
            match change {
                Ownership::Revoke(p) => self.cursors.revoke([&tp(p)]),
                Ownership::Assign(p) => self.cursors.assign([tp(p)]),
            }
        }
    }
}

impl Source for MemorySource {
    fn poll(&mut self, wait: Duration, signals: &PollSignals) -> Result<(), SourceError> {
        self.apply_ownership_changes();
        let mut read = false;
        let started: Vec<TopicPartition> = self.cursors.started().map(|(t, _)| t.clone()).collect();
        for t in started {
            for record in self.logs.snapshot(&t) {
                read |= self
                    .cursors
                    .read(&t, record.offset, |r| r.push_owned(&record))
                    != Read::Ignored;
            }
            let end = self.logs.end(t.partition);
            self.cursors.advance(&t, end);
            self.cursors.reached(&t, end);
        }
        if !read {
            let until = std::time::Instant::now() + wait.min(Duration::from_millis(20));
            while std::time::Instant::now() < until && !signals.interrupted() {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Ok(())
    }

    fn hold(&mut self, done: &Receiver<()>) {
        let _ = done.recv();
        self.apply_ownership_changes();
    }

    fn start_partitions(
        &mut self,
        starts: &[(TopicPartition, Option<i64>)],
    ) -> Result<(), SourceError> {
        for (t, from) in starts {
            self.cursors.start(t, from.unwrap_or(0));
        }
        Ok(())
    }

    fn progress(&self) -> Vec<PartitionProgress> {
        self.cursors.progress(|t| Some(self.logs.end(t.partition)))
    }

    fn cursors(&self) -> &Cursors {
        &self.cursors
    }

    fn cursors_mut(&mut self) -> &mut Cursors {
        &mut self.cursors
    }
}

/// A transform in plain Rust: one row per record (`partition`, `offset`,
/// and the number of the version that made it); traps on [`POISON`].
pub struct FakeTransform {
    pub version: i64,
    digest: String,
    limits: Limits,
}

impl FakeTransform {
    pub fn new(version: i64) -> Self {
        FakeTransform {
            version,
            digest: format!("module-v{version}"),
            limits: Limits::default(),
        }
    }
}

impl Transform for FakeTransform {
    fn module_digest(&self) -> &str {
        &self.digest
    }
    fn params(&self) -> &str {
        "{}"
    }
    fn limits(&self) -> &Limits {
        &self.limits
    }
    fn run(
        &self,
        _plan: &Plan,
        records: &Records,
        _state: std::sync::Arc<dyn sluice_core::state::StateBase>,
    ) -> Result<Output, RunError> {
        let (mut partitions, mut offsets) = (Vec::new(), Vec::new());
        for r in records.iter() {
            if r.value == Some(POISON) {
                return Err(RunError::Trap(format!("poison at offset {}", r.offset)));
            }
            partitions.push(r.partition as i64);
            offsets.push(r.offset);
        }
        let int = |name: &str, values: Vec<i64>| Column {
            name: name.into(),
            nulls: vec![],
            data: ColumnData::Int64(values),
        };
        Ok(Output {
            targets: vec![TargetRows {
                target: "rows".into(),
                rows: offsets.len() as u32,
                columns: vec![
                    int("version", vec![self.version; offsets.len()]),
                    int("partition", partitions),
                    int("offset", offsets),
                ],
            }],
            rejections: vec![],
            late: Vec::new(),
            state: Default::default(),
        })
    }
}

/// The versions a test activates: `newer` offers the active one when it is
/// not the running one.
#[derive(Clone, Default)]
pub struct FakeVersions {
    active: Arc<Mutex<i64>>,
}

impl FakeVersions {
    pub fn new(active: i64) -> Self {
        FakeVersions {
            active: Arc::new(Mutex::new(active)),
        }
    }
    pub fn activate(&self, version: i64) {
        *self.active.lock().unwrap() = version;
    }
}

impl Versions for FakeVersions {
    type Transform = FakeTransform;
    async fn newer(
        &self,
        running: &FakeTransform,
    ) -> Result<Option<Swap<FakeTransform>>, VersionError> {
        let active = *self.active.lock().unwrap();
        Ok((active != running.version).then(|| Swap {
            version: active,
            transform: FakeTransform::new(active),
        }))
    }
}

/// What one commit attempt meets, queued by the test.
pub enum Fault {
    /// Another owner commits `[checkpoint, to)` of `partition` first: the
    /// attempt finds the checkpoint moved and is fenced.
    FenceBy { partition: i32, to: i64 },
    /// The commit lands but its reply is lost.
    LoseReply,
    /// The reply is lost and nothing landed (the connection died before).
    LoseRequest,
    /// The sink cannot be reached.
    Unavailable,
    /// Runs `cue` (a shutdown, a revoke, an activation), then waits `for_`,
    /// then commits normally: something happens while the commit is in
    /// flight.
    During {
        cue: Box<dyn FnOnce() + Send>,
        for_: Duration,
    },
}

/// One committed batch as the fake sink stores it.
#[derive(Debug, Clone)]
pub struct Landed {
    pub batch_id: String,
    pub module_digest: String,
    pub ranges: Vec<OffsetRange>,
    /// (version, partition, offset) of every row.
    pub rows: Vec<(i64, i32, i64)>,
    /// (partition, offset, kind) of every dead letter.
    pub dead_letters: Vec<(i32, i64, DeadLetterKind)>,
    /// By the pipeline under test, or by the "other owner" of a fence.
    pub by_other_owner: bool,
}

#[derive(Default)]
struct Stored {
    checkpoints: HashMap<TopicPartition, i64>,
    landed: Vec<Landed>,
    attempts: usize,
    /// What the loop said this instance no longer owns, in order.
    released: Vec<TopicPartition>,
}

/// A sink in memory with the offset compare-and-set of the real ones, and
/// faults queued per commit attempt (1-based).
#[derive(Clone, Default)]
pub struct FaultySink {
    stored: Arc<Mutex<Stored>>,
    faults: Arc<Mutex<HashMap<usize, Fault>>>,
}

impl FaultySink {
    /// Queues `fault` for commit attempt `attempt` (counting from 1).
    pub fn on_attempt(&self, attempt: usize, fault: Fault) {
        self.faults.lock().unwrap().insert(attempt, fault);
    }

    pub fn landed(&self) -> Vec<Landed> {
        self.stored.lock().unwrap().landed.clone()
    }

    pub fn checkpoint(&self, partition: i32) -> Option<i64> {
        self.stored
            .lock()
            .unwrap()
            .checkpoints
            .get(&tp(partition))
            .copied()
    }

    pub fn attempts(&self) -> usize {
        self.stored.lock().unwrap().attempts
    }

    /// The partitions the loop released, in order.
    pub fn released(&self) -> Vec<TopicPartition> {
        self.stored.lock().unwrap().released.clone()
    }

    /// The CAS and the write, as one step under the lock.
    fn apply(&self, commit: &Commit<'_>) -> CommitOutcome {
        let mut stored = self.stored.lock().unwrap();
        for r in &commit.plan.ranges {
            let found = stored.checkpoints.get(&r.topic_partition()).copied();
            if found.unwrap_or(r.from) != r.from {
                return CommitOutcome::Fenced {
                    partition: r.topic_partition().to_string(),
                    expected: r.from,
                    found,
                };
            }
        }
        for r in &commit.plan.ranges {
            stored.checkpoints.insert(r.topic_partition(), r.until);
        }
        stored.landed.push(landed_of(commit));
        CommitOutcome::Committed
    }

    /// The other owner of a fence: commits `[checkpoint, to)` itself.
    fn other_owner_commits(&self, partition: i32, to: i64) {
        let mut stored = self.stored.lock().unwrap();
        let from = stored.checkpoints.get(&tp(partition)).copied().unwrap_or(0);
        stored.checkpoints.insert(tp(partition), to);
        stored.landed.push(Landed {
            batch_id: format!("other-owner-{partition}-{from}-{to}"),
            module_digest: String::new(),
            ranges: vec![OffsetRange {
                topic: TOPIC.into(),
                partition,
                from,
                until: to,
            }],
            rows: vec![],
            dead_letters: vec![],
            by_other_owner: true,
        });
    }
}

fn landed_of(commit: &Commit<'_>) -> Landed {
    let target = &commit.output.targets[0];
    let ints = |i: usize| match &target.columns[i].data {
        ColumnData::Int64(v) => v.clone(),
        other => panic!("fake transform writes ints, found {other:?}"),
    };
    let (versions, partitions, offsets) = (ints(0), ints(1), ints(2));
    let records: Vec<_> = commit.records.iter().collect();
    Landed {
        batch_id: commit.plan.batch_id.clone(),
        module_digest: commit.plan.module_digest.clone(),
        ranges: commit.plan.ranges.clone(),
        rows: (0..offsets.len())
            .map(|i| (versions[i], partitions[i] as i32, offsets[i]))
            .collect(),
        dead_letters: commit
            .dead_letters
            .iter()
            .map(|d| (records[d.index].partition, records[d.index].offset, d.kind))
            .collect(),
        by_other_owner: false,
    }
}

impl Sink for FaultySink {
    async fn checkpoints(
        &self,
        _pipeline: &str,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError> {
        let stored = self.stored.lock().unwrap();
        Ok(partitions
            .iter()
            .filter_map(|t| stored.checkpoints.get(t).map(|o| (t.clone(), *o)))
            .collect())
    }

    async fn commit(&self, commit: &Commit<'_>) -> Result<CommitOutcome, SinkError> {
        let attempt = {
            let mut stored = self.stored.lock().unwrap();
            stored.attempts += 1;
            stored.attempts
        };
        let fault = self.faults.lock().unwrap().remove(&attempt);
        match fault {
            None => Ok(self.apply(commit)),
            Some(Fault::FenceBy { partition, to }) => {
                self.other_owner_commits(partition, to);
                Ok(self.apply(commit))
            }
            Some(Fault::LoseReply) => {
                self.apply(commit);
                Err(SinkError::commit_unknown("fake", "the reply was lost"))
            }
            Some(Fault::LoseRequest) => Err(SinkError::commit_unknown(
                "fake",
                "the connection died before the commit",
            )),
            Some(Fault::Unavailable) => Err(SinkError::unavailable("fake", "sink down")),
            Some(Fault::During { cue, for_ }) => {
                cue();
                tokio::time::sleep(for_).await;
                Ok(self.apply(commit))
            }
        }
    }

    fn released(&self, partitions: &[TopicPartition]) {
        self.stored
            .lock()
            .unwrap()
            .released
            .extend_from_slice(partitions);
    }
}

/// Checks exactly-once against the logs: per partition, the landed ranges
/// tile `[0, checkpoint)` without gaps or overlaps, and every record in the
/// pipeline's own ranges is in its batch's rows or dead letters exactly
/// once (records in the other owner's ranges are the other owner's).
/// Returns the number of records the pipeline itself landed.
pub fn assert_exactly_once(logs: &Logs, sink: &FaultySink, partitions: &[i32]) -> usize {
    let landed = sink.landed();
    let mut own = 0;
    for &p in partitions {
        let mut ranges: Vec<(i64, i64, bool)> = landed
            .iter()
            .flat_map(|b| {
                b.ranges
                    .iter()
                    .filter(|r| r.partition == p)
                    .map(|r| (r.from, r.until, b.by_other_owner))
            })
            .collect();
        ranges.sort();
        let mut at = 0;
        for (from, until, _) in &ranges {
            assert_eq!(
                *from, at,
                "partition {p}: ranges {ranges:?} leave a gap or overlap"
            );
            at = *until;
        }
        assert_eq!(
            sink.checkpoint(p).unwrap_or(0),
            at,
            "partition {p}: checkpoint"
        );
        let mut seen: Vec<i64> = landed
            .iter()
            .flat_map(|b| {
                let rows = b.rows.iter().filter(|r| r.1 == p).map(|r| r.2);
                let dead = b.dead_letters.iter().filter(|d| d.0 == p).map(|d| d.1);
                rows.chain(dead).collect::<Vec<_>>()
            })
            .collect();
        seen.sort();
        let expected: Vec<i64> = logs
            .offsets(p)
            .into_iter()
            .filter(|o| {
                ranges
                    .iter()
                    .any(|(from, until, other)| !other && o >= from && o < until)
            })
            .collect();
        assert_eq!(seen, expected, "partition {p}: records landed vs log");
        own += seen.len();
    }
    own
}
