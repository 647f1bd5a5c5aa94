//! The conformance transform in Rust: the reference every other language's
//! copy (sdk/python/conformance, sdk/js/conformance, ...) must match byte for byte on the
//! same input (docs/languages.md states the transform).
//!
//! Per record: a value that is not a JSON object is rejected; an object
//! with `"keep": false` is skipped; any other gives one `events` row
//! (offset, user or null, score or null, score × 0.1, the raw key, its
//! word count, vip) and one `words` row per ASCII word of `text`,
//! lowercased. A record with an `events` row and a string `user` also
//! counts in keyed state (docs/languages.md, step 5) and gives a `seen` row.

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
        let now = batch.context.batch_time_ms;
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
            let Some(Value::String(user)) = obj.get("user") else {
                continue;
            };
            let (count_key, last_key) = (format!("n:{user}"), format!("last:{user}"));
            let state = r.state();
            let n = state.get_i64(count_key.as_bytes()).unwrap_or(0) + 1;
            let last = state.get_str(last_key.as_bytes());
            match obj.get("forget") == Some(&Value::Bool(true)) {
                true => state.delete(count_key.as_bytes()),
                false => state.set_i64(count_key.as_bytes(), n),
            }
            let text = match obj.get("text") {
                Some(Value::String(text)) => text.as_str(),
                _ => "",
            };
            let expires = match obj.get("expire") == Some(&Value::Bool(true)) {
                true => now,
                false => now + 60_000,
            };
            state.set_expiring(last_key.as_bytes(), text.as_bytes(), expires);
            // Declared where its first row is made: mid-batch, after rows of
            // the other targets (later calls find it by name).
            let seen = out.target(
                "seen",
                &[
                    ("offset", Kind::Int64),
                    ("user", Kind::Text),
                    ("n", Kind::Int64),
                    ("last", Kind::Text),
                ],
            );
            let row = out.row(seen).int(r.offset).text(user).int(n);
            match last {
                Some(last) => row.text(&last),
                None => row.null(),
            };
        }
        Ok(())
    }
}

sluice_plugin::export!(Conformance);
