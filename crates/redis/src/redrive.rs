//! Redriving dead letters into a Redis sink: the redrive batch's commands,
//! its new dead letters and lineage entry, and the removal of the dead
//! letters it ran, by one call of the commit script.
//!
//! # Delivery guarantee
//!
//! Exactly-once per dead letter. The host names the dead letters it ran by
//! record and the batch that stored them; they are looked up in the list
//! (read once per redrive: an entry gone since is what the script's check
//! catches) and passed to the script as the exact entries stored. The script checks
//! every one is still in the list (`LPOS`) before it writes anything, and
//! removes them (`LREM`) with the batch's writes, so a redrive that lost a
//! race, or whose dead letters were trimmed meanwhile, writes nothing and
//! is told which one is gone. A lost reply is settled by the host counting
//! them back ([`Redrive::still_stored`]). Depends on Redis's script
//! atomicity, as every batch does (`sink`); needs Redis 6.0.6 or later
//! (`LPOS`).
//!
//! It must not move an offset: a redrive's plan has no ranges.

use crate::dead_letters::{StoredEntry, parse, stored};
use crate::sink::{RedisSink, outcome};
use sluice_core::dead_letters::{RecordKey, Redrive, RedriveOutcome, StoredDeadLetter};
use sluice_core::sink::{Commit, CommitOutcome, SinkError};
use std::collections::HashMap;
use tokio::sync::Mutex;

/// The stored dead letters a redrive looks its batches' entries up in: the
/// pipeline's list as first read, by batch and record. Read once, not per
/// redrive batch (each read is the whole list).
#[derive(Default)]
pub(crate) struct RedriveEntries(Mutex<Option<ReadEntries>>);

/// One pipeline's stored entries: (storing batch, record) -> the entry.
struct ReadEntries {
    pipeline: String,
    by_record: HashMap<(String, RecordKey), String>,
}

impl RedisSink {
    /// The stored entries of `taken` as stored by `stored_by`, in order;
    /// `Err` names the first one no longer stored.
    async fn entries_of(
        &self,
        pipeline: &str,
        stored_by: &str,
        taken: &[StoredDeadLetter],
    ) -> Result<Result<Vec<String>, RecordKey>, SinkError> {
        let mut read = self.redrive_entries.0.lock().await;
        if read.as_ref().is_none_or(|r| r.pipeline != pipeline) {
            let all = stored(self.conn(), &self.keys(pipeline)).await?;
            let by_record = all
                .into_iter()
                .map(|StoredEntry { text, letter }| ((letter.batch_id.clone(), letter.key()), text))
                .collect();
            *read = Some(ReadEntries {
                pipeline: pipeline.to_string(),
                by_record,
            });
        }
        let by_record = &read.as_ref().expect("read above").by_record;
        let mut texts = Vec::with_capacity(taken.len());
        for d in taken {
            match by_record.get(&(stored_by.to_string(), d.key())) {
                Some(text) => texts.push(text.clone()),
                None => return Ok(Err(d.key())),
            }
        }
        Ok(Ok(texts))
    }

    /// The entries stored by batch `stored_by`, by record.
    async fn stored_by(
        &self,
        pipeline: &str,
        stored_by: &str,
    ) -> Result<HashMap<RecordKey, String>, SinkError> {
        let all = stored(self.conn(), &self.keys(pipeline)).await?;
        Ok(all
            .into_iter()
            .filter(|e| e.letter.batch_id == stored_by)
            .map(|StoredEntry { text, letter }| (letter.key(), text))
            .collect())
    }
}

impl Redrive for RedisSink {
    async fn redrive(
        &self,
        commit: &Commit<'_>,
        stored_by: &str,
        taken: &[StoredDeadLetter],
    ) -> Result<RedriveOutcome, SinkError> {
        let entries = match self
            .entries_of(&commit.plan.pipeline, stored_by, taken)
            .await?
        {
            Ok(entries) => entries,
            Err(gone) => return Ok(RedriveOutcome::Gone(gone)),
        };
        let reply = self.commit_with(commit, &entries).await?;
        if reply.first().map(String::as_str) == Some("gone") {
            let entry = reply.get(1).map_or("", String::as_str);
            let key = parse(entry).map(|d| d.key()).map_err(|why| {
                SinkError::database(
                    "the commit script named a dead letter sluice did not write",
                    why,
                )
            })?;
            return Ok(RedriveOutcome::Gone(key));
        }
        match outcome(reply, commit)? {
            CommitOutcome::Committed => Ok(RedriveOutcome::Committed),
            fenced => Err(SinkError::Database {
                context: format!("a redrive moves no offset, yet its commit was {fenced:?}"),
                cause: None,
            }),
        }
    }

    async fn still_stored(
        &self,
        pipeline: &str,
        stored_by: &str,
        taken: &[StoredDeadLetter],
    ) -> Result<usize, SinkError> {
        let of_batch = self.stored_by(pipeline, stored_by).await?;
        Ok(taken
            .iter()
            .filter(|d| of_batch.contains_key(&d.key()))
            .count())
    }
}
