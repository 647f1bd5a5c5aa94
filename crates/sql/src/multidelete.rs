//! Deletes by key, many rows a statement, for the dialects with positional
//! placeholders (SQLite, MySQL): `DELETE FROM t WHERE k1 = ? AND k2 IN (?,
//! ?, ...)`, one statement per run of rows that agree on every key column
//! but the last. A state table's deletes (key: scope, then state key) come
//! sorted by partition, so a batch's deletes in one partition are a few
//! statements, not one per key: one hop to SQLite's worker thread, or one
//! round trip to MySQL, per [`MAX_IN`] keys.
//!
//! `IN` matches exactly what one `k = ?` per row matches: a key cell that is
//! NULL matches no row either way. Lists hold a power of two keys (the last
//! key repeated to fill one), so a target needs at most ~10 distinct
//! statement texts and the driver's prepared-statement cache reuses them.
//!
//! This module must not bind or run anything.

use super::{Cell, Target, TypedColumn};
use std::ops::Range;

/// Most keys in one `IN` list (MariaDB turns lists of 1,000 or more into a
/// subquery by default, `in_predicate_conversion_threshold`).
pub const MAX_IN: usize = 512;

/// One target's multi-row delete, as text pieces.
#[derive(Debug)]
pub struct MultiRowDelete {
    /// `DELETE FROM t WHERE k1 = ? AND ` (empty conditions for a one-column
    /// key: `DELETE FROM t WHERE `).
    head: String,
    /// The last key column, quoted.
    last: String,
}

/// One statement: its text and the rows whose keys it binds.
#[derive(Debug, PartialEq, Eq)]
pub struct DeleteChunk {
    /// `head` + `last IN (?, ...)`, with [`DeleteChunk::listed`]
    /// placeholders.
    pub sql: String,
    /// Rows of the batch; the first binds the prefix columns, then every
    /// row its last key column, the last row again to fill the list.
    pub rows: Range<usize>,
}

impl MultiRowDelete {
    /// Deletes from `target` by its key; `None` if it has no key.
    pub fn for_target(target: &Target) -> Option<Self> {
        let keys = target.quoted_keys();
        let (last, prefix) = keys.split_last()?;
        let mut head = format!("DELETE FROM {} WHERE ", target.table);
        for k in prefix {
            head.push_str(k);
            head.push_str(" = ? AND ");
        }
        Some(MultiRowDelete {
            head,
            last: last.to_string(),
        })
    }

    /// The statements deleting `rows` rows, whose key columns are `keys`
    /// (the target's, in key order), each binding at most `max_bytes` on
    /// the wire (the filler keys counted; but for a single oversized key).
    pub fn chunks(
        &self,
        keys: &[&TypedColumn<'_>],
        rows: usize,
        max_bytes: usize,
    ) -> Vec<DeleteChunk> {
        let (last, prefix) = keys.split_last().expect("a delete target has a key");
        let same_prefix = |a: usize, b: usize| prefix.iter().all(|c| same(c.cell(a), c.cell(b)));
        let mut chunks = Vec::new();
        let mut start = 0;
        while start < rows {
            let mut bytes: usize = prefix.iter().map(|c| c.wire_size(start)).sum();
            bytes += last.wire_size(start);
            let mut end = start + 1;
            while end < rows && end - start < MAX_IN && same_prefix(start, end) {
                // With `end` in, the list is filled with copies of it.
                let key = last.wire_size(end);
                let count = end - start + 1;
                if bytes + key * (1 + listed(count) - count) > max_bytes {
                    break;
                }
                bytes += key;
                end += 1;
            }
            chunks.push(DeleteChunk {
                sql: self.sql(listed(end - start)),
                rows: start..end,
            });
            start = end;
        }
        chunks
    }

    fn sql(&self, listed: usize) -> String {
        let mut sql = String::with_capacity(self.head.len() + self.last.len() + 6 + listed * 3);
        sql.push_str(&self.head);
        sql.push_str(&self.last);
        sql.push_str(" IN (");
        for i in 0..listed {
            sql.push_str(if i == 0 { "?" } else { ", ?" });
        }
        sql.push(')');
        sql
    }
}

impl DeleteChunk {
    /// Placeholders in its `IN` list.
    pub fn listed(&self) -> usize {
        listed(self.rows.len())
    }

    /// The cells to bind, in placeholder order: the prefix columns of the
    /// first row, then the last key column of each row, the last row
    /// repeated up to `listed`.
    pub fn cells<'a>(&self, keys: &[&TypedColumn<'a>]) -> Vec<Cell<'a>> {
        let (last, prefix) = keys.split_last().expect("a delete target has a key");
        let filler = self.rows.end - 1;
        let listed = self.rows.clone().chain(std::iter::repeat(filler));
        (prefix.iter().map(|c| c.cell(self.rows.start)))
            .chain(listed.take(self.listed()).map(|row| last.cell(row)))
            .collect()
    }
}

/// Placeholders in the `IN` list of `rows` rows: filled up to a power of
/// two.
fn listed(rows: usize) -> usize {
    rows.next_power_of_two()
}

/// Whether two cells hold the same value (NULL equal to NULL: rows with
/// NULL in a prefix column share a statement, which matches none of them,
/// as their own would not).
fn same(a: Cell<'_>, b: Cell<'_>) -> bool {
    match (a, b) {
        (Cell::Integer(a), Cell::Integer(b)) => a == b,
        (Cell::Real(a), Cell::Real(b)) => a.map(f64::to_bits) == b.map(f64::to_bits),
        (Cell::Text(a), Cell::Text(b)) => a == b,
        (Cell::Blob(a), Cell::Blob(b)) => a == b,
        (Cell::Boolean(a), Cell::Boolean(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delete(prefix: usize) -> MultiRowDelete {
        let mut head = "DELETE FROM t WHERE ".to_string();
        for i in 0..prefix {
            head.push_str(&format!("k{i} = ? AND "));
        }
        MultiRowDelete {
            head,
            last: "k".into(),
        }
    }

    fn ints(cells: &[Cell<'_>]) -> Vec<Option<i64>> {
        cells
            .iter()
            .map(|c| match c {
                Cell::Integer(v) => *v,
                Cell::Blob(b) => b.map(|b| b[0] as i64),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    #[test]
    fn one_column_keys_go_in_lists_of_a_power_of_two() {
        let keys = TypedColumn::Integer((0..5).map(Some).collect());
        let chunks = delete(0).chunks(&[&keys], 5, usize::MAX);
        assert_eq!(chunks.len(), 1);
        assert_eq!(
            chunks[0].sql,
            "DELETE FROM t WHERE k IN (?, ?, ?, ?, ?, ?, ?, ?)"
        );
        let cells = chunks[0].cells(&[&keys]);
        assert_eq!(
            ints(&cells),
            [0, 1, 2, 3, 4, 4, 4, 4].map(Some).to_vec(),
            "the last key fills the list"
        );
    }

    #[test]
    fn a_statement_per_run_of_equal_prefixes_and_per_max_in_keys() {
        let scopes = [1, 1, 2, 2, 2, 1];
        let scope = TypedColumn::Integer(scopes.iter().map(|s| Some(*s)).collect());
        let names: Vec<[u8; 1]> = (0..6u8).map(|i| [i]).collect();
        let key = TypedColumn::Blob(names.iter().map(|n| Some(&n[..])).collect());
        let chunks = delete(1).chunks(&[&scope, &key], 6, usize::MAX);
        let rows: Vec<Range<usize>> = chunks.iter().map(|c| c.rows.clone()).collect();
        assert_eq!(rows, [0..2, 2..5, 5..6]);
        assert_eq!(
            chunks[1].sql,
            "DELETE FROM t WHERE k0 = ? AND k IN (?, ?, ?, ?)"
        );
        let cells = chunks[1].cells(&[&scope, &key]);
        assert_eq!(ints(&cells), [2, 2, 3, 4, 4].map(Some).to_vec());

        let many = TypedColumn::Integer((0..(MAX_IN as i64 + 1)).map(Some).collect());
        let chunks = delete(0).chunks(&[&many], MAX_IN + 1, usize::MAX);
        assert_eq!(chunks.len(), 2);
        assert_eq!((chunks[0].rows.len(), chunks[0].listed()), (MAX_IN, MAX_IN));
        assert_eq!((chunks[1].rows.len(), chunks[1].listed()), (1, 1));
    }

    #[test]
    fn a_statement_stays_under_the_byte_budget_filler_included() {
        let long: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 91]).collect();
        let keys = TypedColumn::Blob(long.iter().map(|k| Some(&k[..])).collect());
        // 100 bytes a key on the wire: three keys fill a list of four.
        let chunks = delete(0).chunks(&[&keys], 10, 400);
        let sizes: Vec<(usize, usize)> =
            chunks.iter().map(|c| (c.rows.len(), c.listed())).collect();
        assert_eq!(sizes, [(4, 4), (4, 4), (2, 2)]);
        let chunks = delete(0).chunks(&[&keys], 10, 350);
        let sizes: Vec<(usize, usize)> =
            chunks.iter().map(|c| (c.rows.len(), c.listed())).collect();
        assert_eq!(
            sizes,
            [(2, 2), (2, 2), (2, 2), (2, 2), (2, 2)],
            "a third key would need a fourth"
        );
        let chunks = delete(0).chunks(&[&keys], 2, 10);
        assert_eq!(chunks.len(), 2, "a key over the budget goes alone");
    }

    #[test]
    fn null_prefixes_share_a_statement_and_other_types_never_do() {
        assert!(same(Cell::Integer(None), Cell::Integer(None)));
        assert!(same(Cell::Real(Some(0.5)), Cell::Real(Some(0.5))));
        assert!(!same(Cell::Integer(Some(1)), Cell::Text(Some("1"))));
    }
}
