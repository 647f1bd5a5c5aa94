//! The state store: what must outlive a process and be shared by every
//! instance of a pipeline. The module store (components by sha256, each
//! pipeline's activations) and the lineage reader (committed batches, for
//! `verify` and `shadow`). Each sink kind says where its state lives (the
//! SQL sinks keep it in their own database); the traits here keep the
//! control plane, replay and version following free of any one backend.
//!
//! Owns what a "version" is: a (module digest, params) pair activated for a
//! pipeline under an increasing number. Lineage rows name the module and
//! params digests a batch ran, which map back to a version here. It must not
//! write lineage: lineage is written only in the sink's batch commit.

use crate::batch::{OffsetRange, now_ms};
use crate::error::{Cause, prefixed};
use crate::sink::{Commit, SinkError};
use serde::{Deserialize, Serialize};

/// The module store of one pipeline's state store. Object-safe (held as
/// `Arc<dyn ModuleStore>` by the control plane, replay and the runtime's
/// version following). A version row is only ever appended: rollback
/// appends the earlier version again.
#[async_trait::async_trait]
pub trait ModuleStore: Send + Sync {
    /// Stores `component` under its sha256 (a no-op if already stored) and
    /// returns the digest.
    async fn put(&self, component: &[u8]) -> Result<String, StoreError>;
    /// The component stored under `digest`.
    async fn get(&self, digest: &str) -> Result<Vec<u8>, StoreError>;
    /// The version `pipeline` runs now, if any was ever activated.
    async fn active(&self, pipeline: &str) -> Result<Option<Version>, StoreError>;
    /// Every activation of `pipeline`, oldest first.
    async fn history(&self, pipeline: &str) -> Result<Vec<Version>, StoreError>;
    /// Makes (`digest`, `params`) the active version of `pipeline`: appends
    /// a version numbered one past the newest. `action` says why.
    async fn activate(
        &self,
        pipeline: &str,
        digest: &str,
        params: &str,
        action: Activation,
    ) -> Result<Version, StoreError>;
    /// Activates (`digest`, `params`) as version 1 if `pipeline` has no
    /// version yet (its first start); returns the active version either
    /// way. Several instances starting at once seed it once.
    async fn seed(&self, pipeline: &str, digest: &str, params: &str)
    -> Result<Version, StoreError>;

    /// The distinct (module, params) pairs `pipeline` has run, each with the
    /// last version number that activated it.
    async fn summary(&self, pipeline: &str) -> Result<Vec<VersionSummary>, StoreError> {
        let history = self.history(pipeline).await?;
        let active = history.last().map(|v| v.version);
        let mut out: Vec<VersionSummary> = Vec::new();
        for v in history {
            out.retain(|s| {
                !(s.module_digest == v.module_digest && s.params_digest == v.params_digest)
            });
            out.push(VersionSummary {
                active: Some(v.version) == active,
                version: v.version,
                module_digest: v.module_digest,
                params_digest: v.params_digest,
                params: v.params,
            });
        }
        Ok(out)
    }

    /// The params `pipeline` ran with under `params_digest`.
    async fn params_for(
        &self,
        pipeline: &str,
        params_digest: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(self
            .history(pipeline)
            .await?
            .into_iter()
            .find(|v| v.params_digest == params_digest)
            .map(|v| v.params))
    }

    /// Activates the version that ran before the active one: the newest
    /// earlier activation with another module or other params.
    async fn rollback(&self, pipeline: &str) -> Result<Version, StoreError> {
        let history = self.history(pipeline).await?;
        let Some(current) = history.last() else {
            return Err(StoreError::NothingToRollBack(pipeline.to_string()));
        };
        let previous = history
            .iter()
            .rev()
            .find(|v| {
                v.module_digest != current.module_digest || v.params_digest != current.params_digest
            })
            .ok_or_else(|| StoreError::NothingToRollBack(pipeline.to_string()))?;
        self.activate(
            pipeline,
            &previous.module_digest,
            &previous.params,
            Activation::Rollback,
        )
        .await
    }
}

/// Reads a pipeline's lineage back (read-only).
#[async_trait::async_trait]
pub trait LineageStore: Send + Sync {
    /// The selected committed batches of `pipeline`, in commit order.
    async fn batches(
        &self,
        pipeline: &str,
        selection: &Selection,
    ) -> Result<Vec<CommittedBatch>, SinkError>;
    /// The keyed state batch `batch_id`'s runs read as it started (what a
    /// replay of it serves its state calls from); empty if it read none, or
    /// the store keeps no state.
    async fn state_reads(
        &self,
        _pipeline: &str,
        _batch_id: &str,
    ) -> Result<crate::state::StateMap, SinkError> {
        Ok(crate::state::StateMap::default())
    }
}

/// One activation of a pipeline: from `activated_at_ms` on, its batches run
/// this module with these params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    pub pipeline: String,
    /// Increasing per pipeline; a rollback appends a new number.
    pub version: i64,
    /// sha256 of the component, hex.
    pub module_digest: String,
    /// The params handed to `init`, JSON. (The control API leaves it out
    /// for a reader without the token: it may hold secrets.)
    #[serde(default)]
    pub params: String,
    /// sha256 of `params`, hex (what lineage rows record).
    pub params_digest: String,
    /// Why it was activated: `seed` (first start, from the config),
    /// `activate` or `rollback`.
    pub action: String,
    pub activated_at_ms: i64,
}

/// A distinct (module, params) pair a pipeline has run, with the last
/// version number that activated it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionSummary {
    pub version: i64,
    pub module_digest: String,
    pub params_digest: String,
    /// Left out by the control API for a reader without the token.
    #[serde(default)]
    pub params: String,
    pub active: bool,
}

/// Why a version was activated (recorded as [`Version::action`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// The pipeline's first start made the configured module version 1.
    Seed,
    /// `sluice deploy --activate` or `sluice activate`.
    Activate,
    /// `sluice rollback`: the version before the active one, again.
    Rollback,
}

impl Activation {
    /// As the store records it: `seed`, `activate`, `rollback`.
    pub fn as_str(self) -> &'static str {
        match self {
            Activation::Seed => "seed",
            Activation::Activate => "activate",
            Activation::Rollback => "rollback",
        }
    }
}

/// Why the module store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached: retry later.
    #[error("module store unavailable{}", prefixed(.context))]
    Unavailable {
        context: String,
        #[source]
        cause: Option<Cause>,
    },
    /// The database refused a write while another held its lock (SQLite):
    /// retry shortly.
    #[error("module store busy")]
    Busy(#[source] Cause),
    /// Any other database error.
    #[error("module store{}", prefixed(.context))]
    Database {
        context: String,
        #[source]
        cause: Option<Cause>,
    },
    /// The pipeline keeps no module store where it says (a sink kind with
    /// no state and no `[state]`).
    #[error("module store configuration: {0}")]
    Config(String),
    /// The settings the store opens with do not fit (a bad URL, names the
    /// database refuses).
    #[error("module store configuration")]
    Settings(#[source] SinkError),
    #[error("no module with digest {0} in the store (upload it first)")]
    UnknownModule(String),
    #[error("pipeline `{0}` has no earlier version to roll back to")]
    NothingToRollBack(String),
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. } | StoreError::Busy(_))
    }
}

/// One committed batch as its lineage rows record it.
#[derive(Debug, Clone)]
pub struct CommittedBatch {
    pub batch_id: String,
    pub module_digest: String,
    pub params_digest: String,
    pub batch_time_ms: i64,
    pub output_digest: String,
    pub committed_at_ms: i64,
    /// The engine, limits and poison policy it ran under (JSON of
    /// `ReplaySettings`); empty for batches committed before they were
    /// recorded.
    pub settings: String,
    pub ranges: Vec<OffsetRange>,
}

impl CommittedBatch {
    /// A redrive of dead letters: no ranges to read again (its records
    /// were the dead letters it removed), so it cannot be replayed.
    pub fn is_redrive(&self) -> bool {
        self.ranges.is_empty()
            && self
                .batch_id
                .starts_with(crate::dead_letters::REDRIVE_PREFIX)
    }
}

/// Which committed batches to replay; empty fields select everything.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only these batch ids.
    pub batch_ids: Vec<String>,
    /// Only batches committed at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Only batches committed before this time.
    pub until_ms: Option<i64>,
    /// Only batches with a range of this partition overlapping
    /// `[from, until)`: (topic, partition, from, until).
    pub offsets: Option<(String, i32, i64, i64)>,
    /// Only the newest `last` batches (after the filters above).
    pub last: Option<usize>,
}

impl Selection {
    /// True if `b` is selected.
    pub fn keeps(&self, b: &CommittedBatch) -> bool {
        (self.batch_ids.is_empty() || self.batch_ids.contains(&b.batch_id))
            && self.since_ms.is_none_or(|t| b.committed_at_ms >= t)
            && self.until_ms.is_none_or(|t| b.committed_at_ms < t)
            && self.offsets.as_ref().is_none_or(|(topic, p, from, until)| {
                b.ranges.iter().any(|r| {
                    &r.topic == topic && r.partition == *p && r.from < *until && *from < r.until
                })
            })
    }

    /// Keeps the newest `last` of `batches` (in commit order), if set.
    pub fn keep_last(&self, batches: &mut Vec<CommittedBatch>) {
        if let Some(last) = self.last {
            batches.drain(..batches.len().saturating_sub(last));
        }
    }
}

/// One committed batch as a JSON lineage entry: how the sinks without
/// tables (Redis, Kafka) store their lineage.
#[derive(Debug, Serialize, Deserialize)]
pub struct LineageEntry {
    pub batch_id: String,
    pub module_digest: String,
    pub params_digest: String,
    pub batch_time_ms: i64,
    pub records: u64,
    pub rows: u64,
    pub dead_letters: u64,
    pub output_digest: String,
    pub committed_at_ms: i64,
    pub settings: String,
    pub ranges: Vec<OffsetRange>,
    /// The keyed state the batch's runs read as it started, as
    /// [`crate::state::StateMap::encode`] writes it, in hex; empty (and
    /// left out) if it read none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state_reads: String,
}

impl LineageEntry {
    pub fn of(c: &Commit<'_>) -> LineageEntry {
        LineageEntry {
            batch_id: c.plan.batch_id.clone(),
            module_digest: c.plan.module_digest.clone(),
            params_digest: c.plan.params_digest.clone(),
            batch_time_ms: c.plan.batch_time_ms,
            records: c.records.len() as u64,
            rows: c.output.row_count(),
            dead_letters: c.dead_letters.len() as u64,
            output_digest: c.output_digest.to_string(),
            committed_at_ms: now_ms(),
            settings: c.plan.settings.clone(),
            ranges: c.plan.ranges.clone(),
            state_reads: match c.state_reads.is_empty() {
                true => String::new(),
                false => hex::encode(c.state_reads.encode()),
            },
        }
    }

    /// The state reads it recorded.
    pub fn reads(&self) -> Result<crate::state::StateMap, SinkError> {
        let bytes = hex::decode(&self.state_reads)
            .map_err(|e| SinkError::database("a lineage entry's state reads", e))?;
        match bytes.is_empty() {
            true => Ok(crate::state::StateMap::default()),
            false => crate::state::StateMap::decode(&bytes)
                .map_err(|e| SinkError::database("a lineage entry's state reads", e)),
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("lineage entries serialize")
    }

    pub fn into_batch(self) -> CommittedBatch {
        CommittedBatch {
            batch_id: self.batch_id,
            module_digest: self.module_digest,
            params_digest: self.params_digest,
            batch_time_ms: self.batch_time_ms,
            output_digest: self.output_digest,
            committed_at_ms: self.committed_at_ms,
            settings: self.settings,
            ranges: self.ranges,
        }
    }
}

/// The state reads batch `batch_id`'s newest entry among `entries`
/// (lineage entries' JSON) recorded (empty if it recorded none); `None` if
/// it is not there. (The newest: a batch the same plan gave again after a
/// reset may have started from other state.)
pub fn entry_state_reads<T: AsRef<[u8]>>(
    entries: impl IntoIterator<Item = T>,
    batch_id: &str,
) -> Result<Option<crate::state::StateMap>, SinkError> {
    let mut found = None;
    for entry in entries {
        if ResetMark::parse(entry.as_ref())?.is_some() {
            continue;
        }
        let entry: LineageEntry = serde_json::from_slice(entry.as_ref())
            .map_err(|e| SinkError::database("a lineage entry is not sluice's JSON", e))?;
        if entry.batch_id == batch_id {
            found = Some(entry);
        }
    }
    found.map(|entry| entry.reads()).transpose()
}

/// A reset's mark in a lineage log that cannot be rewritten (the Kafka
/// sink's lineage topic): the batches before it with a range of its
/// partition that ends past `to` are the old run's, as if a SQL sink's
/// reset had moved them to `PIPELINE@reset-N`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetMark {
    /// N of this reset (the first is 1). First, so a mark's JSON starts
    /// with `{"reset":` and a lineage entry is told from it unparsed.
    pub reset: u64,
    pub topic: String,
    pub partition: i32,
    /// The partition's new checkpoint.
    pub to: i64,
    pub at_ms: i64,
}

impl ResetMark {
    const OPENING: &[u8] = b"{\"reset\":";

    /// The mark `entry` is, or `None` for a batch's entry.
    pub fn parse(entry: &[u8]) -> Result<Option<ResetMark>, SinkError> {
        if !entry.starts_with(Self::OPENING) {
            return Ok(None);
        }
        serde_json::from_slice(entry)
            .map(Some)
            .map_err(|e| SinkError::database("a lineage reset mark is not sluice's JSON", e))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("reset marks serialize")
    }

    /// Whether `batch` (committed before the mark) is the old run's.
    pub fn covers(&self, batch: &CommittedBatch) -> bool {
        batch
            .ranges
            .iter()
            .any(|r| r.topic == self.topic && r.partition == self.partition && r.until > self.to)
    }
}

/// The batches `selection` keeps of lineage entries in commit order (the
/// JSON of [`LineageEntry`], as Redis and Kafka store them). A batch id
/// seen again is left out: a broker that shows aborted transactions to
/// `read_committed` readers shows an attempt of a batch that was retried
/// beside the attempt that committed (the same batch: same plan, same
/// result).
pub fn select_entries<T: AsRef<[u8]>>(
    entries: impl IntoIterator<Item = T>,
    selection: &Selection,
) -> Result<Vec<CommittedBatch>, SinkError> {
    let mut all: Vec<CommittedBatch> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for entry in entries {
        if let Some(mark) = ResetMark::parse(entry.as_ref())? {
            for old in all.iter().filter(|b| mark.covers(b)) {
                seen.remove(&old.batch_id);
            }
            all.retain(|b| !mark.covers(b));
            continue;
        }
        let entry: LineageEntry = serde_json::from_slice(entry.as_ref())
            .map_err(|e| SinkError::database("a lineage entry is not sluice's JSON", e))?;
        let batch = entry.into_batch();
        if seen.insert(batch.batch_id.clone()) {
            all.push(batch);
        }
    }
    let mut batches: Vec<CommittedBatch> = all.into_iter().filter(|b| selection.keeps(b)).collect();
    selection.keep_last(&mut batches);
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(batch_id: &str, from: i64) -> Vec<u8> {
        serde_json::to_vec(&LineageEntry {
            batch_id: batch_id.into(),
            module_digest: "m".into(),
            params_digest: "p".into(),
            batch_time_ms: 0,
            records: 1,
            rows: 1,
            dead_letters: 0,
            output_digest: "d".into(),
            committed_at_ms: from,
            settings: String::new(),
            ranges: vec![OffsetRange {
                topic: "t".into(),
                partition: 0,
                from,
                until: from + 1,
            }],
            state_reads: String::new(),
        })
        .unwrap()
    }

    #[test]
    fn a_reset_mark_leaves_out_the_old_run_it_covers() {
        let mark = |to: i64| {
            ResetMark {
                reset: 1,
                topic: "t".into(),
                partition: 0,
                to,
                at_ms: 9,
            }
            .to_json()
            .into_bytes()
        };
        // Batches at 0, 1, 2; reset to 1 (batches 1 and 2 are the old
        // run's); the re-run commits batch "b" at 1 again, then "d" at 2.
        let entries = [
            entry("a", 0),
            entry("b", 1),
            entry("c", 2),
            mark(1),
            entry("b", 1),
            entry("d", 2),
        ];
        let all = select_entries(&entries, &Selection::default()).unwrap();
        let ids: Vec<&str> = all.iter().map(|b| b.batch_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "d"]);
        assert_eq!(ResetMark::parse(&mark(1)).unwrap().unwrap().to, 1);
        assert!(ResetMark::parse(&entry("a", 0)).unwrap().is_none());
        assert!(entry_state_reads(&entries, "d").unwrap().is_some());
    }

    #[test]
    fn a_batch_id_seen_again_is_one_batch() {
        // An aborted attempt a broker showed, then the attempt that committed.
        let entries = [entry("a", 0), entry("b", 1), entry("b", 1), entry("c", 2)];
        let all = select_entries(&entries, &Selection::default()).unwrap();
        let ids: Vec<&str> = all.iter().map(|b| b.batch_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        let last = Selection {
            last: Some(2),
            ..Selection::default()
        };
        let ids: Vec<String> = select_entries(&entries, &last)
            .unwrap()
            .into_iter()
            .map(|b| b.batch_id)
            .collect();
        assert_eq!(ids, ["b", "c"]);
    }
}
