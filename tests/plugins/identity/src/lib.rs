//! Identity transform: every record out as one row, unchanged.
//!
//! Owns nothing but the copy; it exists to measure the boundary's cost
//! (batch in, instance, rows out) against the same work done natively.

use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};

struct Identity;

impl Transform for Identity {
    fn init(_params: &Params) -> Result<Self, String> {
        Ok(Identity)
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
        for r in batch.records() {
            let row = out.row(t).int(r.partition.into()).int(r.offset);
            let row = match r.key {
                Some(k) => row.bytes(k),
                None => row.null(),
            };
            match r.value {
                Some(v) => row.bytes(v),
                None => row.null(),
            };
        }
        Ok(())
    }
}

sluice_plugin::export!(Identity);
