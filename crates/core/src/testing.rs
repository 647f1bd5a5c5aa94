//! Builders for tests of the crates that consume the core (behind the
//! `testing` feature, never in a release build's API).

use crate::config::{ConfigError, PipelineConfig};
use crate::output::{Column, ColumnData, Output, TargetRows};

/// A pipeline config for a sink kind's config tests: pipeline `p` reading
/// `in` from an unreachable broker through `m.wasm`, with `sink` as the
/// lines of `[sink]` (its `url` among them) and one target `name` of
/// `columns` (an inline table) with `target` lines after.
pub fn sink_config(
    sink: &str,
    name: &str,
    columns: &str,
    target: &str,
) -> Result<PipelineConfig, ConfigError> {
    PipelineConfig::parse(&format!(
        "pipeline = \"p\"\n[source]\nbrokers = \"127.0.0.1:1\"\ntopics = [\"in\"]\n\
         [module]\npath = \"m.wasm\"\n[sink]\n{sink}\n[[sink.targets]]\nname = \"{name}\"\n\
         columns = {columns}\n{target}\n"
    ))
}

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
        late: Vec::new(),
        state: Default::default(),
    }
}
