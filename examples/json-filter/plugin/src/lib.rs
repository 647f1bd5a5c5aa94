//! JSON filter + projection: keeps purchase events at or above a minimum
//! amount and projects them to (id, user, amount) rows.
//!
//! Input values are JSON objects like
//! `{"id":7,"user":"ann","event":"purchase","amount":12.5,...}`. A value that
//! is not such an object is rejected (it becomes a dead letter); it must not
//! fail the batch.
//!
//! Params: `{"event": "purchase", "min_amount": 10.0}` (both optional).

use serde::Deserialize;
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};
use std::borrow::Cow;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_event")]
    event: String,
    #[serde(default)]
    min_amount: f64,
}

fn default_event() -> String {
    "purchase".to_string()
}

#[derive(Deserialize)]
struct Event<'a> {
    id: i64,
    #[serde(borrow)]
    user: Cow<'a, str>,
    #[serde(borrow)]
    event: Cow<'a, str>,
    amount: f64,
}

struct JsonFilter(Config);

impl Transform for JsonFilter {
    fn init(params: &Params) -> Result<Self, String> {
        serde_json::from_str(params.json())
            .map(JsonFilter)
            .map_err(|e| format!("json-filter params: {e}"))
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let t = out.target(
            "purchases",
            &[
                ("id", Kind::Int64),
                ("user", Kind::Text),
                ("amount", Kind::Float64),
            ],
        );
        for r in batch.records() {
            let parsed = r.value.map(serde_json::from_slice::<Event<'_>>);
            match parsed {
                Some(Ok(e)) => {
                    if e.event == self.0.event && e.amount >= self.0.min_amount {
                        out.row(t).int(e.id).text(&e.user).float(e.amount);
                    }
                }
                Some(Err(err)) => out.reject(&r, format!("not a purchase event: {err}")),
                None => out.reject(&r, "null value"),
            }
        }
        Ok(())
    }
}

sluice_plugin::export!(JsonFilter);
