//! {{name}}: a sluice transform in Rust.
//!
//! Each record's value is read as UTF-8 text (bad bytes replaced by
//! U+FFFD); a record with no value is rejected (it becomes a dead letter);
//! every other one gives a row of target `out` with its offset and its
//! value, ASCII letters in upper case, after the `prefix` param. Every
//! language's template does exactly this.
//!
//! Try it:   sluice build && sluice test dist/{{name}}.wasm --input sample.jsonl

use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform, log};

struct Upper {
    prefix: String,
}

impl Transform for Upper {
    fn init(params: &Params) -> Result<Self, String> {
        // The pipeline's `[module.params]`, as JSON.
        let params: serde_json::Value =
            serde_json::from_str(params.json()).map_err(|e| format!("params: {e}"))?;
        let prefix = params["prefix"].as_str().unwrap_or_default().to_string();
        Ok(Upper { prefix })
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let t = out.target("out", &[("offset", Kind::Int64), ("value", Kind::Text)]);
        for r in batch.records() {
            let Some(value) = r.value else {
                out.reject(&r, "no value");
                continue;
            };
            let text = String::from_utf8_lossy(value).to_ascii_uppercase();
            out.row(t).int(r.offset).text(&format!("{}{text}", self.prefix));
        }
        log::info(&format!("{} records", batch.len()));
        Ok(())
    }
}

sluice_plugin::export!(Upper);
