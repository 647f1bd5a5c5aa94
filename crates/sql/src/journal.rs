//! The state journal: each partition's keyed-state changes of its last
//! few batches, one row a batch (`<prefix>state_journal`: scope, seq,
//! changes, absent), merged into the state table in one write once a
//! partition has `sink.state_journal_batches` of them (or
//! [`MAX_JOURNAL_BYTES`]). A window's aggregate rewritten in five batches
//! running reaches the table once a merge instead of five times, and a
//! window that opens and closes between two merges never does; on
//! Postgres, where a state row costs five times an output row, that is
//! most of a windowed batch's commit. The stored state is the table with
//! the partition's journal rows laid over it in order; readers take both
//! in one snapshot (`SqlStateStore`), so every read of a partition from
//! the sink decodes its journal: the default (`state_journal_batches =
//! 1`) keeps no journal, and the setting is for state that fits the
//! host's cache (read from the sink once a partition is taken).
//!
//! # Delivery guarantee
//!
//! A journal row, a merge and the deletion of the rows it merged are
//! written inside the batch transaction after the offset compare-and-set,
//! like every state write: they land exactly when the checkpoint moves, so
//! table plus journal is always the state after the checkpoint's batch, and
//! a fenced zombie's rows roll back with its offsets. Whether a batch
//! appends, merges or writes the table directly is decided from the
//! journal as the transaction sees it (never from memory alone): a table
//! write happens only with the partition's journal empty or merged in the
//! same transaction, so no journal row is ever older than the table.
//!
//! It owns the journal's rows, their bytes and the merge. It must not
//! commit, and must not write the state table: the merged changes go back
//! to `state.rs`, which writes them as any batch's.

use super::dialect::Dialect;
use super::{Param, SqlBackend, SqlTx};
use crate::sink::SinkError;
use sluice_core::state::{KeyTable, Keys, StateError, decode_keys, encode_keys};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// The journal's name after the table prefix.
pub(crate) const JOURNAL_TABLE: &str = "state_journal";

/// A partition's journal is merged before it holds more than this many
/// bytes of changes, whatever `state_journal_batches` says: a merge holds
/// them in memory, and every read of the partition reads them.
const MAX_JOURNAL_BYTES: i64 = 16 << 20;

/// A batch whose changes of a partition take more bytes than this merges
/// them (with the journal) instead of appending a row: a statement that
/// large may pass a server's packet limit (MariaDB's `max_allowed_packet`
/// is 16 MiB by default), which the table's bulk path splits under.
const MAX_ROW_BYTES: usize = 4 << 20;

/// Batches a partition writes the table directly after a merge that found
/// few keys written twice (journaling only added a write).
const DIRECT_BATCHES: u32 = 64;

/// A merge saves too little when it writes more than this share of the
/// changes it merged.
const WORTH_IT: (usize, usize) = (3, 4);

/// One batch's changes of one partition as a journal row: the changes, and
/// which of their keys (a bit each, in key order) the batch read as absent.
pub(crate) struct JournalRow {
    pub(crate) changes: Vec<u8>,
    pub(crate) absent: Vec<u8>,
}

impl JournalRow {
    /// `keys` (a batch's changes of one partition), with `reads` (what the
    /// batch read of that partition as it started).
    pub(crate) fn of(keys: &Keys, reads: Option<&Keys>) -> JournalRow {
        let mut absent = vec![0u8; keys.len().div_ceil(8)];
        for (i, key) in keys.keys().enumerate() {
            if read_absent(reads, key) {
                absent[i / 8] |= 1 << (i % 8);
            }
        }
        JournalRow {
            changes: encode_keys(keys),
            absent,
        }
    }
}

fn read_absent(reads: Option<&Keys>, key: &[u8]) -> bool {
    matches!(reads.and_then(|r| r.get(key)), Some(None))
}

/// The journal rows of a partition laid over each other, in order: each
/// key's last change, and the keys known to have no row in the state table
/// (`None` each: the shape of a batch's reads, so the table write skips
/// deleting them).
///
/// Hashed while rows are laid over each other (a merge of eight batches
/// of 5,000 changes is 40,000 lookups), in key order once done
/// ([`Merged::into_keys`]).
#[derive(Debug, Default)]
pub(crate) struct Merged {
    changes: KeyTable,
    absent_in_table: HashSet<Vec<u8>, foldhash::fast::RandomState>,
    /// Changes merged, counting a key once per row it is in.
    entries: usize,
}

/// A merge's outcome, in key order: each key's last change, and the keys
/// known to have no row in the state table (`None` each).
pub(crate) struct MergedKeys {
    pub(crate) changes: Keys,
    pub(crate) absent_in_table: Keys,
}

impl Merged {
    /// Lays a stored row over what is merged so far. A key's first change
    /// since the table was last written says whether the table has a row
    /// for it: it has none if that batch read it as absent (the journal
    /// before it did not touch the key, so the batch read the table).
    pub(crate) fn add_row(&mut self, changes: &[u8], absent: &[u8]) -> Result<(), StateError> {
        let keys = decode_keys(changes)?;
        for (i, (key, value)) in keys.into_iter().enumerate() {
            let was_absent = absent.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0);
            self.add(key, value, was_absent);
        }
        Ok(())
    }

    /// Lays a batch's changes (`keys`, with its `reads`) over what is merged.
    pub(crate) fn add_batch(&mut self, keys: &Keys, reads: Option<&Keys>) {
        for (key, value) in keys {
            self.add(key.clone(), value.clone(), read_absent(reads, key));
        }
    }

    fn add(&mut self, key: Vec<u8>, value: Option<sluice_core::state::StateValue>, absent: bool) {
        self.entries += 1;
        if absent && !self.changes.contains_key(&key) {
            self.absent_in_table.insert(key.clone());
        }
        self.changes.insert(key, value);
    }

    /// What was merged, in key order.
    pub(crate) fn into_keys(self) -> MergedKeys {
        MergedKeys {
            changes: self.changes.into_iter().collect(),
            absent_in_table: self
                .absent_in_table
                .into_iter()
                .map(|k| (k, None))
                .collect(),
        }
    }

    /// Whether the merge wrote few enough keys for the journal to pay.
    fn paid(&self) -> bool {
        self.changes.len() * WORTH_IT.1 <= self.entries * WORTH_IT.0
    }
}

/// The changes a partition's journal rows hold (`changes`, in order),
/// laid over each other: what a reader lays over the table.
pub(crate) fn overlay(changes: &[Vec<u8>]) -> Result<Keys, StateError> {
    let mut keys = Keys::new();
    for row in changes {
        keys.extend(decode_keys(row)?);
    }
    Ok(keys)
}

/// How a batch writes one partition's changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Into the state table (the journal is empty).
    Table,
    /// As a journal row.
    Append,
    /// Merged with the journal's rows into the state table, the rows
    /// deleted.
    Merge,
}

/// The journal table's statements, and per scope how many batches still
/// write the table directly.
pub(crate) struct Journal {
    batches: i64,
    stats: String,
    select: String,
    insert: String,
    delete: String,
    direct: Mutex<HashMap<i64, u32>>,
}

impl Journal {
    /// Creates the table if missing; `batches` is
    /// `sink.state_journal_batches`.
    pub(crate) async fn open<B: SqlBackend>(
        backend: &B,
        schema: Option<&str>,
        prefix: &str,
        batches: u64,
    ) -> Result<Journal, SinkError> {
        let d = backend.dialect();
        let table = d.qualified(schema, &format!("{prefix}{JOURNAL_TABLE}"))?;
        let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
        let t = &d.types;
        super::create(
            backend,
            &format!(
                "CREATE TABLE IF NOT EXISTS {table} ({} {} NOT NULL, {} {} NOT NULL, \
                 {} {} NOT NULL, {} {} NOT NULL, PRIMARY KEY ({}, {}))",
                c("scope"),
                t.bigint,
                c("seq"),
                t.bigint,
                c("changes"),
                t.blob,
                c("absent"),
                t.blob,
                c("scope"),
                c("seq"),
            ),
        )
        .await?;
        let scope_is = format!("{} = {}", c("scope"), d.param(1));
        let int = |e: String| format!("CAST({e} AS {})", t.cast_bigint);
        Ok(Journal {
            batches: batches as i64,
            stats: format!(
                "SELECT {}, {} FROM {table} WHERE {scope_is}",
                int("COUNT(*)".into()),
                int(format!("COALESCE(SUM(LENGTH({})), 0)", c("changes"))),
            ),
            select: select(d, &table, &scope_is),
            insert: format!(
                "INSERT INTO {table} ({}, {}, {}, {}) VALUES ({})",
                c("scope"),
                c("seq"),
                c("changes"),
                c("absent"),
                d.params(1, 4)
            ),
            delete: format!("DELETE FROM {table} WHERE {scope_is}"),
            direct: Mutex::default(),
        })
    }

    /// How this batch writes `scope`'s changes, `row_bytes` of them as a
    /// journal row.
    pub(crate) async fn route<S>(
        &self,
        tx: &mut impl SqlTx<S>,
        scope: i64,
        row_bytes: usize,
    ) -> Result<Route, SinkError> {
        let stats = tx.query_i64s(&self.stats, &[Param::Int(scope)]).await?;
        let (rows, bytes) = match stats.as_deref() {
            Some(&[rows, bytes]) => (rows, bytes),
            _ => (0, 0),
        };
        if rows == 0 && (self.batches == 1 || self.direct_turn(scope)) {
            return Ok(Route::Table);
        }
        if rows + 1 >= self.batches
            || row_bytes > MAX_ROW_BYTES
            || bytes + row_bytes as i64 > MAX_JOURNAL_BYTES
        {
            return Ok(Route::Merge);
        }
        Ok(Route::Append)
    }

    /// Whether `scope` writes the table directly this batch (a merge found
    /// the journal not worth it not long ago).
    fn direct_turn(&self, scope: i64) -> bool {
        let mut direct = self.direct.lock().unwrap_or_else(|e| e.into_inner());
        match direct.get_mut(&scope) {
            Some(left) if *left > 0 => {
                *left -= 1;
                true
            }
            _ => false,
        }
    }

    /// Appends `row` as `scope`'s change at `seq` (the batch's next offset
    /// in the partition: it grows with every batch).
    pub(crate) async fn append<S>(
        &self,
        tx: &mut impl SqlTx<S>,
        scope: i64,
        seq: i64,
        row: &JournalRow,
    ) -> Result<(), SinkError> {
        let params = [
            Param::Int(scope),
            Param::Int(seq),
            Param::Bytes(Some(&row.changes)),
            Param::Bytes(Some(&row.absent)),
        ];
        tx.execute(&self.insert, &params).await.map(drop)
    }

    /// `scope`'s journal rows merged, and deleted (the caller writes the
    /// merge into the table in the same transaction).
    pub(crate) async fn take<S>(
        &self,
        tx: &mut impl SqlTx<S>,
        scope: i64,
    ) -> Result<Merged, SinkError> {
        let rows = tx.query_blobs(&self.select, &[Param::Int(scope)]).await?;
        let mut merged = Merged::default();
        for row in &rows {
            match row.as_slice() {
                [changes, absent] => merged.add_row(changes, absent),
                _ => Err(StateError::Corrupt("a journal row's columns".into())),
            }
            .map_err(|e| SinkError::database(format!("the state journal of scope {scope}"), e))?;
        }
        tx.execute(&self.delete, &[Param::Int(scope)]).await?;
        Ok(merged)
    }

    /// Notes how much `merged` (with the batch) saved: one that saved
    /// little sends `scope` to the table directly for a while.
    pub(crate) fn merged(&self, scope: i64, merged: &Merged) {
        if !merged.paid() {
            let mut direct = self.direct.lock().unwrap_or_else(|e| e.into_inner());
            direct.insert(scope, DIRECT_BATCHES);
        }
    }
}

/// `SELECT changes, absent` of one scope's journal rows in order; the
/// scope is what `scope_is` says.
fn select(d: &Dialect, table: &str, scope_is: &str) -> String {
    let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
    format!(
        "SELECT {}, {} FROM {table} WHERE {scope_is} ORDER BY {}",
        c("changes"),
        c("absent"),
        c("seq")
    )
}

/// `SELECT changes` of one scope's journal rows in order (what a reader
/// lays over the table); the scope is what `scope_is` says.
pub(crate) fn select_changes(d: &Dialect, table: &str, scope_is: &str) -> String {
    let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
    format!(
        "SELECT {} FROM {table} WHERE {scope_is} ORDER BY {}",
        c("changes"),
        c("seq")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::state::StateValue;

    fn value(v: &str) -> Option<StateValue> {
        Some(StateValue {
            value: v.as_bytes().to_vec(),
            expires_at_ms: None,
        })
    }

    fn keys(entries: &[(&str, Option<StateValue>)]) -> Keys {
        entries
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.clone()))
            .collect()
    }

    /// Later rows win; a key is absent from the table only if the first
    /// batch that changed it read it as absent.
    #[test]
    fn rows_merge_in_order_and_keep_what_the_table_lacks() {
        let first = keys(&[("a", value("1")), ("b", value("1")), ("c", value("1"))]);
        let first_reads = keys(&[("a", None), ("b", value("0"))]);
        let second = keys(&[("a", value("2")), ("c", None), ("d", value("2"))]);
        let second_reads = keys(&[("a", value("1")), ("d", None)]);
        let mut merged = Merged::default();
        for (changes, reads) in [(&first, &first_reads), (&second, &second_reads)] {
            let row = JournalRow::of(changes, Some(reads));
            merged.add_row(&row.changes, &row.absent).unwrap();
        }
        merged.add_batch(&keys(&[("b", value("3"))]), None);
        let expected = keys(&[
            ("a", value("2")),
            ("b", value("3")),
            ("c", None),
            ("d", value("2")),
        ]);
        assert_eq!(merged.entries, 7);
        // 4 keys written for 7 changes: worth it.
        assert!(merged.paid());
        let merged = merged.into_keys();
        assert_eq!(merged.changes, expected);
        assert_eq!(merged.absent_in_table, keys(&[("a", None), ("d", None)]));
        let row = |k: &Keys| JournalRow::of(k, None).changes;
        assert_eq!(
            overlay(&[row(&first), row(&second)]).unwrap(),
            keys(&[
                ("a", value("2")),
                ("b", value("1")),
                ("c", None),
                ("d", value("2"))
            ])
        );
    }

    /// First sightings only: the merge writes every change it merged.
    #[test]
    fn a_merge_of_distinct_keys_does_not_pay() {
        let mut merged = Merged::default();
        merged.add_batch(&keys(&[("a", value("1")), ("b", value("1"))]), None);
        merged.add_batch(&keys(&[("c", value("1")), ("d", value("1"))]), None);
        assert!(!merged.paid());
    }
}
