//! Stamp transform: every record out as one `records` row (the same table
//! shape as `identity`), its value prefixed with the `tag` parameter.
//!
//! It exists to show and test module swaps: with `identity` as one version
//! and `stamp` as another, each committed row tells which one wrote it.
//!
//! Params: `{"tag": "v2:"}` (optional; default `stamped:`).

use serde::Deserialize;
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_tag")]
    tag: String,
}

fn default_tag() -> String {
    "stamped:".to_string()
}

struct Stamp(Config);

impl Transform for Stamp {
    fn init(params: &Params) -> Result<Self, String> {
        serde_json::from_str(params.json())
            .map(Stamp)
            .map_err(|e| format!("stamp params: {e}"))
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let t = out.target(
            "records",
            &[
                ("partition", Kind::Int64),
                ("offset", Kind::Int64),
                ("key", Kind::Bytes),
                ("value", Kind::Bytes),
            ],
        );
        let mut stamped = Vec::new();
        for r in batch.records() {
            let row = out.row(t).int(r.partition.into()).int(r.offset);
            let row = match r.key {
                Some(k) => row.bytes(k),
                None => row.null(),
            };
            stamped.clear();
            stamped.extend_from_slice(self.0.tag.as_bytes());
            stamped.extend_from_slice(r.value.unwrap_or_default());
            row.bytes(&stamped);
        }
        Ok(())
    }
}

sluice_plugin::export!(Stamp);
