//! Word count: splits each value into lowercase words, counts them within the
//! batch and emits one (word, n) row per distinct word, in sorted order.
//!
//! The sink accumulates `n` by `word`, committed with the offsets, so the
//! table holds exactly-once totals across batches. No state is kept here.
//!
//! Params (all optional): `{"min_length": 1}`: shorter words are skipped;
//! `{"field": "user"}`: count the words of that top-level string field of
//! a JSON object value instead of the whole value (a record whose value is
//! not such an object is rejected).

use serde::Deserialize;
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "one")]
    min_length: usize,
    #[serde(default)]
    field: Option<String>,
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
            let text = match &self.0.field {
                None => std::borrow::Cow::Borrowed(text),
                Some(field) => match field_text(text, field) {
                    Some(t) => std::borrow::Cow::Owned(t),
                    None => {
                        out.reject(
                            &r,
                            format!("value is not a JSON object with a string `{field}`"),
                        );
                        continue;
                    }
                },
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

/// The string `field` of the JSON object `text`, if it is one.
fn field_text(text: &str, field: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    Some(value.get(field)?.as_str()?.to_string())
}

sluice_plugin::export!(WordCount);
