//! Dedupe in the module, with keyed state: the first sighting of an event
//! id passes, repeats within the window are dropped, for the Postgres
//! dedupe example. The ids seen are kept in state (scoped to the input
//! partition: events of one id must share a partition, which a producer
//! keyed by id gives), each expiring `window_ms` of record time after it was
//! first seen, so the state does not grow for ever.
//!
//! Input values are JSON objects like `{"id":"e1","user":"ann","amount":12.5}`
//! (other fields are ignored). A value without a text `id` and `user` and a
//! number `amount` is rejected (a dead letter); it must not fail the batch.
//!
//! Out: target `events` (id, user, amount), one row per first sighting; and
//! target `repeats` (user, n = 1) per repeat dropped, which the pipeline
//! adds up per user.
//!
//! Params: `window_ms` (default 86,400,000: 24 h).

use serde::Deserialize;
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};
use std::borrow::Cow;

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    user: Cow<'a, str>,
    amount: f64,
}

struct Dedupe {
    window_ms: i64,
}

impl Transform for Dedupe {
    fn init(params: &Params) -> Result<Self, String> {
        let p: serde_json::Value =
            serde_json::from_str(params.json()).map_err(|e| format!("params: {e}"))?;
        let window_ms = match p.get("window_ms") {
            None => 86_400_000,
            Some(v) => v
                .as_i64()
                .filter(|ms| *ms > 0)
                .ok_or("`window_ms` must be a positive integer (ms)")?,
        };
        Ok(Dedupe { window_ms })
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let events = out.target(
            "events",
            &[
                ("id", Kind::Text),
                ("user", Kind::Text),
                ("amount", Kind::Float64),
            ],
        );
        let repeats = out.target("repeats", &[("user", Kind::Text), ("n", Kind::Int64)]);
        for r in batch.records() {
            let e = match r.value.map(serde_json::from_slice::<Event<'_>>) {
                Some(Ok(e)) if !e.id.is_empty() && !e.user.is_empty() => e,
                Some(Ok(_)) => {
                    out.reject(&r, "empty `id` or `user`");
                    continue;
                }
                Some(Err(err)) => {
                    out.reject(&r, format!("not an event: {err}"));
                    continue;
                }
                None => {
                    out.reject(&r, "null value");
                    continue;
                }
            };
            let state = r.state();
            if state.get(e.id.as_bytes()).is_some() {
                out.row(repeats).text(&e.user).int(1);
                continue;
            }
            state.set_expiring(e.id.as_bytes(), b"", r.timestamp + self.window_ms);
            out.row(events).text(&e.id).text(&e.user).float(e.amount);
        }
        Ok(())
    }
}

sluice_plugin::export!(Dedupe);
