//! Multi-row `INSERT ... VALUES (?, ..), (?, ..)` statements for the
//! dialects with positional placeholders (SQLite, MySQL), cut into chunks
//! that respect the server's parameter and packet limits.
//!
//! Chunks hold a power of two rows, so a target needs at most ~17 distinct
//! statement texts and the driver's prepared-statement cache reuses them
//! across batches. This module must not bind or run anything.

use super::{Target, TypedColumn};
use std::ops::Range;

/// One target's multi-row insert, as text pieces.
#[derive(Debug)]
pub struct MultiRowInsert {
    /// `INSERT INTO t (a, b) VALUES `
    pub head: String,
    /// `(?, ?)`
    pub row: String,
    /// ` ON CONFLICT ...` / ` ON DUPLICATE KEY ...` or empty.
    pub tail: String,
    /// Most rows per statement (parameter limit / width).
    pub max_rows: usize,
}

impl MultiRowInsert {
    /// `INSERT INTO` all of `target`'s columns, followed by `tail`.
    pub fn for_target(target: &Target, tail: String, max_params: usize) -> Self {
        let head = format!(
            "INSERT INTO {} ({}) VALUES ",
            target.table,
            target.quoted.join(", ")
        );
        MultiRowInsert::new(head, target.columns.len(), tail, max_params)
    }

    pub fn new(head: String, width: usize, tail: String, max_params: usize) -> Self {
        MultiRowInsert {
            head,
            row: format!("({})", vec!["?"; width].join(", ")),
            tail,
            max_rows: (max_params / width.max(1)).max(1),
        }
    }

    /// The statement for `rows` rows.
    pub fn sql(&self, rows: usize) -> String {
        let mut sql = String::with_capacity(self.head.len() + rows * (self.row.len() + 2));
        sql.push_str(&self.head);
        for i in 0..rows {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&self.row);
        }
        sql.push_str(&self.tail);
        sql
    }

    /// Splits `0..rows` into chunks of power-of-two sizes, each at most
    /// `max_rows` rows and (but for a single oversized row) `max_bytes` on
    /// the wire.
    pub fn chunks(
        &self,
        columns: &[TypedColumn<'_>],
        rows: usize,
        max_bytes: usize,
    ) -> Vec<Range<usize>> {
        let mut chunks = Vec::new();
        let mut start = 0;
        while start < rows {
            let mut fit = 0;
            let mut bytes = self.head.len() + self.tail.len();
            while start + fit < rows && fit < self.max_rows {
                let row: usize = columns.iter().map(|c| c.wire_size(start + fit)).sum();
                if fit > 0 && bytes + row > max_bytes {
                    break;
                }
                bytes += row + self.row.len();
                fit += 1;
            }
            let size = 1usize << (usize::BITS - 1 - fit.leading_zeros());
            chunks.push(start..start + size);
            start += size;
        }
        chunks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_powers_of_two_within_limits() {
        let insert = MultiRowInsert::new("INSERT ".into(), 2, String::new(), 20);
        let text: Vec<Option<&str>> = vec![Some("0123456789"); 23];
        let columns = [
            TypedColumn::Text(text),
            TypedColumn::Integer(vec![Some(1); 23]),
        ];
        let chunks = insert.chunks(&columns, 23, usize::MAX);
        let sizes: Vec<usize> = chunks.iter().map(|r| r.len()).collect();
        assert_eq!(sizes, vec![8, 8, 4, 2, 1]);
        assert_eq!(chunks.last().unwrap().end, 23);
        // ~37 bytes per row: 100 bytes hold 2 rows.
        let small = insert.chunks(&columns, 23, 100);
        assert!(small.iter().all(|r| r.len() <= 2));
        assert_eq!(insert.sql(2), "INSERT (?, ?), (?, ?)");
    }
}
