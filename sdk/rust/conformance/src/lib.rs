//! The conformance transform in Rust: the reference every other language's
//! copy (sdk/python/conformance, sdk/js/conformance, ...) must match byte for byte on the
//! same input (docs/languages.md states the transform).
//!
//! Per record: a value that is not a JSON object is rejected; an object
//! with `"keep": false` is skipped; any other gives one `events` row
//! (offset, user or null, score or null, score × 0.1, the raw key, its
//! word count, vip) and one `words` row per ASCII word of `text`,
//! lowercased.

use serde_json::Value;
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};

struct Conformance;

/// Maximal runs of ASCII letters and digits, lowercased.
fn ascii_words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_ascii_lowercase())
        .collect()
}

impl Transform for Conformance {
    fn init(_: &Params) -> Result<Self, String> {
        Ok(Conformance)
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let events = out.target(
            "events",
            &[
                ("offset", Kind::Int64),
                ("user", Kind::Text),
                ("score", Kind::Float64),
                ("scaled", Kind::Float64),
                ("key", Kind::Bytes),
                ("words", Kind::Int64),
                ("vip", Kind::Bool),
            ],
        );
        let words = out.target("words", &[("offset", Kind::Int64), ("word", Kind::Text)]);
        for r in batch.records() {
            let parsed = r
                .value
                .and_then(|v| serde_json::from_slice::<Value>(v).ok());
            let Some(Value::Object(obj)) = parsed else {
                out.reject(&r, "not a JSON object");
                continue;
            };
            if obj.get("keep") == Some(&Value::Bool(false)) {
                continue;
            }
            let score = obj.get("score").and_then(Value::as_f64);
            let split = match obj.get("text") {
                Some(Value::String(text)) => ascii_words(text),
                _ => Vec::new(),
            };
            let row = out.row(events).int(r.offset);
            let row = match obj.get("user") {
                Some(Value::String(user)) => row.text(user),
                _ => row.null(),
            };
            let row = match score {
                Some(s) => row.float(s).float(s * 0.1),
                None => row.null().null(),
            };
            let row = match r.key {
                Some(key) => row.bytes(key),
                None => row.null(),
            };
            row.int(split.len() as i64)
                .bool(obj.get("vip") == Some(&Value::Bool(true)));
            for word in &split {
                out.row(words).int(r.offset).text(word);
            }
        }
        Ok(())
    }
}

sluice_plugin::export!(Conformance);
