//! A batch's output as the host holds it: rows per target in columns, and
//! rejected records; plus its canonical digest for lineage and `verify`.
//!
//! Owns the contract checks on what a module returned and the digest. It
//! must not know how a sink writes rows.

use sha2::{Digest, Sha256};

/// Everything one batch produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Output {
    pub targets: Vec<TargetRows>,
    pub rejections: Vec<Rejection>,
    /// Records the module found late (behind the watermark, for a closed
    /// window): dead letters of kind `late`.
    pub late: Vec<Rejection>,
    /// The keyed state the batch changed: per partition, each key's new
    /// value or its deletion.
    pub state: crate::state::StateMap,
}

/// Rows for one named target, column by column.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetRows {
    pub target: String,
    pub rows: u32,
    pub columns: Vec<Column>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub name: String,
    /// 1 = null, per row; empty = no nulls.
    pub nulls: Vec<u8>,
    pub data: ColumnData,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ColumnData {
    Int64(Vec<i64>),
    Float64(Vec<f64>),
    Text { lengths: Vec<u32>, data: Vec<u8> },
    Bytes { lengths: Vec<u32>, data: Vec<u8> },
    Bool(Vec<u8>),
}

/// A record the module refused; it becomes a dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Index of the record in the batch.
    pub index: u32,
    pub reason: String,
}

/// One cell, borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Null,
    Int(i64),
    Float(f64),
    Text(&'a str),
    Bytes(&'a [u8]),
    Bool(bool),
}

impl Value<'_> {
    /// The cell as JSON, as the stdout and Kafka sinks write rows: text as
    /// a string, bytes as a string if UTF-8 else as `{"hex": ...}`.
    pub fn to_json(self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Int(i) => i.into(),
            Value::Float(f) => f.into(),
            Value::Text(t) => t.into(),
            Value::Bytes(b) => match std::str::from_utf8(b) {
                Ok(t) => t.into(),
                Err(_) => serde_json::json!({ "hex": hex::encode(b) }),
            },
            Value::Bool(b) => b.into(),
        }
    }
}

impl ColumnData {
    fn len(&self) -> usize {
        match self {
            ColumnData::Int64(v) => v.len(),
            ColumnData::Float64(v) => v.len(),
            ColumnData::Text { lengths, .. } | ColumnData::Bytes { lengths, .. } => lengths.len(),
            ColumnData::Bool(v) => v.len(),
        }
    }

    fn tag(&self) -> u8 {
        match self {
            ColumnData::Int64(_) => 1,
            ColumnData::Float64(_) => 2,
            ColumnData::Text { .. } => 3,
            ColumnData::Bytes { .. } => 4,
            ColumnData::Bool(_) => 5,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            ColumnData::Int64(_) => "int64",
            ColumnData::Float64(_) => "float64",
            ColumnData::Text { .. } => "text",
            ColumnData::Bytes { .. } => "bytes",
            ColumnData::Bool(_) => "boolean",
        }
    }
}

impl Column {
    /// The column's cells in row order, one at a time: a batch's output is
    /// never held a second time as wide per-cell values.
    pub fn values(&self) -> Box<dyn Iterator<Item = Value<'_>> + '_> {
        let null = move |i: usize| self.nulls.get(i).is_some_and(|&n| n != 0);
        let cells: Box<dyn Iterator<Item = Value<'_>> + '_> = match &self.data {
            ColumnData::Int64(v) => Box::new(v.iter().map(|&x| Value::Int(x))),
            ColumnData::Float64(v) => Box::new(v.iter().map(|&x| Value::Float(x))),
            ColumnData::Bool(v) => Box::new(v.iter().map(|&x| Value::Bool(x != 0))),
            ColumnData::Text { lengths, data } => {
                Box::new(split(lengths, data).map(|b| {
                    Value::Text(std::str::from_utf8(b).expect("checked by Output::check"))
                }))
            }
            ColumnData::Bytes { lengths, data } => Box::new(split(lengths, data).map(Value::Bytes)),
        };
        Box::new(
            cells
                .enumerate()
                .map(move |(i, v)| if null(i) { Value::Null } else { v }),
        )
    }
}

fn split<'a>(lengths: &'a [u32], data: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut at = 0usize;
    lengths.iter().map(move |&l| {
        let start = at;
        at += l as usize;
        &data[start..at]
    })
}

impl Output {
    /// Checks the module kept the contract: column lengths match the row
    /// count, text is UTF-8, rejections point at records of the batch.
    /// The first float cell that no sink stores faithfully (NaN or an
    /// infinity; SQLite turns NaN into NULL, MySQL refuses both), described
    /// for the user; nulls are not looked at.
    pub fn first_non_finite(&self) -> Option<String> {
        for t in &self.targets {
            for c in &t.columns {
                let ColumnData::Float64(values) = &c.data else {
                    continue;
                };
                let null = |i: usize| c.nulls.get(i).is_some_and(|&n| n != 0);
                if let Some(row) = (0..values.len()).find(|&i| !null(i) && !values[i].is_finite()) {
                    return Some(format!(
                        "target `{}`, column `{}`, row {row}: {} (floats must be finite on \
                         every sink; write null instead)",
                        t.target, c.name, values[row]
                    ));
                }
            }
        }
        None
    }

    /// Stores -0.0 as 0.0, so every sink holds the same value (SQLite and
    /// MySQL would print it as 0 anyway) and equal rows hash alike.
    pub fn normalize_zeros(&mut self) {
        for t in &mut self.targets {
            for c in &mut t.columns {
                if let ColumnData::Float64(values) = &mut c.data {
                    values
                        .iter_mut()
                        .filter(|v| **v == 0.0)
                        .for_each(|v| *v = 0.0);
                }
            }
        }
    }

    pub fn check(&self, batch_len: usize) -> Result<(), String> {
        for t in &self.targets {
            let mut seen = std::collections::BTreeSet::new();
            for c in &t.columns {
                if !seen.insert(&c.name) {
                    return Err(format!(
                        "target `{}` has column `{}` twice",
                        t.target, c.name
                    ));
                }
                let rows = t.rows as usize;
                if c.data.len() != rows || !(c.nulls.is_empty() || c.nulls.len() == rows) {
                    return Err(format!(
                        "target `{}` column `{}` has {} values for {} rows",
                        t.target,
                        c.name,
                        c.data.len(),
                        rows
                    ));
                }
                if let ColumnData::Text { lengths, data } | ColumnData::Bytes { lengths, data } =
                    &c.data
                {
                    let total: u64 = lengths.iter().map(|&l| l as u64).sum();
                    if total != data.len() as u64 {
                        return Err(format!(
                            "target `{}` column `{}`: lengths add up to {total}, data has {} bytes",
                            t.target,
                            c.name,
                            data.len()
                        ));
                    }
                }
                if let ColumnData::Text { lengths, data } = &c.data
                    && split(lengths, data).any(|b| std::str::from_utf8(b).is_err())
                {
                    return Err(format!(
                        "target `{}` column `{}` holds text that is not UTF-8",
                        t.target, c.name
                    ));
                }
            }
        }
        if let Some(r) = self
            .rejections
            .iter()
            .find(|r| r.index as usize >= batch_len)
        {
            return Err(format!(
                "rejection of record {} in a batch of {batch_len}",
                r.index
            ));
        }
        Ok(())
    }

    /// Bytes the output holds in the host (values, lengths, null flags,
    /// names, rejection reasons): what `limits.max_output_mib` bounds.
    pub fn byte_size(&self) -> usize {
        let columns: usize = self
            .targets
            .iter()
            .flat_map(|t| &t.columns)
            .map(|c| {
                c.name.len()
                    + c.nulls.len()
                    + match &c.data {
                        ColumnData::Int64(v) => v.len() * 8,
                        ColumnData::Float64(v) => v.len() * 8,
                        ColumnData::Bool(v) => v.len(),
                        ColumnData::Text { lengths, data }
                        | ColumnData::Bytes { lengths, data } => lengths.len() * 4 + data.len(),
                    }
            })
            .sum();
        let rejections: usize = self.rejections.iter().map(|r| 4 + r.reason.len()).sum();
        let state: usize = (self.state.0.values().flatten())
            .map(|(k, v)| k.len() + v.as_ref().map_or(1, |v| v.size()))
            .sum();
        columns + rejections + state
    }

    /// Total rows over all targets.
    pub fn row_count(&self) -> u64 {
        self.targets.iter().map(|t| t.rows as u64).sum()
    }

    /// Appends `other` (the output of a sub-batch whose record `i` is
    /// record `index_map[i]` of the whole batch).
    pub fn absorb(&mut self, other: Output, index_map: &[usize]) {
        for t in other.targets {
            match self.targets.iter_mut().find(|x| x.target == t.target) {
                Some(existing) if same_shape(existing, &t) => append_rows(existing, t),
                _ => self.targets.push(t),
            }
        }
        let remap = |r: Rejection| Rejection {
            index: index_map[r.index as usize] as u32,
            reason: r.reason,
        };
        self.rejections
            .extend(other.rejections.into_iter().map(remap));
        self.late.extend(other.late.into_iter().map(remap));
        self.state.overlay(other.state);
    }

    /// sha256 over the canonical form of a batch's result: its rows and
    /// its dead letters. Equal results give equal digests however they were
    /// represented: a column without a null list and one of all zeros,
    /// whatever a module left under a null, any non-zero byte as `true`.
    ///
    /// The form (every integer little-endian, every string and byte string
    /// as its u64 length then its bytes): the tag `sluice-output-2`; the
    /// number of targets (u64); per target its name, row count (u64) and
    /// column count (u64); per column its name, its type tag (one byte:
    /// 1 int64, 2 float64, 3 text, 4 bytes, 5 bool) and then either 0 and
    /// every row's value (no row is null) or 1 and per row 0 (null) or 1
    /// and the value; a value is 8 bytes (int64, the float64's bits), one
    /// byte 0/1 (bool) or a length-prefixed string. Then the number of dead
    /// letters (u64) and, by record index, each one's index (u64), kind and
    /// — for a record the module rejected, whose reason is the module's own
    /// output — 1 and the reason, else 0 (the host's wording of a trap or a
    /// limit may change between versions; the kind and the record may not).
    /// Then, only if the batch changed keyed state (so a stateless batch's
    /// digest is what it always was), the tag `state` and the changes as
    /// [`crate::state::StateMap::encode`] writes them (partitions and keys
    /// in order).
    pub fn digest(&self, dead_letters: &[(usize, &str, Option<&str>)]) -> String {
        let mut h = Sha256::new();
        h.update(b"sluice-output-2");
        put_len(&mut h, self.targets.len());
        for t in &self.targets {
            put_str(&mut h, &t.target);
            put_len(&mut h, t.rows as usize);
            put_len(&mut h, t.columns.len());
            for c in &t.columns {
                put_str(&mut h, &c.name);
                h.update([c.data.tag()]);
                put_column(&mut h, c, t.rows as usize);
            }
        }
        put_len(&mut h, dead_letters.len());
        for (index, kind, reason) in dead_letters {
            put_len(&mut h, *index);
            put_str(&mut h, kind);
            match reason {
                Some(reason) => {
                    h.update([1]);
                    put_str(&mut h, reason);
                }
                None => h.update([0]),
            }
        }
        if !self.state.is_empty() {
            h.update(b"state");
            h.update(self.state.encode());
        }
        hex::encode(h.finalize())
    }

    /// The digest sluice recorded before the canonical form (batches whose
    /// lineage has no settings): kept so `verify` can check them.
    pub fn legacy_digest(&self) -> String {
        let mut h = Sha256::new();
        for t in &self.targets {
            h.update(b"T");
            put_str(&mut h, &t.target);
            h.update(t.rows.to_le_bytes());
            for c in &t.columns {
                put_str(&mut h, &c.name);
                h.update([c.data.tag()]);
                put_bytes(&mut h, &c.nulls);
                match &c.data {
                    ColumnData::Int64(v) => v.iter().for_each(|x| h.update(x.to_le_bytes())),
                    ColumnData::Float64(v) => {
                        v.iter().for_each(|x| h.update(x.to_bits().to_le_bytes()))
                    }
                    ColumnData::Bool(v) => put_bytes(&mut h, v),
                    ColumnData::Text { lengths, data } | ColumnData::Bytes { lengths, data } => {
                        lengths.iter().for_each(|l| h.update(l.to_le_bytes()));
                        put_bytes(&mut h, data);
                    }
                }
            }
        }
        for r in &self.rejections {
            h.update(b"R");
            h.update(r.index.to_le_bytes());
            put_str(&mut h, &r.reason);
        }
        hex::encode(h.finalize())
    }
}

fn put_len(h: &mut Sha256, n: usize) {
    h.update((n as u64).to_le_bytes());
}

/// One column in the canonical form (see [`Output::digest`]), written
/// through a buffer: values are small, the hasher is fastest fed in bulk.
fn put_column(h: &mut Sha256, c: &Column, rows: usize) {
    const FLUSH: usize = 64 * 1024;
    let is_null = |row: usize| c.nulls.get(row).is_some_and(|&n| n != 0);
    let any_null = c.nulls.iter().any(|&n| n != 0);
    let mut buf: Vec<u8> = Vec::with_capacity(FLUSH + 1024);
    buf.push(any_null as u8);
    let mut cell = |buf: &mut Vec<u8>, row: usize, value: &[u8], framed: bool| {
        if any_null {
            if is_null(row) {
                buf.push(0);
                return;
            }
            buf.push(1);
        }
        if framed {
            buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
        }
        buf.extend_from_slice(value);
        if buf.len() >= FLUSH {
            h.update(&buf);
            buf.clear();
        }
    };
    match &c.data {
        ColumnData::Int64(v) => {
            for (row, x) in v.iter().enumerate().take(rows) {
                cell(&mut buf, row, &x.to_le_bytes(), false);
            }
        }
        ColumnData::Float64(v) => {
            for (row, x) in v.iter().enumerate().take(rows) {
                cell(&mut buf, row, &x.to_bits().to_le_bytes(), false);
            }
        }
        ColumnData::Bool(v) => {
            for (row, x) in v.iter().enumerate().take(rows) {
                cell(&mut buf, row, &[(*x != 0) as u8], false);
            }
        }
        ColumnData::Text { lengths, data } | ColumnData::Bytes { lengths, data } => {
            let mut at = 0usize;
            for (row, &len) in lengths.iter().enumerate().take(rows) {
                let value = &data[at..at + len as usize];
                at += len as usize;
                cell(&mut buf, row, value, true);
            }
        }
    }
    h.update(&buf);
}

fn put_str(h: &mut Sha256, s: &str) {
    put_bytes(h, s.as_bytes());
}

fn put_bytes(h: &mut Sha256, b: &[u8]) {
    h.update((b.len() as u64).to_le_bytes());
    h.update(b);
}

fn same_shape(a: &TargetRows, b: &TargetRows) -> bool {
    a.columns.len() == b.columns.len()
        && a.columns
            .iter()
            .zip(&b.columns)
            .all(|(x, y)| x.name == y.name && x.data.tag() == y.data.tag())
}

fn append_rows(into: &mut TargetRows, from: TargetRows) {
    let (old_rows, new_rows) = (into.rows as usize, from.rows as usize);
    for (a, b) in into.columns.iter_mut().zip(from.columns) {
        if !a.nulls.is_empty() || !b.nulls.is_empty() {
            a.nulls.resize(old_rows, 0);
            let mut bn = b.nulls;
            bn.resize(new_rows, 0);
            a.nulls.extend(bn);
        }
        match (&mut a.data, b.data) {
            (ColumnData::Int64(x), ColumnData::Int64(y)) => x.extend(y),
            (ColumnData::Float64(x), ColumnData::Float64(y)) => x.extend(y),
            (ColumnData::Bool(x), ColumnData::Bool(y)) => x.extend(y),
            (
                ColumnData::Text {
                    lengths: l,
                    data: d,
                },
                ColumnData::Text { lengths, data },
            )
            | (
                ColumnData::Bytes {
                    lengths: l,
                    data: d,
                },
                ColumnData::Bytes { lengths, data },
            ) => {
                l.extend(lengths);
                d.extend(data);
            }
            _ => unreachable!("same_shape checked the column types"),
        }
    }
    into.rows += from.rows;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(target: &str, v: Vec<i64>) -> Output {
        Output {
            targets: vec![TargetRows {
                target: target.into(),
                rows: v.len() as u32,
                columns: vec![Column {
                    name: "n".into(),
                    nulls: vec![],
                    data: ColumnData::Int64(v),
                }],
            }],
            rejections: vec![],
            late: Vec::new(),
            state: Default::default(),
        }
    }

    #[test]
    fn digest_is_order_sensitive_and_stable() {
        let d = |o: Output| o.digest(&[]);
        assert_eq!(d(ints("t", vec![1, 2])), d(ints("t", vec![1, 2])));
        assert_ne!(d(ints("t", vec![1, 2])), d(ints("t", vec![2, 1])));
        assert_ne!(d(ints("t", vec![1])), d(ints("u", vec![1])));
    }

    fn column(nulls: Vec<u8>, data: ColumnData) -> Output {
        let rows = nulls.len().max(match &data {
            ColumnData::Bool(v) => v.len(),
            ColumnData::Int64(v) => v.len(),
            ColumnData::Text { lengths, .. } => lengths.len(),
            _ => 0,
        }) as u32;
        Output {
            targets: vec![TargetRows {
                target: "t".into(),
                rows,
                columns: vec![Column {
                    name: "c".into(),
                    nulls,
                    data,
                }],
            }],
            rejections: vec![],
            late: Vec::new(),
            state: Default::default(),
        }
    }

    #[test]
    fn digest_is_canonical_over_representations() {
        let d = |o: Output| o.digest(&[]);
        // No null list and a null list of zeros are the same rows.
        assert_eq!(
            d(column(vec![], ColumnData::Int64(vec![1, 2]))),
            d(column(vec![0, 0], ColumnData::Int64(vec![1, 2])))
        );
        // What lies under a null does not count; a null does.
        assert_eq!(
            d(column(vec![0, 1], ColumnData::Int64(vec![1, 7]))),
            d(column(vec![0, 1], ColumnData::Int64(vec![1, 9])))
        );
        assert_ne!(
            d(column(vec![0, 1], ColumnData::Int64(vec![1, 7]))),
            d(column(vec![], ColumnData::Int64(vec![1, 7])))
        );
        let text = |nulls, parts: &[&str]| {
            column(
                nulls,
                ColumnData::Text {
                    lengths: parts.iter().map(|p| p.len() as u32).collect(),
                    data: parts.concat().into_bytes(),
                },
            )
        };
        assert_eq!(
            d(text(vec![1, 0], &["junk", "b"])),
            d(text(vec![1, 0], &["", "b"]))
        );
        // Any non-zero byte is `true`.
        assert_eq!(
            d(column(vec![], ColumnData::Bool(vec![1, 0]))),
            d(column(vec![], ColumnData::Bool(vec![255, 0])))
        );
        // Framed: moving a byte between strings changes the digest.
        assert_ne!(d(text(vec![], &["ab", "c"])), d(text(vec![], &["a", "bc"])));
    }

    #[test]
    fn digest_covers_dead_letters_and_only_module_reasons() {
        let o = || ints("t", vec![1]);
        assert_ne!(o().digest(&[]), o().digest(&[(3, "trap", None)]));
        assert_ne!(
            o().digest(&[(3, "trap", None)]),
            o().digest(&[(4, "trap", None)])
        );
        assert_ne!(
            o().digest(&[(3, "trap", None)]),
            o().digest(&[(3, "fuel", None)])
        );
        assert_ne!(
            o().digest(&[(3, "rejected", Some("bad"))]),
            o().digest(&[(3, "rejected", Some("worse"))])
        );
    }

    #[test]
    fn absorb_appends_rows_and_remaps_rejections() {
        let mut a = ints("t", vec![1]);
        let mut b = ints("t", vec![2, 3]);
        b.rejections.push(Rejection {
            index: 1,
            reason: "bad".into(),
        });
        a.absorb(b, &[4, 9]);
        assert_eq!(a, {
            let mut e = ints("t", vec![1, 2, 3]);
            e.rejections.push(Rejection {
                index: 9,
                reason: "bad".into(),
            });
            e
        });
    }

    #[test]
    fn check_rejects_mismatched_lengths() {
        let mut o = ints("t", vec![1, 2]);
        o.targets[0].rows = 3;
        assert!(o.check(10).unwrap_err().contains("2 values for 3 rows"));
    }
}
