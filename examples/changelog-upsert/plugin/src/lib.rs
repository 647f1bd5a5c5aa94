//! A changelog keyed by id (like a MySQL binlog or a Debezium topic)
//! applied as keyed upserts and deletes: replaying any part of the log again
//! converges to the same table.
//!
//! Input values are JSON objects like
//! `{"op":"u","id":7,"name":"ann","email":"ann@example.com"}` with `op` one
//! of `c` (create), `u` (update), `r` (snapshot read) or `d` (delete; only
//! `id` needed). Within a batch only the last change per id counts, so an
//! id goes either to `upserts` or to `deletes`, never both (the sink
//! applies targets one after another). Input order within a partition is
//! the log order; changes of one id must stay on one partition (key by id).
//! Anything else is rejected to the dead letters. No params.

use serde::Deserialize;
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Change {
    op: String,
    id: i64,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    email: Option<String>,
}

struct Changelog;

impl Transform for Changelog {
    fn init(params: &Params) -> Result<Self, String> {
        match params.json().trim() {
            "" | "{}" | "null" => Ok(Changelog),
            other => Err(format!("changelog takes no params, got {other}")),
        }
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        // id -> last change in this batch (None = deleted).
        let mut last: BTreeMap<i64, Option<(Option<String>, Option<String>)>> = BTreeMap::new();
        for r in batch.records() {
            let change = match r.value.map(serde_json::from_slice::<Change>) {
                Some(Ok(c)) => c,
                Some(Err(err)) => {
                    out.reject(&r, format!("not a change: {err}"));
                    continue;
                }
                None => {
                    out.reject(&r, "null value");
                    continue;
                }
            };
            match change.op.as_str() {
                "c" | "u" | "r" => {
                    last.insert(change.id, Some((change.name, change.email)));
                }
                "d" => {
                    last.insert(change.id, None);
                }
                other => out.reject(&r, format!("unknown op `{other}`")),
            }
        }
        let upserts = out.target(
            "upserts",
            &[
                ("id", Kind::Int64),
                ("name", Kind::Text),
                ("email", Kind::Text),
            ],
        );
        let deletes = out.target("deletes", &[("id", Kind::Int64)]);
        for (id, change) in last {
            match change {
                Some((name, email)) => {
                    let row = out.row(upserts).int(id);
                    let row = match &name {
                        Some(n) => row.text(n),
                        None => row.null(),
                    };
                    match &email {
                        Some(e) => row.text(e),
                        None => row.null(),
                    };
                }
                None => {
                    out.row(deletes).int(id);
                }
            }
        }
        Ok(())
    }
}

sluice_plugin::export!(Changelog);
