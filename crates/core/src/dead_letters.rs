//! Dead letters after the fact: reading the ones a sink stored
//! (`sluice dead-letters list|show`) and redriving them, that is running
//! the stored records through the active version once more and committing
//! their outputs together with the removal of the dead letters they came
//! from.
//!
//! Owns the stored dead letter, the filter a listing takes and the two
//! traits a sink implements for it. It must not run a module or pick a
//! backend: the host's `redrive` does the first, `state` the second.
//!
//! # Delivery guarantee of a redrive
//!
//! A redrive commit is one sink transaction: it deletes every dead letter
//! it redrives (each must still be there, stored by the batch it was
//! listed with: a missing one means another redrive or a reset took it,
//! and nothing is written), writes the rows
//! and any new dead letters the records give now, and a lineage row for
//! the redrive (no offset ranges: the offsets were committed long ago).
//! A crash before the commit leaves the dead letters stored, so the next
//! redrive runs them again; after it they are gone, so no redrive can run
//! them twice. A sink that keeps them in a log it cannot delete from (the
//! Kafka sink's topic) moves a position past them in that transaction
//! instead ([`StoredDeadLetter::stored_at`]). It depends on the sink's atomic commit and on the dead
//! letter keeping the record's key, value and timestamp (headers are not
//! kept: a redriven record has none).

use crate::sink::{Commit, SinkError};

/// The prefix of a redrive's batch id; its lineage row has no ranges.
pub const REDRIVE_PREFIX: &str = "redrive-";

/// One dead letter as the sink stored it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StoredDeadLetter {
    /// The batch that dead-lettered it (a redrive's id for one that failed
    /// again in a redrive).
    pub batch_id: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The record's time (ms since the epoch); -1 for dead letters stored
    /// before sluice kept it.
    pub timestamp: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// `rejected`, `trap`, `fuel`, `memory`, `deadline`, `non-finite`,
    /// `output`.
    pub kind: String,
    pub reason: String,
    /// The batch's planned time, if its lineage row is still there.
    pub batch_time_ms: Option<i64>,
    /// When the batch was committed, if its lineage row is still there.
    pub committed_at_ms: Option<i64>,
    /// Where a sink that keeps dead letters in a log (the Kafka sink's
    /// dead-letter topic) stored it; such a sink redrives them in that
    /// order, in runs stored by one batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_at: Option<StoredAt>,
}

/// A dead letter's place in a log: partition and offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct StoredAt {
    pub partition: i32,
    pub offset: i64,
}

impl StoredDeadLetter {
    pub fn key(&self) -> RecordKey {
        RecordKey {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
        }
    }
}

/// Where a record was read from: a dead letter's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct RecordKey {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl std::fmt::Display for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.topic, self.partition, self.offset)
    }
}

impl std::str::FromStr for RecordKey {
    type Err = String;

    /// `TOPIC:PARTITION:OFFSET` (the topic may hold colons).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}`: expected TOPIC:PARTITION:OFFSET");
        let (rest, offset) = s.rsplit_once(':').ok_or_else(bad)?;
        let (topic, partition) = rest.rsplit_once(':').ok_or_else(bad)?;
        if topic.is_empty() {
            return Err(bad());
        }
        Ok(RecordKey {
            topic: topic.to_string(),
            partition: partition.parse().map_err(|_| bad())?,
            offset: offset.parse().map_err(|_| bad())?,
        })
    }
}

/// Which stored dead letters a listing or a redrive takes (all by default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Only those of this batch.
    pub batch_id: Option<String>,
    /// Only those of this kind.
    pub kind: Option<String>,
    /// Only those whose batch was committed at or after this time (ms since
    /// the epoch).
    pub since_ms: Option<i64>,
    /// Only this record.
    pub record: Option<RecordKey>,
}

impl DeadLetterFilter {
    pub fn keeps(&self, d: &StoredDeadLetter) -> bool {
        self.batch_id.as_ref().is_none_or(|b| *b == d.batch_id)
            && self.kind.as_ref().is_none_or(|k| *k == d.kind)
            && self
                .since_ms
                .is_none_or(|t| d.committed_at_ms.is_some_and(|c| c >= t))
            && self.record.as_ref().is_none_or(|r| *r == d.key())
    }
}

/// The dead letters `filter` keeps of `letters` (stored without their
/// batch's times, as a log or a list keeps them), each given its batch's
/// planned and commit times from `lineage` while it keeps them, sorted by
/// topic, partition and offset (what [`DeadLetterReader::list`] returns).
pub async fn with_batch_times(
    letters: impl IntoIterator<Item = StoredDeadLetter>,
    lineage: &dyn crate::store::LineageStore,
    pipeline: &str,
    filter: &DeadLetterFilter,
) -> Result<Vec<StoredDeadLetter>, SinkError> {
    let times: std::collections::HashMap<String, (i64, i64)> = lineage
        .batches(pipeline, &crate::store::Selection::default())
        .await?
        .into_iter()
        .map(|b| (b.batch_id, (b.batch_time_ms, b.committed_at_ms)))
        .collect();
    let mut kept = Vec::new();
    for mut d in letters {
        if let Some((batch_time, committed_at)) = times.get(&d.batch_id) {
            d.batch_time_ms = Some(*batch_time);
            d.committed_at_ms = Some(*committed_at);
        }
        if filter.keeps(&d) {
            kept.push(d);
        }
    }
    kept.sort_by_key(StoredDeadLetter::key);
    Ok(kept)
}

/// Reads a pipeline's stored dead letters (read-only).
#[async_trait::async_trait]
pub trait DeadLetterReader: Send + Sync {
    /// The dead letters `filter` keeps, by topic, partition and offset.
    async fn list(
        &self,
        pipeline: &str,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<StoredDeadLetter>, SinkError>;
}

/// What a redrive commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedriveOutcome {
    /// The outputs, the new dead letters, the lineage row and the removal
    /// of the redriven dead letters landed together.
    Committed,
    /// This dead letter was no longer stored (another redrive or a reset
    /// took it): nothing was written.
    Gone(RecordKey),
}

/// A sink that can commit a redrive (see the module header).
#[allow(async_fn_in_trait)]
pub trait Redrive {
    /// Commits `commit` (whose records are the dead letters `taken`, in
    /// order; its plan has no ranges) and deletes `taken`, in one
    /// transaction. A dead letter is a record *as stored by batch
    /// `stored_by`*: one a redrive stored again since (under its own id)
    /// is another, so two redrives of one listing cannot both take it.
    async fn redrive(
        &self,
        commit: &Commit<'_>,
        stored_by: &str,
        taken: &[StoredDeadLetter],
    ) -> Result<RedriveOutcome, SinkError>;
    /// How many of `taken` are still stored by `stored_by`: after a commit
    /// whose outcome is unknown, none means it landed and all means it did
    /// not.
    async fn still_stored(
        &self,
        pipeline: &str,
        stored_by: &str,
        taken: &[StoredDeadLetter],
    ) -> Result<usize, SinkError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys_parse_with_colons_in_the_topic() {
        let k: RecordKey = "a:b:3:42".parse().unwrap();
        assert_eq!((k.topic.as_str(), k.partition, k.offset), ("a:b", 3, 42));
        assert_eq!(k.to_string(), "a:b:3:42");
        for bad in ["", "t:1", ":1:2", "t:x:2", "t:1:y"] {
            assert!(bad.parse::<RecordKey>().is_err(), "{bad}");
        }
    }
}
