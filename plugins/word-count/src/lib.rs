//! Word count: splits each value into lowercase words, counts them within the
//! batch and emits one (word, n) row per distinct word, in sorted order.
//!
//! The sink accumulates `n` by `word`, committed with the offsets, so the
//! table holds exactly-once totals across batches. No state is kept here.
//!
//! Params: `{"min_length": 1}` (optional): shorter words are skipped.

use serde::Deserialize;
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "one")]
    min_length: usize,
}

fn one() -> usize {
    1
}

struct WordCount(Config);

impl Transform for WordCount {
    fn init(params: &Params) -> Result<Self, String> {
        serde_json::from_str(params.json())
            .map(WordCount)
            .map_err(|e| format!("word-count params: {e}"))
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for r in batch.records() {
            let Some(value) = r.value else { continue };
            let Ok(text) = std::str::from_utf8(value) else {
                out.reject(&r, "value is not UTF-8 text");
                continue;
            };
            for word in text
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
            {
                if word.chars().count() >= self.0.min_length {
                    *counts.entry(word.to_lowercase()).or_default() += 1;
                }
            }
        }
        let t = out.target("word_counts", &[("word", Kind::Text), ("n", Kind::Int64)]);
        for (word, n) in &counts {
            out.row(t).text(word).int(*n);
        }
        Ok(())
    }
}

sluice_plugin::export!(WordCount);
