//! A transform that logs, for the host's tests of module logs: one info
//! line per batch (`N records from OFFSET`), a warning for each record
//! whose value is `warn`, an error line for each `error`; a record whose
//! value is `panic` panics (a trap: the batch is bisected); every other
//! record is echoed as a row of target `records` (offset, value).

use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform, log};

struct Chatty;

impl Transform for Chatty {
    fn init(_params: &Params) -> Result<Self, String> {
        Ok(Chatty)
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let t = out.target("records", &[("offset", Kind::Int64), ("value", Kind::Text)]);
        let mut first = None;
        let mut count = 0;
        for r in batch.records() {
            first.get_or_insert(r.offset);
            count += 1;
            let value = String::from_utf8_lossy(r.value.unwrap_or_default());
            match value.as_ref() {
                "warn" => log::warn(&format!("offset {} says warn", r.offset)),
                "error" => log::error(&format!("offset {} says error", r.offset)),
                "panic" => panic!("offset {} says panic", r.offset),
                _ => {}
            }
            out.row(t).int(r.offset).text(&value);
        }
        log::info(&format!("{count} records from {}", first.unwrap_or(-1)));
        Ok(())
    }
}

sluice_plugin::export!(Chatty);
