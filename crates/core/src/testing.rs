//! Builders for tests of the crates that consume the core (behind the
//! `testing` feature, never in a release build's API).

use crate::output::{Column, ColumnData, Output, TargetRows};

/// One target of (`word` text, `n` int64) rows.
pub fn words_output(target: &str, words: &[(&str, i64)]) -> Output {
    let mut lengths = Vec::new();
    let mut data = Vec::new();
    for (w, _) in words {
        lengths.push(w.len() as u32);
        data.extend_from_slice(w.as_bytes());
    }
    Output {
        targets: vec![TargetRows {
            target: target.into(),
            rows: words.len() as u32,
            columns: vec![
                Column {
                    name: "word".into(),
                    nulls: vec![],
                    data: ColumnData::Text { lengths, data },
                },
                Column {
                    name: "n".into(),
                    nulls: vec![],
                    data: ColumnData::Int64(words.iter().map(|w| w.1).collect()),
                },
            ],
        }],
        rejections: vec![],
    }
}
