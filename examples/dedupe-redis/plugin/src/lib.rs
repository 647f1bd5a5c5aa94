//! Dedupe: one `(day, user)` row per event, for the Redis dedupe example
//! (a set of the users seen each day, and an exact count of events per
//! day).
//!
//! Input values are JSON objects like
//! `{"user":"ann","day":"2026-11-30",...}` (other fields are ignored). A
//! value without a text `user` and `day` is rejected (it becomes a dead
//! letter); it must not fail the batch.
//!
//! Params: none.

use serde::Deserialize;
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};
use std::borrow::Cow;

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow)]
    user: Cow<'a, str>,
    #[serde(borrow)]
    day: Cow<'a, str>,
}

struct Dedupe;

impl Transform for Dedupe {
    fn init(_params: &Params) -> Result<Self, String> {
        Ok(Dedupe)
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let t = out.target("seen", &[("day", Kind::Text), ("user", Kind::Text)]);
        for r in batch.records() {
            match r.value.map(serde_json::from_slice::<Event<'_>>) {
                Some(Ok(e)) if !e.user.is_empty() && !e.day.is_empty() => {
                    out.row(t).text(&e.day).text(&e.user);
                }
                Some(Ok(_)) => out.reject(&r, "empty `user` or `day`"),
                Some(Err(err)) => out.reject(&r, format!("not an event: {err}")),
                None => out.reject(&r, "null value"),
            }
        }
        Ok(())
    }
}

sluice_plugin::export!(Dedupe);
